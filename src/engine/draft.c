/*
 * draft.c — the MTP assistant's forward pass (see draft.h).
 */
#include "draft.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

/* The last target layer of an attention type, or -1. */
static int
last_layer_of(const g4_model *t, int full)
{
	int			i;

	for (i = t->cfg.n_layers - 1; i >= 0; i--)
		if (t->cfg.layer_full[i] == full)
			return i;
	return -1;
}

static int
check_match(const g4_model *a, const g4_model *t, g4_err *err)
{
	const g4_model_config *ac = &a->cfg;
	const g4_model_config *tc = &t->cfg;
	int			used[2] = {0, 0};
	int			i;

	if (tc->family != G4_FAMILY_GEMMA4)
		return g4_fail(err, G4_ERR_INVALID, "the draft model is a Gemma 4 assistant but the target is not Gemma 4");
	if (ac->backbone_hidden != tc->hidden_size)
		return g4_fail(err, G4_ERR_INVALID,
					   "the draft model was made for a target of hidden size %d, the target's is %d",
					   ac->backbone_hidden, tc->hidden_size);
	if (ac->vocab_size != tc->vocab_size)
		return g4_fail(err, G4_ERR_INVALID, "the draft model's vocabulary has %d tokens, the target's %d",
					   ac->vocab_size, tc->vocab_size);
	for (i = 0; i < ac->n_layers; i++)
		used[ac->layer_full[i] ? 1 : 0] = 1;
	for (i = 0; i < 2; i++)
	{
		const g4_attn_type *x = &ac->attn[i];
		const g4_attn_type *y = &tc->attn[i];
		const char *kind = i ? "full" : "sliding";

		if (!used[i])
			continue;
		if (last_layer_of(t, i) < 0)
			return g4_fail(err, G4_ERR_INVALID, "the draft model reads a %s attention layer the target lacks", kind);
		if (x->head_dim != y->head_dim || x->n_kv_heads != y->n_kv_heads || x->k_eq_v != y->k_eq_v)
			return g4_fail(err, G4_ERR_INVALID,
						   "the draft model's %s layers expect K/V of %d heads of %d%s, the target's have %d of %d%s",
						   kind, x->n_kv_heads, x->head_dim, x->k_eq_v ? " (K = V)" : "", y->n_kv_heads,
						   y->head_dim, y->k_eq_v ? " (K = V)" : "");
	}
	if (used[0] && ac->sliding_window != tc->sliding_window)
		return g4_fail(err, G4_ERR_INVALID, "the draft model's sliding window is %d, the target's %d",
					   ac->sliding_window, tc->sliding_window);
	return G4_OK;
}

int
g4_draft_init(g4_draft *d, g4_model *assistant, const g4_model *target, int max_rows, g4_err *err)
{
	const g4_model_config *c = &assistant->cfg;
	g4_backend *be = assistant->be;
	size_t		R = (size_t) max_rows;
	size_t		B = (size_t) c->backbone_hidden;
	size_t		H = (size_t) c->hidden_size;
	size_t		F = (size_t) c->intermediate_size;
	size_t		V = (size_t) c->vocab_size;
	size_t		q_max = (size_t) c->n_heads * (size_t) G4_MAX(c->attn[0].head_dim, c->attn[1].head_dim);
	struct
	{
		void	  **p;
		size_t		bytes;
	}			bufs[10];
	size_t		k;
	int			t;

	memset(d, 0, sizeof(*d));
	if (check_match(assistant, target, err) != G4_OK)
		return err->code;
	d->m = assistant;
	d->target = target;
	d->max_rows = max_rows;
	for (t = 0; t < 2; t++)
	{
		int			i = last_layer_of(target, t);

		if (i < 0)
			continue;
		d->kv[t] = target->layers[i].kv;
		d->kv[t].n_heads = c->n_heads;
	}
	bufs[0].p = (void **) &d->ids, bufs[0].bytes = (G4_SPEC_MAX_TOKENS + 1) * R * sizeof(int32_t);
	bufs[1].p = (void **) &d->in, bufs[1].bytes = R * 2 * B * sizeof(float);
	bufs[2].p = (void **) &d->x, bufs[2].bytes = R * H * sizeof(float);
	bufs[3].p = (void **) &d->h, bufs[3].bytes = R * H * sizeof(float);
	bufs[4].p = (void **) &d->q, bufs[4].bytes = R * q_max * sizeof(float);
	bufs[5].p = (void **) &d->attn, bufs[5].bytes = R * q_max * sizeof(float);
	bufs[6].p = (void **) &d->gu, bufs[6].bytes = R * 2 * F * sizeof(float);
	bufs[7].p = (void **) &d->act, bufs[7].bytes = R * F * sizeof(float);
	bufs[8].p = (void **) &d->logits, bufs[8].bytes = R * V * sizeof(float);
	bufs[9].p = (void **) &d->h_prev, bufs[9].bytes = R * B * sizeof(float);
	for (k = 0; k < G4_ARRAY_LEN(bufs); k++)
	{
		*bufs[k].p = be->ops->alloc(be, bufs[k].bytes);
		if (!*bufs[k].p)
		{
			g4_draft_free(d);
			return g4_fail(err, G4_ERR_NOMEM, "out of %s memory for the draft model's buffers", be->ops->name);
		}
		d->buffer_bytes += bufs[k].bytes;
	}
	return G4_OK;
}

void
g4_draft_free(g4_draft *d)
{
	void	   *ps[] = {d->ids, d->in, d->x, d->h, d->q, d->attn, d->gu, d->act, d->logits, d->h_prev};
	size_t		k;

	if (d->m)
		for (k = 0; k < G4_ARRAY_LEN(ps); k++)
			if (ps[k])
				d->m->be->ops->free(d->m->be, ps[k]);
	memset(d, 0, sizeof(*d));
}

void
g4_draft_ranges(int p, int w, int32_t lo[2], int32_t hi[2])
{
	/* the assistant's sliding mask is |q - k| <= w, bidirectional over the
	 * shared K/V: the last w + 1 positions before p, one more than the
	 * target's own window */
	lo[G4_KVG_SLIDING] = G4_MAX(0, p - 1 - w);
	hi[G4_KVG_SLIDING] = p;
	lo[G4_KVG_FULL] = 0;
	hi[G4_KVG_FULL] = p;
}

#define TRY(call) do { int _rc = (call); if (_rc != G4_OK) \
	return g4_fail(err, _rc, "%s backend: draft model: %s failed", be->ops->name, #call); } while (0)

/* Decoder layers of the assistant on d->x (n rows); leaves norm(x) in d->h. */
static int
decoder(g4_draft *d, int n, g4_err *err)
{
	const g4_model *m = d->m;
	const g4_model_config *c = &m->cfg;
	g4_backend *be = m->be;
	int			H = c->hidden_size;
	float		eps = (float) c->rms_eps;
	int			i;

	TRY(be->ops->rmsnorm(be, d->x, m->layers[0].attn_norm, n, H, eps, d->h));
	for (i = 0; i < c->n_layers; i++)
	{
		const g4_layer *ly = &m->layers[i];
		const g4_layer *next = i + 1 < c->n_layers ? &m->layers[i + 1] : NULL;
		const g4_kv_layer *kv = &d->kv[c->layer_full[i] ? 1 : 0];

		TRY(be->ops->matmul(be, ly->qkv, d->h, n, d->q));
		{
			g4_head_run q = {0, c->n_heads, ly->q_norm, m->inv_freq[c->layer_full[i] ? 1 : 0], 0};

			TRY(be->ops->head_norm_rope(be, d->q, n, ly->q_dim, kv->head_dim, &q, 1, eps, NULL));
		}
		TRY(be->ops->attention(be, kv, d->q, ly->q_dim, n, d->attn));
		TRY(be->ops->matmul(be, ly->o, d->attn, n, d->h));
		TRY(be->ops->add_rmsnorm(be, d->x, d->h, ly->post_attn_norm, n, H, eps, 1.0f, ly->pre_ffn_norm, d->h));
		TRY(be->ops->matmul_geglu(be, ly->gate_up, d->h, n, c->intermediate_size, d->gu, d->act));
		TRY(be->ops->matmul(be, ly->down, d->act, n, d->h));
		TRY(be->ops->add_rmsnorm(be, d->x, d->h, ly->post_ffn_norm, n, H, eps, ly->layer_scalar,
								 next ? next->attn_norm : NULL, next ? d->h : NULL));
	}
	TRY(be->ops->rmsnorm(be, d->x, m->final_norm, n, H, eps, d->h));
	return G4_OK;
}

/* Graph tag of a round of k passes: rounds of different lengths are
 * different sequences of operations, and none is a forward step. */
#define DRAFT_GRAPH_TAG(k) (((uint64_t) 0x6472616674ull << 8) | (uint64_t) (k))

/* The round's metadata and its first tokens. */
static int
round_start(g4_draft *d, const g4_step_meta *meta, g4_err *err)
{
	g4_backend *be = d->m->be;
	int			n = meta->n_tokens;

	if (n <= 0 || n > d->max_rows || meta->n_logits != n)
		return g4_fail(err, G4_ERR_INTERNAL, "a draft round of %d rows (%d hidden states) exceeds its buffers (%d)",
					   n, meta->n_logits, d->max_rows);
	d->n_rows = n;
	TRY(be->ops->step_begin(be, meta));
	TRY(be->ops->upload(be, d->ids, meta->token, (size_t) n * sizeof(int32_t)));
	return G4_OK;
}

/* h_prev of the first pass: the rows' target hidden states. */
static int
gather_target_rows(g4_draft *d, const float *target_h, g4_err *err)
{
	g4_backend *be = d->m->be;

	TRY(be->ops->gather_logit_rows(be, target_h, d->m->cfg.backbone_hidden, d->h_prev));
	return G4_OK;
}

int
g4_draft_begin(g4_draft *d, const g4_step_meta *meta, const float *target_h, g4_err *err)
{
	if (round_start(d, meta, err) != G4_OK)
		return err->code;
	return gather_target_rows(d, target_h, err);
}

int
g4_draft_pass(g4_draft *d, int pass, g4_err *err)
{
	const g4_model *m = d->m;
	const g4_model *t = d->target;
	g4_backend *be = m->be;
	int			n = d->n_rows;
	int			B = m->cfg.backbone_hidden;

	if (pass < 0 || pass >= G4_SPEC_MAX_TOKENS)
		return g4_fail(err, G4_ERR_INTERNAL, "draft pass %d of at most %d", pass, G4_SPEC_MAX_TOKENS);
	TRY(be->ops->embed_concat(be, t->embed, t->embed_scale, d->ids + (size_t) pass * (size_t) n, d->h_prev, B, n,
							  d->in));
	TRY(be->ops->matmul(be, m->pre_proj, d->in, n, d->x));
	if (decoder(d, n, err) != G4_OK)
		return err->code;
	TRY(be->ops->matmul(be, m->embed, d->h, n, d->logits));
	TRY(be->ops->matmul(be, m->post_proj, d->h, n, d->h_prev));
	TRY(be->ops->argmax(be, d->logits, n, m->cfg.vocab_size, d->ids + (size_t) (pass + 1) * (size_t) n));
	return G4_OK;
}

int
g4_draft_round(g4_draft *d, const g4_step_meta *meta, const float *target_h, int k, int32_t *ids, g4_err *err)
{
	g4_backend *be = d->m->be;
	int			graphs = be->ops->graph_begin && be->ops->graph_end;
	int			replay = 0;
	int			rc = G4_OK;
	int			pass;

	if (k < 1 || k > G4_SPEC_MAX_TOKENS)
		return g4_fail(err, G4_ERR_INTERNAL, "a draft round of %d passes (1..%d)", k, G4_SPEC_MAX_TOKENS);
	if (round_start(d, meta, err) != G4_OK)
		return err->code;
	if (graphs)
	{
		rc = be->ops->graph_begin(be, DRAFT_GRAPH_TAG(k));
		if (rc < 0)
			return g4_fail(err, rc, "%s backend: starting a draft graph failed", be->ops->name);
		replay = rc == 1;		/* recorded before: graph_end replays it */
		rc = G4_OK;
	}
	if (!replay)
	{
		rc = gather_target_rows(d, target_h, err);
		for (pass = 0; pass < k && rc == G4_OK; pass++)
			rc = g4_draft_pass(d, pass, err);
	}
	if (graphs)
	{
		int			rc2 = be->ops->graph_end(be, rc != G4_OK);

		if (rc == G4_OK && rc2 != G4_OK)
			return g4_fail(err, rc2, "%s backend: finishing a draft graph failed", be->ops->name);
	}
	if (rc != G4_OK)
		return rc;
	/* the proposals of passes 1..k, contiguous: one read */
	TRY(be->ops->download(be, ids, d->ids + d->n_rows, (size_t) k * (size_t) d->n_rows * sizeof(int32_t)));
	return be->ops->sync(be, err);
}
