/*
 * draft.h — the MTP assistant's forward pass: proposing draft tokens for
 * speculative decoding (gemma4_unified_assistant).
 *
 * One drafting step for a batch of rows, each row a sequence whose target
 * has computed positions [0, p) and chosen the token at p:
 *   x = pre_projection([target_embed(token), h_prev])
 *   assistant decoder layers: queries only, attending the target's K/V of
 *   its last sliding layer (the last window + 1 positions before p) and of
 *   its last full layer (all positions before p), at position p
 *   h = norm(x); logits = h · E_assistantᵀ (no softcap);
 *   h_prev' = post_projection(h); token' = argmax(logits)
 * k steps at the same position p propose k tokens; the assistant keeps no
 * K/V of its own.
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
	/* device buffers */
	float	   *emb;			/* [R][B] target embeddings of the tokens */
	float	   *in;				/* [R][2B] [embedding, h_prev] */
	float	   *x;				/* [R][H] residual stream */
	float	   *h;				/* [R][H] */
	float	   *q;				/* [R][q_max] */
	float	   *attn;			/* [R][q_max] */
	float	   *gu;				/* [R][2F] */
	float	   *act;			/* [R][F] */
	float	   *logits;			/* [R][V] */
	float	   *proj;			/* [R][B] projected state (next h_prev) */
	/* host */
	float	   *in_host;		/* [R][2B] */
	float	   *logits_host;	/* [R][V], backends without device sampling */
	g4_row_sampling *greedy;	/* [R] temperature 0 */
} g4_draft;

/* Check that the assistant fits the target (hidden size, vocabulary, the
 * K/V geometry and window of the layers it reads) and allocate buffers for
 * up to max_rows rows per step.  A mismatch is G4_ERR_INVALID, saying what
 * differs. */
int			g4_draft_init(g4_draft *d, g4_model *assistant, const g4_model *target, int max_rows,
						  g4_err *err);
void		g4_draft_free(g4_draft *d);

/* Visible target key ranges of an assistant query at position p (window w):
 * lo/hi indexed by G4_KVG_*. */
void		g4_draft_ranges(int p, int w, int32_t lo[2], int32_t hi[2]);

/*
 * One drafting step over meta->n_tokens rows (no logit rows): meta->token
 * holds each row's current token, meta->pos its position p, meta->slot its
 * sequence, meta->lo/hi the ranges of g4_draft_ranges.  h_prev (host,
 * [n][backbone_hidden]) holds each row's previous hidden state and receives
 * the projected one; ids receives the proposals; when logits is not NULL it
 * receives every row's assistant logits (host [n][vocab]).
 */
int			g4_draft_step(g4_draft *d, const g4_step_meta *meta, float *h_prev, int32_t *ids, float *logits,
						  g4_err *err);

#endif
