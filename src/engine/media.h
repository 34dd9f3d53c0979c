/*
 * media.h — images and audio from raw file bytes to the model's inputs.
 *
 * Decoding (image_decode.c, audio_decode.c) gives what transformers 5.17's
 * processor sees when it loads a file: PIL's Image.open, exif_transpose and
 * convert("RGB") for images; for audio a mono waveform at 16 kHz (channels
 * averaged, resampled with libsoxr at its "high quality" setting, which is
 * librosa's default resampler).  Formats are detected from the bytes.
 *
 * Preprocessing (media_preprocess.c) is Gemma4UnifiedImageProcessor's and
 * Gemma4UnifiedAudioFeatureExtractor's: the soft-token budget's target size,
 * the antialiased bicubic resize on uint8, x * float(1/255), 48 x 48 patches
 * with their (x, y) block positions; 640-sample audio frames.
 *
 * Everything here is pure and thread-safe: no engine, no backend.  The
 * functions that take a `cancel` flag (NULL: none) poll it once per row of
 * pixels or block of samples, so that a request cancelled in the middle of
 * a large item stops within about a millisecond of work, with
 * G4_ERR_CANCELLED and everything freed.
 */
#ifndef G4_MEDIA_H
#define G4_MEDIA_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"

#define G4_PATCH_PX 48			/* model patch side: 16-px patches merged 3 x 3 */
#define G4_PATCH_DIM (G4_PATCH_PX * G4_PATCH_PX * 3)	/* 6912 values per image token */
#define G4_AUDIO_RATE 16000
#define G4_AUDIO_FRAME 640		/* samples per audio token (40 ms) */
/* samples (all channels) the audio decoder reads at a time: 256 kB */
#define G4_AUDIO_BLOCK 65536

#define G4_DEFAULT_SOFT_TOKENS 280
/* PIL's Image.MAX_IMAGE_PIXELS (its decompression-bomb threshold) */
#define G4_DEFAULT_MAX_IMAGE_PIXELS INT64_C(89478485)
#define G4_DEFAULT_MAX_AUDIO_SECONDS 600.0

/* An 8-bit RGB image, rows top to bottom, pixels R, G, B. */
typedef struct
{
	int			width;
	int			height;
	uint8_t    *rgb;			/* [height][width][3] */
} g4_image;

/* Mono samples at G4_AUDIO_RATE. */
typedef struct
{
	float	   *samples;
	int64_t		n;
	double		source_seconds; /* duration of the file as decoded */
} g4_audio;

/* One media item ready for its embedder. */
typedef struct g4_media_input
{
	int			kind;			/* g4_media_kind */
	int			n_tokens;		/* soft tokens */
	float	   *values;			/* image: [n_tokens][G4_PATCH_DIM]; audio: [n_tokens][G4_AUDIO_FRAME] */
	int32_t    *pos;			/* image: [n_tokens][2] (x, y) block position; audio: NULL */
	double		seconds;		/* audio duration (0 for images) */
	double		decode_seconds; /* wall time spent decoding and preprocessing */
	int			row_offset;		/* first of its rows among the prompt's soft-token rows */
} g4_media_input;

typedef struct
{
	int			max_soft_tokens;	/* per image: 70, 140, 280, 560 or 1120 */
	int64_t		max_image_pixels;
	double		max_audio_seconds;
} g4_media_limits;

/* Resolve a request's limits (0 fields take the defaults) and check them. */
int			g4_media_limits_from_request(const g4_request *req, g4_media_limits *lim, g4_err *err);

/* ---- decoders (image_decode.c, audio_decode.c); messages name no item ---- */

/* Decode PNG, JPEG, WebP or GIF (first frame).  The pixel count is checked
 * against max_pixels from the header, before any pixel memory is taken. */
int			g4_image_decode(const uint8_t *data, size_t len, int64_t max_pixels,
							const g4_cancel_flag *cancel, g4_image *out, g4_err *err);
void		g4_image_free(g4_image *img);

/* Decode WAV, FLAC, MP3 or Ogg Vorbis to mono 16 kHz; longer than
 * max_seconds (from the header when it says) fails.  Read and resampled
 * G4_AUDIO_BLOCK samples at a time: the file's own rate is never held
 * whole. */
int			g4_audio_decode(const uint8_t *data, size_t len, double max_seconds,
							const g4_cancel_flag *cancel, g4_audio *out, g4_err *err);
void		g4_audio_free(g4_audio *a);

/* ---- streaming resampler to G4_AUDIO_RATE (audio_resample.c) ---- */

typedef struct g4_resampler g4_resampler;

/* A resampler from `rate`; expected_in (0: unknown) sizes its output. */
int			g4_resampler_new(int rate, int64_t expected_in, g4_resampler **out, g4_err *err);
/* The next n mono samples at the input rate (not kept after the call). */
int			g4_resampler_push(g4_resampler *r, const float *in, int64_t n, g4_err *err);
/* Flush: out takes the 16 kHz samples of everything pushed. */
int			g4_resampler_finish(g4_resampler *r, g4_audio *out, g4_err *err);
void		g4_resampler_free(g4_resampler *r);

/* ---- preprocessing (media_preprocess.c) ---- */

/* G4_ERR_CANCELLED, with a message, once *cancel is set (NULL: never). */
int			g4_media_poll_cancel(const g4_cancel_flag *cancel, g4_err *err);

/* get_aspect_ratio_preserving_size: the resized height and width (multiples
 * of 48) for a soft-token budget. */
int			g4_image_target_size(int height, int width, int max_soft_tokens, int *out_h, int *out_w,
								 g4_err *err);

/* Antialiased bicubic resize of 8-bit RGB (torch's uint8 kernel: Keys
 * a = -0.5 weights scaled to int16 fixed point, horizontal pass then
 * vertical, each rounded to uint8). */
int			g4_image_resize(const g4_image *in, int height, int width, const g4_cancel_flag *cancel,
							g4_image *out, g4_err *err);

/* Resize to the budget, rescale and cut into patches with positions. */
int			g4_image_to_input(const g4_image *img, int max_soft_tokens, const g4_cancel_flag *cancel,
							  g4_media_input *out, g4_err *err);

/* Frame audio into 640-sample tokens, zero-padding the last.  Takes the
 * samples: `a` is left empty (and is untouched on failure). */
int			g4_audio_to_input(g4_audio *a, g4_media_input *out, g4_err *err);

/* Decode and preprocess one item of a request.  `number` is its 1-based
 * index among the items of its kind; error messages start with "image N: "
 * or "audio N: ". */
int			g4_media_prepare(const g4_media *m, int number, const g4_media_limits *lim,
							 const g4_cancel_flag *cancel, g4_media_input *out, g4_err *err);
void		g4_media_input_free(g4_media_input *in);

#endif
