/*
 * image_decode.c — PNG (libpng), JPEG (libjpeg-turbo), WebP (libwebp) and
 * GIF (giflib) to 8-bit RGB, as PIL's Image.open + ImageOps.exif_transpose
 * + convert("RGB") give it to transformers' processor:
 *
 *  - alpha is dropped, not composited (convert("RGB") keeps the colour
 *    channels of RGBA, LA and palette-with-transparency images);
 *  - grey is replicated to R = G = B; palettes are looked up;
 *  - 16-bit PNG samples keep their high byte, except 16-bit grey without
 *    alpha, which PIL opens as mode "I;16" and clips to 255 on conversion
 *    (so every value above 255 becomes white: done the same here);
 *  - CMYK JPEG: R = 255 - C... as PIL's cmyk2rgb, (255-C)(255-K)/255 with
 *    its rounding; Adobe files store CMYK inverted (PIL's "CMYK;I");
 *  - the EXIF orientation tag (JPEG APP1, PNG eXIf, WebP EXIF) is applied;
 *  - GIF: the first frame on a canvas of the logical screen size, filled
 *    outside the frame with the transparent index (else index 0) as PIL
 *    does; animated WebP is refused.
 *
 * The header's width x height is checked against the pixel limit before any
 * pixel memory is allocated.  The caller's cancel flag is polled once per
 * row decoded (per iMCU row of each scan for progressive JPEG, per piece of
 * input for WebP) and once per row transposed.
 */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gif_lib.h>
#include <jpeglib.h>
#include <jerror.h>
#include <png.h>
#include <webp/decode.h>

#include "media.h"
#include "util.h"

void
g4_image_free(g4_image *img)
{
	if (!img)
		return;
	free(img->rgb);
	img->rgb = NULL;
	img->width = img->height = 0;
}

static int
check_size(int64_t w, int64_t h, int64_t max_pixels, const char *fmt, g4_err *err)
{
	if (w <= 0 || h <= 0)
		return g4_fail(err, G4_ERR_INVALID, "the %s image is empty (%lld x %lld pixels)", fmt,
					   (long long) w, (long long) h);
	if (w * h > max_pixels)
		return g4_fail(err, G4_ERR_INVALID,
					   "the %s image is %lld x %lld pixels, more than the limit of %lld (max_image_pixels)",
					   fmt, (long long) w, (long long) h, (long long) max_pixels);
	return G4_OK;
}

static int
alloc_rgb(g4_image *img, int w, int h, g4_err *err)
{
	img->rgb = g4_malloc((size_t) w * (size_t) h * 3);
	if (!img->rgb)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory for a %d x %d image", w, h);
	img->width = w;
	img->height = h;
	return G4_OK;
}

/* ---- EXIF orientation ---- */

static unsigned
rd16(const uint8_t *p, int be)
{
	return be ? (unsigned) (p[0] << 8 | p[1]) : (unsigned) (p[1] << 8 | p[0]);
}

static uint32_t
rd32(const uint8_t *p, int be)
{
	return be ? ((uint32_t) p[0] << 24 | (uint32_t) p[1] << 16 | (uint32_t) p[2] << 8 | p[3])
		: ((uint32_t) p[3] << 24 | (uint32_t) p[2] << 16 | (uint32_t) p[1] << 8 | p[0]);
}

/* Orientation (1..8) from a TIFF-structured EXIF block; 1 when absent. */
static int
exif_orientation(const uint8_t *t, size_t n)
{
	int			be;
	uint32_t	ifd;
	unsigned	count,
				i;

	if (n >= 6 && memcmp(t, "Exif\0\0", 6) == 0)
	{
		t += 6;
		n -= 6;
	}
	if (n < 8)
		return 1;
	if (t[0] == 'M' && t[1] == 'M')
		be = 1;
	else if (t[0] == 'I' && t[1] == 'I')
		be = 0;
	else
		return 1;
	ifd = rd32(t + 4, be);
	if (ifd > n - 2 || ifd < 8)
		return 1;
	count = rd16(t + ifd, be);
	for (i = 0; i < count; i++)
	{
		size_t		e = ifd + 2 + (size_t) i * 12;

		if (e + 12 > n)
			break;
		if (rd16(t + e, be) == 0x0112 && rd16(t + e + 2, be) == 3)
		{
			unsigned	v = rd16(t + e + 8, be);

			return v >= 1 && v <= 8 ? (int) v : 1;
		}
	}
	return 1;
}

/*
 * ImageOps.exif_transpose: 2 mirror, 3 rotate 180, 4 flip, 5 transpose,
 * 6 rotate 90 clockwise, 7 transverse, 8 rotate 90 counter-clockwise.
 * Source pixel (sx, sy) of destination (x, y) in a W' x H' result.
 */
static int
apply_orientation(g4_image *img, int orientation, const g4_cancel_flag *cancel, g4_err *err)
{
	int			w = img->width,
				h = img->height;
	int			swap = orientation >= 5;
	int			dw = swap ? h : w,
				dh = swap ? w : h;
	uint8_t    *out;
	int			x,
				y,
				rc;

	if (orientation <= 1)
		return G4_OK;
	out = g4_malloc((size_t) w * (size_t) h * 3);
	if (!out)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory for a %d x %d image", w, h);
	for (y = 0; y < dh; y++)
	{
		if ((rc = g4_media_poll_cancel(cancel, err)) != G4_OK)
		{
			free(out);
			return rc;
		}
		for (x = 0; x < dw; x++)
		{
			int			sx,
						sy;

			switch (orientation)
			{
				case 2:
					sx = w - 1 - x, sy = y;
					break;
				case 3:
					sx = w - 1 - x, sy = h - 1 - y;
					break;
				case 4:
					sx = x, sy = h - 1 - y;
					break;
				case 5:
					sx = y, sy = x;
					break;
				case 6:
					sx = y, sy = h - 1 - x;
					break;
				case 7:
					sx = w - 1 - y, sy = h - 1 - x;
					break;
				default:		/* 8 */
					sx = w - 1 - y, sy = x;
					break;
			}
			memcpy(out + ((size_t) y * dw + x) * 3, img->rgb + ((size_t) sy * w + sx) * 3, 3);
		}
	}
	free(img->rgb);
	img->rgb = out;
	img->width = dw;
	img->height = dh;
	return G4_OK;
}

/* ---- PNG ---- */

typedef struct
{
	const uint8_t *data;
	size_t		len;
	size_t		off;
	char		msg[200];
	jmp_buf		jb;
} png_src;

static void
png_read_mem(png_structp png, png_bytep out, size_t n)
{
	png_src    *s = png_get_io_ptr(png);

	if (n > s->len - s->off)
		png_error(png, "truncated PNG data");
	memcpy(out, s->data + s->off, n);
	s->off += n;
}

static void
png_on_error(png_structp png, png_const_charp msg)
{
	png_src    *s = png_get_error_ptr(png);

	snprintf(s->msg, sizeof(s->msg), "%s", msg);
	longjmp(s->jb, 1);
}

static void
png_on_warning(png_structp png, png_const_charp msg)
{
}

static int
decode_png(const uint8_t *data, size_t len, int64_t max_pixels, const g4_cancel_flag *cancel, g4_image *img,
		   g4_err *err)
{
	png_src		src;
	png_structp png;
	png_infop	info = NULL;
	uint8_t    *volatile tmp16 = NULL;
	volatile int rc = G4_OK;
	volatile int orientation = 1;

	memset(&src, 0, sizeof(src));
	src.data = data;
	src.len = len;
	png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_on_error, png_on_warning);
	if (!png || !(info = png_create_info_struct(png)))
	{
		png_destroy_read_struct(&png, NULL, NULL);
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	}
	if (setjmp(src.jb))
	{
		if (rc == G4_OK)
			rc = g4_fail(err, G4_ERR_INVALID, "%s%s", strstr(src.msg, "PNG") ? "" : "corrupt PNG data: ",
						 src.msg);
		goto done;
	}
	png_set_read_fn(png, &src, png_read_mem);
	/* CRC errors: PIL's decoder does not stop for ancillary chunks either */
	png_set_crc_action(png, PNG_CRC_ERROR_QUIT, PNG_CRC_WARN_DISCARD);
	png_read_info(png, info);
	{
		png_uint_32 w = png_get_image_width(png, info);
		png_uint_32 h = png_get_image_height(png, info);
		int			depth = png_get_bit_depth(png, info);
		int			type = png_get_color_type(png, info);
		int			grey16 = type == PNG_COLOR_TYPE_GRAY && depth == 16;
		int			passes,
					pass;
		png_uint_32 y;

		if ((rc = check_size(w, h, max_pixels, "PNG", err)) != G4_OK)
			goto done;
		if (type == PNG_COLOR_TYPE_PALETTE)
			png_set_palette_to_rgb(png);
		if (type == PNG_COLOR_TYPE_GRAY && depth < 8)
			png_set_expand_gray_1_2_4_to_8(png);
		if (depth == 16)
		{
			if (type != PNG_COLOR_TYPE_GRAY)
				png_set_strip_16(png);	/* high byte, as PIL's "RGB;16B" */
		}
		/* alpha, and a palette's tRNS alpha, are dropped as convert("RGB") does */
		if ((type & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, info, PNG_INFO_tRNS))
			png_set_strip_alpha(png);
		if ((type == PNG_COLOR_TYPE_GRAY || type == PNG_COLOR_TYPE_GRAY_ALPHA) && !grey16)
			png_set_gray_to_rgb(png);
		passes = png_set_interlace_handling(png);
		png_read_update_info(png, info);
		if (png_get_rowbytes(png, info) != (size_t) w * (grey16 ? 2 : 3))
		{
			rc = g4_fail(err, G4_ERR_INTERNAL, "unexpected PNG row layout (%zu bytes for %u pixels)",
						 (size_t) png_get_rowbytes(png, info), (unsigned) w);
			goto done;
		}
		if ((rc = alloc_rgb(img, (int) w, (int) h, err)) != G4_OK)
			goto done;
		/* row by row, pass by pass, as png_read_image reads them, polling
		 * cancel in between; 16-bit grey (big-endian samples) goes to the
		 * last two thirds of each row, to be clipped and replicated there */
		for (pass = 0; pass < passes; pass++)
			for (y = 0; y < h; y++)
			{
				if ((rc = g4_media_poll_cancel(cancel, err)) != G4_OK)
					goto done;
				png_read_row(png, img->rgb + (size_t) y * w * 3 + (grey16 ? w : 0), NULL);
			}
		if (grey16)
		{
			/* each sample is clipped to 255 and replicated (the mode "I;16"
			 * conversion), walking the row through a copy since the RGB
			 * output overtakes its source */
			tmp16 = g4_malloc((size_t) w * 2);
			if (!tmp16)
			{
				rc = g4_fail(err, G4_ERR_NOMEM, "out of memory");
				goto done;
			}
			for (y = 0; y < h; y++)
			{
				uint8_t    *dst = img->rgb + (size_t) y * w * 3;
				png_uint_32 x;

				memcpy(tmp16, dst + w, (size_t) w * 2);
				for (x = 0; x < w; x++)
				{
					unsigned	v16 = (unsigned) tmp16[2 * x] << 8 | tmp16[2 * x + 1];
					uint8_t		v = v16 > 255 ? 255 : (uint8_t) v16;

					dst[3 * x] = dst[3 * x + 1] = dst[3 * x + 2] = v;
				}
			}
		}
		png_read_end(png, info);
#ifdef PNG_eXIf_SUPPORTED
		{
			png_uint_32 n = 0;
			png_bytep	exif = NULL;

			if (png_get_eXIf_1(png, info, &n, &exif) && exif)
				orientation = exif_orientation(exif, n);
		}
#endif
	}
done:
	free(tmp16);
	png_destroy_read_struct(&png, &info, NULL);
	if (rc == G4_OK)
		rc = apply_orientation(img, orientation, cancel, err);
	if (rc != G4_OK)
		g4_image_free(img);
	return rc;
}

/* ---- JPEG ---- */

/* Scans a progressive JPEG may have: encoders write about ten; each scan of
 * a large image is a pass over all its coefficients, so a small file of
 * thousands of repeated scans would take minutes to decode.  A limit like
 * djpeg's -maxscans. */
#define JPEG_MAX_SCANS 100

typedef struct
{
	struct jpeg_error_mgr pub;
	struct jpeg_progress_mgr progress;
	jmp_buf		jb;
	int			truncated;
	int			too_many_scans;
	const g4_cancel_flag *cancel;
	g4_err	   *err;
	int			cancelled;
} jpeg_errors;

static void
jpeg_on_error(j_common_ptr cinfo)
{
	jpeg_errors *e = (jpeg_errors *) cinfo->err;

	longjmp(e->jb, 1);
}

/* Called once per iMCU row of each scan as jpeg_start_decompress takes in
 * a progressive file, and once per jpeg_read_scanlines call: stop at the
 * scan limit, or when cancelled. */
static void
jpeg_on_progress(j_common_ptr cinfo)
{
	jpeg_errors *e = (jpeg_errors *) cinfo->err;

	if (cinfo->is_decompressor && ((j_decompress_ptr) cinfo)->input_scan_number > JPEG_MAX_SCANS)
	{
		e->too_many_scans = 1;
		longjmp(e->jb, 1);
	}
	if (g4_media_poll_cancel(e->cancel, e->err) != G4_OK)
	{
		e->cancelled = 1;
		longjmp(e->jb, 1);
	}
}

/* Premature end of data is a warning to libjpeg (it pads with grey); PIL
 * refuses such files ("image file is truncated"), and so do we. */
static void
jpeg_on_message(j_common_ptr cinfo, int level)
{
	jpeg_errors *e = (jpeg_errors *) cinfo->err;

	if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF)
		e->truncated = 1;
}

static int
decode_jpeg(const uint8_t *data, size_t len, int64_t max_pixels, const g4_cancel_flag *cancel, g4_image *img,
			g4_err *err)
{
	struct jpeg_decompress_struct cinfo;
	jpeg_errors je;
	uint8_t    *volatile row = NULL;
	volatile int rc = G4_OK;
	volatile int orientation = 1;

	memset(&cinfo, 0, sizeof(cinfo));
	cinfo.err = jpeg_std_error(&je.pub);
	je.pub.error_exit = jpeg_on_error;
	je.pub.emit_message = jpeg_on_message;
	je.truncated = 0;
	je.too_many_scans = 0;
	je.cancel = cancel;
	je.err = err;
	je.cancelled = 0;
	memset(&je.progress, 0, sizeof(je.progress));
	je.progress.progress_monitor = jpeg_on_progress;
	if (setjmp(je.jb))
	{
		char		msg[JMSG_LENGTH_MAX];

		if (rc == G4_OK && je.cancelled)
			rc = G4_ERR_CANCELLED;	/* err set by jpeg_on_progress */
		if (rc == G4_OK && je.too_many_scans)
			rc = g4_fail(err, G4_ERR_INVALID, "the JPEG has more than %d scans", JPEG_MAX_SCANS);
		if (rc == G4_OK)
		{
			je.pub.format_message((j_common_ptr) & cinfo, msg);
			rc = g4_fail(err, G4_ERR_INVALID, "corrupt JPEG data: %s", msg);
		}
		goto done;
	}
	jpeg_create_decompress(&cinfo);
	cinfo.progress = &je.progress;	/* after create, which clears cinfo */
	jpeg_mem_src(&cinfo, data, (unsigned long) len);
	jpeg_save_markers(&cinfo, JPEG_APP0 + 1, 0xFFFF);
	jpeg_read_header(&cinfo, TRUE);
	if ((rc = check_size(cinfo.image_width, cinfo.image_height, max_pixels, "JPEG", err)) != G4_OK)
		goto done;
	{
		jpeg_saved_marker_ptr m;

		for (m = cinfo.marker_list; m; m = m->next)
			if (m->marker == JPEG_APP0 + 1 && m->data_length >= 6 && memcmp(m->data, "Exif\0\0", 6) == 0)
			{
				orientation = exif_orientation(m->data, m->data_length);
				break;
			}
	}
	{
		int			cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
		/* Adobe's inverted CMYK whether or not the file says so, as PIL
		 * reads it (JpegImagePlugin: "assume adobe conventions") */
		int			inverted = cmyk;
		int			comps;
		JDIMENSION	w,
					x;

		cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
		jpeg_start_decompress(&cinfo);
		w = cinfo.output_width;
		comps = cinfo.output_components;
		if ((rc = alloc_rgb(img, (int) w, (int) cinfo.output_height, err)) != G4_OK)
			goto done;
		row = g4_malloc((size_t) w * comps);
		if (!row)
		{
			rc = g4_fail(err, G4_ERR_NOMEM, "out of memory");
			goto done;
		}
		while (cinfo.output_scanline < cinfo.output_height)
		{
			uint8_t    *dst = img->rgb + (size_t) cinfo.output_scanline * w * 3;
			JSAMPROW	rp = row;

			jpeg_read_scanlines(&cinfo, &rp, 1);
			if (!cmyk)
			{
				memcpy(dst, row, (size_t) w * 3);
				continue;
			}
			for (x = 0; x < w; x++)
			{
				int			k = row[4 * x + 3],
							c;

				if (inverted)
					k = 255 - k;
				for (c = 0; c < 3; c++)
				{
					int			v = inverted ? 255 - row[4 * x + c] : row[4 * x + c];
					/* PIL's MULDIV255((255 - v), (255 - k)) */
					int			t = (255 - v) * (255 - k) + 128;

					dst[3 * x + c] = (uint8_t) (((t >> 8) + t) >> 8);
				}
			}
		}
		jpeg_finish_decompress(&cinfo);
		if (je.truncated)
			rc = g4_fail(err, G4_ERR_INVALID, "truncated JPEG data");
	}
done:
	free(row);
	jpeg_destroy_decompress(&cinfo);
	if (rc == G4_OK)
		rc = apply_orientation(img, orientation, cancel, err);
	if (rc != G4_OK)
		g4_image_free(img);
	return rc;
}

/* ---- WebP ---- */

/* The EXIF chunk of a RIFF/WEBP container, or NULL. */
static const uint8_t *
webp_exif(const uint8_t *data, size_t len, size_t *n)
{
	size_t		off = 12;

	while (off + 8 <= len)
	{
		size_t		sz = rd32(data + off + 4, 0);

		if (sz > len - off - 8)
			return NULL;
		if (memcmp(data + off, "EXIF", 4) == 0)
		{
			*n = sz;
			return data + off + 8;
		}
		off += 8 + sz + (sz & 1);
	}
	return NULL;
}

/* Bytes of a WebP handed to its decoder at a time: at a photograph's
 * compression some hundred thousand pixels, under a millisecond. */
#define WEBP_PIECE 16384

/* WebPDecode has no progress hook: the incremental decoder, given the
 * file a piece more at a time (in place, no copy), decodes what each
 * piece completes and lets cancel be polled in between.  Its pixels are
 * WebPDecodeRGBInto's. */
static int
decode_webp_pixels(const uint8_t *data, size_t len, const g4_cancel_flag *cancel, g4_image *img, g4_err *err)
{
	WebPIDecoder *idec = WebPINewRGB(MODE_RGB, img->rgb, (size_t) img->width * img->height * 3, img->width * 3);
	size_t		fed = 0;
	int			rc = G4_OK;

	if (!idec)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	for (;;)
	{
		VP8StatusCode st;

		if ((rc = g4_media_poll_cancel(cancel, err)) != G4_OK)
			break;
		fed = G4_MIN(len, fed + WEBP_PIECE);
		st = WebPIUpdate(idec, data, fed);
		if (st == VP8_STATUS_OK)
			break;
		if (st != VP8_STATUS_SUSPENDED || fed == len)
		{
			rc = g4_fail(err, G4_ERR_INVALID, "corrupt or truncated WebP data");
			break;
		}
	}
	WebPIDelete(idec);
	return rc;
}

static int
decode_webp(const uint8_t *data, size_t len, int64_t max_pixels, const g4_cancel_flag *cancel, g4_image *img,
			g4_err *err)
{
	WebPBitstreamFeatures f;
	const uint8_t *exif;
	size_t		exif_n = 0;
	int			rc;

	switch (WebPGetFeatures(data, len, &f))
	{
		case VP8_STATUS_OK:
			break;
		case VP8_STATUS_NOT_ENOUGH_DATA:
			return g4_fail(err, G4_ERR_INVALID, "truncated WebP data");
		default:
			return g4_fail(err, G4_ERR_INVALID, "corrupt WebP data");
	}
	if (f.has_animation)
		return g4_fail(err, G4_ERR_INVALID, "animated WebP is not supported");
	if ((rc = check_size(f.width, f.height, max_pixels, "WebP", err)) != G4_OK)
		return rc;
	if ((rc = alloc_rgb(img, f.width, f.height, err)) != G4_OK)
		return rc;
	rc = decode_webp_pixels(data, len, cancel, img, err);
	exif = webp_exif(data, len, &exif_n);
	if (rc == G4_OK)
		rc = apply_orientation(img, exif ? exif_orientation(exif, exif_n) : 1, cancel, err);
	if (rc != G4_OK)
		g4_image_free(img);
	return rc;
}

/* ---- GIF ---- */

typedef struct
{
	const uint8_t *data;
	size_t		len;
	size_t		off;
} gif_src;

static int
gif_read_mem(GifFileType *gif, GifByteType *out, int n)
{
	gif_src    *s = gif->UserData;
	size_t		k = G4_MIN((size_t) n, s->len - s->off);

	memcpy(out, s->data + s->off, k);
	s->off += k;
	return (int) k;
}

static int
gif_error(GifFileType *gif, int code, g4_err *err)
{
	if (code == D_GIF_ERR_READ_FAILED || code == D_GIF_ERR_EOF_TOO_SOON)
		return g4_fail(err, G4_ERR_INVALID, "truncated GIF data");
	return g4_fail(err, G4_ERR_INVALID, "corrupt GIF data: %s", GifErrorString(code) ? GifErrorString(code) : "?");
}

static int
decode_gif(const uint8_t *data, size_t len, int64_t max_pixels, const g4_cancel_flag *cancel, g4_image *img,
		   g4_err *err)
{
	gif_src		src = {data, len, 0};
	int			code = 0;
	GifFileType *gif = DGifOpen(&src, gif_read_mem, &code);
	GifByteType *idx = NULL;
	int			transparent = -1;
	int			rc = G4_OK;

	if (!gif)
		return gif_error(NULL, code, err);
	/* a screen already past the limit is refused before any frame is read;
	 * an empty one is sized by its frame below */
	if (gif->SWidth > 0 && gif->SHeight > 0 &&
		(rc = check_size(gif->SWidth, gif->SHeight, max_pixels, "GIF", err)) != G4_OK)
		goto done;
	for (;;)
	{
		GifRecordType rt;

		if (DGifGetRecordType(gif, &rt) == GIF_ERROR)
		{
			rc = gif_error(gif, gif->Error, err);
			goto done;
		}
		if (rt == TERMINATE_RECORD_TYPE)
		{
			rc = g4_fail(err, G4_ERR_INVALID, "the GIF has no image");
			goto done;
		}
		if (rt == EXTENSION_RECORD_TYPE)
		{
			int			ext;
			GifByteType *block;

			if (DGifGetExtension(gif, &ext, &block) == GIF_ERROR)
			{
				rc = gif_error(gif, gif->Error, err);
				goto done;
			}
			while (block)
			{
				if (ext == GRAPHICS_EXT_FUNC_CODE && block[0] >= 4 && (block[1] & 1))
					transparent = block[4];
				if (DGifGetExtensionNext(gif, &block) == GIF_ERROR)
				{
					rc = gif_error(gif, gif->Error, err);
					goto done;
				}
			}
			continue;
		}
		if (rt != IMAGE_DESC_RECORD_TYPE)
			continue;
		if (DGifGetImageDesc(gif) == GIF_ERROR)
		{
			rc = gif_error(gif, gif->Error, err);
			goto done;
		}
		break;
	}
	{
		GifImageDesc *d = &gif->Image;
		ColorMapObject *cm = d->ColorMap ? d->ColorMap : gif->SColorMap;
		int			fw = d->Width,
					fh = d->Height;
		/* the canvas grows to hold a frame past the logical screen, as
		 * PIL's does */
		int			W = G4_MAX(gif->SWidth, d->Left + fw),
					H = G4_MAX(gif->SHeight, d->Top + fh);
		int			i,
					x,
					y;
		static const int ilace_start[4] = {0, 4, 2, 1},
					ilace_step[4] = {8, 8, 4, 2};
		GifPixelType *line;

		if (!cm)
		{
			rc = g4_fail(err, G4_ERR_INVALID, "corrupt GIF data: no colour table");
			goto done;
		}
		if (fw <= 0 || fh <= 0 || (int64_t) fw * fh > max_pixels)
		{
			rc = g4_fail(err, G4_ERR_INVALID, "corrupt GIF data: a %d x %d frame", fw, fh);
			goto done;
		}
		if ((rc = check_size(W, H, max_pixels, "GIF", err)) != G4_OK)
			goto done;
		idx = g4_malloc((size_t) W * H + (size_t) fw);
		if (!idx)
		{
			rc = g4_fail(err, G4_ERR_NOMEM, "out of memory");
			goto done;
		}
		memset(idx, transparent >= 0 ? transparent : 0, (size_t) W * H);
		line = idx + (size_t) W * H;
		/* rows arrive in storage order: four passes when interlaced */
		for (i = 0; i < (d->Interlace ? 4 : 1); i++)
			for (y = d->Interlace ? ilace_start[i] : 0; y < fh; y += d->Interlace ? ilace_step[i] : 1)
			{
				int			dy = d->Top + y;

				if ((rc = g4_media_poll_cancel(cancel, err)) != G4_OK)
					goto done;
				if (DGifGetLine(gif, line, fw) == GIF_ERROR)
				{
					rc = gif_error(gif, gif->Error, err);
					goto done;
				}
				if (dy < 0 || dy >= H)
					continue;
				for (x = 0; x < fw; x++)
					if (d->Left + x >= 0 && d->Left + x < W)
						idx[(size_t) dy * W + d->Left + x] = line[x];
			}
		if ((rc = alloc_rgb(img, W, H, err)) != G4_OK)
			goto done;
		for (y = 0; y < H; y++)
		{
			if ((rc = g4_media_poll_cancel(cancel, err)) != G4_OK)
				goto done;
			for (x = 0; x < W; x++)
			{
				size_t		at = (size_t) y * W + x;
				int			c = idx[at];
				GifColorType col = c < cm->ColorCount ? cm->Colors[c] : (GifColorType) {0, 0, 0};

				img->rgb[3 * at] = col.Red;
				img->rgb[3 * at + 1] = col.Green;
				img->rgb[3 * at + 2] = col.Blue;
			}
		}
	}
done:
	free(idx);
	DGifCloseFile(gif, &code);
	if (rc != G4_OK)
		g4_image_free(img);
	return rc;
}

int
g4_image_decode(const uint8_t *data, size_t len, int64_t max_pixels, const g4_cancel_flag *cancel, g4_image *out,
				g4_err *err)
{
	memset(out, 0, sizeof(*out));
	if (!data || len == 0)
		return g4_fail(err, G4_ERR_INVALID, "the file is empty");
	if (len >= 8 && memcmp(data, "\x89PNG\r\n\x1a\n", 8) == 0)
		return decode_png(data, len, max_pixels, cancel, out, err);
	if (len >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF)
		return decode_jpeg(data, len, max_pixels, cancel, out, err);
	if (len >= 12 && memcmp(data, "RIFF", 4) == 0 && memcmp(data + 8, "WEBP", 4) == 0)
		return decode_webp(data, len, max_pixels, cancel, out, err);
	if (len >= 6 && (memcmp(data, "GIF87a", 6) == 0 || memcmp(data, "GIF89a", 6) == 0))
		return decode_gif(data, len, max_pixels, cancel, out, err);
	return g4_fail(err, G4_ERR_INVALID, "unsupported image format (PNG, JPEG, WebP and GIF are read)");
}
