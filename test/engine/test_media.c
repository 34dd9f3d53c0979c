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
#include <dirent.h>

#include "harness.h"
#include "media.h"
#include "test.h"

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
		CHECK_OK(g4_image_decode((const uint8_t *) data, len, G4_DEFAULT_MAX_IMAGE_PIXELS, &img, &err), &err);
		free(data);
		CHECK_MSG(img.width == g4j_get_int(c, "decoded_w", -1) && img.height == g4j_get_int(c, "decoded_h", -1),
				  "%s: decoded %d x %d, PIL %lld x %lld", file, img.width, img.height,
				  (long long) g4j_get_int(c, "decoded_w", -1), (long long) g4j_get_int(c, "decoded_h", -1));
		CHECK_MSG(hash_is(fnv1a64(img.rgb, (size_t) img.width * img.height * 3), g4j_get_str(c, "decoded_fnv")),
				  "%s: the decoded RGB differs from PIL's", file);
		CHECK_OK(g4_image_target_size(img.height, img.width, budget, &th, &tw, &err), &err);
		CHECK_INT(tw, g4j_get_int(c, "resized_w", -1));
		CHECK_INT(th, g4j_get_int(c, "resized_h", -1));
		CHECK_OK(g4_image_to_input(&img, budget, &in, &err), &err);
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
		CHECK_OK(g4_audio_decode((const uint8_t *) data, len, 60, &a, &err), &err);
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
		CHECK_INT(in.n_tokens, g4j_get_int(c, "n_tokens", -1));
		CHECK(in.values[(size_t) in.n_tokens * G4_AUDIO_FRAME - 1] == 0 || n % G4_AUDIO_FRAME == 0);
		g4_media_input_free(&in);
		g4_audio_free(&a);
	}
	printf("    worst sample difference %.3g (%s)\n", worst, worst_file);
	h_golden_free(&G);
}
