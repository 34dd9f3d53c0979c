/*
 * gemv_w4.cu — the int4 group-32 matmul for 1 to 4 activation rows (decode):
 * a tensor-core GEMV over the packed W_I4 layout (cuda_common.cuh) that keeps
 * several k-tiles of weight loads in flight per warp (the best of nine
 * variants measured standalone: test/bench/RESULTS.md, "The int4 GEMV").
 *
 * Design:
 *  - each lane loads its own 16 bytes of a tile with one 128-bit
 *    ld.global.nc.L1::no_allocate straight into registers, plus its rows'
 *    two scale words: no shared-memory staging of weights;
 *  - a warp owns one unit (16 output rows) and a range of consecutive
 *    k-tiles, held in two register buffers of GEMV_U = 2 tiles: one
 *    buffer's loads are in flight while the other is dequantised and
 *    multiplied, then refilled.  Each (tile, group of 32 columns) is its own
 *    2-MMA chain started from zero, scaled into float32 accumulators
 *    (tile_mma of matmul.cuh);
 *  - 8 warps per block, 8 units per block (SKINNY_WARPS: the unit groups of
 *    the skinny kernel); K is split over blocks, per matrix: the split with
 *    the fewest k-tiles per warp that keeps every block resident in one
 *    wave (ties: the smaller split; residency from the occupancy
 *    calculator, once).  Partial sums [ksplit][n][out] go to the scratch
 *    and the last block of each unit group (an integer count) adds them in
 *    split order and resets its counter (skinny_item_end of matmul.cuh):
 *    deterministic, no float atomics;
 *  - the rows' activations are staged once per block, for the block's K
 *    range, in shared memory as B fragments: row r's bf16 high part in
 *    column 2r and its low part in column 2r + 1 of the n8 tile (x = hi +
 *    lo + e, |e| <= 2^-17 |x|), columns of absent rows zero.  One MMA forms
 *    both products of all rows exactly (codes are exact in bf16), so 1 to 4
 *    rows cost the MMAs of one, and y[r] = C[2r] + C[2r + 1]: float32-class
 *    sums, as the skinny kernel's SPLIT mode;
 *  - programmatic dependent launch: the first 2U tiles' loads are issued
 *    before g4c_pdl_wait (weights are never written by a kernel of the
 *    step), x is read and y, the partial sums and the counters touched
 *    after it.
 *
 * Measured standalone on the H200 (one row, 12B-shaped Gemma 4): qkv
 * 6144x3840 8.2 us, gate_up 30720x3840 20.5 us, down 3840x15360 12.5 us,
 * o 3840x4096 6.6 us; the int4 matmuls of a whole decode step 2,324 us
 * (2.54 TB/s) against 4,073 us for the skinny kernel; max error 4.1e-7 of
 * Σ|w·x| (bound 3e-5), bit-deterministic.  2 to 4 rows read the same weight
 * bytes with the same MMAs; they only stage 2 to 4 times the activations
 * (1 KiB per k-tile) and partial sums, both small next to the weights.
 * 64 registers (sm_90), no spills.
 */
#include "matmul.cuh"

#define GEMV_U 2				/* tiles per register buffer (two buffers) */
#define GEMV_MINB 4				/* blocks per SM the registers allow: 32 warps */
#define GEMV_XS_KTILE skinny_xs_per_ktile(1)	/* staged activations per k-tile: 1 KiB */
#define GEMV_NK_MAX 256			/* k-tiles a block may stage: above any GPU's shared memory */

/* 16 streamed bytes of codes: read once, kept out of L1.  Volatile keeps the
 * PTX order (loads before the MMAs that follow them). */
__device__ __forceinline__ uint4
gemv_ld_stream(const uint4 *p)
{
	uint4		r;

	asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
				 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
	return r;
}

/* A scale word; L1 may keep its line: the next tiles' scales share it. */
__device__ __forceinline__ uint32_t
gemv_ld_scale(const uint32_t *p)
{
	uint32_t	r;

	asm volatile("ld.global.nc.u32 %0, [%1];\n" : "=r"(r) : "l"(p));
	return r;
}

/* Issue the loads of tiles i .. i + GEMV_U - 1 of the warp's nt tiles. */
__device__ __forceinline__ void
gemv_fetch(wtile<G4C_W_I4> b[GEMV_U], const uint4 *wp, const uint32_t *sp, int i, int nt)
{
#pragma unroll
	for (int j = 0; j < GEMV_U; j++)
		if (i + j < nt)			/* warp-uniform */
		{
			b[j].w = gemv_ld_stream(wp + (size_t) (i + j) * 32);
			b[j].s_lo = gemv_ld_scale(sp + (size_t) (i + j) * 16);
			b[j].s_hi = gemv_ld_scale(sp + (size_t) (i + j) * 16 + 8);
		}
}

/* Dequantise and multiply tiles i .. i + GEMV_U - 1 (staged k-tiles of the
 * block's range); tile j of a buffer adds into accumulator set j, so that
 * the scale FMAs form GEMV_U independent chains. */
__device__ __forceinline__ void
gemv_consume(const wtile<G4C_W_I4> b[GEMV_U], float acc[GEMV_U][1][4], const void *xs, int i, int nt, int lane)
{
#pragma unroll
	for (int j = 0; j < GEMV_U; j++)
		if (i + j < nt)
			tile_mma<1, true>(acc[j], b[j], xs, i + j, lane);
}

/*
 * The activations of k-tiles [kt0, kt0 + nk) as B fragments, in the layout
 * stage_x<1, true> (matmul.cuh) writes: entry (k16 step s, lane 4c + t) =
 * {x[k], x[k+1]}, {x[k+8], x[k+9]} of column c at k = 64 kt0 + 16 s + 2 t,
 * column 2r the bf16 high parts of row r, 2r + 1 its low parts, zero for
 * rows >= n and beyond K.  Unlike stage_x (an item per entry), an item is
 * (s, t) for all four rows, its eight loads in flight together: a thread
 * waits for L2 once per item whatever n, as the lab did for one row (two
 * items per thread for gate_up's 30 k-tiles, not eight), and the staging is
 * on the critical path of every block.
 */
__device__ __forceinline__ void
gemv_stage_x(const float *x, int n, int K, int kt0, int nk, uint2 *xs)
{
	for (int e = threadIdx.x; e < nk * 16; e += blockDim.x)
	{
		int			t = e & 3,
					s = e >> 2;
		int			k = 64 * kt0 + 16 * s + 2 * t;
		float2		v0[4],
					v1[4];

#pragma unroll
		for (int r = 0; r < 4; r++)
		{
			v0[r] = v1[r] = make_float2(0.0f, 0.0f);
			if (r < n)
			{
				const float *row = x + (size_t) r * (size_t) K;

				if (k < K)
					v0[r] = *reinterpret_cast<const float2 *>(row + k);
				if (k + 8 < K)
					v1[r] = *reinterpret_cast<const float2 *>(row + k + 8);
			}
		}
#pragma unroll
		for (int r = 0; r < 4; r++)
		{
			uint32_t	h0,
						l0,
						h1,
						l1;

			g4c_split_bf16(v0[r].x, v0[r].y, &h0, &l0);
			g4c_split_bf16(v1[r].x, v1[r].y, &h1, &l1);
			xs[s * 32 + 8 * r + t] = make_uint2(h0, h1);
			xs[s * 32 + 8 * r + 4 + t] = make_uint2(l0, l1);
		}
	}
}

/* blockIdx.x, read again: the epilogue recomputes its indices instead of
 * keeping them live across the main loop (registers are the occupancy
 * limit) */
__device__ __forceinline__ int
gemv_block_index(void)
{
	int			b;

	asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(b));
	return b;
}

/*
 * Block b = (unit group ug = b % n_ug, K range ks = b / n_ug), ranges of
 * floor / ceil(KT / ksplit) k-tiles; warp w takes unit 8 ug + w over the
 * whole range.  The arguments are the skinny kernel's (one work item per
 * block; kr is the longest range).
 */
__global__ void __launch_bounds__(SKINNY_WARPS * 32, GEMV_MINB)
gemv_i4_kernel(skinny_args a)
{
	extern __shared__ __align__(128) unsigned char smem[];
	__shared__ bool last;
	const int	lane = threadIdx.x & 31,
				warp = threadIdx.x >> 5;
	const int	ug = blockIdx.x % a.n_ug,
				ks = blockIdx.x / a.n_ug;
	const int	kt0 = (int) ((int64_t) ks * a.KT / a.ksplit),
				kt1 = (int) ((int64_t) (ks + 1) * a.KT / a.ksplit);
	const int	u = ug * SKINNY_WARPS + warp;
	const int	nt = u < a.U ? kt1 - kt0 : 0;	/* k-tiles of this warp */
	const size_t tile0 = (size_t) (u < a.U ? u : 0) * (size_t) a.KT + (size_t) kt0;
	const uint4 *wp = a.tiles + tile0 * 32 + lane;
	const uint32_t *sp = a.scales + tile0 * 16 + (lane >> 2);
	wtile<G4C_W_I4> b0[GEMV_U],
				b1[GEMV_U];
	float		acc[GEMV_U][1][4],
				sum[1][4];

#pragma unroll
	for (int j = 0; j < GEMV_U; j++)
		acc[j][0][0] = acc[j][0][1] = acc[j][0][2] = acc[j][0][3] = 0.0f;
	g4c_pdl_trigger();
	/* 2U tiles in flight before anything else */
	gemv_fetch(b0, wp, sp, 0, nt);
	gemv_fetch(b1, wp, sp, GEMV_U, nt);
	/* Always true (ksplit >= 1), so the wait stays unconditional; written
	 * plainly, ptxas (nvcc 13.0) scheduled griddepcontrol.wait above the .nc
	 * loads, which defeats the overlap; behind a branch it stays after them
	 * (checked in the sm_90 SASS). */
	if (a.ksplit > 0)
		g4c_pdl_wait();
	gemv_stage_x(a.x, a.n, a.K, kt0, kt1 - kt0, reinterpret_cast<uint2 *>(smem));
	__syncthreads();
	for (int i = 0; i < nt; i += 2 * GEMV_U)
	{
		gemv_consume(b0, acc, smem, i, nt, lane);	/* b1 in flight */
		gemv_fetch(b0, wp, sp, i + 2 * GEMV_U, nt);
		gemv_consume(b1, acc, smem, i + GEMV_U, nt, lane);	/* b0 in flight */
		gemv_fetch(b1, wp, sp, i + 3 * GEMV_U, nt);
	}
#pragma unroll
	for (int e = 0; e < 4; e++)
	{
		sum[0][e] = acc[0][0][e];
#pragma unroll
		for (int j = 1; j < GEMV_U; j++)
			sum[0][e] += acc[j][0][e];
	}
	{
		const int	b = gemv_block_index();
		const int	bug = b % a.n_ug;

		/* lane (g, t) holds rows g and g + 8 of activation row t: C[2t]
		 * (high parts) + C[2t + 1] (low parts) */
		skinny_item_end<1, true>(a, b / a.n_ug, bug, bug * SKINNY_WARPS + warp, lane, sum, &last);
	}
}

/* Resident blocks per SM with nk k-tiles of activations staged (0: they do
 * not fit), from a table built once. */
static int
gemv_residency(g4_cuda *c, int nk, int *blocks)
{
	static int	table[GEMV_NK_MAX + 1];
	static int	top = -1;		/* most k-tiles a block may stage; -1: no table yet */

	if (top < 0)
	{
		cudaFuncAttributes fa;
		int			optin = 0,
					xs_max;

		G4C_CHECK(c, cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, c->device));
		G4C_CHECK(c, cudaFuncGetAttributes(&fa, gemv_i4_kernel));
		xs_max = min(optin - (int) fa.sharedSizeBytes, GEMV_NK_MAX * GEMV_XS_KTILE);
		G4C_CHECK(c, cudaFuncSetAttribute(gemv_i4_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, xs_max));
		for (int k = 1; k * GEMV_XS_KTILE <= xs_max; k++)
			G4C_CHECK(c, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&table[k], gemv_i4_kernel, SKINNY_WARPS * 32,
																	   (size_t) k * GEMV_XS_KTILE));
		top = xs_max / GEMV_XS_KTILE;
	}
	*blocks = nk <= top ? table[nk] : 0;
	return G4_OK;
}

int
g4c_gemv_i4(g4_cuda *c, const g4_weight *w, const float *x, int n, float *y)
{
	skinny_args a;
	int			KT = (int) w->ktiles;
	int			n_ug = (int) ((w->units + SKINNY_WARPS - 1) / SKINNY_WARPS);
	int			ksplit = 0,
				nk = 0;

	if (n <= 0)
		return G4_OK;
	if (n > 4)
		return G4_ERR_UNSUPPORTED;
	/* The split: the fewest k-tiles per warp (the longest range, nk) among
	 * the splits whose blocks are all resident at once; the first split
	 * whose activations fit is taken whatever its waves (unsplit, where one
	 * block per unit group is already more than one wave). */
	for (int ks = 1; ks <= KT; ks++)
	{
		int			m = (KT + ks - 1) / ks,
					occ = 0;

		if (gemv_residency(c, m, &occ) != G4_OK)
			return c->err_code;
		if (occ <= 0)
			continue;
		if (ksplit > 0 && (int64_t) n_ug * ks > (int64_t) occ * c->sm_count)
			break;
		if (ksplit == 0 || m < nk)
		{
			ksplit = ks;
			nk = m;
		}
	}
	if (ksplit == 0)
		return G4_ERR_UNSUPPORTED;
	a.tiles = (const uint4 *) w->data;
	a.scales = (const uint32_t *) w->scales;
	a.x = x;
	a.n = n;
	a.K = (int) w->in;
	a.N = (int) w->out;
	a.KT = KT;
	a.U = (int) w->units;
	a.n_ug = n_ug;
	a.kr = nk;
	a.ksplit = ksplit;
	a.per_cta = 1;
	a.y = y;
	a.partial = NULL;
	a.counters = NULL;
	if (ksplit > 1)
	{
		/* sizes fixed by the shape and n: a recorded step graph stays valid */
		a.partial = (float *) g4c_scratch(c, (size_t) ksplit * (size_t) n * (size_t) w->out * sizeof(float));
		a.counters = g4c_counters(c, (size_t) n_ug);
		if (!a.partial || !a.counters)
			return c->err_code;
	}
	return g4c_launch(c, "matmul (int4 gemv)", gemv_i4_kernel, dim3((unsigned) (n_ug * ksplit)),
					  dim3(SKINNY_WARPS * 32), (size_t) nk * GEMV_XS_KTILE, a);
}
