/*
 * attention_decode.cu — attention of one query token per block over the
 * turboquant_k8v4 pool (decode), on tensor cores with the keys as the MMA's
 * rows, so that a sequence's gq query heads fill the 8 columns and no row of
 * the 16-row MMA is wasted on absent tokens.
 *
 * A block takes one (token, KV head, split); each of its four warps walks
 * its own 16-key pool blocks (warp w: blocks w, w + 4, ...) with its own
 * online softmax, without block-wide barriers, and the four states are
 * merged once at the end.  Per pool block a warp computes
 *   Sᵀ[key][row] = K8 · Qᵀ      (16 keys × head_dim, int8 codes made f16
 *                                exactly; the key scale applied to the 16
 *                                scores, not to the 4,096 elements)
 *   Oᵀ[dim][row] += V · Pᵀ      (V = (2c − 15)·scale rounded to f16, as the
 *                                tensor-core kernel rounds it)
 * Each thread loads its fragments straight from the pool (no staging in
 * shared memory): the MMA's reduction index is free to map onto any head
 * dims, so it is mapped onto contiguous bytes — thread tq of a quad owns
 * key bytes [HD/4·tq, +HD/4), thread gr of a column owns value bytes
 * [HD/16·gr, +HD/16) — and every load is a 16-byte vector.
 *
 * Queries, probabilities and values are f16 with float32 accumulation and
 * softmax: the tensor-core kernel's precision class.  Splits write the
 * partial format attn_merge_kernel combines (attention.cu).
 */
#include "attention.cuh"

#define DEC_WARPS 4
#define DEC_CHAINS 2			/* score accumulators per pool block (dec_scores) */

template <int HD>
struct dec_geom
{
	static_assert(HD % 64 == 0 && HD / 8 <= G4_KV_V4_GROUP_MAX, "a thread's values lie in one scale group");
	static constexpr int KSTEPS = HD / 16;	/* MMA k-steps of q·k */
	static constexpr int KWORDS = HD / 16;	/* key words per thread per key: HD/4 bytes */
	static constexpr int MT = HD / 16;	/* output m-tiles (16 dims each) */
	static constexpr int VWORDS = HD / 64;	/* value words per thread per key: HD/16 bytes */
	static constexpr int G = HD < G4_KV_V4_GROUP_MAX ? HD : G4_KV_V4_GROUP_MAX;
};

/* The bytes one thread needs of one pool block: keys gr and gr + 8, values
 * of keys 2tq, 2tq + 1, 2tq + 8, 2tq + 9, and their scales (f16 bits). */
template <int HD>
struct dec_raw
{
	uint32_t	k[2][dec_geom<HD>::KWORDS];
	uint32_t	v[4][dec_geom<HD>::VWORDS];
	uint16_t	ks[2];
	uint16_t	vs[4];
};

template <int HD>
__device__ __forceinline__ void
dec_load(const uint8_t *hb, int gr, int tq, dec_raw<HD> &r)
{
	using G = dec_geom<HD>;

#pragma unroll
	for (int h = 0; h < 2; h++)
	{
		int			key = gr + 8 * h;

		load_bytes<HD / 4>(hb + (size_t) key * HD + (HD / 4) * tq, reinterpret_cast<uint8_t *>(r.k[h]));
		r.ks[h] = *reinterpret_cast<const uint16_t *>(hb + g4_kv_tq_kscale_off(HD) + 2 * key);
	}
#pragma unroll
	for (int j = 0; j < 4; j++)
	{
		int			key = 2 * tq + (j & 1) + 8 * (j >> 1);

		load_bytes<HD / 16>(hb + g4_kv_tq_v_off(HD) + (size_t) key * (HD / 2) + (HD / 16) * gr,
							reinterpret_cast<uint8_t *>(r.v[j]));
		r.vs[j] = *reinterpret_cast<const uint16_t *>(hb + g4_kv_tq_vscale_off(HD) + (size_t) key * (HD / G::G) * 2 +
													  (size_t) ((HD / 8) * gr / G::G) * 2);
	}
}

/* Value codes as the f16 pair (2c − 15)·scale, from the nibbles at bits
 * 4..7 of each half: 0x6400 | 16c is 1024 + 16c, and 1024 + 16c times 1/8
 * minus 143 is 2c − 15 exactly (one FMA of exact terms), then one rounding
 * in the product.  Taking the nibbles where they need no shift into bits
 * 1..4 leaves three shifts per word for its four nibbles, and one LOP3 per
 * pair with the magic in a register: 3.75 instructions per pair, not 5. */
__device__ __forceinline__ uint32_t
v4x2_to_f16x2(uint32_t nibbles_at_4, __half2 scale)
{
	uint32_t	h;
	__half2		x;

	asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(h) : "r"(nibbles_at_4), "n"(0x00F000F0), "r"(0x64006400u));
	x = __hfma2(*reinterpret_cast<__half2 *>(&h), __half2half2(__ushort_as_half(0x3000)),	/* 1/8 */
				__half2half2(__ushort_as_half(0xD878)));	/* -143 */
	x = __hmul2(x, scale);
	return *reinterpret_cast<uint32_t *>(&x);
}

__device__ __forceinline__ __half2
half2_of_bits(uint16_t lo, uint16_t hi)
{
	uint32_t	b = (uint32_t) lo | ((uint32_t) hi << 16);

	return *reinterpret_cast<__half2 *>(&b);
}

/* One warp's attention state: per row 2tq + c, the running max and sum,
 * and Oᵀ: o[i][c] = dim HD/8·gr + 2i, o[i][2 + c] = that dim + 1. */
template <int HD>
struct dec_state
{
	float		o[dec_geom<HD>::MT][4];
	float		m[2];
	float		l[2];
};

/* Qᵀ as the B operand: column gr = query row gr (zero past gq), reduction
 * index {2tq, 2tq+1 | 2tq+8, 2tq+9} of step s = dims HD/4·tq + 4s + {0,1 | 2,3};
 * kept in shared memory, entry [s][lane], and read at each k-step: in 32
 * registers they made the 4-blocks-per-SM build spill (at 3, 4, 5 and 6
 * blocks per SM: 96.0, 77.6, 125.0 and 177.1 us per sliding layer at 64
 * sequences, runs 93–94; from shared memory 70.6 at 4, run 95). */
template <int HD>
__device__ __forceinline__ void
dec_query_fragments(const float *qs, int gq, int gr, int tq, int lane, uint2 *qfs)
{
#pragma unroll
	for (int s = 0; s < dec_geom<HD>::KSTEPS; s++)
	{
		const float *qr = qs + gr * HD + (HD / 4) * tq + 4 * s;

		qfs[s * 32 + lane] = make_uint2(gr < gq ? g4c_pack_f16(qr[0], qr[1]) : 0u,
										gr < gq ? g4c_pack_f16(qr[2], qr[3]) : 0u);
	}
}

/* Sᵀ = K8·Qᵀ of one pool block: s[0], s[1] = key gr, rows 2tq, 2tq+1;
 * s[2], s[3] = key gr + 8 (unscaled: times the key's scale later).  The
 * k-steps go to DEC_CHAINS accumulators in turn, added at the end: each
 * MMA waits for the one before it on its accumulator, so one chain of
 * HD/16 was the longest wait of a pool block. */
template <int HD>
__device__ __forceinline__ void
dec_scores(const dec_raw<HD> &r, const uint2 *qfs, int lane, float s[4])
{
	float		acc[DEC_CHAINS][4] = {};

#pragma unroll
	for (int k = 0; k < dec_geom<HD>::KSTEPS; k++)
	{
		uint32_t	w0 = r.k[0][k] ^ 0x80808080u,
					w1 = r.k[1][k] ^ 0x80808080u;
		uint32_t	af[4] = {i8x2_to_f16x2(w0, 0x4140u), i8x2_to_f16x2(w1, 0x4140u),
		i8x2_to_f16x2(w0, 0x4342u), i8x2_to_f16x2(w1, 0x4342u)};

		uint2		q = qfs[k * 32 + lane];

		g4c_mma_f16(acc[k % DEC_CHAINS], af, q.x, q.y);
	}
#pragma unroll
	for (int i = 0; i < 4; i++)
	{
		s[i] = acc[0][i];
#pragma unroll
		for (int c = 1; c < DEC_CHAINS; c++)
			s[i] += acc[c][i];
	}
}

/* Online softmax of rows 2tq + c over the block's 16 keys (held by the 8
 * lanes of column tq): scales and masks the scores, turns them into
 * probabilities p (same layout as s), rescales the state.  The 64 output
 * accumulators are rescaled only when some row of the warp has a new
 * maximum: elsewhere every factor is exactly 1, and after the first few
 * blocks most blocks move no maximum. */
template <int HD>
__device__ __forceinline__ void
dec_softmax(const dec_raw<HD> &r, const float s[4], int pos0, int lo, int hi, float scale, int gr,
			dec_state<HD> &st, float p[4])
{
	float		corr[2];

#pragma unroll
	for (int c = 0; c < 2; c++)
	{
		float		x[2];
		float		mx,
					mnew,
					sum;

#pragma unroll
		for (int h = 0; h < 2; h++)
		{
			int			pos = pos0 + gr + 8 * h;

			x[h] = pos >= lo && pos < hi ? s[2 * h + c] * g4_f16_to_f32(r.ks[h]) * scale : -INFINITY;
		}
		mx = fmaxf(x[0], x[1]);
		mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
		mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
		mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
		mnew = fmaxf(st.m[c], mx);
		corr[c] = mnew == -INFINITY ? 1.0f : __expf(st.m[c] - mnew);
		st.m[c] = mnew;
#pragma unroll
		for (int h = 0; h < 2; h++)
			p[2 * h + c] = mnew == -INFINITY ? 0.0f : __expf(x[h] - mnew);
		sum = p[c] + p[2 + c];
		sum += __shfl_xor_sync(0xffffffffu, sum, 4);
		sum += __shfl_xor_sync(0xffffffffu, sum, 8);
		sum += __shfl_xor_sync(0xffffffffu, sum, 16);
		st.l[c] = st.l[c] * corr[c] + sum;
	}
	if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f))
	{
#pragma unroll
		for (int i = 0; i < dec_geom<HD>::MT; i++)
		{
			st.o[i][0] *= corr[0];
			st.o[i][2] *= corr[0];
			st.o[i][1] *= corr[1];
			st.o[i][3] *= corr[1];
		}
	}
}

/* Pᵀ as the B operand: column gr = row gr; reduction index 2tq, 2tq+1 |
 * 2tq+8, 2tq+9 = keys.  P[key][row] sits in lane (key mod 8)·4 + row/2,
 * entry (row & 1) + 2·(key ≥ 8). */
__device__ __forceinline__ void
dec_transpose_p(const float p[4], int gr, int tq, uint32_t pb[2])
{
	int			src0 = ((2 * tq) << 2) | (gr >> 1),
				src1 = ((2 * tq + 1) << 2) | (gr >> 1);
	float		e[8];

#pragma unroll
	for (int h = 0; h < 4; h++)
	{
		e[h] = __shfl_sync(0xffffffffu, p[h], src0);
		e[4 + h] = __shfl_sync(0xffffffffu, p[h], src1);
	}
	if (gr & 1)
	{
		pb[0] = g4c_pack_f16(e[1], e[5]);
		pb[1] = g4c_pack_f16(e[3], e[7]);
	}
	else
	{
		pb[0] = g4c_pack_f16(e[0], e[4]);
		pb[1] = g4c_pack_f16(e[2], e[6]);
	}
}

/* Oᵀ += V·Pᵀ: m-tile i, row gr = dim HD/8·gr + 2i (the low nibble of the
 * thread's value byte i), row gr + 8 = that dim + 1. */
template <int HD>
__device__ __forceinline__ void
dec_accumulate(const dec_raw<HD> &r, const uint32_t pb[2], dec_state<HD> &st)
{
	__half2		sc01 = half2_of_bits(r.vs[0], r.vs[1]),
				sc89 = half2_of_bits(r.vs[2], r.vs[3]);

#pragma unroll
	for (int i = 0; i < dec_geom<HD>::MT; i += 2)
	{
		int			wd = i / 4,
					bt = (i % 4) / 2;	/* bytes i, i + 1 = byte pair bt of word wd */
		/* bytes [A.b_i, A.b_i+1, B.b_i, B.b_i+1] of key words A, B */
		uint32_t	sel = (uint32_t) (2 * bt) | ((uint32_t) (2 * bt + 1) << 4) |
			((uint32_t) (4 + 2 * bt) << 8) | ((uint32_t) (5 + 2 * bt) << 12);
		uint32_t	x01 = __byte_perm(r.v[0][wd], r.v[1][wd], sel),
					x89 = __byte_perm(r.v[2][wd], r.v[3][wd], sel);
		uint32_t	af[4];

		af[0] = v4x2_to_f16x2(x01 << 4, sc01);
		af[1] = v4x2_to_f16x2(x01, sc01);
		af[2] = v4x2_to_f16x2(x89 << 4, sc89);
		af[3] = v4x2_to_f16x2(x89, sc89);
		g4c_mma_f16(st.o[i], af, pb[0], pb[1]);
		af[0] = v4x2_to_f16x2(x01 >> 4, sc01);
		af[1] = v4x2_to_f16x2(x01 >> 8, sc01);
		af[2] = v4x2_to_f16x2(x89 >> 4, sc89);
		af[3] = v4x2_to_f16x2(x89 >> 8, sc89);
		g4c_mma_f16(st.o[i + 1], af, pb[0], pb[1]);
	}
}

/* The warp's state into its slot of ws: [warp][row][m, l, HD dims]. */
template <int HD>
__device__ __forceinline__ void
dec_store_state(const dec_state<HD> &st, float *ws, int warp, int gq, int gr, int tq)
{
#pragma unroll
	for (int c = 0; c < 2; c++)
	{
		int			row = 2 * tq + c;
		float	   *dst = ws + ((size_t) warp * gq + row) * (HD + 2);

		if (row >= gq)
			continue;
		if (gr == 0)
		{
			dst[0] = st.m[c];
			dst[1] = st.l[c];
		}
#pragma unroll
		for (int i = 0; i < dec_geom<HD>::MT; i++)
		{
			dst[2 + (HD / 8) * gr + 2 * i] = st.o[i][c];
			dst[2 + (HD / 8) * gr + 2 * i + 1] = st.o[i][2 + c];
		}
	}
}

/* MINB: blocks per SM the registers must allow (attn_decode_kernel_for) */
template <int HD, int MINB>
__global__ void __launch_bounds__(DEC_WARPS * 32, MINB)
attn_decode_kernel(attn_args a)
{
	extern __shared__ __align__(16) unsigned char sm_raw[];
	float	   *qs = reinterpret_cast<float *>(sm_raw);	/* [gq][HD]: queries, then the output rows */
	uint2	   *qfs = reinterpret_cast<uint2 *>(qs + a.gq * HD);	/* [KSTEPS][32]: their fragments */
	float	   *ws = reinterpret_cast<float *>(qfs + dec_geom<HD>::KSTEPS * 32);	/* [warps][gq][HD + 2]: the warps' states */
	int			t = blockIdx.x / a.n_kv;
	int			g = blockIdx.x % a.n_kv;
	int			split = blockIdx.y;
	int			lane = threadIdx.x & 31;
	int			warp = threadIdx.x >> 5;
	int			gr = lane >> 2,
				tq = lane & 3;
	int			gq = a.gq;
	int			lo,
				hi,
				slot,
				b_begin,
				b_end;
	dec_state<HD> st;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	lo = a.lo[t];
	hi = a.hi[t];
	slot = a.slot[t];
	for (int i = threadIdx.x; i < gq * HD; i += blockDim.x)
		qs[i] = a.q[(size_t) t * a.q_stride + (size_t) g * gq * HD + i];
	__syncthreads();
	if (a.rotated)
		hadamard_rows<HD>(qs, gq, HD);
	if (warp == 0)
		dec_query_fragments<HD>(qs, gq, gr, tq, lane, qfs);
	__syncthreads();
#pragma unroll
	for (int i = 0; i < dec_geom<HD>::MT; i++)
		st.o[i][0] = st.o[i][1] = st.o[i][2] = st.o[i][3] = 0.0f;
	st.m[0] = st.m[1] = -INFINITY;
	st.l[0] = st.l[1] = 0.0f;
	split_blocks(lo, hi, a.S, split, &b_begin, &b_end);

	for (int b = b_begin + warp; b < b_end; b += DEC_WARPS)
	{
		const uint8_t *hb = kv_head_block(a, slot, b * G4_KV_BLOCK_TOKENS, g);
		dec_raw<HD> r;
		float		s[4],
					p[4];
		uint32_t	pb[2];

		if (!hb)
		{
			if (lane == 0)
				atomicOr(a.status, G4C_STATUS_KV_MISSING);
			continue;
		}
		dec_load<HD>(hb, gr, tq, r);
		/* positions outside [lo, hi) may hold anything (never written, or
		 * left by a finished sequence): a zero scale makes their values 0,
		 * since a probability of 0 times a NaN value would still be NaN */
#pragma unroll
		for (int j = 0; j < 4; j++)
		{
			int			pos = b * G4_KV_BLOCK_TOKENS + 2 * tq + (j & 1) + 8 * (j >> 1);

			if (pos < lo || pos >= hi)
				r.vs[j] = 0;
		}
		dec_scores<HD>(r, qfs, lane, s);
		dec_softmax<HD>(r, s, b * G4_KV_BLOCK_TOKENS, lo, hi, a.scale, gr, st, p);
		dec_transpose_p(p, gr, tq, pb);
		dec_accumulate<HD>(r, pb, st);
	}

	dec_store_state<HD>(st, ws, warp, gq, gr, tq);
	__syncthreads();
	attn_finish_token(a, ws, qs, split, DEC_WARPS, HD, t, g);
}

/*
 * Two builds of one kernel: as it needs (147 registers) an SM holds 3
 * blocks; held to 128 (no spills since the query fragments moved to shared
 * memory) it holds 4.  With `groups` (token, KV head) pairs to serve, 4 per
 * SM pay where the step fills a wave of 3 per SM without splitting (64
 * sequences of Gemma 4: 113.7 -> 89.8 us per sliding layer in run 42, 96.0
 * -> 70.6 in runs 93 and 95), and cost where it does not (16: 38.8 -> 42.2
 * us, more splits merged; run 42); test/bench/RESULTS.md.  Held to 96
 * registers for 5 per SM, it spills and is slower (run 95).
 */
attn_kernel_fn
attn_decode_kernel_for(int hd, int dtype, int k_eq_v, int gq, int groups, int sm_count, int *smem)
{
	if (dtype != G4_KV_TURBOQUANT_K8V4 || k_eq_v || gq < 1 || gq > 8 || hd != 256)
		return NULL;
	*smem = (gq * hd + DEC_WARPS * gq * (hd + 2)) * (int) sizeof(float) + (hd / 16) * 32 * (int) sizeof(uint2);
	if (groups >= 3 * sm_count)
		return attn_decode_kernel<256, 4>;
	return attn_decode_kernel<256, 3>;
}
