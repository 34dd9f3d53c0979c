/*
 * kv_store.c — CPU reference of writing the step's K and V rows into the
 * paged pool (cuda/kv_store.cu): one (token, KV head) item per task, each
 * encoded by kv_codec.c into its block.
 */
#include "cpu.h"

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
	uint8_t    *blk = g4_cpu_head_block(s->c, L, s->c->slot[t], pos, g);
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

	if (!c->kv_configured || L->head_dim > G4_CPU_MAX_HD)
		return G4_ERR_INTERNAL;
	g4_pool_run(c->pool, (int64_t) n * L->n_kv_heads, store_item, &s);
	return s.bad ? G4_ERR_INTERNAL : G4_OK;
}
