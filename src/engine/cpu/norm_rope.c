/*
 * norm_rope.c — CPU reference of the normalisations and RoPE
 * (cuda/norm_rope.cu): RMSNorm over rows, per-head RMSNorm + RoPE, the
 * residual add with post-norm (and the next block's input norm), and RoPE of
 * one vector.
 *
 * Numerics follow transformers' float32 path: RMSNorm is
 * x * (mean(x²) + eps)^-0.5 * w (the mean accumulated in double here, which
 * is at least as accurate as torch's vectorised float sum), RoPE uses
 * float32 angles pos * inv_freq.
 */
#include <math.h>

#include "cpu.h"
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
	int			hd;
	const g4_head_run *runs;
	int			n_runs;
	int			heads;			/* of all runs */
	float		eps;
} head_ctx;

static void
head_item(void *arg, int64_t item, int thread)
{
	head_ctx   *h = arg;
	int			t = (int) (item / h->heads);
	int			k = (int) (item % h->heads);
	const g4_head_run *r = h->runs;
	float	   *x;
	float		f;
	int			i;

	while (k >= r->heads)
		k -= (r++)->heads;
	x = h->x + (size_t) t * h->stride + (size_t) r->col + (size_t) k * h->hd;
	f = rms_factor(x, h->hd, h->eps);
	for (i = 0; i < h->hd; i++)
		x[i] = r->w ? (x[i] * f) * r->w[i] : x[i] * f;
	if (r->inv_freq)
		g4_rope_apply(x, h->hd, h->c->pos[t], r->inv_freq);
}

int
g4_cpu_head_norm_rope(g4_backend *be, float *x, int n, int stride, int hd, const g4_head_run *runs, int n_runs,
					  float eps, const g4_kv_layer *L)
{
	g4_cpu	   *c = g4_cpu_of(be);
	head_ctx	h = {c, x, stride, hd, runs, n_runs, 0, eps};
	const float *rows[3] = {NULL, NULL, NULL};	/* by G4_STORE_K, G4_STORE_V */
	int			i;

	if (n_runs < 1 || n_runs > G4_HEAD_RUNS_MAX)
		return G4_ERR_INTERNAL;
	for (i = 0; i < n_runs; i++)
	{
		h.heads += runs[i].heads;
		if (runs[i].store == G4_STORE_K || runs[i].store == G4_STORE_V)
			rows[runs[i].store] = x + runs[i].col;
	}
	if (L && (!rows[G4_STORE_V] || (!L->k_eq_v && !rows[G4_STORE_K])))
		return G4_ERR_INTERNAL;
	g4_pool_run(c->pool, (int64_t) n * h.heads, head_item, &h);
	if (!L)
		return G4_OK;
	return g4_cpu_kv_store(be, L, L->k_eq_v ? NULL : rows[G4_STORE_K], stride, rows[G4_STORE_V], stride, n);
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

void
g4_rope_apply(float *x, int hd, int pos, const float *inv_freq)
{
	int			half = hd / 2;
	int			j;

	for (j = 0; j < half; j++)
	{
		float		angle;
		float		c,
					s;
		float		a,
					b;

		if (inv_freq[j] == 0.0f)
			continue;			/* cos 0 = 1, sin 0 = 0: the pair passes through */
		angle = (float) pos * inv_freq[j];
		c = cosf(angle);
		s = sinf(angle);
		a = x[j];
		b = x[j + half];
		x[j] = a * c - b * s;
		x[j + half] = b * c + a * s;
	}
}
