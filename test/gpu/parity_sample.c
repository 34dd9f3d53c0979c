/*
 * parity_sample.c — the device sampler against g4_sample: the same rows,
 * settings and draws; the ids chosen must agree.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "parity.h"
#include "sampler.h"
#include "util.h"

typedef struct
{
	float		temperature,
				top_p,
				min_p;
	int			top_k;
} sample_setting;

/* the first N_IN_TURN taken in turn (SAMPLE_ALL_SETTINGS); an enum of
 * parity.h names each one a row takes alone */
#define N_IN_TURN 10
static const sample_setting settings[] = {
	{0.0f, 1.0f, 0.0f, 0},		/* greedy */
	{1.0f, 1.0f, 0.0f, 0},		/* plain temperature */
	{0.7f, 0.95f, 0.0f, 0},
	{1.0f, 1.0f, 0.0f, 40},
	{1.3f, 0.9f, 0.0f, 64},
	{1.0f, 1.0f, 0.05f, 0},
	{0.8f, 0.5f, 0.02f, 3000},
	{2.0f, 0.999f, 0.0f, 1},
	{1.6f, 1.0f, 0.0f, 200000},
	{1.0f, 0.3f, 0.0f, 0},
	{1.0f, 0.95f, 0.0f, 0},
};

/* a suppressed id that is a maximum, the last id, another */
static const int32_t suppress[3] = {5, 262143, 100};

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + ts.tv_nsec * 1e-9;
}

/*
 * rows [n][vocab] sampled on the device with settings s[i % n_s] and the
 * draw of a generator seeded with seed0 + i; returns how many ids differ
 * from g4_sample's on the same row and generator.  *seconds: the device
 * call's wall time.
 */
static int
sample_case(const float *rows, int n, int vocab, const sample_setting *s, int n_s, uint64_t seed0,
			int n_suppress, double *seconds)
{
	float	   *d = gpu_copy(rows, (size_t) n * vocab * 4);
	float	   *row = p_malloc((size_t) vocab * 4);
	g4_row_sampling *rs = p_calloc((size_t) n, sizeof(*rs));
	int32_t    *ids = p_malloc((size_t) n * sizeof(int32_t));
	const int32_t *sup = n_suppress ? suppress : NULL;
	g4_sampler_scratch sc;
	double		t0;
	int			i,
				bad = 0;

	memset(&sc, 0, sizeof(sc));
	for (i = 0; i < n; i++)
	{
		const sample_setting *p = &s[i % n_s];
		g4_rng		r;

		g4_rng_seed(&r, seed0 + (uint64_t) i);
		rs[i].temperature = p->temperature;
		rs[i].top_p = p->top_p;
		rs[i].min_p = p->min_p;
		rs[i].top_k = p->top_k;
		rs[i].u = p->temperature > 0.0f ? g4_rng_uniform(&r) : 0.0;
	}
	t0 = now_s();
	P_RUN(gpu_be, sample, d, n, vocab, sup, n_suppress, rs, ids);
	*seconds = now_s() - t0;
	for (i = 0; i < n; i++)
	{
		const sample_setting *p = &s[i % n_s];
		g4_sampling sp;
		g4_rng		r;
		int32_t		want;

		g4_sampling_default(&sp);
		sp.temperature = p->temperature;
		sp.top_p = p->top_p;
		sp.min_p = p->min_p;
		sp.top_k = p->top_k;
		g4_rng_seed(&r, seed0 + (uint64_t) i);
		memcpy(row, rows + (size_t) i * vocab, (size_t) vocab * 4);
		want = g4_sample(row, vocab, &sp, NULL, sup, n_suppress, &r, &sc);
		if (want != ids[i])
		{
			bad++;
			printf("    row %d (T %g, top_k %d, top_p %g, min_p %g, u %.9f): device %d, host %d\n", i,
				   (double) p->temperature, p->top_k, (double) p->top_p, (double) p->min_p, rs[i].u, ids[i], want);
		}
	}
	g4_sampler_scratch_free(&sc);
	return bad;
}

static int
sample_describe(const parity_row *r, int i, char *label, size_t size)
{
	const sample_args *a = &r->a.sample;

	if (a->logits == LOGITS_NAN)
		snprintf(label, size, "%d rows x %d, a NaN at the first, a middle, the last or a suppressed id, "
				 "10 settings (ids differing)", a->n, a->vocab);
	else if (a->logits == LOGITS_TIED)
		snprintf(label, size, "%d rows of 8 tied values, 10 settings (ids differing)", a->n);
	else if (a->setting == SAMPLE_ALL_SETTINGS)
		snprintf(label, size, "%d rows x %d, 10 settings (ids differing)", a->n, a->vocab);
	else
		snprintf(label, size, "%d and %d rows x %d, top_p %g top_k %d (ids differing)", a->n, a->n_b, a->vocab,
				 (double) settings[a->setting].top_p, settings[a->setting].top_k);
	return 1;
}

/* A Gemma-like row: normal logits soft-capped at 30, a few large ones. */
static void
gemma_row(float *x, int vocab)
{
	int			i;

	fill_normal(x, (size_t) vocab, 3.0f);
	for (i = 0; i < 20; i++)
		x[rnd() % (uint64_t) vocab] += (float) (8.0 + 8.0 * unif());
	for (i = 0; i < vocab; i++)
		x[i] = 30.0f * tanhf(x[i] / 30.0f);
}

/* The rows of the row's kind of logits, as many as its calls take. */
static void *
sample_setup(const parity_row *r)
{
	const sample_args *a = &r->a.sample;
	int			n = G4_MAX(a->n, a->n_b),
				vocab = a->vocab,
				k,
				i;
	float	   *l = p_malloc((size_t) n * vocab * 4);

	switch (a->logits)
	{
		case LOGITS_GEMMA:
			for (k = 0; k < n; k++)
				gemma_row(l + (size_t) k * vocab, vocab);
			/* a suppressed maximum, ties of the maximum, an all-equal row */
			l[2 * (size_t) vocab + 5] = 99.0f;
			l[3 * (size_t) vocab + 10] = l[3 * (size_t) vocab + 20000] = 50.0f;
			for (i = 0; i < vocab; i++)
				l[4 * (size_t) vocab + i] = 1.0f;
			break;
		case LOGITS_NAN:
			/* the NaN's place turns with the row, shifted by one every
			 * N_IN_TURN rows: each place meets each setting (row k's is
			 * k % N_IN_TURN); the suppressed id is suppress[0] */
			for (k = 0; k < n; k++)
			{
				float	   *x = l + (size_t) k * vocab;
				int			at[4] = {0, vocab / 2 + 7, vocab - 1, suppress[0]};

				gemma_row(x, vocab);
				x[at[(k / N_IN_TURN + k) % 4]] = NAN;
			}
			break;
		case LOGITS_TIED:
			/* logits on a grid of 8 values, every filter cutting through them */
			for (i = 0; i < n * vocab; i++)
				l[i] = (float) (rnd() % 8) * 0.5f;
			break;
		case LOGITS_SMALL_VOCAB:
			fill_normal(l, (size_t) n * vocab, 2.0f);
			break;
		default:
			fill_normal(l, (size_t) n * vocab, 3.0f);
			break;
	}
	return l;
}

static void
sample_run(const parity_row *r, void *fx, int i, double *metric)
{
	const sample_args *a = &r->a.sample;
	const float *l = fx;
	const sample_setting *s = a->setting == SAMPLE_ALL_SETTINGS ? settings : &settings[a->setting];
	int			n_s = a->setting == SAMPLE_ALL_SETTINGS ? N_IN_TURN : 1;
	double		secs,
				secs_b;
	int			bad;

	bad = sample_case(l, a->n, a->vocab, s, n_s, a->seed, a->n_suppress, &secs);
	if (a->n_b)
	{
		bad += sample_case(l, a->n_b, a->vocab, s, n_s, a->seed_b, a->n_suppress, &secs_b);
		printf("    device sampler timing (T 1, top_p %g, top_k %d): %d row %.3f ms, %d rows %.3f ms (copies included)\n",
			   (double) s->top_p, s->top_k, a->n, secs * 1e3, a->n_b, secs_b * 1e3);
	}
	else
		printf("    device sampler, %d rows x %d: %.2f ms (one call, copies included)\n", a->n, a->vocab, secs * 1e3);
	metric[0] = (double) bad;
}

const parity_kind parity_sample = {
	.family = "sample",
	.describe = sample_describe,
	.setup = sample_setup,
	.run = sample_run,
};

/* The same rows and draws twice: the same ids (metric: 1 when any differs). */
static int
sample_twice_describe(const parity_row *r, int i, char *label, size_t size)
{
	snprintf(label, size, "the same rows and draws twice (ids differing)");
	return 1;
}

static void
sample_twice_run(const parity_row *r, void *fx, int i, double *metric)
{
	const sample_setting *s = &settings[r->a.sample.setting];
	int			n = r->a.sample.n,
				vocab = r->a.sample.vocab,
				k;
	size_t		len = (size_t) n * vocab;
	float	   *l = p_malloc(len * 4);
	float	   *d,
			   *d2;
	g4_row_sampling *rs = p_calloc((size_t) n, sizeof(*rs));
	int32_t    *a = p_malloc((size_t) n * 4),
			   *b = p_malloc((size_t) n * 4);

	fill_normal(l, len, 2.0f);
	d = gpu_copy(l, len * 4);
	d2 = gpu_copy(l, len * 4);
	for (k = 0; k < n; k++)
	{
		rs[k].temperature = s->temperature;
		rs[k].top_p = s->top_p;
		rs[k].min_p = s->min_p;
		rs[k].top_k = s->top_k;
		rs[k].u = (k + 0.5) / n;
	}
	P_RUN(gpu_be, sample, d, n, vocab, NULL, 0, rs, a);
	P_RUN(gpu_be, sample, d2, n, vocab, NULL, 0, rs, b);
	metric[0] = (double) (memcmp(a, b, (size_t) n * 4) != 0);
}

const parity_kind parity_sample_twice = {
	.family = "sample",
	.describe = sample_twice_describe,
	.run = sample_twice_run,
};
