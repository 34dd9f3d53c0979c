/*
 * kv_store.cu — writing the step's K and V rows into the paged pool, in
 * every pool dtype, byte for byte as kv_codec.c encodes them.
 *
 * One warp per (token, KV head) item, several items per block, and no
 * block-wide barrier: a step writes only a few hundred bytes per item, so
 * the kernel is bound by latency, and a whole block per item would spend
 * more on its barriers between the Hadamard stages and in the amax
 * reductions (~30 per item at head_dim 256) than on the writes.
 *
 * turboquant_k8v4: lane l holds elements [l·P, l·P + P) of the head
 * (kv_store.cuh, whose encoders these are).  f32 and bf16 are copies, four
 * elements per access where the rows are aligned.
 */
#include <math.h>

#include "kv_store.cuh"

#define STORE_WARPS 4			/* items per block */
#define STORE_THREADS (32 * STORE_WARPS)
#define STORE_MAX_HD 512

struct store_args
{
	kv_dest		d;
	int			n_kv_heads;
	int			items;			/* tokens * n_kv_heads */
	int			vec;			/* k, v rows 16-byte aligned and hd % 4 == 0 */
	const float *k;
	int			k_stride;
	const float *v;
	int			v_stride;
};

/* One (token, KV head): its rows and where they go. */
struct store_item
{
	const float *k;				/* NULL for k_eq_v layers */
	const float *v;
	uint8_t    *hb;				/* the head's bytes in the token's block */
	int			off;			/* the token's row in the block */
};

/*
 * The item of this warp, after the dependent-launch wait (positions, block
 * tables and rows are earlier kernels' outputs).  False when the warp has
 * none or the token's block is missing (then the status says so): the
 * whole warp returns together, so every shuffle after it has all 32 lanes.
 */
__device__ __forceinline__ bool
store_item_of(const store_args &a, store_item *it)
{
	int			item = blockIdx.x * STORE_WARPS + (threadIdx.x >> 5);
	int			t,
				g;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	if (item >= a.items)
		return false;
	t = item / a.n_kv_heads;
	g = item % a.n_kv_heads;
	it->hb = kv_head_bytes(a.d, t, g, &it->off);
	if (!it->hb)
		return false;
	it->k = a.k ? a.k + (size_t) t * (size_t) a.k_stride + (size_t) g * (size_t) a.d.hd : NULL;
	it->v = a.v + (size_t) t * (size_t) a.v_stride + (size_t) g * (size_t) a.d.hd;
	return true;
}

/* ---- f32 / bf16 ---- */

/* Both rows are loaded before either is stored: the stores could alias the
 * loads as far as the compiler knows, so this order is what lets the two
 * loads be in flight together. */
__global__ void __launch_bounds__(STORE_THREADS)
kv_store_copy_kernel(store_args a)
{
	store_item	it;
	int			lane = threadIdx.x & 31;
	int			bf16 = a.d.dtype == G4_KV_BF16;
	const float *key,
			   *val;
	size_t		krow,
				vrow;

	if (!store_item_of(a, &it))
		return;
	/* a k_eq_v layer stores its value in the key's rows, and nothing else */
	key = a.d.k_eq_v ? it.v : it.k;
	val = a.d.k_eq_v ? NULL : it.v;
	krow = (size_t) it.off * (size_t) a.d.hd;
	vrow = (size_t) (G4_KV_BLOCK_TOKENS + it.off) * (size_t) a.d.hd;
	if (a.vec)
	{
		for (int i = 4 * lane; i < a.d.hd; i += 4 * 32)
		{
			float4		fk = *(const float4 *) (key + i);
			float4		fv = val ? *(const float4 *) (val + i) : fk;

			put4(it.hb, krow + i, fk, bf16);
			if (val)
				put4(it.hb, vrow + i, fv, bf16);
		}
		return;
	}
	for (int i = lane; i < a.d.hd; i += 32)
	{
		float		fk = key[i];
		float		fv = val ? val[i] : fk;

		put1(it.hb, krow + i, fk, bf16);
		if (val)
			put1(it.hb, vrow + i, fv, bf16);
	}
}

/* ---- turboquant_k8v4 ---- */

template <int P>
__global__ void __launch_bounds__(STORE_THREADS)
kv_store_tq_kernel(store_args a)
{
	store_item	it;
	float		kx[P],
				vx[P];

	if (!store_item_of(a, &it))
		return;
	if (a.d.k_eq_v)
	{
		/* not rotated: attention applies RoPE to the plain vector */
		lane_load<P>(vx, it.v, a.d.hd, a.vec);
		store_k8<P>(vx, it.hb, it.off, a.d.hd);
		return;
	}
	/* both rows loaded, then both transformed: their loads and shuffle
	 * chains are independent and overlap */
	lane_load<P>(kx, it.k, a.d.hd, a.vec);
	lane_load<P>(vx, it.v, a.d.hd, a.vec);
	hadamard_warp<P>(kx, a.d.hd);
	hadamard_warp<P>(vx, a.d.hd);
	store_k8<P>(kx, it.hb, it.off, a.d.hd);
	store_v4<P>(vx, it.hb, it.off, a.d.hd);
}

int
g4c_kv_dest(g4_cuda *c, const g4_kv_layer *L, kv_dest *d)
{
	const g4_kv_pool_desc *kv = &c->kv;
	int			hd = L->head_dim;

	if (!c->kv_configured || hd > STORE_MAX_HD || hd < 2)
		return G4_ERR_INTERNAL;
	if (kv->dtype == G4_KV_TURBOQUANT_K8V4 && (hd & (hd - 1)) != 0)
		return G4_ERR_UNSUPPORTED;
	d->dtype = kv->dtype;
	d->k_eq_v = L->k_eq_v;
	d->hd = hd;
	d->layer_base = kv->base[L->group] + (size_t) L->index * kv->layer_stride[L->group];
	d->layer_block_bytes = kv->layer_block_bytes[L->group];
	d->head_block_bytes = g4_kv_head_block_bytes(kv->dtype, hd, L->k_eq_v);
	d->table = kv->block_tables[L->group];
	d->max_blocks = kv->max_blocks_per_seq;
	d->pos = c->d_pos;
	d->slot = c->d_slot;
	d->status = c->d_status;
	/* the wide stores rely on it: every head block is a multiple of 16 bytes */
	if ((uintptr_t) d->layer_base % 16 != 0)
		return G4_ERR_INTERNAL;
	return G4_OK;
}

int
g4c_kv_store(g4_backend *be, const g4_kv_layer *L, const float *k, int k_stride, const float *v, int v_stride, int n)
{
	g4_cuda    *c = g4c_of(be);
	void		(*kernel) (store_args);
	store_args	a;
	int			hd = L->head_dim;
	int			rc = g4c_kv_dest(c, L, &a.d);

	if (rc != G4_OK)
		return rc;
	if (n <= 0)
		return G4_OK;
	a.n_kv_heads = L->n_kv_heads;
	a.items = n * L->n_kv_heads;
	a.k = L->k_eq_v ? NULL : k;
	a.k_stride = k_stride;
	a.v = v;
	a.v_stride = v_stride;
	a.vec = (((uintptr_t) a.k | (uintptr_t) v) % 16 == 0 && (L->k_eq_v || k_stride % 4 == 0) && v_stride % 4 == 0
			 && hd % 4 == 0);
	if (a.d.dtype != G4_KV_TURBOQUANT_K8V4)
		kernel = kv_store_copy_kernel;
	else
		kernel = lane_kernel_of(hd < 32 ? 1 : hd / 32, kv_store_tq_kernel<1>, kv_store_tq_kernel<2>,
								kv_store_tq_kernel<4>, kv_store_tq_kernel<8>, kv_store_tq_kernel<16>);
	return g4c_launch(c, "kv_store", kernel, dim3((a.items + STORE_WARPS - 1) / STORE_WARPS), dim3(STORE_THREADS), 0,
					  a);
}
