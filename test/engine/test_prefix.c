/*
 * test_prefix.c — the prefix cache on the fixture model: outputs equal with
 * the cache on and off (greedy, every KV dtype, sequences sharing a prefix,
 * staggered), hits equal to the shared blocks, references back to zero
 * after finish and cancel, eviction under pool pressure, the sliding
 * window of a shared prefix surviving interleaved traffic, and soft-token
 * positions keyed by their embedding rows.
 */
#include "harness.h"
#include "test.h"

#define NEED_MODEL() \
	const char *model = h_fixture_model(); \
	if (!model) G4_SKIP("G4_FIXTURE_MODEL not set (run through make check-engine)")

#define BT G4_KV_BLOCK_TOKENS
#define MAX_PROMPT 600

/* A prompt: BOS, `shared` tokens common to every variant, then `own`
 * tokens particular to variant v. */
static int
make_prompt(int32_t *ids, int shared, int own, int v)
{
	int			i;

	ids[0] = 2;
	for (i = 1; i < shared; i++)
		ids[i] = 1000 + (i * 37) % 900;
	for (i = 0; i < own; i++)
		ids[shared + i] = 1000 + (v * 131 + i * 17 + 5) % 900;
	return shared + own;
}

/* Every block of every group unreferenced, and the free counts adding up. */
static void
check_refs_zero(g4_engine *e)
{
	g4_kvpool  *p = &e->kv;
	int			g,
				b;

	for (g = 0; g < G4_KVG_COUNT; g++)
	{
		if (p->desc.n_layers[g] == 0)
			continue;
		CHECK_INT(p->n_free[g], p->n_blocks[g]);
		if (!p->caching)
			continue;
		for (b = 0; b < p->n_blocks[g]; b++)
			CHECK_MSG(p->cache[g].ref[b] == 0, "group %d block %d has %d references", g, b, p->cache[g].ref[b]);
		CHECK_INT(p->n_plain[g] + p->cache[g].n_tier[0] + p->cache[g].n_tier[1], p->n_free[g]);
		CHECK_INT(p->cache[g].n_tier[0] + p->cache[g].n_tier[1], p->cache[g].n_cached);
	}
}

typedef struct
{
	int			n;				/* requests */
	int			shared;			/* tokens every prompt shares */
	int			own;			/* tokens each adds */
	int			max_tokens;
	int			stagger;		/* steps between submissions (0: all at once) */
} workload;

/* What one request produced. */
typedef struct
{
	int32_t		tok[64];
	int			n_tok;
	float	   *logits;			/* first sampled position, malloc'd */
	int			vocab;
} outcome;

/* Run a workload to completion; out[i] receives request i's outcome. */
static int
run_workload(g4_engine *e, const workload *w, outcome *out, g4_err *err)
{
	h_run		run;
	int32_t		ids[MAX_PROMPT];
	int			i,
				rc = G4_OK;

	run.r = calloc((size_t) w->n, sizeof(h_result));
	run.n = 0;
	if (!run.r)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	h_attach(e, &run);
	for (i = 0; i < w->n && rc == G4_OK; i++)
	{
		g4_request	req;
		int			k;

		h_token_request(&req, ids, make_prompt(ids, w->shared, w->own, i), w->max_tokens);
		rc = g4_submit(e, &req, &run.r[i].id, err);
		run.n = i + 1;
		for (k = 0; k < w->stagger && rc == G4_OK; k++)
			rc = g4_step(e, h_on_event, &run, err) < 0 ? err->code : G4_OK;
	}
	if (rc == G4_OK)
		rc = h_drain(e, &run, 10000, err);
	for (i = 0; i < run.n; i++)
	{
		if (rc == G4_OK && run.r[i].failed)
			rc = g4_fail(err, G4_ERR_INTERNAL, "request %d failed: %s", i, run.r[i].error);
		out[i].n_tok = G4_MIN(run.r[i].n_tokens, 64);
		memcpy(out[i].tok, run.r[i].tokens, (size_t) out[i].n_tok * sizeof(int32_t));
		out[i].logits = run.r[i].first_logits;
		out[i].vocab = run.r[i].vocab;
		run.r[i].first_logits = NULL;
		h_result_free(&run.r[i]);
	}
	free(run.r);
	return rc;
}

static void
outcomes_free(outcome *o, int n)
{
	int			i;

	for (i = 0; i < n; i++)
		free(o[i].logits);
}

/* Greedy outputs and first logits are the same with the cache on and off,
 * in every KV dtype, for sequences sharing a prefix submitted staggered
 * (later ones admitted while earlier ones run) and all at once. */
G4_TEST(prefix_outputs_equal_cache_on_off)
{
	static const int dtypes[] = {G4_KV_F32, G4_KV_BF16, G4_KV_TURBOQUANT_K8V4};
	static const workload loads[] = {
		{6, 5 * BT + 3, 9, 12, 2},		/* staggered: later ones hit */
		{4, 4 * BT, 1, 8, 0},			/* all at once: admitted together, no hit */
		{5, 3 * BT, 2 * BT, 6, 1},		/* variants diverge on a block boundary */
	};
	size_t		d,
				l;

	NEED_MODEL();
	for (d = 0; d < G4_ARRAY_LEN(dtypes); d++)
		for (l = 0; l < G4_ARRAY_LEN(loads); l++)
		{
			const workload *w = &loads[l];
			outcome		out[2][8];
			uint64_t	hits[2];
			int			on;
			int			i;

			memset(out, 0, sizeof(out));
			for (on = 0; on < 2; on++)
			{
				g4_options	o;
				g4_engine  *e;
				g4_err		err;
				g4_stats	st;

				h_options(&o, model);
				o.kv_dtype = dtypes[d];
				o.enable_prefix_caching = on;
				CHECK_OK(g4_open(&o, &e, &err), &err);
				CHECK_OK(run_workload(e, w, out[on], &err), &err);
				g4_stats_get(e, &st);
				hits[on] = st.prefix_hit_tokens;
				check_refs_zero(e);
				g4_close(e);
				if (g4_test_failed())
					return;
			}
			CHECK_MSG(hits[0] == 0 && (hits[1] > 0) == (w->stagger > 0),
					  "dtype %d load %zu: %llu / %llu tokens from the cache", dtypes[d], l,
					  (unsigned long long) hits[0], (unsigned long long) hits[1]);
			for (i = 0; i < w->n; i++)
			{
				CHECK_INT(out[1][i].n_tok, out[0][i].n_tok);
				CHECK_MSG(memcmp(out[1][i].tok, out[0][i].tok, (size_t) out[0][i].n_tok * sizeof(int32_t)) == 0,
						  "dtype %d load %zu request %d: different tokens with the cache on", dtypes[d], l, i);
				CHECK_MSG(out[0][i].logits && out[1][i].logits &&
						  memcmp(out[0][i].logits, out[1][i].logits, (size_t) out[0][i].vocab * sizeof(float)) == 0,
						  "dtype %d load %zu request %d: first logits differ with the cache on", dtypes[d], l, i);
			}
			outcomes_free(out[0], w->n);
			outcomes_free(out[1], w->n);
		}
}
