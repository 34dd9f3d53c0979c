/*
 * test_media.c — media decoding and preprocessing against transformers 5.17
 * (test/golden/media.*, written by test/reference/golden_media.py from the
 * files in test/fixtures/media/), the decoders' handling of bad files
 * (test/fixtures/media/bad/ and generated corruptions), and the limits.
 *
 * Images must match exactly: the decoded RGB, the resized uint8 pixels and
 * the float32 pixel values are compared through FNV-1a hashes of their bytes
 * (the resize is torch's integer kernel, the rescale one float multiply).
 * Audio is compared sample by sample with a tolerance: the reference's
 * libsoxr build (python-soxr) and the system's may round differently.
 */
#include <gif_lib.h>
#include <webp/decode.h>

#include "harness.h"
#include "image_encode.h"
#include "media.h"
#include "test.h"
#include "xorshift.h"

/* worst |difference| allowed on a [-1, 1] waveform after resampling */
#define AUDIO_TOL 1e-4

static uint64_t
fnv1a64(const void *p, size_t n)
{
	const uint8_t *b = p;
	uint64_t	h = 0xcbf29ce484222325ull;
	size_t		i;

	for (i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

static int
read_media(const char *name, char **data, size_t *len, g4_err *err)
{
	char		path[4096];

	snprintf(path, sizeof(path), "%s/test/fixtures/media/%s", g4_test_srcdir(), name);
	return g4_read_file(path, data, len, err);
}

static int
hash_is(uint64_t h, const char *want)
{
	char		hex[32];

	snprintf(hex, sizeof(hex), "%016llx", (unsigned long long) h);
	return want && strcmp(hex, want) == 0;
}

G4_TEST(media_image_preprocessing_matches_transformers)
{
	h_golden	G;
	char		why[512];
	const g4j  *imgs;
	size_t		i;
	int			n_exact = 0;

	CHECK_MSG(h_golden_load("media", &G, why, sizeof(why)) == 0, "golden: %s", why);
	imgs = g4j_get(g4j_root(G.doc), "images");
	CHECK(g4j_len(imgs) >= 30);
	for (i = 0; i < g4j_len(imgs); i++)
	{
		const g4j  *c = g4j_at(imgs, i);
		const char *file = g4j_get_str(c, "file");
		int			budget = (int) g4j_get_int(c, "max_soft_tokens", 0);
		char	   *data;
		size_t		len;
		g4_err		err;
		g4_image	img;
		g4_media_input in;
		int			th,
					tw,
					t;
		uint8_t    *u8;

		CHECK_OK(read_media(file, &data, &len, &err), &err);
		CHECK_OK(g4_image_decode((const uint8_t *) data, len, G4_DEFAULT_MAX_IMAGE_PIXELS, NULL, &img, &err), &err);
		free(data);
		CHECK_MSG(img.width == g4j_get_int(c, "decoded_w", -1) && img.height == g4j_get_int(c, "decoded_h", -1),
				  "%s: decoded %d x %d, PIL %lld x %lld", file, img.width, img.height,
				  (long long) g4j_get_int(c, "decoded_w", -1), (long long) g4j_get_int(c, "decoded_h", -1));
		CHECK_MSG(hash_is(fnv1a64(img.rgb, (size_t) img.width * img.height * 3), g4j_get_str(c, "decoded_fnv")),
				  "%s: the decoded RGB differs from PIL's", file);
		CHECK_OK(g4_image_target_size(img.height, img.width, budget, &th, &tw, &err), &err);
		CHECK_INT(tw, g4j_get_int(c, "resized_w", -1));
		CHECK_INT(th, g4j_get_int(c, "resized_h", -1));
		CHECK_OK(g4_image_to_input(&img, budget, NULL, &in, &err), &err);
		CHECK_INT(in.n_tokens, g4j_get_int(c, "n_tokens", -1));
		for (t = 0; t < in.n_tokens; t++)
			CHECK_MSG(in.pos[2 * t] == t % (tw / 48) && in.pos[2 * t + 1] == t / (tw / 48),
					  "%s: token %d at (%d, %d)", file, t, in.pos[2 * t], in.pos[2 * t + 1]);
		u8 = malloc((size_t) in.n_tokens * G4_PATCH_DIM);
		CHECK(u8);
		for (t = 0; t < in.n_tokens * G4_PATCH_DIM; t++)
			u8[t] = (uint8_t) lrintf(in.values[t] * 255.0f);
		if (!hash_is(fnv1a64(u8, (size_t) in.n_tokens * G4_PATCH_DIM), g4j_get_str(c, "patch_u8_fnv")))
		{
			free(u8);
			CHECK_MSG(0, "%s: the resized pixels differ from torchvision's", file);
		}
		free(u8);
		CHECK_MSG(hash_is(fnv1a64(in.values, (size_t) in.n_tokens * G4_PATCH_DIM * sizeof(float)),
						  g4j_get_str(c, "pixel_values_fnv")),
				  "%s: the pixel values differ from the processor's (rescale)", file);
		n_exact++;
		g4_media_input_free(&in);
		g4_image_free(&img);
	}
	printf("    %d images: decoded RGB, resized pixels and pixel values bit-identical\n", n_exact);
	h_golden_free(&G);
}

G4_TEST(media_audio_preprocessing_matches_transformers)
{
	h_golden	G;
	char		why[512];
	const g4j  *clips;
	size_t		i;
	double		worst = 0;
	const char *worst_file = "";

	CHECK_MSG(h_golden_load("media", &G, why, sizeof(why)) == 0, "golden: %s", why);
	clips = g4j_get(g4j_root(G.doc), "audio");
	CHECK(g4j_len(clips) >= 10);
	for (i = 0; i < g4j_len(clips); i++)
	{
		const g4j  *c = g4j_at(clips, i);
		const char *file = g4j_get_str(c, "file");
		int64_t		n = g4j_get_int(c, "samples", -1);
		const float *ref = G.data + g4j_get_int(c, "samples_offset", 0);
		char	   *data;
		size_t		len;
		g4_err		err;
		g4_audio	a;
		g4_media_input in;
		double		d,
					mref;

		CHECK_OK(read_media(file, &data, &len, &err), &err);
		CHECK_OK(g4_audio_decode((const uint8_t *) data, len, 60, NULL, &a, &err), &err);
		free(data);
		CHECK_MSG(a.n == n, "%s: %lld samples at 16 kHz, the reference %lld", file, (long long) a.n, (long long) n);
		d = h_max_abs_diff(a.samples, ref, (int) n, &mref);
		CHECK_MSG(d <= AUDIO_TOL, "%s: samples differ by up to %.3g (tolerance %.3g)", file, d, AUDIO_TOL);
		if (d > worst)
		{
			worst = d;
			worst_file = file;
		}
		CHECK_OK(g4_audio_to_input(&a, &in, &err), &err);
		/* the frames are the samples, taken over, then zeros */
		CHECK(a.samples == NULL && a.n == 0);
		CHECK(h_max_abs_diff(in.values, ref, (int) n, &mref) == d);
		CHECK_INT(in.n_tokens, g4j_get_int(c, "n_tokens", -1));
		CHECK(in.values[(size_t) in.n_tokens * G4_AUDIO_FRAME - 1] == 0 || n % G4_AUDIO_FRAME == 0);
		g4_media_input_free(&in);
		g4_audio_free(&a);
	}
	printf("    worst sample difference %.3g (%s)\n", worst, worst_file);
	h_golden_free(&G);
}

/* ---- the fixture model with media, against transformers ---- */

#define ERR_FACTOR 3.0			/* as test_model.c */
#define ERR_FLOOR 1e-6

typedef struct
{
	const char *name;
	const char *text;			/* the user message; media go before it */
	const char *files[3];
	int			kinds[3];
	int			n_media;
} model_case;

static const model_case model_cases[] = {
	{"text_only", "Name three colours.", {NULL}, {0}, 0},
	{"one_image", "What is in this picture?", {"photo_640x480.jpg"}, {G4_MEDIA_IMAGE}, 1},
	{"two_images", "Compare them.", {"photo_640x480.jpg", "rgb_300x200.png"}, {G4_MEDIA_IMAGE, G4_MEDIA_IMAGE}, 2},
	{"image_audio", "Describe both.", {"rgb_300x200.png", "pcm16_16k_mono.wav"}, {G4_MEDIA_IMAGE, G4_MEDIA_AUDIO}, 2},
};

/* A chat request: one user message, the case's media (no placeholders). */
static int
case_request(const model_case *mc, g4_message *msg, g4_media *media, char **bufs, int max_tokens, g4_request *req,
			 g4_err *err)
{
	int			i;

	memset(req, 0, sizeof(*req));
	memset(msg, 0, sizeof(*msg));
	msg->role = G4_ROLE_USER;
	msg->content = mc->text;
	for (i = 0; i < mc->n_media; i++)
	{
		size_t		len;
		int			rc = read_media(mc->files[i], &bufs[i], &len, err);

		if (rc != G4_OK)
			return rc;
		media[i].kind = mc->kinds[i];
		media[i].data = (const uint8_t *) bufs[i];
		media[i].len = len;
	}
	req->input_kind = G4_INPUT_CHAT;
	req->messages = msg;
	req->n_messages = 1;
	req->media = mc->n_media ? media : NULL;
	req->n_media = mc->n_media;
	req->max_tokens = max_tokens;
	g4_sampling_default(&req->sampling);
	req->sampling.temperature = 0;
	return G4_OK;
}

static void
check_model_cases(const g4_options *o)
{
	h_golden	G;
	char		why[512];
	g4_engine  *e;
	g4_err		err;
	size_t		k;

	CHECK_MSG(h_golden_load("media", &G, why, sizeof(why)) == 0, "golden: %s", why);
	CHECK_OK(g4_open(o, &e, &err), &err);
	for (k = 0; k < G4_ARRAY_LEN(model_cases); k++)
	{
		const model_case *mc = &model_cases[k];
		const g4j  *c = NULL;
		const g4j  *cases = g4j_get(g4j_root(G.doc), "model_cases");
		g4_message	msg;
		g4_media	media[3];
		char	   *bufs[3] = {NULL, NULL, NULL};
		g4_request	req;
		g4_seq	   *s;
		int32_t    *ids,
				   *want,
				   *types;
		int			n_ids,
					n_want,
					n_types = 0,
					i;
		h_result	res;
		double		mref,
					d32,
					d64,
					ref_err;

		for (i = 0; i < (int) g4j_len(cases); i++)
			if (strcmp(g4j_get_str(g4j_at(cases, (size_t) i), "name"), mc->name) == 0)
				c = g4j_at(cases, (size_t) i);
		CHECK_MSG(c, "golden case %s missing", mc->name);
		ids = h_ints(g4j_get(c, "ids"), &n_ids);
		want = h_ints(g4j_get(c, "greedy"), &n_want);
		types = g4j_is(g4j_get(c, "mm_token_type_ids"), G4J_ARRAY) ? h_ints(g4j_get(c, "mm_token_type_ids"), &n_types) : NULL;
		CHECK_OK(case_request(mc, &msg, media, bufs, n_want, &req, &err), &err);

		/* the expanded prompt and its bidirectional blocks */
		s = g4_seq_new(e, &req, &err);
		CHECK_MSG(s, "%s: %s", mc->name, err.msg);
		CHECK_MSG(s->n_prompt == n_ids, "%s: %d prompt tokens, transformers %d", mc->name, s->n_prompt, n_ids);
		for (i = 0; i < n_ids; i++)
			CHECK_MSG(s->tok[i] == ids[i], "%s: prompt token %d is %d, transformers %d", mc->name, i, s->tok[i], ids[i]);
		for (i = 0; types && i < n_types; i++)
		{
			int			blk = s->mm_block ? s->mm_block[i] : -1;

			CHECK_MSG((types[i] == 1) == (blk >= 0), "%s: position %d has block %d, mm_token_type %d", mc->name, i,
					  blk, types[i]);
		}
		g4_seq_free(s);

		/* logits and the greedy continuation */
		CHECK_OK(h_run_one(e, &req, 100000, &res, &err), &err);
		CHECK_MSG(!res.failed && res.first_logits, "%s failed: %s", mc->name, res.error);
		d32 = h_max_abs_diff(res.first_logits, G.data + g4j_get_int(c, "logits_offset", 0), res.vocab, &mref);
		d64 = h_max_abs_diff(res.first_logits, G.data + g4j_get_int(c, "logits64_offset", 0), res.vocab, NULL);
		ref_err = g4j_get_num(c, "fp32_vs_fp64", 0.0);
		printf("    %-12s %4d prompt tokens: |engine - float64| = %.2e, |transformers fp32 - float64| = %.2e, "
			   "|engine - transformers| = %.2e (logits up to %.2f)\n", mc->name, n_ids, d64, ref_err, d32, mref);
		CHECK_MSG(d64 <= ERR_FACTOR * ref_err + ERR_FLOOR, "%s: logits %.3g from the float64 reference (bound %.3g)",
				  mc->name, d64, ERR_FACTOR * ref_err + ERR_FLOOR);
		for (i = 0; i < n_want && i < res.n_tokens; i++)
			CHECK_MSG(res.tokens[i] == want[i], "%s: greedy token %d is %d, transformers %d", mc->name, i,
					  res.tokens[i], want[i]);
		CHECK_MSG(res.n_tokens == n_want, "%s: %d greedy tokens, transformers %d", mc->name, res.n_tokens, n_want);
		h_result_free(&res);
		for (i = 0; i < mc->n_media; i++)
			free(bufs[i]);
		free(ids);
		free(want);
		free(types);
	}
	g4_close(e);
	h_golden_free(&G);
}

G4_TEST(media_model_logits_and_greedy_match_transformers)
{
	const char *model = h_fixture_model();
	g4_options	o;

	if (!model)
		G4_SKIP("G4_FIXTURE_MODEL not set (run through make check-engine)");
	h_options(&o, model);
	check_model_cases(&o);
}

/* ---- bad input ---- */

typedef struct
{
	const char *file;
	int			kind;
	const char *message;		/* a part of the error message */
} bad_case;

static const bad_case bad_cases[] = {
	{"empty.png", G4_MEDIA_IMAGE, "image 1: the file is empty"},
	{"truncated.png", G4_MEDIA_IMAGE, "image 1: truncated PNG data"},
	{"header_only.png", G4_MEDIA_IMAGE, "image 1: truncated PNG data"},
	{"bad_ihdr_crc.png", G4_MEDIA_IMAGE, "image 1: corrupt PNG data"},
	{"bomb_60000x60000.png", G4_MEDIA_IMAGE, "image 1: the PNG image is 60000 x 60000 pixels, more than the limit"},
	{"zero_width.png", G4_MEDIA_IMAGE, "image 1: corrupt PNG data"},
	{"truncated.jpg", G4_MEDIA_IMAGE, "image 1: truncated JPEG data"},
	{"soi_only.jpg", G4_MEDIA_IMAGE, "image 1: corrupt JPEG data"},
	{"truncated.webp", G4_MEDIA_IMAGE, "image 1: corrupt or truncated WebP data"},
	{"truncated.gif", G4_MEDIA_IMAGE, "image 1: truncated GIF data"},
	{"gif_no_image.gif", G4_MEDIA_IMAGE, "image 1: the GIF has no image"},
	{"scans_200x150.jpg", G4_MEDIA_IMAGE, "image 1: the JPEG has more than 100 scans"},
	{"bitmap.bmp", G4_MEDIA_IMAGE, "image 1: unsupported image format"},
	{"text.txt", G4_MEDIA_IMAGE, "image 1: unsupported image format"},
	{"random.bin", G4_MEDIA_IMAGE, "image 1: unsupported image format"},
	{"random.bin", G4_MEDIA_AUDIO, "audio 1: unsupported audio format"},
	{"truncated_header.wav", G4_MEDIA_AUDIO, "audio 1: corrupt or truncated WAV data"},
	{"corrupt.flac", G4_MEDIA_AUDIO, "audio 1: corrupt or truncated FLAC data"},
	{"truncated.ogg", G4_MEDIA_AUDIO, "audio 1: corrupt or truncated Ogg data"},
	{"no_samples.wav", G4_MEDIA_AUDIO, "audio 1: the WAV file holds no samples"},
	{"empty.png", G4_MEDIA_AUDIO, "audio 1: the file is empty"},
};

static int
read_bad(const char *name, char **data, size_t *len, g4_err *err)
{
	char		sub[256];

	snprintf(sub, sizeof(sub), "bad/%s", name);
	return read_media(sub, data, len, err);
}

G4_TEST(media_bad_files_fail_clearly)
{
	g4_media_limits lim = {G4_DEFAULT_SOFT_TOKENS, G4_DEFAULT_MAX_IMAGE_PIXELS, G4_DEFAULT_MAX_AUDIO_SECONDS};
	size_t		k;

	for (k = 0; k < G4_ARRAY_LEN(bad_cases); k++)
	{
		const bad_case *b = &bad_cases[k];
		char	   *data;
		size_t		len;
		g4_err		err;
		g4_media	m;
		g4_media_input in;
		int			rc;

		CHECK_OK(read_bad(b->file, &data, &len, &err), &err);
		m.kind = b->kind;
		m.data = (const uint8_t *) data;
		m.len = len;
		memset(&err, 0, sizeof(err));
		rc = g4_media_prepare(&m, 1, &lim, NULL, &in, &err);
		free(data);
		CHECK_MSG(rc == G4_ERR_INVALID && strstr(err.msg, b->message),
				  "%s: rc %d \"%s\", expected G4_ERR_INVALID with \"%s\"", b->file, rc, err.msg, b->message);
	}
}

/* A real 10-hour WAV (8-bit mono at 1 kHz: 36 MB) is refused from its
 * header, before any sample is read or converted. */
G4_TEST(media_ten_hour_wav_refused)
{
	g4_media_limits lim = {G4_DEFAULT_SOFT_TOKENS, G4_DEFAULT_MAX_IMAGE_PIXELS, G4_DEFAULT_MAX_AUDIO_SECONDS};
	const uint32_t rate = 1000,
				n = 36000u * rate;
	uint8_t    *w = malloc(44 + (size_t) n);
	uint8_t		hdr[44] = "RIFF\0\0\0\0WAVEfmt \x10\0\0\0\x01\0\x01\0\0\0\0\0\0\0\0\0\x01\0\x08\0data";
	g4_media	m;
	g4_media_input in;
	g4_err		err;
	int			rc;

	CHECK(w);
	hdr[4] = (uint8_t) ((36 + n) & 0xFF), hdr[5] = (uint8_t) ((36 + n) >> 8), hdr[6] = (uint8_t) ((36 + n) >> 16),
		hdr[7] = (uint8_t) ((36 + n) >> 24);
	hdr[24] = (uint8_t) (rate & 0xFF), hdr[25] = (uint8_t) (rate >> 8);	/* sample rate */
	hdr[28] = (uint8_t) (rate & 0xFF), hdr[29] = (uint8_t) (rate >> 8);	/* byte rate */
	hdr[40] = (uint8_t) (n & 0xFF), hdr[41] = (uint8_t) (n >> 8), hdr[42] = (uint8_t) (n >> 16),
		hdr[43] = (uint8_t) (n >> 24);
	memcpy(w, hdr, 44);
	memset(w + 44, 0x80, n);
	m.kind = G4_MEDIA_AUDIO;
	m.data = w;
	m.len = 44 + (size_t) n;
	rc = g4_media_prepare(&m, 1, &lim, NULL, &in, &err);
	free(w);
	CHECK_MSG(rc == G4_ERR_INVALID && strstr(err.msg, "audio 1: the WAV audio lasts 36000.0 s, more than the limit of 600 s"),
			  "rc %d: %s", rc, err.msg);
}

/* Limits come from the request: the same files pass or fail by them. */
G4_TEST(media_limits_apply)
{
	g4_request	req;
	g4_media_limits lim;
	g4_err		err;
	char	   *data;
	size_t		len;
	g4_media	m;
	g4_media_input in;

	memset(&req, 0, sizeof(req));
	CHECK_OK(g4_media_limits_from_request(&req, &lim, &err), &err);
	CHECK_INT(lim.max_soft_tokens, 280);
	req.max_soft_tokens = 100;
	CHECK(g4_media_limits_from_request(&req, &lim, &err) == G4_ERR_INVALID);
	CHECK(strstr(err.msg, "70, 140, 280, 560 or 1120"));
	req.max_soft_tokens = 70;
	req.max_image_pixels = 640 * 480 - 1;
	req.max_audio_seconds = 0.4;
	CHECK_OK(g4_media_limits_from_request(&req, &lim, &err), &err);

	CHECK_OK(read_media("photo_640x480.jpg", &data, &len, &err), &err);
	m.kind = G4_MEDIA_IMAGE;
	m.data = (const uint8_t *) data;
	m.len = len;
	CHECK(g4_media_prepare(&m, 3, &lim, NULL, &in, &err) == G4_ERR_INVALID);
	CHECK_MSG(strstr(err.msg, "image 3: the JPEG image is 640 x 480 pixels, more than the limit of 307199"), "%s",
			  err.msg);
	lim.max_image_pixels = 640 * 480;
	CHECK_OK(g4_media_prepare(&m, 3, &lim, NULL, &in, &err), &err);
	CHECK_INT(in.n_tokens, 63);	/* 70-token budget: 432 x 336 */
	g4_media_input_free(&in);
	free(data);

	CHECK_OK(read_media("pcm16_16k_mono.wav", &data, &len, &err), &err);
	m.kind = G4_MEDIA_AUDIO;
	m.data = (const uint8_t *) data;
	m.len = len;
	CHECK(g4_media_prepare(&m, 2, &lim, NULL, &in, &err) == G4_ERR_INVALID);
	CHECK_MSG(strstr(err.msg, "audio 2: the WAV audio lasts 0.5 s, more than the limit of 0.4 s"), "%s", err.msg);
	lim.max_audio_seconds = 0.5;
	CHECK_OK(g4_media_prepare(&m, 2, &lim, NULL, &in, &err), &err);
	CHECK_INT(in.n_tokens, 13);
	g4_media_input_free(&in);
	free(data);
}

/*
 * Fuzz the decoders: every good file cut at many lengths and with bytes
 * flipped at deterministic places must decode or fail with G4_ERR_INVALID,
 * never crash or report anything else.
 */
G4_TEST(media_decoder_fuzz)
{
	static const char *const files[] = {
		"rgb_37x53.png", "rgb_interlaced.png", "palette_trns_60x60.png", "grey16_56x40.png", "grey_99x66.jpg",
		"progressive_200x150.jpg", "cmyk_72x48.jpg", "exif6_90x60.jpg", "lossy_120x90.webp",
		"alpha_lossless_40x40.webp", "interlaced_70x45.gif", "anim_first_frame.gif", "pcm8_8k_mono.wav",
		"flac16_16k_mono.flac", "mp3_44k_mono.mp3", "vorbis_44k_stereo.ogg", "float_22k_stereo.wav",
	};
	g4_media_limits lim = {70, 1 << 20, 30.0};
	uint64_t	state = 0x243f6a8885a308d3ull;
	int			runs = 0,
				ok = 0;
	size_t		f;

	for (f = 0; f < G4_ARRAY_LEN(files); f++)
	{
		char	   *data;
		size_t		len;
		g4_err		err;
		int			kind = strstr(files[f], ".wav") || strstr(files[f], ".flac") || strstr(files[f], ".mp3") ||
			strstr(files[f], ".ogg") ? G4_MEDIA_AUDIO : G4_MEDIA_IMAGE;
		int			t;

		CHECK_OK(read_media(files[f], &data, &len, &err), &err);
		for (t = 0; t < 40; t++)
		{
			uint8_t    *buf = malloc(len);
			size_t		n = len;
			g4_media	m;
			g4_media_input in;
			int			rc,
						j;

			CHECK(buf);
			memcpy(buf, data, len);
			if (t < 16)
				n = len * (size_t) (t + 1) / 17;	/* cut */
			else
				for (j = 0; j < 1 + t % 4; j++)
				{
					state = h_xorshift64(&state);
					buf[state % len] ^= (uint8_t) (1 + (state >> 32) % 255);	/* flip */
				}
			m.kind = kind;
			m.data = buf;
			m.len = n;
			memset(&err, 0, sizeof(err));
			rc = g4_media_prepare(&m, 1, &lim, NULL, &in, &err);
			CHECK_MSG(rc == G4_OK || rc == G4_ERR_INVALID, "%s variant %d: rc %d (%s)", files[f], t, rc, err.msg);
			CHECK_MSG(rc == G4_OK || strncmp(err.msg, kind == G4_MEDIA_IMAGE ? "image 1: " : "audio 1: ", 9) == 0,
					  "%s variant %d: message \"%s\" does not name the item", files[f], t, err.msg);
			ok += rc == G4_OK;
			runs++;
			if (rc == G4_OK)
				g4_media_input_free(&in);
			free(buf);
		}
		free(data);
	}
	printf("    %d damaged files: %d decoded, %d refused with a message\n", runs, ok, runs - ok);
}

/* ---- placement ---- */

/* A growing memory buffer as giflib's output. */
typedef struct
{
	uint8_t		data[4096];
	size_t		len;
} gif_out;

static int
gif_write_mem(GifFileType *g, const GifByteType *b, int n)
{
	gif_out    *o = g->UserData;

	if (n < 0 || o->len + (size_t) n > sizeof(o->data))
		return 0;
	memcpy(o->data + o->len, b, (size_t) n);
	o->len += (size_t) n;
	return n;
}

/* A one-frame GIF: a screen of sw x sh, a frame of fw x fh at (left, top),
 * two colours, pixel (x, y) = (x + y) % 2. */
static int
make_gif(gif_out *o, int sw, int sh, int left, int top, int fw, int fh)
{
	GifColorType pal[2] = {{0, 0, 0}, {255, 255, 255}};
	ColorMapObject *cm = GifMakeMapObject(2, pal);
	int			code = 0,
				y,
				x,
				ok;
	GifFileType *g;
	GifPixelType line[64];

	o->len = 0;
	g = EGifOpen(o, gif_write_mem, &code);
	if (!g || !cm)
		return 0;
	ok = EGifPutScreenDesc(g, sw, sh, 1, 0, cm) == GIF_OK && EGifPutImageDesc(g, left, top, fw, fh, false, NULL) == GIF_OK;
	for (y = 0; ok && y < fh; y++)
	{
		for (x = 0; x < fw; x++)
			line[x] = (GifPixelType) ((x + y) % 2);
		ok = EGifPutLine(g, line, fw) == GIF_OK;
	}
	GifFreeMapObject(cm);
	return EGifCloseFile(g, &code) == GIF_OK && ok;
}

/* A GIF frame past its logical screen grows the canvas (PIL's size: the
 * larger of the screen and the frame's extent), and an empty screen takes
 * the frame's size. */
G4_TEST(media_gif_frame_past_the_screen)
{
	static const struct
	{
		int			sw,
					sh,
					left,
					top,
					fw,
					fh,
					w,
					h;
	}			c[] = {{6, 5, 0, 0, 12, 10, 12, 10}, {6, 5, 3, 2, 4, 4, 7, 6}, {0, 0, 0, 0, 12, 10, 12, 10},
		{20, 20, 1, 1, 4, 4, 20, 20}};
	size_t		k;

	for (k = 0; k < G4_ARRAY_LEN(c); k++)
	{
		gif_out		o;
		g4_image	img;
		g4_err		err;

		CHECK(make_gif(&o, c[k].sw, c[k].sh, c[k].left, c[k].top, c[k].fw, c[k].fh));
		CHECK_OK(g4_image_decode(o.data, o.len, G4_DEFAULT_MAX_IMAGE_PIXELS, NULL, &img, &err), &err);
		CHECK_MSG(img.width == c[k].w && img.height == c[k].h, "case %zu: %d x %d, expected %d x %d", k, img.width,
				  img.height, c[k].w, c[k].h);
		/* the frame's pixels where it was put */
		CHECK_INT(img.rgb[3 * ((size_t) c[k].top * img.width + c[k].left) + 1], 0);
		CHECK_INT(img.rgb[3 * ((size_t) c[k].top * img.width + c[k].left + 1) + 1], 255);
		g4_image_free(&img);
	}
}

/* WebP is decoded a piece of the file at a time (so that cancel can be
 * polled in between): the pixels are those of one WebPDecodeRGBInto call,
 * for lossy and lossless files, with and without alpha, of many pieces
 * (the fixtures are one piece each). */
G4_TEST(media_webp_in_pieces_as_in_one_call)
{
	const int	w = 1000,
				h = 700;
	const size_t npx = (size_t) w * h;
	uint8_t    *rgb = h_noise_rgb(w, h, 0x6a09e667f3bcc909ull),
			   *rgba = malloc(npx * 4),
			   *want = malloc(npx * 3);
	size_t		i;
	int			lossless,
				channels;

	CHECK(rgb && rgba && want);
	for (i = 0; i < npx; i++)
	{
		memcpy(rgba + 4 * i, rgb + 3 * i, 3);
		rgba[4 * i + 3] = (uint8_t) (rgb[3 * i] ^ rgb[3 * i + 1]);
	}
	for (lossless = 0; lossless <= 1; lossless++)
		for (channels = 3; channels <= 4; channels++)
		{
			g4_buf		file = {NULL, 0, 0};
			g4_image	img;
			g4_err		err;

			CHECK(h_encode_webp(channels == 4 ? rgba : rgb, channels, w, h, lossless, &file));
			CHECK_MSG(file.len > 100000, "%zu bytes: too few pieces", file.len);
			CHECK(WebPDecodeRGBInto((const uint8_t *) file.data, file.len, want, npx * 3, w * 3));
			CHECK_OK(g4_image_decode((const uint8_t *) file.data, file.len, G4_DEFAULT_MAX_IMAGE_PIXELS, NULL, &img,
									 &err), &err);
			g4_buf_free(&file);
			CHECK(img.width == w && img.height == h);
			CHECK_MSG(memcmp(img.rgb, want, npx * 3) == 0, "%s WebP%s: the pixels differ from one call's",
					  lossless ? "lossless" : "lossy", channels == 4 ? " with alpha" : "");
			g4_image_free(&img);
		}
	free(rgb);
	free(rgba);
	free(want);
}

/* A FLAC cut short, or corrupt in the middle, is an error, not a shorter
 * clip (the reference, soundfile, raises "flac decoder lost sync"). */
G4_TEST(media_truncated_flac_is_an_error)
{
	g4_media_limits lim = {G4_DEFAULT_SOFT_TOKENS, G4_DEFAULT_MAX_IMAGE_PIXELS, G4_DEFAULT_MAX_AUDIO_SECONDS};
	char	   *data;
	size_t		len;
	g4_media	m;
	g4_media_input in;
	g4_err		err;
	int			rc;

	CHECK_OK(read_media("flac24_24k_stereo.flac", &data, &len, &err), &err);
	m = (g4_media) {G4_MEDIA_AUDIO, (const uint8_t *) data, len * 6 / 10};
	rc = g4_media_prepare(&m, 1, &lim, NULL, &in, &err);
	free(data);
	if (rc == G4_OK)
		g4_media_input_free(&in);
	CHECK_MSG(rc == G4_ERR_INVALID && strstr(err.msg, "audio 1: corrupt FLAC data"), "rc %d: %s", rc, err.msg);
}

/* Media whose soft tokens pass the window are refused as soon as they do,
 * before the remaining items are decoded (each holds its inputs until
 * then): 300 one-pixel images, a window of 128. */
G4_TEST(media_past_the_window_refused_before_the_rest_decode)
{
	const char *model = h_fixture_model();
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	char	   *img;
	size_t		img_len;
	g4_media	media[300];
	g4_request	req;
	int			i;

	if (!model)
		G4_SKIP("G4_FIXTURE_MODEL not set (run through make check-engine)");
	h_options(&o, model);
	o.max_model_len = 128;
	CHECK_OK(g4_open(&o, &e, &err), &err);
	CHECK_OK(read_media("rgb_1x1.png", &img, &img_len, &err), &err);
	for (i = 0; i < 300; i++)
		media[i] = (g4_media) {G4_MEDIA_IMAGE, (const uint8_t *) img, img_len};
	memset(&req, 0, sizeof(req));
	g4_sampling_default(&req.sampling);
	req.input_kind = G4_INPUT_TEXT;
	req.prompt = "Describe them.";
	req.max_tokens = 4;
	req.max_soft_tokens = 70;
	req.media = media;
	req.n_media = 300;
	CHECK(g4_seq_new(e, &req, &err) == NULL);
	CHECK_MSG(err.code == G4_ERR_TOO_LONG && strstr(err.msg, "the first 2 media items take"), "%d: %s", err.code,
			  err.msg);
	free(img);
	g4_close(e);
}

G4_TEST(media_placement_and_refusals)
{
	const char *model = h_fixture_model();
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	char	   *img,
			   *aud;
	size_t		img_len,
				aud_len;
	g4_media	media[2];
	g4_request	req;
	g4_seq	   *s;
	int			i,
				n_img_tok = 60,	/* rgb_300x200.png at 70: 480 x 288 */
				n_aud_tok = 13;

	if (!model)
		G4_SKIP("G4_FIXTURE_MODEL not set (run through make check-engine)");
	h_options(&o, model);
	o.max_model_len = 128;
	CHECK_OK(g4_open(&o, &e, &err), &err);
	CHECK_OK(read_media("rgb_300x200.png", &img, &img_len, &err), &err);
	CHECK_OK(read_media("pcm16_16k_mono.wav", &aud, &aud_len, &err), &err);
	media[0] = (g4_media) {G4_MEDIA_IMAGE, (const uint8_t *) img, img_len};
	media[1] = (g4_media) {G4_MEDIA_AUDIO, (const uint8_t *) aud, aud_len};
	memset(&req, 0, sizeof(req));
	g4_sampling_default(&req.sampling);
	req.input_kind = G4_INPUT_TEXT;
	req.max_tokens = 4;
	req.max_soft_tokens = 70;
	req.media = media;
	req.n_media = 2;

	/* placeholders take the next item of their kind: audio first here */
	req.prompt = "Hear <|audio|> then see <|image|>.";
	s = g4_seq_new(e, &req, &err);
	CHECK_MSG(s, "%s", err.msg);
	CHECK_INT(s->n_embeds, n_img_tok + n_aud_tok);
	/* rows in prompt order: the audio's first, then the image's */
	CHECK_INT(s->media_in[0].row_offset, n_aud_tok);
	CHECK_INT(s->media_in[1].row_offset, 0);
	for (i = 1; i < s->n_embeds; i++)
		CHECK(s->embed_pos[i] > s->embed_pos[i - 1]);
	for (i = 0; i < n_aud_tok; i++)
		CHECK(s->mm_block[s->embed_pos[i]] == -1);
	for (i = 0; i < n_img_tok; i++)
		CHECK(s->mm_block[s->embed_pos[n_aud_tok + i]] == 0);
	CHECK(s->tok[s->embed_pos[0] - 1] == e->chat.audio_begin);
	CHECK(s->tok[s->embed_pos[n_aud_tok] - 1] == e->chat.image_begin);
	g4_seq_free(s);

	/* more placeholders than items */
	req.prompt = "<|image|> and <|image|>";
	CHECK(g4_seq_new(e, &req, &err) == NULL && err.code == G4_ERR_INVALID);
	CHECK_MSG(strstr(err.msg, "more image placeholders than image items"), "%s", err.msg);
	/* fewer */
	req.prompt = "Only <|audio|>.";
	CHECK(g4_seq_new(e, &req, &err) == NULL && err.code == G4_ERR_INVALID);
	CHECK_MSG(strstr(err.msg, "1 media placeholders for 2 media items"), "%s", err.msg);

	/* media pushing the prompt past the window (128) */
	req.prompt = "Describe.";
	req.max_soft_tokens = 140;	/* 126 image tokens */
	CHECK(g4_seq_new(e, &req, &err) == NULL && err.code == G4_ERR_TOO_LONG);
	CHECK_MSG(strstr(err.msg, "context window"), "%s", err.msg);

	/* a bad item names itself, and nothing is queued */
	media[1].len = 30;
	req.max_soft_tokens = 70;
	CHECK(g4_seq_new(e, &req, &err) == NULL && err.code == G4_ERR_INVALID);
	CHECK_MSG(strstr(err.msg, "audio 1: "), "%s", err.msg);
	CHECK(!g4_has_work(e));

	free(img);
	free(aud);
	g4_close(e);
}
