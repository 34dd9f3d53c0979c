/*
 * test_gpu_memory.c — the CUDA backend's buffers are sized when the engine
 * opens (dry_steps.h), so serving grows none of them: on the tiny fixture
 * and its assistant, in each KV dtype, a prompt reaching the window's end
 * in chunks of max_num_batched_tokens, every slot decoding beside it, and
 * drafts verified leave the workspace the engine reported at open.  The
 * sampler runs on the device (no logits hook).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "test.h"
#include "util.h"

#define SEQS 8
#define WINDOW 2048
#define CHUNK 256
#define GENERATED 24

static int
serve(g4_engine *e, g4_err *err)
{
	h_result	res[SEQS];
	h_run		run = {res, SEQS};
	int32_t    *ids = malloc((size_t) WINDOW * sizeof(int32_t));
	int			rc = G4_OK;

	if (!ids)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	memset(res, 0, sizeof(res));
	h_attach_tokens(e, &run);
	for (int i = 0; i < WINDOW; i++)
		ids[i] = 1000 + (i * 7) % 500;
	for (int k = 0; k < SEQS && rc == G4_OK; k++)
	{
		g4_request	req;
		/* one prompt up to the window's end, the others short */
		int			n = k == 0 ? WINDOW - GENERATED : 16 + k;

		h_token_request(&req, ids, n, GENERATED);
		rc = g4_submit(e, &req, &res[k].id, err);
	}
	if (rc == G4_OK)
		rc = h_drain(e, &run, 10000, err);
	for (int k = 0; k < SEQS; k++)
	{
		if (rc == G4_OK && (!res[k].finished || res[k].failed))
			rc = g4_fail(err, G4_ERR_INTERNAL, "request %d did not finish: %s", k, res[k].error);
		h_result_free(&res[k]);
	}
	free(ids);
	return rc;
}

G4_TEST(gpu_backend_buffers_do_not_grow_while_serving)
{
	static const char *const dn[] = {"f32", "bf16", "turboquant_k8v4"};
	const char *model = h_fixture_model();
	char		assistant[4200];
	g4_err		err;

	H_NEED_CUDA_AND_ASSISTANT(model, assistant);
	for (int dtype = G4_KV_F32; dtype <= G4_KV_TURBOQUANT_K8V4; dtype++)
	{
		g4_options	o;
		g4_engine  *e;
		g4_stats	at_open,
					after;

		h_options(&o, model);
		o.backend = G4_BACKEND_CUDA;
		o.kv_dtype = dtype;
		o.draft_model_path = assistant;
		o.max_num_seqs = SEQS;
		o.max_num_batched_tokens = CHUNK;
		o.max_model_len = WINDOW;
		CHECK_OK(g4_open(&o, &e, &err), &err);
		g4_stats_get(e, &at_open);
		CHECK_OK(serve(e, &err), &err);
		g4_stats_get(e, &after);
		printf("FIGURE %-18s | %s: workspace %zu bytes at open, %zu after serving\n", "backend buffers", dn[dtype],
			   at_open.workspace_bytes, after.workspace_bytes);
		CHECK_MSG(after.workspace_bytes == at_open.workspace_bytes,
				  "%s: the workspace grew from %zu to %zu bytes while serving", dn[dtype], at_open.workspace_bytes,
				  after.workspace_bytes);
		CHECK_MSG(after.spec_drafted > 0, "%s: nothing drafted", dn[dtype]);
		g4_close(e);
	}
}
