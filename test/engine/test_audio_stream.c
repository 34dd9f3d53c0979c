/*
 * test_audio_stream.c — audio resampled as it is read, G4_AUDIO_BLOCK
 * samples at a time, gives exactly the samples of the whole clip held at
 * its own rate and resampled in one call (soxr_oneshot, reading all of its
 * input and flushing, as python-soxr's resample() does), for the fixtures
 * and for long synthetic clips at 44.1, 48 and 192 kHz whose lengths fall
 * on, beside and far from the block boundaries.
 */
#include <sndfile.h>
#include <soxr.h>

#include "harness.h"
#include "media.h"
#include "test.h"
#include "util.h"
#include "xorshift.h"

/* The reference: librosa.to_mono over every frame (the decoder's float sums
 * in the same order), then libsoxr "high quality" over the whole clip,
 * round(n * 16000 / rate) samples zero-padded to ceil(n * 16000 / rate). */
static int
one_shot(const float *frames, int64_t n, int channels, int rate, g4_audio *out)
{
	double		ratio = (double) G4_AUDIO_RATE / rate;
	size_t		olen = (size_t) ((double) n * ratio + 0.5);
	float	   *mono = malloc((size_t) n * sizeof(float));
	soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
	soxr_quality_spec_t q = soxr_quality_spec(SOXR_HQ, 0);
	size_t		odone = 0;
	int64_t		i;
	int			c,
				ok = 1;

	out->n = rate == G4_AUDIO_RATE ? n : (int64_t) ceil((double) n * ratio);
	out->samples = calloc((size_t) out->n + 1, sizeof(float));
	if (!mono || !out->samples)
	{
		free(mono);
		g4_audio_free(out);
		return 0;
	}
	for (i = 0; i < n; i++)
	{
		float		s = 0.0f;

		for (c = 0; c < channels; c++)
			s += frames[i * channels + c];
		mono[i] = s / (float) channels;
	}
	if (rate == G4_AUDIO_RATE)
		memcpy(out->samples, mono, (size_t) n * sizeof(float));
	else if (soxr_oneshot(rate, G4_AUDIO_RATE, 1, mono, (size_t) n, NULL, out->samples, olen, &odone, &io, &q, NULL))
	{
		g4_audio_free(out);
		ok = 0;
	}
	free(mono);
	return ok;
}

/* Where two clips first differ, or -1 when they are the same bit for bit. */
static int64_t
first_difference(const g4_audio *a, const g4_audio *b)
{
	int64_t		i;

	if (a->n != b->n)
		return G4_MIN(a->n, b->n);
	for (i = 0; i < a->n; i++)
		if (memcmp(&a->samples[i], &b->samples[i], sizeof(float)) != 0)
			return i;
	return -1;
}

/* Tones, a sweep and noise in each channel, loud to the last sample (the
 * end of a clip is where a resampler's flush shows). */
static float *
synthetic(int64_t n, int channels, int rate, uint64_t seed)
{
	float	   *f = malloc((size_t) n * channels * sizeof(float));
	int64_t		i;
	int			c;

	for (i = 0; f && i < n; i++)
		for (c = 0; c < channels; c++)
		{
			double		t = (double) i / rate;

			f[i * channels + c] = (float) (0.3 * sin(2 * M_PI * (220.0 + 110 * c) * t) +
										   0.2 * sin(2 * M_PI * (100.0 + 3000 * t / 20) * t) +
										   0.1 * (h_uniform(&seed) - 0.5));
		}
	return f;
}

/* Decode a synthetic clip and compare it with the one-shot reference. */
static void
check_synthetic(int rate, int channels, int64_t n)
{
	float	   *frames = synthetic(n, channels, rate, 0x9e3779b97f4a7c15ull ^ (uint64_t) n);
	size_t		len;
	uint8_t    *wav = frames ? h_float_wav(frames, n, channels, rate, &len) : NULL;
	g4_audio	got,
				want;
	g4_err		err;
	int64_t		at;

	CHECK(wav);
	CHECK(one_shot(frames, n, channels, rate, &want));
	free(frames);
	CHECK_OK(g4_audio_decode(wav, len, 600, NULL, &got, &err), &err);
	free(wav);
	at = first_difference(&got, &want);
	CHECK_MSG(at < 0, "%d Hz, %d channels, %lld frames: %lld samples (one shot %lld), first different at %lld "
			  "(%.9g, one shot %.9g)", rate, channels, (long long) n, (long long) got.n, (long long) want.n,
			  (long long) at, at < got.n ? got.samples[at] : 0.0, at < want.n ? want.samples[at] : 0.0);
	g4_audio_free(&got);
	g4_audio_free(&want);
}

/* Long stereo clips (20 s and a sample: one shot's buffer-bound reading
 * left the filter unflushed there at each of these rates), and lengths on
 * either side of the read blocks (stereo: G4_AUDIO_BLOCK / 2 frames). */
G4_TEST(media_audio_streamed_long_clips_as_one_shot)
{
	static const int rates[] = {44100, 48000, 192000, 16000};
	const int64_t block = G4_AUDIO_BLOCK / 2;
	size_t		r;

	for (r = 0; r < G4_ARRAY_LEN(rates); r++)
	{
		const int64_t lengths[] = {1, 2, block - 1, block, block + 1, 3 * block, 3 * block + 1,
		(int64_t) rates[r] * 20 + 1};
		size_t		k;

		for (k = 0; k < G4_ARRAY_LEN(lengths); k++)
		{
			check_synthetic(rates[r], 2, lengths[k]);
			if (g4_test_failed())
				return;
		}
	}
	/* three channels: a block of 21845 frames, not a power of two */
	check_synthetic(44100, 3, 100000);
}

/* The committed clips (WAV, FLAC, MP3, Ogg Vorbis; 1 to 3 channels). */
G4_TEST(media_audio_streamed_fixtures_as_one_shot)
{
	static const char *const files[] = {
		"pcm8_8k_mono.wav", "pcm16_11k_3ch.wav", "pcm16_16k_mono.wav", "float_22k_stereo.wav",
		"pcm24_44k_stereo.wav", "pcm32_48k_mono.wav", "flac16_16k_mono.flac", "flac24_24k_stereo.flac",
		"mp3_44k_mono.mp3", "vorbis_44k_stereo.ogg",
	};
	size_t		f;

	for (f = 0; f < G4_ARRAY_LEN(files); f++)
	{
		char		path[4096];
		char	   *data;
		size_t		len;
		SF_INFO		info;
		SNDFILE    *sf;
		float	   *frames;
		sf_count_t	n;
		g4_audio	got,
					want;
		g4_err		err;
		int64_t		at;

		snprintf(path, sizeof(path), "%s/test/fixtures/media/%s", g4_test_srcdir(), files[f]);
		memset(&info, 0, sizeof(info));
		sf = sf_open(path, SFM_READ, &info);
		CHECK_MSG(sf && info.frames > 0, "%s: %s", files[f], sf_strerror(sf));
		frames = malloc((size_t) info.frames * info.channels * sizeof(float));
		CHECK(frames);
		n = sf_readf_float(sf, frames, info.frames);
		sf_close(sf);
		CHECK(one_shot(frames, n, info.channels, info.samplerate, &want));
		free(frames);
		CHECK_OK(g4_read_file(path, &data, &len, &err), &err);
		CHECK_OK(g4_audio_decode((const uint8_t *) data, len, 60, NULL, &got, &err), &err);
		free(data);
		at = first_difference(&got, &want);
		CHECK_MSG(at < 0, "%s: %lld samples (one shot %lld), first different at %lld", files[f], (long long) got.n,
				  (long long) want.n, (long long) at);
		g4_audio_free(&got);
		g4_audio_free(&want);
	}
}

/* The resampler alone, fed one clip cut in different ways: one sample at a
 * time, in blocks, in blocks and a remainder, in irregular pieces. */
G4_TEST(media_audio_streamed_any_cut_as_one_shot)
{
	static const int rates[] = {44100, 48000, 192000, 8000};
	static const int64_t pieces[] = {1, G4_AUDIO_BLOCK, 4093, 0};	/* 0: irregular */
	const int64_t n = 2 * G4_AUDIO_BLOCK + 7;
	size_t		r,
				p;

	for (r = 0; r < G4_ARRAY_LEN(rates); r++)
	{
		float	   *mono = synthetic(n, 1, rates[r], 0x2545f4914f6cdd1dull);
		g4_audio	want;

		CHECK(mono);
		CHECK(one_shot(mono, n, 1, rates[r], &want));
		for (p = 0; p < G4_ARRAY_LEN(pieces); p++)
		{
			g4_resampler *rs;
			g4_audio	got;
			g4_err		err;
			uint64_t	seed = 7;
			int64_t		done = 0,
						at;

			/* with the length known from a header, or not */
			CHECK_OK(g4_resampler_new(rates[r], p % 2 ? n : 0, &rs, &err), &err);
			while (done < n)
			{
				int64_t		k = G4_MIN(n - done, pieces[p] ? pieces[p] : 1 + (int64_t) (h_xorshift64(&seed) % 9000));

				CHECK_OK(g4_resampler_push(rs, mono + done, k, &err), &err);
				done += k;
			}
			CHECK_OK(g4_resampler_finish(rs, &got, &err), &err);
			g4_resampler_free(rs);
			at = first_difference(&got, &want);
			CHECK_MSG(at < 0, "%d Hz in pieces of %lld: %lld samples (one shot %lld), first different at %lld",
					  rates[r], (long long) pieces[p], (long long) got.n, (long long) want.n, (long long) at);
			g4_audio_free(&got);
		}
		g4_audio_free(&want);
		free(mono);
	}
}
