/*
 * image_encode.c — images encoded in memory for the media tests: noise,
 * and the encoders of each format the decoders read (libjpeg, libpng,
 * giflib, libwebp), each at a setting that keeps the test's time down.
 */
#include <stdio.h>				/* before jpeglib.h, which needs FILE */
#include <stdlib.h>
#include <string.h>

#include <gif_lib.h>
#include <jpeglib.h>
#include <png.h>
#include <webp/encode.h>

#include "image_encode.h"
#include "xorshift.h"

uint8_t *
h_noise_rgb(int w, int h, uint64_t seed)
{
	size_t		n = (size_t) w * h * 3,
				i;
	uint8_t    *p = malloc(n);

	for (i = 0; p && i < n; i += 8)
	{
		uint64_t	r = h_xorshift64(&seed);

		memcpy(p + i, &r, G4_MIN(8, n - i));
	}
	return p;
}

int
h_encode_jpeg_progressive(const uint8_t *rgb, int w, int h, g4_buf *out)
{
	struct jpeg_compress_struct c;
	struct jpeg_error_mgr je;
	unsigned char *mem = NULL;
	unsigned long len = 0;
	int			ok;

	c.err = jpeg_std_error(&je);
	jpeg_create_compress(&c);
	jpeg_mem_dest(&c, &mem, &len);
	c.image_width = (JDIMENSION) w;
	c.image_height = (JDIMENSION) h;
	c.input_components = 3;
	c.in_color_space = JCS_RGB;
	jpeg_set_defaults(&c);
	jpeg_set_quality(&c, 90, TRUE);
	jpeg_simple_progression(&c);
	jpeg_start_compress(&c, TRUE);
	while (c.next_scanline < c.image_height)
	{
		JSAMPROW	row = (JSAMPROW) (rgb + (size_t) c.next_scanline * w * 3);

		jpeg_write_scanlines(&c, &row, 1);
	}
	jpeg_finish_compress(&c);
	jpeg_destroy_compress(&c);
	ok = g4_buf_append(out, mem, len) == G4_OK;
	free(mem);
	return ok;
}

static void
png_write_mem(png_structp png, png_bytep p, size_t n)
{
	if (g4_buf_append(png_get_io_ptr(png), p, n) != G4_OK)
		png_error(png, "out of memory");
}

static void
png_flush_mem(png_structp png)
{
}

int
h_encode_png_interlaced(const uint8_t *rgb, int w, int h, g4_buf *out)
{
	png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
	png_infop	info = png ? png_create_info_struct(png) : NULL;
	png_bytep  *rows = malloc(sizeof(png_bytep) * h);
	int			y;

	if (!info || !rows)
	{
		png_destroy_write_struct(&png, &info);
		free(rows);
		return 0;
	}
	if (setjmp(png_jmpbuf(png)))
	{
		png_destroy_write_struct(&png, &info);
		free(rows);
		return 0;
	}
	png_set_write_fn(png, out, png_write_mem, png_flush_mem);
	png_set_compression_level(png, 0);
	png_set_IHDR(png, info, (png_uint_32) w, (png_uint_32) h, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_ADAM7,
				 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
	for (y = 0; y < h; y++)
		rows[y] = (png_bytep) (rgb + (size_t) y * w * 3);
	png_set_rows(png, info, rows);
	png_write_png(png, info, PNG_TRANSFORM_IDENTITY, NULL);
	png_destroy_write_struct(&png, &info);
	free(rows);
	return 1;
}

static int
gif_write_mem(GifFileType *g, const GifByteType *b, int n)
{
	return n >= 0 && g4_buf_append(g->UserData, b, (size_t) n) == G4_OK ? n : 0;
}

int
h_encode_gif(const uint8_t *rgb, int w, int h, g4_buf *out)
{
	GifColorType pal[256];
	ColorMapObject *cm;
	GifFileType *g;
	GifPixelType *line = malloc((size_t) w);
	int			code = 0,
				ok,
				x,
				y,
				i;

	for (i = 0; i < 256; i++)
		pal[i] = (GifColorType) {(GifByteType) i, (GifByteType) i, (GifByteType) i};
	cm = GifMakeMapObject(256, pal);
	g = EGifOpen(out, gif_write_mem, &code);
	ok = line && cm && g && EGifPutScreenDesc(g, w, h, 8, 0, cm) == GIF_OK &&
		EGifPutImageDesc(g, 0, 0, w, h, false, NULL) == GIF_OK;
	for (y = 0; ok && y < h; y++)
	{
		for (x = 0; x < w; x++)
			line[x] = rgb[((size_t) y * w + x) * 3];
		ok = EGifPutLine(g, line, w) == GIF_OK;
	}
	GifFreeMapObject(cm);
	free(line);
	return g && EGifCloseFile(g, &code) == GIF_OK && ok;
}

static int
webp_write_mem(const uint8_t *p, size_t n, const WebPPicture *pic)
{
	return g4_buf_append(pic->custom_ptr, p, n) == G4_OK;
}

int
h_encode_webp(const uint8_t *pixels, int channels, int w, int h, int lossless, g4_buf *out)
{
	WebPConfig	cfg;
	WebPPicture pic;
	int			ok;

	if (!WebPConfigInit(&cfg) || !WebPPictureInit(&pic))
		return 0;
	cfg.method = 0;
	cfg.quality = 50;
	cfg.lossless = lossless;
	pic.use_argb = lossless;
	pic.width = w;
	pic.height = h;
	pic.writer = webp_write_mem;
	pic.custom_ptr = out;
	ok = (channels == 4 ? WebPPictureImportRGBA(&pic, pixels, w * 4) : WebPPictureImportRGB(&pic, pixels, w * 3)) &&
		WebPEncode(&cfg, &pic);
	WebPPictureFree(&pic);
	return ok;
}
