/*
 * ops_dense.c — CPU reference of the row-wise operations: embedding lookup
 * (alone, or followed by given rows), RMSNorm, per-head norm + RoPE, GeGLU,
 * residual add with post-norm, logit row gathering, the largest element of
 * rows, soft-capping.
 *
 * Numerics follow transformers' float32 path: RMSNorm is
 * x * (mean(x²) + eps)^-0.5 * w (the mean accumulated in double here, which
 * is at least as accurate as torch's vectorised float sum), GELU is the tanh
 * approximation, RoPE uses float32 angles pos * inv_freq.
 */
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "quant.h"
#include "util.h"

#define ROWS_PER_ITEM 4

static float
rms_factor(const float *x, int dim, float eps)
{
	double		ss = 0.0;
	int			i;

	for (i = 0; i < dim; i++)
		ss += (double) x[i] * (double) x[i];
	return powf((float) (ss / dim) + eps, -0.5f);
}

/* ---- embedding ---- */

typedef struct
{
	g4_cpu	   *c;
	const g4_weight *table;
	float		scale;
	float	   *out;
} embed_ctx;

/* dst[w->in] = row tok of the table, decoded, times scale */
static void
embed_row(const g4_weight *w, int32_t tok, float scale, float *dst)
{
	const g4_host_weight *p = &w->parts[0];
	int64_t		i;

	g4_dequant_row(p->fmt, (const uint8_t *) p->data + (size_t) tok * g4_wfmt_row_bytes(p->fmt, p->in),
				   p->scales ? p->scales + (size_t) tok * (size_t) (p->in / 32) : NULL, p->in, dst);
	for (i = 0; i < w->in; i++)
		dst[i] *= scale;
}

static void
embed_item(void *arg, int64_t t, int thread)
{
	embed_ctx  *e = arg;
	int32_t		tok = e->c->token[t];

	if (tok < 0 || tok >= e->table->out)
		return;					/* supplied by the caller / validated earlier */
	embed_row(e->table, tok, e->scale, e->out + (size_t) t * (size_t) e->table->in);
}

int
g4_cpu_embed(g4_backend *be, const g4_weight *table, float scale, float *out)
{
	g4_cpu	   *c = g4_cpu_of(be);
	embed_ctx	e = {c, table, scale, out};

	if (table->n_parts != 1)
		return G4_ERR_INTERNAL;
	g4_pool_run(c->pool, c->n_tokens, embed_item, &e);
	return G4_OK;
}

int
g4_cpu_embed_concat(g4_backend *be, const g4_weight *table, float scale, const int32_t *ids, const float *h,
					int h_dim, int n, float *out)
{
	size_t		width = (size_t) table->in + (size_t) h_dim;
	int			i;

	if (table->n_parts != 1)
		return G4_ERR_INTERNAL;
	for (i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= table->out)
			return G4_ERR_INTERNAL;
	for (i = 0; i < n; i++)
	{
		float	   *dst = out + (size_t) i * width;

		embed_row(table, ids[i], scale, dst);
		memcpy(dst + table->in, h + (size_t) i * (size_t) h_dim, (size_t) h_dim * sizeof(float));
	}
	return G4_OK;
}

/* ---- RMSNorm over rows ---- */

typedef struct
{
	const float *x;
	const float *w;
	int			rows;
	int			dim;
	float		eps;
	float	   *y;
} norm_ctx;

static void
norm_item(void *arg, int64_t item, int thread)
{
	norm_ctx   *n = arg;
	int			r0 = (int) item * ROWS_PER_ITEM;
	int			r1 = G4_MIN(n->rows, r0 + ROWS_PER_ITEM);
	int			r,
				i;

	for (r = r0; r < r1; r++)
	{
		const float *x = n->x + (size_t) r * n->dim;
		float	   *y = n->y + (size_t) r * n->dim;
		float		f = rms_factor(x, n->dim, n->eps);

		for (i = 0; i < n->dim; i++)
			y[i] = n->w ? (x[i] * f) * n->w[i] : x[i] * f;
	}
}

int
g4_cpu_rmsnorm(g4_backend *be, const float *x, const float *w, int rows, int dim, float eps, float *y)
{
	norm_ctx	n = {x, w, rows, dim, eps, y};

	g4_pool_run(g4_cpu_of(be)->pool, G4_DIV_UP(rows, ROWS_PER_ITEM), norm_item, &n);
	return G4_OK;
}

/* ---- per-head RMSNorm + RoPE ---- */

typedef struct
{
	g4_cpu	   *c;
	float	   *x;
	int			stride;
	int			heads;
	int			hd;
	const float *w;
	float		eps;
	const float *inv_freq;
} head_ctx;

static void
head_item(void *arg, int64_t item, int thread)
{
	head_ctx   *h = arg;
	int			t = (int) (item / h->heads);
	int			k = (int) (item % h->heads);
	float	   *x = h->x + (size_t) t * h->stride + (size_t) k * h->hd;
	float		f = rms_factor(x, h->hd, h->eps);
	int			i;

	for (i = 0; i < h->hd; i++)
		x[i] = h->w ? (x[i] * f) * h->w[i] : x[i] * f;
	if (h->inv_freq)
		g4_rope_apply(x, h->hd, h->c->pos[t], h->inv_freq);
}

int
g4_cpu_head_norm_rope(g4_backend *be, float *x, int n, int stride, int heads, int hd,
					  const float *w, float eps, const float *inv_freq)
{
	g4_cpu	   *c = g4_cpu_of(be);
	head_ctx	h = {c, x, stride, heads, hd, w, eps, inv_freq};

	g4_pool_run(c->pool, (int64_t) n * heads, head_item, &h);
	return G4_OK;
}

/* ---- GeGLU ---- */

typedef struct
{
	const float *gu;
	int			n;
	int			ff;
	float	   *out;
} geglu_ctx;

static float
gelu_tanh(float x)
{
	const float beta = 0.7978845608028654f;	/* sqrt(2/pi) */
	const float kappa = 0.044715f;
	float		inner = beta * (x + kappa * x * x * x);

	return 0.5f * x * (1.0f + tanhf(inner));
}

static void
geglu_item(void *arg, int64_t t, int thread)
{
	geglu_ctx  *g = arg;
	const float *gate = g->gu + (size_t) t * 2 * g->ff;
	const float *up = gate + g->ff;
	float	   *o = g->out + (size_t) t * g->ff;
	int			i;

	for (i = 0; i < g->ff; i++)
		o[i] = gelu_tanh(gate[i]) * up[i];
}

int
g4_cpu_geglu(g4_backend *be, const float *gu, int n, int ff, float *out)
{
	geglu_ctx	g = {gu, n, ff, out};

	g4_pool_run(g4_cpu_of(be)->pool, n, geglu_item, &g);
	return G4_OK;
}

/* ---- residual add with post-norm ---- */

typedef struct
{
	float	   *x;
	const float *h;
	const float *w;
	int			dim;
	float		eps;
	float		scale;
	const float *next_w;
	float	   *y;
} addnorm_ctx;

static void
addnorm_item(void *arg, int64_t t, int thread)
{
	addnorm_ctx *a = arg;
	float	   *x = a->x + (size_t) t * a->dim;
	const float *h = a->h + (size_t) t * a->dim;
	float		f = rms_factor(h, a->dim, a->eps);
	int			i;

	for (i = 0; i < a->dim; i++)
	{
		float		v = x[i] + (h[i] * f) * a->w[i];

		x[i] = a->scale == 1.0f ? v : v * a->scale;
	}
	if (a->y)
	{
		float	   *y = a->y + (size_t) t * a->dim;

		f = rms_factor(x, a->dim, a->eps);
		for (i = 0; i < a->dim; i++)
			y[i] = (x[i] * f) * a->next_w[i];
	}
}

int
g4_cpu_add_rmsnorm(g4_backend *be, float *x, const float *h, const float *w, int n, int dim,
				   float eps, float scale, const float *next_w, float *y)
{
	addnorm_ctx a = {x, h, w, dim, eps, scale, next_w, y};

	g4_pool_run(g4_cpu_of(be)->pool, n, addnorm_item, &a);
	return G4_OK;
}

/* ---- logit rows, their largest element, soft-cap ---- */

int
g4_cpu_argmax(g4_backend *be, const float *logits, int n, int vocab, int32_t *ids)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		const float *row = logits + (size_t) i * (size_t) vocab;
		int			j,
					best = 0;

		for (j = 1; j < vocab; j++)
			if (row[j] > row[best])
				best = j;
		ids[i] = best;
	}
	return G4_OK;
}

int
g4_cpu_gather_logit_rows(g4_backend *be, const float *x, int dim, float *out)
{
	g4_cpu	   *c = g4_cpu_of(be);
	int			i;

	for (i = 0; i < c->n_logits; i++)
		memmove(out + (size_t) i * dim, x + (size_t) c->logit_rows[i] * dim, (size_t) dim * sizeof(float));
	return G4_OK;
}

typedef struct
{
	float	   *x;
	size_t		count;
	float		cap;
} softcap_ctx;

#define SOFTCAP_CHUNK 16384

static void
softcap_item(void *arg, int64_t item, int thread)
{
	softcap_ctx *s = arg;
	size_t		i0 = (size_t) item * SOFTCAP_CHUNK;
	size_t		i1 = G4_MIN(s->count, i0 + SOFTCAP_CHUNK);
	size_t		i;

	for (i = i0; i < i1; i++)
		s->x[i] = tanhf(s->x[i] / s->cap) * s->cap;
}

int
g4_cpu_softcap(g4_backend *be, float *x, size_t count, float cap)
{
	softcap_ctx s = {x, count, cap};

	g4_pool_run(g4_cpu_of(be)->pool, (int64_t) G4_DIV_UP(count, SOFTCAP_CHUNK), softcap_item, &s);
	return G4_OK;
}
