/*
 * audio_decode.c — WAV (PCM 8/16/24/32 bit, float), FLAC, MP3 and Ogg
 * Vorbis through libsndfile, read from memory, to mono float at 16 kHz.
 *
 * The samples are what soundfile.read(dtype="float32") gives (libsndfile's
 * normalised floats: integer PCM divided by its full scale), averaged over
 * the channels (librosa.to_mono), then resampled as librosa.resample does
 * by default (audio_resample.c).  The model's feature extractor itself
 * never resamples: it assumes 16 kHz.
 *
 * The file is read G4_AUDIO_BLOCK samples at a time, each block down-mixed
 * and resampled before the next is read: besides the 16 kHz output, the
 * decoder holds one block, whatever the file's rate and length.
 */
#include <stdlib.h>
#include <string.h>

#include <sndfile.h>

#include "media.h"
#include "util.h"

void
g4_audio_free(g4_audio *a)
{
	if (!a)
		return;
	free(a->samples);
	a->samples = NULL;
	a->n = 0;
}

typedef struct
{
	const uint8_t *data;
	sf_count_t	len;
	sf_count_t	off;
} mem_file;

static sf_count_t
mem_length(void *user)
{
	return ((mem_file *) user)->len;
}

static sf_count_t
mem_seek(sf_count_t offset, int whence, void *user)
{
	mem_file   *m = user;
	sf_count_t	base = whence == SEEK_SET ? 0 : whence == SEEK_CUR ? m->off : m->len;

	/* compared without adding: offsets come from the file */
	if (offset < -base || offset > m->len - base)
		return -1;
	m->off = base + offset;
	return m->off;
}

static sf_count_t
mem_read(void *ptr, sf_count_t count, void *user)
{
	mem_file   *m = user;
	sf_count_t	n = G4_MIN(count, m->len - m->off);

	if (n <= 0)
		return 0;
	memcpy(ptr, m->data + m->off, (size_t) n);
	m->off += n;
	return n;
}

static sf_count_t
mem_write(const void *ptr, sf_count_t count, void *user)
{
	return 0;
}

static sf_count_t
mem_tell(void *user)
{
	return ((mem_file *) user)->off;
}

/* The container from the first bytes, for messages and the format check. */
static const char *
sniff(const uint8_t *d, size_t n)
{
	if (n >= 12 && memcmp(d, "RIFF", 4) == 0 && memcmp(d + 8, "WAVE", 4) == 0)
		return "WAV";
	if (n >= 12 && memcmp(d, "RF64", 4) == 0 && memcmp(d + 8, "WAVE", 4) == 0)
		return "WAV";
	if (n >= 4 && memcmp(d, "fLaC", 4) == 0)
		return "FLAC";
	if (n >= 4 && memcmp(d, "OggS", 4) == 0)
		return "Ogg";
	if (n >= 3 && memcmp(d, "ID3", 3) == 0)
		return "MP3";
	if (n >= 2 && d[0] == 0xFF && (d[1] & 0xE0) == 0xE0)
		return "MP3";
	return NULL;
}

/* librosa.to_mono over the frames of a block, in place: mono sample i is
 * written over samples the frames up to i have already given. */
static void
mix_to_mono(float *buf, int64_t frames, int channels)
{
	int64_t		i;

	if (channels == 1)
		return;
	for (i = 0; i < frames; i++)
	{
		const float *fr = buf + i * channels;
		float		s = 0.0f;
		int			c;

		for (c = 0; c < channels; c++)
			s += fr[c];
		buf[i] = s / (float) channels;
	}
}

int
g4_audio_decode(const uint8_t *data, size_t len, double max_seconds, const g4_cancel_flag *cancel, g4_audio *out,
				g4_err *err)
{
	SF_VIRTUAL_IO io = {mem_length, mem_seek, mem_read, mem_write, mem_tell};
	mem_file	mf = {data, (sf_count_t) len, 0};
	SF_INFO		info;
	SNDFILE    *sf;
	const char *fmt;
	float	   *buf = NULL;
	g4_resampler *rs = NULL;
	int64_t		cap,
				block,
				n = 0;
	int			rc = G4_OK;

	memset(out, 0, sizeof(*out));
	if (!data || len == 0)
		return g4_fail(err, G4_ERR_INVALID, "the file is empty");
	fmt = sniff(data, len);
	if (!fmt)
		return g4_fail(err, G4_ERR_INVALID, "unsupported audio format (WAV, FLAC, MP3 and Ogg Vorbis are read)");
	memset(&info, 0, sizeof(info));
	sf = sf_open_virtual(&io, SFM_READ, &info, &mf);
	if (!sf)
		return g4_fail(err, G4_ERR_INVALID, "corrupt or truncated %s data: %s", fmt, sf_strerror(NULL));
	if (info.channels <= 0 || info.samplerate <= 0)
	{
		rc = g4_fail(err, G4_ERR_INVALID, "corrupt %s data: %d channels at %d Hz", fmt, info.channels,
					 info.samplerate);
		goto done;
	}
	/* the work a second of audio costs grows with its rate: 192 kHz, the
	 * fastest that recordings use, bounds it */
	if (info.samplerate < 1000 || info.samplerate > 192000)
	{
		rc = g4_fail(err, G4_ERR_INVALID, "unsupported sample rate %d Hz (1000 to 192000)", info.samplerate);
		goto done;
	}
	/* the header's length when it gives one; reading stops at the limit anyway */
	if (info.frames > 0 && (double) info.frames / info.samplerate > max_seconds)
	{
		rc = g4_fail(err, G4_ERR_INVALID, "the %s audio lasts %.1f s, more than the limit of %g s (max_audio_seconds)",
					 fmt, (double) info.frames / info.samplerate, max_seconds);
		goto done;
	}
	cap = (int64_t) (max_seconds * info.samplerate) + 1;
	if (info.frames > 0 && info.frames < cap)
		cap = info.frames + 1;
	block = G4_MAX(G4_AUDIO_BLOCK / info.channels, 1);
	buf = g4_malloc((size_t) block * info.channels * sizeof(float));
	if (!buf)
	{
		rc = g4_fail(err, G4_ERR_NOMEM, "out of memory");
		goto done;
	}
	if ((rc = g4_resampler_new(info.samplerate, info.frames > 0 ? cap - 1 : 0, &rs, err)) != G4_OK)
		goto done;
	for (;;)
	{
		sf_count_t	got;

		if ((rc = g4_media_poll_cancel(cancel, err)) != G4_OK)
			goto done;
		got = sf_readf_float(sf, buf, block);
		if (got <= 0)
			break;
		if (n + got > cap - 1)
		{
			rc = g4_fail(err, G4_ERR_INVALID, "the %s audio lasts more than the limit of %g s (max_audio_seconds)",
						 fmt, max_seconds);
			goto done;
		}
		mix_to_mono(buf, got, info.channels);
		if ((rc = g4_resampler_push(rs, buf, got, err)) != G4_OK)
			goto done;
		n += got;
	}
	if (sf_error(sf) != SF_ERR_NO_ERROR)
	{
		rc = g4_fail(err, G4_ERR_INVALID, "corrupt %s data: %s", fmt, sf_strerror(sf));
		goto done;
	}
	/* a FLAC's header counts its samples exactly: fewer means the decoder
	 * lost its way (cut short, or corrupt in the middle), an error as
	 * soundfile reads it, not a shorter clip */
	if (strcmp(fmt, "FLAC") == 0 && info.frames > 0 && n < info.frames)
	{
		rc = g4_fail(err, G4_ERR_INVALID, "corrupt FLAC data: %lld of the %lld samples its header declares",
					 (long long) n, (long long) info.frames);
		goto done;
	}
	if (n == 0)
	{
		rc = g4_fail(err, G4_ERR_INVALID, "the %s file holds no samples", fmt);
		goto done;
	}
	if ((rc = g4_resampler_finish(rs, out, err)) != G4_OK)
		goto done;
	out->source_seconds = (double) n / info.samplerate;
done:
	g4_resampler_free(rs);
	free(buf);
	sf_close(sf);
	return rc;
}
