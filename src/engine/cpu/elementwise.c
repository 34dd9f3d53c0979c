/*
 * elementwise.c — CPU reference of the element- and row-wise operations of
 * cuda/elementwise.cu: embedding lookup (alone, or followed by given rows),
 * GeGLU, logit row gathering, soft-capping.
 *
 * GELU is the tanh approximation, in float32 as transformers computes it.
 */
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "quant.h"
#include "util.h"

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
		if (ids[i] < G4_SAMPLE_NAN || ids[i] >= table->out)
			return G4_ERR_INTERNAL;
	for (i = 0; i < n; i++)
	{
		float	   *dst = out + (size_t) i * width;

		if (ids[i] == G4_SAMPLE_NAN)
			memset(dst, 0, (size_t) table->in * sizeof(float));
		else
			embed_row(table, ids[i], scale, dst);
		memcpy(dst + table->in, h + (size_t) i * (size_t) h_dim, (size_t) h_dim * sizeof(float));
	}
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

int
g4_cpu_matmul_geglu(g4_backend *be, const g4_weight *w, const float *x, int n, int ff, float *gu, float *out)
{
	int			rc = g4_cpu_matmul(be, w, x, n, gu);

	return rc != G4_OK ? rc : g4_cpu_geglu(be, gu, n, ff, out);
}

/* ---- logit rows, soft-cap ---- */

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
