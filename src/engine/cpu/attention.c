/*
 * attention.c — CPU reference of attention over the paged pool
 * (cuda/attention*.cu).
 *
 * Attention streams each query's visible keys [lo, hi) with an online
 * softmax (running maximum and sum), so memory stays O(head_dim) whatever
 * the context.  The range is always cut into splits of SPLIT_KEYS keys,
 * each attended from scratch, and the splits' results are merged in order
 * by log-sum-exp.  The arithmetic is therefore fixed by the query's range
 * alone: whether the splits of one query run on one thread (many queries)
 * or on all of them (a lone long decode), and whatever else shares the
 * batch, the result is the same to the bit.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "util.h"

#define SPLIT_KEYS 512
#define MAX_GROUP 32			/* query heads per KV head */

typedef struct
{
	g4_cpu	   *c;
	const g4_kv_layer *L;
	const float *q;
	int			q_stride;
	float	   *out;
	int			max_splits;
	float	   *partial;		/* parallel splits: [n][kv][max_splits][group][hd + 2] */
	int			bad;
} attn_ctx;

/* Attend one token's query heads of one KV head to keys [j0, j1).  Writes
 * the unnormalised accumulator, the running max and sum per head. */
static int
attend_range(const attn_ctx *a, int t, int g, int j0, int j1, float *acc, float *mx, float *sum)
{
	const g4_cpu *c = a->c;
	const g4_kv_layer *L = a->L;
	int			hd = L->head_dim;
	int			gq = L->n_heads / L->n_kv_heads;
	int			dtype = c->kv.dtype;
	int			rotated = dtype == G4_KV_TURBOQUANT_K8V4 && !L->k_eq_v;
	float		qh[MAX_GROUP][G4_CPU_MAX_HD];
	float		key[G4_CPU_MAX_HD];
	float		val[G4_CPU_MAX_HD];
	int			h,
				j,
				d;

	for (h = 0; h < gq; h++)
	{
		memcpy(qh[h], a->q + (size_t) t * a->q_stride + (size_t) (g * gq + h) * hd, (size_t) hd * sizeof(float));
		if (rotated)
			g4_hadamard(qh[h], hd); /* (Hq)·(Hk) = q·k */
		mx[h] = -INFINITY;
		sum[h] = 0.0f;
		memset(acc + (size_t) h * hd, 0, (size_t) hd * sizeof(float));
	}
	for (j = j0; j < j1; j++)
	{
		const uint8_t *blk = g4_cpu_head_block(c, L, c->slot[t], j, g);
		int			off = j % G4_KV_BLOCK_TOKENS;

		if (!blk)
			return -1;
		g4_kv_decode_k(dtype, L->k_eq_v, hd, blk, off, key);
		g4_kv_decode_v(dtype, L->k_eq_v, hd, blk, off, val);
		if (L->k_eq_v)
		{
			/* k = RoPE(v * k_norm.weight) at the key's position */
			for (d = 0; d < hd; d++)
				key[d] = val[d] * L->k_norm_w[d];
			g4_rope_apply(key, hd, j, L->inv_freq);
		}
		for (h = 0; h < gq; h++)
		{
			float		s = 0.0f;
			float	   *ah = acc + (size_t) h * hd;

			for (d = 0; d < hd; d++)
				s += qh[h][d] * key[d];
			s *= L->scale;
			if (s > mx[h])
			{
				float		corr = expf(mx[h] - s);	/* exp(-inf) = 0 on the first key */

				for (d = 0; d < hd; d++)
					ah[d] *= corr;
				sum[h] *= corr;
				mx[h] = s;
			}
			{
				float		p = expf(s - mx[h]);

				sum[h] += p;
				for (d = 0; d < hd; d++)
					ah[d] += p * val[d];
			}
		}
	}
	return 0;
}

/* Fold a split's (m, l, a) into the running (M, S, A), in split order. */
static void
merge_split(int hd, int first, float m, float l, const float *a, float *M, float *S, float *A)
{
	int			d;

	if (first)
	{
		*M = m;
		*S = l;
		memcpy(A, a, (size_t) hd * sizeof(float));
		return;
	}
	{
		float		nm = fmaxf(*M, m);
		float		cM = expf(*M - nm);
		float		cm = expf(m - nm);

		*S = *S * cM + l * cm;
		for (d = 0; d < hd; d++)
			A[d] = A[d] * cM + a[d] * cm;
		*M = nm;
	}
}

static void
finish_head(const attn_ctx *a, const float *acc, float sum, float *dst)
{
	int			hd = a->L->head_dim;
	int			d;
	float		inv = sum > 0.0f ? 1.0f / sum : 0.0f;

	for (d = 0; d < hd; d++)
		dst[d] = acc[d] * inv;
	if (a->c->kv.dtype == G4_KV_TURBOQUANT_K8V4 && !a->L->k_eq_v)
		g4_hadamard(dst, hd);	/* values were stored rotated: undo once */
}

static int
n_splits_of(const attn_ctx *a, int t)
{
	int			len = a->c->hi[a->L->group][t] - a->c->lo[a->L->group][t];

	return len > 0 ? G4_DIV_UP(len, SPLIT_KEYS) : 1;
}

static float *
partial_at(const attn_ctx *a, int t, int g, int split, int h)
{
	const g4_kv_layer *L = a->L;
	size_t		gq = (size_t) (L->n_heads / L->n_kv_heads);

	return a->partial + ((((size_t) t * L->n_kv_heads + (size_t) g) * (size_t) a->max_splits + (size_t) split) *
						 gq + (size_t) h) * (size_t) (L->head_dim + 2);
}

/* Every split of one (token, KV head), merged as it goes. */
static void
attn_item(void *arg, int64_t item, int thread)
{
	attn_ctx   *a = arg;
	const g4_kv_layer *L = a->L;
	int			hd = L->head_dim;
	int			gq = L->n_heads / L->n_kv_heads;
	int			g = (int) (item % L->n_kv_heads);
	int			t = (int) (item / L->n_kv_heads);
	int			lo = a->c->lo[L->group][t];
	int			hi = a->c->hi[L->group][t];
	int			ns = n_splits_of(a, t);
	float		acc[MAX_GROUP * G4_CPU_MAX_HD];
	float		run[MAX_GROUP * G4_CPU_MAX_HD];
	float		mx[MAX_GROUP],
				sum[MAX_GROUP],
				M[MAX_GROUP],
				S[MAX_GROUP];
	int			s,
				h;

	for (s = 0; s < ns; s++)
	{
		int			j0 = lo + s * SPLIT_KEYS;

		if (attend_range(a, t, g, j0, G4_MIN(hi, j0 + SPLIT_KEYS), acc, mx, sum) != 0)
		{
			a->bad = 1;
			return;
		}
		for (h = 0; h < gq; h++)
			merge_split(hd, s == 0, mx[h], sum[h], acc + (size_t) h * hd, &M[h], &S[h], run + (size_t) h * hd);
	}
	for (h = 0; h < gq; h++)
		finish_head(a, run + (size_t) h * hd, S[h],
					a->out + (size_t) t * L->n_heads * hd + (size_t) (g * gq + h) * hd);
}

/* One split of one (token, KV head), to the partial buffer. */
static void
split_item(void *arg, int64_t item, int thread)
{
	attn_ctx   *a = arg;
	const g4_kv_layer *L = a->L;
	int			hd = L->head_dim;
	int			gq = L->n_heads / L->n_kv_heads;
	int			s = (int) (item % a->max_splits);
	int			g = (int) ((item / a->max_splits) % L->n_kv_heads);
	int			t = (int) (item / a->max_splits / L->n_kv_heads);
	int			j0 = a->c->lo[L->group][t] + s * SPLIT_KEYS;
	float		acc[MAX_GROUP * G4_CPU_MAX_HD];
	float		mx[MAX_GROUP],
				sum[MAX_GROUP];
	int			h;

	if (s >= n_splits_of(a, t))
		return;
	if (attend_range(a, t, g, j0, G4_MIN(a->c->hi[L->group][t], j0 + SPLIT_KEYS), acc, mx, sum) != 0)
	{
		a->bad = 1;
		return;
	}
	for (h = 0; h < gq; h++)
	{
		float	   *ph = partial_at(a, t, g, s, h);

		ph[0] = mx[h];
		ph[1] = sum[h];
		memcpy(ph + 2, acc + (size_t) h * hd, (size_t) hd * sizeof(float));
	}
}

/* Merge the partials of one (token, KV head), in split order. */
static void
merge_item(void *arg, int64_t item, int thread)
{
	attn_ctx   *a = arg;
	const g4_kv_layer *L = a->L;
	int			hd = L->head_dim;
	int			gq = L->n_heads / L->n_kv_heads;
	int			g = (int) (item % L->n_kv_heads);
	int			t = (int) (item / L->n_kv_heads);
	int			ns = n_splits_of(a, t);
	float		run[G4_CPU_MAX_HD];
	int			h,
				s;

	for (h = 0; h < gq; h++)
	{
		float		M = 0.0f,
					S = 0.0f;

		for (s = 0; s < ns; s++)
		{
			const float *ph = partial_at(a, t, g, s, h);

			merge_split(hd, s == 0, ph[0], ph[1], ph + 2, &M, &S, run);
		}
		finish_head(a, run, S, a->out + (size_t) t * L->n_heads * hd + (size_t) (g * gq + h) * hd);
	}
}

int
g4_cpu_attention(g4_backend *be, const g4_kv_layer *L, const float *q, int q_stride, int n, float *out)
{
	g4_cpu	   *c = g4_cpu_of(be);
	attn_ctx	a;
	int			threads = g4_pool_threads(c->pool);
	int			t;

	if (!c->kv_configured || L->head_dim > G4_CPU_MAX_HD || L->n_heads % L->n_kv_heads != 0)
		return G4_ERR_INTERNAL;
	if (L->n_heads / L->n_kv_heads > MAX_GROUP)
		return G4_ERR_UNSUPPORTED;
	memset(&a, 0, sizeof(a));
	a.c = c;
	a.L = L;
	a.q = q;
	a.q_stride = q_stride;
	a.out = out;
	a.max_splits = 1;
	for (t = 0; t < n; t++)
		a.max_splits = G4_MAX(a.max_splits, n_splits_of(&a, t));
	/* few queries with long ranges: spread their splits over the threads
	 * (same arithmetic as one thread merging them in order) */
	if (n * L->n_kv_heads < 2 * threads && a.max_splits > 1)
	{
		size_t		need = (size_t) n * L->n_kv_heads * a.max_splits * (size_t) (L->n_heads / L->n_kv_heads) *
			(size_t) (L->head_dim + 2);

		if (need > c->scratch_len)
		{
			float	   *p = realloc(c->scratch, need * sizeof(float));

			if (!p)
				return G4_ERR_NOMEM;
			c->scratch = p;
			c->scratch_len = need;
		}
		a.partial = c->scratch;
		g4_pool_run(c->pool, (int64_t) n * L->n_kv_heads * a.max_splits, split_item, &a);
		if (!a.bad)
			g4_pool_run(c->pool, (int64_t) n * L->n_kv_heads, merge_item, &a);
	}
	else
		g4_pool_run(c->pool, (int64_t) n * L->n_kv_heads, attn_item, &a);
	return a.bad ? G4_ERR_INTERNAL : G4_OK;
}
