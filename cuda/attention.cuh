/*
 * attention.cuh — what the attention kernels share: their arguments, the
 * paged pool's head blocks, decoding stored K/V elements (float32, bf16,
 * turboquant_k8v4 through kvformat.h), the Hadamard rotation of rows in
 * shared memory, and the f16 tile decoding of one 16-key pool block for
 * the tensor-core kernels.  The kernels and their dispatch: attention.cu.
 */
#ifndef G4_ATTENTION_CUH
#define G4_ATTENTION_CUH

#include <math.h>

#include "cuda_common.cuh"

#define ATTN_SPLIT_MIN_KEYS 32

/*
 * The float32 kernel splits a token's range by the token's own span alone:
 * ceil(span / ATTN_SPLIT_MIN_KEYS) splits, at most ATTN_SIMT_MAX_SPLITS, so
 * that a token's attention never depends on what else the step holds (the
 * batch, the longest range, a verify step's other tokens): the kernel that
 * is exact to rounding is also batch-invariant.  The launch covers the
 * step's most (attn_simt_splits of its longest span); a token's further
 * splits are empty and add nothing in the merge.
 */
#define ATTN_SIMT_MAX_SPLITS 32

static inline __host__ __device__ int
attn_simt_splits(int span)
{
	int			s = (span + ATTN_SPLIT_MIN_KEYS - 1) / ATTN_SPLIT_MIN_KEYS;

	return s < 1 ? 1 : (s > ATTN_SIMT_MAX_SPLITS ? ATTN_SIMT_MAX_SPLITS : s);
}

struct attn_args;
typedef void (*attn_kernel_fn) (struct attn_args);

struct attn_args
{
	int			dtype;
	int			k_eq_v;
	int			rotated;		/* turboquant and not k_eq_v */
	int			hd;
	int			n_kv;
	int			gq;				/* query heads per KV head */
	float		scale;
	const float *knorm;			/* k_eq_v */
	const float *inv_freq;		/* k_eq_v */
	int			rope_pairs;		/* k_eq_v: inv_freq's rotated pairs, leading */
	const uint8_t *layer_base;
	size_t		layer_block_bytes;
	size_t		head_block_bytes;
	const int32_t *table;
	int			max_blocks;
	const float *q;
	int			q_stride;
	float	   *out;
	int			out_stride;		/* n_heads * hd */
	/* out's bf16 copy (g4c_act_bf16_offer), or NULL: written by the
	 * kernel that writes out (attn_finish_token, the k_eq_v decode kernel,
	 * attn_merge_kernel) */
	uint16_t   *out_bf16;
	const int32_t *slot,
			   *lo,
			   *hi;
	const int32_t *tiles;		/* tc: first token of each tile, then n */
	int			S;				/* splits (gridDim.y) */
	float	   *partial;		/* [group][split][row][hd + 2] when S > 1 */
	unsigned   *status;
	/* per token its k_eq_v prefill run's first 16-key tile, -1 for tokens
	 * outside the runs (backend_cuda.cu, keqv_tile_runs) */
	const int32_t *tile_base;
	/* the prefill runs' rows are attention_gemm.cu's: the tc kernel skips
	 * their tiles */
	int			gemm_runs;
};

typedef void (*attn_kernel_fn) (attn_args);

/* attention_gemm.cu: whether its products serve this layer's prefill runs
 * (the step has some, and their key and value rows fit its bound), and
 * those runs' attention into a->out */
int			g4c_attention_gemm_serves(const g4_cuda *c, const attn_args *a);
int			g4c_attention_gemm(g4_cuda *c, const attn_args *a);
/* its buffers grown, in a dry step, for the most runs within the bound */
int			g4c_attention_gemm_dry(g4_cuda *c, const attn_args *a);

/* attention_prefill.cu: its kernel for this geometry, or NULL (wgmma: the
 * device runs the sm_90a kernels) */
attn_kernel_fn g4c_attention_prefill_kernel(int hd, int k_eq_v, int dtype, int gq, int wgmma, int *rows, int *threads,
											int *smem);

/* Eight floats as f16 (g4c_pack_f16) into 16 bytes of shared memory. */
__device__ __forceinline__ void
put8_f16(unsigned char *p, const float x[8])
{
	*reinterpret_cast<uint4 *>(p) =
		make_uint4(g4c_pack_f16(x[0], x[1]), g4c_pack_f16(x[2], x[3]), g4c_pack_f16(x[4], x[5]), g4c_pack_f16(x[6], x[7]));
}

/* Head block of (slot, position) for KV head g, or NULL. */
__device__ __forceinline__ const uint8_t *
kv_head_block(const attn_args &a, int slot, int p, int g)
{
	int32_t		blk = a.table[(size_t) slot * (size_t) a.max_blocks + (size_t) (p / G4_KV_BLOCK_TOKENS)];

	if (blk < 0)
		return NULL;
	return a.layer_base + (size_t) blk * a.layer_block_bytes + (size_t) g * a.head_block_bytes;
}

/* n bytes (1..64, a power of two, naturally aligned), global or shared */
template <int NB>
__device__ __forceinline__ void
load_bytes(const uint8_t *p, uint8_t *dst)
{
	if constexpr (NB >= 16)
	{
#pragma unroll
		for (int i = 0; i < NB / 16; i++)
			reinterpret_cast<uint4 *>(dst)[i] = reinterpret_cast<const uint4 *>(p)[i];
	}
	else if constexpr (NB == 8)
		*reinterpret_cast<uint2 *>(dst) = *reinterpret_cast<const uint2 *>(p);
	else if constexpr (NB == 4)
		*reinterpret_cast<uint32_t *>(dst) = *reinterpret_cast<const uint32_t *>(p);
	else if constexpr (NB == 2)
		*reinterpret_cast<uint16_t *>(dst) = *reinterpret_cast<const uint16_t *>(p);
	else
		*dst = *p;
}

/* Decode E consecutive elements starting at d0 of the stored K (k = true)
 * or V of one (token, head) slot.  For k_eq_v layers both are the stored
 * vector. */
template <int DT, int E>
__device__ __forceinline__ void
decode_elems(const uint8_t *hb, int off, int hd, int d0, bool k, bool k_eq_v, float *x)
{
	if (DT == G4_KV_F32)
	{
		float		v[E];
		const float *p = reinterpret_cast<const float *>(hb) + (size_t) ((k || k_eq_v) ? off : G4_KV_BLOCK_TOKENS + off) * hd + d0;

		load_bytes<E * 4>(reinterpret_cast<const uint8_t *>(p), reinterpret_cast<uint8_t *>(v));
#pragma unroll
		for (int e = 0; e < E; e++)
			x[e] = v[e];
	}
	else if (DT == G4_KV_BF16)
	{
		uint16_t	v[E];
		const uint16_t *p = reinterpret_cast<const uint16_t *>(hb) + (size_t) ((k || k_eq_v) ? off : G4_KV_BLOCK_TOKENS + off) * hd + d0;

		load_bytes<E * 2>(reinterpret_cast<const uint8_t *>(p), reinterpret_cast<uint8_t *>(v));
#pragma unroll
		for (int e = 0; e < E; e++)
			x[e] = g4_bf16_to_f32(v[e]);
	}
	else if (k || k_eq_v)
	{
		int8_t		v[E];
		float		s = g4_f16_to_f32(*reinterpret_cast<const uint16_t *>(hb + g4_kv_tq_kscale_off(hd) + 2 * (size_t) off));

		load_bytes<E>(hb + (size_t) off * hd + d0, reinterpret_cast<uint8_t *>(v));
#pragma unroll
		for (int e = 0; e < E; e++)
			x[e] = g4_kv_k8_value(v[e], s);
	}
	else
	{
		int			G = g4_kv_v4_group(hd);
		const uint8_t *vq = hb + g4_kv_tq_v_off(hd) + (size_t) off * (size_t) (hd / 2);
		const uint16_t *vs = reinterpret_cast<const uint16_t *>(hb + g4_kv_tq_vscale_off(hd) + (size_t) off * (size_t) (hd / G) * 2);

		if constexpr (E >= 2)
		{
			uint8_t		v[E / 2];
			float		s = g4_f16_to_f32(vs[d0 / G]);	/* E divides G */

			load_bytes<E / 2>(vq + d0 / 2, v);
#pragma unroll
			for (int e = 0; e < E / 2; e++)
			{
				x[2 * e] = g4_kv_v4_value(v[e] & 15, s);
				x[2 * e + 1] = g4_kv_v4_value(v[e] >> 4, s);
			}
		}
		else
		{
			uint8_t		b = vq[d0 / 2];
			float		s = g4_f16_to_f32(vs[d0 / G]);

			x[0] = g4_kv_v4_value((b >> (4 * (d0 & 1))) & 15, s);
		}
	}
}

/* 16-byte accesses to a row only where it is aligned: query and output rows
 * need not be. */
__device__ __forceinline__ int
row_aligned16(const float *row)
{
	return (reinterpret_cast<uintptr_t>(row) & 15) == 0;
}

/* The Hadamard transform of `rows` rows of HD floats, `stride` apart in
 * shared memory and written before a barrier: one warp per row in
 * registers (hadamard_warp), no barrier between the stages; a barrier at
 * the end (whole block). */
template <int HD>
static __device__ void
hadamard_rows(float *x, int rows, int stride)
{
	constexpr int P = HD >= 32 ? HD / 32 : 1;

	for (int r = threadIdx.x >> 5; r < rows; r += blockDim.x >> 5)
	{
		float	   *row = x + (size_t) r * stride;
		float		v[P];

		lane_load<P>(v, row, HD, row_aligned16(row));
		hadamard_warp<P>(v, HD);
		lane_store<P>(v, row, HD, row_aligned16(row));
	}
	__syncthreads();
}

/* hadamard_rows for a head_dim known only at run time: the pool's
 * turboquant head_dims are powers of two up to 512 (g4c_attention). */
static __device__ void
hadamard_rows_hd(float *x, int rows, int hd, int stride)
{
	switch (hd)
	{
		case 512:
			return hadamard_rows<512>(x, rows, stride);
		case 256:
			return hadamard_rows<256>(x, rows, stride);
		case 128:
			return hadamard_rows<128>(x, rows, stride);
		case 64:
			return hadamard_rows<64>(x, rows, stride);
		case 32:
			return hadamard_rows<32>(x, rows, stride);
		case 16:
			return hadamard_rows<16>(x, rows, stride);
		case 8:
			return hadamard_rows<8>(x, rows, stride);
		case 4:
			return hadamard_rows<4>(x, rows, stride);
		case 2:
			return hadamard_rows<2>(x, rows, stride);
		default:
			return hadamard_rows<1>(x, rows, stride);
	}
}

/* Where the output row r of a block goes: token t0 + r / gq, query head
 * g·gq + r % gq; NULL for rows past the block's tokens. */
struct row_map
{
	float	   *out;
	int			out_stride;
	int			t0;
	int			ntok;
	int			gq;
	int			g;
	int			hd;

	__device__ __forceinline__ float *row(int r) const
	{
		int			tt = r / gq;

		if (tt >= ntok)
			return NULL;
		return out + (size_t) (t0 + tt) * out_stride + (size_t) (g * gq + r % gq) * hd;
	}
};

/* The end of a kernel whose `warps` warps each walked their own keys for
 * one token t and KV head g: their states, [gq rows][m, l, HD outputs] in
 * ws, combined by log-sum-exp (whole block); this split's partial for
 * attn_merge_kernel when the range is split, else the normalised rows
 * (through qs, rotated back on turboquant pools) into the output.  Used by
 * the float32 and decode kernels. */
static __device__ void
attn_finish_token(const attn_args &a, const float *ws, float *qs, int split, int warps, int HD, int t, int g)
{
	int			gq = a.gq;

	for (int q = threadIdx.x; q < gq * HD; q += blockDim.x)
	{
		int			h = q / HD,
					d = q % HD;
		float		mm = -INFINITY,
					ll = 0.0f,
					aa = 0.0f;

		for (int w = 0; w < warps; w++)
			mm = fmaxf(mm, ws[((size_t) w * gq + h) * (HD + 2)]);
		for (int w = 0; w < warps; w++)
		{
			const float *st = ws + ((size_t) w * gq + h) * (HD + 2);
			float		wt;

			if (st[0] == -INFINITY)
				continue;
			wt = expf(st[0] - mm);
			ll += st[1] * wt;
			aa += st[2 + d] * wt;
		}
		if (a.S == 1)
			qs[q] = aa * (ll > 0.0f ? 1.0f / ll : 0.0f);
		else
		{
			float	   *pp = a.partial + (((size_t) blockIdx.x * a.S + split) * gq + h) * (HD + 2);

			if (d == 0)
			{
				pp[0] = mm;
				pp[1] = ll;
			}
			pp[2 + d] = aa;
		}
	}
	if (a.S > 1)
		return;					/* attn_merge_kernel finishes */
	__syncthreads();
	if (a.rotated)
		hadamard_rows_hd(qs, gq, HD, HD);
	for (int q = threadIdx.x; q < gq * HD; q += blockDim.x)
	{
		size_t		at = (size_t) t * a.out_stride + (size_t) g * gq * HD + q;

		a.out[at] = qs[q];
		if (a.out_bf16)
			a.out_bf16[at] = g4_f32_to_bf16(qs[q]);
	}
}

/* Two int8 codes (bytes sel of w) as an exact f16 pair: 0x64XX is 1024 + XX,
 * and XX = code + 128 after the sign flip. */
__device__ __forceinline__ uint32_t
i8x2_to_f16x2(uint32_t w_flipped, uint32_t sel)
{
	uint32_t	h = __byte_perm(w_flipped, 0x64u, sel);
	__half2		x = __hsub2(*reinterpret_cast<__half2 *>(&h), __half2half2(__ushort_as_half(0x6480)));	/* 1152 */

	return *reinterpret_cast<uint32_t *>(&x);
}

/* ==== tensor-core tiles ============================================================ */

/* Byte offset of element (row, d) of a 16-bit [rows][HD] tile whose 16-byte
 * chunks are XOR-swizzled by row (conflict-free ldmatrix). */
template <int HD>
__device__ __forceinline__ int
swz(int row, int d)
{
	return row * HD * 2 + ((((d >> 3) ^ (row & 7))) << 4) + ((d & 7) << 1);
}

/* Rows a warp rotates at once in tile_queries_f16 and tile_store_rotated:
 * their shuffles and loads overlap */
#define TILE_ROT_ROWS 2

/* Byte offset of element (row, d) of a 16-bit tile of ROWS rows in the
 * warpgroup-MMA layout (wgmma.cuh): [dims / 64][ROWS][128 bytes], each
 * row's 16-byte chunks XOR-swizzled by row. */
template <int ROWS>
__device__ __forceinline__ int
wgt_off(int row, int d)
{
	return (d >> 6) * ROWS * 128 + row * 128 + ((((d >> 3) & 7) ^ (row & 7)) << 4) + ((d & 7) << 1);
}

/* swz, or wgt_off where WROWS (the tile's rows) is not 0 */
template <int HD, int WROWS>
__device__ __forceinline__ int
qtile_off(int row, int d)
{
	if constexpr (WROWS > 0)
		return wgt_off<WROWS>(row, d);
	else
		return swz<HD>(row, d);
}

/* ==== tiles of query rows (tc and prefill kernels) ================================= */

/* The key ranges of a tile's R rows into rlo / rhi (empty past its ntok
 * tokens) and their union into kr[0..1] (INT32_MAX, INT32_MIN when empty).
 * The caller synchronises before reading them. */
static __device__ void
tile_row_ranges(const attn_args &a, int t0, int ntok, int R, int *rlo, int *rhi, int *kr)
{
	if (threadIdx.x == 0)
	{
		kr[0] = INT32_MAX;
		kr[1] = INT32_MIN;
	}
	__syncthreads();
	for (int r = threadIdx.x; r < R; r += blockDim.x)
	{
		int			tt = r / a.gq;
		int			lo = 0,
					hi = 0;

		if (tt < ntok)
		{
			lo = a.lo[t0 + tt];
			hi = a.hi[t0 + tt];
			if (hi > lo)
			{
				atomicMin(&kr[0], lo);
				atomicMax(&kr[1], hi);
			}
		}
		rlo[r] = lo;
		rhi[r] = hi;
	}
}

/* This split's share [*b_begin, *b_end) of the pool blocks covering the
 * keys [lo, hi) of one token (the decode kernels): S runs of equal length,
 * the last ones shorter or empty. */
__device__ __forceinline__ void
split_blocks(int lo, int hi, int S, int split, int *b_begin, int *b_end)
{
	int			b_lo = lo / G4_KV_BLOCK_TOKENS;
	int			b_hi = hi > lo ? (hi - 1) / G4_KV_BLOCK_TOKENS + 1 : b_lo;
	int			per = (b_hi - b_lo + S - 1) / S;

	*b_begin = b_lo + split * per;
	*b_end = min(b_hi, *b_begin + per);
}

/* This split's keys [ks, ke) of the tile's [kmin, kmax): S chunks of a
 * multiple of `align` keys. */
__device__ __forceinline__ void
split_range(int kmin, int kmax, int S, int split, int align, int *ks, int *ke)
{
	int			span = kmax > kmin ? kmax - kmin : 0;
	int			chunk = (span + S - 1) / S;

	chunk = (chunk + align - 1) / align * align;
	*ks = kmin + split * chunk;
	*ke = min(kmax, *ks + chunk);
}

/* The tile's R query rows (token t0 + r / gq, query head g·gq + r % gq) as
 * f16 in Qs (swizzled, or in the warpgroup-MMA layout of WROWS = R rows),
 * zeros past its tokens; rotated by the Hadamard transform first when rot
 * (a warp per row, in registers).  The caller synchronises before reading
 * Qs. */
template <int HD, int WROWS = 0>
static __device__ void
tile_queries_f16(const attn_args &a, int t0, int ntok, int g, int R, bool rot, unsigned char *Qs)
{
	if (rot)
	{
		constexpr int P = HD >= 32 ? HD / 32 : 1;
		int			lane = threadIdx.x & 31;
		int			nw = blockDim.x >> 5;

		static_assert(HD >= 64, "a lane's elements pair up into f16 words");
		/* TILE_ROT_ROWS rows a warp at a time (hadamard_warp_rows) */
		for (int r0 = threadIdx.x >> 5; r0 < R; r0 += TILE_ROT_ROWS * nw)
		{
			float		x[TILE_ROT_ROWS][P];

#pragma unroll
			for (int n = 0; n < TILE_ROT_ROWS; n++)
			{
				int			r = r0 + n * nw;
				int			tt = r / a.gq;

				if (r < R && tt < ntok)
				{
					const float *row = a.q + (size_t) (t0 + tt) * a.q_stride + (size_t) (g * a.gq + r % a.gq) * HD;

					lane_load<P>(x[n], row, HD, row_aligned16(row));
				}
				else
				{
#pragma unroll
					for (int i = 0; i < P; i++)
						x[n][i] = 0.0f;
				}
			}
			hadamard_warp_rows<P, TILE_ROT_ROWS>(x, HD);
#pragma unroll
			for (int n = 0; n < TILE_ROT_ROWS; n++)
				if (r0 + n * nw < R)
#pragma unroll
					for (int i = 0; i < P; i += 2)
						*reinterpret_cast<uint32_t *>(Qs + qtile_off<HD, WROWS>(r0 + n * nw, lane * P + i)) =
							g4c_pack_f16(x[n][i], x[n][i + 1]);
		}
	}
	else
	{
		for (int q = threadIdx.x; q < R * HD / 2; q += blockDim.x)
		{
			int			r = q / (HD / 2),
						d = 2 * (q % (HD / 2));
			int			tt = r / a.gq;
			float2		v = make_float2(0.0f, 0.0f);

			if (tt < ntok)
				v = *reinterpret_cast<const float2 *>(a.q + (size_t) (t0 + tt) * a.q_stride + (size_t) (g * a.gq + r % a.gq) * HD + d);
			*reinterpret_cast<uint32_t *>(Qs + qtile_off<HD, WROWS>(r, d)) = g4c_pack_f16(v.x, v.y);
		}
	}
}

/* Rotated (turboquant) output rows, normalised in `st` (R rows of HD
 * floats, written before a barrier): rotated back, a warp per
 * TILE_ROT_ROWS rows in registers (hadamard_warp_rows), and stored. */
template <int HD>
static __device__ void
tile_store_rotated(const float *st, int R, const row_map &map)
{
	constexpr int P = HD >= 32 ? HD / 32 : 1;
	int			nw = blockDim.x >> 5;

	for (int r0 = threadIdx.x >> 5; r0 < R; r0 += TILE_ROT_ROWS * nw)
	{
		float	   *dst[TILE_ROT_ROWS];
		float		x[TILE_ROT_ROWS][P];
		bool		any = false;

#pragma unroll
		for (int n = 0; n < TILE_ROT_ROWS; n++)
		{
			int			r = r0 + n * nw;

			dst[n] = r < R ? map.row(r) : NULL;	/* warp-uniform */
			any |= dst[n] != NULL;
			if (dst[n])
				lane_load<P>(x[n], st + (size_t) r * HD, HD, row_aligned16(st + (size_t) r * HD));
			else
#pragma unroll
				for (int i = 0; i < P; i++)
					x[n][i] = 0.0f;
		}
		if (!any)
			continue;
		hadamard_warp_rows<P, TILE_ROT_ROWS>(x, HD);
#pragma unroll
		for (int n = 0; n < TILE_ROT_ROWS; n++)
			if (dst[n])
				lane_store<P>(x[n], dst[n], HD, row_aligned16(dst[n]));
	}
}

/* sin and cos of a float32 angle: Cody-Waite reduction by 2π then the fast
 * intrinsic (|error| ~ 1e-6, below the f16 rounding of the keys) */
__device__ __forceinline__ void
sincos_reduced(float angle, float *s, float *c)
{
	float		k = rintf(angle * 0.15915494309189535f);
	float		r = fmaf(-k, 6.28318548202514648f, angle);

	r = fmaf(k, 1.7484555314695172e-7f, r);
	__sincosf(r, s, c);
}

/* RoPE of the pair (kl, kh) at position p (exact as a float) with inverse
 * frequency f, in float32: the angle p·f rounded once, then its sine and
 * cosine. */
__device__ __forceinline__ void
rope_pair(float kl, float kh, float f, float p, float *kx, float *ky)
{
	float		s,
				co;

	sincos_reduced(__fmul_rn(p, f), &s, &co);
	*kx = kl * co - kh * s;
	*ky = kh * co + kl * s;
}

/* The keys at dims d and d + HD/2 of a k_eq_v layer at position p, from
 * the stored (value) elements lo and hi: RoPE(v ⊙ k_norm) with inverse
 * frequency f (0: the pair is not rotated). */
__device__ __forceinline__ void
keqv_key_pair(float lo, float hi, float kn_lo, float kn_hi, float f, int p, float *kx, float *ky)
{
	float		kl = lo * kn_lo;
	float		kh = hi * kn_hi;

	if (f != 0.0f)
		rope_pair(kl, kh, f, (float) p, kx, ky);
	else
	{
		*kx = kl;
		*ky = kh;
	}
}

template <int HD, int DT, bool KEQV, int RG>
struct tc_geom
{
	static constexpr int NTH = 128 * RG;
	static constexpr int R = 16 * RG;	/* query rows */
	static constexpr int DW = HD / 4;	/* head dims per warp */
	static constexpr int TPK = NTH / 16;	/* threads per key when decoding a block */
	/* a piece is 8 consecutive dims (k_eq_v: 8 dims of each half) */
	static constexpr int PIECES = KEQV ? HD / 16 : HD / 8;
	static constexpr int PPT = PIECES / TPK;
	static constexpr int EB = DT == G4_KV_F32 ? 4 : DT == G4_KV_BF16 ? 2 : 1;	/* key bytes per element */
	static constexpr int Q_BYTES = R * HD * 2;
	static constexpr int KV_BYTES = 2 * 16 * HD * 2;
	static constexpr int SX_BYTES = RG * 4 * 256 * 4;
	/* rotated (turboquant, not k_eq_v) outputs pass through float rows
	 * placed after Qs, over Ks / Vs */
	static constexpr bool ROT = DT == G4_KV_TURBOQUANT_K8V4 && !KEQV;
	static constexpr int STAGE_BYTES = ROT ? R * HD * 4 : 0;
	static constexpr int MAIN_BYTES = Q_BYTES + (KV_BYTES > STAGE_BYTES ? KV_BYTES : STAGE_BYTES);
	static constexpr int SMEM = MAIN_BYTES + SX_BYTES + (HD + HD / 2) * 4 + R * 8;
};

/* Raw bytes of one thread's pieces of one pool block. */
template <int HD, int DT, bool KEQV, int RG>
struct tc_raw
{
	using G = tc_geom<HD, DT, KEQV, RG>;
	uint8_t		k[G::PPT][8 * G::EB * (KEQV ? 2 : 1)];	/* KEQV: lower then upper half */
	uint8_t		v[KEQV ? 1 : G::PPT][KEQV ? 1 : (DT == G4_KV_TURBOQUANT_K8V4 ? 4 : 8 * G::EB)];
	float		ks;				/* turboquant key scale */
	float		vs[G::PPT];		/* turboquant value scale per piece */
	bool		ok;
};

template <int HD, int DT, bool KEQV, int RG>
__device__ __forceinline__ void
tc_load_raw(const attn_args &a, int slot, int g, int b, tc_raw<HD, DT, KEQV, RG> &raw)
{
	using G = tc_geom<HD, DT, KEQV, RG>;
	int			j = threadIdx.x / G::TPK;
	int			c = threadIdx.x % G::TPK;
	const uint8_t *hb = kv_head_block(a, slot, b * G4_KV_BLOCK_TOKENS, g);

	raw.ok = hb != NULL;
	if (!hb)
		return;
	if (DT == G4_KV_TURBOQUANT_K8V4)
		raw.ks = g4_f16_to_f32(*reinterpret_cast<const uint16_t *>(hb + g4_kv_tq_kscale_off(HD) + 2 * j));
#pragma unroll
	for (int i = 0; i < G::PPT; i++)
	{
		int			d = 8 * (c + G::TPK * i);	/* first dim of the piece */
		const uint8_t *krow = hb + (size_t) j * HD * G::EB;

		load_bytes<8 * G::EB>(krow + (size_t) d * G::EB, raw.k[i]);
		if (KEQV)
			load_bytes<8 * G::EB>(krow + (size_t) (d + HD / 2) * G::EB, raw.k[i] + 8 * G::EB);
		else if (DT == G4_KV_TURBOQUANT_K8V4)
		{
			const int	GR = g4_kv_v4_group(HD);	/* a multiple of the piece's 8 */

			load_bytes<4>(hb + g4_kv_tq_v_off(HD) + (size_t) j * (HD / 2) + d / 2, raw.v[i]);
			raw.vs[i] = g4_f16_to_f32(*reinterpret_cast<const uint16_t *>(hb + g4_kv_tq_vscale_off(HD) + (size_t) j * (HD / GR) * 2 + (size_t) (d / GR) * 2));
		}
		else
			load_bytes<8 * G::EB>(hb + (size_t) (G4_KV_BLOCK_TOKENS + j) * HD * G::EB + (size_t) d * G::EB, raw.v[KEQV ? 0 : i]);
	}
}

template <int DT, int EB>
__device__ __forceinline__ float
raw_elem(const uint8_t *p, int e, float s)
{
	if (DT == G4_KV_F32)
		return reinterpret_cast<const float *>(p)[e];
	if (DT == G4_KV_BF16)
		return g4_bf16_to_f32(reinterpret_cast<const uint16_t *>(p)[e]);
	return g4_kv_k8_value(reinterpret_cast<const int8_t *>(p)[e], s);
}

/* Byte offset of element (row, d) of a 16-bit [rows][HD] tile: swizzled
 * (swz) for the tensor-core kernels' shared memory, plain row-major rows
 * for cuBLASLt's operands (attention_gemm.cu). */
template <int HD, bool PLAIN>
__device__ __forceinline__ int
tile_off(int row, int d)
{
	return PLAIN ? (row * HD + d) * 2 : swz<HD>(row, d);
}

/* Decode the raw pieces into Ks / Vs (f16, swizzled, or plain rows when
 * PLAIN).  Positions outside
 * the block's key range [ks, ke) may hold anything (never written, or left
 * by a finished sequence): they become zeros, since a masked probability of
 * 0 times a NaN value would still be NaN. */
template <int HD, int DT, bool KEQV, int RG, bool PLAIN = false>
__device__ __forceinline__ void
tc_store_block(const attn_args &a, int b, int ks, int ke, const tc_raw<HD, DT, KEQV, RG> &raw, unsigned char *Ks,
			   unsigned char *Vs, const float *knorm_s, const float *invf_s)
{
	using G = tc_geom<HD, DT, KEQV, RG>;
	int			j = threadIdx.x / G::TPK;
	int			c = threadIdx.x % G::TPK;
	int			p = b * G4_KV_BLOCK_TOKENS + j;
	bool		live = raw.ok && p >= ks && p < ke;

#pragma unroll
	for (int i = 0; i < G::PPT; i++)
	{
		int			d = 8 * (c + G::TPK * i);
		float		kx[8],
					vx[8];

		if (!live)
		{
#pragma unroll
			for (int e = 0; e < 8; e++)
				kx[e] = vx[e] = 0.0f;
		}
		if (KEQV)
		{
			float		ky[8],
						vy[8];

			if (live)
			{
#pragma unroll
				for (int e = 0; e < 8; e++)
				{
					float		lo = raw_elem<DT, G::EB>(raw.k[i], e, raw.ks);
					float		hi = raw_elem<DT, G::EB>(raw.k[i] + 8 * G::EB, e, raw.ks);

					vx[e] = lo;
					vy[e] = hi;
					keqv_key_pair(lo, hi, knorm_s[d + e], knorm_s[d + e + HD / 2], invf_s[d + e], p, &kx[e], &ky[e]);
				}
			}
			else
			{
#pragma unroll
				for (int e = 0; e < 8; e++)
					ky[e] = vy[e] = 0.0f;
			}
			*reinterpret_cast<uint4 *>(Ks + tile_off<HD, PLAIN>(j, d + HD / 2)) =
				make_uint4(g4c_pack_f16(ky[0], ky[1]), g4c_pack_f16(ky[2], ky[3]), g4c_pack_f16(ky[4], ky[5]), g4c_pack_f16(ky[6], ky[7]));
			*reinterpret_cast<uint4 *>(Vs + tile_off<HD, PLAIN>(j, d + HD / 2)) =
				make_uint4(g4c_pack_f16(vy[0], vy[1]), g4c_pack_f16(vy[2], vy[3]), g4c_pack_f16(vy[4], vy[5]), g4c_pack_f16(vy[6], vy[7]));
		}
		else if (live)
		{
#pragma unroll
			for (int e = 0; e < 8; e++)
			{
				kx[e] = raw_elem<DT, G::EB>(raw.k[i], e, raw.ks);
				if (DT == G4_KV_TURBOQUANT_K8V4)
				{
					int			byte = raw.v[i][e >> 1];

					vx[e] = g4_kv_v4_value((byte >> (4 * (e & 1))) & 15, raw.vs[i]);
				}
				else
					vx[e] = raw_elem<DT, G::EB>(raw.v[i], e, 0.0f);
			}
		}
		*reinterpret_cast<uint4 *>(Ks + tile_off<HD, PLAIN>(j, d)) =
			make_uint4(g4c_pack_f16(kx[0], kx[1]), g4c_pack_f16(kx[2], kx[3]), g4c_pack_f16(kx[4], kx[5]), g4c_pack_f16(kx[6], kx[7]));
		*reinterpret_cast<uint4 *>(Vs + tile_off<HD, PLAIN>(j, d)) =
			make_uint4(g4c_pack_f16(vx[0], vx[1]), g4c_pack_f16(vx[2], vx[3]), g4c_pack_f16(vx[4], vx[5]), g4c_pack_f16(vx[6], vx[7]));
	}
}

/* attention_decode.cu: the decode kernel for this geometry and `groups`
 * (token, KV head) pairs on sm_count SMs, or NULL; *smem its dynamic
 * shared memory. */
attn_kernel_fn attn_decode_kernel_for(int hd, int dtype, int k_eq_v, int gq, int groups, int sm_count, int *smem);

/* attention_decode_full.cu: the decode kernel of k_eq_v layers for this
 * geometry, or NULL (wgmma: the device runs the sm_90a kernels); *threads
 * its block size, *smem its dynamic shared memory. */
attn_kernel_fn attn_decode_full_kernel_for(int hd, int dtype, int k_eq_v, int gq, int rope_pairs, int wgmma,
										   int *threads, int *smem);

#endif
