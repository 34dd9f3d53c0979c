/*
 * audio_resample.c — mono samples at the file's rate, block by block, to
 * 16 kHz, as librosa.resample does by default: python-soxr's resample(),
 * which feeds libsoxr ("high quality") in chunks through soxr_process and
 * then flushes it.  round(n * 16000 / rate) samples come out, zero-padded
 * to ceil(n * 16000 / rate) (librosa's fix_length).
 *
 * libsoxr's output does not depend on how its input is cut: every stage
 * keeps its own FIFO and works on fixed-size pieces of it, so feeding a
 * file block by block gives the samples one soxr_oneshot call over the
 * whole file would (with idone NULL: with an idone pointer, soxr_oneshot
 * reads only as much input as the output buffer asks for, and leaves the
 * filter unflushed when that is short of the end).
 *
 * Memory: the 16 kHz output, which the model takes whole anyway, plus
 * libsoxr's filter state; the caller's block is consumed by each push.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <soxr.h>

#include "media.h"
#include "util.h"

struct g4_resampler
{
	int			rate;
	double		ratio;			/* output samples per input sample */
	soxr_t		soxr;			/* NULL at 16 kHz: samples pass through */
	int64_t		n_in;
	float	   *out;
	int64_t		n_out;
	int64_t		cap;
};

/* Room for `need` output samples: the header's length first, then twice
 * the capacity, so that a clip whose length the header did not give is
 * copied O(log n) times. */
static int
reserve(g4_resampler *r, int64_t need, g4_err *err)
{
	int64_t		cap = G4_MAX(need, r->cap * 2);
	float	   *p;

	if (need <= r->cap)
		return G4_OK;
	p = g4_realloc(r->out, (size_t) cap * sizeof(float));
	if (!p)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory for %lld samples", (long long) cap);
	r->out = p;
	r->cap = cap;
	return G4_OK;
}

/* Output samples for n input samples before the zero padding: round(n *
 * ratio), libsoxr's own count (its flush stops there). */
static int64_t
resampled_len(const g4_resampler *r, int64_t n)
{
	return (int64_t) ((double) n * r->ratio + 0.5);
}

/* Room asked for beyond resampled_len(input so far): the zero padding's
 * sample and libsoxr's rounding of its own count, with a margin. */
#define OUT_SLACK 64

int
g4_resampler_new(int rate, int64_t expected_in, g4_resampler **out, g4_err *err)
{
	g4_resampler *r = g4_calloc(1, sizeof(g4_resampler));
	int			rc;

	*out = NULL;
	if (!r)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	r->rate = rate;
	r->ratio = (double) G4_AUDIO_RATE / rate;
	if (rate != G4_AUDIO_RATE)
	{
		soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
		soxr_quality_spec_t q = soxr_quality_spec(SOXR_HQ, 0);
		soxr_error_t e = NULL;

		r->soxr = soxr_create(rate, G4_AUDIO_RATE, 1, &e, &io, &q, NULL);
		if (e || !r->soxr)
		{
			rc = g4_fail(err, G4_ERR_INTERNAL, "resampling from %d Hz failed: %s", rate, e ? e : "no resampler");
			g4_resampler_free(r);
			return rc;
		}
	}
	if (expected_in > 0 && (rc = reserve(r, resampled_len(r, expected_in) + OUT_SLACK, err)) != G4_OK)
	{
		g4_resampler_free(r);
		return rc;
	}
	*out = r;
	return G4_OK;
}

/* Hand libsoxr its input (NULL: the end, to flush) and take all the output
 * it has ready.  Its output lags the input by its filter's delay, so the
 * room for resampled_len(n_in) always suffices; were it short, libsoxr
 * would keep the rest for the next call. */
static int
drain(g4_resampler *r, const float *in, int64_t n, g4_err *err)
{
	do
	{
		size_t		odone = 0;
		soxr_error_t e;
		int			rc;

		if ((rc = reserve(r, G4_MAX(resampled_len(r, r->n_in), r->n_out) + OUT_SLACK, err)) != G4_OK)
			return rc;
		/* idone NULL: all of the input is taken, whatever the room */
		e = soxr_process(r->soxr, in, in ? (size_t) n : 0, NULL, r->out + r->n_out, (size_t) (r->cap - r->n_out),
						 &odone);
		if (e)
			return g4_fail(err, G4_ERR_INTERNAL, "resampling from %d Hz failed: %s", r->rate, e);
		r->n_out += (int64_t) odone;
		if (in || odone == 0)
			return G4_OK;
	} while (1);
}

int
g4_resampler_push(g4_resampler *r, const float *in, int64_t n, g4_err *err)
{
	int			rc;

	if (n <= 0)
		return G4_OK;
	r->n_in += n;
	if (r->soxr)
		return drain(r, in, n, err);
	if ((rc = reserve(r, r->n_in + OUT_SLACK, err)) != G4_OK)
		return rc;
	memcpy(r->out + r->n_out, in, (size_t) n * sizeof(float));
	r->n_out += n;
	return G4_OK;
}

int
g4_resampler_finish(g4_resampler *r, g4_audio *out, g4_err *err)
{
	int64_t		total = (int64_t) ceil((double) r->n_in * r->ratio);
	int			rc;

	memset(out, 0, sizeof(*out));
	if (r->soxr)
	{
		if ((rc = drain(r, NULL, 0, err)) != G4_OK)
			return rc;
		r->n_out = G4_MIN(r->n_out, resampled_len(r, r->n_in));
	}
	if ((rc = reserve(r, G4_MAX(total, 1), err)) != G4_OK)
		return rc;
	if (total > r->n_out)
		memset(r->out + r->n_out, 0, (size_t) (total - r->n_out) * sizeof(float));
	out->samples = r->out;
	out->n = total;
	r->out = NULL;
	r->n_out = r->cap = 0;
	return G4_OK;
}

void
g4_resampler_free(g4_resampler *r)
{
	if (!r)
		return;
	soxr_delete(r->soxr);
	free(r->out);
	free(r);
}
