/*
 * score.c — teacher-forced scoring: the logits of every position of a given
 * token sequence (g4_score), for perplexity, KV-dtype divergence and
 * retrieval checks.
 *
 * The sequence goes through the same metadata builder as a request's prompt
 * (g4_schedule_meta), in chunks of at most max_num_batched_tokens, so its
 * logits are those a request with that prompt would see.  Each chunk runs
 * the layers once; its logit rows are then computed in slices as tall as the
 * workspace's logits buffer.  A row holding a NaN (the forward pass broke)
 * ends the call with G4_ERR_NUMERIC before it reaches the callback.
 */
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "util.h"

int
g4_score(g4_engine *e, const int32_t *ids, int n, int first_logit, g4_logits_fn fn, void *ctx, g4_err *err)
{
	const g4_model_config *c = &e->model->cfg;
	int			V = c->vocab_size;
	g4_seq		s;
	g4_sched_item item;
	g4_schedule sc;
	int			slot = 0;
	int			start;
	int			rc = G4_OK;
	int			i;

	if (!ids || n < 1 || !fn || first_logit < 0)
		return g4_fail(err, G4_ERR_INVALID, "scoring needs at least one token and a logits callback");
	if (n > e->max_model_len)
		return g4_fail(err, G4_ERR_TOO_LONG, "%d tokens exceed the context window of %d", n, e->max_model_len);
	if (e->n_seqs > 0)
		return g4_fail(err, G4_ERR_BUSY, "scoring needs an idle engine: %d requests are live", e->n_seqs);
	for (i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= V)
			return g4_fail(err, G4_ERR_INVALID, "token id %d at position %d is outside the vocabulary (%d)",
						   ids[i], i, V);

	g4_progress_start(&e->progress);
	/* a text-only prompt in slot 0, as the scheduler would describe it */
	memset(&s, 0, sizeof(s));
	s.tok = (int32_t *) ids;
	s.n_tok = s.n_prompt = n;
	s.slot = slot;
	memset(&sc, 0, sizeof(sc));
	sc.items = &item;
	sc.n_items = sc.cap_items = 1;
	e->slot_used[slot] = 1;

	for (start = 0; start < n && rc == G4_OK; start += e->max_batched)
	{
		int			count = G4_MIN(e->max_batched, n - start);
		g4_step_meta meta;
		g4_embed_rows extra;
		int			r0;
		int			keep;

		item.seq = &s;
		item.start = start;
		item.count = count;
		item.wants_logits = 0;
		sc.n_tokens = count;
		rc = g4_kvpool_ensure(&e->kv, slot, start, start + count);
		if (rc != G4_OK)
		{
			g4_fail(err, rc, "the KV pool cannot hold %d tokens of one sequence", start + count);
			break;
		}
		rc = g4_schedule_meta(e, &sc, &meta, &extra, err);
		if (rc == G4_OK)
			rc = g4_model_forward(e->model, &e->ws, &meta, NULL, err);
		/* logit rows in slices; row r of the step is position start + r */
		for (r0 = G4_MAX(first_logit - start, 0); rc == G4_OK && r0 < count; r0 += e->max_logits)
		{
			int			rows = G4_MIN(e->max_logits, count - r0);

			for (i = 0; i < rows; i++)
				e->st_logit_rows[i] = r0 + i;
			meta.n_logits = rows;
			meta.logit_rows = e->st_logit_rows;
			rc = g4_model_logits(e->model, &e->ws, &meta, err);
			if (rc == G4_OK)
				rc = e->be->ops->download(e->be, e->logits_host, e->ws.logits,
										  (size_t) rows * (size_t) V * sizeof(float));
			if (rc == G4_OK)
				rc = e->be->ops->sync(e->be, err);
			for (i = 0; rc == G4_OK && i < rows; i++)
			{
				const float *row = e->logits_host + (size_t) i * (size_t) V;

				/* a row holding a NaN is never handed out (g4_argmax tells,
				 * as it tells the sampler) */
				if (g4_argmax(row, V) == G4_SAMPLE_NAN)
					rc = g4_fail(err, G4_ERR_NUMERIC,
								 "the model produced a non-finite value: NaN in the logits at position %d",
								 start + r0 + i);
				else
					fn(ctx, start + r0 + i, row, V);
			}
		}
		if (rc == G4_OK)
			rc = e->be->ops->sync(e->be, err);
		keep = start + count - c->sliding_window + 1;
		if (keep > 0)
			g4_kvpool_trim_window(&e->kv, slot, keep, start + count);
	}
	g4_kvpool_release(&e->kv, slot, n + 1);
	e->slot_used[slot] = 0;
	if (rc != G4_OK && err->msg[0] == '\0')
		g4_fail(err, rc, "%s", g4_status_name(rc));
	return rc;
}
