/*
 * attention.c — CPU reference of the KV store and of attention over the
 * paged pool.
 *
 * Attention streams each query's visible keys [lo, hi) block by block with an
 * online softmax (running maximum and sum), so memory stays O(head_dim)
 * whatever the context.  When there are fewer (token, KV head) pairs than
 * threads, the key range is split and the partial results are merged by
 * log-sum-exp (split-KV), so a single long decode still uses every core.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "util.h"

#define SPLIT_MIN_KEYS 512
#define MAX_HD 512
#define MAX_GROUP 32			/* query heads per KV head */

static uint8_t *
head_block(const g4_cpu *c, const g4_kv_layer *L, int slot, int pos, int kv_head)
{
	const g4_kv_pool_desc *kv = &c->kv;
	int			g = L->group;
	int32_t		blk = kv->block_tables[g][(size_t) slot * (size_t) kv->max_blocks_per_seq +
										  (size_t) (pos / G4_KV_BLOCK_TOKENS)];
	size_t		hb = g4_kv_head_block_bytes(kv->dtype, L->head_dim, L->k_eq_v);

	if (blk < 0)
		return NULL;
	return kv->base[g] + (size_t) L->index * kv->layer_stride[g] + (size_t) blk * kv->layer_block_bytes[g] +
		(size_t) kv_head * hb;
}

typedef struct
{
	g4_cpu	   *c;
	const g4_kv_layer *L;
	const float *k;
	int			k_stride;
	const float *v;
	int			v_stride;
	int			bad;
} store_ctx;

static void
store_item(void *arg, int64_t item, int thread)
{
	store_ctx  *s = arg;
	const g4_kv_layer *L = s->L;
	int			t = (int) (item / L->n_kv_heads);
	int			g = (int) (item % L->n_kv_heads);
	int			pos = s->c->pos[t];
	uint8_t    *blk = head_block(s->c, L, s->c->slot[t], pos, g);
	const float *k = s->k ? s->k + (size_t) t * s->k_stride + (size_t) g * L->head_dim : NULL;
	const float *v = s->v + (size_t) t * s->v_stride + (size_t) g * L->head_dim;

	if (!blk)
	{
		s->bad = 1;				/* the scheduler must have allocated this block */
		return;
	}
	g4_kv_encode_head(s->c->kv.dtype, L->k_eq_v, L->head_dim, blk, pos % G4_KV_BLOCK_TOKENS, k, v);
}

int
g4_cpu_kv_store(g4_backend *be, const g4_kv_layer *L, const float *k, int k_stride,
				const float *v, int v_stride, int n)
{
	g4_cpu	   *c = g4_cpu_of(be);
	store_ctx	s = {c, L, k, k_stride, v, v_stride, 0};

	if (!c->kv_configured || L->head_dim > MAX_HD)
		return G4_ERR_INTERNAL;
	g4_pool_run(c->pool, (int64_t) n * L->n_kv_heads, store_item, &s);
	return s.bad ? G4_ERR_INTERNAL : G4_OK;
}

typedef struct
{
	g4_cpu	   *c;
	const g4_kv_layer *L;
	const float *q;
	int			q_stride;
	float	   *out;
	int			n_splits;
	int			split_keys;
	float	   *partial;		/* [n][kv][splits][group][hd + 2] when split */
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
	float		qh[MAX_GROUP][MAX_HD];
	float		key[MAX_HD];
	float		val[MAX_HD];
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
		const uint8_t *blk = head_block(c, L, c->slot[t], j, g);
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

static void
finish_head(const attn_ctx *a, float *acc, float sum, float *dst)
{
	int			hd = a->L->head_dim;
	int			d;
	float		inv = sum > 0.0f ? 1.0f / sum : 0.0f;

	for (d = 0; d < hd; d++)
		dst[d] = acc[d] * inv;
	if (a->c->kv.dtype == G4_KV_TURBOQUANT_K8V4 && !a->L->k_eq_v)
		g4_hadamard(dst, hd);	/* values were stored rotated: undo once */
}

static void
attn_item(void *arg, int64_t item, int thread)
{
	attn_ctx   *a = arg;
	const g4_kv_layer *L = a->L;
	int			hd = L->head_dim;
	int			gq = L->n_heads / L->n_kv_heads;
	int			split = (int) (item % a->n_splits);
	int			g = (int) ((item / a->n_splits) % L->n_kv_heads);
	int			t = (int) (item / a->n_splits / L->n_kv_heads);
	int			lo = a->c->lo[L->group][t];
	int			hi = a->c->hi[L->group][t];
	float		acc[MAX_GROUP * MAX_HD];
	float		mx[MAX_GROUP],
				sum[MAX_GROUP];
	int			h;

	if (a->n_splits == 1)
	{
		if (attend_range(a, t, g, lo, hi, acc, mx, sum) != 0)
		{
			a->bad = 1;
			return;
		}
		for (h = 0; h < gq; h++)
			finish_head(a, acc + (size_t) h * hd, sum[h],
						a->out + (size_t) t * L->n_heads * hd + (size_t) (g * gq + h) * hd);
	}
	else
	{
		int			j0 = lo + split * a->split_keys;
		int			j1 = G4_MIN(hi, j0 + a->split_keys);
		float	   *p = a->partial + (((size_t) t * L->n_kv_heads + (size_t) g) * a->n_splits + (size_t) split) *
			(size_t) gq * (size_t) (hd + 2);

		if (j0 >= j1)
		{
			for (h = 0; h < gq; h++)
			{
				p[(size_t) h * (hd + 2)] = -INFINITY;
				p[(size_t) h * (hd + 2) + 1] = 0.0f;
			}
			return;
		}
		if (attend_range(a, t, g, j0, j1, acc, mx, sum) != 0)
		{
			a->bad = 1;
			return;
		}
		for (h = 0; h < gq; h++)
		{
			float	   *ph = p + (size_t) h * (hd + 2);

			ph[0] = mx[h];
			ph[1] = sum[h];
			memcpy(ph + 2, acc + (size_t) h * hd, (size_t) hd * sizeof(float));
		}
	}
}

/* Merge the splits of one (token, KV head) by log-sum-exp. */
static void
merge_item(void *arg, int64_t item, int thread)
{
	attn_ctx   *a = arg;
	const g4_kv_layer *L = a->L;
	int			hd = L->head_dim;
	int			gq = L->n_heads / L->n_kv_heads;
	int			g = (int) (item % L->n_kv_heads);
	int			t = (int) (item / L->n_kv_heads);
	float		acc[MAX_HD];
	int			h,
				s,
				d;

	for (h = 0; h < gq; h++)
	{
		float		m = -INFINITY;
		float		sum = 0.0f;

		for (s = 0; s < a->n_splits; s++)
		{
			const float *ph = a->partial + ((((size_t) t * L->n_kv_heads + (size_t) g) * a->n_splits + (size_t) s) *
											(size_t) gq + (size_t) h) * (size_t) (hd + 2);

			m = fmaxf(m, ph[0]);
		}
		memset(acc, 0, (size_t) hd * sizeof(float));
		for (s = 0; s < a->n_splits; s++)
		{
			const float *ph = a->partial + ((((size_t) t * L->n_kv_heads + (size_t) g) * a->n_splits + (size_t) s) *
											(size_t) gq + (size_t) h) * (size_t) (hd + 2);
			float		w;

			if (ph[0] == -INFINITY)
				continue;
			w = expf(ph[0] - m);
			sum += ph[1] * w;
			for (d = 0; d < hd; d++)
				acc[d] += ph[2 + d] * w;
		}
		finish_head(a, acc, sum, a->out + (size_t) t * L->n_heads * hd + (size_t) (g * gq + h) * hd);
	}
}

int
g4_cpu_attention(g4_backend *be, const g4_kv_layer *L, const float *q, int q_stride, int n, float *out)
{
	g4_cpu	   *c = g4_cpu_of(be);
	attn_ctx	a;
	int			threads = g4_pool_threads(c->pool);
	int			longest = 0;
	int			t;
	int			gq;

	if (!c->kv_configured || L->head_dim > MAX_HD || L->n_heads % L->n_kv_heads != 0)
		return G4_ERR_INTERNAL;
	gq = L->n_heads / L->n_kv_heads;
	if (gq > MAX_GROUP)
		return G4_ERR_UNSUPPORTED;
	memset(&a, 0, sizeof(a));
	a.c = c;
	a.L = L;
	a.q = q;
	a.q_stride = q_stride;
	a.out = out;
	a.n_splits = 1;
	for (t = 0; t < n; t++)
		longest = G4_MAX(longest, c->hi[L->group][t] - c->lo[L->group][t]);
	/* split long ranges when there is too little parallelism otherwise */
	if (n * L->n_kv_heads < 2 * threads && longest > 2 * SPLIT_MIN_KEYS)
	{
		int			want = G4_DIV_UP(2 * threads, n * L->n_kv_heads);
		size_t		need;

		a.split_keys = G4_MAX(SPLIT_MIN_KEYS, G4_DIV_UP(longest, want));
		a.n_splits = G4_DIV_UP(longest, a.split_keys);
		need = (size_t) n * L->n_kv_heads * a.n_splits * gq * (size_t) (L->head_dim + 2);
		if (need > c->scratch_len)
		{
			float	   *p = realloc(c->scratch, need * sizeof(float));

			if (!p)
				return G4_ERR_NOMEM;
			c->scratch = p;
			c->scratch_len = need;
		}
		a.partial = c->scratch;
	}
	g4_pool_run(c->pool, (int64_t) n * L->n_kv_heads * a.n_splits, attn_item, &a);
	if (!a.bad && a.n_splits > 1)
		g4_pool_run(c->pool, (int64_t) n * L->n_kv_heads, merge_item, &a);
	return a.bad ? G4_ERR_INTERNAL : G4_OK;
}
