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
 * turboquant_k8v4: lane l holds elements [l·P, l·P + P) of the head in
 * registers (P = head_dim / 32; head widths below 32 give one element to
 * each of the first head_dim lanes, the others hold 0 and write nothing).
 * The Hadamard transform is hadamard_warp (cuda_common.cuh).  The amaxes
 * are warp shuffles (the key over the whole warp, each value group over its
 * G / P lanes), scales and codes are kvformat.h's, and a lane's codes are
 * contiguous in the pool, so it stores them at once (8 bytes of key, 4 of
 * value nibbles at head_dim 256).  f32 and bf16 are copies, four elements per access where
 * the rows are aligned.
 */
#include <math.h>

#include "cuda_common.cuh"

#define STORE_WARPS 4			/* items per block */
#define STORE_THREADS (32 * STORE_WARPS)
#define STORE_MAX_HD 512
#define FULL_MASK 0xffffffffu

struct store_args
{
	int			dtype;
	int			k_eq_v;
	int			hd;
	int			n_kv_heads;
	int			items;			/* tokens * n_kv_heads */
	int			vec;			/* k, v rows 16-byte aligned and hd % 4 == 0 */
	uint8_t    *layer_base;		/* base + layer * layer_stride, 16-byte aligned */
	size_t		layer_block_bytes;
	size_t		head_block_bytes;
	const int32_t *table;		/* [max_seqs][max_blocks] */
	int			max_blocks;
	const float *k;
	int			k_stride;
	const float *v;
	int			v_stride;
	const int32_t *pos;
	const int32_t *slot;
	unsigned   *status;
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
				g,
				p;
	int32_t		blk;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	if (item >= a.items)
		return false;
	t = item / a.n_kv_heads;
	g = item % a.n_kv_heads;
	p = a.pos[t];
	blk = a.table[(size_t) a.slot[t] * (size_t) a.max_blocks + (size_t) (p / G4_KV_BLOCK_TOKENS)];
	if (blk < 0)
	{
		if ((threadIdx.x & 31) == 0)
			atomicOr(a.status, G4C_STATUS_KV_MISSING);
		return false;
	}
	it->k = a.k ? a.k + (size_t) t * (size_t) a.k_stride + (size_t) g * (size_t) a.hd : NULL;
	it->v = a.v + (size_t) t * (size_t) a.v_stride + (size_t) g * (size_t) a.hd;
	it->hb = a.layer_base + (size_t) blk * a.layer_block_bytes + (size_t) g * a.head_block_bytes;
	it->off = p % G4_KV_BLOCK_TOKENS;
	return true;
}

/* ---- f32 / bf16 ---- */

/* Element `at` (K rows 0..15, V rows 16..31, hd each) of the head's f32 or
 * bf16 rows = x; put4: four elements from `at` (a multiple of 4). */
__device__ __forceinline__ void
put1(uint8_t *hb, size_t at, float x, int bf16)
{
	if (bf16)
		((uint16_t *) hb)[at] = g4_f32_to_bf16(x);
	else
		((float *) hb)[at] = x;
}

__device__ __forceinline__ void
put4(uint8_t *hb, size_t at, float4 f, int bf16)
{
	if (bf16)
		*(uint2 *) ((uint16_t *) hb + at) =
			make_uint2(g4_f32_to_bf16(f.x) | (uint32_t) g4_f32_to_bf16(f.y) << 16,
					   g4_f32_to_bf16(f.z) | (uint32_t) g4_f32_to_bf16(f.w) << 16);
	else
		*(float4 *) ((float *) hb + at) = f;
}

/* Both rows are loaded before either is stored: the stores could alias the
 * loads as far as the compiler knows, so this order is what lets the two
 * loads be in flight together. */
__global__ void __launch_bounds__(STORE_THREADS)
kv_store_copy_kernel(store_args a)
{
	store_item	it;
	int			lane = threadIdx.x & 31;
	int			bf16 = a.dtype == G4_KV_BF16;
	const float *key,
			   *val;
	size_t		krow,
				vrow;

	if (!store_item_of(a, &it))
		return;
	/* a k_eq_v layer stores its value in the key's rows, and nothing else */
	key = a.k_eq_v ? it.v : it.k;
	val = a.k_eq_v ? NULL : it.v;
	krow = (size_t) it.off * (size_t) a.hd;
	vrow = (size_t) (G4_KV_BLOCK_TOKENS + it.off) * (size_t) a.hd;
	if (a.vec)
	{
		for (int i = 4 * lane; i < a.hd; i += 4 * 32)
		{
			float4		fk = *(const float4 *) (key + i);
			float4		fv = val ? *(const float4 *) (val + i) : fk;

			put4(it.hb, krow + i, fk, bf16);
			if (val)
				put4(it.hb, vrow + i, fv, bf16);
		}
		return;
	}
	for (int i = lane; i < a.hd; i += 32)
	{
		float		fk = key[i];
		float		fv = val ? val[i] : fk;

		put1(it.hb, krow + i, fk, bf16);
		if (val)
			put1(it.hb, vrow + i, fv, bf16);
	}
}

/* ---- turboquant_k8v4, P elements per lane ---- */

/* max |x| over this lane's elements and those of the `lanes` lanes (a power
 * of two) of its aligned lane group; NaN when one of them is NaN. */
template <int P>
__device__ __forceinline__ float
group_amax(const float x[P], int lanes)
{
	float		m = 0.0f;

#pragma unroll
	for (int i = 0; i < P; i++)
		m = g4_kv_amax_step(m, x[i]);
	for (int o = lanes >> 1; o > 0; o >>= 1)
		m = g4_kv_amax_step(m, __shfl_xor_sync(FULL_MASK, m, o));
	return m;
}

/* NB bytes, packed little-endian in w, at dst (aligned to NB). */
template <int NB>
__device__ __forceinline__ void
store_packed(uint8_t *dst, const uint32_t *w)
{
	if constexpr (NB == 1)
		*dst = (uint8_t) w[0];
	else if constexpr (NB == 2)
		*(uint16_t *) dst = (uint16_t) w[0];
	else if constexpr (NB == 4)
		*(uint32_t *) dst = w[0];
	else if constexpr (NB == 8)
		*(uint2 *) dst = make_uint2(w[0], w[1]);
	else
	{
		static_assert(NB == 16, "a lane stores 1, 2, 4, 8 or 16 bytes");
		*(uint4 *) dst = make_uint4(w[0], w[1], w[2], w[3]);
	}
}

/* The key (or a k_eq_v layer's plain value): int8 codes, one scale. */
template <int P>
__device__ __forceinline__ void
store_k8(const float x[P], uint8_t *hb, int off, int hd)
{
	int			lane = threadIdx.x & 31;
	float		inv;
	uint16_t	s16 = g4_kv_scale(group_amax<P>(x, 32), G4_KV_K8_LEVELS, &inv);
	uint32_t	w[(P + 3) / 4] = {0};

#pragma unroll
	for (int i = 0; i < P; i++)
		w[i / 4] |= (uint32_t) (uint8_t) g4_kv_k8_code(x[i], inv) << (8 * (i % 4));
	if (lane * P < hd)
		store_packed<P>(hb + (size_t) off * (size_t) hd + (size_t) (lane * P), w);
	if (lane == 0)
		*(uint16_t *) (hb + g4_kv_tq_kscale_off(hd) + 2 * (size_t) off) = s16;
}

/* The rotated value: 4-bit codes, one scale per G elements. */
template <int P>
__device__ __forceinline__ void
store_v4(const float x[P], uint8_t *hb, int off, int hd)
{
	int			lane = threadIdx.x & 31;
	int			G = g4_kv_v4_group(hd);
	int			lanes = G / P;	/* lanes sharing a scale: P divides 32 and G */
	float		inv;
	uint16_t	s16 = g4_kv_scale(group_amax<P>(x, lanes), G4_KV_V4_STEPS, &inv);
	uint32_t	w[(P + 7) / 8] = {0};
	uint8_t    *vq = hb + g4_kv_tq_v_off(hd) + (size_t) off * (size_t) (hd / 2);
	uint16_t   *vs = (uint16_t *) (hb + g4_kv_tq_vscale_off(hd) + (size_t) off * (size_t) (hd / G) * 2);

#pragma unroll
	for (int i = 0; i < P; i++)
		w[i / 8] |= (uint32_t) g4_kv_v4_code(x[i], inv) << (4 * (i % 8));
	if constexpr (P == 1)
	{
		/* a byte holds two lanes' codes: the even lane writes it */
		uint32_t	hi = __shfl_down_sync(FULL_MASK, w[0], 1);

		if ((lane & 1) == 0 && lane < hd)
			vq[lane / 2] = (uint8_t) (w[0] | hi << 4);
	}
	else
	{
		if (lane * P < hd)
			store_packed<P / 2>(vq + (size_t) (lane * P / 2), w);
	}
	if (lane % lanes == 0 && lane * P < hd)
		vs[lane * P / G] = s16;
}

template <int P>
__global__ void __launch_bounds__(STORE_THREADS)
kv_store_tq_kernel(store_args a)
{
	store_item	it;
	float		kx[P],
				vx[P];

	if (!store_item_of(a, &it))
		return;
	if (a.k_eq_v)
	{
		/* not rotated: attention applies RoPE to the plain vector */
		lane_load<P>(vx, it.v, a.hd, a.vec);
		store_k8<P>(vx, it.hb, it.off, a.hd);
		return;
	}
	/* both rows loaded, then both transformed: their loads and shuffle
	 * chains are independent and overlap */
	lane_load<P>(kx, it.k, a.hd, a.vec);
	lane_load<P>(vx, it.v, a.hd, a.vec);
	hadamard_warp<P>(kx, a.hd);
	hadamard_warp<P>(vx, a.hd);
	store_k8<P>(kx, it.hb, it.off, a.hd);
	store_v4<P>(vx, it.hb, it.off, a.hd);
}

int
g4c_kv_store(g4_backend *be, const g4_kv_layer *L, const float *k, int k_stride, const float *v, int v_stride, int n)
{
	g4_cuda    *c = g4c_of(be);
	const g4_kv_pool_desc *kv = &c->kv;
	void		(*kernel) (store_args);
	store_args	a;
	int			hd = L->head_dim;

	if (!c->kv_configured || hd > STORE_MAX_HD || hd < 2)
		return G4_ERR_INTERNAL;
	if (kv->dtype == G4_KV_TURBOQUANT_K8V4 && (hd & (hd - 1)) != 0)
		return G4_ERR_UNSUPPORTED;
	if (n <= 0)
		return G4_OK;
	a.dtype = kv->dtype;
	a.k_eq_v = L->k_eq_v;
	a.hd = hd;
	a.n_kv_heads = L->n_kv_heads;
	a.items = n * L->n_kv_heads;
	a.layer_base = kv->base[L->group] + (size_t) L->index * kv->layer_stride[L->group];
	a.layer_block_bytes = kv->layer_block_bytes[L->group];
	a.head_block_bytes = g4_kv_head_block_bytes(kv->dtype, hd, L->k_eq_v);
	a.table = kv->block_tables[L->group];
	a.max_blocks = kv->max_blocks_per_seq;
	a.k = L->k_eq_v ? NULL : k;
	a.k_stride = k_stride;
	a.v = v;
	a.v_stride = v_stride;
	a.vec = (((uintptr_t) a.k | (uintptr_t) v) % 16 == 0 && (L->k_eq_v || k_stride % 4 == 0) && v_stride % 4 == 0
			 && hd % 4 == 0);
	a.pos = c->d_pos;
	a.slot = c->d_slot;
	a.status = c->d_status;
	/* the wide stores rely on it: every head block is a multiple of 16 bytes */
	if ((uintptr_t) a.layer_base % 16 != 0)
		return G4_ERR_INTERNAL;
	if (kv->dtype != G4_KV_TURBOQUANT_K8V4)
		kernel = kv_store_copy_kernel;
	else
		switch (hd < 32 ? 1 : hd / 32)	/* elements per lane */
		{
			case 1:
				kernel = kv_store_tq_kernel<1>;
				break;
			case 2:
				kernel = kv_store_tq_kernel<2>;
				break;
			case 4:
				kernel = kv_store_tq_kernel<4>;
				break;
			case 8:
				kernel = kv_store_tq_kernel<8>;
				break;
			default:
				kernel = kv_store_tq_kernel<16>;
				break;
		}
	return g4c_launch(c, "kv_store", kernel, dim3((a.items + STORE_WARPS - 1) / STORE_WARPS), dim3(STORE_THREADS), 0,
					  a);
}
