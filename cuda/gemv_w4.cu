/*
 * gemv_w4.cu — the int4 group-32 matmul for 1 to 16 activation rows (decode
 * and small decode batches; on Hopper 1 to 8, the warpgroup-MMA kernel
 * being faster beyond; more rows go to the gemms, g4c_matmul_i4): a
 * tensor-core GEMV over the packed W_I4 layout
 * (cuda_common.cuh) that keeps several k-tiles of weight loads in flight per
 * warp (the best of nine variants measured standalone:
 * test/bench/RESULTS.md, "The int4 GEMV").
 *
 * Design:
 *  - each lane loads its own 16 bytes of a tile with one 128-bit
 *    ld.global.nc.L1::no_allocate straight into registers, plus its rows'
 *    two scale words: no shared-memory staging of weights;
 *  - a warp owns one unit (16 output rows) and a range of consecutive
 *    k-tiles, held in two register buffers of gemv_u(NT) tiles (2, and 4
 *    for 9 to 16 rows, whose kernel is held to 2 blocks per SM: more bytes
 *    in flight per warp, 4 % faster on gate_up at 16 rows, run 20): one
 *    buffer's loads are in flight while the other is dequantised and
 *    multiplied, then refilled.  Each (tile, group of 32 columns) is its own
 *    2-MMA chain started from zero, scaled into float32 accumulators
 *    (tile_mma of matmul.cuh);
 *  - 8 warps per block, 8 units per block (SKINNY_WARPS: the unit groups of
 *    the skinny kernel); K is split over blocks, per matrix: the split with
 *    the fewest k-tiles per warp that keeps every block resident in one
 *    wave (ties: the smaller split; residency from the occupancy
 *    calculator, once per tile count), and where none does, the fewest
 *    rounds of resident blocks times k-tiles + 1.  Partial sums
 *    [ksplit][n][out] go to the scratch and the last block of each unit
 *    group (an integer count) adds them in split order and resets its
 *    counter (skinny_item_end of matmul.cuh): deterministic, no float
 *    atomics;
 *  - the rows' activations are staged once per block, for the block's K
 *    range, in shared memory as the B fragments of NT n8 tiles, 4 rows per
 *    tile, in the layout of the skinny kernel: row r's bf16
 *    high part in column 2 (r % 4) and its low part in column 2 (r % 4) + 1
 *    of tile r / 4 (x = hi + lo + e, |e| <= 2^-17 |x|), columns of absent
 *    rows zero.  One MMA per tile forms both products of its rows exactly
 *    (codes are exact in bf16), and y[r] = C[2 (r % 4)] + C[2 (r % 4) + 1]
 *    of tile r / 4: float32-class sums, as the skinny kernel;
 *  - NT = 1 tile serves 1 to 4 rows, 2 tiles 5 to 8, 4 tiles 9 to 16
 *    (gemv_run instantiations).  Every NT streams the same weight bytes with
 *    the same loads; a k16 step costs NT MMAs, the accumulators grow NT
 *    times (so do the registers: fewer blocks per SM, gemv_minb) and a
 *    k-tile stages NT KiB of activations;
 *  - programmatic dependent launch: the first 2U tiles' loads are issued
 *    before g4c_pdl_wait (weights are never written by a kernel of the
 *    step), x is read and y, the partial sums and the counters touched
 *    after it.
 *
 * Measured standalone on the H200 (one row, 12B-shaped Gemma 4): qkv
 * 6144x3840 8.2 us, gate_up 30720x3840 20.5 us, down 3840x15360 12.5 us,
 * o 3840x4096 6.6 us; the int4 matmuls of a whole decode step 2,324 us
 * (2.54 TB/s) against 4,073 us for the skinny kernel; max error 4.1e-7 of
 * Σ|w·x| (bound 3e-5), bit-deterministic.  2 to 4 rows (one tile) read the
 * same weight bytes with the same MMAs; they only stage 2 to 4 times the
 * activations (1 KiB per k-tile) and partial sums, both small next to the
 * weights.
 * Registers (sm_90 / sm_80, no spills): NT = 1 64 / 63 (4 blocks of 8 warps
 * per SM), NT = 2 80 / 80 (3 blocks), NT = 4 128 / 128 (2 blocks).
 */
#include "matmul.cuh"

/* Tiles per register buffer (two buffers) and independent accumulator sets
 * (the scale FMAs' chains) for NT n8 tiles. */
__host__ __device__ constexpr int
gemv_u(int nt)
{
	return nt == 4 ? 4 : 2;
}

__host__ __device__ constexpr int
gemv_chains(int nt)
{
	return nt == 1 ? 2 : 1;
}
#define GEMV_NK_MAX 256			/* k-tiles a block may stage: above any GPU's shared memory */

/* Blocks per SM that the registers of NT tiles allow (__launch_bounds__):
 * the most that spill nothing.  Unbounded, ptxas takes 64 / 94 / 142
 * registers for NT = 1 / 2 / 4 (sm_90); 3 blocks give NT = 2 80 and 2
 * blocks NT = 4 128, without spills. */
constexpr int
gemv_minb(int nt)
{
	return nt == 1 ? 4 : nt == 2 ? 3 : 2;
}

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

/* Issue the loads of tiles i .. i + U - 1 of the warp's nt tiles. */
template <int U>
__device__ __forceinline__ void
gemv_fetch(wtile<G4C_W_I4> b[U], const uint4 *wp, const uint32_t *sp, int i, int nt)
{
#pragma unroll
	for (int j = 0; j < U; j++)
		if (i + j < nt)			/* warp-uniform */
		{
			b[j].w = gemv_ld_stream(wp + (size_t) (i + j) * 32);
			b[j].s_lo = gemv_ld_scale(sp + (size_t) (i + j) * 16);
			b[j].s_hi = gemv_ld_scale(sp + (size_t) (i + j) * 16 + 8);
		}
}

/* Dequantise and multiply tiles i .. i + U - 1 (staged k-tiles of the
 * block's range); tile j of a buffer adds into accumulator set j % C, so
 * that the scale FMAs form C independent chains (with NT > 1 the NT tiles'
 * chains are independent already). */
template <int NT>
__device__ __forceinline__ void
gemv_consume(const wtile<G4C_W_I4> b[gemv_u(NT)], float acc[gemv_chains(NT)][NT][4], const void *xs, int i, int nt,
			 int lane)
{
#pragma unroll
	for (int j = 0; j < gemv_u(NT); j++)
		if (i + j < nt)
			tile_mma<NT>(acc[j % gemv_chains(NT)], b[j], xs, i + j, lane);
}

/*
 * The activations of k-tiles [kt0, kt0 + nk) as the B fragments of NT n8
 * tiles, in the layout stage_x<NT> (matmul.cuh) writes: entry (k16
 * step s, tile q, lane 4c + t), at 32 (NT s + q) + 4c + t, = {x[k], x[k+1]},
 * {x[k+8], x[k+9]} of column c at k = 64 kt0 + 16 s + 2 t.  Row r is in tile
 * q = r / 4, its bf16 high parts in column c = 2 (r % 4), its low parts in
 * c + 1: entries 32 NT s + 8 r + t and 32 NT s + 8 r + 4 + t.  Zero for rows
 * >= n and beyond K.  Unlike stage_x (an item per entry), an item is (s, t)
 * for all 4 NT rows, its 8 NT loads in flight together: a thread waits for
 * L2 once per item whatever n, as the lab did for one row (two items per
 * thread for gate_up's 30 k-tiles, where stage_x has 8 NT times as many),
 * and the staging is on the critical path of every block.
 */
template <int NT>
__device__ __forceinline__ void
gemv_stage_x(const float *x, int n, int K, int kt0, int nk, uint2 *xs)
{
	for (int e = threadIdx.x; e < nk * 16; e += blockDim.x)
	{
		int			t = e & 3,
					s = e >> 2;
		int			k = 64 * kt0 + 16 * s + 2 * t;
		float2		v0[4 * NT],
					v1[4 * NT];

#pragma unroll
		for (int r = 0; r < 4 * NT; r++)
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
		for (int r = 0; r < 4 * NT; r++)
		{
			uint32_t	h0,
						l0,
						h1,
						l1;

			g4c_split_bf16(v0[r].x, v0[r].y, &h0, &l0);
			g4c_split_bf16(v1[r].x, v1[r].y, &h1, &l1);
			xs[32 * NT * s + 8 * r + t] = make_uint2(h0, h1);
			xs[32 * NT * s + 8 * r + 4 + t] = make_uint2(l0, l1);
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
template <int NT>
__global__ void __launch_bounds__(SKINNY_WARPS * 32, gemv_minb(NT))
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
	constexpr int U = gemv_u(NT),
				C = gemv_chains(NT);
	wtile<G4C_W_I4> b0[U],
				b1[U];
	float		acc[C][NT][4],
				sum[NT][4];

#pragma unroll
	for (int j = 0; j < C; j++)
#pragma unroll
		for (int q = 0; q < NT; q++)
			acc[j][q][0] = acc[j][q][1] = acc[j][q][2] = acc[j][q][3] = 0.0f;
	g4c_pdl_trigger();
	/* 2U tiles in flight before anything else */
	gemv_fetch<U>(b0, wp, sp, 0, nt);
	gemv_fetch<U>(b1, wp, sp, U, nt);
	/* Always true (ksplit >= 1), so the wait stays unconditional; written
	 * plainly, ptxas (nvcc 13.0) scheduled griddepcontrol.wait above the .nc
	 * loads, which defeats the overlap; behind a branch it stays after them
	 * (checked in the sm_90 SASS of each NT). */
	if (a.ksplit > 0)
		g4c_pdl_wait();
	gemv_stage_x<NT>(a.x, a.n, a.K, kt0, kt1 - kt0, reinterpret_cast<uint2 *>(smem));
	__syncthreads();
	for (int i = 0; i < nt; i += 2 * U)
	{
		gemv_consume<NT>(b0, acc, smem, i, nt, lane);	/* b1 in flight */
		gemv_fetch<U>(b0, wp, sp, i + 2 * U, nt);
		gemv_consume<NT>(b1, acc, smem, i + U, nt, lane);	/* b0 in flight */
		gemv_fetch<U>(b1, wp, sp, i + 3 * U, nt);
	}
#pragma unroll
	for (int q = 0; q < NT; q++)
#pragma unroll
		for (int e = 0; e < 4; e++)
		{
			sum[q][e] = acc[0][q][e];
#pragma unroll
			for (int j = 1; j < C; j++)
				sum[q][e] += acc[j][q][e];
		}
	{
		const int	b = gemv_block_index();
		const int	bug = b % a.n_ug;

		/* lane (g, t) holds rows g and g + 8 of activation row 4q + t in
		 * tile q: C[2t] (high parts) + C[2t + 1] (low parts) */
		skinny_item_end<NT>(a, b / a.n_ug, bug, bug * SKINNY_WARPS + warp, lane, sum, &last);
	}
}

/* Resident blocks per SM of the NT-tile kernel with nk k-tiles of
 * activations staged (0: they do not fit), from a table built once per NT. */
template <int NT>
static int
gemv_residency(g4_cuda *c, int nk, int *blocks)
{
	constexpr int per_kt = skinny_xs_per_ktile(NT);	/* NT KiB */
	static int	table[GEMV_NK_MAX + 1];
	static int	top = -1;		/* most k-tiles a block may stage; -1: no table yet */

	if (top < 0)
	{
		cudaFuncAttributes fa;
		int			optin = 0,
					xs_max;

		G4C_CHECK(c, cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, c->device));
		G4C_CHECK(c, cudaFuncGetAttributes(&fa, gemv_i4_kernel<NT>));
		xs_max = min(optin - (int) fa.sharedSizeBytes, GEMV_NK_MAX * per_kt);
		G4C_CHECK(c, cudaFuncSetAttribute(gemv_i4_kernel<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, xs_max));
		for (int k = 1; k * per_kt <= xs_max; k++)
			G4C_CHECK(c, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&table[k], gemv_i4_kernel<NT>,
																	   SKINNY_WARPS * 32, (size_t) k * per_kt));
		top = xs_max / per_kt;
	}
	*blocks = nk <= top ? table[nk] : 0;
	return G4_OK;
}

/* n <= 4 NT rows through the NT-tile kernel */
template <int NT>
static int
gemv_run(g4_cuda *c, const g4_weight *w, const float *x, int n, float *y)
{
	skinny_args a;
	int			KT = (int) w->ktiles;
	int			n_ug = (int) ((w->units + SKINNY_WARPS - 1) / SKINNY_WARPS);
	int			ksplit = 0,
				nk = 0;
	int64_t		best = 0;

	/* The split: the fewest k-tiles per warp (the longest range, nk) among
	 * the splits whose blocks are all resident at once (ties: the smaller
	 * split).  Where none is (many unit groups, or 2 and 4 tiles' staged
	 * activations leaving room for few blocks, as for gate_up), the fewest
	 * rounds of resident blocks times nk + 1, the 1 for a block's fixed
	 * costs (staging, first loads, reduction), rather than the first split
	 * that fits, which may hold one block per SM for several rounds. */
	for (int ks = 1; ks <= KT; ks++)
	{
		int			m = (KT + ks - 1) / ks,
					occ = 0;
		int64_t		slots,
					rounds,
					cost;

		if (gemv_residency<NT>(c, m, &occ) != G4_OK)
			return c->err_code;
		if (occ <= 0)
			continue;
		slots = (int64_t) occ * c->sm_count;
		rounds = ((int64_t) n_ug * ks + slots - 1) / slots;
		/* one round ranks before any split of more (m <= KT) */
		cost = rounds == 1 ? m : KT + rounds * (m + 1);
		if (ksplit == 0 || cost < best)
		{
			best = cost;
			ksplit = ks;
			nk = m;
		}
	}
	if (ksplit == 0)
		return G4_ERR_UNSUPPORTED;
	/* one work item per block; kr is the longest range */
	if (skinny_args_init(c, w, x, n, y, ksplit, nk, 1, &a) != G4_OK)
		return c->err_code;
	return g4c_launch(c, "matmul (int4 gemv)", gemv_i4_kernel<NT>, dim3((unsigned) (n_ug * ksplit)),
					  dim3(SKINNY_WARPS * 32), (size_t) nk * skinny_xs_per_ktile(NT), a);
}

/* The smallest tile count that holds the n rows (4 per n8 tile). */
int
g4c_gemv_i4(g4_cuda *c, const g4_weight *w, const float *x, int n, float *y)
{
	if (n <= 0)
		return G4_OK;
	if (n <= 4)
		return gemv_run<1>(c, w, x, n, y);
	if (n <= 8)
		return gemv_run<2>(c, w, x, n, y);
	if (n <= 16)
		return gemv_run<4>(c, w, x, n, y);
	return G4_ERR_UNSUPPORTED;
}
