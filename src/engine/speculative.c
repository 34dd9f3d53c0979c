/*
 * speculative.c — MTP speculative decoding in the engine: after each step,
 * the assistant drafts up to k tokens for every decoding sequence (draft.c);
 * the next step verifies each sequence's pending token and its drafts in
 * one target pass over k + 1 positions (mixed with other sequences' prefill
 * chunks by the scheduler), keeps the longest accepted run plus the
 * target's own next token, and rolls the KV pool back past it.
 *
 * Acceptance: greedy sequences keep a draft while it equals the target's
 * choice (so the output is token for token the output without drafting);
 * sampled ones use speculative sampling (spec_accept.c), so the output is
 * distributed as sampling from the target alone.  A target row holding a
 * NaN fails the sequence there (G4_ERR_NUMERIC, nothing after it taken); an
 * assistant row holding one ends that sequence's drafts before it (a draft
 * is only a guess: the target's output stays whole).
 *
 * k adapts per sequence: a running mean r of the drafts accepted per
 * verify bounds it to round(r) + 1 (from num_speculative_tokens down to 1),
 * and no sequence drafts while more than spec_max_batch sequences decode,
 * where the verify step's extra rows cost more than they save.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "spec_accept.h"
#include "util.h"

/* Weight of the latest verify in the running acceptance mean. */
#define SPEC_RATE_WEIGHT 0.25f

/* Positions before the target's sliding window the assistant still reads:
 * the target's query at p sees p - W + 1.., the assistant's p - 1 - W.. */
#define SPEC_SLIDING_EXTRA 2

int
g4_spec_open(g4_engine *e, g4_err *err)
{
	const g4_options *o = &e->opts;
	g4_model   *a = NULL;
	size_t		S = (size_t) e->max_seqs;
	int			g;

	e->spec_k = 0;
	e->stats.spec_max_batch = o->spec_max_batch;
	if (!o->draft_model_path || !o->draft_model_path[0] || o->num_speculative_tokens == 0)
		return G4_OK;
	if (o->num_speculative_tokens < 0 || o->num_speculative_tokens > G4_SPEC_MAX_TOKENS)
		return g4_fail(err, G4_ERR_INVALID, "num_speculative_tokens must be in 0..%d (got %d)", G4_SPEC_MAX_TOKENS,
					   o->num_speculative_tokens);
	if (o->spec_max_batch < 0)
		return g4_fail(err, G4_ERR_INVALID, "the speculative batch limit must be >= 0 (got %d)", o->spec_max_batch);
	if (g4_model_load_assistant(o->draft_model_path, e->be, &a, err) != G4_OK)
		return err->code;
	if (g4_draft_init(&e->draft, a, e->model, e->max_seqs, err) != G4_OK)
	{
		g4_model_free(a);
		return g4_fail_ctx(err, "draft model %s", o->draft_model_path);
	}
	e->model->sliding_keep_extra = SPEC_SLIDING_EXTRA;
	e->spec_k = o->num_speculative_tokens;
	e->stats.spec_k = e->spec_k;
	/* every decoding sequence may have 1 + k logits rows */
	e->max_logits = e->max_seqs * (1 + e->spec_k);
	e->spec_p = g4_malloc((size_t) e->model->cfg.vocab_size * sizeof(double));
	e->spec_seq = g4_malloc(S * sizeof(g4_seq *));
	e->spec_tok = g4_malloc(S * sizeof(int32_t));
	e->spec_pos = g4_malloc(S * sizeof(int32_t));
	e->spec_slot = g4_malloc(S * sizeof(int32_t));
	e->spec_rows = g4_malloc(S * sizeof(int32_t));
	e->spec_ids = g4_malloc(S * G4_SPEC_MAX_TOKENS * sizeof(int32_t));
	for (g = 0; g < G4_KVG_COUNT; g++)
	{
		e->spec_lo[g] = g4_malloc(S * sizeof(int32_t));
		e->spec_hi[g] = g4_malloc(S * sizeof(int32_t));
	}
	if (!e->spec_p || !e->spec_seq || !e->spec_tok || !e->spec_pos || !e->spec_slot || !e->spec_rows ||
		!e->spec_ids || !e->spec_lo[0] || !e->spec_lo[1] || !e->spec_hi[0] || !e->spec_hi[1])
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	return G4_OK;
}

void
g4_spec_close(g4_engine *e)
{
	g4_model   *a = e->draft.m;
	int			g;

	g4_draft_free(&e->draft);
	g4_model_free(a);
	free(e->spec_p);
	free(e->spec_seq);
	free(e->spec_tok);
	free(e->spec_pos);
	free(e->spec_slot);
	free(e->spec_rows);
	free(e->spec_ids);
	for (g = 0; g < G4_KVG_COUNT; g++)
	{
		free(e->spec_lo[g]);
		free(e->spec_hi[g]);
	}
}

void
g4_spec_verify(g4_engine *e, const g4_sched_item *it, int row0, int device_ids, g4_event_fn fn, void *ctx)
{
	const g4_model_config *c = &e->model->cfg;
	g4_seq	   *s = it->seq;
	int			V = c->vocab_size;
	int			nd = it->n_draft;
	int			force = e->opts.bench_force_accept;
	int			accepted_n = 0;
	int			done = 0;
	int			j;

	e->stats.spec_verify_steps++;
	e->stats.spec_drafted += (uint64_t) nd;
	for (j = 0; j < nd; j++)
		e->stats.spec_pos_drafted[j]++;
	for (j = 0; j <= nd && !done; j++)
	{
		float	   *row = e->logits_host + (size_t) (row0 + j) * (size_t) V;
		int			is_draft = j < nd;
		int			accepted = 0;
		int32_t		id;

		if (!device_ids && e->logits_hook)
			e->logits_hook(e->hook_ctx, s->id, row, V);
		if (device_ids)
			id = e->st_ids[row0 + j];
		else if (is_draft && s->samp.temperature > 0.0f)
		{
			int			rc = g4_sample_dist(row, V, &s->samp, s->has_hist ? &s->hist : NULL, c->suppress_ids,
											c->n_suppress, &e->scratch, e->spec_p);

			if (rc == G4_ERR_NOMEM)
			{
				g4_seq_fail(e, s, G4_ERR_NOMEM, "out of memory verifying drafts", fn, ctx);
				done = 1;
				break;
			}
			/* G4_ERR_NUMERIC: a NaN row, which emitting fails */
			id = rc == G4_OK ? g4_spec_accept(e->spec_p, NULL, V, s->draft[j], &s->rng, &accepted)
				: G4_SAMPLE_NAN;
		}
		else
			id = g4_sample(row, V, &s->samp, s->has_hist ? &s->hist : NULL, c->suppress_ids, c->n_suppress,
						   &s->rng, &e->scratch);
		if (is_draft && s->samp.temperature == 0.0f)
			accepted = id == s->draft[j];
		/* a NaN row fails the sequence even where a draft is forced */
		if (is_draft && force >= 0 && id != G4_SAMPLE_NAN)
		{
			accepted = j < force;
			if (accepted)
				id = s->draft[j];
		}
		if (is_draft && accepted)
		{
			e->stats.spec_accepted++;
			e->stats.spec_pos_accepted[j]++;
			accepted_n++;
		}
		s->spec_row = row0 + j;
		done = g4_seq_emit_token(e, s, id, fn, ctx);
		if (is_draft && !accepted)
			break;
	}
	if (done)
	{
		/* finished (its slot and every block it held are released) */
		s->spec_row = -1;
		s->n_draft = 0;
		return;
	}
	/* the pending token and the accepted drafts are in the pool; the
	 * rejected drafts' positions are dropped with any block they alone
	 * occupied */
	s->n_computed = it->start + 1 + accepted_n;
	g4_kvpool_truncate(&e->kv, s->slot, s->n_computed, it->start + it->count);
	g4_seq_trim_window(e, s);
	s->spec_rate += SPEC_RATE_WEIGHT * ((float) accepted_n - s->spec_rate);
	s->n_draft = 0;
}

/* Drafts s may propose for the next step, n_decoding sequences decoding. */
static int
draft_budget(const g4_engine *e, const g4_seq *s, int n_decoding)
{
	int			k = e->spec_k;

	if (k == 0 || s->spec_off || s->slot < 0 || n_decoding > e->opts.spec_max_batch)
		return 0;
	if (e->opts.bench_force_accept < 0)
		k = G4_MIN(k, (int) lroundf(s->spec_rate) + 1);	/* a forced rate is no rate */
	/* the verify emits up to k + 1 tokens; drafts sit at n_tok.. */
	k = G4_MIN(k, s->max_tokens - s->n_generated - 1);
	k = G4_MIN(k, e->max_model_len - s->n_tok);
	return G4_MAX(k, 0);
}

int
g4_spec_draft(g4_engine *e, g4_err *err)
{
	int			W = e->model->cfg.sliding_window;
	int			n_decoding = 0;
	int			n = 0;
	int			k_max = 0;
	int			i,
				step;
	double		t0;
	g4_step_meta meta;

	if (!e->draft.m)
		return G4_OK;
	for (i = 0; i < e->n_seqs; i++)
	{
		const g4_seq *s = e->seqs[i];

		n_decoding += s->slot >= 0 && s->n_computed >= s->n_prompt;
	}
	for (i = 0; i < e->n_seqs; i++)
	{
		g4_seq	   *s = e->seqs[i];
		int			k;

		if (s->spec_row < 0)
			continue;
		k = s->n_computed == s->n_tok - 1 ? draft_budget(e, s, n_decoding) : 0;
		s->n_draft = 0;
		if (k == 0)
		{
			s->spec_row = -1;
			continue;
		}
		e->spec_seq[n] = s;
		e->spec_tok[n] = s->tok[s->n_tok - 1];
		e->spec_pos[n] = s->n_tok - 1;
		e->spec_slot[n] = s->slot;
		/* h_prev: the target's final-normed row that chose the token */
		e->spec_rows[n] = s->spec_row;
		s->spec_row = -1;
		{
			int32_t		lo[2],
						hi[2];
			int			g;

			g4_draft_ranges(s->n_tok - 1, W, lo, hi);
			for (g = 0; g < G4_KVG_COUNT; g++)
			{
				e->spec_lo[g][n] = lo[g];
				e->spec_hi[g][n] = hi[g];
			}
		}
		/* while drafting, -budget marks a row whose drafts are not all in */
		s->n_draft = -k;
		k_max = G4_MAX(k_max, k);
		n++;
	}
	if (n == 0)
		return G4_OK;
	t0 = g4_now();
	memset(&meta, 0, sizeof(meta));
	meta.n_tokens = n;
	meta.token = e->spec_tok;
	meta.pos = e->spec_pos;
	meta.slot = e->spec_slot;
	for (i = 0; i < G4_KVG_COUNT; i++)
	{
		meta.lo[i] = e->spec_lo[i];
		meta.hi[i] = e->spec_hi[i];
	}
	meta.n_logits = n;
	meta.logit_rows = e->spec_rows;
	/* every row runs k_max passes (one recorded round per shape); each
	 * keeps the proposals up to its budget or an end of sequence */
	if (g4_draft_round(&e->draft, &meta, e->ws.lx, k_max, e->spec_ids, err) != G4_OK)
	{
		for (i = 0; i < n; i++)
			e->spec_seq[i]->n_draft = 0;
		return err->code;
	}
	for (step = 0; step < k_max; step++)
	{
		const int32_t *ids = e->spec_ids + (size_t) step * (size_t) n;

		e->stats.spec_draft_steps++;
		e->stats.spec_draft_tokens += (uint64_t) n;
		for (i = 0; i < n; i++)
		{
			g4_seq	   *s = e->spec_seq[i];

			if (s->n_draft >= 0)
				continue;		/* complete */
			/* a NaN in the assistant's row proposes nothing: the drafts end
			 * before it (the passes after it read a zero embedding, and
			 * their proposals are not taken) */
			if (ids[i] == G4_SAMPLE_NAN)
			{
				s->n_draft = step;
				continue;
			}
			s->draft[step] = ids[i];
			/* done at its budget, or after drafting an end of sequence */
			if (step + 1 == -s->n_draft || g4_is_eos(e, ids[i]))
				s->n_draft = step + 1;
		}
	}
	e->stats.spec_draft_seconds += g4_now() - t0;
	if (e->draft_hook)
		for (i = 0; i < n; i++)
			e->draft_hook(e->draft_hook_ctx, e->spec_seq[i]->id, e->spec_seq[i]->n_tok, e->spec_seq[i]->draft,
						  e->spec_seq[i]->n_draft);
	return G4_OK;
}

void
g4_set_draft_hook(g4_engine *e, void (*fn) (void *ctx, uint64_t seq_id, int first_pos, int32_t *drafts, int n),
				  void *ctx)
{
	e->draft_hook = fn;
	e->draft_hook_ctx = ctx;
}
