/*
 * sampler.c — host-side token sampling.
 */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "util.h"

/* ---- random numbers: splitmix64 seeding xoshiro256** ---- */

static uint64_t
splitmix(uint64_t *x)
{
	uint64_t	z = (*x += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

void
g4_rng_seed(g4_rng *r, uint64_t seed)
{
	uint64_t	x = seed;
	int			i;

	for (i = 0; i < 4; i++)
		r->s[i] = splitmix(&x);
}

static uint64_t
rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

uint64_t
g4_rng_next(g4_rng *r)
{
	uint64_t   *s = r->s;
	uint64_t	result = rotl(s[1] * 5, 7) * 9;
	uint64_t	t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return result;
}

double
g4_rng_uniform(g4_rng *r)
{
	return (double) (g4_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- token history ---- */

int
g4_hist_init(g4_token_hist *h, int vocab, const int32_t *prompt, int n_prompt)
{
	int			i;

	h->vocab = vocab;
	h->in_prompt = g4_calloc((size_t) vocab, 1);
	h->out_count = g4_calloc((size_t) vocab, sizeof(int32_t));
	if (!h->in_prompt || !h->out_count)
	{
		g4_hist_free(h);
		return G4_ERR_NOMEM;
	}
	for (i = 0; i < n_prompt; i++)
		if (prompt[i] >= 0 && prompt[i] < vocab)
			h->in_prompt[prompt[i]] = 1;
	return G4_OK;
}

void
g4_hist_add_output(g4_token_hist *h, int32_t id)
{
	if (h->out_count && id >= 0 && id < h->vocab)
		h->out_count[id]++;
}

void
g4_hist_free(g4_token_hist *h)
{
	free(h->in_prompt);
	free(h->out_count);
	h->in_prompt = NULL;
	h->out_count = NULL;
}

void
g4_sampler_scratch_free(g4_sampler_scratch *s)
{
	free(s->probs);
	free(s->idx);
	memset(s, 0, sizeof(*s));
}

int
g4_sampling_needs_hist(const g4_sampling *p)
{
	return p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
}

int
g4_sampling_validate(const g4_sampling *p, g4_err *err)
{
	if (!(p->temperature >= 0.0f) || !isfinite(p->temperature))
		return g4_fail(err, G4_ERR_INVALID, "temperature must be a finite number >= 0 (got %g)",
					   (double) p->temperature);
	if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
		return g4_fail(err, G4_ERR_INVALID, "top_p must be in (0, 1] (got %g)", (double) p->top_p);
	if (p->top_k < 0)
		return g4_fail(err, G4_ERR_INVALID, "top_k must be >= 0, 0 meaning no limit (got %d)", p->top_k);
	if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
		return g4_fail(err, G4_ERR_INVALID, "min_p must be in [0, 1] (got %g)", (double) p->min_p);
	if (!(p->repetition_penalty > 0.0f) || !isfinite(p->repetition_penalty))
		return g4_fail(err, G4_ERR_INVALID, "repetition_penalty must be > 0 (got %g)",
					   (double) p->repetition_penalty);
	if (!isfinite(p->presence_penalty) || fabsf(p->presence_penalty) > 2.0f)
		return g4_fail(err, G4_ERR_INVALID, "presence_penalty must be in [-2, 2] (got %g)",
					   (double) p->presence_penalty);
	if (!isfinite(p->frequency_penalty) || fabsf(p->frequency_penalty) > 2.0f)
		return g4_fail(err, G4_ERR_INVALID, "frequency_penalty must be in [-2, 2] (got %g)",
					   (double) p->frequency_penalty);
	return G4_OK;
}

int32_t
g4_argmax(const float *x, int n)
{
	int32_t		best = 0;
	float		bv = x[0];
	int			has_nan = isnan(bv);
	int			i;

	for (i = 1; i < n; i++)
	{
		float		v = x[i];

		if (v > bv)
		{
			bv = v;
			best = i;
		}
		has_nan |= isnan(v);
	}
	return has_nan ? G4_SAMPLE_NAN : best;
}

/* The integer weight of an id of relative probability e in [0, 1]. */
static inline uint64_t
fixed_weight(float e)
{
	return (uint64_t) (e * G4_SAMPLE_FIXED_ONE);
}

/* The sampling order: larger e first, then the smaller id. */
static inline int
before(const float *e, int32_t i, int32_t j)
{
	return e[i] > e[j] || (e[i] == e[j] && i < j);
}

/* qsort_r comparator in the sampling order (context: e) */
static int
cmp_order(const void *a, const void *b, void *ctx)
{
	int32_t		i = *(const int32_t *) a;
	int32_t		j = *(const int32_t *) b;

	return before(ctx, i, j) ? -1 : before(ctx, j, i);
}

/* Partition idx[0..n) so its first k entries are the k first in the
 * sampling order (quickselect; the order is total, so the set is unique). */
static void
select_first(int32_t *idx, int n, int k, const float *e)
{
	int			lo = 0,
				hi = n - 1;

	while (lo < hi)
	{
		int32_t		pivot = idx[(lo + hi) / 2];
		int			i = lo,
					j = hi;

		while (i <= j)
		{
			while (before(e, idx[i], pivot))
				i++;
			while (before(e, pivot, idx[j]))
				j--;
			if (i <= j)
			{
				int32_t		t = idx[i];

				idx[i] = idx[j];
				idx[j] = t;
				i++;
				j--;
			}
		}
		if (k - 1 <= j)
			hi = j;
		else if (k - 1 >= i)
			lo = i;
		else
			break;
	}
}

/* top-p: the length of the shortest run of idx[0..n), in the sampling
 * order, whose weight reaches top_p of the whole; idx is reordered.  Only a
 * prefix is sorted when it holds that run. */
static int
top_p_keep(int32_t *idx, int n, float top_p, const float *e)
{
	uint64_t	all = 0,
				cum = 0;
	double		target;
	int			sorted = G4_MIN(n, 1024);
	int			i;

	for (i = 0; i < n; i++)
		all += fixed_weight(e[idx[i]]);
	target = (double) top_p * (double) all;
	if (sorted < n)
		select_first(idx, n, sorted, e);
	for (;;)
	{
		qsort_r(idx, (size_t) sorted, sizeof(int32_t), cmp_order, (void *) e);
		cum = 0;
		for (i = 0; i < sorted; i++)
		{
			cum += fixed_weight(e[idx[i]]);
			if ((double) cum >= target)
				return i + 1;
		}
		if (sorted == n)
			return n;
		sorted = n;
	}
}

/* Suppressed ids and penalties, in place. */
static void
adjust_logits(float *logits, int vocab, const g4_sampling *p, const g4_token_hist *hist, const int32_t *suppress,
			  int n_suppress)
{
	int			i;

	for (i = 0; i < n_suppress; i++)
		if (suppress[i] >= 0 && suppress[i] < vocab)
			logits[suppress[i]] = -INFINITY;

	if (hist && g4_sampling_needs_hist(p))
	{
		for (i = 0; i < vocab; i++)
		{
			int			seen_out = hist->out_count[i] > 0;

			if (p->repetition_penalty != 1.0f && (seen_out || hist->in_prompt[i]))
				logits[i] = logits[i] > 0 ? logits[i] / p->repetition_penalty : logits[i] * p->repetition_penalty;
			if (seen_out)
				logits[i] -= p->presence_penalty + p->frequency_penalty * (float) hist->out_count[i];
		}
	}
}

/*
 * The kept set at temperature > 0 (a row without NaN, maxl its largest
 * logit, finite): fills sc->probs with each id's relative probability e and
 * returns the id closing the kept prefix of the sampling order (ids not
 * after it are kept) and the kept ids' total integer weight; -1 when out
 * of memory.
 */
static int32_t
kept_set(const float *logits, int vocab, float maxl, const g4_sampling *p, g4_sampler_scratch *sc,
		 uint64_t *total)
{
	float	   *e;
	float		emin;
	int32_t		last;
	int			i;
	int			n;

	if (sc->cap < vocab)
	{
		float	   *pr = realloc(sc->probs, (size_t) vocab * sizeof(float));
		int32_t    *ix = realloc(sc->idx, (size_t) vocab * sizeof(int32_t));

		if (pr)
			sc->probs = pr;
		if (ix)
			sc->idx = ix;
		if (!pr || !ix)
			return -1;
		sc->cap = vocab;
	}
	/* relative probabilities at temperature T (the largest is exactly 1) */
	e = sc->probs;
	emin = p->min_p > 0.0f ? p->min_p : 0x1p-149f;
	n = 0;
	for (i = 0; i < vocab; i++)
	{
		/* no NaN: the row holds none, and maxl is finite */
		e[i] = expf((logits[i] - maxl) / p->temperature);
		if (e[i] >= emin)
			sc->idx[n++] = i;
	}
	if (p->top_k > 0 && p->top_k < n)
	{
		select_first(sc->idx, n, p->top_k, e);
		n = p->top_k;
	}
	if (p->top_p < 1.0f)
		n = top_p_keep(sc->idx, n, p->top_p, e);

	/* the kept set is a prefix of the sampling order: its last entry decides
	 * membership */
	last = sc->idx[0];
	*total = 0;
	for (i = 0; i < n; i++)
	{
		if (before(e, last, sc->idx[i]))
			last = sc->idx[i];
		*total += fixed_weight(e[sc->idx[i]]);
	}
	return last;
}

int32_t
g4_sample(float *logits, int vocab, const g4_sampling *p, const g4_token_hist *hist,
		  const int32_t *suppress, int n_suppress, g4_rng *rng, g4_sampler_scratch *sc)
{
	float		maxl;
	int32_t		best,
				last;
	uint64_t	total,
				cum;
	double		u,
				target;
	int			i;

	adjust_logits(logits, vocab, p, hist, suppress, n_suppress);
	best = g4_argmax(logits, vocab);
	if (p->temperature == 0.0f)
		return best;
	/* one draw per sampled token, whatever happens next: the device sampler
	 * receives the same draw from the host */
	u = g4_rng_uniform(rng);
	if (best == G4_SAMPLE_NAN || !isfinite(logits[best]))
		return best;
	maxl = logits[best];
	last = kept_set(logits, vocab, maxl, p, sc, &total);
	if (last < 0)
		return best;			/* out of memory: degrade to greedy */

	/* the draw walks the kept ids in id order */
	target = u * (double) total;
	cum = 0;
	best = last;
	for (i = 0; i < vocab; i++)
	{
		if (before(sc->probs, last, i))
			continue;
		best = i;
		cum += fixed_weight(sc->probs[i]);
		if ((double) cum > target)
			return i;
	}
	return best;				/* rounding left the target unreached: the last kept id */
}

int
g4_sample_dist(float *logits, int vocab, const g4_sampling *p, const g4_token_hist *hist,
			   const int32_t *suppress, int n_suppress, g4_sampler_scratch *sc, double *probs)
{
	int32_t		best,
				last;
	uint64_t	total;
	int			i;

	adjust_logits(logits, vocab, p, hist, suppress, n_suppress);
	best = g4_argmax(logits, vocab);
	if (best == G4_SAMPLE_NAN)
		return G4_ERR_NUMERIC;
	memset(probs, 0, (size_t) vocab * sizeof(double));
	if (p->temperature == 0.0f || !isfinite(logits[best]))
	{
		probs[best] = 1.0;
		return G4_OK;
	}
	last = kept_set(logits, vocab, logits[best], p, sc, &total);
	if (last < 0)
		return G4_ERR_NOMEM;
	for (i = 0; i < vocab; i++)
		if (!before(sc->probs, last, i))
			probs[i] = (double) fixed_weight(sc->probs[i]) / (double) total;
	return G4_OK;
}
