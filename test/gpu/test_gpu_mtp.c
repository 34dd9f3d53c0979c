/*
 * test_gpu_mtp.c — speculative decoding on the CUDA backend, on the tiny
 * fixture target and its assistant (gemma4-make-model --assistant, written
 * beside the target as <fixture>-assistant):
 *  - greedy output with drafting is identical to the output without, on
 *    the CUDA backend, for every golden prompt (64 tokens), all submitted
 *    together (mixed lengths) and each alone, in each KV dtype (the
 *    fixture's kernels are batch-invariant: one float32 matmul order at
 *    every row count, each token's attention split by its own range);
 *  - with the f32 pool the CUDA engine's drafts (every proposal of every
 *    round) and tokens equal the CPU engine's.
 * The fixture runs in exact float32 on the GPU (see test_gpu_model.c), so
 * both are exact.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "test.h"
#include "util.h"

#define N_CASES 5
#define MAX_DRAFTS 4096

static const char *const case_names[N_CASES] = {"one_token", "short", "past_window", "long", "code"};

/* Everything one engine run produced. */
typedef struct
{
	h_result	res[N_CASES];
	int32_t		drafts[N_CASES][MAX_DRAFTS];	/* every proposal, in order */
	int			n_drafts[N_CASES];
	uint64_t	spec_drafted;
	uint64_t	spec_accepted;
} mtp_run;

static void
record_drafts(void *ctx, uint64_t seq_id, int first_pos, int32_t *drafts, int n)
{
	mtp_run    *r = ctx;
	int			k,
				j;

	(void) first_pos;
	for (k = 0; k < N_CASES; k++)
		if (r->res[k].id == seq_id)
			for (j = 0; j < n && r->n_drafts[k] < MAX_DRAFTS; j++)
				r->drafts[k][r->n_drafts[k]++] = drafts[j];
}

/* Every golden prompt through one engine: all submitted together, or each
 * alone (submitted once the previous one has finished). */
static int
run_all(const char *model, const char *assistant, const h_golden *G, int backend, int dtype, int alone, mtp_run *r,
		g4_err *err)
{
	g4_options	o;
	g4_engine  *e;
	h_run		run = {r->res, N_CASES};
	int32_t    *ids[N_CASES] = {NULL};
	int			n_ids[N_CASES];
	g4_stats	st;
	int			k,
				rc = G4_OK;

	memset(r, 0, sizeof(*r));
	h_options(&o, model);
	o.backend = backend;
	o.kv_dtype = dtype;
	o.draft_model_path = assistant;
	if ((rc = g4_open(&o, &e, err)) != G4_OK)
		return rc;
	g4_set_draft_hook(e, record_drafts, r);
	if (!alone)
		h_attach(e, &run);
	for (k = 0; k < N_CASES && rc == G4_OK; k++)
	{
		g4_request	req;

		ids[k] = h_ints(g4j_get(h_golden_case(G, case_names[k]), "ids"), &n_ids[k]);
		h_token_request(&req, ids[k], n_ids[k], 64);
		if (alone)
		{
			h_run		one = {&r->res[k], 1};

			h_attach(e, &one);
			rc = g4_submit(e, &req, &r->res[k].id, err);
			if (rc == G4_OK)
				rc = h_drain(e, &one, 100000, err);
		}
		else
			rc = g4_submit(e, &req, &r->res[k].id, err);
	}
	if (rc == G4_OK && !alone)
		rc = h_drain(e, &run, 100000, err);
	g4_stats_get(e, &st);
	r->spec_drafted = st.spec_drafted;
	r->spec_accepted = st.spec_accepted;
	for (k = 0; k < N_CASES; k++)
		free(ids[k]);
	g4_close(e);
	return rc;
}

static void
free_run(mtp_run *r)
{
	int			k;

	for (k = 0; k < N_CASES; k++)
		h_result_free(&r->res[k]);
}

static int
same_tokens(const h_result *a, const h_result *b)
{
	return a->n_tokens == b->n_tokens && memcmp(a->tokens, b->tokens, (size_t) a->n_tokens * sizeof(int32_t)) == 0;
}

G4_TEST(gpu_mtp_greedy_with_drafting_matches)
{
	static const char *const dn[] = {"f32", "bf16", "turboquant_k8v4"};
	const char *model = h_fixture_model();
	char		assistant[4200];
	h_golden	G;
	char		why[512];
	g4_err		err;
	int			dtype;

	H_NEED_CUDA_AND_ASSISTANT(model, assistant);
	CHECK_MSG(h_golden_load("model-tiny", &G, why, sizeof(why)) == 0, "golden: %s", why);
	for (dtype = G4_KV_F32; dtype <= G4_KV_TURBOQUANT_K8V4; dtype++)
	{
		mtp_run    *plain = calloc(1, sizeof(mtp_run)),
				   *gpu = calloc(1, sizeof(mtp_run)),
				   *alone = calloc(1, sizeof(mtp_run)),
				   *cpu = calloc(1, sizeof(mtp_run));
		int			k;

		CHECK_MSG(plain && gpu && alone && cpu, "out of memory");
		CHECK_OK(run_all(model, NULL, &G, G4_BACKEND_CUDA, dtype, 0, plain, &err), &err);
		CHECK_OK(run_all(model, assistant, &G, G4_BACKEND_CUDA, dtype, 0, gpu, &err), &err);
		CHECK_OK(run_all(model, assistant, &G, G4_BACKEND_CUDA, dtype, 1, alone, &err), &err);
		if (dtype == G4_KV_F32)
			CHECK_OK(run_all(model, assistant, &G, G4_BACKEND_CPU, dtype, 0, cpu, &err), &err);
		printf("FIGURE %-18s | %s: %llu drafted, %llu accepted\n", "mtp drafting", dn[dtype],
			   (unsigned long long) gpu->spec_drafted, (unsigned long long) gpu->spec_accepted);
		CHECK_MSG(gpu->spec_drafted > 0, "%s: nothing drafted", dn[dtype]);
		for (k = 0; k < N_CASES; k++)
		{
			char		label[96];
			int			ok = same_tokens(&gpu->res[k], &plain->res[k]);

			snprintf(label, sizeof(label), "%s %s greedy, drafting vs not", dn[dtype], case_names[k]);
			printf("PARITY %-18s | %-44s | %10d | %8d | %s\n", "mtp greedy", label, ok ? 0 : 1, 0,
				   ok ? "ok" : "FAIL");
			CHECK_MSG(ok, "%s %s: CUDA output with drafting differs from without", dn[dtype], case_names[k]);
			ok = same_tokens(&alone->res[k], &plain->res[k]);
			snprintf(label, sizeof(label), "%s %s greedy, alone drafting vs batch not", dn[dtype], case_names[k]);
			printf("PARITY %-18s | %-44s | %10d | %8d | %s\n", "mtp greedy", label, ok ? 0 : 1, 0,
				   ok ? "ok" : "FAIL");
			CHECK_MSG(ok, "%s %s: CUDA output alone with drafting differs from the batch's without", dn[dtype],
					  case_names[k]);
			if (dtype != G4_KV_F32)
				continue;
			ok = same_tokens(&gpu->res[k], &cpu->res[k]);
			snprintf(label, sizeof(label), "%s %s greedy with drafting, cuda vs cpu", dn[dtype], case_names[k]);
			printf("PARITY %-18s | %-44s | %10d | %8d | %s\n", "mtp greedy", label, ok ? 0 : 1, 0,
				   ok ? "ok" : "FAIL");
			CHECK_MSG(ok, "%s: CUDA output with drafting differs from the CPU's", case_names[k]);
			ok = gpu->n_drafts[k] == cpu->n_drafts[k] &&
				memcmp(gpu->drafts[k], cpu->drafts[k], (size_t) gpu->n_drafts[k] * sizeof(int32_t)) == 0;
			snprintf(label, sizeof(label), "%s %s proposals (%d), cuda vs cpu", dn[dtype], case_names[k],
					 cpu->n_drafts[k]);
			printf("PARITY %-18s | %-44s | %10d | %8d | %s\n", "mtp proposals", label, ok ? 0 : 1, 0,
				   ok ? "ok" : "FAIL");
			CHECK_MSG(ok, "%s: the CUDA engine's drafts differ from the CPU's", case_names[k]);
		}
		free_run(plain);
		free_run(gpu);
		free_run(alone);
		free_run(cpu);
		free(plain);
		free(gpu);
		free(alone);
		free(cpu);
	}
	h_golden_free(&G);
}
