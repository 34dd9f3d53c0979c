/*
 * test_prefix.c — the prefix cache on the fixture model: outputs equal with
 * the cache on and off (greedy, every KV dtype, sequences sharing a prefix,
 * staggered), hits equal to the shared blocks, references back to zero
 * after finish and cancel, eviction under pool pressure, the sliding
 * window of a shared prefix surviving interleaved traffic, soft-token
 * positions keyed by their embedding rows, and a prefix prefilled once for
 * requests submitted together.
 */
#include "harness.h"
#include "test.h"

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
		{4, 4 * BT, 1, 8, 0},			/* all at once: the others wait for the first's blocks */
		{5, 3 * BT, 2 * BT, 6, 1},		/* variants diverge on a block boundary */
	};
	size_t		d,
				l;

	H_NEED_FIXTURE(model);
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
			CHECK_MSG(hits[0] == 0 && hits[1] > 0,
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

/* Run one token prompt to completion; returns the tokens it took from the
 * cache (or -1 on failure, reported).  *res holds the run's result (what a
 * previous run left there is freed: declare it zeroed). */
static int64_t
run_prompt(g4_engine *e, const int32_t *ids, int n, int max_tokens, h_result *res, g4_err *err)
{
	g4_request	req;
	g4_stats	before,
				after;

	h_result_free(res);
	g4_stats_get(e, &before);
	h_token_request(&req, ids, n, max_tokens);
	if (h_run_one(e, &req, 1000, res, err) != G4_OK || res->failed)
		return -1;
	g4_stats_get(e, &after);
	return (int64_t) (after.prefix_hit_tokens - before.prefix_hit_tokens);
}

/* The hit is exactly the blocks a prompt shares with a cached one: whole
 * blocks, never the prompt's last token, per group the blocks each kind
 * of layer needs; what is hit is not prefilled. */
G4_TEST(prefix_hits_equal_shared_blocks)
{
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	g4_stats	st,
				st0;
	h_result	res = {0};
	int32_t		ids[MAX_PROMPT];
	int			W,
				n;
	int64_t		hit;

	H_NEED_FIXTURE(model);
	h_options(&o, model);
	CHECK_OK(g4_open(&o, &e, &err), &err);
	W = e->model->cfg.sliding_window;
	CHECK(W <= BT);				/* the sliding group's expectations below */
	memset(&res, 0, sizeof(res));

	/* the first prompt finds nothing; 5 blocks + 7 tokens */
	n = make_prompt(ids, 5 * BT, 7, 0);
	CHECK_INT(run_prompt(e, ids, n, 4, &res, &err), 0);
	g4_stats_get(e, &st0);
	CHECK_INT(st0.groups[1].blocks_cached, 5);
	CHECK_INT(st0.groups[0].blocks_cached, 5);

	/* the same 5 blocks, another tail: 5 full-layer blocks and the one
	 * sliding block of the window before position 80 */
	n = make_prompt(ids, 5 * BT, 7, 1);
	hit = run_prompt(e, ids, n, 4, &res, &err);
	CHECK_INT(hit, 5 * BT);
	g4_stats_get(e, &st);
	CHECK_INT(st.tokens_prefilled - st0.tokens_prefilled, 7);
	CHECK_INT(st.groups[1].prefix_hits - st0.groups[1].prefix_hits, 5);
	CHECK_INT(st.groups[1].prefix_lookups - st0.groups[1].prefix_lookups, 5);
	CHECK_INT(st.groups[0].prefix_hits - st0.groups[0].prefix_hits, 1);
	CHECK_INT(st.groups[0].prefix_lookups - st0.groups[0].prefix_lookups, 1);
	CHECK_INT(st.prefix_query_tokens - st0.prefix_query_tokens, n);

	/* exactly the cached 80 tokens: the last block is computed again, its
	 * last token's logits start the answer */
	n = make_prompt(ids, 5 * BT, 0, 0);
	CHECK_INT(run_prompt(e, ids, n, 4, &res, &err), 4 * BT);

	/* diverging inside block 2: blocks 0 and 1 */
	n = make_prompt(ids, 2 * BT + 5, 3 * BT, 9);
	CHECK_INT(run_prompt(e, ids, n, 4, &res, &err), 2 * BT);

	/* a different first token shares nothing */
	n = make_prompt(ids, 5 * BT, 7, 2);
	ids[0] = 3;
	CHECK_INT(run_prompt(e, ids, n, 4, &res, &err), 0);
	h_result_free(&res);
	check_refs_zero(e);
	g4_close(e);
}

/* Cancelling a sequence that shares blocks leaves the others' output
 * intact; every reference is returned after finish and cancel. */
G4_TEST(prefix_references_released_on_cancel)
{
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	h_run		run;
	h_result	r[3],
				alone;
	int32_t		ids[3][MAX_PROMPT];
	int			n[3];
	int			i,
				step;

	H_NEED_FIXTURE(model);
	h_options(&o, model);
	CHECK_OK(g4_open(&o, &e, &err), &err);
	memset(r, 0, sizeof(r));
	memset(&alone, 0, sizeof(alone));
	for (i = 0; i < 3; i++)
		n[i] = make_prompt(ids[i], 6 * BT, 5, i);
	/* request 0 alone: the reference output */
	CHECK(run_prompt(e, ids[0], n[0], 24, &alone, &err) >= 0);

	run.r = r;
	run.n = 3;
	h_attach(e, &run);
	for (i = 0; i < 3; i++)
	{
		g4_request	req;

		h_token_request(&req, ids[i], n[i], 24);
		CHECK_OK(g4_submit(e, &req, &r[i].id, &err), &err);
	}
	for (step = 0; step < 4; step++)
		CHECK(g4_step(e, h_on_event, &run, &err) >= 0);
	/* all three share the first six blocks by now */
	CHECK(e->kv.cache[G4_KVG_FULL].ref[e->kv.tables[G4_KVG_FULL][(size_t) e->seqs[0]->slot *
																  (size_t) e->kv.max_blocks_per_seq]] == 3);
	g4_cancel(e, r[1].id, h_on_event, &run);
	CHECK(r[1].finished && r[1].finish_reason == G4_FINISH_CANCELLED);
	CHECK_OK(h_drain(e, &run, 1000, &err), &err);
	CHECK_INT(r[0].n_tokens, alone.n_tokens);
	CHECK(memcmp(r[0].tokens, alone.tokens, (size_t) alone.n_tokens * sizeof(int32_t)) == 0);
	check_refs_zero(e);
	for (i = 0; i < 3; i++)
		h_result_free(&r[i]);
	h_result_free(&alone);
	g4_close(e);
}

/* Open an engine whose full group has exactly `full_blocks` blocks. */
static int
open_sized(const char *model, int caching, int max_seqs, int full_blocks, g4_engine **e, g4_err *err)
{
	g4_options	o;
	g4_stats	st;
	int			rc;

	h_options(&o, model);
	o.enable_prefix_caching = caching;
	o.max_num_seqs = max_seqs;
	o.max_num_batched_tokens = 64;
	for (;;)
	{
		/* groups[0] sliding, [1] full: give or take the full blocks missing
		 * (the sliding group's room for kept windows depends on the budget) */
		if ((rc = g4_open(&o, e, err)) != G4_OK)
			return rc;
		g4_stats_get(*e, &st);
		if (st.groups[1].blocks_total == full_blocks)
			return G4_OK;
		g4_close(*e);
		o.kv_pool_bytes = (size_t) st.groups[0].blocks_total * st.groups[0].block_bytes +
			(size_t) full_blocks * st.groups[1].block_bytes;
	}
}

/* A small pool: cached blocks are reclaimed for new content when needed,
 * sequences sharing a prefix are preempted and readmitted, and the outputs
 * stay those of the pool without the cache. */
G4_TEST(prefix_blocks_reclaimed_under_pressure)
{
	static const workload load = {6, 3 * BT + 4, 40, 40, 3};	/* 9 blocks each at the end */
	outcome		out[2][8];
	uint64_t	preempted[2];
	int			on,
				i;

	H_NEED_FIXTURE(model);
	memset(out, 0, sizeof(out));
	for (on = 0; on < 2; on++)
	{
		g4_engine  *e;
		g4_err		err;
		g4_stats	st;
		h_result	res = {0};
		int32_t		ids[MAX_PROMPT];
		int			k;

		/* 16 full blocks: one sequence at its longest, not two */
		CHECK_OK(open_sized(model, on, 4, 16, &e, &err), &err);
		CHECK_OK(run_workload(e, &load, out[on], &err), &err);
		g4_stats_get(e, &st);
		preempted[on] = st.preemptions;
		if (on)
		{
			CHECK(st.groups[1].blocks_cached > 0 && st.groups[1].blocks_cached <= 16);
			CHECK(st.prefix_hit_tokens > 0);
			/* distinct prompts one after another: the cache fills the pool
			 * and gives its blocks back to each new prompt */
			memset(&res, 0, sizeof(res));
			for (k = 0; k < 5; k++)
			{
				int			n = make_prompt(ids, 1, 13 * BT, 100 + k);

				ids[1] = 2000 + k;
				CHECK(run_prompt(e, ids, n, 8, &res, &err) == 0);
				CHECK(!res.failed);
			}
			g4_stats_get(e, &st);
			CHECK(st.groups[1].blocks_cached >= 13 && st.groups[1].blocks_cached <= 16);
			h_result_free(&res);
		}
		check_refs_zero(e);
		g4_close(e);
	}
	CHECK_MSG(preempted[0] > 0 && preempted[1] > 0, "preemptions %llu / %llu: the pool was not under pressure",
			  (unsigned long long) preempted[0], (unsigned long long) preempted[1]);
	for (i = 0; i < load.n; i++)
	{
		CHECK_INT(out[1][i].n_tok, out[0][i].n_tok);
		CHECK_MSG(memcmp(out[1][i].tok, out[0][i].tok, (size_t) out[0][i].n_tok * sizeof(int32_t)) == 0,
				  "request %d: different tokens with the cache on", i);
	}
	outcomes_free(out[0], load.n);
	outcomes_free(out[1], load.n);
}

/* Requests sharing a prefix, each followed by unrelated long prompts whose
 * sliding blocks cycle through the whole sliding group.  With plain LRU
 * eviction the shared prefix's last window is recycled between its uses
 * and every hit collapses to zero although the full layers still match;
 * with the window kept, every request after the first two hits it. */
G4_TEST(prefix_sliding_window_survives_interleaving)
{
	int64_t		hits[2][6];
	int			kept;

	H_NEED_FIXTURE(model);
	for (kept = 0; kept < 2; kept++)
	{
		g4_options	o;
		g4_engine  *e;
		g4_err		err;
		h_result	res = {0};
		int32_t		ids[MAX_PROMPT];
		int			k,
					j;

		h_options(&o, model);
		o.max_num_seqs = 4;
		CHECK_OK(g4_open(&o, &e, &err), &err);
		if (!kept)
			e->kv.cache[G4_KVG_SLIDING].keep_cap = 0;	/* plain LRU, for the figure */
		memset(&res, 0, sizeof(res));
		for (k = 0; k < 6; k++)
		{
			int			n = make_prompt(ids, 5 * BT, 9, k);

			hits[kept][k] = run_prompt(e, ids, n, 2, &res, &err);
			CHECK(hits[kept][k] >= 0);
			/* more distinct sliding blocks than the sliding group holds */
			for (j = 0; j < 3; j++)
			{
				int			m = make_prompt(ids, 1, 20 * BT, 1000 + 3 * k + j);

				ids[1] = 3000 + 3 * k + j;
				CHECK(run_prompt(e, ids, m, 2, &res, &err) == 0);
			}
		}
		h_result_free(&res);
		check_refs_zero(e);
		g4_close(e);
	}
	printf("    figure: cached tokens per shared-prefix request, plain LRU: %lld %lld %lld %lld %lld %lld; "
		   "window kept: %lld %lld %lld %lld %lld %lld\n",
		   (long long) hits[0][0], (long long) hits[0][1], (long long) hits[0][2], (long long) hits[0][3],
		   (long long) hits[0][4], (long long) hits[0][5], (long long) hits[1][0], (long long) hits[1][1],
		   (long long) hits[1][2], (long long) hits[1][3], (long long) hits[1][4], (long long) hits[1][5]);
	CHECK_INT(hits[0][5], 0);
	CHECK_INT(hits[1][2], 5 * BT);
	CHECK_INT(hits[1][5], 5 * BT);
}

/* Soft-token positions are keyed by their embedding rows: the same rows
 * share the blocks, a different row at one position ends the hit before
 * its block. */
G4_TEST(prefix_soft_tokens_keyed_by_embedding_rows)
{
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	int32_t		ids[MAX_PROMPT];
	int32_t		pos[2] = {20, 21};
	float	   *rows;
	int			H,
				n,
				v;
	int64_t		hit[3];

	H_NEED_FIXTURE(model);
	h_options(&o, model);
	CHECK_OK(g4_open(&o, &e, &err), &err);
	H = e->model->cfg.hidden_size;
	rows = calloc((size_t) (2 * H), sizeof(float));
	CHECK(rows);
	n = make_prompt(ids, 3 * BT + 12, 0, 0);
	for (v = 0; v < 3; v++)
	{
		h_run		run;
		h_result	r;
		g4_request	req;
		g4_stats	a,
					b;
		int			i;

		for (i = 0; i < 2 * H; i++)
			rows[i] = 0.01f * (float) (i % 17) - 0.05f;
		if (v == 2)
			rows[H + 3] += 0.5f;	/* the second soft row differs */
		memset(&r, 0, sizeof(r));
		run.r = &r;
		run.n = 1;
		h_attach(e, &run);
		g4_stats_get(e, &a);
		h_token_request(&req, ids, n, 3);
		CHECK_OK(g4_submit_embeds(e, &req, 2, pos, rows, NULL, &r.id, &err), &err);
		CHECK_OK(h_drain(e, &run, 100, &err), &err);
		g4_stats_get(e, &b);
		hit[v] = (int64_t) (b.prefix_hit_tokens - a.prefix_hit_tokens);
		h_result_free(&r);
	}
	CHECK_INT(hit[0], 0);
	CHECK_INT(hit[1], 3 * BT);
	CHECK_INT(hit[2], BT);
	free(rows);
	check_refs_zero(e);
	g4_close(e);
}

/* Requests sharing a prefix submitted together: the first prefills it, the
 * others wait for its blocks instead of computing them again. */
G4_TEST(prefix_admitted_together_prefill_it_once)
{
	static const workload load = {5, 6 * BT + 3, 20, 4, 0};
	outcome		out[8];
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	g4_stats	st;
	int			prompt = load.shared + load.own;

	H_NEED_FIXTURE(model);
	memset(out, 0, sizeof(out));
	h_options(&o, model);
	CHECK_OK(g4_open(&o, &e, &err), &err);
	CHECK_OK(run_workload(e, &load, out, &err), &err);
	g4_stats_get(e, &st);
	CHECK_INT(st.prefix_hit_tokens, (load.n - 1) * 6 * BT);
	CHECK_INT(st.tokens_prefilled, load.n * prompt - (load.n - 1) * 6 * BT);
	outcomes_free(out, load.n);
	check_refs_zero(e);
	g4_close(e);
}
