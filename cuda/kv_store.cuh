/*
 * kv_store.cuh — writing a (token, KV head)'s K or V row into the paged pool
 * from the warp that holds it, byte for byte as kv_codec.c encodes it: the
 * encoders of kv_store.cu's kernels and of head_norm_rope's store
 * (norm_rope.cu).
 *
 * turboquant_k8v4: lane l holds elements [l·P, l·P + P) of the head in
 * registers (P = head_dim / 32; head widths below 32 give one element to
 * each of the first head_dim lanes, the others hold 0 and write nothing): the
 * layout of hadamard_warp (cuda_common.cuh).  The amaxes are warp shuffles
 * (the key over the whole warp, each value group over its G / P lanes),
 * scales and codes are kvformat.h's, and a lane's codes are contiguous in
 * the pool, so it stores them at once (8 bytes of key, 4 of value nibbles at
 * head_dim 256).
 */
#ifndef G4_KV_STORE_CUH
#define G4_KV_STORE_CUH

#include "cuda_common.cuh"

#define KV_FULL_MASK 0xffffffffu

/* Where one layer's rows go, and the step's tokens. */
struct kv_dest
{
	int			dtype;
	int			k_eq_v;
	int			hd;
	uint8_t    *layer_base;		/* base + layer * layer_stride, 16-byte aligned */
	size_t		layer_block_bytes;
	size_t		head_block_bytes;
	const int32_t *table;		/* [max_seqs][max_blocks] */
	int			max_blocks;
	const int32_t *pos;
	const int32_t *slot;
	unsigned   *status;
};

/* The instance of a kernel template over P elements per lane for p (1, 2,
 * 4, 8 or 16: the layout's widths up to 512). */
template <typename F>
static inline F
lane_kernel_of(int p, F k1, F k2, F k4, F k8, F k16)
{
	return p == 1 ? k1 : p == 2 ? k2 : p == 4 ? k4 : p == 8 ? k8 : k16;
}

/* kv_store.cu: layer L's destination in the configured pool. */
int			g4c_kv_dest(g4_cuda *c, const g4_kv_layer *L, kv_dest *d);

/* The bytes of KV head g in token t's block, and the token's row there
 * (`off`); NULL where the block is missing, which the status records.  After
 * the dependent-launch wait: positions, tables and slots may be earlier
 * kernels' outputs. */
__device__ __forceinline__ uint8_t *
kv_head_bytes(const kv_dest &d, int t, int g, int *off)
{
	int			p = d.pos[t];
	int32_t		blk = d.table[(size_t) d.slot[t] * (size_t) d.max_blocks + (size_t) (p / G4_KV_BLOCK_TOKENS)];

	if (blk < 0)
	{
		if ((threadIdx.x & 31) == 0)
			atomicOr(d.status, G4C_STATUS_KV_MISSING);
		return NULL;
	}
	*off = p % G4_KV_BLOCK_TOKENS;
	return d.layer_base + (size_t) blk * d.layer_block_bytes + (size_t) g * d.head_block_bytes;
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
		m = g4_kv_amax_step(m, __shfl_xor_sync(KV_FULL_MASK, m, o));
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
		uint32_t	hi = __shfl_down_sync(KV_FULL_MASK, w[0], 1);

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

/* One row held by the warp (lane_load's layout) into head bytes hb, token
 * row off, as kv_store's k (G4_STORE_K) or v (G4_STORE_V) row; x is
 * rotated in place where the dtype rotates it.  A k_eq_v
 * layer stores only its value, in the key's rows, as int8 codes and not
 * rotated (attention applies RoPE to the plain vector). */
template <int P>
__device__ __forceinline__ void
kv_put_row(const kv_dest &d, uint8_t *hb, int off, float x[P], int row)
{
	int			lane = threadIdx.x & 31;

	if (d.dtype == G4_KV_TURBOQUANT_K8V4)
	{
		if (d.k_eq_v)
		{
			store_k8<P>(x, hb, off, d.hd);
			return;
		}
		hadamard_warp<P>(x, d.hd);
		if (row == G4_STORE_K)
			store_k8<P>(x, hb, off, d.hd);
		else
			store_v4<P>(x, hb, off, d.hd);
		return;
	}
	{
		int			bf16 = d.dtype == G4_KV_BF16;
		size_t		at = (size_t) ((row == G4_STORE_V && !d.k_eq_v ? G4_KV_BLOCK_TOKENS : 0) + off) * (size_t) d.hd +
			(size_t) (lane * P);

		if constexpr (P % 4 == 0)
		{
			/* rows of 32 P floats: every lane's four are 16-byte aligned */
#pragma unroll
			for (int i = 0; i < P; i += 4)
				put4(hb, at + i, make_float4(x[i], x[i + 1], x[i + 2], x[i + 3]), bf16);
		}
		else
		{
#pragma unroll
			for (int i = 0; i < P; i++)
				if (lane * P + i < d.hd)
					put1(hb, at + i, x[i], bf16);
		}
	}
}

#endif
