/*
 * nan_cases.c — see nan_cases.h.
 */
#include "nan_cases.h"

#include "harness.h"
#include "test.h"
#include "util.h"

/* Set the embedding row NAN_CASE_ID of model.safetensors to NaN (bf16). */
static int
nan_embedding_row(void *ctx, const char *file, char **data, size_t *len)
{
	uint64_t	hlen = 0;
	g4_err		err;
	g4j_doc    *doc;
	const g4j  *root;
	size_t		i;
	int			rc = -1;

	if (strcmp(file, "model.safetensors") != 0)
		return 0;
	for (i = 0; i < 8 && i < *len; i++)
		hlen |= (uint64_t) (uint8_t) (*data)[i] << (8 * i);
	if (*len < 8 || hlen > *len - 8)
		return -1;
	doc = g4j_parse(*data + 8, (size_t) hlen, &err);
	root = g4j_root(doc);
	for (i = 0; doc && i < g4j_len(root); i++)
	{
		const char *name = g4j_str(g4j_key_at(root, i));
		const g4j  *t = g4j_value_at(root, i);
		size_t		n = name ? strlen(name) : 0;
		int64_t		dim = g4j_int(g4j_at(g4j_get(t, "shape"), 1), 0);
		size_t		row = 8 + (size_t) hlen + (size_t) g4j_int(g4j_at(g4j_get(t, "data_offsets"), 0), 0) +
			(size_t) NAN_CASE_ID * (size_t) dim * 2;
		int64_t		k;

		if (n < 19 || strcmp(name + n - 19, "embed_tokens.weight") != 0)
			continue;
		if (!g4j_get_str(t, "dtype") || strcmp(g4j_get_str(t, "dtype"), "BF16") != 0 || dim <= 0 ||
			row + (size_t) dim * 2 > *len)
			break;
		for (k = 0; k < dim; k++)
		{
			(*data)[row + 2 * (size_t) k] = (char) 0xC0;	/* 0x7FC0: a quiet NaN */
			(*data)[row + 2 * (size_t) k + 1] = 0x7F;
		}
		rc = 0;
		break;
	}
	g4j_free(doc);
	return rc;
}

/* A copy of a model directory with the NaN row, in tmpdir/name. */
static int
nan_copy(const char *model, const char *name, char *out, size_t out_len)
{
	return h_model_copy(model, name, nan_embedding_row, NULL, out, out_len);
}

/* The golden case "short": its prompt and transformers' 64 greedy tokens. */
typedef struct
{
	h_golden	G;
	int32_t    *ids;
	int			n_ids;
	int32_t    *greedy;
	int			n_greedy;
} short_case;

static int
short_case_load(short_case *c)
{
	char		why[512];
	const g4j  *k;

	memset(c, 0, sizeof(*c));
	if (h_golden_load("model-tiny", &c->G, why, sizeof(why)) != 0)
		return -1;
	k = h_golden_case(&c->G, "short");
	c->ids = h_ints(g4j_get(k, "ids"), &c->n_ids);
	c->greedy = h_ints(g4j_get(k, "greedy"), &c->n_greedy);
	return c->ids && c->greedy && c->n_ids > 0 && c->n_greedy > 0 ? 0 : -1;
}

static void
short_case_free(short_case *c)
{
	free(c->ids);
	free(c->greedy);
	h_golden_free(&c->G);
}

/* The test options on a backend. */
static void
options(g4_options *o, const char *model, int backend)
{
	h_options(o, model);
	o->backend = backend;
}

/* One request to its end, tokens recorded (chosen where the backend
 * chooses them). */
static int
run_alone(g4_engine *e, const g4_request *req, h_result *res, g4_err *err)
{
	h_run		run = {res, 1};
	int			rc;

	memset(res, 0, sizeof(*res));
	h_attach_tokens(e, &run);
	rc = g4_submit(e, req, &res->id, err);
	return rc != G4_OK ? rc : h_drain(e, &run, 1000, err);
}

void
nan_case_batch(const char *model, int backend)
{
	static const struct
	{
		int			dtype;
		const char *name;
	}			pools[] = {{G4_KV_F32, "f32"}, {G4_KV_BF16, "bf16"}, {G4_KV_TURBOQUANT_K8V4, "turboquant_k8v4"}};
	char		dir[4096];
	short_case	sc;
	int32_t    *bad;
	size_t		p;
	int			i;

	CHECK(short_case_load(&sc) == 0);
	CHECK(nan_copy(model, "nan-target", dir, sizeof(dir)) == 0);
	/* the golden prompt with the NaN id inside: the last position reads
	 * its keys and values from the pool */
	bad = malloc((size_t) (sc.n_ids + 1) * sizeof(int32_t));
	CHECK(bad != NULL);
	memcpy(bad, sc.ids, (size_t) sc.n_ids * sizeof(int32_t));
	bad[sc.n_ids] = bad[sc.n_ids - 1];
	bad[sc.n_ids - 1] = NAN_CASE_ID;

	for (p = 0; p < G4_ARRAY_LEN(pools); p++)
	{
		const char *pool = pools[p].name;
		g4_options	o;
		g4_engine  *e;
		g4_err		err;
		g4_request	req;
		h_result	res[3];
		h_run		run = {res, 3};
		g4_stats	st;

		options(&o, dir, backend);
		o.kv_dtype = pools[p].dtype;
		CHECK_OK(g4_open(&o, &e, &err), &err);
		memset(res, 0, sizeof(res));
		h_attach_tokens(e, &run);
		h_token_request(&req, sc.ids, sc.n_ids, sc.n_greedy);
		CHECK_OK(g4_submit(e, &req, &res[0].id, &err), &err);
		for (i = 1; i < 3; i++)
		{
			h_token_request(&req, bad, sc.n_ids + 1, 16);
			req.sampling.temperature = i == 1 ? 0.0f : 0.8f;
			req.sampling.top_p = 0.9f;
			req.sampling.seed = 7;
			req.sampling.has_seed = 1;
			CHECK_OK(g4_submit(e, &req, &res[i].id, &err), &err);
		}
		CHECK_OK(h_drain(e, &run, 1000, &err), &err);
		for (i = 1; i < 3; i++)
		{
			CHECK_MSG(res[i].failed, "%s pool: request %d with the NaN id finished (%d tokens, the first %d)", pool,
					  i, res[i].n_tokens, res[i].n_tokens ? res[i].tokens[0] : -1);
			CHECK_INT(res[i].error_code, G4_ERR_NUMERIC);
			CHECK_MSG(strstr(res[i].error, "non-finite") && strstr(res[i].error, "NaN"), "%s", res[i].error);
			CHECK_INT(res[i].n_tokens, 0);
		}
		/* the quantised pools' greedy output is the CPU's own, not
		 * transformers' (test_kv): only the f32 pool's is compared */
		CHECK_MSG(!res[0].failed && res[0].finished, "%s pool: the clean request failed: %s", pool, res[0].error);
		CHECK_INT(res[0].n_tokens, sc.n_greedy);
		for (i = 0; pools[p].dtype == G4_KV_F32 && i < sc.n_greedy; i++)
			CHECK_MSG(res[0].tokens[i] == sc.greedy[i], "greedy token %d is %d, transformers %d", i,
					  res[0].tokens[i], sc.greedy[i]);
		CHECK_INT(h_kv_blocks_used(e), 0);
		CHECK(!g4_has_work(e));
		g4_stats_get(e, &st);
		CHECK_INT(st.requests_failed, 2);
		CHECK_INT(st.requests_finished, 1);
		for (i = 0; i < 3; i++)
			h_result_free(&res[i]);
		g4_close(e);
	}
	free(bad);
	short_case_free(&sc);
}

/* The blocks the prefix cache supplied so far, all groups. */
static uint64_t
prefix_hits(g4_engine *e)
{
	g4_stats	st;
	uint64_t	hits = 0;
	int			g;

	g4_stats_get(e, &st);
	for (g = 0; g < st.n_groups; g++)
		hits += st.groups[g].prefix_hits;
	return hits;
}

void
nan_case_prefix(const char *model, int backend)
{
	enum
	{
		N = 41					/* two whole blocks and a token */
	};
	char		dir[4096];
	short_case	sc;
	int32_t		clean[N],
				bad[N];
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	g4_request	req;
	h_result	res;
	uint64_t	hits;
	int			i;

	CHECK(short_case_load(&sc) == 0);
	CHECK(nan_copy(model, "nan-target", dir, sizeof(dir)) == 0);
	for (i = 0; i < N; i++)
		clean[i] = bad[i] = sc.ids[i % sc.n_ids];
	bad[20] = NAN_CASE_ID;		/* in the second block */
	options(&o, dir, backend);
	o.enable_prefix_caching = 1;
	CHECK_OK(g4_open(&o, &e, &err), &err);

	/* the cache serves a clean prompt's blocks to its repeat */
	for (i = 0; i < 2; i++)
	{
		h_token_request(&req, clean, N, 1);
		CHECK_OK(run_alone(e, &req, &res, &err), &err);
		CHECK_MSG(!res.failed, "%s", res.error);
		h_result_free(&res);
	}
	hits = prefix_hits(e);
	CHECK_MSG(hits > 0, "the clean prompt's repeat found nothing in the cache");

	/* not the blocks of a sequence that met a NaN (the first run takes
	 * the clean prompt's first block, which it shares) */
	for (i = 0; i < 2; i++)
	{
		hits = prefix_hits(e);
		h_token_request(&req, bad, N, 1);
		CHECK_OK(run_alone(e, &req, &res, &err), &err);
		CHECK_MSG(res.failed && res.error_code == G4_ERR_NUMERIC, "run %d: %s", i, res.failed ? res.error : "finished");
		h_result_free(&res);
	}
	CHECK_MSG(prefix_hits(e) == hits, "the NaN prompt's repeat took %llu blocks from the cache",
			  (unsigned long long) (prefix_hits(e) - hits));
	CHECK_INT(h_kv_blocks_used(e), 0);
	g4_close(e);
	short_case_free(&sc);
}

/* Drafts rewritten to start with the NaN id. */
static void
nan_first_draft(void *ctx, uint64_t seq_id, int first_pos, int32_t *drafts, int n)
{
	if (n > 0)
		drafts[0] = NAN_CASE_ID;
}

void
nan_case_verify(const char *model, int backend)
{
	char		dir[4096],
				abuf[4096];
	short_case	sc;
	int			sampled;

	CHECK_MSG(h_assistant_of(model, abuf, sizeof(abuf)), "no assistant beside %s", model);
	CHECK(short_case_load(&sc) == 0);
	CHECK(nan_copy(model, "nan-target", dir, sizeof(dir)) == 0);
	for (sampled = 0; sampled < 2; sampled++)
	{
		const char *what = sampled ? "sampled" : "greedy";
		g4_options	o;
		g4_engine  *e;
		g4_err		err;
		g4_request	req;
		h_result	res;
		g4_stats	st;

		options(&o, dir, backend);
		o.draft_model_path = abuf;
		o.num_speculative_tokens = 3;
		o.bench_force_accept = 1;
		CHECK_OK(g4_open(&o, &e, &err), &err);
		g4_set_draft_hook(e, nan_first_draft, NULL);
		h_token_request(&req, sc.ids, sc.n_ids, 32);
		req.sampling.temperature = sampled ? 0.8f : 0.0f;
		req.sampling.seed = 11;
		req.sampling.has_seed = 1;
		CHECK_OK(run_alone(e, &req, &res, &err), &err);
		g4_stats_get(e, &st);
		CHECK_MSG(st.spec_verify_steps == 1, "%s: %llu verify steps", what,
				  (unsigned long long) st.spec_verify_steps);
		CHECK_MSG(res.failed && res.error_code == G4_ERR_NUMERIC, "%s: %s after %d tokens", what,
				  res.failed ? res.error : "finished", res.n_tokens);
		/* the prefill's token, then the forced draft */
		CHECK_INT(res.n_tokens, 2);
		CHECK(sampled || res.tokens[0] == sc.greedy[0]);
		CHECK_INT(res.tokens[1], NAN_CASE_ID);
		CHECK_INT(h_kv_blocks_used(e), 0);
		h_result_free(&res);
		g4_close(e);
	}
	short_case_free(&sc);
}

void
nan_case_drafts(const char *model, int backend)
{
	char		dir[4096],
				abuf[4096];
	short_case	sc;
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	g4_request	req;
	h_result	res;
	g4_stats	st;
	int			i;

	CHECK_MSG(h_assistant_of(model, abuf, sizeof(abuf)), "no assistant beside %s", model);
	CHECK(short_case_load(&sc) == 0);
	CHECK(nan_copy(abuf, "nan-assistant", dir, sizeof(dir)) == 0);
	options(&o, model, backend);
	o.draft_model_path = dir;
	CHECK_OK(g4_open(&o, &e, &err), &err);
	h_token_request(&req, sc.ids, sc.n_ids, sc.n_greedy);
	CHECK_OK(run_alone(e, &req, &res, &err), &err);
	CHECK_MSG(!res.failed && res.finished, "%s", res.error);
	CHECK_INT(res.n_tokens, sc.n_greedy);
	for (i = 0; i < sc.n_greedy; i++)
		CHECK_MSG(res.tokens[i] == sc.greedy[i], "greedy token %d is %d, transformers %d", i, res.tokens[i],
				  sc.greedy[i]);
	g4_stats_get(e, &st);
	CHECK_MSG(st.spec_draft_steps > 0, "the assistant never ran");
	CHECK_INT(st.spec_drafted, 0);
	CHECK_INT(h_kv_blocks_used(e), 0);
	h_result_free(&res);
	g4_close(e);
	short_case_free(&sc);
}

static void
count_rows(void *ctx, int pos, const float *logits, int vocab)
{
	int		   *calls = ctx;

	(*calls)++;
}

void
nan_case_score(const char *model, int backend)
{
	char		dir[4096];
	short_case	sc;
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	g4_request	req;
	h_result	res;
	int			calls = 0;
	int			rc;
	int			i;

	CHECK(short_case_load(&sc) == 0);
	CHECK(nan_copy(model, "nan-target", dir, sizeof(dir)) == 0);
	options(&o, dir, backend);
	CHECK_OK(g4_open(&o, &e, &err), &err);
	rc = g4_score(e, sc.ids, sc.n_ids, 2, count_rows, &calls, &err);
	CHECK(h_failed_as("scoring on the NaN copy", rc, &err, G4_ERR_NUMERIC, "non-finite", "position 2"));
	CHECK_INT(calls, 0);
	CHECK_INT(h_kv_blocks_used(e), 0);
	h_token_request(&req, sc.ids, sc.n_ids, sc.n_greedy);
	CHECK_OK(run_alone(e, &req, &res, &err), &err);
	CHECK_MSG(!res.failed && res.n_tokens == sc.n_greedy, "%d tokens: %s", res.n_tokens, res.error);
	for (i = 0; i < sc.n_greedy; i++)
		CHECK_INT(res.tokens[i], sc.greedy[i]);
	h_result_free(&res);
	g4_close(e);
	short_case_free(&sc);
}
