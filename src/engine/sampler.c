/*
 * sampler.c — host-side token sampling.
 */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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

static int32_t
argmax(const float *x, int n)
{
	int32_t		best = 0;
	int			i;

	for (i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return best;
}

/* descending by probability, ties by id (qsort_r context: the probabilities) */
static int
cmp_desc(const void *a, const void *b, void *ctx)
{
	const float *sort_keys = ctx;
	int32_t		i = *(const int32_t *) a;
	int32_t		j = *(const int32_t *) b;

	if (sort_keys[i] > sort_keys[j])
		return -1;
	if (sort_keys[i] < sort_keys[j])
		return 1;
	return i < j ? -1 : (i > j);
}

/* Partition idx[0..n) so its first k entries are the k most probable
 * (quickselect on probs). */
static void
select_top(int32_t *idx, int n, int k, const float *probs)
{
	int			lo = 0,
				hi = n - 1;

	while (lo < hi)
	{
		float		pivot = probs[idx[(lo + hi) / 2]];
		int			i = lo,
					j = hi;

		while (i <= j)
		{
			while (probs[idx[i]] > pivot)
				i++;
			while (probs[idx[j]] < pivot)
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

int32_t
g4_sample(float *logits, int vocab, const g4_sampling *p, const g4_token_hist *hist,
		  const int32_t *suppress, int n_suppress, g4_rng *rng, g4_sampler_scratch *sc)
{
	int			i;
	int			n;
	float		maxl;
	double		total;

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

	if (p->temperature == 0.0f)
		return argmax(logits, vocab);

	/* probabilities at temperature T over every id */
	if (sc->cap < vocab)
	{
		float	   *pr = realloc(sc->probs, (size_t) vocab * sizeof(float));
		int32_t    *ix = realloc(sc->idx, (size_t) vocab * sizeof(int32_t));

		if (pr)
			sc->probs = pr;
		if (ix)
			sc->idx = ix;
		if (!pr || !ix)
			return argmax(logits, vocab);	/* out of memory: degrade to greedy */
		sc->cap = vocab;
	}
	maxl = logits[argmax(logits, vocab)];
	total = 0.0;
	for (i = 0; i < vocab; i++)
	{
		float		e = expf((logits[i] - maxl) / p->temperature);

		sc->probs[i] = e;
		total += e;
	}
	n = 0;
	for (i = 0; i < vocab; i++)
	{
		sc->probs[i] = (float) (sc->probs[i] / total);
		if (sc->probs[i] > 0.0f)
			sc->idx[n++] = i;
	}

	/* min-p: drop ids below min_p times the best probability */
	if (p->min_p > 0.0f)
	{
		float		cut = p->min_p * sc->probs[argmax(logits, vocab)];
		int			m = 0;

		for (i = 0; i < n; i++)
			if (sc->probs[sc->idx[i]] >= cut)
				sc->idx[m++] = sc->idx[i];
		n = m;
	}
	/* top-k, then top-p over what is left, in descending order */
	{
		int			k = p->top_k > 0 && p->top_k < n ? p->top_k : n;
		int			sorted;

		if (k < n)
		{
			select_top(sc->idx, n, k, sc->probs);
			n = k;
		}
		/* sort a prefix large enough to hold the top-p mass, else all */
		sorted = G4_MIN(n, 1024);
		if (sorted < n)
			select_top(sc->idx, n, sorted, sc->probs);
		qsort_r(sc->idx, (size_t) sorted, sizeof(int32_t), cmp_desc, sc->probs);
		if (p->top_p < 1.0f)
		{
			double		mass = 0.0,
						all = 0.0;
			int			keep = -1;

			for (i = 0; i < n; i++)
				all += sc->probs[sc->idx[i]];
			for (i = 0; i < sorted; i++)
			{
				mass += sc->probs[sc->idx[i]];
				if (mass >= p->top_p * all)
				{
					keep = i + 1;
					break;
				}
			}
			if (keep < 0 && sorted < n)
			{
				qsort_r(sc->idx, (size_t) n, sizeof(int32_t), cmp_desc, sc->probs);
				mass = 0.0;
				for (i = 0; i < n; i++)
				{
					mass += sc->probs[sc->idx[i]];
					if (mass >= p->top_p * all)
					{
						keep = i + 1;
						break;
					}
				}
			}
			if (keep > 0)
				n = keep;
		}
	}
	/* draw from what is left, renormalised */
	{
		double		mass = 0.0;
		double		u;

		for (i = 0; i < n; i++)
			mass += sc->probs[sc->idx[i]];
		u = g4_rng_uniform(rng) * mass;
		for (i = 0; i < n; i++)
		{
			u -= sc->probs[sc->idx[i]];
			if (u < 0.0)
				return sc->idx[i];
		}
		return n > 0 ? sc->idx[n - 1] : argmax(logits, vocab);
	}
}
