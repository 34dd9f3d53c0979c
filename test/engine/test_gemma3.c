/*
 * test_gemma3.c — the embedded default model, Gemma 3 270M (GGUF Q4_K_M),
 * against implementations we did not write: transformers loading the same
 * GGUF (float32 and float64) and llama.cpp (test/golden/gemma3-270m.json,
 * recorded by test/reference/golden_gemma3.py).
 *
 * Tolerance, as for the Gemma 4 fixture: the engine and transformers both
 * compute in float32 from the same dequantised weights; the engine's logits
 * must be as close to the float64 result as transformers' float32 run is,
 * within a factor of 3 (+1e-5 absolute).  The comparison covers the 256 most
 * likely ids and the log-sum-exp over the whole vocabulary (which moves if
 * any logit is off).  Greedy continuations of 32 tokens must be identical.
 */
#include <math.h>

#include "harness.h"
#include "test.h"

static const char *
gguf_model(void)
{
	const char *p = getenv("G4_GGUF_MODEL");

	return p && *p && g4_is_file(p) ? p : NULL;
}

#define NEED_GGUF() \
	const char *model = gguf_model(); \
	h_golden G; \
	char why[512]; \
	if (!model) G4_SKIP("Gemma 3 270M not available (the package registry was unreachable)"); \
	if (h_golden_load("gemma3-270m", &G, why, sizeof(why)) != 0) { CHECK_MSG(0, "%s", why); }

static void
gguf_options(g4_options *o, const char *model)
{
	h_options(o, model);
	o->kv_pool_bytes = (size_t) 256 << 20;
}

static double
logsumexp(const float *x, int n)
{
	double		m = -INFINITY,
				s = 0;
	int			i;

	for (i = 0; i < n; i++)
		m = fmax(m, x[i]);
	for (i = 0; i < n; i++)
		s += exp(x[i] - m);
	return m + log(s);
}

G4_TEST(gemma3_logits_and_greedy_match_transformers)
{
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	const g4j  *cases;
	size_t		k;

	NEED_GGUF();
	gguf_options(&o, model);
	CHECK_OK(g4_open(&o, &e, &err), &err);
	cases = g4j_get(g4j_root(G.doc), "cases");
	CHECK(g4j_len(cases) >= 5);
	for (k = 0; k < g4j_len(cases); k++)
	{
		const g4j  *c = g4j_at(cases, k);
		h_result	res;
		g4_request	req;
		int32_t    *ids,
				   *want,
				   *top;
		int			n,
					nw,
					nt,
					i;
		const g4j  *t64 = g4j_get(c, "top_logits64");
		double		d64 = 0;
		double		ref_err = g4j_get_num(c, "fp32_vs_fp64", 0);
		double		bound = 3.0 * ref_err + 1e-5;
		double		lse_err;

		ids = h_ints(g4j_get(c, "ids"), &n);
		want = h_ints(g4j_get(c, "greedy"), &nw);
		top = h_ints(g4j_get(c, "top_ids"), &nt);
		/* the prompt's ids come from transformers' tokenizer: ours must agree */
		{
			int32_t    *mine = NULL;
			int			n_mine = 0;
			const char *text = g4j_get_str(c, "prompt");

			CHECK_OK(g4_tokenize(e, text, strlen(text), 1, &mine, &n_mine, &err), &err);
			CHECK_INT(n_mine, n);
			for (i = 0; i < n; i++)
				CHECK_INT(mine[i], ids[i]);
			free(mine);
		}
		h_token_request(&req, ids, n, nw);
		CHECK_OK(h_run_one(e, &req, 1000, &res, &err), &err);
		CHECK_MSG(!res.failed && res.first_logits, "%s", res.error);
		for (i = 0; i < nt; i++)
			d64 = fmax(d64, fabs(res.first_logits[top[i]] - g4j_num(g4j_at(t64, (size_t) i), 0)));
		lse_err = fabs(logsumexp(res.first_logits, res.vocab) - g4j_get_num(c, "logsumexp64", 0));
		printf("    \"%.24s\": |engine - float64| = %.2e (top %d), log-sum-exp off by %.2e, "
			   "transformers fp32 - float64 = %.2e\n", g4j_get_str(c, "prompt"), d64, nt, lse_err, ref_err);
		CHECK_MSG(d64 <= bound, "logits %.3g from the float64 reference (bound %.3g)", d64, bound);
		CHECK_MSG(lse_err <= bound, "log-sum-exp %.3g from the float64 reference (bound %.3g)", lse_err, bound);
		for (i = 0; i < nw && i < res.n_tokens; i++)
			CHECK_MSG(res.tokens[i] == want[i], "greedy token %d is %d, transformers %d", i, res.tokens[i], want[i]);
		CHECK_INT(res.n_tokens, nw);
		/* llama.cpp, when it was available to the recording: same argmax */
		{
			const g4j  *lc = g4j_get(c, "llama_cpp_top_ids");

			if (lc)
				CHECK_MSG(g4j_int(g4j_at(lc, 0), -1) == top[0], "llama.cpp's next token %d differs from %d",
						  (int) g4j_int(g4j_at(lc, 0), -1), top[0]);
		}
		h_result_free(&res);
		free(ids);
		free(want);
		free(top);
	}
	g4_close(e);
	h_golden_free(&G);
}

/* Compressed KV caches on real weights: how long greedy output stays equal
 * to the exact cache's (figures; the formats' error bounds are tested at the
 * operation level in test_kv.c). */
G4_TEST(gemma3_kv_dtypes_figures)
{
	static const int dtypes[] = {G4_KV_F32, G4_KV_BF16, G4_KV_TURBOQUANT_K8V4};
	static const char *const names[] = {"f32", "bf16", "turboquant_k8v4"};
	int32_t		out[3][8][64];
	int			n_out[3][8];
	int			n_cases = 0;
	size_t		d;

	NEED_GGUF();
	for (d = 0; d < G4_ARRAY_LEN(dtypes); d++)
	{
		g4_options	o;
		g4_engine  *e;
		g4_err		err;
		const g4j  *cases = g4j_get(g4j_root(G.doc), "cases");
		size_t		k;

		gguf_options(&o, model);
		o.kv_dtype = dtypes[d];
		CHECK_OK(g4_open(&o, &e, &err), &err);
		n_cases = (int) G4_MIN(g4j_len(cases), 8);
		for (k = 0; k < (size_t) n_cases; k++)
		{
			h_result	res;
			g4_request	req;
			int32_t    *ids;
			int			n;

			ids = h_ints(g4j_get(g4j_at(cases, k), "ids"), &n);
			h_token_request(&req, ids, n, 64);
			CHECK_OK(h_run_one(e, &req, 1000, &res, &err), &err);
			n_out[d][k] = res.n_tokens;
			memcpy(out[d][k], res.tokens, sizeof(int32_t) * (size_t) res.n_tokens);
			h_result_free(&res);
			free(ids);
		}
		g4_close(e);
	}
	for (d = 1; d < G4_ARRAY_LEN(dtypes); d++)
	{
		int			same = 0,
					total = 0,
					k;

		for (k = 0; k < n_cases; k++)
		{
			int			i;

			for (i = 0; i < n_out[0][k] && i < n_out[d][k] && out[d][k][i] == out[0][k][i]; i++)
				;
			same += i;
			total += n_out[0][k];
		}
		printf("    figure: Gemma 3 270M, KV %s vs f32: %d of %d greedy tokens identical before the first "
			   "divergence (%d prompts)\n", names[d], same, total, n_cases);
	}
	h_golden_free(&G);
}
