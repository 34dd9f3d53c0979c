/*
 * media_preprocess.c — decoded media to the embedders' inputs, as
 * transformers 5.17's Gemma4UnifiedImageProcessor (torchvision backend) and
 * Gemma4UnifiedAudioFeatureExtractor compute them.
 *
 * Image: target size for the soft-token budget (get_aspect_ratio_preserving_
 * size), torchvision resize(BICUBIC, antialias=True) on the uint8 image,
 * value = float(u8) * float(1/255), 48 x 48 blocks in raster order, each
 * the block's HWC raster of 6912 values, position (block column, block row).
 *
 * The resize is torch's uint8 antialiased kernel (the PIL algorithm with
 * int16 weights): per output pixel the Keys (a = -0.5) filter, widened by
 * the scale when downsampling, over the input pixels around the centre,
 * normalised in double, then scaled to int16 fixed point with the largest
 * precision that keeps the largest weight below 2^15; sums in integers,
 * rounded and clamped to uint8; the horizontal pass first, each pass only
 * when that side changes.  Checked bit-exact against torch.
 *
 * Audio: zero-padded to a multiple of 640 samples, one token per frame.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "media.h"
#include "util.h"

static const int supported_soft_tokens[] = {70, 140, 280, 560, 1120};

int
g4_media_limits_from_request(const g4_request *req, g4_media_limits *lim, g4_err *err)
{
	size_t		i;
	int			ok = 0;

	lim->max_soft_tokens = req->max_soft_tokens > 0 ? req->max_soft_tokens : G4_DEFAULT_SOFT_TOKENS;
	lim->max_image_pixels = req->max_image_pixels > 0 ? req->max_image_pixels : G4_DEFAULT_MAX_IMAGE_PIXELS;
	lim->max_audio_seconds = req->max_audio_seconds > 0 ? req->max_audio_seconds : G4_DEFAULT_MAX_AUDIO_SECONDS;
	for (i = 0; i < G4_ARRAY_LEN(supported_soft_tokens); i++)
		ok |= lim->max_soft_tokens == supported_soft_tokens[i];
	if (!ok || req->max_soft_tokens < 0)
		return g4_fail(err, G4_ERR_INVALID, "max_soft_tokens must be 70, 140, 280, 560 or 1120 (got %d)",
					   req->max_soft_tokens);
	if (req->max_image_pixels < 0 || req->max_audio_seconds < 0 || isnan(req->max_audio_seconds))
		return g4_fail(err, G4_ERR_INVALID, "max_image_pixels and max_audio_seconds must not be negative");
	return G4_OK;
}

int
g4_media_poll_cancel(const g4_cancel_flag *cancel, g4_err *err)
{
	if (cancel && *cancel)
		return g4_fail(err, G4_ERR_CANCELLED, "cancelled");
	return G4_OK;
}

int
g4_image_target_size(int height, int width, int max_soft_tokens, int *out_h, int *out_w, g4_err *err)
{
	/* max_patches = budget * 3^2 patches of 16 px */
	double		target_px = (double) max_soft_tokens * 9 * 256;
	double		factor = sqrt(target_px / ((double) height * width));
	int			side = G4_PATCH_PX;
	int64_t		th = (int64_t) floor(factor * height / side) * side;
	int64_t		tw = (int64_t) floor(factor * width / side) * side;
	int64_t		max_side = (int64_t) max_soft_tokens * side;

	if (th == 0 && tw == 0)
		return g4_fail(err, G4_ERR_INVALID, "a %d x %d image cannot be resized to whole 48-pixel patches", width,
					   height);
	if (th == 0)
	{
		th = side;
		tw = G4_MIN((int64_t) floor((double) width / height) * side, max_side);
	}
	else if (tw == 0)
	{
		tw = side;
		th = G4_MIN((int64_t) floor((double) height / width) * side, max_side);
	}
	if ((double) th * tw > target_px || th <= 0 || tw <= 0)
		return g4_fail(err, G4_ERR_INVALID,
					   "a %d x %d image is too elongated for %d soft tokens (it would be resized to %lld x %lld)",
					   width, height, max_soft_tokens, (long long) tw, (long long) th);
	*out_h = (int) th;
	*out_w = (int) tw;
	return G4_OK;
}

/* ---- resize ---- */

static double
keys_cubic(double x)
{
	const double a = -0.5;

	if (x < 0)
		x = -x;
	if (x < 1)
		return ((a + 2) * x - (a + 3)) * x * x + 1;
	if (x < 2)
		return (((x - 5) * x + 8) * x - 4) * a;
	return 0;
}

/* Integer weights of one pass: for output i, taps [first[i], first[i] +
 * count[i]) of the input with weights w[i * stride ...]. */
typedef struct
{
	int		   *first;
	int		   *count;
	int16_t    *w;
	int			stride;
	int			precision;
} resize_taps;

static void
taps_free(resize_taps *t)
{
	free(t->first);
	free(t->count);
	free(t->w);
}

static int
taps_init(int in, int out, resize_taps *t, g4_err *err)
{
	double		scale = (double) in / out;
	double		fscale = scale >= 1 ? scale : 1.0;
	double		support = 2.0 * fscale;
	double	   *wd;
	double		maxw = 0;
	int			i,
				j;

	memset(t, 0, sizeof(*t));
	t->stride = (int) ceil(support) * 2 + 1;
	t->first = g4_malloc(sizeof(int) * out);
	t->count = g4_malloc(sizeof(int) * out);
	t->w = g4_malloc(sizeof(int16_t) * out * t->stride);
	wd = g4_malloc(sizeof(double) * out * t->stride);
	if (!t->first || !t->count || !t->w || !wd)
	{
		free(wd);
		taps_free(t);
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	}
	for (i = 0; i < out; i++)
	{
		double		center = scale * (i + 0.5);
		int			lo = G4_MAX((int) (center - support + 0.5), 0);
		int			hi = G4_MIN((int) (center + support + 0.5), in);
		double		sum = 0;
		double	   *w = wd + (size_t) i * t->stride;

		t->first[i] = lo;
		t->count[i] = G4_MIN(hi - lo, t->stride);
		for (j = 0; j < t->count[i]; j++)
		{
			w[j] = keys_cubic((j + lo - center + 0.5) / fscale);
			sum += w[j];
		}
		for (j = 0; j < t->count[i]; j++)
		{
			if (sum != 0)
				w[j] /= sum;
			if (w[j] > maxw)
				maxw = w[j];
		}
	}
	/* the largest precision whose largest weight still fits int16 */
	for (t->precision = 0; t->precision < 22; t->precision++)
		if ((int) (0.5 + maxw * (1 << (t->precision + 1))) >= (1 << 15))
			break;
	for (i = 0; i < out; i++)
		for (j = 0; j < t->count[i]; j++)
		{
			double		v = wd[(size_t) i * t->stride + j] * (1 << t->precision);

			t->w[(size_t) i * t->stride + j] = (int16_t) (v < 0 ? -(int) (0.5 - v) : (int) (0.5 + v));
		}
	free(wd);
	return G4_OK;
}

static inline uint8_t
clamp_u8(int32_t v)
{
	return v < 0 ? 0 : v > 255 ? 255 : (uint8_t) v;
}

/* One pass along x (horizontal) or y: src is sw x sh, dst dw x dh. */
static int
resize_pass(const uint8_t *src, int sw, int sh, uint8_t *dst, int dw, int dh, int horizontal,
			const g4_cancel_flag *cancel, g4_err *err)
{
	resize_taps t;
	int			x,
				y,
				k,
				c;
	int			rc = taps_init(horizontal ? sw : sh, horizontal ? dw : dh, &t, err);

	if (rc != G4_OK)
		return rc;
	for (y = 0; y < dh; y++)
	{
		if ((rc = g4_media_poll_cancel(cancel, err)) != G4_OK)
			break;
		for (x = 0; x < dw; x++)
		{
			int			o = horizontal ? x : y;
			const int16_t *w = t.w + (size_t) o * t.stride;

			for (c = 0; c < 3; c++)
			{
				int32_t		acc = 1 << (t.precision - 1);

				for (k = 0; k < t.count[o]; k++)
				{
					size_t		si = horizontal ? ((size_t) y * sw + t.first[o] + k)
						: ((size_t) (t.first[o] + k) * sw + x);

					acc += (int32_t) src[si * 3 + c] * w[k];
				}
				dst[((size_t) y * dw + x) * 3 + c] = clamp_u8(acc >> t.precision);
			}
		}
	}
	taps_free(&t);
	return rc;
}

int
g4_image_resize(const g4_image *in, int height, int width, const g4_cancel_flag *cancel, g4_image *out,
				g4_err *err)
{
	uint8_t    *mid = NULL;
	const uint8_t *src = in->rgb;
	int			sw = in->width;
	int			rc;

	memset(out, 0, sizeof(*out));
	out->rgb = g4_malloc((size_t) width * height * 3);
	if (!out->rgb)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	out->width = width;
	out->height = height;
	if (width != in->width)
	{
		uint8_t    *dst = height != in->height ? (mid = g4_malloc((size_t) width * in->height * 3)) : out->rgb;

		if (!dst)
		{
			g4_image_free(out);
			return g4_fail(err, G4_ERR_NOMEM, "out of memory");
		}
		if ((rc = resize_pass(src, in->width, in->height, dst, width, in->height, 1, cancel, err)) != G4_OK)
			goto fail;
		src = dst;
		sw = width;
	}
	if (height != in->height)
	{
		if ((rc = resize_pass(src, sw, in->height, out->rgb, width, height, 0, cancel, err)) != G4_OK)
			goto fail;
	}
	else if (width == in->width)
		memcpy(out->rgb, in->rgb, (size_t) width * height * 3);
	free(mid);
	return G4_OK;
fail:
	free(mid);
	g4_image_free(out);
	return rc;
}

/* ---- patches ---- */

void
g4_media_input_free(g4_media_input *in)
{
	if (!in)
		return;
	free(in->values);
	free(in->pos);
	memset(in, 0, sizeof(*in));
}

int
g4_image_to_input(const g4_image *img, int max_soft_tokens, const g4_cancel_flag *cancel, g4_media_input *out,
				  g4_err *err)
{
	g4_image	rs = {0, 0, NULL};
	const g4_image *src = img;
	const float inv255 = (float) (1.0 / 255.0);
	int			th,
				tw,
				bx,
				by,
				nbx,
				nby,
				rc;

	memset(out, 0, sizeof(*out));
	out->kind = G4_MEDIA_IMAGE;
	if ((rc = g4_image_target_size(img->height, img->width, max_soft_tokens, &th, &tw, err)) != G4_OK)
		return rc;
	if (th != img->height || tw != img->width)
	{
		if ((rc = g4_image_resize(img, th, tw, cancel, &rs, err)) != G4_OK)
			return rc;
		src = &rs;
	}
	nbx = tw / G4_PATCH_PX;
	nby = th / G4_PATCH_PX;
	out->n_tokens = nbx * nby;
	out->values = g4_malloc((size_t) out->n_tokens * G4_PATCH_DIM * sizeof(float));
	out->pos = g4_malloc((size_t) out->n_tokens * 2 * sizeof(int32_t));
	if (!out->values || !out->pos)
	{
		g4_image_free(&rs);
		g4_media_input_free(out);
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	}
	for (by = 0; by < nby; by++)
		for (bx = 0; bx < nbx; bx++)
		{
			int			t = by * nbx + bx;
			float	   *v = out->values + (size_t) t * G4_PATCH_DIM;
			int			yy,
						i;

			for (yy = 0; yy < G4_PATCH_PX; yy++)
			{
				const uint8_t *row = src->rgb + ((size_t) (by * G4_PATCH_PX + yy) * tw + bx * G4_PATCH_PX) * 3;

				for (i = 0; i < G4_PATCH_PX * 3; i++)
					v[yy * G4_PATCH_PX * 3 + i] = (float) row[i] * inv255;
			}
			out->pos[2 * t] = bx;
			out->pos[2 * t + 1] = by;
		}
	g4_image_free(&rs);
	return G4_OK;
}

int
g4_audio_to_input(g4_audio *a, g4_media_input *out, g4_err *err)
{
	size_t		padded;
	float	   *v;

	memset(out, 0, sizeof(*out));
	out->kind = G4_MEDIA_AUDIO;
	if (a->n <= 0)
		return g4_fail(err, G4_ERR_INVALID, "the audio holds no samples");
	out->n_tokens = (int) G4_DIV_UP(a->n, G4_AUDIO_FRAME);
	padded = (size_t) out->n_tokens * G4_AUDIO_FRAME;
	/* the samples become the frames in place: never held twice */
	v = g4_realloc(a->samples, padded * sizeof(float));
	if (!v)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	memset(v + a->n, 0, (padded - (size_t) a->n) * sizeof(float));
	out->values = v;
	out->seconds = (double) a->n / G4_AUDIO_RATE;
	a->samples = NULL;
	a->n = 0;
	return G4_OK;
}

int
g4_media_prepare(const g4_media *m, int number, const g4_media_limits *lim, const g4_cancel_flag *cancel,
				 g4_media_input *out, g4_err *err)
{
	double		t0 = g4_now();
	int			rc;

	memset(out, 0, sizeof(*out));
	if (m->kind == G4_MEDIA_IMAGE)
	{
		g4_image	img;

		rc = g4_image_decode(m->data, m->len, lim->max_image_pixels, cancel, &img, err);
		if (rc == G4_OK)
		{
			rc = g4_image_to_input(&img, lim->max_soft_tokens, cancel, out, err);
			g4_image_free(&img);
		}
		if (rc != G4_OK)
			return g4_fail_ctx(err, "image %d", number);
	}
	else if (m->kind == G4_MEDIA_AUDIO)
	{
		g4_audio	a;

		rc = g4_audio_decode(m->data, m->len, lim->max_audio_seconds, cancel, &a, err);
		if (rc == G4_OK)
		{
			rc = g4_audio_to_input(&a, out, err);
			g4_audio_free(&a);
		}
		if (rc != G4_OK)
			return g4_fail_ctx(err, "audio %d", number);
	}
	else
		return g4_fail(err, G4_ERR_INVALID, "media item %d has an unknown kind %d", number, m->kind);
	out->decode_seconds = g4_now() - t0;
	return G4_OK;
}
