/*
 * attention_prefill.cu — attention for tiles of several tokens of one
 * sequence (prefill chunks, verify steps), FlashAttention-2 style with f16
 * tensor-core products, float32 softmax and accumulation: the tc kernel's
 * numerics (attention.cu), organised for throughput.
 *
 * A block takes R query rows (consecutive tokens × the query heads of one
 * KV head, as row_map) and walks its key range in tiles of KT keys:
 *   - each group of 16 rows belongs to one warp: the warp's online softmax
 *     and its rows of O stay in registers, with no exchange between warps;
 *   - a tile's raw pool bytes arrive by cp.async ahead of their use and are
 *     decoded once into f16 K / V tiles one tile ahead (double-buffered);
 *   - turboquant queries are rotated by the Hadamard transform once and the
 *     outputs rotated back once, as in the tc kernel.
 * Two kernels share these phases (pf_stage_tile, pf_decode_tile,
 * pf_softmax, pf_store) and differ in how the products run:
 *   - attn_prefill_kernel (mma.sync m16n8k16, any sm_80+ device, every KV
 *     dtype): a warp computes S = Q·Kᵀ and O += P·V of its 16 rows from
 *     ldmatrix fragments, 32-key tiles, raw bytes two tiles ahead;
 *   - attn_prefill_wgmma_kernel (sm_90a, turboquant pools): the two
 *     warpgroups of the block each own 64 rows and issue warpgroup MMAs
 *     (wgmma.cuh) that read Q, K and V straight from shared memory, 48-key
 *     tiles; the next tile's decoding runs while the tensor cores work.
 *     The mma.sync kernel spent ~2,000 instructions per warp and 32-key
 *     tile for 128 MMAs at 8 warps per SM, latency-bound (ncu, run 118).
 * Long ranges may be split over blocks: partials in the tc kernel's format,
 * combined by attn_merge_kernel.
 *
 * Head_dim 256 without k_eq_v only (the sliding layers): full layers
 * (head_dim 512, k_eq_v) go to attention_gemm.cu and the tc kernel.  The
 * choice between kernels: choose_kernel in attention.cu.
 */
#include "attention.cuh"
#include "wgmma.cuh"

#define PF_HD 256				/* head_dim; a warp's O: 32 n8 tiles, 128 registers */

/* Shared memory: Qs [R][PF_HD] f16 | K, V tiles [2][K, V][KT][PF_HD] f16 | raw
 * pool blocks [2][KT / 16][head block bytes] | row ranges [2][R] |
 * their union [2] | the tiles' key scales
 * [2][KT] float | whether each raw block was present [2][KT / 16]
 * (no static shared memory: smem() is the whole, and its start keeps the
 * 1024-byte alignment the warpgroup-MMA tiles need).  The tiles are
 * swizzled by row (swz) for ldmatrix, or in the warpgroup-MMA layout
 * (wgt_off) where WG.  Rotated outputs pass through float rows over the
 * K / V tiles, SR rows at a time. */
template <int NW, bool WG>
struct pf_geom
{
	/* keys per tile: the warpgroup kernel's 48 are the most whose raw
	 * bytes still fit twice beside the tiles (64 would fit them once, and
	 * wait for each tile's bytes: 244 us a sliding layer at 2k, run 128) */
	static constexpr int KT = WG ? 48 : 32;
	static constexpr int PB = KT / G4_KV_BLOCK_TOKENS;	/* pool blocks per tile */
	static constexpr int NTH = 32 * NW;
	static constexpr int R = 16 * NW;
	static constexpr int Q_BYTES = R * PF_HD * 2;
	static constexpr int TILE_BYTES = KT * PF_HD * 2;	/* K or V */
	static constexpr int KV_BYTES = 2 * 2 * TILE_BYTES;
	static constexpr int SR = KV_BYTES / (PF_HD * 4) < R ? KV_BYTES / (PF_HD * 4) : R;

	__host__ __device__ static int raw_bytes(int hbb)
	{
		return 2 * PB * ((hbb + 15) / 16 * 16);
	}
	__host__ __device__ static int smem(int hbb)
	{
		return Q_BYTES + KV_BYTES + raw_bytes(hbb) + R * 8 + 16 + 2 * KT * 4 + 2 * PB * 4;
	}
	/* byte offset of element (key j, dim d) in a K or V tile */
	__device__ static int kv_off(int j, int d)
	{
		if constexpr (WG)
			return wgt_off<KT>(j, d);
		else
			return swz<PF_HD>(j, d);
	}
};

/* Start copying the raw pool blocks of key tile `kt` that meet [ks, ke)
 * into `raw` (one cp.async group per thread); missing blocks are flagged in
 * the status, and in `present` for the decoding (read after a barrier). */
template <class G>
__device__ __forceinline__ void
pf_stage_tile(const attn_args &a, int slot, int g, int kt, int ks, int ke, uint8_t *raw, int hbb_pad, int *present)
{
	int			hbb = (int) a.head_block_bytes;

#pragma unroll
	for (int pb = 0; pb < G::PB; pb++)
	{
		int			p0 = (kt * G::PB + pb) * G4_KV_BLOCK_TOKENS;
		const uint8_t *hb;

		if (p0 >= ke || p0 + G4_KV_BLOCK_TOKENS <= ks)
			continue;			/* outside the range: never read, may be freed */
		hb = kv_head_block(a, slot, p0, g);
		if (threadIdx.x == 0)
			present[pb] = hb != NULL;
		if (!hb)
		{
			if (threadIdx.x == 0)
				atomicOr(a.status, G4C_STATUS_KV_MISSING);
			continue;
		}
		for (int i = threadIdx.x; i < hbb / 16; i += G::NTH)
			g4c_cp_async16(raw + pb * hbb_pad + i * 16, hb + i * 16, true);
	}
	g4c_cp_async_commit();
}

/* Eight turboquant elements of one key from its raw block: the key codes
 * as exact f16 (the key's scale multiplies its scores instead: pf_softmax)
 * and the values (2c - 15) · scale, each one rounding of the exact product
 * as g4_kv_v4_value then f16 would give, clamped to the f16 range as
 * g4c_pack_f16 clamps.  f16 arithmetic on pairs: 1024 + 2c (0x6400 | 2c)
 * less 1039 is 2c - 15 exactly. */
__device__ __forceinline__ void
pf_decode_tq8(const uint8_t *hb, int off, int d, uint4 *k, uint4 *v)
{
	const int	G = g4_kv_v4_group(PF_HD);
	uint2		kw = *reinterpret_cast<const uint2 *>(hb + (size_t) off * PF_HD + d);
	uint32_t	vw = *reinterpret_cast<const uint32_t *>(hb + g4_kv_tq_v_off(PF_HD) + (size_t) off * (PF_HD / 2) + d / 2);
	uint16_t	vs = *reinterpret_cast<const uint16_t *>(hb + g4_kv_tq_vscale_off(PF_HD) + (size_t) off * (PF_HD / G) * 2 + (size_t) (d / G) * 2);
	__half2		s2 = __half2half2(__ushort_as_half(vs));
	const __half2 bias = __half2half2(__ushort_as_half(0x640f));	/* 1039 */
	const __half2 top = __half2half2(__ushort_as_half(0x7bff));	/* 65504 */
	uint32_t	lo2 = (vw << 1) & 0x1e1e1e1eu,	/* 2c of each byte's low nibble */
				hi2 = (vw >> 3) & 0x1e1e1e1eu;	/* and of its high nibble */
	uint32_t	pv[4];

	kw.x ^= 0x80808080u;
	kw.y ^= 0x80808080u;
	*k = make_uint4(i8x2_to_f16x2(kw.x, 0x4140u), i8x2_to_f16x2(kw.x, 0x4342u),
					i8x2_to_f16x2(kw.y, 0x4140u), i8x2_to_f16x2(kw.y, 0x4342u));
#pragma unroll
	for (int e = 0; e < 4; e++)
	{
		/* elements 2e, 2e + 1: byte e's low then high nibble */
		uint32_t	h = (__byte_perm(lo2, hi2, (uint32_t) (e | ((4 + e) << 8))) & 0x00ff00ffu) | 0x64006400u;
		__half2		x = __hmul2(__hsub2(*reinterpret_cast<__half2 *>(&h), bias), s2);

		x = __hmin2(__hmax2(x, __hneg2(top)), top);
		pv[e] = *reinterpret_cast<uint32_t *>(&x);
	}
	*v = make_uint4(pv[0], pv[1], pv[2], pv[3]);
}

/* Decode key tile `kt` from its raw blocks into f16 K and V tiles (G's
 * layout), and for turboquant each key's scale into ksc: warp w takes keys
 * w + NW·u for u in [U0, U1) (all of them by default; the warpgroup kernel
 * decodes a tile in two halves around its products); a lane 8 consecutive
 * dims of each.  Keys outside [ks, ke) or in missing blocks become zeros,
 * with scale 0 (see tc_store_block: a masked probability of 0 times a NaN
 * is still NaN). */
template <int DT, class G, int U0 = 0, int U1 = G::KT / (G::NTH / 32)>
__device__ __forceinline__ void
pf_decode_tile(int kt, int ks, int ke, const uint8_t *raw, int hbb_pad, const int *present, unsigned char *Kt,
			   unsigned char *Vt, float *ksc)
{
	constexpr int NW = G::NTH / 32;
	int			lane = threadIdx.x & 31;
	int			warp = threadIdx.x >> 5;

	static_assert(32 * 8 == PF_HD, "a warp's lanes decode a key's dims, 8 each");
#pragma unroll
	for (int u = U0; u < U1; u++)
	{
		int			j = warp + NW * u;
		int			p = kt * G::KT + j;
		const uint8_t *hb = raw + (j / G4_KV_BLOCK_TOKENS) * hbb_pad;
		int			off = j % G4_KV_BLOCK_TOKENS;
		bool		live = p >= ks && p < ke && present[j / G4_KV_BLOCK_TOKENS];
		int			d = 8 * lane;
		float		kx[8],
					vx[8];

		if (DT == G4_KV_TURBOQUANT_K8V4)
		{
			uint4		k = make_uint4(0, 0, 0, 0),
						v = make_uint4(0, 0, 0, 0);

			if (live)
				pf_decode_tq8(hb, off, d, &k, &v);
			if (lane == 0)
				ksc[j] = live ? g4_f16_to_f32(*reinterpret_cast<const uint16_t *>(hb + g4_kv_tq_kscale_off(PF_HD) + 2 * off)) : 0.0f;
			*reinterpret_cast<uint4 *>(Kt + G::kv_off(j, d)) = k;
			*reinterpret_cast<uint4 *>(Vt + G::kv_off(j, d)) = v;
			continue;
		}
		if (!live)
		{
#pragma unroll
			for (int e = 0; e < 8; e++)
				kx[e] = vx[e] = 0.0f;
		}
		else
		{
			decode_elems<DT, 8>(hb, off, PF_HD, d, true, false, kx);
			decode_elems<DT, 8>(hb, off, PF_HD, d, false, false, vx);
		}
		put8_f16(Kt + G::kv_off(j, d), kx);
		put8_f16(Vt + G::kv_off(j, d), vx);
	}
}

/* Scores of a warp's 16 rows (Qw: their f16 rows) against the tile's KT
 * keys: s[n][·] is the m16n8 accumulator of keys 8n .. 8n + 7. */
template <int KT>
__device__ __forceinline__ void
pf_scores(const unsigned char *Qw, const unsigned char *Kt, float s[KT / 8][4])
{
	int			lane = threadIdx.x & 31;

#pragma unroll
	for (int n = 0; n < KT / 8; n++)
		s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
	for (int k = 0; k < PF_HD / 16; k++)
	{
		uint32_t	af[4];

		g4c_ldmatrix_x4(af, Qw + swz<PF_HD>(lane & 15, 16 * k + 8 * (lane >> 4)));
#pragma unroll
		for (int n = 0; n < KT / 16; n++)
		{
			uint32_t	bf[4];

			g4c_ldmatrix_x4(bf, Kt + swz<PF_HD>(16 * n + (lane & 7) + ((lane >> 4) << 3), 16 * k + 8 * ((lane >> 3) & 1)));
			g4c_mma_f16(s[2 * n], af, bf[0], bf[1]);
			g4c_mma_f16(s[2 * n + 1], af, bf[2], bf[3]);
		}
	}
}

/* Online softmax of one tile's scores (keys k0 ..): scale (by the keys'
 * own scales too where ksc is not NULL), mask each row to its keys [lo, hi)
 * (rows gr and gr + 8 of the warp), update the running max m and sum l,
 * rescale O where a row's max moved, and leave the probabilities in s. */
template <int KT>
__device__ __forceinline__ void
pf_softmax(float s[KT / 8][4], int k0, float scale, const float *ksc, const int lo[2], const int hi[2], float m[2],
		   float l[2], float o[PF_HD / 8][4])
{
	int			tq = threadIdx.x & 3;
	float		corr[2];

#pragma unroll
	for (int n = 0; n < KT / 8; n++)
	{
		float2		kf = ksc ? *reinterpret_cast<const float2 *>(ksc + 8 * n + 2 * tq) : make_float2(1.0f, 1.0f);

#pragma unroll
		for (int e = 0; e < 4; e++)
		{
			int			h = e >> 1;
			int			kp = k0 + 8 * n + 2 * tq + (e & 1);

			s[n][e] = (kp < lo[h] || kp >= hi[h]) ? -INFINITY : s[n][e] * (e & 1 ? kf.y : kf.x) * scale;
		}
	}
#pragma unroll
	for (int h = 0; h < 2; h++)
	{
		float		mx = -INFINITY,
					mnew,
					sum = 0.0f;

#pragma unroll
		for (int n = 0; n < KT / 8; n++)
			mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
		mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
		mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
		mnew = fmaxf(m[h], mx);
		corr[h] = mnew == -INFINITY ? 1.0f : __expf(m[h] - mnew);
		m[h] = mnew;
#pragma unroll
		for (int n = 0; n < KT / 8; n++)
#pragma unroll
			for (int e = 2 * h; e < 2 * h + 2; e++)
			{
				s[n][e] = mnew == -INFINITY ? 0.0f : __expf(s[n][e] - mnew);
				sum += s[n][e];
			}
		sum += __shfl_xor_sync(0xffffffffu, sum, 1);
		sum += __shfl_xor_sync(0xffffffffu, sum, 2);
		l[h] = l[h] * corr[h] + sum;
	}
	/* a factor of 1 changes nothing: once the rows' maxima settle, most
	 * tiles skip the 128 multiplications */
	if (__all_sync(0xffffffffu, corr[0] == 1.0f && corr[1] == 1.0f))
		return;
#pragma unroll
	for (int i = 0; i < PF_HD / 8; i++)
	{
		o[i][0] *= corr[0];
		o[i][1] *= corr[0];
		o[i][2] *= corr[1];
		o[i][3] *= corr[1];
	}
}

/* O += P·V over the tile's keys (P as f16 A fragments, V by transposed
 * ldmatrix). */
template <int KT>
__device__ __forceinline__ void
pf_accumulate(const float s[KT / 8][4], const unsigned char *Vt, float o[PF_HD / 8][4])
{
	int			lane = threadIdx.x & 31;

#pragma unroll
	for (int k = 0; k < KT / 16; k++)
	{
		uint32_t	pf[4];

		pf[0] = g4c_pack_f16(s[2 * k][0], s[2 * k][1]);
		pf[1] = g4c_pack_f16(s[2 * k][2], s[2 * k][3]);
		pf[2] = g4c_pack_f16(s[2 * k + 1][0], s[2 * k + 1][1]);
		pf[3] = g4c_pack_f16(s[2 * k + 1][2], s[2 * k + 1][3]);
#pragma unroll
		for (int i = 0; i < PF_HD / 8; i += 2)
		{
			uint32_t	vf[4];

			g4c_ldmatrix_x4_trans(vf, Vt + swz<PF_HD>(16 * k + (lane & 7) + (((lane >> 3) & 1) << 3), 8 * i + 8 * (lane >> 4)));
			g4c_mma_f16(o[i], pf, vf[0], vf[1]);
			g4c_mma_f16(o[i + 1], pf, vf[2], vf[3]);
		}
	}
}

/* The block's shared memory, carved as pf_geom describes. */
template <class G>
struct pf_smem
{
	unsigned char *Qs;
	unsigned char *KV;			/* [buffer][K, V][tile] */
	uint8_t    *raw;			/* [buffer][block][bytes] */
	int		   *rlo,
			   *rhi,
			   *kr;				/* the rows' union, [2] */
	float	   *ksc;			/* [buffer][KT] */
	int		   *present;		/* [buffer][PB] */
	int			hbb_pad;		/* a raw block's bytes, 16-byte aligned */

	__device__ pf_smem(unsigned char *base, int hbb)
	{
		hbb_pad = (hbb + 15) / 16 * 16;
		Qs = base;
		KV = base + G::Q_BYTES;
		raw = KV + G::KV_BYTES;
		rlo = reinterpret_cast<int *>(raw + G::raw_bytes(hbb));
		rhi = rlo + G::R;
		kr = rhi + G::R;
		ksc = reinterpret_cast<float *>(kr + 4);
		present = reinterpret_cast<int *>(ksc + 2 * G::KT);
	}
	/* raw buffer b's blocks, and whether each was present */
	__device__ uint8_t *raw_buf(int b) const
	{
		return raw + b * G::PB * hbb_pad;
	}
	__device__ int *present_buf(int b) const
	{
		return present + b * G::PB;
	}
};

/* This lane's two rows (16·warp + gr, + 8) within the split's keys
 * [ks, ke). */
__device__ __forceinline__ void
pf_lane_rows(const int *rlo, const int *rhi, int ks, int ke, int lo[2], int hi[2])
{
	int			r0 = 16 * (threadIdx.x >> 5) + ((threadIdx.x & 31) >> 2);

#pragma unroll
	for (int h = 0; h < 2; h++)
	{
		lo[h] = max(rlo[r0 + 8 * h], ks);
		hi[h] = min(rhi[r0 + 8 * h], ke);
	}
}

/* The union of the warp's rows' ranges (INT32_MAX, INT32_MIN when empty)
 * into *wlo, *whi. */
__device__ __forceinline__ void
pf_warp_union(const int lo[2], const int hi[2], int *wlo, int *whi)
{
	int			ulo = hi[0] > lo[0] ? lo[0] : INT32_MAX,
				uhi = hi[0] > lo[0] ? hi[0] : INT32_MIN;

	if (hi[1] > lo[1])
	{
		ulo = min(ulo, lo[1]);
		uhi = max(uhi, hi[1]);
	}
#pragma unroll
	for (int x = 4; x < 32; x <<= 1)
	{
		ulo = min(ulo, __shfl_xor_sync(0xffffffffu, ulo, x));
		uhi = max(uhi, __shfl_xor_sync(0xffffffffu, uhi, x));
	}
	*wlo = ulo;
	*whi = uhi;
}

/* The block's rows (token tile, KV head) and this split's keys [ks, ke). */
struct pf_block
{
	int			t0,
				ntok,
				g,
				split,
				slot,
				ks,
				ke;
};

/* The start of both kernels: the block's coordinates, its rows' key ranges
 * (sm.rlo, sm.rhi) and the split's keys, and the first two key tiles' raw
 * bytes requested (two cp.async groups, or one or none for shorter
 * ranges): they travel while the queries are prepared. */
template <class G>
__device__ __forceinline__ pf_block
pf_begin(const attn_args &a, const pf_smem<G> &sm)
{
	constexpr int KT = G::KT;
	int			tile = blockIdx.x / a.n_kv;
	pf_block	blk;

	blk.g = blockIdx.x % a.n_kv;
	blk.split = blockIdx.y;
	blk.t0 = a.tiles[tile];
	blk.ntok = a.tiles[tile + 1] - blk.t0;
	blk.slot = a.slot[blk.t0];
	g4c_pdl_trigger();
	g4c_pdl_wait();
	tile_row_ranges(a, blk.t0, blk.ntok, G::R, sm.rlo, sm.rhi, sm.kr);
	__syncthreads();
	split_range(sm.kr[0], sm.kr[1], a.S, blk.split, KT, &blk.ks, &blk.ke);
	if (blk.ks < blk.ke)
	{
		pf_stage_tile<G>(a, blk.slot, blk.g, blk.ks / KT, blk.ks, blk.ke, sm.raw_buf(0), sm.hbb_pad, sm.present_buf(0));
		if ((blk.ke - 1) / KT > blk.ks / KT)
			pf_stage_tile<G>(a, blk.slot, blk.g, blk.ks / KT + 1, blk.ks, blk.ke, sm.raw_buf(1), sm.hbb_pad,
							 sm.present_buf(1));
	}
	return blk;
}

/* The split's first key tile decoded into K / V buffer 0, once its raw
 * bytes (pf_begin's first group) and the queries are in. */
template <int DT, class G>
__device__ __forceinline__ void
pf_first_tile(const pf_block &blk, const pf_smem<G> &sm)
{
	if ((blk.ke - 1) / G::KT > blk.ks / G::KT)
		g4c_cp_async_wait<1>();
	else
		g4c_cp_async_wait<0>();
	__syncthreads();
	pf_decode_tile<DT, G>(blk.ks / G::KT, blk.ks, blk.ke, sm.raw_buf(0), sm.hbb_pad, sm.present_buf(0), sm.KV,
						  sm.KV + G::TILE_BYTES, sm.ksc);
}

/* The epilogue: this warp's rows 16·warp + gr (+8), dims 8i + 2tq (+1),
 * as this split's partial for attn_merge_kernel, or normalised into the
 * output (through float rows over the K / V tiles and rotated back where
 * ROT).  The caller's products are complete. */
template <class G, bool ROT>
__device__ __forceinline__ void
pf_store(const attn_args &a, const float o[PF_HD / 8][4], const float m[2], const float l[2], const pf_block &blk,
		 unsigned char *KV)
{
	constexpr int QP = ROT ? G::R / G::SR : 1;	/* output passes through the float rows */
	constexpr int PR = G::R / QP;	/* rows per pass */
	float	   *stage = reinterpret_cast<float *>(KV);
	int			lane = threadIdx.x & 31;
	int			rg = threadIdx.x >> 5;
	int			gr = lane >> 2,
				tq = lane & 3;

	if (a.S > 1)
	{
		float	   *part = a.partial + ((size_t) blockIdx.x * a.S + blk.split) * G::R * (PF_HD + 2);

#pragma unroll
		for (int h = 0; h < 2; h++)
		{
			float	   *pr = part + (size_t) (16 * rg + gr + 8 * h) * (PF_HD + 2);

			if (tq == 0)
			{
				pr[0] = m[h];
				pr[1] = l[h];
			}
#pragma unroll
			for (int i = 0; i < PF_HD / 8; i++)
				*reinterpret_cast<float2 *>(pr + 2 + 8 * i + 2 * tq) = make_float2(o[i][2 * h], o[i][2 * h + 1]);
		}
		return;					/* attn_merge_kernel finishes */
	}
	for (int pass = 0; pass < QP; pass++)
	{
		int			r0 = pass * PR;
		row_map		map = {a.out, a.out_stride, blk.t0 + r0 / a.gq, blk.ntok - r0 / a.gq, a.gq, blk.g, PF_HD};

		if (ROT)
			__syncthreads();	/* the float rows lie over tiles still in use */
#pragma unroll
		for (int h = 0; h < 2; h++)
		{
			int			r = 16 * rg + gr + 8 * h - r0;
			float		inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
			float	   *dst;

			if (r < 0 || r >= PR)
				continue;
			dst = ROT ? stage + (size_t) r * PF_HD : map.row(r);
			if (!dst)
				continue;
#pragma unroll
			for (int i = 0; i < PF_HD / 8; i++)
				*reinterpret_cast<float2 *>(dst + 8 * i + 2 * tq) = make_float2(o[i][2 * h] * inv, o[i][2 * h + 1] * inv);
		}
		if (ROT)
		{
			__syncthreads();
			/* turboquant values were rotated: undo once per row */
			tile_store_rotated<PF_HD>(stage, PR, map);
		}
	}
}

template <int DT, int NW>
__global__ void __launch_bounds__(32 * NW, 1)
attn_prefill_kernel(attn_args a)
{
	using G = pf_geom<NW, false>;
	constexpr int KT = G::KT;
	extern __shared__ __align__(1024) unsigned char sm_raw[];
	pf_smem<G>	sm(sm_raw, (int) a.head_block_bytes);
	pf_block	blk = pf_begin<G>(a, sm);
	int			ks = blk.ks,
				ke = blk.ke;
	float		o[PF_HD / 8][4] = {};
	float		m[2] = {-INFINITY, -INFINITY},
				l[2] = {0.0f, 0.0f};

	tile_queries_f16<PF_HD>(a, blk.t0, blk.ntok, blk.g, G::R, DT == G4_KV_TURBOQUANT_K8V4, sm.Qs);

	if (ks < ke)
	{
		int			kt0 = ks / KT,
					kt1 = (ke - 1) / KT;
		int			lo[2],
					hi[2],
					wlo,
					whi;
		const unsigned char *Qw = sm.Qs + swz<PF_HD>(16 * (threadIdx.x >> 5), 0);

		pf_lane_rows(sm.rlo, sm.rhi, ks, ke, lo, hi);
		pf_warp_union(lo, hi, &wlo, &whi);
		pf_first_tile<DT, G>(blk, sm);
		for (int kt = kt0; kt <= kt1; kt++)
		{
			int			b = (kt - kt0) & 1;
			unsigned char *Kt = sm.KV + b * 2 * G::TILE_BYTES;
			unsigned char *Kn = sm.KV + (1 - b) * 2 * G::TILE_BYTES;

			/* after this barrier: tile kt is decoded, tile kt + 1's bytes
			 * have arrived, and every warp is done with tile kt - 1's K / V
			 * and tile kt's raw bytes */
			g4c_cp_async_wait<0>();
			__syncthreads();
			if (kt + 2 <= kt1)
				pf_stage_tile<G>(a, blk.slot, blk.g, kt + 2, ks, ke, sm.raw_buf(b), sm.hbb_pad, sm.present_buf(b));
			if (kt + 1 <= kt1)
				pf_decode_tile<DT, G>(kt + 1, ks, ke, sm.raw_buf(1 - b), sm.hbb_pad, sm.present_buf(1 - b), Kn,
									  Kn + G::TILE_BYTES, sm.ksc + (1 - b) * KT);
			/* a warp whose rows see none of this tile's keys skips it */
			if (kt * KT < whi && (kt + 1) * KT > wlo)
			{
				float		s[KT / 8][4];

				pf_scores<KT>(Qw, Kt, s);
				pf_softmax<KT>(s, kt * KT, a.scale, DT == G4_KV_TURBOQUANT_K8V4 ? sm.ksc + b * KT : NULL, lo, hi, m, l, o);
				pf_accumulate<KT>(s, Kt + G::TILE_BYTES, o);
			}
		}
	}
	pf_store<G, DT == G4_KV_TURBOQUANT_K8V4>(a, o, m, l, blk, sm.KV);
}

/*
 * The warpgroup-MMA kernel (turboquant pools, sm_90a).  Warpgroup w owns
 * rows 64w .. 64w + 63; per 48-key tile kt (buffer b):
 *   1. barrier: tile kt is decoded, tile kt + 1's raw bytes have arrived,
 *      every warpgroup is done with tile kt - 1; tile kt + 2's raw bytes
 *      are requested into the buffer tile kt's left;
 *   2. S = Q·Kᵀ: 16 wgmmas (k16 steps over head_dim), one group;
 *   3. the first half of tile kt + 1's keys decoded while they run;
 *   4. softmax on S (pf_softmax: S's accumulator is the m16n8 layout, key
 *      scales and masks as the mma.sync kernel), P as f16 A fragments;
 *   5. O += P·V: 12 wgmmas (3 k16 steps of keys × 4 blocks of 64 dims,
 *      V read MN-major), one group;
 *   6. the second half of tile kt + 1 decoded while they run, then the
 *      wait for O.
 * Every warpgroup multiplies every tile of the split's range: a branch
 * around a wgmma makes ptxas serialise all of them, and its rows' masks
 * zero the keys they do not see.
 */
template <int DT>
__global__ void __launch_bounds__(256, 1)
attn_prefill_wgmma_kernel(attn_args a)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
	using G = pf_geom<8, true>;
	constexpr int KT = G::KT;
	constexpr int NW = 8;
	constexpr int HALF = KT / NW / 2;	/* key units per warp in each decoding half */
	extern __shared__ __align__(1024) unsigned char sm_raw[];
	pf_smem<G>	sm(sm_raw, (int) a.head_block_bytes);
	uint32_t	s_q = (uint32_t) __cvta_generic_to_shared(sm.Qs) + (threadIdx.x >> 7) * 64 * 128;
	uint32_t	s_kv = (uint32_t) __cvta_generic_to_shared(sm.KV);
	pf_block	blk = pf_begin<G>(a, sm);
	int			ks = blk.ks,
				ke = blk.ke;
	float		o[PF_HD / 8][4] = {};
	float		m[2] = {-INFINITY, -INFINITY},
				l[2] = {0.0f, 0.0f};

	static_assert(KT % 16 == 0 && HALF * 2 * NW == KT, "tiles of k16 steps, decoded in two halves");
	tile_queries_f16<PF_HD, G::R>(a, blk.t0, blk.ntok, blk.g, G::R, true, sm.Qs);
	wg_fence_proxy();

	if (ks < ke)
	{
		int			kt0 = ks / KT,
					kt1 = (ke - 1) / KT;
		int			lo[2],
					hi[2];

		pf_lane_rows(sm.rlo, sm.rhi, ks, ke, lo, hi);
		pf_first_tile<DT, G>(blk, sm);
		wg_fence_proxy();
		for (int kt = kt0; kt <= kt1; kt++)
		{
			int			b = (kt - kt0) & 1;
			uint32_t	s_k = s_kv + b * 2 * G::TILE_BYTES,
						s_v = s_k + G::TILE_BYTES;
			unsigned char *Kn = sm.KV + (1 - b) * 2 * G::TILE_BYTES;
			const uint8_t *rn = sm.raw_buf(1 - b);
			const int  *pn = sm.present_buf(1 - b);
			float	   *ksn = sm.ksc + (1 - b) * KT;
			bool		next = kt + 1 <= kt1;
			float		s[KT / 8][4];
			uint32_t	pf[KT / 16][4];

			g4c_cp_async_wait<0>();
			__syncthreads();
			if (kt + 2 <= kt1)
				pf_stage_tile<G>(a, blk.slot, blk.g, kt + 2, ks, ke, sm.raw_buf(b), sm.hbb_pad, sm.present_buf(b));
			wg_fence();
#pragma unroll
			for (int st = 0; st < PF_HD / 16; st++)
				wg_mma_f16_ss48(&s[0][0], wg_desc(s_q + (st >> 2) * G::R * 128 + (st & 3) * 32),
								wg_desc(s_k + (st >> 2) * KT * 128 + (st & 3) * 32), st > 0);
			wg_commit();
			if (next)
				pf_decode_tile<DT, G, 0, HALF>(kt + 1, ks, ke, rn, sm.hbb_pad, pn, Kn, Kn + G::TILE_BYTES, ksn);
			wg_wait<0>();
			wg_fence_regs(&s[0][0], KT / 2);
			pf_softmax<KT>(s, kt * KT, a.scale, sm.ksc + b * KT, lo, hi, m, l, o);
#pragma unroll
			for (int k = 0; k < KT / 16; k++)
			{
				pf[k][0] = g4c_pack_f16(s[2 * k][0], s[2 * k][1]);
				pf[k][1] = g4c_pack_f16(s[2 * k][2], s[2 * k][3]);
				pf[k][2] = g4c_pack_f16(s[2 * k + 1][0], s[2 * k + 1][1]);
				pf[k][3] = g4c_pack_f16(s[2 * k + 1][2], s[2 * k + 1][3]);
			}
			wg_fence();
#pragma unroll
			for (int k = 0; k < KT / 16; k++)
#pragma unroll
				for (int db = 0; db < PF_HD / 64; db++)
					wg_mma_f16_rs64_mn(&o[8 * db][0], pf[k], wg_desc_mn(s_v + db * KT * 128 + k * 16 * 128), 1);
			wg_commit();
			if (next)
			{
				pf_decode_tile<DT, G, HALF, 2 * HALF>(kt + 1, ks, ke, rn, sm.hbb_pad, pn, Kn, Kn + G::TILE_BYTES, ksn);
				wg_fence_proxy();
			}
			wg_wait<0>();
			wg_fence_regs(&o[0][0], PF_HD / 2);
		}
	}
	pf_store<G, true>(a, o, m, l, blk, sm.KV);
#endif
}

template <int NW>
static attn_kernel_fn
prefill_kernel_for(int dtype, int hbb, int *rows, int *threads, int *smem)
{
	using G = pf_geom<NW, false>;

	*rows = G::R;
	*threads = G::NTH;
	*smem = G::smem(hbb);
	switch (dtype)
	{
		case G4_KV_F32:
			return attn_prefill_kernel<G4_KV_F32, NW>;
		case G4_KV_BF16:
			return attn_prefill_kernel<G4_KV_BF16, NW>;
		default:
			return attn_prefill_kernel<G4_KV_TURBOQUANT_K8V4, NW>;
	}
}

/* The kernel for this geometry, or NULL (head_dim other than 256, k_eq_v
 * layers), with its query rows per block, threads and shared memory;
 * wgmma: the device runs the sm_90a kernels (g4c_wgmma_probe). */
attn_kernel_fn
g4c_attention_prefill_kernel(int hd, int k_eq_v, int dtype, int gq, int wgmma, int *rows, int *threads, int *smem)
{
	int			hbb = (int) g4_kv_head_block_bytes(dtype, hd, k_eq_v);

	if (hd != PF_HD || k_eq_v || gq > 16 || 16 % gq != 0)
		return NULL;
	if (wgmma && dtype == G4_KV_TURBOQUANT_K8V4 && gq >= 2)
	{
		using G = pf_geom<8, true>;

		*rows = G::R;
		*threads = G::NTH;
		*smem = G::smem(hbb);
		return attn_prefill_wgmma_kernel<G4_KV_TURBOQUANT_K8V4>;
	}
	/* 128 rows (8 warps) halve the decoding per row where the shared memory
	 * holds them (not float32 pools: 224 KiB for 64 rows) and a tile's
	 * tokens are at most 64 */
	return dtype != G4_KV_F32 && gq >= 2 ? prefill_kernel_for<8>(dtype, hbb, rows, threads, smem)
		: prefill_kernel_for<4>(dtype, hbb, rows, threads, smem);
}
