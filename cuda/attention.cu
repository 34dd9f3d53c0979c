/*
 * attention.cu — attention over the paged KV pool (f32, bf16,
 * turboquant_k8v4; K rebuilt as RoPE(V ⊙ k_norm) on k_eq_v layers).
 *
 * Two kernels, one contract (attention.c): every query row sees the keys
 * [lo, hi) of its token, softmax(q·k·scale)·v, turboquant queries rotated by
 * the Hadamard transform once and outputs rotated back once.
 *
 *  simt  float32 on the CUDA cores, exact to rounding and batch-invariant
 *        (each token splits its own range: attn_simt_splits): one block per
 *        (token, KV head, split) streams the 16-position head blocks of its
 *        range through shared memory (cp.async, double-buffered); four warps
 *        take four keys of each with an online softmax each, lane = a slice
 *        of head_dim.  Decode of layers
 *        with few query heads per KV head (memory-bound), and every shape
 *        the tensor-core kernel does not cover.
 *  tc    f16 tensor cores (m16n8k16), float32 softmax and accumulation
 *        (queries, keys, values and probabilities are normalised-scale
 *        quantities: f16 keeps 11 significant bits where bf16 keeps 8):
 *        a block takes 16·RG query rows (consecutive tokens of one sequence
 *        × the query heads of one KV head), decodes each 16-key pool block
 *        once into shared memory as f16 (K rebuilt with RoPE for k_eq_v)
 *        while the next block's raw bytes are already being loaded, and
 *        splits head_dim over four warps per 16 rows (partial q·k summed
 *        through shared memory, each warp owning a quarter of the output).
 *        Prefill, and decode of layers with many query heads per KV head.
 *
 * Prefill chunks go to attention_prefill.cu: the tc kernel's numerics,
 * FlashAttention-2 style; on k_eq_v layers, prefill runs go to
 * attention_gemm.cu (two cuBLASLt products around a softmax); decode and
 * verify steps on the turboquant pool (a few tokens per sequence) to
 * attention_decode.cu and attention_decode_full.cu.  The choice:
 * choose_kernel.
 *
 * Long ranges are split over blocks (flash-decoding): each writes its
 * partial (max, sum, unnormalised output) per row and attn_merge_kernel
 * combines them by log-sum-exp in split order, one block per row, so
 * results do not depend on timing.
 */
#include <stdlib.h>
#include <string.h>

#include "attention.cuh"

/* ==== simt ======================================================================= */

#define SIMT_WARPS 4

template <int HD>
struct simt_geom
{
	static constexpr int E = HD >= 32 ? HD / 32 : 1;	/* dims per lane */
	static constexpr int LANES = HD / E;	/* lanes holding dims */
	static constexpr int GQMAX = (64 / E) > 32 ? 32 : (64 / E);
};

template <int HD, int DT>
__global__ void __launch_bounds__(SIMT_WARPS * 32)
attn_simt_kernel(attn_args a)
{
	constexpr int E = simt_geom<HD>::E;
	constexpr int LANES = simt_geom<HD>::LANES;
	constexpr int GQMAX = simt_geom<HD>::GQMAX;
	constexpr int U = G4_KV_BLOCK_TOKENS / SIMT_WARPS;	/* keys of a block per warp */
	extern __shared__ __align__(16) unsigned char sm_raw[];
	float	   *sm = reinterpret_cast<float *>(sm_raw);
	float	   *qs = sm;			/* [gq][HD] */
	float	   *ms = sm + a.gq * HD;	/* [warps][gq][HD + 2] */
	/* two head blocks (16 positions of this KV head), staged by cp.async */
	uint8_t    *blk = sm_raw + (((size_t) a.gq * HD + (size_t) SIMT_WARPS * a.gq * (HD + 2)) * 4 + 15) / 16 * 16;
	__shared__ bool blk_ok[2];
	int			t = blockIdx.x / a.n_kv;
	int			g = blockIdx.x % a.n_kv;
	int			split = blockIdx.y;
	int			lane = threadIdx.x & 31;
	int			warp = threadIdx.x >> 5;
	int			gq = a.gq;
	int			lo = a.lo[t],
				hi = a.hi[t];
	int			span = max(hi - lo, 0);
	int			splits = attn_simt_splits(span);
	int			chunk = max((span + splits - 1) / splits, 1);
	int			j0 = lo + split * chunk;
	int			j1 = split < splits ? min(hi, j0 + chunk) : j0;
	int			slot = a.slot[t];
	int			d0 = lane * E;
	bool		dl = lane < LANES;
	int			hbb = (int) a.head_block_bytes;
	float		m[GQMAX],
				l[GQMAX],
				acc[GQMAX][E];

	g4c_pdl_trigger();
	g4c_pdl_wait();
	for (int i = threadIdx.x; i < gq * HD; i += blockDim.x)
		qs[i] = a.q[(size_t) t * a.q_stride + (size_t) g * gq * HD + i];
	__syncthreads();
	if (a.rotated)
		hadamard_rows<HD>(qs, gq, HD);
#pragma unroll
	for (int h = 0; h < GQMAX; h++)
	{
		m[h] = -INFINITY;
		l[h] = 0.0f;
#pragma unroll
		for (int e = 0; e < E; e++)
			acc[h][e] = 0.0f;
	}
	if (j0 < j1)
	{
		int			b0 = j0 / G4_KV_BLOCK_TOKENS,
					b1 = (j1 - 1) / G4_KV_BLOCK_TOKENS;

		/* stage pool block b into buffer b & 1 (one cp.async group) */
		auto		stage = [&] (int b)
		{
			const uint8_t *hb = kv_head_block(a, slot, b * G4_KV_BLOCK_TOKENS, g);
			uint8_t    *dst = blk + (size_t) (b & 1) * hbb;

			if (threadIdx.x == 0)
			{
				blk_ok[b & 1] = hb != NULL;
				if (!hb)
					atomicOr(a.status, G4C_STATUS_KV_MISSING);
			}
			if (hb)
				for (int i = threadIdx.x; i < hbb / 16; i += blockDim.x)
					g4c_cp_async16(dst + i * 16, hb + i * 16, true);
			g4c_cp_async_commit();
		};

		stage(b0);
		for (int b = b0; b <= b1; b++)
		{
			const uint8_t *hb = blk + (size_t) (b & 1) * hbb;

			if (b < b1)
			{
				stage(b + 1);
				g4c_cp_async_wait<1>();
			}
			else
				g4c_cp_async_wait<0>();
			__syncthreads();
			/* keys of this block: warp w takes offsets w, w + 4, w + 8, w + 12 */
			if (blk_ok[b & 1])
			{
				float		key[U][E],
							val[U][E];
				bool		have[U];

#pragma unroll
				for (int u = 0; u < U; u++)
				{
					int			off = warp + u * SIMT_WARPS;
					int			jj = b * G4_KV_BLOCK_TOKENS + off;

					have[u] = jj >= j0 && jj < j1;
					if (have[u] && dl)
					{
						decode_elems<DT, E>(hb, off, HD, d0, true, a.k_eq_v, key[u]);
						if (!a.k_eq_v)
							decode_elems<DT, E>(hb, off, HD, d0, false, false, val[u]);
					}
					else
					{
#pragma unroll
						for (int e = 0; e < E; e++)
							key[u][e] = val[u][e] = 0.0f;
					}
				}
#pragma unroll
				for (int u = 0; u < U; u++)
				{
					int			jj = b * G4_KV_BLOCK_TOKENS + warp + u * SIMT_WARPS;

					if (!have[u])
						continue;	/* warp-uniform */
					if (a.k_eq_v)
					{
						/* k = RoPE(v * k_norm); RoPE pairs (i, i + HD/2) sit
						 * LANES/2 lanes apart */
						bool		upper = lane >= LANES / 2;

#pragma unroll
						for (int e = 0; e < E; e++)
						{
							val[u][e] = key[u][e];
							key[u][e] = dl ? __fmul_rn(key[u][e], a.knorm[d0 + e]) : 0.0f;
						}
#pragma unroll
						for (int e = 0; e < E; e++)
						{
							float		other = __shfl_xor_sync(0xffffffffu, key[u][e], LANES / 2);
							int			i = (upper ? d0 - HD / 2 : d0) + e;

							if (dl && a.inv_freq[i] != 0.0f)
							{
								float		sn,
											co;

								sincosf(__fmul_rn((float) jj, a.inv_freq[i]), &sn, &co);
								key[u][e] = upper ? __fadd_rn(__fmul_rn(key[u][e], co), __fmul_rn(other, sn))
									: __fsub_rn(__fmul_rn(key[u][e], co), __fmul_rn(other, sn));
							}
						}
					}
#pragma unroll
					for (int h = 0; h < GQMAX; h++)
					{
						float		sc = 0.0f,
									p;

						if (h >= gq)
							break;
						if (dl)
						{
#pragma unroll
							for (int e = 0; e < E; e++)
								sc = fmaf(qs[h * HD + d0 + e], key[u][e], sc);
						}
						sc = g4c_warp_sum(sc) * a.scale;
						if (sc > m[h])
						{
							float		corr = expf(m[h] - sc);

#pragma unroll
							for (int e = 0; e < E; e++)
								acc[h][e] *= corr;
							l[h] *= corr;
							m[h] = sc;
						}
						p = expf(sc - m[h]);
						l[h] += p;
#pragma unroll
						for (int e = 0; e < E; e++)
							acc[h][e] = fmaf(p, val[u][e], acc[h][e]);
					}
				}
			}
			__syncthreads();	/* the buffer is refilled two blocks on */
		}
	}

	/* the four warps' states, merged into warp 0's slot */
#pragma unroll
	for (int h = 0; h < GQMAX; h++)
	{
		float	   *dst;

		if (h >= gq)
			break;
		dst = ms + ((size_t) warp * gq + h) * (HD + 2);
		if (lane == 0)
		{
			dst[0] = m[h];
			dst[1] = l[h];
		}
		if (dl)
		{
#pragma unroll
			for (int e = 0; e < E; e++)
				dst[2 + d0 + e] = acc[h][e];
		}
	}
	__syncthreads();
	/* qs is free now: it receives this block's normalised rows */
	attn_finish_token(a, ms, qs, split, SIMT_WARPS, HD, t, g);
}

/* ==== tc ========================================================================= */


template <int HD, int DT, bool KEQV, int RG>
__global__ void __launch_bounds__(128 * RG)
attn_tc_kernel(attn_args a)
{
	using G = tc_geom<HD, DT, KEQV, RG>;
	constexpr int NT_O = G::DW / 8;	/* output n8 tiles per warp */
	extern __shared__ __align__(16) unsigned char sm_raw[];
	unsigned char *sm = sm_raw;
	__shared__ int kr[2];
	unsigned char *Qs = sm;
	unsigned char *Ks = sm + G::Q_BYTES;
	unsigned char *Vs = Ks + 16 * HD * 2;
	float	   *Sx = reinterpret_cast<float *>(sm + G::MAIN_BYTES);
	float	   *knorm_s = Sx + RG * 4 * 256;
	float	   *invf_s = knorm_s + HD;
	int		   *rlo = reinterpret_cast<int *>(invf_s + HD / 2);
	int		   *rhi = rlo + G::R;
	int			tile = blockIdx.x / a.n_kv;
	int			g = blockIdx.x % a.n_kv;
	int			split = blockIdx.y;
	int			t0 = a.tiles[tile];
	int			ntok = a.tiles[tile + 1] - t0;
	int			slot = a.slot[t0];
	int			lane = threadIdx.x & 31;
	int			warp = threadIdx.x >> 5;
	int			rg = warp >> 2,
				dw = warp & 3;
	int			gr = lane >> 2,
				tq = lane & 3;
	int			ks,
				ke;
	float		o[NT_O][4];
	float		mrow[2] = {-INFINITY, -INFINITY},
				lrow[2] = {0.0f, 0.0f};

	g4c_pdl_trigger();
	g4c_pdl_wait();
	if (a.gemm_runs && a.tile_base[t0] >= 0)
		return;
	tile_row_ranges(a, t0, ntok, G::R, rlo, rhi, kr);
	if (KEQV)
	{
		for (int i = threadIdx.x; i < HD; i += blockDim.x)
			knorm_s[i] = a.knorm[i];
		for (int i = threadIdx.x; i < HD / 2; i += blockDim.x)
			invf_s[i] = a.inv_freq[i];
	}
	/* queries as f16 (rotated first for turboquant) */
	tile_queries_f16<HD>(a, t0, ntok, g, G::R, G::ROT, Qs);
	__syncthreads();
	split_range(kr[0], kr[1], a.S, split, 16, &ks, &ke);
#pragma unroll
	for (int i = 0; i < NT_O; i++)
		o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;

	if (ks < ke)
	{
		int			b0 = ks / G4_KV_BLOCK_TOKENS;
		int			b1 = (ke - 1) / G4_KV_BLOCK_TOKENS;
		int			lo0 = rlo[16 * rg + gr],
					hi0 = rhi[16 * rg + gr];
		int			lo1 = rlo[16 * rg + gr + 8],
					hi1 = rhi[16 * rg + gr + 8];
		tc_raw<HD, DT, KEQV, RG> raw;

		lo0 = max(lo0, ks);
		lo1 = max(lo1, ks);
		hi0 = min(hi0, ke);
		hi1 = min(hi1, ke);
		tc_load_raw<HD, DT, KEQV, RG>(a, slot, g, b0, raw);
		for (int b = b0; b <= b1; b++)
		{
			float		sacc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};

			tc_store_block<HD, DT, KEQV, RG>(a, b, ks, ke, raw, Ks, Vs, knorm_s, invf_s);
			if (!raw.ok && threadIdx.x == 0)
				atomicOr(a.status, G4C_STATUS_KV_MISSING);
			__syncthreads();
			/* the next block's bytes travel while this one is used */
			if (b < b1)
				tc_load_raw<HD, DT, KEQV, RG>(a, slot, g, b + 1, raw);

			/* partial q·k over this warp's quarter of the head */
#pragma unroll
			for (int s = 0; s < G::DW / 16; s++)
			{
				uint32_t	af[4],
							bf[4];
				int			d = dw * G::DW + 16 * s;

				g4c_ldmatrix_x4(af, Qs + swz<HD>(16 * rg + (lane & 15), d + 8 * (lane >> 4)));
				g4c_ldmatrix_x4(bf, Ks + swz<HD>((lane & 7) + ((lane >> 4) << 3), d + 8 * ((lane >> 3) & 1)));
				g4c_mma_f16(sacc[0], af, bf[0], bf[1]);
				g4c_mma_f16(sacc[1], af, bf[2], bf[3]);
			}
			{
				float	   *mine = Sx + (rg * 4 + dw) * 256;

#pragma unroll
				for (int nt = 0; nt < 2; nt++)
				{
					*reinterpret_cast<float2 *>(mine + gr * 16 + nt * 8 + 2 * tq) = make_float2(sacc[nt][0], sacc[nt][1]);
					*reinterpret_cast<float2 *>(mine + (gr + 8) * 16 + nt * 8 + 2 * tq) = make_float2(sacc[nt][2], sacc[nt][3]);
				}
			}
			__syncthreads();
			{
				float		sc[2][4];
				float		rmax[2],
							rsum[2],
							corr[2];
				uint32_t	pf[4];

#pragma unroll
				for (int nt = 0; nt < 2; nt++)
#pragma unroll
					for (int e = 0; e < 4; e++)
					{
						int			row = gr + 8 * (e >> 1);
						int			col = nt * 8 + 2 * tq + (e & 1);
						int			kp = b * G4_KV_BLOCK_TOKENS + col;
						float		s = 0.0f;

#pragma unroll
						for (int w = 0; w < 4; w++)
							s += Sx[(rg * 4 + w) * 256 + row * 16 + col];
						s *= a.scale;
						if (e < 2 ? (kp < lo0 || kp >= hi0) : (kp < lo1 || kp >= hi1))
							s = -INFINITY;
						sc[nt][e] = s;
					}
#pragma unroll
				for (int h = 0; h < 2; h++)
				{
					float		mx = fmaxf(fmaxf(sc[0][2 * h], sc[0][2 * h + 1]), fmaxf(sc[1][2 * h], sc[1][2 * h + 1]));
					float		mnew;

					mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
					mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
					mnew = fmaxf(mrow[h], mx);
					rmax[h] = mnew;
					corr[h] = mnew == -INFINITY ? 1.0f : __expf(mrow[h] - mnew);
					mrow[h] = mnew;
				}
#pragma unroll
				for (int nt = 0; nt < 2; nt++)
#pragma unroll
					for (int e = 0; e < 4; e++)
					{
						float		mm = rmax[e >> 1];

						sc[nt][e] = mm == -INFINITY ? 0.0f : __expf(sc[nt][e] - mm);
					}
#pragma unroll
				for (int h = 0; h < 2; h++)
				{
					float		s = sc[0][2 * h] + sc[0][2 * h + 1] + sc[1][2 * h] + sc[1][2 * h + 1];

					s += __shfl_xor_sync(0xffffffffu, s, 1);
					s += __shfl_xor_sync(0xffffffffu, s, 2);
					rsum[h] = s;
					lrow[h] = lrow[h] * corr[h] + rsum[h];
				}
				/* a factor of 1 changes nothing: skipped once the rows'
				 * maxima settle */
				if (!__all_sync(0xffffffffu, corr[0] == 1.0f && corr[1] == 1.0f))
				{
#pragma unroll
					for (int i = 0; i < NT_O; i++)
					{
						o[i][0] *= corr[0];
						o[i][1] *= corr[0];
						o[i][2] *= corr[1];
						o[i][3] *= corr[1];
					}
				}
				pf[0] = g4c_pack_f16(sc[0][0], sc[0][1]);
				pf[1] = g4c_pack_f16(sc[0][2], sc[0][3]);
				pf[2] = g4c_pack_f16(sc[1][0], sc[1][1]);
				pf[3] = g4c_pack_f16(sc[1][2], sc[1][3]);
#pragma unroll
				for (int i = 0; i < NT_O; i += 2)
				{
					uint32_t	vf[4];
					int			d = dw * G::DW + 8 * i;

					g4c_ldmatrix_x4_trans(vf, Vs + swz<HD>((lane & 7) + (((lane >> 3) & 1) << 3), d + 8 * (lane >> 4)));
					g4c_mma_f16(o[i], pf, vf[0], vf[1]);
					g4c_mma_f16(o[i + 1], pf, vf[2], vf[3]);
				}
			}
			__syncthreads();
		}
	}

	/* epilogue: rows 16rg + gr (+8), dims dw·DW + 8i + 2tq (+1) */
	{
		row_map		map = {a.out, a.out_stride, t0, ntok, a.gq, g, HD};
		float	   *st = reinterpret_cast<float *>(sm + G::Q_BYTES);

		if (a.S > 1)
		{
			float	   *part = a.partial + ((size_t) blockIdx.x * a.S + split) * G::R * (HD + 2);

#pragma unroll
			for (int h = 0; h < 2; h++)
			{
				int			r = 16 * rg + gr + 8 * h;

				if (dw == 0 && tq == 0)
				{
					part[(size_t) r * (HD + 2)] = mrow[h];
					part[(size_t) r * (HD + 2) + 1] = lrow[h];
				}
#pragma unroll
				for (int i = 0; i < NT_O; i++)
					*reinterpret_cast<float2 *>(part + (size_t) r * (HD + 2) + 2 + dw * G::DW + 8 * i + 2 * tq) =
						make_float2(o[i][2 * h], o[i][2 * h + 1]);
			}
			return;				/* attn_merge_kernel finishes */
		}
		else
		{
#pragma unroll
			for (int h = 0; h < 2; h++)
			{
				int			r = 16 * rg + gr + 8 * h;
				float		inv = lrow[h] > 0.0f ? 1.0f / lrow[h] : 0.0f;
				float	   *dst = G::ROT ? st + (size_t) r * HD : map.row(r);

				if (!dst)
					continue;
#pragma unroll
				for (int i = 0; i < NT_O; i++)
					*reinterpret_cast<float2 *>(dst + dw * G::DW + 8 * i + 2 * tq) =
						make_float2(o[i][2 * h] * inv, o[i][2 * h + 1] * inv);
			}
			if (!G::ROT)
				return;
			__syncthreads();
		}
		/* turboquant values were rotated: undo once per row */
		tile_store_rotated<HD>(st, G::R, map);
	}
}

/* ==== merge ====================================================================== */

/* One block per (group, row, chunk of 128 head dims): group = the attention
 * kernel's blockIdx.x (tile or token, times KV heads), row = a query row of
 * it; rotated rows take one block for the whole row (the inverse Hadamard
 * transform mixes every dim). */
__global__ void __launch_bounds__(128)
attn_merge_kernel(attn_args a, int rows, int chunks)
{
	extern __shared__ __align__(16) unsigned char sm_raw[];
	float	   *w = reinterpret_cast<float *>(sm_raw);	/* [S] weights */
	float	   *o = w + (a.S + 3) / 4 * 4;	/* [hd], 16-byte aligned */
	__shared__ float red[32];
	int			group = blockIdx.x / (rows * chunks);
	int			r = (blockIdx.x / chunks) % rows;
	int			d_lo = (blockIdx.x % chunks) * (a.hd / chunks);
	int			d_hi = d_lo + a.hd / chunks;
	int			g = group % a.n_kv;
	int			t0,
				ntok;
	const float *part = a.partial + (size_t) group * a.S * rows * (a.hd + 2);
	float		m = -INFINITY,
				l = 0.0f;
	float	   *dst;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	if (a.tiles)
	{
		int			tile = group / a.n_kv;

		t0 = a.tiles[tile];
		ntok = a.tiles[tile + 1] - t0;
	}
	else
	{
		t0 = group / a.n_kv;
		ntok = 1;
	}
	if (r / a.gq >= ntok || (a.gemm_runs && a.tile_base[t0] >= 0))
		return;
	dst = a.out + (size_t) (t0 + r / a.gq) * a.out_stride + (size_t) (g * a.gq + r % a.gq) * a.hd;
	for (int s = threadIdx.x; s < a.S; s += blockDim.x)
		m = fmaxf(m, __ldcg(part + ((size_t) s * rows + r) * (a.hd + 2)));
	m = g4c_block_max(m, red);
	for (int s = threadIdx.x; s < a.S; s += blockDim.x)
	{
		const float *ph = part + ((size_t) s * rows + r) * (a.hd + 2);
		float		ms = __ldcg(ph);
		float		ws = ms == -INFINITY ? 0.0f : expf(ms - m);

		w[s] = ws;
		l += ws == 0.0f ? 0.0f : __ldcg(ph + 1) * ws;
	}
	l = g4c_block_sum(l, red);
	__syncthreads();
	for (int d = d_lo + threadIdx.x; d < d_hi; d += blockDim.x)
	{
		const float *pd = part + (size_t) r * (a.hd + 2) + 2 + d;
		size_t		step = (size_t) rows * (a.hd + 2);
		float		acc = 0.0f;
		int			s = 0;

		/* eight independent loads in flight (empty splits hold zeros) */
		for (; s + 8 <= a.S; s += 8)
		{
			float		v[8];

#pragma unroll
			for (int k = 0; k < 8; k++)
				v[k] = __ldcg(pd + (size_t) (s + k) * step);
#pragma unroll
			for (int k = 0; k < 8; k++)
				acc = fmaf(v[k], w[s + k], acc);
		}
		for (; s < a.S; s++)
			acc = fmaf(__ldcg(pd + (size_t) s * step), w[s], acc);
		o[d] = acc * (l > 0.0f ? 1.0f / l : 0.0f);
	}
	__syncthreads();
	if (a.rotated)
		hadamard_rows_hd(o, 1, a.hd, a.hd);
	for (int d = d_lo + threadIdx.x; d < d_hi; d += blockDim.x)
	{
		dst[d] = o[d];
		if (a.out_bf16)
			a.out_bf16[dst - a.out + d] = g4_f32_to_bf16(o[d]);
	}
}

/* ==== dispatch ===================================================================== */

template <int HD>
static attn_kernel_fn
simt_kernel_for(int dtype)
{
	switch (dtype)
	{
		case G4_KV_F32:
			return attn_simt_kernel<HD, G4_KV_F32>;
		case G4_KV_BF16:
			return attn_simt_kernel<HD, G4_KV_BF16>;
		default:
			return attn_simt_kernel<HD, G4_KV_TURBOQUANT_K8V4>;
	}
}

static attn_kernel_fn
simt_kernel(int hd, int dtype, int *gqmax)
{
	switch (hd)
	{
		case 16:
			*gqmax = simt_geom<16>::GQMAX;
			return simt_kernel_for<16>(dtype);
		case 32:
			*gqmax = simt_geom<32>::GQMAX;
			return simt_kernel_for<32>(dtype);
		case 64:
			*gqmax = simt_geom<64>::GQMAX;
			return simt_kernel_for<64>(dtype);
		case 128:
			*gqmax = simt_geom<128>::GQMAX;
			return simt_kernel_for<128>(dtype);
		case 256:
			*gqmax = simt_geom<256>::GQMAX;
			return simt_kernel_for<256>(dtype);
		case 512:
			*gqmax = simt_geom<512>::GQMAX;
			return simt_kernel_for<512>(dtype);
	}
	*gqmax = 0;
	return NULL;
}

template <int HD, bool KEQV, int RG>
static attn_kernel_fn
tc_kernel_for(int dtype, int *smem)
{
	switch (dtype)
	{
		case G4_KV_F32:
			*smem = tc_geom<HD, G4_KV_F32, KEQV, RG>::SMEM;
			return attn_tc_kernel<HD, G4_KV_F32, KEQV, RG>;
		case G4_KV_BF16:
			*smem = tc_geom<HD, G4_KV_BF16, KEQV, RG>::SMEM;
			return attn_tc_kernel<HD, G4_KV_BF16, KEQV, RG>;
		default:
			*smem = tc_geom<HD, G4_KV_TURBOQUANT_K8V4, KEQV, RG>::SMEM;
			return attn_tc_kernel<HD, G4_KV_TURBOQUANT_K8V4, KEQV, RG>;
	}
}

/* The tensor-core kernel for this geometry, or NULL: head_dim 256 without
 * k_eq_v, 512 with it (the Gemma 4 layers). */
static attn_kernel_fn
tc_kernel(int hd, int k_eq_v, int dtype, int rg, int *smem)
{
	if (hd == 256 && !k_eq_v)
		return rg == 1 ? tc_kernel_for<256, false, 1>(dtype, smem) : tc_kernel_for<256, false, 4>(dtype, smem);
	if (hd == 512 && k_eq_v)
		return rg == 1 ? tc_kernel_for<512, true, 1>(dtype, smem) : tc_kernel_for<512, true, 4>(dtype, smem);
	return NULL;
}

/* Raise a kernel's dynamic shared-memory limit to the most it was asked
 * for (its size may depend on the layer's query heads per KV head). */
static int
allow_smem(g4_cuda *c, attn_kernel_fn fn, int bytes)
{
	static attn_kernel_fn done[32];
	static int	done_bytes[32];
	static int	n_done;
	int			i = 0;

	if (bytes <= 48 * 1024)
		return G4_OK;
	while (i < n_done && done[i] != fn)
		i++;
	if (i < n_done && done_bytes[i] >= bytes)
		return G4_OK;
	G4C_CHECK(c, cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
	if (i == n_done && n_done < 32)
		done[n_done++] = fn;
	if (i < n_done)
		done_bytes[i] = bytes;
	return G4_OK;
}

static int
log2i(int v)
{
	int			l = 0;

	while ((1 << l) < v)
		l++;
	return l;
}

/* Splits of a range of `span` keys for `base` blocks of work: about
 * `per_sm` blocks per SM (latency hiding), at least `min_keys` keys each and
 * at most 1024 splits. */
static int
choose_splits(const g4_cuda *c, int base, int span, int per_sm, int min_keys)
{
	int			want = (per_sm * c->sm_count + base - 1) / base;
	int			most = (span + min_keys - 1) / min_keys;

	if (want > most)
		want = most;
	if (want > 1024)
		want = 1024;
	return want < 1 ? 1 : want;
}

/*
 * Splits for a kernel whose blocks all take about the same time, `resident`
 * of them at once on the GPU: the least estimated time, waves of blocks
 * times a block's keys (span / S) plus its fixed cost, counted as min_keys
 * more (reading the queries, combining the warps' states, writing the
 * partial row); the fewer splits on a tie.  The decode kernel bounds the
 * per-SM rule (choose_splits) with it: at 16 sequences (its registers hold
 * 3 blocks per SM) 5 splits were 1.6 waves and 3 are one full wave, 48.2 ->
 * 38.8 us per sliding layer (runs 40-41); where it asked for more splits
 * than the per-SM rule (64 to 256 sequences) the merging cost more than the
 * waves saved (64: 113.6 -> 118.5 us; 128: 6,328 -> 5,786 tok/s, run 41).
 */
static int
choose_splits_waves(int base, int span, int resident, int min_keys)
{
	int			most = (span + min_keys - 1) / min_keys;
	int			best = 1;
	double		best_cost = 1e30;

	if (most > 1024)
		most = 1024;
	for (int s = 1; s <= most; s++)
	{
		double		waves = (double) (((long) base * s + resident - 1) / resident);
		double		cost = waves * ((double) span / s + min_keys);

		if (cost < best_cost - 1e-9)
		{
			best_cost = cost;
			best = s;
		}
	}
	return best;
}

/* Blocks of fn one SM holds (cached per kernel; 0 after recording an error). */
static int
resident_per_sm(g4_cuda *c, attn_kernel_fn fn, int threads, int smem)
{
	static attn_kernel_fn fns[8];
	static int	counts[8];
	static int	n_fns;
	int			b;

	for (int i = 0; i < n_fns; i++)
		if (fns[i] == fn)
			return counts[i];
	b = g4c_blocks_per_sm(c, (const void *) fn, threads, smem);
	if (b > 0 && n_fns < 8)
	{
		fns[n_fns] = fn;
		counts[n_fns++] = b;
	}
	return b;
}

/* The kernel serving one layer's step, and how its blocks are laid out. */
typedef struct
{
	attn_kernel_fn fn;
	const char *name;
	int			smem;
	int			threads;
	int			rows;			/* query rows of one block */
	int			level;			/* tc: tiles of 2^level tokens; -1: one token per block */
	int			per_sm;			/* blocks resident per SM (how many splits fill the GPU) */
	int			waves;			/* splits also bounded by choose_splits_waves */
	int			min_keys;		/* keys per split, at least */
	int			split_rows;		/* decode kernels: the step's sequences, which the
								 * split count is chosen for (0: its blocks) */
	int			token_splits;	/* float32: each token splits its own span
								 * (attn_simt_splits) */
	int			tc;				/* the tensor-core kernel: k_eq_v prefill runs
								 * may go to attention_gemm.cu instead */
	int			out_bf16;		/* unsplit, it writes out's bf16 copy too
								 * (attn_args.out_bf16) */
} attn_choice;

/* Steps whose sequences bring at most this many consecutive tokens each go
 * to the decode kernels, one block per token: plain decode (1) and verify
 * steps (1 + the drafts, at most 8). */
#define ATTN_DECODE_MAX_RUN 8

/* The k_eq_v decode kernel on warpgroup MMA up to this many sequences, the
 * mma.sync one beyond: alone it is faster at every batch (34.6 against 59.6
 * us a layer at 16 sequences, 97.0 against 120.0 at 64), but in the step
 * only up to 16 (decode B=16 2k 5.79 -> 5.67 ms; B=64 9.46 -> 9.62-9.63,
 * B=128 and 256 the same; RESULTS.md, runs 136-141) */
#define ATTN_DECODE_FULL_WGMMA_MAX_SEQS 16

/*
 * The choice, by shape (figures: test/bench/RESULTS.md):
 *  - decode kernels: turboquant head_dim 256 without k_eq_v
 *    (attention_decode.cu) and head_dim 512 with k_eq_v, up to 16 query
 *    heads per KV head (attention_decode_full.cu: on warpgroup MMA on
 *    sm_90a, G4_ATTN_DECODE_FULL=mma keeping the mma.sync kernel), on
 *    steps whose
 *    sequences bring at most ATTN_DECODE_MAX_RUN tokens each: plain decode
 *    and verify steps.  Their split count is chosen for the step's
 *    sequences, not its tokens, so a verify step computes each token's
 *    attention exactly as the decode step of that token would where both
 *    steps' longest ranges fall in one power-of-two bucket (a verify
 *    step of 5 tokens on the tensor-core kernel: 48.6 us per sliding layer
 *    at batch 1 against 15.6 for a decode step, run 56).
 *    G4_ATTN_DECODE=off turns them off, so benchmarks can time the kernels
 *    they replace on the same shapes;
 *  - prefill kernel (attention_prefill.cu): head_dim 256 without k_eq_v,
 *    where the device holds its shared memory and the step has 64 tokens
 *    or more in tiles a quarter full on average (prefill chunks: a 2k
 *    chunk's sliding layers 33.5 -> 24.3 ms, run 31); its warpgroup-MMA
 *    form on sm_90a for turboquant pools (G4_ATTN_PREFILL=mma keeps the
 *    mma.sync one).  Not verify steps
 *    (5 tokens in a 64-token tile: forced a = 3 drafting at batch 1 fell
 *    from 2.14x to 1.62x of plain decode) nor full layers (11.1 -> 14.6 ms
 *    there).  G4_ATTN=tc keeps the tensor-core kernel;
 *  - tensor cores (64-row tiles when the step's tiles are mostly full,
 *    i.e. prefill; 16-row tiles otherwise) wherever they exist, except for
 *    a step of one token with few query heads per KV head, which the
 *    float32 kernel serves faster (the 12B-shaped decode step at batch 1:
 *    150 tok/s, 136 on tensor cores; run 16);
 *    where it is chosen on a k_eq_v layer, the step's prefill runs go to
 *    the cuBLASLt products of attention_gemm.cu (their key and value rows
 *    within its memory bound), the tc kernel keeping the other tokens;
 *  - float32 for the rest.
 */
static int
choose_kernel(g4_cuda *c, const g4_kv_layer *L, int dtype, int gq, int n, attn_choice *ch)
{
	static const char *dec_env,
			   *tc_env;
	static int	env_read;
	static int	smem_max = -1;
	int			hd = L->head_dim;
	int			gqmax;
	attn_kernel_fn simt = simt_kernel(hd, dtype, &gqmax);
	int			rg = 1;
	attn_kernel_fn tc = NULL;

	if (!env_read)
	{
		/* read once: this runs per layer */
		dec_env = getenv("G4_ATTN_DECODE");
		tc_env = getenv("G4_ATTN");
		env_read = 1;
	}
	if (smem_max < 0)
		G4C_CHECK(c, cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, c->device));
	memset(ch, 0, sizeof(*ch));
	ch->min_keys = ATTN_SPLIT_MIN_KEYS;
	/* runs of consecutive tokens of one sequence: every run fits a tile of
	 * ATTN_DECODE_MAX_RUN tokens when there are as many such tiles as
	 * 64-token ones */
	if (c->n_tiles[log2i(ATTN_DECODE_MAX_RUN)] == c->n_tiles[G4C_TPC_LEVELS - 1] &&
		!(dec_env && strcmp(dec_env, "off") == 0))
	{
		int			seqs = c->n_tiles[G4C_TPC_LEVELS - 1];

		ch->split_rows = seqs;
		ch->fn = attn_decode_kernel_for(hd, dtype, L->k_eq_v, gq, seqs * L->n_kv_heads, c->sm_count, &ch->smem);
		if (ch->fn)
		{
			ch->name = "attention (decode)";
			ch->out_bf16 = 1;
			ch->threads = 128;
			ch->rows = gq;
			ch->level = -1;
			ch->per_sm = 4;
			ch->waves = 1;
			ch->min_keys = 4 * G4_KV_BLOCK_TOKENS;	/* a pool block for each warp */
			return G4_OK;
		}
		/* G4_ATTN_DECODE_FULL=mma keeps the mma.sync k_eq_v kernel on sm_90a
		 * (read at every call: the parity rows set it per row) */
		const char *df_env = getenv("G4_ATTN_DECODE_FULL");
		int			wg = c->wgmma && seqs <= ATTN_DECODE_FULL_WGMMA_MAX_SEQS &&
			!(df_env && strcmp(df_env, "mma") == 0);

		ch->fn = attn_decode_full_kernel_for(hd, dtype, L->k_eq_v, gq, L->rope_pairs, wg, &ch->threads, &ch->smem);
		if (ch->fn)
		{
			ch->name = "attention (decode, k_eq_v)";
			ch->out_bf16 = 1;
			ch->rows = gq;
			ch->level = -1;
			ch->per_sm = 2;		/* its shared memory holds two */
			ch->waves = 1;
			/* two chunks of 64 keys: a split's partial rows (16 x 514
			 * floats, written and merged) cost what ~128 keys of the pool
			 * do.  Against four chunks (run 113): batch 1 at 2k 4.667 ->
			 * 4.589 ms a step (8 splits -> 16), the rest within +-0.3 %;
			 * one chunk cost 14 % at 16 x 32k */
			ch->min_keys = 8 * G4_KV_BLOCK_TOKENS;
			return G4_OK;
		}
	}
	if (!(tc_env && strcmp(tc_env, "tc") == 0))
	{
		/* G4_ATTN_PREFILL=mma keeps the mma.sync prefill kernel on sm_90a
		 * too (read at every call: the parity rows set it per row) */
		const char *pf_env = getenv("G4_ATTN_PREFILL");
		int			wg = c->wgmma && !(pf_env && strcmp(pf_env, "mma") == 0);

		ch->fn = g4c_attention_prefill_kernel(hd, L->k_eq_v, dtype, gq, wg, &ch->rows, &ch->threads, &ch->smem);
		/* tiles at least a quarter full on average */
		if (ch->fn && ch->smem <= smem_max && n >= 64 &&
			4 * n >= c->n_tiles[log2i(ch->rows / gq)] * (ch->rows / gq))
		{
			ch->name = "attention (prefill)";
			ch->level = log2i(ch->rows / gq);
			ch->per_sm = 1;
			return G4_OK;
		}
		ch->fn = NULL;
	}
	if (gq <= 16 && 16 % gq == 0 && 2 * n >= c->n_tiles[log2i(64 / gq)] * (64 / gq) && n >= 64)
		rg = 4;
	if (gq <= 16 && 16 % gq == 0)
		tc = tc_kernel(hd, L->k_eq_v, dtype, rg, &ch->smem);
	if (tc && (gq >= 8 || n >= 2 || !simt || gq > gqmax))
	{
		ch->fn = tc;
		ch->tc = 1;
		ch->name = "attention (tensor cores)";
		ch->threads = 128 * rg;
		ch->rows = 16 * rg;
		ch->level = log2i(16 * rg / gq);
		/* 4 decode blocks, or 1 prefill block of 512 threads */
		ch->per_sm = rg == 1 ? 4 : 1;
		return G4_OK;
	}
	if (!simt || gq > gqmax)
		return G4_ERR_UNSUPPORTED;
	ch->fn = simt;
	ch->name = "attention (float32)";
	ch->out_bf16 = 1;
	ch->smem = ((gq * hd + SIMT_WARPS * gq * (hd + 2)) * (int) sizeof(float) + 15) / 16 * 16 +
		2 * (int) g4_kv_head_block_bytes(dtype, hd, L->k_eq_v);
	ch->threads = SIMT_WARPS * 32;
	ch->rows = gq;
	ch->level = -1;
	ch->token_splits = 1;
	return G4_OK;
}

/* Dry steps (backend.h): the partial results a kernel that splits by
 * choose_splits alone may write for any step: `groups` blocks split only
 * when fewer than per_sm · SMs, into ceil(per_sm · SMs / groups), so that
 * groups · S < 2 · per_sm · SMs.  (The decode kernels split by the step's
 * sequences, and the dry steps run every number of them; the float32
 * kernel by each token's span, whose splits grow with the step.) */
static size_t
split_partial_bound(const g4_cuda *c, const attn_choice *ch, int hd)
{
	if (ch->token_splits || ch->split_rows > 0)
		return 0;
	return 2 * (size_t) ch->per_sm * (size_t) c->sm_count * (size_t) ch->rows * (size_t) (hd + 2) * sizeof(float);
}

/* The chosen kernel over the step (and its split merge); with a->gemm_runs
 * it skips the prefill runs' tiles, and writes no bf16 copy of out, which
 * attention_gemm.cu's rows would leave stale. */
static int
attention_launch(g4_cuda *c, const g4_kv_layer *L, int n, const attn_choice *ch, attn_args *a)
{
	int			hd = L->head_dim;
	int			groups;

	groups = (ch->level >= 0 ? c->n_tiles[ch->level] : n) * a->n_kv;
	{
		int			split_base = ch->split_rows > 0 ? ch->split_rows * a->n_kv : groups;

		if (ch->token_splits)
			a->S = attn_simt_splits(c->span_bucket[L->group]);
		else
			a->S = choose_splits(c, split_base, c->span_bucket[L->group], ch->per_sm, ch->min_keys);
		if (ch->waves)
		{
			int			resident = resident_per_sm(c, ch->fn, ch->threads, ch->smem);

			if (resident <= 0)
				return c->err_code;
			a->S = min(a->S, choose_splits_waves(split_base, c->span_bucket[L->group], resident * c->sm_count,
											   ch->min_keys));
		}
	}
	if (c->dry)
	{
		size_t		bound = split_partial_bound(c, ch, hd);

		if (bound > 0 && !g4c_scratch(c, bound))
			return c->err_code;
	}
	if (a->S > 1)
	{
		a->partial = (float *) g4c_scratch(c, (size_t) groups * a->S * ch->rows * (hd + 2) * sizeof(float));
		if (!a->partial)
			return c->err_code;
	}
	if (allow_smem(c, ch->fn, ch->smem) != G4_OK)
		return c->err_code;
	/* the bf16 copy of out for the o matmul, from the kernel that writes
	 * out last */
	a->out_bf16 = a->S == 1 && ch->out_bf16 && !a->gemm_runs ? g4c_act_bf16_offer(c, a->out, n, a->out_stride) : NULL;
	if (g4c_launch(c, ch->name, ch->fn, dim3(groups, a->S), dim3(ch->threads), (size_t) ch->smem, *a) != G4_OK)
		return c->err_code;
	if (a->S > 1)
	{
		int			chunks = (a->rotated || hd < 256) ? 1 : hd / 128;

		a->out_bf16 = a->gemm_runs ? NULL : g4c_act_bf16_offer(c, a->out, n, a->out_stride);
		return g4c_launch(c, "attention (merge)", attn_merge_kernel, dim3(groups * ch->rows * chunks), dim3(128),
						  ((a->S + 3) / 4 * 4 + hd) * sizeof(float), *a, ch->rows, chunks);
	}
	return G4_OK;
}

int
g4c_attention(g4_backend *be, const g4_kv_layer *L, const float *q, int q_stride, int n, float *out)
{
	g4_cuda    *c = g4c_of(be);
	const g4_kv_pool_desc *kv = &c->kv;
	attn_args	a;
	attn_choice ch;
	int			hd = L->head_dim;
	int			gq;

	if (!c->kv_configured || L->n_kv_heads <= 0 || L->n_heads % L->n_kv_heads != 0)
		return G4_ERR_INTERNAL;
	if (n <= 0)
		return G4_OK;
	if (kv->dtype == G4_KV_TURBOQUANT_K8V4 && (hd & (hd - 1)) != 0)
		return G4_ERR_UNSUPPORTED;
	gq = L->n_heads / L->n_kv_heads;
	if (choose_kernel(c, L, kv->dtype, gq, n, &ch) != G4_OK)
		return c->err_code != G4_OK ? c->err_code : G4_ERR_UNSUPPORTED;

	a.dtype = kv->dtype;
	a.k_eq_v = L->k_eq_v;
	a.rotated = kv->dtype == G4_KV_TURBOQUANT_K8V4 && !L->k_eq_v;
	a.hd = hd;
	a.n_kv = L->n_kv_heads;
	a.gq = gq;
	a.scale = L->scale;
	a.knorm = L->k_norm_w;
	a.inv_freq = L->inv_freq;
	a.rope_pairs = L->rope_pairs;
	a.layer_base = kv->base[L->group] + (size_t) L->index * kv->layer_stride[L->group];
	a.layer_block_bytes = kv->layer_block_bytes[L->group];
	a.head_block_bytes = g4_kv_head_block_bytes(kv->dtype, hd, L->k_eq_v);
	a.table = kv->block_tables[L->group];
	a.max_blocks = kv->max_blocks_per_seq;
	a.q = q;
	a.q_stride = q_stride;
	a.out = out;
	a.out_stride = L->n_heads * hd;
	a.out_bf16 = NULL;
	a.slot = c->d_slot;
	a.lo = c->d_lo[L->group];
	a.hi = c->d_hi[L->group];
	a.status = c->d_status;
	a.partial = NULL;
	a.tiles = ch.level >= 0 ? c->d_tiles[ch.level] : NULL;
	a.tile_base = c->d_tile_base;
	a.gemm_runs = ch.tc && L->group == G4_KVG_FULL && g4c_attention_gemm_serves(c, &a);
	if (c->dry && ch.tc && L->group == G4_KVG_FULL && g4c_attention_gemm_dry(c, &a) != G4_OK)
		return c->err_code;
	if (a.gemm_runs)
	{
		/* the runs' tokens on cuBLASLt; the tc kernel for the others, if any */
		const int32_t *runs = c->h_meta + (c->d_tile_runs - c->d_meta);
		int			rest = n;

		for (int r = 0; r < c->n_tile_runs; r++)
			rest -= runs[G4C_RUN_INTS * r + 5];
		if (rest > 0 && attention_launch(c, L, n, &ch, &a) != G4_OK)
			return c->err_code;
		return g4c_attention_gemm(c, &a);
	}
	return attention_launch(c, L, n, &ch, &a);
}
