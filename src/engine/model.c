/*
 * model.c — the decoder's forward pass over one scheduler step, expressed
 * as backend operations, and the activation workspace it runs in.
 *
 * Per layer (Gemma 4; Gemma 3 differs only through the configuration):
 *   h = rmsnorm(x) ; q|k|v = h·Wqkvᵀ
 *   q = rope(qnorm(q)) ; k = rope(knorm(k)) ; v = vnorm(v)   (k_eq_v: v = vnorm(k))
 *   store k, v in the pool ; a = attention(q, pool)
 *   x = x + postnorm(a·Woᵀ)
 *   x = (x + postffnnorm(down(gelu(gate(h')) * up(h')))) * layer_scalar,
 *       h' = preffnnorm(x)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "util.h"

/* The gate/up buffer of one MLP slice is bounded by this many bytes. */
#define MLP_SLICE_BYTES ((size_t) 256 << 20)

static int
max_qkv_width(const g4_model_config *c, int *q_max)
{
	int			w = 0;
	int			t;

	*q_max = 0;
	for (t = 0; t < 2; t++)
	{
		const g4_attn_type *a = &c->attn[t];
		int			q = c->n_heads * a->head_dim;
		int			kv = a->n_kv_heads * a->head_dim;
		int			width = q + kv * (a->k_eq_v ? 1 : 2);

		w = G4_MAX(w, width);
		*q_max = G4_MAX(*q_max, q);
	}
	return w;
}

static int
mlp_rows_for(const g4_model_config *c, int max_tokens)
{
	size_t		per_row = (size_t) c->intermediate_size * 3 * sizeof(float);
	size_t		rows = MLP_SLICE_BYTES / per_row;

	if (rows < 1)
		rows = 1;
	return (int) G4_MIN((size_t) max_tokens, rows);
}

/*
 * Rows per MLP slice of a step of T tokens: slices of equal size (a multiple
 * of 128, the last one shorter) rather than full ones and a remainder: a 2k
 * chunk's MLP on cuBLASLt at 1,456 + 592 rows ran its 592-row slice at
 * 275-475 TFLOP/s against 620-730 for the first (run 64).
 */
int
g4_mlp_slice_rows(const g4_workspace *ws, int T)
{
	int			slice;

	if (T <= 0)
		return 1;
	slice = G4_DIV_UP(T, G4_DIV_UP(T, ws->mlp_rows));
	return G4_MIN(ws->mlp_rows, G4_DIV_UP(slice, 128) * 128);
}

size_t
g4_workspace_bytes(const g4_model_config *c, int max_tokens, int max_logits)
{
	size_t		T = (size_t) max_tokens;
	size_t		H = (size_t) c->hidden_size;
	size_t		F = (size_t) c->intermediate_size;
	size_t		M = (size_t) mlp_rows_for(c, max_tokens);
	int			q_max;
	size_t		w = (size_t) max_qkv_width(c, &q_max);

	return sizeof(float) * (2 * T * H + T * w + T * (size_t) q_max + M * 3 * F +
							(size_t) max_logits * (H + (size_t) c->vocab_size));
}

int
g4_workspace_init(g4_model *m, int max_tokens, int max_logits, g4_workspace *ws, g4_err *err)
{
	const g4_model_config *c = &m->cfg;
	g4_backend *be = m->be;
	size_t		T = (size_t) max_tokens;
	size_t		H = (size_t) c->hidden_size;
	size_t		F = (size_t) c->intermediate_size;
	int			q_max;
	size_t		w = (size_t) max_qkv_width(c, &q_max);
	struct
	{
		float	  **p;
		size_t		n;
	}			bufs[8];
	size_t		k;

	memset(ws, 0, sizeof(*ws));
	ws->max_tokens = max_tokens;
	ws->max_logits = max_logits;
	ws->mlp_rows = mlp_rows_for(c, max_tokens);
	bufs[0].p = &ws->x, bufs[0].n = T * H;
	bufs[1].p = &ws->h, bufs[1].n = T * H;
	bufs[2].p = &ws->qkv, bufs[2].n = T * w;
	bufs[3].p = &ws->attn, bufs[3].n = T * (size_t) q_max;
	bufs[4].p = &ws->gu, bufs[4].n = (size_t) ws->mlp_rows * 2 * F;
	bufs[5].p = &ws->act, bufs[5].n = (size_t) ws->mlp_rows * F;
	bufs[6].p = &ws->lx, bufs[6].n = (size_t) max_logits * H;
	bufs[7].p = &ws->logits, bufs[7].n = (size_t) max_logits * (size_t) c->vocab_size;
	for (k = 0; k < G4_ARRAY_LEN(bufs); k++)
	{
		*bufs[k].p = be->ops->alloc(be, bufs[k].n * sizeof(float));
		if (!*bufs[k].p)
		{
			g4_workspace_free(m, ws);
			return g4_fail(err, G4_ERR_NOMEM,
						   "out of %s memory for the activation workspace (%zu MiB for %d tokens per step)",
						   be->ops->name, g4_workspace_bytes(c, max_tokens, max_logits) >> 20, max_tokens);
		}
		ws->bytes += bufs[k].n * sizeof(float);
	}
	return G4_OK;
}

void
g4_workspace_free(g4_model *m, g4_workspace *ws)
{
	float	   *ps[] = {ws->x, ws->h, ws->qkv, ws->attn, ws->gu, ws->act, ws->lx, ws->logits};
	size_t		k;

	for (k = 0; k < G4_ARRAY_LEN(ps); k++)
		if (ps[k])
			m->be->ops->free(m->be, ps[k]);
	memset(ws, 0, sizeof(*ws));
}

/* Stop at the first failing operation (its code is returned). */
#define TRY(call) do { int _rc = (call); if (_rc != G4_OK) \
	return g4_fail(err, _rc, "%s backend: %s failed", be->ops->name, #call); } while (0)

/* The attention block; its input norm is already in ws->h when `normed`
 * (the previous block's residual add wrote it).  Leaves the MLP's input norm
 * in ws->h. */
int
g4_layer_head_runs(const g4_model_config *c, const g4_layer *ly, g4_head_run runs[G4_HEAD_RUNS_MAX])
{
	const g4_kv_layer *kv = &ly->kv;
	int			n = 0;

	runs[n++] = (g4_head_run) {0, c->n_heads, ly->q_norm, kv->inv_freq, 0};
	if (kv->k_eq_v)
		runs[n++] = (g4_head_run) {ly->q_dim, kv->n_kv_heads, NULL, NULL, G4_STORE_V};
	else
	{
		runs[n++] = (g4_head_run) {ly->q_dim, kv->n_kv_heads, ly->k_norm, kv->inv_freq, G4_STORE_K};
		if (c->v_norm)
			runs[n++] = (g4_head_run) {ly->q_dim + ly->kv_dim, kv->n_kv_heads, NULL, NULL, G4_STORE_V};
	}
	return n;
}

static int
attention_block(g4_model *m, g4_workspace *ws, const g4_layer *ly, int normed, int T, g4_err *err)
{
	const g4_model_config *c = &m->cfg;
	g4_backend *be = m->be;
	const g4_kv_layer *kv = &ly->kv;
	int			hd = kv->head_dim;
	int			stride = ly->q_dim + ly->kv_dim * (kv->k_eq_v ? 1 : 2);
	float	   *q = ws->qkv;
	float	   *k = ws->qkv + ly->q_dim;
	float	   *v = k + ly->kv_dim;
	float		eps = (float) c->rms_eps;
	g4_head_run runs[G4_HEAD_RUNS_MAX];
	int			n_runs = g4_layer_head_runs(c, ly, runs);

	if (!normed)
		TRY(be->ops->rmsnorm(be, ws->x, ly->attn_norm, T, c->hidden_size, eps, ws->h));
	TRY(be->ops->matmul(be, ly->qkv, ws->h, T, ws->qkv));
	/* on k_eq_v layers V is the raw key normalised without weight; K is
	 * rebuilt from it inside attention, so only V is stored.  Where every
	 * stored row is one of the runs (v normalised, or k_eq_v) the store is
	 * part of head_norm_rope: one operation, not two */
	if (kv->k_eq_v || c->v_norm)
		TRY(be->ops->head_norm_rope(be, ws->qkv, T, stride, hd, runs, n_runs, eps, kv));
	else
	{
		TRY(be->ops->head_norm_rope(be, ws->qkv, T, stride, hd, runs, n_runs, eps, NULL));
		TRY(be->ops->kv_store(be, kv, k, stride, v, stride, T));
	}
	TRY(be->ops->attention(be, kv, q, stride, T, ws->attn));
	TRY(be->ops->matmul(be, ly->o, ws->attn, T, ws->h));
	TRY(be->ops->add_rmsnorm(be, ws->x, ws->h, ly->post_attn_norm, T, c->hidden_size, eps, 1.0f,
							 ly->pre_ffn_norm, ws->h));
	return G4_OK;
}

/* The MLP block on the input norm in ws->h; leaves the next layer's input
 * norm there (none after the last layer). */
static int
mlp_block(g4_model *m, g4_workspace *ws, const g4_layer *ly, const g4_layer *next, int T, g4_err *err)
{
	const g4_model_config *c = &m->cfg;
	g4_backend *be = m->be;
	size_t		H = (size_t) c->hidden_size;
	float		eps = (float) c->rms_eps;
	int			r0,
				slice = g4_mlp_slice_rows(ws, T);

	/* row-local work: processed in slices to bound the gate/up buffer */
	for (r0 = 0; r0 < T; r0 += slice)
	{
		int			rows = G4_MIN(slice, T - r0);
		float	   *hx = ws->h + (size_t) r0 * H;

		TRY(be->ops->matmul_geglu(be, ly->gate_up, hx, rows, c->intermediate_size, ws->gu, ws->act));
		TRY(be->ops->matmul(be, ly->down, ws->act, rows, hx));
	}
	TRY(be->ops->add_rmsnorm(be, ws->x, ws->h, ly->post_ffn_norm, T, c->hidden_size, eps, ly->layer_scalar,
							 next ? next->attn_norm : NULL, next ? ws->h : NULL));
	return G4_OK;
}

/* The logits of the step's logit rows from the final residual stream. */
static int
issue_logits(g4_model *m, g4_workspace *ws, int n_logits, g4_err *err)
{
	const g4_model_config *c = &m->cfg;
	g4_backend *be = m->be;

	TRY(be->ops->gather_logit_rows(be, ws->x, c->hidden_size, ws->lx));
	TRY(be->ops->rmsnorm(be, ws->lx, m->final_norm, n_logits, c->hidden_size, (float) c->rms_eps, ws->lx));
	TRY(be->ops->matmul(be, m->embed, ws->lx, n_logits, ws->logits));
	if (c->final_softcap > 0)
		TRY(be->ops->softcap(be, ws->logits, (size_t) n_logits * (size_t) c->vocab_size, (float) c->final_softcap));
	return G4_OK;
}

/* Every operation of one step, after step_begin. */
static int
issue_step(g4_model *m, g4_workspace *ws, const g4_step_meta *meta, const g4_embed_rows *extra, g4_err *err)
{
	const g4_model_config *c = &m->cfg;
	g4_backend *be = m->be;
	size_t		H = (size_t) c->hidden_size;
	int			T = meta->n_tokens;
	int			i;

	TRY(be->ops->embed(be, m->embed, m->embed_scale, ws->x));
	if (extra)
	{
		/* soft tokens are placed unscaled, after the table lookup */
		for (i = 0; i < extra->n; i++)
			TRY(be->ops->upload(be, ws->x + (size_t) extra->row_index[i] * H,
								extra->rows + (size_t) i * H, H * sizeof(float)));
	}
	for (i = 0; i < c->n_layers; i++)
	{
		const g4_layer *ly = &m->layers[i];
		const g4_layer *next = i + 1 < c->n_layers ? &m->layers[i + 1] : NULL;

		if (attention_block(m, ws, ly, i > 0, T, err) != G4_OK || mlp_block(m, ws, ly, next, T, err) != G4_OK)
			return g4_fail_ctx(err, "layer %d", i);

		/*
		 * A layer done on the CPU backend (its worker threads have joined:
		 * this is the calling thread).  On CUDA a layer is only queued
		 * here, so a report says the host is queueing; the device's own
		 * progress is not reported (a device that hangs stays silent in
		 * the step's final wait).
		 */
		g4_progress_tick(m->progress);
	}
	if (meta->n_logits > 0)
		TRY(issue_logits(m, ws, meta->n_logits, err));
	return G4_OK;
}

int
g4_model_forward(g4_model *m, g4_workspace *ws, const g4_step_meta *meta,
				 const g4_embed_rows *extra, g4_err *err)
{
	g4_backend *be = m->be;
	int			T = meta->n_tokens;
	int			graphs;
	int			rc;

	if (T <= 0 || T > ws->max_tokens || meta->n_logits > ws->max_logits)
		return g4_fail(err, G4_ERR_INTERNAL, "step of %d tokens / %d logit rows exceeds the workspace (%d / %d)",
					   T, meta->n_logits, ws->max_tokens, ws->max_logits);
	TRY(be->ops->step_begin(be, meta));

	/* A backend that records steps replays a step whose operations depend
	 * only on its shape; uploaded soft-token rows make a step unique. */
	graphs = !extra && !ws->no_graphs && be->ops->graph_begin && be->ops->graph_end;
	if (graphs)
	{
		rc = be->ops->graph_begin(be, G4_GRAPH_FORWARD);
		if (rc < 0)
			return g4_fail(err, rc, "%s backend: starting a step graph failed", be->ops->name);
		if (rc == 1)
		{
			TRY(be->ops->graph_end(be, 0));
			return G4_OK;
		}
	}
	rc = issue_step(m, ws, meta, extra, err);
	if (graphs)
	{
		int			rc2 = be->ops->graph_end(be, rc != G4_OK);

		if (rc == G4_OK && rc2 != G4_OK)
			return g4_fail(err, rc2, "%s backend: finishing a step graph failed", be->ops->name);
	}
	return rc;
}

int
g4_model_logits(g4_model *m, g4_workspace *ws, const g4_step_meta *meta, g4_err *err)
{
	g4_backend *be = m->be;

	if (meta->n_logits <= 0 || meta->n_logits > ws->max_logits)
		return g4_fail(err, G4_ERR_INTERNAL, "%d logit rows exceed the workspace (%d)", meta->n_logits,
					   ws->max_logits);
	TRY(be->ops->step_begin(be, meta));
	return issue_logits(m, ws, meta->n_logits, err);
}
