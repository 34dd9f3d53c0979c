/*
 * attention_decode_full.cu — attention of one query token per block over
 * the turboquant_k8v4 pool on layers whose key derives from the value
 * (k_eq_v: Gemma 4's full layers, head_dim 512, one KV head for 16 query
 * heads), on tensor cores.
 *
 * The stored vector v = s·c (int8 codes c, one f16 scale s per key) serves
 * as the value and, through K = RoPE(v ⊙ k_norm), as the key.  Both are
 * linear in c, so the scale stays out of the MMA operands: the scores are
 * taken against K' = RoPE(c ⊙ k_norm) and multiplied by s, and the values
 * enter as the codes themselves (exact in f16) against the probabilities
 * times s.  Where a pair of dims is not rotated (proportional RoPE leaves
 * three quarters of them alone) k_norm is folded into the query, so those
 * key elements are the codes too; only the rotated pairs pay for the
 * rebuild, with the same float32 angle as every other kernel.
 *
 * Two kernels: attn_decode_full_wgmma_kernel (sm_90a, below the first)
 * and this mma.sync one, which serves other devices and layers whose
 * rotated pairs are not 16, 32, 48 or 64 (every pair: the tests' full
 * RoPE).
 * A block takes one (token, KV head, split) and walks its keys in chunks
 * of DF_BLOCKS 16-key pool blocks, each chunk staged into shared memory by
 * cp.async while the previous one is computed:
 *   scores   two warps per pool block, each half of every piece group's
 *            k-steps: S[row][key] = Q'·K'ᵀ (query rows as the MMA's 16
 *            rows, keys as columns), the halves summed through shared
 *            memory;
 *   softmax  the chunk's row maxima meet in shared memory, the first warp
 *            of each pool block turns its scores into probabilities P' =
 *            p·s (f16, the value MMA's A fragments) and row sums;
 *   values   warp w owns head_dim/DF_WARPS output dims and adds P'·C for
 *            every key of the chunk.
 * Every warp so keeps the same running max and sum of every row and an
 * eighth of the output: four barriers per chunk, no state to merge at the
 * end.  The kernel is latency-bound (a warp's chain of dependent
 * instructions per chunk, ncu run 43): eight warps per block rather than
 * four halve that chain and double the warps an SM holds.  Splits write
 * the partial format attn_merge_kernel combines.
 *
 * Shared memory holds a key's 16-byte pieces XOR-swizzled by the key, so
 * that both access patterns (a thread's pieces of one key in the score
 * phase, 8 bytes of four keys in the value phase) are conflict-free.
 */
#include "attention.cuh"
#include "wgmma.cuh"

#define DF_BLOCKS 4				/* pool blocks of a chunk */
#define DF_WARPS (2 * DF_BLOCKS)	/* two per pool block for the scores */
#define DF_KEYS (DF_BLOCKS * G4_KV_BLOCK_TOKENS)	/* keys of a chunk */
#define DF_ROWS 16				/* query rows: the MMA's M (gq <= 16) */

template <int HD>
struct df_geom
{
	static_assert(HD / DF_WARPS == 64, "a warp's output dims are 8 bytes of a key for each lane row");
	static constexpr int HALF = HD / 2;
	static constexpr int GROUPS = HALF / 64;	/* piece groups of a half: pieces 4i + tq */
	static constexpr int KSTEPS = HD / 16;
	static constexpr int NT = HD / DF_WARPS / 8;	/* value n-tiles of a warp */
	static constexpr int CODES = DF_KEYS * HD;
	static constexpr int STAGE = CODES + DF_KEYS * 2;	/* codes, then the f16 scales */
	static constexpr int QF = KSTEPS * 32 * 16;	/* the query's A fragments */
	/* + P' fragments [blocks][lanes], the second warps' partial scores
	 * [blocks][lanes][8], row maxima and sums [blocks][rows] */
	static constexpr int SMEM = 2 * STAGE + QF + HALF * 16 + DF_BLOCKS * 32 * 16 + DF_BLOCKS * 32 * 32 +
		2 * DF_BLOCKS * DF_ROWS * 4;
};

/* Where piece p (16 bytes) of chunk key k lies in its row. */
__device__ __forceinline__ int
df_piece(int k, int p)
{
	return p ^ ((k & 6) ^ ((k & 1) << 2));
}

/* Issue the copies of the chunk of pool blocks [cb, cb + DF_BLOCKS) ∩ [.., b_end)
 * into stage (one cp.async group); bit kb of the result: block cb + kb is
 * there.  A block of the range missing from the table is flagged. */
template <int HD>
__device__ __forceinline__ unsigned
df_issue(const attn_args &a, int slot, int g, int cb, int b_end, uint8_t *stage)
{
	using G = df_geom<HD>;
	constexpr int PER_BLOCK = G4_KV_BLOCK_TOKENS * HD / 16 + 2;	/* pieces: codes, scales */
	const uint8_t *hb[DF_BLOCKS];
	unsigned	ok = 0;

	/* the table entries first, all in flight together */
#pragma unroll
	for (int kb = 0; kb < DF_BLOCKS; kb++)
	{
		hb[kb] = cb + kb < b_end ? kv_head_block(a, slot, (cb + kb) * G4_KV_BLOCK_TOKENS, g) : NULL;
		if (hb[kb])
			ok |= 1u << kb;
		else if (cb + kb < b_end && threadIdx.x == 0)
			atomicOr(a.status, G4C_STATUS_KV_MISSING);
	}
	for (int i = threadIdx.x; i < DF_BLOCKS * PER_BLOCK; i += blockDim.x)
	{
		int			kb = i / PER_BLOCK,
					r = i % PER_BLOCK;
		/* selects, not an indexed local array */
		const uint8_t *src = kb == 0 ? hb[0] : kb == 1 ? hb[1] : kb == 2 ? hb[2] : hb[3];

		static_assert(DF_BLOCKS == 4, "the select above names each block");
		if (!src)
			continue;
		if (r < PER_BLOCK - 2)
		{
			int			key = r / (HD / 16),
						p = r % (HD / 16),
						k = kb * G4_KV_BLOCK_TOKENS + key;

			g4c_cp_async16(stage + (size_t) k * HD + 16 * df_piece(k, p), src + (size_t) key * HD + 16 * p, true);
		}
		else
			g4c_cp_async16(stage + G::CODES + kb * 32 + 16 * (r - (PER_BLOCK - 2)),
						   src + g4_kv_tq_kscale_off(HD) + 16 * (r - (PER_BLOCK - 2)), true);
	}
	g4c_cp_async_commit();
	return ok;
}

/*
 * The query rows as A fragments, in the order the score phase reads them:
 * k-step s = 8i + u, lane (gr, tq), registers {row gr, row gr + 8} × {lower
 * dims ℓ, ℓ + 1 | upper dims ℓ + HD/2, ℓ + HD/2 + 1}, ℓ = 16(4i + tq) + 2u
 * (a lane's key elements of a k-step are then two bytes of its piece 4i +
 * tq of each half).  k_norm is folded in where the pair is not rotated;
 * rows past gq are zeros.  Read in memory order, written where they go.
 */
template <int HD>
__device__ __forceinline__ void
df_query_fragments(const attn_args &a, int t, int g, const float4 *rope, uint32_t *qf)
{
	const float *q = a.q + (size_t) t * a.q_stride + (size_t) g * a.gq * HD;

#pragma unroll 4
	for (int e = threadIdx.x; e < DF_ROWS * HD / 2; e += blockDim.x)
	{
		int			row = e / (HD / 2),
					d0 = 2 * (e % (HD / 2));
		int			upper = d0 >= HD / 2,
					l0 = d0 - upper * (HD / 2);
		int			piece = l0 / 16;
		int			s = 8 * (piece / 4) + (l0 % 16) / 2;
		int			lane = 4 * (row % 8) + piece % 4;
		float2		x = make_float2(0.0f, 0.0f);

		if (row < a.gq)
		{
			float4		r0 = rope[l0],
						r1 = rope[l0 + 1];

			x = *reinterpret_cast<const float2 *>(q + (size_t) row * HD + d0);
			if (r0.x == 0.0f)
				x.x *= upper ? r0.z : r0.y;
			if (r1.x == 0.0f)
				x.y *= upper ? r1.z : r1.y;
		}
		qf[(s * 32 + lane) * 4 + row / 8 + 2 * upper] = g4c_pack_f16(x.x, x.y);
	}
}

/* The key elements of one k-step for one key: dims ℓ, ℓ + 1 (b0) and
 * their partners ℓ + HD/2, ℓ + HD/2 + 1 (b1), from the f16 codes; a
 * rotated pair becomes RoPE(c ⊙ k_norm) at position p.  rope[ℓ] = {inverse
 * frequency, k_norm at ℓ, at ℓ + HD/2}. */
__device__ __forceinline__ void
df_rotate_pairs(uint32_t &b0, uint32_t &b1, int l0, int p, const float4 *rope)
{
	float2		lo = __half22float2(__halves2half2(__ushort_as_half((unsigned short) (b0 & 0xFFFFu)),
												  __ushort_as_half((unsigned short) (b0 >> 16))));
	float2		hi = __half22float2(__halves2half2(__ushort_as_half((unsigned short) (b1 & 0xFFFFu)),
												  __ushort_as_half((unsigned short) (b1 >> 16))));
	float		kx[2] = {lo.x, lo.y},
				ky[2] = {hi.x, hi.y};

#pragma unroll
	for (int j = 0; j < 2; j++)
	{
		float4		r = rope[l0 + j];
		float		x = kx[j],
					y = ky[j];

		if (r.x != 0.0f)
			keqv_key_pair(x, y, r.y, r.z, r.x, p, &kx[j], &ky[j]);
	}
	b0 = g4c_pack_f16(kx[0], kx[1]);
	b1 = g4c_pack_f16(ky[0], ky[1]);
}

/* Word j of a piece (selects, not an indexed local array) */
__device__ __forceinline__ uint32_t
df_word(const uint4 &p, int j)
{
	return j == 0 ? p.x : j == 1 ? p.y : j == 2 ? p.z : p.w;
}

/* Half `half` of piece group i of the scores (k-steps 8i + 4half .. + 3)
 * into sc[k-step parity]: ROT when a pair of the group is rotated for some
 * lane (warp-uniform, so that the plain groups carry no rebuild code). */
template <int HD, bool ROT>
__device__ __forceinline__ void
df_scores_group(const uint8_t *stage, const uint32_t *qf, const float4 *rope, int kb, int half, int pos0, int lane,
				int i, float sc[2][2][4])
{
	int			gr = lane >> 2,
				tq = lane & 3;
	uint4		w[2][2];			/* [key gr, gr + 8][lower, upper piece] */

#pragma unroll
	for (int nt = 0; nt < 2; nt++)
	{
		int			k = kb * G4_KV_BLOCK_TOKENS + 8 * nt + gr;

#pragma unroll
		for (int h = 0; h < 2; h++)
		{
			w[nt][h] = *reinterpret_cast<const uint4 *>(stage + (size_t) k * HD +
														16 * df_piece(k, h * (HD / 32) + 4 * i + tq));
			w[nt][h].x ^= 0x80808080u;
			w[nt][h].y ^= 0x80808080u;
			w[nt][h].z ^= 0x80808080u;
			w[nt][h].w ^= 0x80808080u;
		}
	}
	/* the rebuild is long: one pair of k-steps' code serves the half's
	 * four (the instruction cache holds the kernel only so) */
#pragma unroll (ROT ? 2 : 4)
	for (int u = 4 * half; u < 4 * half + 4; u++)
	{
		int			s = 8 * i + u;
		int			l0 = 16 * (4 * i + tq) + 2 * u;
		uint4		qa = *reinterpret_cast<const uint4 *>(qf + (size_t) (s * 32 + lane) * 4);
		uint32_t	a[4] = {qa.x, qa.y, qa.z, qa.w};
		/* bytes 2u, 2u + 1 of the piece: byte pair u % 2 of word u / 2 */
		uint32_t	sel = (u & 1) ? 0x4342u : 0x4140u;

#pragma unroll
		for (int nt = 0; nt < 2; nt++)
		{
			uint32_t	b0 = i8x2_to_f16x2(df_word(w[nt][0], u >> 1), sel),
						b1 = i8x2_to_f16x2(df_word(w[nt][1], u >> 1), sel);

			if (ROT)
				df_rotate_pairs(b0, b1, l0, pos0 + 8 * nt + gr, rope);
			/* two accumulators per key tile: chains half as long */
			g4c_mma_f16(sc[u & 1][nt], a, b0, b1);
		}
	}
}

/* Half `half` of the k-steps of the scores of pool block kb: sc[nt] =
 * S[rows gr, gr + 8][keys 8nt + 2tq, + 1] (unscaled, partial), from the
 * chunk's codes in stage; bit i of rot: group i has rotated pairs. */
template <int HD>
__device__ __forceinline__ void
df_scores(const uint8_t *stage, const uint32_t *qf, const float4 *rope, int kb, int half, int pos0, int lane,
		  unsigned rot, float sc[2][4])
{
	float		acc[2][2][4] = {};

#pragma unroll 1
	for (int i = 0; i < df_geom<HD>::GROUPS; i++)
	{
		if ((rot >> i) & 1)
			df_scores_group<HD, true>(stage, qf, rope, kb, half, pos0, lane, i, acc);
		else
			df_scores_group<HD, false>(stage, qf, rope, kb, half, pos0, lane, i, acc);
	}
#pragma unroll
	for (int nt = 0; nt < 2; nt++)
#pragma unroll
		for (int e = 0; e < 4; e++)
			sc[nt][e] = acc[0][nt][e] + acc[1][nt][e];
}

/* f16 pair {code of x's byte j, code of y's byte j} (two keys, one dim) */
__device__ __forceinline__ uint32_t
df_code_pair(uint32_t x, uint32_t y, int j)
{
	uint32_t	h = (__byte_perm(x, y, (uint32_t) j | ((uint32_t) (4 + j) << 8)) & 0x00FF00FFu) ^ 0x64806480u;
	__half2		v = __hsub2(*reinterpret_cast<__half2 *>(&h), __half2half2(__ushort_as_half(0x6480)));	/* 1152 */

	return *reinterpret_cast<uint32_t *>(&v);
}

/* O[rows gr, gr + 8][the warp's dims] += P'·C over the chunk's keys: value
 * n-tile j column gr = dim HD/8·warp + 8gr + j (byte j of the lane's 8
 * bytes), so o[j] holds dims HD/8·warp + 16tq + j and that + 8. */
template <int HD>
__device__ __forceinline__ void
df_values(const uint8_t *stage, const uint4 *pf, int warp, int lane, float o[][4])
{
	int			gr = lane >> 2,
				tq = lane & 3;

#pragma unroll 1
	for (int kb = 0; kb < DF_BLOCKS; kb++)
	{
		uint4		pa = pf[kb * 32 + lane];
		uint32_t	a[4] = {pa.x, pa.y, pa.z, pa.w};
		uint32_t	v[4][2];		/* keys 2tq, 2tq + 1, 2tq + 8, 2tq + 9 */

#pragma unroll
		for (int j = 0; j < 4; j++)
		{
			int			k = kb * G4_KV_BLOCK_TOKENS + 2 * tq + (j & 1) + 8 * (j >> 1);
			int			byte = (HD / DF_WARPS) * warp + 8 * gr;
			uint2		x = *reinterpret_cast<const uint2 *>(stage + (size_t) k * HD + 16 * df_piece(k, byte / 16) +
															 byte % 16);

			v[j][0] = x.x;
			v[j][1] = x.y;
		}
#pragma unroll
		for (int j = 0; j < HD / DF_WARPS / 8; j++)
			g4c_mma_f16(o[j], a, df_code_pair(v[0][j >> 2], v[1][j >> 2], j & 3),
						df_code_pair(v[2][j >> 2], v[3][j >> 2], j & 3));
	}
}

/* What a block of (token, split) walks: the token's sequence slot, the
 * split's pool blocks [b_begin, b_end), their keys [klo, khi) within the
 * token's range, and the chunks of DF_BLOCKS pool blocks over them. */
typedef struct
{
	int			slot,
				b_begin,
				b_end,
				klo,
				khi,
				chunks;
} df_range;

/* (after the wait for the previous kernel) */
__device__ __forceinline__ df_range
df_split_range(const attn_args &a, int t, int split)
{
	int			lo = a.lo[t],
				hi = a.hi[t];
	df_range	r;

	r.slot = a.slot[t];
	split_blocks(lo, hi, a.S, split, &r.b_begin, &r.b_end);
	r.klo = max(lo, r.b_begin * G4_KV_BLOCK_TOKENS);
	r.khi = min(hi, r.b_end * G4_KV_BLOCK_TOKENS);
	r.chunks = r.b_end > r.b_begin ? (r.b_end - r.b_begin + DF_BLOCKS - 1) / DF_BLOCKS : 0;
	return r;
}

/* Whether key `key` of the chunk from pool block cb is one to attend to:
 * its pool block there (bit of ok) and its position within [klo, khi). */
__device__ __forceinline__ bool
df_live(const df_range &rg, unsigned ok, int cb, int key)
{
	int			p = cb * G4_KV_BLOCK_TOKENS + key;

	return ((ok >> (key / G4_KV_BLOCK_TOKENS)) & 1) && p >= rg.klo && p < rg.khi;
}

/* Where query row `row` of (token t, KV head g, split) goes: the output,
 * scaled by *mul = 1/l, with its bf16 copy (*dstb, where offered) when the
 * range is not split; else the split's partial row after its (m, l)
 * header, which the thread given `header` writes (attn_merge_kernel
 * combines them). */
__device__ __forceinline__ float *
df_row_dst(const attn_args &a, int t, int g, int split, int row, float m, float l, bool header, uint16_t **dstb,
		   float *mul)
{
	float	   *p;

	*dstb = NULL;
	*mul = 1.0f;
	if (a.S == 1)
	{
		size_t		at = (size_t) t * a.out_stride + (size_t) (g * a.gq + row) * a.hd;

		*dstb = a.out_bf16 ? a.out_bf16 + at : NULL;
		*mul = l > 0.0f ? 1.0f / l : 0.0f;
		return a.out + at;
	}
	p = a.partial + (((size_t) blockIdx.x * a.S + split) * a.gq + row) * (a.hd + 2);
	if (header)
	{
		p[0] = m;
		p[1] = l;
	}
	return p + 2;
}

/* Two stages: the next chunk loads while this one is computed (two blocks
 * per SM; one stage and three blocks per SM measured slower at 16
 * sequences, 77 -> 97 us per layer, run 44). */
template <int HD>
__global__ void __launch_bounds__(DF_WARPS * 32, 2)
attn_decode_full_kernel(attn_args a)
{
	using G = df_geom<HD>;
	extern __shared__ __align__(16) unsigned char sm_raw[];
	uint8_t    *stages = sm_raw;	/* [2][STAGE] */
	uint32_t   *qf = reinterpret_cast<uint32_t *>(sm_raw + 2 * G::STAGE);
	float4	   *rope = reinterpret_cast<float4 *>(sm_raw + 2 * G::STAGE + G::QF);	/* [HD / 2] */
	uint4	   *pf = reinterpret_cast<uint4 *>(rope + G::HALF);	/* [blocks][32 lanes] */
	float4	   *ps = reinterpret_cast<float4 *>(pf + DF_BLOCKS * 32);	/* [blocks][32 lanes][2] */
	float	   *mx = reinterpret_cast<float *>(ps + DF_BLOCKS * 32 * 2);	/* [blocks][rows] */
	float	   *sums = mx + DF_BLOCKS * DF_ROWS;	/* [blocks][rows] */
	int			t = blockIdx.x / a.n_kv;
	int			g = blockIdx.x % a.n_kv;
	int			split = blockIdx.y;
	int			lane = threadIdx.x & 31;
	int			warp = threadIdx.x >> 5;
	int			gr = lane >> 2,
				tq = lane & 3;
	int			kb = warp % DF_BLOCKS,	/* the warp's pool block for the scores */
				half = warp / DF_BLOCKS;	/* and its half of the k-steps */
	df_range	rg;
	unsigned	ok_cur = 0,
				ok_next = 0,
				rot = 0;		/* bit i: piece group i has rotated pairs (df_scores) */
	float		o[G::NT][4];
	float		m[2] = {-INFINITY, -INFINITY},	/* rows gr, gr + 8 */
				l[2] = {0.0f, 0.0f};

	g4c_pdl_trigger();
	g4c_pdl_wait();
	rg = df_split_range(a, t, split);
	if (rg.chunks > 0)
		ok_cur = df_issue<HD>(a, rg.slot, g, rg.b_begin, rg.b_end, stages);
	for (int i = threadIdx.x; i < G::HALF; i += blockDim.x)
		rope[i] = make_float4(a.inv_freq[i], a.knorm[i], a.knorm[i + G::HALF], 0.0f);
	__syncthreads();
	df_query_fragments<HD>(a, t, g, rope, qf);
	for (int i = 0; i < G::GROUPS; i++)
	{
		bool		r = false;

		for (int j = 0; j < 16; j++)
			r |= rope[16 * (4 * i + tq) + j].x != 0.0f;
		rot |= (unsigned) __any_sync(0xffffffffu, r) << i;
	}
#pragma unroll
	for (int j = 0; j < G::NT; j++)
		o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

	for (int c = 0; c < rg.chunks; c++)
	{
		int			cb = rg.b_begin + c * DF_BLOCKS;
		const uint8_t *stage = stages + (c & 1) * G::STAGE;
		const uint16_t *ks = reinterpret_cast<const uint16_t *>(stage + G::CODES);
		int			pos0 = (cb + kb) * G4_KV_BLOCK_TOKENS;	/* the warp's pool block */
		bool		mine = (ok_cur >> kb) & 1;
		float		sc[2][4],
					mnew[2],
					corr[2];

		/* the chunk is in, and every warp is done with the other stage */
		g4c_cp_async_wait<0>();
		__syncthreads();
		if (c + 1 < rg.chunks)
			ok_next = df_issue<HD>(a, rg.slot, g, cb + DF_BLOCKS, rg.b_end, stages + ((c + 1) & 1) * G::STAGE);

		/* half of the scores of the warp's pool block; the second warp's
		 * half to the first */
		df_scores<HD>(stage, qf, rope, kb, half, pos0, lane, rot, sc);
		if (half)
		{
			ps[(kb * 32 + lane) * 2] = make_float4(sc[0][0], sc[0][1], sc[0][2], sc[0][3]);
			ps[(kb * 32 + lane) * 2 + 1] = make_float4(sc[1][0], sc[1][1], sc[1][2], sc[1][3]);
		}
		__syncthreads();

		/* first warps: the whole scores, scaled and masked, and their row
		 * maxima */
		if (!half)
		{
			float4		o0 = ps[(kb * 32 + lane) * 2],
						o1 = ps[(kb * 32 + lane) * 2 + 1];

			sc[0][0] += o0.x, sc[0][1] += o0.y, sc[0][2] += o0.z, sc[0][3] += o0.w;
			sc[1][0] += o1.x, sc[1][1] += o1.y, sc[1][2] += o1.z, sc[1][3] += o1.w;
#pragma unroll
			for (int nt = 0; nt < 2; nt++)
#pragma unroll
				for (int e = 0; e < 4; e++)
				{
					int			k = kb * G4_KV_BLOCK_TOKENS + 8 * nt + 2 * tq + (e & 1);
					int			p = pos0 + 8 * nt + 2 * tq + (e & 1);

					sc[nt][e] = mine && p >= rg.klo && p < rg.khi ? sc[nt][e] * g4_f16_to_f32(ks[k]) * a.scale : -INFINITY;
				}
#pragma unroll
			for (int h = 0; h < 2; h++)
			{
				float		x = fmaxf(fmaxf(sc[0][2 * h], sc[0][2 * h + 1]), fmaxf(sc[1][2 * h], sc[1][2 * h + 1]));

				x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
				x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
				if (tq == 0)
					mx[kb * DF_ROWS + gr + 8 * h] = x;
			}
		}
		__syncthreads();

		/* the chunk's row maxima (every warp); first warps: probabilities
		 * P' = p·s and row sums */
#pragma unroll
		for (int h = 0; h < 2; h++)
		{
			float		x = m[h];

#pragma unroll
			for (int w = 0; w < DF_BLOCKS; w++)
				x = fmaxf(x, mx[w * DF_ROWS + gr + 8 * h]);
			mnew[h] = x;
			corr[h] = x == -INFINITY ? 1.0f : __expf(m[h] - x);
		}
		if (!half)
		{
			float		s[2][2];	/* the scale of keys 8nt + 2tq + e (0 where masked: p is 0) */

#pragma unroll
			for (int h = 0; h < 2; h++)
			{
				float		sum;

#pragma unroll
				for (int nt = 0; nt < 2; nt++)
#pragma unroll
					for (int e = 0; e < 2; e++)
					{
						float	   *x = &sc[nt][2 * h + e];

						*x = *x == -INFINITY ? 0.0f : __expf(*x - mnew[h]);
					}
				sum = sc[0][2 * h] + sc[0][2 * h + 1] + sc[1][2 * h] + sc[1][2 * h + 1];
				sum += __shfl_xor_sync(0xffffffffu, sum, 1);
				sum += __shfl_xor_sync(0xffffffffu, sum, 2);
				if (tq == 0)
					sums[kb * DF_ROWS + gr + 8 * h] = sum;
			}
#pragma unroll
			for (int nt = 0; nt < 2; nt++)
#pragma unroll
				for (int e = 0; e < 2; e++)
				{
					int			p = pos0 + 8 * nt + 2 * tq + e;

					s[nt][e] = mine && p >= rg.klo && p < rg.khi ?
						g4_f16_to_f32(ks[kb * G4_KV_BLOCK_TOKENS + 8 * nt + 2 * tq + e]) : 0.0f;
				}
			pf[kb * 32 + lane] = make_uint4(g4c_pack_f16(sc[0][0] * s[0][0], sc[0][1] * s[0][1]),
											g4c_pack_f16(sc[0][2] * s[0][0], sc[0][3] * s[0][1]),
											g4c_pack_f16(sc[1][0] * s[1][0], sc[1][1] * s[1][1]),
											g4c_pack_f16(sc[1][2] * s[1][0], sc[1][3] * s[1][1]));
		}
		__syncthreads();

		/* every warp: the rows' running state, then its dims' values */
#pragma unroll
		for (int h = 0; h < 2; h++)
		{
			float		sum = 0.0f;

#pragma unroll
			for (int w = 0; w < DF_BLOCKS; w++)
				sum += sums[w * DF_ROWS + gr + 8 * h];
			l[h] = l[h] * corr[h] + sum;
			m[h] = mnew[h];
#pragma unroll
			for (int j = 0; j < G::NT; j++)
			{
				o[j][2 * h] *= corr[h];
				o[j][2 * h + 1] *= corr[h];
			}
		}
		df_values<HD>(stage, pf, warp, lane, o);
		ok_cur = ok_next;
	}

	/* rows gr, gr + 8; o[j][2h + e] is dim HD/8·warp + 16tq + 8e + j */
#pragma unroll
	for (int h = 0; h < 2; h++)
	{
		int			row = gr + 8 * h;
		uint16_t   *dstb;
		float		mul;
		float	   *dst;

		if (row >= a.gq)
			continue;
		dst = df_row_dst(a, t, g, split, row, m[h], l[h], warp == 0 && tq == 0, &dstb, &mul);
#pragma unroll
		for (int j = 0; j < G::NT; j++)
#pragma unroll
			for (int e = 0; e < 2; e++)
			{
				int			d = (HD / DF_WARPS) * warp + 16 * tq + 8 * e + j;
				float		v = o[j][2 * h + e] * mul;

				dst[d] = v;
				if (dstb)
					dstb[d] = g4_f32_to_bf16(v);
			}
	}
}

/*
 * The warpgroup-MMA kernel (sm_90a; rotated pairs a multiple of 16 within
 * the first 64, as Gemma 4's proportional RoPE has them).  One block of
 * two warpgroups per (token, KV head, split); the chunk's keys are the
 * MMAs' M, so one warpgroup's MMAs cover a chunk of 64 keys where the
 * mma.sync kernel above spent eight warps and four barriers.  Per chunk of
 * DW_KEYS keys:
 *   1. its codes, loaded into registers during the previous chunk, become
 *      the f16 tile C [key][dim] (the values, and the keys on the dims
 *      RoPE leaves alone, k_norm folded into the query there); the rotated
 *      pairs' keys RoPE(c ⊙ k_norm) go to a tile of their own (dims
 *      [0, 64) and [HD/2, HD/2 + 64)); the next chunk's codes are loaded;
 *   2. Sᵀ = K'·Q'ᵀ (keys × query rows): each warpgroup 16 wgmma m64n16k16
 *      over half the dims, the two halves exchanged through shared memory
 *      and added (a + b = b + a: both hold the same scores);
 *   3. the softmax of each query row over the chunk's keys, scaled by each
 *      key's scale s: a row's chunk maximum meets across the warpgroup's
 *      four warps in shared memory; P' = p·s as f16 [row][key];
 *   4. Oᵀ += Cᵀ·P'ᵀ (head dims × query rows), each warpgroup over half the
 *      dims: 16 wgmma m64n16k16, C read MN-major as A, so the values are
 *      the codes themselves.
 * The conversion and rotation are shared by all 256 threads.  Shared
 * memory bounds the kernel (the f16 tile written, then read by the MMAs:
 * L1/shared at 78 % of its throughput against DRAM's 18 % at 64
 * sequences, ncu run 139).  The numerics are the mma.sync kernel's: f16
 * codes, query and P', float32 scores, sums and outputs.  Each thread
 * keeps its own keys' share of a row's Σp, summed at the end.
 */
#define DW_KEYS 64				/* keys of a chunk: four pool blocks */
#define DW_ROWS 16				/* query rows: the MMAs' N (gq <= 16) */
#define DW_ROPE_PAIRS 64		/* rotated pairs it takes: one 64-dim slab each half */
#define DW_HD 512
#define DW_THREADS 256

/* Shared memory: C [8 slabs][64 keys][128 B] | the rotated slabs' keys
 * [2][64][128 B] | Q' [8 slabs][16 rows][128 B] | P' [16 rows][128 B] |
 * RoPE {inv_freq, k_norm lo, hi} [64] | row maxima [2 warpgroups][4
 * warps][16] | key scales [64] | the halves of Sᵀ [2 warpgroups][128
 * threads][8] */
#define DW_SLAB (DW_KEYS * 128)
#define DW_OFF_KR (8 * DW_SLAB)
#define DW_OFF_Q (DW_OFF_KR + 2 * DW_SLAB)
#define DW_OFF_P (DW_OFF_Q + 8 * DW_ROWS * 128)
#define DW_OFF_ROPE (DW_OFF_P + DW_ROWS * 128)
#define DW_OFF_RED (DW_OFF_ROPE + DW_ROPE_PAIRS * 16)
#define DW_OFF_KS (DW_OFF_RED + 8 * DW_ROWS * 4)
#define DW_OFF_XS (DW_OFF_KS + DW_KEYS * 4)
#define DW_SMEM (DW_OFF_XS + DW_THREADS * 8 * 4)

/* A chunk's codes in flight: thread t holds keys t / 16 + 16i (i < 4, in
 * pool block i), 16 dims of each half (16 (t % 16) .. and HD/2 + that),
 * the scale of key t (t < 64), and which of the chunk's pool blocks are
 * there. */
typedef struct
{
	uint4		lo[4],
				hi[4];
	uint16_t	ks;
	unsigned	ok;
} dw_codes;

__device__ __forceinline__ void
dw_load(const attn_args &a, int slot, int g, int cb, int b_end, dw_codes &r)
{
	const uint8_t *hb[DF_BLOCKS];
	int			key = (int) (threadIdx.x >> 4),
				pp = threadIdx.x & 15;

	r.ok = 0;
#pragma unroll
	for (int kb = 0; kb < DF_BLOCKS; kb++)
	{
		hb[kb] = cb + kb < b_end ? kv_head_block(a, slot, (cb + kb) * G4_KV_BLOCK_TOKENS, g) : NULL;
		if (hb[kb])
			r.ok |= 1u << kb;
		else if (cb + kb < b_end && threadIdx.x == 0)
			atomicOr(a.status, G4C_STATUS_KV_MISSING);
	}
#pragma unroll
	for (int i = 0; i < DF_BLOCKS; i++)
	{
		r.lo[i] = r.hi[i] = make_uint4(0, 0, 0, 0);
		if (hb[i])
		{
			r.lo[i] = *reinterpret_cast<const uint4 *>(hb[i] + (size_t) key * DW_HD + 16 * pp);
			r.hi[i] = *reinterpret_cast<const uint4 *>(hb[i] + (size_t) key * DW_HD + DW_HD / 2 + 16 * pp);
		}
	}
	r.ks = 0;
	if (threadIdx.x < DW_KEYS)
	{
		int			kb = threadIdx.x / G4_KV_BLOCK_TOKENS;
		/* selects, not an indexed local array */
		const uint8_t *src = kb == 0 ? hb[0] : kb == 1 ? hb[1] : kb == 2 ? hb[2] : hb[3];

		if (src)
			r.ks = *reinterpret_cast<const uint16_t *>(src + g4_kv_tq_kscale_off(DW_HD) +
													   2 * (threadIdx.x % G4_KV_BLOCK_TOKENS));
	}
}

/* 16 int8 codes as f16, into the two 16-byte chunks of dims d .. d + 15
 * of key `key` in C */
__device__ __forceinline__ void
dw_put_codes(unsigned char *C, int key, int d, uint4 w)
{
	uint32_t	x[4] = {w.x ^ 0x80808080u, w.y ^ 0x80808080u, w.z ^ 0x80808080u, w.w ^ 0x80808080u};
	uint32_t	h[8];

#pragma unroll
	for (int i = 0; i < 4; i++)
	{
		h[2 * i] = i8x2_to_f16x2(x[i], 0x4140u);
		h[2 * i + 1] = i8x2_to_f16x2(x[i], 0x4342u);
	}
	*reinterpret_cast<uint4 *>(C + wgt_off<DW_KEYS>(key, d)) = make_uint4(h[0], h[1], h[2], h[3]);
	*reinterpret_cast<uint4 *>(C + wgt_off<DW_KEYS>(key, d + 8)) = make_uint4(h[4], h[5], h[6], h[7]);
}

/* The keys RoPE(c ⊙ k_norm) of the rotated pairs [0, rope_pairs) (a
 * multiple of 16: whole k16 steps of dims [0, 64) and [HD/2, HD/2 + 64))
 * of every key of the chunk (first position p0) into KR, from the codes in
 * C.  Thread t: key t / 4, pairs 16 (t % 4) .. + 15.  A pair past
 * inv_freq's nonzero ones would rotate by cos 1, sin 0 (exact): no branch
 * on the frequency. */
__device__ __forceinline__ void
dw_rotate(const unsigned char *C, unsigned char *KR, const float4 *rope, int rope_pairs, int p0)
{
	int			key = threadIdx.x >> 2;
	int			d0 = 16 * (threadIdx.x & 3);
	float		p = (float) (p0 + key);

	if (d0 >= rope_pairs)
		return;					/* a plain k16 step: the scores read C there */
#pragma unroll
	for (int c = 0; c < 2; c++)
	{
		int			d = d0 + 8 * c;
		uint4		lo = *reinterpret_cast<const uint4 *>(C + wgt_off<DW_KEYS>(key, d));
		uint4		hi = *reinterpret_cast<const uint4 *>(C + wgt_off<DW_KEYS>(key, DW_HD / 2 + d));
		uint32_t	lw[4] = {lo.x, lo.y, lo.z, lo.w},
					hw[4] = {hi.x, hi.y, hi.z, hi.w};

#pragma unroll
		for (int i = 0; i < 4; i++)
		{
			float2		l2 = __half22float2(*reinterpret_cast<const __half2 *>(&lw[i]));
			float2		h2 = __half22float2(*reinterpret_cast<const __half2 *>(&hw[i]));
			float		kx[2] = {l2.x, l2.y},
						ky[2] = {h2.x, h2.y};

#pragma unroll
			for (int e = 0; e < 2; e++)
			{
				float4		r = rope[d + 2 * i + e];

				rope_pair(kx[e] * r.y, ky[e] * r.z, r.x, p, &kx[e], &ky[e]);
			}
			lw[i] = g4c_pack_f16(kx[0], kx[1]);
			hw[i] = g4c_pack_f16(ky[0], ky[1]);
		}
		*reinterpret_cast<uint4 *>(KR + wgt_off<DW_KEYS>(key, d)) = make_uint4(lw[0], lw[1], lw[2], lw[3]);
		*reinterpret_cast<uint4 *>(KR + DW_SLAB + wgt_off<DW_KEYS>(key, d)) = make_uint4(hw[0], hw[1], hw[2], hw[3]);
	}
}

/* The query rows Q' (f16; k_norm folded in on the pairs RoPE leaves alone,
 * rows past gq zero) into Qs, 8 dims a thread at a time. */
__device__ __forceinline__ void
dw_queries(const attn_args &a, int t, int g, unsigned char *Qs)
{
	for (int i = threadIdx.x; i < DW_ROWS * DW_HD / 8; i += DW_THREADS)
	{
		int			row = i / (DW_HD / 8),
					d = 8 * (i % (DW_HD / 8));
		float		x[8] = {};

		if (row < a.gq)
		{
			const float *q = a.q + (size_t) t * a.q_stride + (size_t) (g * a.gq + row) * DW_HD + d;
			float4		q0 = *reinterpret_cast<const float4 *>(q),
						q1 = *reinterpret_cast<const float4 *>(q + 4),
						k0 = *reinterpret_cast<const float4 *>(a.knorm + d),
						k1 = *reinterpret_cast<const float4 *>(a.knorm + d + 4);
			float		qv[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w},
						kv[8] = {k0.x, k0.y, k0.z, k0.w, k1.x, k1.y, k1.z, k1.w};

#pragma unroll
			for (int e = 0; e < 8; e++)
				x[e] = (d + e) % (DW_HD / 2) < a.rope_pairs ? qv[e] : qv[e] * kv[e];
		}
		put8_f16(Qs + wgt_off<DW_ROWS>(row, d), x);
	}
}

template <int HD>
__global__ void __launch_bounds__(DW_THREADS, 2)
attn_decode_full_wgmma_kernel(attn_args a)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
	extern __shared__ __align__(1024) unsigned char sm[];
	unsigned char *C = sm,
			   *KR = sm + DW_OFF_KR,
			   *Qs = sm + DW_OFF_Q,
			   *Ps = sm + DW_OFF_P;
	float4	   *rope = reinterpret_cast<float4 *>(sm + DW_OFF_ROPE);
	int			wg = threadIdx.x >> 7;
	float	   *red = reinterpret_cast<float *>(sm + DW_OFF_RED) + wg * 4 * DW_ROWS;	/* [warp][row] */
	float	   *ksc = reinterpret_cast<float *>(sm + DW_OFF_KS);
	float4	   *xs = reinterpret_cast<float4 *>(sm + DW_OFF_XS);	/* [thread][2] */
	uint32_t	s_c = (uint32_t) __cvta_generic_to_shared(C),
				s_kr = (uint32_t) __cvta_generic_to_shared(KR),
				s_q = (uint32_t) __cvta_generic_to_shared(Qs),
				s_p = (uint32_t) __cvta_generic_to_shared(Ps);
	int			t = blockIdx.x / a.n_kv,
				g = blockIdx.x % a.n_kv,
				split = blockIdx.y;
	int			warp = (threadIdx.x >> 5) & 3,	/* within the warpgroup */
				lane = threadIdx.x & 31;
	int			gr = lane >> 2,
				tq = lane & 3;
	df_range	rg;
	bool		rot = a.rope_pairs > 0;
	float		o[4][8] = {};	/* [the warpgroup's dim slab][m64n16 fragment]: Oᵀ */
	float		m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY},
				l[4] = {};
	dw_codes	cur;

	/* this thread's query rows (the accumulators' columns) are 2tq + 8j +
	 * e, r = 2j + e; its keys (rows of Sᵀ) 16 warp + gr + 8h */
#define DW_ROW(r) (2 * tq + 8 * ((r) >> 1) + ((r) & 1))
	static_assert(HD == DW_HD, "head_dim 512");
	g4c_pdl_wait();
	rg = df_split_range(a, t, split);
	if (rg.chunks > 0)
		dw_load(a, rg.slot, g, rg.b_begin, rg.b_end, cur);
	if (threadIdx.x < DW_ROPE_PAIRS)
		rope[threadIdx.x] = make_float4(a.inv_freq[threadIdx.x], a.knorm[threadIdx.x],
										a.knorm[threadIdx.x + HD / 2], 0.0f);
	dw_queries(a, t, g, Qs);

	for (int c = 0; c < rg.chunks; c++)
	{
		int			cb = rg.b_begin + c * DF_BLOCKS;
		unsigned	ok = cur.ok;	/* the chunk's pool blocks that are there */
		float		sc[8],
					corr[4];

		/* every warp is done with the previous chunk's products (and the
		 * queries and RoPE table are in) */
		wg_wait<0>();
		wg_fence_regs(&o[0][0], 32);
		__syncthreads();
#pragma unroll
		for (int i = 0; i < DF_BLOCKS; i++)
		{
			int			key = (int) (threadIdx.x >> 4) + 16 * i,
						d = 16 * (threadIdx.x & 15);

			dw_put_codes(C, key, d, cur.lo[i]);
			dw_put_codes(C, key, HD / 2 + d, cur.hi[i]);
		}
		/* 0 for keys outside the range: their probabilities are 0, and their
		 * slots may hold any bytes (a scale of NaN) */
		if (threadIdx.x < DW_KEYS)
			ksc[threadIdx.x] = df_live(rg, ok, cb, threadIdx.x) ? g4_f16_to_f32(cur.ks) : 0.0f;
		if (c + 1 < rg.chunks)
			dw_load(a, rg.slot, g, cb + DF_BLOCKS, rg.b_end, cur);
		if (rot)
		{
			__syncthreads();
			dw_rotate(C, KR, rope, a.rope_pairs, cb * G4_KV_BLOCK_TOKENS);
		}
		wg_fence_proxy();
		__syncthreads();

		/* Sᵀ = K'·Q'ᵀ over the warpgroup's half of the dims */
		wg_fence();
#pragma unroll
		for (int st = 0; st < HD / 32; st++)
		{
			int			slab = 4 * wg + (st >> 2);
			/* the rotated k16 steps from KR */
			uint32_t	ka = (slab & 3) == 0 && 16 * (st & 3) < a.rope_pairs ? s_kr + (slab >> 2) * DW_SLAB :
				s_c + slab * DW_SLAB;

			wg_mma_f16_ss16<0>(sc, wg_desc(ka + (st & 3) * 32), wg_desc(s_q + slab * DW_ROWS * 128 + (st & 3) * 32),
							   st > 0);
		}
		wg_commit();
		wg_wait<0>();
		wg_fence_regs(sc, 8);
		/* the other half from the other warpgroup's same thread */
		xs[2 * threadIdx.x] = make_float4(sc[0], sc[1], sc[2], sc[3]);
		xs[2 * threadIdx.x + 1] = make_float4(sc[4], sc[5], sc[6], sc[7]);
		__syncthreads();
		{
			float4		x0 = xs[2 * (threadIdx.x ^ 128)],
						x1 = xs[2 * (threadIdx.x ^ 128) + 1];

			sc[0] += x0.x, sc[1] += x0.y, sc[2] += x0.z, sc[3] += x0.w;
			sc[4] += x1.x, sc[5] += x1.y, sc[6] += x1.z, sc[7] += x1.w;
		}

		/* scores scaled (the key's scale and the layer's) and masked: sc[4j
		 * + 2h + e] is key 16 warp + gr + 8h, query row DW_ROW(2j + e) */
#pragma unroll
		for (int h = 0; h < 2; h++)
		{
			int			key = 16 * warp + gr + 8 * h;
			bool		live = df_live(rg, ok, cb, key);
			float		f = ksc[key] * a.scale;

#pragma unroll
			for (int j = 0; j < 2; j++)
#pragma unroll
				for (int e = 0; e < 2; e++)
				{
					float	   *x = &sc[4 * j + 2 * h + e];

					*x = live ? *x * f : -INFINITY;
				}
		}
		/* the chunk's maximum of each query row over the warpgroup */
#pragma unroll
		for (int r = 0; r < 4; r++)
		{
			int			j = r >> 1,
						e = r & 1;
			float		x = fmaxf(sc[4 * j + e], sc[4 * j + 2 + e]);

			x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
			x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 8));
			x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 16));
			if (gr == 0)
				red[warp * DW_ROWS + DW_ROW(r)] = x;
		}
		__syncthreads();
		/* running maxima and sums; P' = p·s into Ps ([row][key], K-major),
		 * by the first warpgroup (the second holds the same) */
#pragma unroll
		for (int r = 0; r < 4; r++)
		{
			int			j = r >> 1,
						e = r & 1;
			float		mx = m[r];

#pragma unroll
			for (int w = 0; w < 4; w++)
				mx = fmaxf(mx, red[w * DW_ROWS + DW_ROW(r)]);
			corr[r] = mx == -INFINITY ? 1.0f : __expf(m[r] - mx);
			m[r] = mx;
#pragma unroll
			for (int h = 0; h < 2; h++)
			{
				float	   *x = &sc[4 * j + 2 * h + e];
				int			key = 16 * warp + gr + 8 * h;
				float		pv = *x == -INFINITY ? 0.0f : __expf(*x - mx);

				l[r] = h == 0 ? l[r] * corr[r] + pv : l[r] + pv;
				if (wg == 0)
					*reinterpret_cast<__half *>(Ps + wgt_off<DW_ROWS>(DW_ROW(r), key)) =
						__float2half_rn(pv * ksc[key]);
			}
		}
		if (corr[0] != 1.0f || corr[1] != 1.0f || corr[2] != 1.0f || corr[3] != 1.0f)
#pragma unroll
			for (int s = 0; s < 4; s++)
#pragma unroll
				for (int i = 0; i < 8; i++)
					o[s][i] *= corr[((i >> 2) << 1) | (i & 1)];
		wg_fence_proxy();
		__syncthreads();

		/* Oᵀ += Cᵀ·P'ᵀ: the warpgroup's four dim slabs over the chunk's four
		 * k16 steps of keys */
		wg_fence();
#pragma unroll
		for (int ks = 0; ks < DW_KEYS / 16; ks++)
#pragma unroll
			for (int s = 0; s < 4; s++)
				wg_mma_f16_ss16<1>(o[s], wg_desc_mn(s_c + (4 * wg + s) * DW_SLAB + ks * 16 * 128),
								   wg_desc(s_p + ks * 32), 1);
		wg_commit();
	}
	/* the successor is scheduled only now: triggered at the start, its
	 * blocks came in beside these (decode B=1 2k 4.62 -> 4.59 ms, B=256
	 * 26.66 -> 26.08; RESULTS.md, run 141) */
	g4c_pdl_trigger();
	wg_wait<0>();
	wg_fence_regs(&o[0][0], 32);

	/* each row's Σp over the warpgroup's keys (both hold the same) */
#pragma unroll
	for (int r = 0; r < 4; r++)
	{
		l[r] += __shfl_xor_sync(0xffffffffu, l[r], 4);
		l[r] += __shfl_xor_sync(0xffffffffu, l[r], 8);
		l[r] += __shfl_xor_sync(0xffffffffu, l[r], 16);
	}
	__syncthreads();
	if (gr == 0)
#pragma unroll
		for (int r = 0; r < 4; r++)
			red[warp * DW_ROWS + DW_ROW(r)] = l[r];
	__syncthreads();
#pragma unroll
	for (int r = 0; r < 4; r++)
		l[r] = red[DW_ROW(r)] + red[DW_ROWS + DW_ROW(r)] + red[2 * DW_ROWS + DW_ROW(r)] + red[3 * DW_ROWS + DW_ROW(r)];

	/* o[s][4j + 2h + e]: dim 64 (4 wg + s) + 16 warp + gr + 8h, query row
	 * DW_ROW(2j + e) */
#pragma unroll
	for (int r = 0; r < 4; r++)
	{
		int			row = DW_ROW(r),
					j = r >> 1,
					e = r & 1;
		uint16_t   *dstb;
		float		mul;
		float	   *dst;

		if (row >= a.gq)
			continue;
		dst = df_row_dst(a, t, g, split, row, m[r], l[r], threadIdx.x < 4, &dstb, &mul);
#pragma unroll
		for (int s = 0; s < 4; s++)
#pragma unroll
			for (int h = 0; h < 2; h++)
			{
				int			d = 64 * (4 * wg + s) + 16 * warp + gr + 8 * h;
				float		v = o[s][4 * j + 2 * h + e] * mul;

				dst[d] = v;
				if (dstb)
					dstb[d] = g4_f32_to_bf16(v);
			}
	}
#undef DW_ROW
#endif
}

attn_kernel_fn
attn_decode_full_kernel_for(int hd, int dtype, int k_eq_v, int gq, int rope_pairs, int wgmma, int *threads, int *smem)
{
	if (dtype != G4_KV_TURBOQUANT_K8V4 || !k_eq_v || gq < 1 || gq > DF_ROWS || hd != 512)
		return NULL;
	if (wgmma && rope_pairs <= DW_ROPE_PAIRS && rope_pairs % 16 == 0)
	{
		*threads = DW_THREADS;
		*smem = DW_SMEM;
		return attn_decode_full_wgmma_kernel<512>;
	}
	*threads = DF_WARPS * 32;
	*smem = df_geom<512>::SMEM;
	return attn_decode_full_kernel<512>;
}
