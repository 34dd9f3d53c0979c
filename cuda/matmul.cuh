/*
 * matmul.cuh — the tensor-core matmul kernels shared by the packed weight
 * formats (W_I4, W_BF16; layouts in cuda_common.cuh): y[n][N] = x[n][K]·Wᵀ.
 *
 * skinny (decode, n <= 8, bf16 weights; int4 weights use its staging
 * layout, tile_mma and skinny_item_end in the GEMV of gemv_w4.cu for 1 to
 * 16 rows and the gemm beyond): weights are the A operand (16 output rows per
 * m16n8k16 tile), the n token rows the B operand (n8 tiles).  A persistent
 * grid; each warp streams one unit of 16 rows over a range of k-tiles
 * through its own ring of shared-memory slots filled by cp.async (3 k-tiles
 * in flight); the block's 8 warps share the activations of the range, staged
 * once in shared memory in fragment order.  K is split into ranges where
 * that balances the blocks; the last block of each unit group (an atomic
 * count) adds the partial sums in a fixed order, so results are
 * deterministic.  Every activation is the sum of two bf16 (hi + lo, residual
 * <= 2^-17 relative), placed in adjacent columns of one B tile so that a
 * single MMA forms both products; int4 codes and bf16 weights are exact in
 * bf16, so products carry float32-class error; group scales multiply
 * float32 partial sums.
 *
 * gemm (bf16 weights n > 8; int4 weights from 17 rows up to the cuBLASLt
 * threshold of g4c_matmul_i4): 32, 64 or 128 x 256 block tiles, 8 warps of
 * (32, 64 or 128) x 32, K split over blocks where the tiles alone would
 * leave SMs idle, k-tiles of 64 through a 4-stage (I4) / 3-stage (BF16)
 * cp.async pipeline;
 * activations in bf16 (matmul_input.cu), A fragments by ldmatrix from an
 * XOR-swizzled tile, int4 weights dequantised in registers to bf16 with the
 * group scale folded in (one rounding).  Products of bf16-rounded operands,
 * float32 accumulation.
 */
#ifndef G4_MATMUL_CUH
#define G4_MATMUL_CUH

#include "cuda_common.cuh"

#define SKINNY_WARPS 8

/* ---- per-format access to the packed tiles ------------------------------- */

template <int FMT>
struct wtile;

/* int4: one 16-byte word group + the two scale words per (unit, k-tile),
 * in registers (the GEMV of gemv_w4.cu loads them; tile_mma consumes them). */
template <>
struct wtile<G4C_W_I4>
{
	uint4		w;
	uint32_t	s_lo,
				s_hi;			/* scales of rows g and g+8: {group 0, group 1} */
};

/* bf16: the four k16-step A fragments of a k-tile */
template <>
struct wtile<G4C_W_BF16>
{
	static constexpr int P = 3;
	static constexpr int SLOT = 2048;
	uint4		w[4];

	static __device__ __forceinline__ void fetch(unsigned char *slot, const uint4 *tiles, const uint32_t *scales,
												 size_t tile, int lane)
	{
#pragma unroll
		for (int s = 0; s < 4; s++)
			g4c_cp_async16(slot + (s * 32 + lane) * 16, tiles + (tile * 4 + s) * 32 + lane, true);
	}

	__device__ __forceinline__ void read(const unsigned char *slot, int lane)
	{
#pragma unroll
		for (int s = 0; s < 4; s++)
			w[s] = *reinterpret_cast<const uint4 *>(slot + (s * 32 + lane) * 16);
	}
};

/* Shared-memory bytes of a block's weight rings. */
template <int FMT>
__host__ __device__ constexpr int
skinny_ring_bytes(void)
{
	return 8 * wtile<FMT>::P * wtile<FMT>::SLOT;
}

/* ---- skinny ----------------------------------------------------------------- */

/* Shared-memory bytes of the staged activations of one k-tile: 4 k16 steps
 * x NT n8 tiles x 32 lanes x one B fragment (two bf16 pairs). */
constexpr int
skinny_xs_per_ktile(int nt)
{
	return 4 * nt * 32 * 8;
}

/* Activation staging limit: two blocks per SM (with the weight rings, at
 * most ~110 KiB each) */
#define SKINNY_XS_MAX (60 * 1024)

struct skinny_args
{
	const uint4 *tiles;
	const uint32_t *scales;		/* I4 */
	const float *x;
	int			n;
	int			K;
	int			N;
	int			KT;				/* k-tiles */
	int			U;				/* units */
	int			n_ug;			/* unit groups of SKINNY_WARPS units */
	int			kr;				/* k-tiles per K range (divides KT) */
	int			ksplit;			/* K ranges */
	int			per_cta;		/* consecutive work items per block */
	float	   *y;
	float	   *partial;		/* [ksplit][n][N] when ksplit > 1 */
	unsigned   *counters;		/* per unit group */
};

/* The arguments of a launch over w split into ksplit K ranges of (at most)
 * kr k-tiles, with the scratch for the partial sums and the counters when K
 * is split: their sizes depend only on the shape and n, so a recorded step
 * graph stays valid.  Shared by the skinny kernel and the GEMV (gemv_w4.cu). */
static inline int
skinny_args_init(g4_cuda *c, const g4_weight *w, const float *x, int n, float *y, int ksplit, int kr,
				 int per_cta, skinny_args *a)
{
	a->tiles = (const uint4 *) w->data;
	a->scales = (const uint32_t *) w->scales;
	a->x = x;
	a->n = n;
	a->K = (int) w->in;
	a->N = (int) w->out;
	a->KT = (int) w->ktiles;
	a->U = (int) w->units;
	a->n_ug = (int) ((w->units + SKINNY_WARPS - 1) / SKINNY_WARPS);
	a->kr = kr;
	a->ksplit = ksplit;
	a->per_cta = per_cta;
	a->y = y;
	a->partial = NULL;
	a->counters = NULL;
	if (ksplit > 1)
	{
		a->partial = (float *) g4c_scratch(c, (size_t) ksplit * (size_t) n * (size_t) w->out * sizeof(float));
		a->counters = g4c_counters(c, (size_t) a->n_ug);
		if (!a->partial || !a->counters)
			return c->err_code;
	}
	return G4_OK;
}

/* Stage activations of k-tiles [kt0, kt0 + kr) in fragment order: entry
 * (step s, n8 tile j, lane) = the B fragment {x[k], x[k+1]}, {x[k+8],
 * x[k+9]} of column g = lane / 4 at k = 64 kt0 + 16 s + 2 (lane % 4).
 * Columns 2i and 2i + 1 hold the bf16 high and low parts of token 4j + i
 * (x = hi + lo + r, |r| <= 2^-17 |x|): one MMA forms both products, the two
 * output columns are added at the end. */
template <int NT>
__device__ __forceinline__ void
stage_x(const skinny_args &a, int kt0, void *xs)
{
	const int	entries = a.kr * 4 * NT * 32;

	for (int e = threadIdx.x; e < entries; e += blockDim.x)
	{
		int			lane = e & 31;
		int			j = (e >> 5) % NT;
		int			s = (e >> 5) / NT;
		int			col = lane >> 2;
		int			tok = 4 * j + (col >> 1);
		int			k = 64 * kt0 + 16 * s + 2 * (lane & 3);
		float2		v0 = make_float2(0.0f, 0.0f),
					v1 = make_float2(0.0f, 0.0f);

		if (tok < a.n)
		{
			const float *row = a.x + (size_t) tok * (size_t) a.K;

			if (k < a.K)
				v0 = *reinterpret_cast<const float2 *>(row + k);
			if (k + 8 < a.K)
				v1 = *reinterpret_cast<const float2 *>(row + k + 8);
		}
		{
			uint32_t	h0,
						l0,
						h1,
						l1;

			g4c_split_bf16(v0.x, v0.y, &h0, &l0);
			g4c_split_bf16(v1.x, v1.y, &h1, &l1);
			reinterpret_cast<uint2 *>(xs)[e] = (col & 1) ? make_uint2(l0, l1) : make_uint2(h0, h1);
		}
	}
}

/* acc[j] += A · x-fragments of k16 step s of the staged range */
template <int NT>
__device__ __forceinline__ void
mma_step(float acc[NT][4], const uint32_t a[4], const void *xs, int s, int lane)
{
#pragma unroll
	for (int j = 0; j < NT; j++)
	{
		uint2		b = reinterpret_cast<const uint2 *>(xs)[(s * NT + j) * 32 + lane];

		g4c_mma_bf16(acc[j], a, b.x, b.y);
	}
}

template <int NT>
__device__ __forceinline__ void
tile_mma(float acc[NT][4], const wtile<G4C_W_I4> &t, const void *xs, int kk, int lane)
{
#pragma unroll
	for (int grp = 0; grp < 2; grp++)
	{
		float		tmp[NT][4];
		uint32_t	wg = grp ? t.w.y : t.w.x;
		uint32_t	wg8 = grp ? t.w.w : t.w.z;
		float		s_lo = g4_bf16_to_f32((uint16_t) (grp ? t.s_lo >> 16 : t.s_lo & 0xffff));
		float		s_hi = g4_bf16_to_f32((uint16_t) (grp ? t.s_hi >> 16 : t.s_hi & 0xffff));

#pragma unroll
		for (int j = 0; j < NT; j++)
			tmp[j][0] = tmp[j][1] = tmp[j][2] = tmp[j][3] = 0.0f;
#pragma unroll
		for (int step = 0; step < 2; step++)
		{
			uint32_t	a[4];

			a[0] = g4c_i4_pair(wg, 2 * step);
			a[1] = g4c_i4_pair(wg8, 2 * step);
			a[2] = g4c_i4_pair(wg, 2 * step + 1);
			a[3] = g4c_i4_pair(wg8, 2 * step + 1);
			mma_step<NT>(tmp, a, xs, kk * 4 + grp * 2 + step, lane);
		}
#pragma unroll
		for (int j = 0; j < NT; j++)
		{
			acc[j][0] = fmaf(tmp[j][0], s_lo, acc[j][0]);
			acc[j][1] = fmaf(tmp[j][1], s_lo, acc[j][1]);
			acc[j][2] = fmaf(tmp[j][2], s_hi, acc[j][2]);
			acc[j][3] = fmaf(tmp[j][3], s_hi, acc[j][3]);
		}
	}
}

template <int NT>
__device__ __forceinline__ void
tile_mma(float acc[NT][4], const wtile<G4C_W_BF16> &t, const void *xs, int kk, int lane)
{
#pragma unroll
	for (int s = 0; s < 4; s++)
	{
		uint32_t	a[4] = {t.w[s].x, t.w[s].y, t.w[s].z, t.w[s].w};

		mma_step<NT>(acc, a, xs, kk * 4 + s, lane);
	}
}

/* End of a work item: write the unit's rows 16u + g (+8), tokens 8j + 2t
 * (+1), to the output or the partial sums of its K range; with K split, the
 * last block to finish a unit group adds its ranges in order.  All threads of
 * the block call it. */
template <int NT>
__device__ __forceinline__ void
skinny_item_end(const skinny_args &a, int ks, int ug, int u, int lane, float acc[NT][4], bool *last)
{
	int			g = lane >> 2,
				t = lane & 3;
	float	   *dst = a.ksplit == 1 ? a.y : a.partial + (size_t) ks * (size_t) a.n * (size_t) a.N;

	if (u < a.U)
	{
#pragma unroll
		for (int j = 0; j < NT; j++)
#pragma unroll
			for (int e = 0; e < 4; e++)
			{
				int			row = 16 * u + g + (e >> 1) * 8;
				int			tok = 4 * j + t;

				/* columns 2t (high parts) and 2t + 1 (low parts) */
				if (row < a.N && tok < a.n && (e & 1) == 0)
					dst[(size_t) tok * (size_t) a.N + (size_t) row] = acc[j][e] + acc[j][e + 1];
			}
	}
#pragma unroll
	for (int j = 0; j < NT; j++)
		acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
	if (a.ksplit == 1)
		return;
	__threadfence();
	__syncthreads();
	if (threadIdx.x == 0)
		*last = atomicAdd(&a.counters[ug], 1u) == (unsigned) a.ksplit - 1;
	__syncthreads();
	if (*last)
	{
		int			row0 = ug * SKINNY_WARPS * 16;
		int			rows = min(SKINNY_WARPS * 16, a.N - row0);

		__threadfence();
		for (int i = threadIdx.x; i < rows * a.n; i += blockDim.x)
		{
			int			tok = i / rows;
			size_t		off = (size_t) tok * (size_t) a.N + (size_t) (row0 + i % rows);
			const float *pk = a.partial + off;
			size_t		step = (size_t) a.n * (size_t) a.N;
			float		sum = 0.0f;
			int			k = 0;

			/* four independent loads in flight, added in range order */
			for (; k + 4 <= a.ksplit; k += 4)
			{
				float		v0 = __ldcg(pk + (size_t) k * step),
							v1 = __ldcg(pk + (size_t) (k + 1) * step),
							v2 = __ldcg(pk + (size_t) (k + 2) * step),
							v3 = __ldcg(pk + (size_t) (k + 3) * step);

				sum = (((sum + v0) + v1) + v2) + v3;
			}
			for (; k < a.ksplit; k++)
				sum += __ldcg(pk + (size_t) k * step);
			a.y[off] = sum;
		}
		if (threadIdx.x == 0)
			a.counters[ug] = 0;
	}
}

/*
 * Work items are (unit group, K range), K-range-major; each block takes
 * per_cta consecutive items (a persistent grid sized to the GPU), so its
 * activations are restaged only when the range changes.  Every warp streams
 * the k-tiles of its unit through a ring of P tiles in flight that runs on
 * across item boundaries: the only block-wide barriers are the restaging
 * and the end of each item.
 */
/* Position of a warp in its block's sequence of k-tiles, advanced without
 * divisions except once per work item. */
struct skinny_cursor
{
	int			item,
				kk,
				ks,
				u;

	__device__ __forceinline__ void set(const skinny_args &a, int it, int warp)
	{
		item = it;
		kk = 0;
		ks = it / a.n_ug;
		u = (it - ks * a.n_ug) * SKINNY_WARPS + warp;
	}

	__device__ __forceinline__ void next(const skinny_args &a, int warp)
	{
		if (++kk == a.kr)
			set(a, item + 1, warp);
	}

	__device__ __forceinline__ size_t tile(const skinny_args &a) const
	{
		return (size_t) u * a.KT + (size_t) (ks * a.kr + kk);
	}
};

template <int FMT, int NT>
__global__ void __launch_bounds__(SKINNY_WARPS * 32, NT >= 4 ? 1 : 2)	/* registers: no spills */
skinny_kernel(skinny_args a)
{
	constexpr int P = wtile<FMT>::P;
	constexpr int SLOT = wtile<FMT>::SLOT;
	extern __shared__ __align__(128) unsigned char smem[];
	__shared__ bool last;
	int			lane = threadIdx.x & 31;
	int			warp = threadIdx.x >> 5;
	unsigned char *ring = smem + warp * P * SLOT;	/* this warp's slots */
	unsigned char *xs = smem + skinny_ring_bytes<FMT>();
	int			i0 = blockIdx.x * a.per_cta;
	int			i1 = min(a.n_ug * a.ksplit, i0 + a.per_cta);
	int			steps = (i1 - i0) * a.kr;
	int			staged = -1;	/* K range held in xs */
	float		acc[NT][4];
	skinny_cursor cur,
				pre;

	g4c_pdl_trigger();
	if (i0 >= i1)
	{
		g4c_pdl_wait();
		return;
	}
#pragma unroll
	for (int j = 0; j < NT; j++)
		acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
	cur.set(a, i0, warp);
	pre.set(a, i0, warp);
	/* one cp.async group per step, empty ones included, so that "all but
	 * the P - 1 newest groups done" always means "this step's tile is in" */
#pragma unroll
	for (int q = 0; q < P; q++)
	{
		if (q < steps)
		{
			if (pre.u < a.U)
				wtile<FMT>::fetch(ring + q * SLOT, a.tiles, a.scales, pre.tile(a), lane);
			pre.next(a, warp);
		}
		g4c_cp_async_commit();
	}
	/* the weights are in flight: now the activations may be read */
	g4c_pdl_wait();
	for (int s0 = 0; s0 < steps; s0 += P)
	{
#pragma unroll
		for (int q = 0; q < P; q++)
		{
			int			s = s0 + q;

			/* the conditions below are uniform over the block */
			if (s < steps && cur.ks != staged)
			{
				__syncthreads();
				stage_x<NT>(a, cur.ks * a.kr, xs);
				__syncthreads();
				staged = cur.ks;
			}
			g4c_cp_async_wait<P - 1>();
			__syncwarp();
			if (s < steps && cur.u < a.U)
			{
				wtile<FMT>	t;

				t.read(ring + q * SLOT, lane);
				tile_mma<NT>(acc, t, xs, cur.kk, lane);
			}
			__syncwarp();		/* the slot is read before it is refilled */
			if (s + P < steps)
			{
				if (pre.u < a.U)
					wtile<FMT>::fetch(ring + q * SLOT, a.tiles, a.scales, pre.tile(a), lane);
				pre.next(a, warp);
			}
			g4c_cp_async_commit();
			if (s < steps)
			{
				if (cur.kk == a.kr - 1)
					skinny_item_end<NT>(a, cur.ks, cur.item - cur.ks * a.n_ug, cur.u, lane, acc, &last);
				cur.next(a, warp);
			}
		}
	}
	g4c_cp_async_wait<0>();
}

/* Blocks of the skinny kernel one SM holds with `smem` bytes staged. */
template <int FMT, int NT>
static int
skinny_occupancy(g4_cuda *c, int smem)
{
	static int	cached_smem[2][9],
				cached[2][9];
	int		   *cs = &cached_smem[FMT][NT];
	int		   *cv = &cached[FMT][NT];

	if (*cs != smem)
	{
		int			blocks = 0;

		if (smem > 48 * 1024 &&
			cudaFuncSetAttribute(skinny_kernel<FMT, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
								 skinny_ring_bytes<FMT>() + SKINNY_XS_MAX) != cudaSuccess)
			return 0;
		if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, skinny_kernel<FMT, NT>, SKINNY_WARPS * 32,
														  smem) != cudaSuccess)
			return 0;
		*cs = smem;
		*cv = blocks;
	}
	return *cv;
}

template <int FMT, int NT>
int
skinny_run(g4_cuda *c, const g4_weight *w, const float *x, int n, float *y)
{
	skinny_args a;
	int			KT = (int) w->ktiles;
	int			per_kt = skinny_xs_per_ktile(NT);
	int			n_ug = (int) ((w->units + SKINNY_WARPS - 1) / SKINNY_WARPS);
	double		wbytes = (double) w->bytes;
	double		best = 1e30;
	int			ksplit = 0,
				ctas = 0;

	/* K ranges: a divisor of KT whose activations fit the stage, chosen for
	 * the least work in the slowest block */
	for (int ks = 1; ks <= KT; ks++)
	{
		int			kr = KT / ks;
		int			occ,
					slots,
					items,
					rounds;
		double		cost;

		if (KT % ks != 0 || kr * per_kt > SKINNY_XS_MAX)
			continue;
		occ = skinny_occupancy<FMT, NT>(c, skinny_ring_bytes<FMT>() + kr * per_kt);
		if (occ <= 0)
			continue;
		items = n_ug * ks;
		slots = occ * c->sm_count;
		rounds = (items + slots - 1) / slots;
		/* k-tiles per warp, plus one for each item's flush, plus the partial
		 * sums' traffic in k-tile rounds */
		cost = (double) rounds * (kr + 1) +
			(ks > 1 ? 2.0 * ks * n * (double) w->out * 4.0 / wbytes * KT * n_ug / slots : 0.0);
		if (cost < best)
		{
			best = cost;
			ksplit = ks;
			ctas = (items + rounds - 1) / rounds;
		}
	}
	if (ksplit == 0)
		return G4_ERR_UNSUPPORTED;
	if (skinny_args_init(c, w, x, n, y, ksplit, KT / ksplit, (n_ug * ksplit + ctas - 1) / ctas, &a) != G4_OK)
		return c->err_code;
	return g4c_launch(c, "matmul (skinny)", skinny_kernel<FMT, NT>,
					  dim3((n_ug * ksplit + a.per_cta - 1) / a.per_cta), dim3(SKINNY_WARPS * 32),
					  (size_t) (skinny_ring_bytes<FMT>() + a.kr * per_kt), a);
}

/* n <= 8 token rows, split activations (4 per n8 tile). */
template <int FMT>
int
skinny_launch(g4_cuda *c, const g4_weight *w, const float *x, int n, float *y)
{
	if (n <= 4)
		return skinny_run<FMT, 1>(c, w, x, n, y);
	if (n <= 8)
		return skinny_run<FMT, 2>(c, w, x, n, y);
	return G4_ERR_UNSUPPORTED;
}

/* ---- gemm ---------------------------------------------------------------------- */

/* Block tile: GEMM_BM(MI) token rows x GEMM_BN weight rows; 8 warps side by
 * side, each owning all the block's token rows and 32 weight rows (2 units),
 * so every dequantised B fragment feeds MI x 4 MMAs.  MI = 8 (128 token rows)
 * for prefill; 2 and 4 (32 and 64 rows) for batched decode, where the token
 * rows are few and the weights must stream near bandwidth: there the grid
 * also splits K so that every SM has blocks (partial sums added in a fixed
 * order by gemm_reduce_kernel, so results stay deterministic). */
#define GEMM_BM(MI) (16 * (MI))
#define GEMM_BN 256
#define GEMM_THREADS 256

template <int FMT>
struct gemm_cfg;

template <>
struct gemm_cfg<G4C_W_I4>
{
	static constexpr int STAGES = 4;
	static constexpr int B_BYTES = (GEMM_BN / 16) * (512 + 64);	/* tiles + scales */
};

template <>
struct gemm_cfg<G4C_W_BF16>
{
	static constexpr int STAGES = 3;
	static constexpr int B_BYTES = (GEMM_BN / 16) * 2048;
};

#define GEMM_A_BYTES(MI) (GEMM_BM(MI) * 64 * 2)

template <int FMT, int MI>
constexpr int
gemm_smem_bytes(void)
{
	return gemm_cfg<FMT>::STAGES * (GEMM_A_BYTES(MI) + gemm_cfg<FMT>::B_BYTES);
}

struct gemm_args
{
	const uint16_t *xb;			/* bf16 [n][Kp] */
	const uint4 *tiles;
	const uint16_t *scales;
	int			n;
	int			N;
	int			KT;
	int			U;
	int			kr;				/* k-tiles per K range (blockIdx.z) */
	float	   *y;				/* [n][N], or the partial sums [ksplit][n][N] */
};

/* Issue the cp.async copies of k-tile kt into one stage. */
template <int FMT, int MI>
__device__ __forceinline__ void
gemm_load_stage(const gemm_args &a, unsigned char *stage, int m0, int u0, int kt)
{
	uint16_t   *As = reinterpret_cast<uint16_t *>(stage);
	unsigned char *Bs = stage + GEMM_A_BYTES(MI);
	size_t		Kp = (size_t) a.KT * 64;

	/* A: BM rows x 8 chunks of 16 bytes, swizzled by row */
	for (int i = threadIdx.x; i < GEMM_BM(MI) * 8; i += GEMM_THREADS)
	{
		int			r = i >> 3,
					ch = i & 7;
		int			row = m0 + r;
		bool		ok = row < a.n;
		const uint16_t *src = a.xb + (size_t) (ok ? row : 0) * Kp + (size_t) kt * 64 + (size_t) ch * 8;

		g4c_cp_async16(As + r * 64 + ((ch ^ (r & 7)) * 8), src, ok);
	}
	if (FMT == G4C_W_I4)
	{
		const int	units = GEMM_BN / 16;

		for (int i = threadIdx.x; i < units * 32; i += GEMM_THREADS)
		{
			int			uu = i >> 5;
			int			u = u0 + uu;
			bool		ok = u < a.U;
			const uint4 *src = a.tiles + ((size_t) (ok ? u : 0) * a.KT + kt) * 32 + (i & 31);

			g4c_cp_async16(Bs + (size_t) i * 16, src, ok);
		}
		for (int i = threadIdx.x; i < units * 4; i += GEMM_THREADS)
		{
			int			uu = i >> 2;
			int			u = u0 + uu;
			bool		ok = u < a.U;
			const uint16_t *src = a.scales + ((size_t) (ok ? u : 0) * a.KT + kt) * 32 + (size_t) (i & 3) * 8;

			g4c_cp_async16(Bs + units * 512 + (size_t) i * 16, src, ok);
		}
	}
	else
	{
		const int	units = GEMM_BN / 16;

		for (int i = threadIdx.x; i < units * 128; i += GEMM_THREADS)
		{
			int			uu = i >> 7;
			int			u = u0 + uu;
			bool		ok = u < a.U;
			const uint4 *src = a.tiles + ((size_t) (ok ? u : 0) * a.KT + kt) * 128 + (i & 127);

			g4c_cp_async16(Bs + (size_t) i * 16, src, ok);
		}
	}
}

/* The B operand of a warp (2 units = 4 n8 tiles) for one k-tile: int4
 * words and scales, read from shared memory once per k-tile. */
template <int FMT>
struct gemm_b;

template <>
struct gemm_b<G4C_W_I4>
{
	uint4		w[2];
	uint32_t	s_lo[2],
				s_hi[2];		/* {group 0, group 1} of rows g and g+8 */

	__device__ __forceinline__ void load(const unsigned char *Bs, int wn, int lane)
	{
		const int	units = GEMM_BN / 16;

#pragma unroll
		for (int q = 0; q < 2; q++)
		{
			int			uu = wn * 2 + q;
			const uint32_t *sc = reinterpret_cast<const uint32_t *>(Bs + units * 512 + uu * 64);

			w[q] = *reinterpret_cast<const uint4 *>(Bs + ((size_t) uu * 32 + lane) * 16);
			s_lo[q] = sc[lane >> 2];
			s_hi[q] = sc[(lane >> 2) + 8];
		}
	}

	/* bf16 B fragments of k16 step s: (code - 8) · scale, one rounding */
	__device__ __forceinline__ void frags(const unsigned char *Bs, int wn, int s, int lane, uint32_t b[4][2]) const
	{
		int			grp = s >> 1,
					step = s & 1;

#pragma unroll
		for (int q = 0; q < 2; q++)
		{
			uint32_t	wg = grp ? w[q].y : w[q].x;
			uint32_t	wg8 = grp ? w[q].w : w[q].z;
			uint32_t	lo = grp ? s_lo[q] >> 16 : s_lo[q] & 0xffff;
			uint32_t	hi = grp ? s_hi[q] >> 16 : s_hi[q] & 0xffff;

			lo |= lo << 16;
			hi |= hi << 16;
			b[2 * q][0] = g4c_bf16_mul2(g4c_i4_pair(wg, 2 * step), lo);
			b[2 * q][1] = g4c_bf16_mul2(g4c_i4_pair(wg, 2 * step + 1), lo);
			b[2 * q + 1][0] = g4c_bf16_mul2(g4c_i4_pair(wg8, 2 * step), hi);
			b[2 * q + 1][1] = g4c_bf16_mul2(g4c_i4_pair(wg8, 2 * step + 1), hi);
		}
	}
};

template <>
struct gemm_b<G4C_W_BF16>
{
	__device__ __forceinline__ void load(const unsigned char *Bs, int wn, int lane)
	{
	}

	__device__ __forceinline__ void frags(const unsigned char *Bs, int wn, int s, int lane, uint32_t b[4][2]) const
	{
#pragma unroll
		for (int q = 0; q < 2; q++)
		{
			int			uu = wn * 2 + q;
			uint4		w = *reinterpret_cast<const uint4 *>(Bs + (((size_t) uu * 4 + s) * 32 + lane) * 16);

			b[2 * q][0] = w.x;
			b[2 * q][1] = w.z;
			b[2 * q + 1][0] = w.y;
			b[2 * q + 1][1] = w.w;
		}
	}
};

/* One k-tile of the block's product: 4 k16 steps, each one dequantised B
 * operand per warp against the MI A fragments of the block's token rows. */
template <int FMT, int MI>
__device__ __forceinline__ void
gemm_ktile(float acc[MI][4][4], const unsigned char *stage, int wn, int lane)
{
	const uint16_t *As = reinterpret_cast<const uint16_t *>(stage);
	gemm_b<FMT> bw;

	bw.load(stage + GEMM_A_BYTES(MI), wn, lane);
#pragma unroll
	for (int s = 0; s < 4; s++)
	{
		uint32_t	bf[4][2];

		bw.frags(stage + GEMM_A_BYTES(MI), wn, s, lane, bf);
#pragma unroll
		for (int i = 0; i < MI; i++)
		{
			uint32_t	af[4];
			int			r = i * 16 + (lane & 15);
			int			ch = 2 * s + (lane >> 4);

			g4c_ldmatrix_x4(af, As + r * 64 + ((ch ^ (r & 7)) * 8));
#pragma unroll
			for (int j = 0; j < 4; j++)
				g4c_mma_bf16(acc[i][j], af, bf[j][0], bf[j][1]);
		}
	}
}

/* Write the warp's accumulators: token rows m0 + 16i + g (+8), weight rows
 * (u0 + 2wn + j/2)·16 + (j%2)·8 + 2t (+1). */
template <int MI>
__device__ __forceinline__ void
gemm_store(const gemm_args &a, float *y, const float acc[MI][4][4], int m0, int u0, int wn, int lane)
{
	int			g = lane >> 2,
				t = lane & 3;

#pragma unroll
	for (int i = 0; i < MI; i++)
#pragma unroll
		for (int j = 0; j < 4; j++)
#pragma unroll
			for (int h = 0; h < 2; h++)
			{
				int			row = m0 + i * 16 + g + 8 * h;
				int			col = (u0 + wn * 2 + (j >> 1)) * 16 + (j & 1) * 8 + 2 * t;

				if (row >= a.n)
					continue;
				if (col < a.N)
					y[(size_t) row * (size_t) a.N + (size_t) col] = acc[i][j][2 * h];
				if (col + 1 < a.N)
					y[(size_t) row * (size_t) a.N + (size_t) col + 1] = acc[i][j][2 * h + 1];
			}
}

/* Grid: x = token-row tiles (fastest, so that the blocks sharing a weight
 * tile run together and read it once from memory), y = weight-row tiles,
 * z = K ranges of a.kr k-tiles. */
template <int FMT, int MI>
__global__ void __launch_bounds__(GEMM_THREADS, MI <= 4 ? 2 : 1)
gemm_kernel(gemm_args a)
{
	constexpr int STAGES = gemm_cfg<FMT>::STAGES;
	constexpr int STAGE_BYTES = GEMM_A_BYTES(MI) + gemm_cfg<FMT>::B_BYTES;
	extern __shared__ __align__(128) unsigned char smem[];
	int			lane = threadIdx.x & 31;
	int			wn = threadIdx.x >> 5;
	int			m0 = blockIdx.x * GEMM_BM(MI);
	int			u0 = blockIdx.y * (GEMM_BN / 16);
	int			kt0 = blockIdx.z * a.kr;
	int			nkt = min(a.kr, a.KT - kt0);
	float		acc[MI][4][4];

	g4c_pdl_trigger();
	g4c_pdl_wait();
#pragma unroll
	for (int i = 0; i < MI; i++)
#pragma unroll
		for (int j = 0; j < 4; j++)
			acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;

#pragma unroll
	for (int st = 0; st < STAGES - 1; st++)
	{
		if (st < nkt)
			gemm_load_stage<FMT, MI>(a, smem + st * STAGE_BYTES, m0, u0, kt0 + st);
		g4c_cp_async_commit();
	}
	for (int kt = 0; kt < nkt; kt++)
	{
		g4c_cp_async_wait<STAGES - 2>();
		__syncthreads();
		if (kt + STAGES - 1 < nkt)
			gemm_load_stage<FMT, MI>(a, smem + ((kt + STAGES - 1) % STAGES) * STAGE_BYTES, m0, u0,
									 kt0 + kt + STAGES - 1);
		g4c_cp_async_commit();
		gemm_ktile<FMT, MI>(acc, smem + (kt % STAGES) * STAGE_BYTES, wn, lane);
	}
	g4c_cp_async_wait<0>();
	gemm_store<MI>(a, a.y + (size_t) blockIdx.z * (size_t) a.n * (size_t) a.N, acc, m0, u0, wn, lane);
}

/* y = the sum of the ksplit partial products, in range order. */
static __global__ void
gemm_reduce_kernel(const float *partial, int ksplit, size_t count, float *y)
{
	g4c_pdl_trigger();
	g4c_pdl_wait();
	for (size_t i = (size_t) blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t) gridDim.x * blockDim.x)
	{
		float		sum = __ldcg(partial + i);

		for (int k = 1; k < ksplit; k++)
			sum += __ldcg(partial + (size_t) k * count + i);
		y[i] = sum;
	}
}

/* A matmul's input x (float32 [n][K]) as bf16 [n][Kp], zero beyond K
 * (matmul_input.cu): its producer's copy, else converted into scratch, with
 * `extra` more bytes of scratch at *extra_at (256-byte aligned; NULL when
 * 0); NULL after recording an error. */
const uint16_t *g4c_matmul_input(g4_cuda *c, const float *x, int n, int K, int Kp, size_t extra, void **extra_at);

/* Blocks of gemm_kernel<FMT, MI> one SM holds (0 after recording an error). */
template <int FMT, int MI>
static int
gemm_occupancy(g4_cuda *c)
{
	static int	blocks;

	if (blocks <= 0)
		blocks = g4c_blocks_per_sm(c, (const void *) gemm_kernel<FMT, MI>, GEMM_THREADS, gemm_smem_bytes<FMT, MI>());
	return blocks;
}

/* The number of K ranges: the least estimated time, in rounds of k-tiles
 * of the busiest SM slot, counting each range's pipeline fill (two
 * k-tiles) and the partial sums' traffic (written and read once, in units
 * of one round's weight traffic: b_bytes per block and k-tile).  Depends
 * only on the shape and n, so a recorded step graph's scratch stays valid. */
static inline int
gemm_ksplit(const g4_weight *w, int n, int tiles_mn, int slots, double b_bytes)
{
	int			KT = (int) w->ktiles;
	double		best = 1e30;
	int			best_ks = 1;

	for (int ks = 1; ks <= KT && ks <= 64; ks++)
	{
		int			kr = (KT + ks - 1) / ks;
		int			items = tiles_mn * ks;
		int			rounds = (items + slots - 1) / slots;
		double		cost;

		if ((KT + kr - 1) / kr != ks)
			continue;			/* the same ranges as a smaller ks */
		cost = (double) rounds * (kr + 2) +
			(ks > 1 ? 2.0 * ks * (double) n * (double) w->out * 4.0 / ((double) slots * b_bytes) : 0.0);
		if (cost < best)
		{
			best = cost;
			best_ks = ks;
		}
	}
	return best_ks;
}

/*
 * A launch of a gemm kernel over the grid (token-row tiles of bm, weight-row
 * tiles of bn_units units, K ranges): activations in bf16 once (their
 * producer's copy or a conversion: g4c_matmul_input), K split by
 * gemm_ksplit where the tiles alone leave SM slots idle (occ blocks per
 * SM), and the partial sums added in range order by gemm_split_finish.
 * Shared by the mma.sync gemm below and the warpgroup-MMA int4 kernel
 * (matmul_w4_wgmma.cu), which launch their kernels between the two.
 */
struct gemm_plan
{
	gemm_args	a;
	dim3		grid;
	int			ksplit;
	float	   *y;				/* the caller's output */
};

static inline int
gemm_split_prepare(g4_cuda *c, const g4_weight *w, const float *x, int n, float *y, int bm, int bn_units,
				   double b_bytes, int occ, gemm_plan *p)
{
	int			Kp = (int) w->ktiles * 64;
	int			mt = (n + bm - 1) / bm;
	int			nt = (int) ((w->units + bn_units - 1) / bn_units);
	void	   *partial = NULL;

	p->ksplit = 1;
	p->y = y;
	if (occ <= 0)				/* the occupancy query recorded its error */
		return c->err_code != G4_OK ? c->err_code : G4_ERR_BACKEND;
	p->ksplit = gemm_ksplit(w, n, mt * nt, occ * c->sm_count, b_bytes);
	p->a.xb = g4c_matmul_input(c, x, n, (int) w->in, Kp,
							   p->ksplit > 1 ? (size_t) p->ksplit * (size_t) n * (size_t) w->out * sizeof(float) : 0,
							   &partial);
	if (!p->a.xb)
		return c->err_code;
	p->a.tiles = (const uint4 *) w->data;
	p->a.scales = w->scales;
	p->a.n = n;
	p->a.N = (int) w->out;
	p->a.KT = (int) w->ktiles;
	p->a.U = (int) w->units;
	p->a.kr = (p->a.KT + p->ksplit - 1) / p->ksplit;
	p->a.y = p->ksplit > 1 ? (float *) partial : y;
	p->grid = dim3((unsigned) mt, (unsigned) nt, (unsigned) p->ksplit);
	return G4_OK;
}

/* out[t][j] = gelu_tanh(gate) · up, gate and up the sums of the ksplit
 * partial products of y[t][j] and y[t][ff + j] in range order, as
 * gemm_reduce_kernel adds them: bit for bit GEGLU of the matmul's output,
 * without writing it.  outb: out's bf16 copy, or NULL. */
static __global__ void
gemm_reduce_geglu_kernel(const float *partial, int ksplit, int n, int ff, float *out, uint16_t *outb)
{
	size_t		count = (size_t) n * 2 * (size_t) ff;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	for (size_t i = (size_t) blockIdx.x * blockDim.x + threadIdx.x; i < (size_t) n * ff;
		 i += (size_t) gridDim.x * blockDim.x)
	{
		size_t		t = i / (size_t) ff;
		size_t		at = i + t * (size_t) ff;	/* y[t][j] */
		float		gate = __ldcg(partial + at),
					up = __ldcg(partial + at + ff);
		float		v;

		for (int k = 1; k < ksplit; k++)
		{
			gate += __ldcg(partial + (size_t) k * count + at);
			up += __ldcg(partial + (size_t) k * count + at + ff);
		}
		v = __fmul_rn(g4c_gelu_tanh(gate), up);
		out[i] = v;
		if (outb)
			outb[i] = g4_f32_to_bf16(v);
	}
}

/* The partial sums added into the caller's output, or with gg GEGLU
 * applied to them into gg->out (the caller's output then left unwritten
 * where K was split). */
static inline int
gemm_split_finish(g4_cuda *c, const gemm_plan *p, const g4c_geglu_after *gg)
{
	size_t		count = (size_t) p->a.n * (size_t) p->a.N;
	unsigned	blocks = g4c_stride_grid(c, count, 8);

	if (p->ksplit == 1)
		return gg ? g4c_geglu(&c->base, p->y, p->a.n, gg->ff, gg->out) : G4_OK;
	if (gg)
		return g4c_launch(c, "matmul (gemm partial sums, geglu)", gemm_reduce_geglu_kernel, dim3(blocks),
						  dim3(256), 0, (const float *) p->a.y, p->ksplit, p->a.n, gg->ff, gg->out,
						  g4c_act_bf16_offer(c, gg->out, p->a.n, gg->ff));
	return g4c_launch(c, "matmul (gemm partial sums)", gemm_reduce_kernel, dim3(blocks), dim3(256), 0,
					  (const float *) p->a.y, p->ksplit, count, p->y);
}

template <int FMT, int MI>
int
gemm_launch(g4_cuda *c, const g4_weight *w, const float *x, int n, float *y, const g4c_geglu_after *gg)
{
	gemm_plan	p;
	int			rc = gemm_split_prepare(c, w, x, n, y, GEMM_BM(MI), GEMM_BN / 16, gemm_cfg<FMT>::B_BYTES,
										gemm_occupancy<FMT, MI>(c), &p);

	if (rc != G4_OK)
		return rc;
	if (g4c_launch(c, "matmul (gemm)", gemm_kernel<FMT, MI>, p.grid, dim3(GEMM_THREADS),
				   (size_t) gemm_smem_bytes<FMT, MI>(), p.a) != G4_OK)
		return c->err_code;
	return gemm_split_finish(c, &p, gg);
}

#endif
