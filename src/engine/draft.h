/*
 * draft.h — the MTP assistant's forward pass: proposing draft tokens for
 * speculative decoding (gemma4_unified_assistant).
 *
 * One drafting pass over a batch of rows, each row a sequence whose target
 * has computed positions [0, p) and chosen the token at p:
 *   x = pre_projection([target_embed(token), h_prev])
 *   assistant decoder layers: queries only, attending the target's K/V of
 *   its last sliding layer (the last window + 1 positions before p) and of
 *   its last full layer (all positions before p), at position p
 *   h = norm(x); logits = h · E_assistantᵀ (no softcap);
 *   h_prev' = post_projection(h); token' = argmax(logits)
 * k passes at the same position p propose k tokens; the assistant keeps no
 * K/V of its own.
 *
 * A round of k passes stays on the device: each pass takes its tokens from
 * the device and leaves its greedy choice there for the next, so the round
 * is one sequence of operations (one recorded graph where the backend
 * records them) and only the k proposals of each row are read back.
 */
#ifndef G4_DRAFT_H
#define G4_DRAFT_H

#include "model.h"

typedef struct
{
	g4_model   *m;				/* the assistant */
	const g4_model *target;
	g4_kv_layer kv[2];			/* the target layers read, per attention type,
								 * with the assistant's query heads */
	int			max_rows;
	int			n_rows;			/* rows of the current round */
	/* device buffers */
	int32_t    *ids;			/* [G4_SPEC_MAX_TOKENS + 1][n_rows]: pass i
								 * reads row tokens ids[i], writes ids[i + 1] */
	float	   *in;				/* [R][2B] [embedding, h_prev] */
	float	   *x;				/* [R][H] residual stream */
	float	   *h;				/* [R][H] */
	float	   *q;				/* [R][q_max] */
	float	   *attn;			/* [R][q_max] */
	float	   *gu;				/* [R][2F] */
	float	   *act;			/* [R][F] */
	float	   *logits;			/* [R][V] the last pass's */
	float	   *h_prev;			/* [R][B] the target's rows, then each pass's
								 * projected state */
	size_t		buffer_bytes;	/* the buffers above */
} g4_draft;

/* Check that the assistant fits the target (hidden size, vocabulary, the
 * K/V geometry and window of the layers it reads) and allocate buffers for
 * up to max_rows rows per round.  A mismatch is G4_ERR_INVALID, saying what
 * differs. */
int			g4_draft_init(g4_draft *d, g4_model *assistant, const g4_model *target, int max_rows,
						  g4_err *err);
void		g4_draft_free(g4_draft *d);

/* Visible target key ranges of an assistant query at position p (window w):
 * lo/hi indexed by G4_KVG_*. */
void		g4_draft_ranges(int p, int w, int32_t lo[2], int32_t hi[2]);

/*
 * A drafting round over meta->n_tokens rows: meta->token holds each row's
 * current token, meta->pos its position p, meta->slot its sequence,
 * meta->lo/hi the ranges of g4_draft_ranges, and meta->logit_rows
 * (n_logits = n_tokens) the row of target_h (device, [*][backbone_hidden]:
 * the target's final-normed hidden states, always the same buffer, which a
 * recorded round holds) that is the row's h_prev.  ids (host, [k][n])
 * receives the proposals of each pass.
 */
int			g4_draft_round(g4_draft *d, const g4_step_meta *meta, const float *target_h, int k, int32_t *ids,
						   g4_err *err);

/* The same round issued pass by pass, for callers that read d->logits or
 * d->ids between passes: g4_draft_begin takes the round's meta and rows,
 * g4_draft_pass(d, i) issues pass i (0-based) on ids[i] and h_prev. */
int			g4_draft_begin(g4_draft *d, const g4_step_meta *meta, const float *target_h, g4_err *err);
int			g4_draft_pass(g4_draft *d, int pass, g4_err *err);

#endif
