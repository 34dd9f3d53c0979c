/*
 * test_media_cancel.c — a request cancelled while one large item is being
 * decoded or resized stops inside that item, with G4_ERR_CANCELLED and
 * nothing left allocated (the sanitized run checks the leaks).
 *
 * Each item is generated here (noise, so that it takes long to decode): a
 * progressive JPEG, an interlaced PNG, a GIF and a WebP of 6 megapixels,
 * the resize of such an image to its soft-token budget, and 30 s of
 * stereo audio at 192 kHz.  A second thread sets the cancel flag as soon
 * as the call has begun.  Each call handles that one item (the decoder or
 * the resize itself; the audio through g4_media_prepare, which names the
 * item), so it can answer G4_ERR_CANCELLED only by having seen the flag
 * inside the item, before its end; without the polls it decodes the whole
 * item and answers G4_OK.  That outcome is what is asserted, not any time.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "harness.h"
#include "image_encode.h"
#include "media.h"
#include "test.h"

#define BIG_W 3000
#define BIG_H 2000

/* ---- the race: the flag set once the call has begun ---- */

typedef struct
{
	g4_cancel_flag cancel;
	atomic_int	started;
} cancel_race;

static void *
cancel_once_started(void *arg)
{
	cancel_race *c = arg;

	while (!atomic_load(&c->started))
		sched_yield();
	c->cancel = 1;
	return NULL;
}

static void
race_begin(cancel_race *c, pthread_t *th)
{
	c->cancel = 0;
	atomic_store(&c->started, 0);
	if (pthread_create(th, NULL, cancel_once_started, c) != 0)
		abort();
	atomic_store(&c->started, 1);
}

/* ---- the tests ---- */

static int
encode_webp_lossy(const uint8_t *rgb, int w, int h, g4_buf *out)
{
	return h_encode_webp(rgb, 3, w, h, 0, out);
}

typedef struct
{
	const char *format;
	int			(*encode) (const uint8_t *rgb, int w, int h, g4_buf *out);
} image_case;

G4_TEST(media_cancel_inside_a_large_image)
{
	static const image_case cases[] = {
		{"progressive JPEG", h_encode_jpeg_progressive},
		{"interlaced PNG", h_encode_png_interlaced},
		{"GIF", h_encode_gif},
		{"WebP", encode_webp_lossy},
	};
	uint8_t    *rgb = h_noise_rgb(BIG_W, BIG_H, 0x853c49e6748fea9bull);
	size_t		k;

	CHECK(rgb);
	for (k = 0; k < G4_ARRAY_LEN(cases); k++)
	{
		g4_buf		file = {NULL, 0, 0};
		g4_image	img;
		g4_err		err;
		cancel_race race;
		pthread_t	th;
		int			rc;

		CHECK_MSG(cases[k].encode(rgb, BIG_W, BIG_H, &file), "%s: encoding failed", cases[k].format);
		memset(&err, 0, sizeof(err));
		race_begin(&race, &th);
		rc = g4_image_decode((const uint8_t *) file.data, file.len, G4_DEFAULT_MAX_IMAGE_PIXELS, &race.cancel, &img,
							 &err);
		pthread_join(th, NULL);
		g4_buf_free(&file);
		if (rc == G4_OK)
			g4_image_free(&img);
		CHECK_MSG(rc == G4_ERR_CANCELLED && strcmp(err.msg, "cancelled") == 0,
				  "%s: rc %d \"%s\", expected G4_ERR_CANCELLED", cases[k].format, rc, err.msg);
		CHECK(img.rgb == NULL);
	}
	free(rgb);
}

/* The resize of a decoded image to its budget: one pass over every row. */
G4_TEST(media_cancel_inside_a_large_resize)
{
	g4_image	img = {BIG_W, BIG_H, h_noise_rgb(BIG_W, BIG_H, 0xda3e39cb94b95bdbull)};
	g4_media_input in;
	g4_err		err;
	cancel_race race;
	pthread_t	th;
	int			rc;

	CHECK(img.rgb);
	memset(&err, 0, sizeof(err));
	race_begin(&race, &th);
	rc = g4_image_to_input(&img, G4_DEFAULT_SOFT_TOKENS, &race.cancel, &in, &err);
	pthread_join(th, NULL);
	g4_image_free(&img);
	if (rc == G4_OK)
		g4_media_input_free(&in);
	CHECK_MSG(rc == G4_ERR_CANCELLED && strcmp(err.msg, "cancelled") == 0, "rc %d \"%s\", expected G4_ERR_CANCELLED",
			  rc, err.msg);
	CHECK(in.values == NULL && in.pos == NULL);
}

/* Audio: read, down-mixed and resampled a block at a time. */
G4_TEST(media_cancel_inside_a_long_audio)
{
	const int	rate = 192000,
				seconds = 30;
	const int64_t n = (int64_t) rate * seconds;
	g4_media_limits lim = {G4_DEFAULT_SOFT_TOKENS, G4_DEFAULT_MAX_IMAGE_PIXELS, G4_DEFAULT_MAX_AUDIO_SECONDS};
	float	   *frames = calloc((size_t) n * 2, sizeof(float));
	size_t		len;
	uint8_t    *wav;
	g4_media	m;
	g4_media_input in;
	g4_err		err;
	cancel_race race;
	pthread_t	th;
	int64_t		i;
	int			rc;

	CHECK(frames);
	for (i = 0; i < n * 2; i++)
		frames[i] = (float) sin((double) i * 0.001);
	wav = h_float_wav(frames, n, 2, rate, &len);
	free(frames);
	CHECK(wav);
	m = (g4_media) {G4_MEDIA_AUDIO, wav, len};
	memset(&err, 0, sizeof(err));
	race_begin(&race, &th);
	rc = g4_media_prepare(&m, 2, &lim, &race.cancel, &in, &err);
	pthread_join(th, NULL);
	free(wav);
	if (rc == G4_OK)
		g4_media_input_free(&in);
	CHECK_MSG(rc == G4_ERR_CANCELLED && strcmp(err.msg, "audio 2: cancelled") == 0,
			  "rc %d \"%s\", expected G4_ERR_CANCELLED", rc, err.msg);
	CHECK(in.values == NULL);
}

/* A request prepared off the engine thread hands its flag to the decoders:
 * set before the call, it stops the first item, which the message names. */
G4_TEST(media_cancel_reaches_the_decoders_through_prepare)
{
	const char *model = h_fixture_model();
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	char		path[4096];
	char	   *png;
	size_t		len;
	g4_media	media[2];
	g4_request	req;
	g4_prepared *p = NULL;
	g4_cancel_flag cancel = 1;

	if (!model)
		G4_SKIP("G4_FIXTURE_MODEL not set (run through make check-engine)");
	h_options(&o, model);
	CHECK_OK(g4_open(&o, &e, &err), &err);
	snprintf(path, sizeof(path), "%s/test/fixtures/media/rgb_300x200.png", g4_test_srcdir());
	CHECK_OK(g4_read_file(path, &png, &len, &err), &err);
	media[0] = media[1] = (g4_media) {G4_MEDIA_IMAGE, (const uint8_t *) png, len};
	memset(&req, 0, sizeof(req));
	g4_sampling_default(&req.sampling);
	req.input_kind = G4_INPUT_TEXT;
	req.prompt = "Describe them.";
	req.max_tokens = 4;
	req.media = media;
	req.n_media = 2;
	memset(&err, 0, sizeof(err));
	CHECK(g4_prepare(e, &req, &cancel, &p, &err) == G4_ERR_CANCELLED && p == NULL);
	CHECK_MSG(strcmp(err.msg, "image 1: cancelled") == 0, "%s", err.msg);
	cancel = 0;
	CHECK_OK(g4_prepare(e, &req, &cancel, &p, &err), &err);
	g4_prepared_free(p);
	free(png);
	g4_close(e);
}
