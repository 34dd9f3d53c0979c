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
		float	  **p;
		size_t		n;
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
	bufs[0].p = &d->emb, bufs[0].n = R * B;
	bufs[1].p = &d->in, bufs[1].n = R * 2 * B;
	bufs[2].p = &d->x, bufs[2].n = R * H;
	bufs[3].p = &d->h, bufs[3].n = R * H;
	bufs[4].p = &d->q, bufs[4].n = R * q_max;
	bufs[5].p = &d->attn, bufs[5].n = R * q_max;
	bufs[6].p = &d->gu, bufs[6].n = R * 2 * F;
	bufs[7].p = &d->act, bufs[7].n = R * F;
	bufs[8].p = &d->logits, bufs[8].n = R * V;
	bufs[9].p = &d->proj, bufs[9].n = R * B;
	for (k = 0; k < G4_ARRAY_LEN(bufs); k++)
	{
		*bufs[k].p = be->ops->alloc(be, bufs[k].n * sizeof(float));
		if (!*bufs[k].p)
		{
			g4_draft_free(d);
			return g4_fail(err, G4_ERR_NOMEM, "out of %s memory for the draft model's buffers", be->ops->name);
		}
	}
	d->in_host = g4_malloc(R * 2 * B * sizeof(float));
	d->greedy = g4_calloc(R, sizeof(g4_row_sampling));
	d->logits_host = be->ops->sample ? NULL : g4_malloc(R * V * sizeof(float));
	if (!d->in_host || !d->greedy || (!be->ops->sample && !d->logits_host))
	{
		g4_draft_free(d);
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	}
	for (k = 0; k < R; k++)
	{
		d->greedy[k].top_p = 1.0f;
		d->greedy[k].min_p = 0.0f;
	}
	return G4_OK;
}

void
g4_draft_free(g4_draft *d)
{
	float	   *ps[] = {d->emb, d->in, d->x, d->h, d->q, d->attn, d->gu, d->act, d->logits, d->proj};
	size_t		k;

	if (d->m)
		for (k = 0; k < G4_ARRAY_LEN(ps); k++)
			if (ps[k])
				d->m->be->ops->free(d->m->be, ps[k]);
	free(d->in_host);
	free(d->logits_host);
	free(d->greedy);
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
		TRY(be->ops->head_norm_rope(be, d->q, n, ly->q_dim, c->n_heads, kv->head_dim, ly->q_norm, eps,
									m->inv_freq[c->layer_full[i] ? 1 : 0]));
		TRY(be->ops->attention(be, kv, d->q, ly->q_dim, n, d->attn));
		TRY(be->ops->matmul(be, ly->o, d->attn, n, d->h));
		TRY(be->ops->add_rmsnorm(be, d->x, d->h, ly->post_attn_norm, n, H, eps, 1.0f, ly->pre_ffn_norm, d->h));
		TRY(be->ops->matmul(be, ly->gate_up, d->h, n, d->gu));
		TRY(be->ops->geglu(be, d->gu, n, c->intermediate_size, d->act));
		TRY(be->ops->matmul(be, ly->down, d->act, n, d->h));
		TRY(be->ops->add_rmsnorm(be, d->x, d->h, ly->post_ffn_norm, n, H, eps, ly->layer_scalar,
								 next ? next->attn_norm : NULL, next ? d->h : NULL));
	}
	TRY(be->ops->rmsnorm(be, d->x, m->final_norm, n, H, eps, d->h));
	return G4_OK;
}

int
g4_draft_step(g4_draft *d, const g4_step_meta *meta, float *h_prev, int32_t *ids, float *logits, g4_err *err)
{
	const g4_model *m = d->m;
	const g4_model *t = d->target;
	g4_backend *be = m->be;
	int			n = meta->n_tokens;
	size_t		B = (size_t) m->cfg.backbone_hidden;
	size_t		V = (size_t) m->cfg.vocab_size;
	float	   *lg;
	int			i;

	if (n <= 0 || n > d->max_rows)
		return g4_fail(err, G4_ERR_INTERNAL, "draft step of %d rows exceeds its buffers (%d)", n, d->max_rows);
	TRY(be->ops->step_begin(be, meta));
	TRY(be->ops->embed(be, t->embed, t->embed_scale, d->emb));
	TRY(be->ops->download(be, d->in_host, d->emb, (size_t) n * B * sizeof(float)));
	TRY(be->ops->sync(be, err));
	/* interleave [embedding, h_prev] per row: the embeddings arrived packed
	 * at the front, so rows move back to front without overlap */
	for (i = n - 1; i >= 0; i--)
	{
		memmove(d->in_host + (size_t) i * 2 * B, d->in_host + (size_t) i * B, B * sizeof(float));
		memcpy(d->in_host + (size_t) i * 2 * B + B, h_prev + (size_t) i * B, B * sizeof(float));
	}
	TRY(be->ops->upload(be, d->in, d->in_host, (size_t) n * 2 * B * sizeof(float)));
	TRY(be->ops->matmul(be, m->pre_proj, d->in, n, d->x));
	if (decoder(d, n, err) != G4_OK)
		return err->code;
	TRY(be->ops->matmul(be, m->embed, d->h, n, d->logits));
	TRY(be->ops->matmul(be, m->post_proj, d->h, n, d->proj));
	TRY(be->ops->download(be, h_prev, d->proj, (size_t) n * B * sizeof(float)));
	if (logits)
		TRY(be->ops->download(be, logits, d->logits, (size_t) n * V * sizeof(float)));
	if (be->ops->sample && !logits)
	{
		/* greedy on the device: only ids come back */
		TRY(be->ops->sample(be, d->logits, n, (int) V, NULL, 0, d->greedy, ids));
		TRY(be->ops->sync(be, err));
		return G4_OK;
	}
	lg = logits ? logits : d->logits_host;
	if (!logits)
		TRY(be->ops->download(be, lg, d->logits, (size_t) n * V * sizeof(float)));
	TRY(be->ops->sync(be, err));
	for (i = 0; i < n; i++)
	{
		const float *row = lg + (size_t) i * V;
		size_t		j,
					best = 0;

		for (j = 1; j < V; j++)
			if (row[j] > row[best])
				best = j;
		ids[i] = (int32_t) best;
	}
	return G4_OK;
}
