/*
 * matmul_w4_wgmma.cu — int4 group-32 weights × bf16 activations on Hopper's
 * warpgroup MMA (wgmma.mma_async, sm_90a), for batched decode and short
 * prefill steps: 9 to 512 token rows, in tiles of up to 128 (g4c_matmul_i4
 * chooses).
 *
 * The weights are the A operand, dequantised in registers: the packed int4
 * tiles (cuda_common.cuh) are already in the A-fragment order of a 16-row
 * slice, which is what each warp of a warpgroup holds for m64nNk16.  The
 * token rows are the B operand, N = 32, 64 or 128 of them, read by the
 * tensor cores straight from shared memory through a matrix descriptor: the
 * stage's activation tile (N rows of 64 bf16, 16-byte chunks XOR-swizzled by
 * row) is the K-major 128-byte-swizzle layout.  One wgmma then covers 64
 * weight rows × N tokens × 16 k, where mma.sync needed 8 to 32 instructions,
 * each fed by its own shared-memory loads: the mma.sync gemm spent ~400
 * instructions per warp and k-tile at 64 rows and ran at a third of the
 * tensor pipe, latency-bound (ncu, run 37).
 *
 * A block is two warpgroups (256 threads) over R × 128 weight rows; k-tiles
 * of 64 flow through a STAGES-deep cp.async ring (weights, scales and the
 * activation tile of each k-tile), the weights of the first stages issued
 * before the wait for the previous kernel.  Per k-tile: one barrier, the
 * refill of the stage two k-tiles back, the warp's weight words from shared
 * memory, then per k16 step: a wait for that step of the previous k-tile
 * (its A registers are reused), the dequantisation ((code - 8) · scale, one
 * rounding, as the mma.sync gemm) and R wgmmas committed as a group, so
 * that a step is dequantised while the previous k-tile's later steps still
 * run (one group per k-tile: 117.6 -> 116.9 us for a sliding layer's
 * matmuls at 64 rows, 158.4 -> 152.5 at 128; run 56).  K is split over blocks and
 * the partial sums added in range order as for the gemm (gemm_split_run):
 * results are deterministic.
 */
#include "matmul.cuh"

#define WG_STAGES 5

/* Bytes of one stage: the activation tile, then 8R units' words and scales,
 * rounded to the 1024 bytes the swizzled tile's alignment needs. */
template <int NTOK, int R>
__host__ __device__ constexpr int
wg_stage_bytes(void)
{
	return (NTOK * 128 + 8 * R * (512 + 64) + 1023) / 1024 * 1024;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ void
wg_fence(void)
{
	asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void
wg_commit(void)
{
	asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

/* wait until at most N committed wgmma groups of this warp are pending */
template <int N>
__device__ __forceinline__ void
wg_wait(void)
{
	asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* Descriptor of a K-major, 128-byte-swizzled tile at shared address addr:
 * rows of 128 bytes, 8-row atoms 1024 bytes apart. */
__device__ __forceinline__ uint64_t
wg_desc(uint32_t addr)
{
	return (uint64_t) ((addr & 0x3FFFF) >> 4) | ((uint64_t) 1 << 16) | ((uint64_t) (1024 >> 4) << 32) |
		((uint64_t) 1 << 62);
}

/* acc (+)= A (64 weight rows × 16 k, registers) · B (16 k × NTOK tokens);
 * the first product of a block writes acc (accumulate 0) rather than adding
 * to zeros set by other instructions, which would serialise the wgmmas */
template <int NTOK>
__device__ __forceinline__ void wg_mma(float *acc, const uint32_t a[4], uint64_t desc, int accumulate);

template <>
__device__ __forceinline__ void
wg_mma<32>(float *d, const uint32_t a[4], uint64_t desc, int accumulate)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
				 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
				 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
				 "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
				 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
				 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
				 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
}

template <>
__device__ __forceinline__ void
wg_mma<64>(float *d, const uint32_t a[4], uint64_t desc, int accumulate)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
				 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
				 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
				 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
				 "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
				 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
				 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
				 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
				 "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
				 "+f"(d[30]), "+f"(d[31])
				 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
}

template <>
__device__ __forceinline__ void
wg_mma<128>(float *d, const uint32_t a[4], uint64_t desc, int accumulate)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
				 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
				 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
				 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
				 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
				 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
				 "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
				 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
				 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
				 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
				 "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
				 "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
				 "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
				 "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
				 "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
				 "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
				 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
}

/*
 * This thread's share of a stage's copies, the parts that do not depend on
 * the k-tile, worked out once: the activation rows' element offsets (-1
 * where the row is beyond n: zero-filled), the weight words' and scales'
 * offsets (-1 past the last unit).  A stage's copies then cost an add each,
 * where recomputing the indices cost a third of the kernel's instructions.
 */
template <int NTOK, int R>
struct wg_copies
{
	static constexpr int UNITS = 8 * R;
	static constexpr int TOK = NTOK * 8 / GEMM_THREADS;	/* 16-byte chunks per thread */
	static constexpr int WT = UNITS * 32 / GEMM_THREADS;
	int			tok[TOK];
	int			wt[WT];
	int			sc;

	__device__ __forceinline__ void init(const gemm_args &a, int m0, int u0)
	{
		int			Kp = a.KT * 64;

#pragma unroll
		for (int j = 0; j < TOK; j++)
		{
			int			i = (int) threadIdx.x + j * GEMM_THREADS;
			int			row = m0 + (i >> 3);

			tok[j] = row < a.n ? row * Kp + (i & 7) * 8 : -1;
		}
#pragma unroll
		for (int j = 0; j < WT; j++)
		{
			int			i = (int) threadIdx.x + j * GEMM_THREADS;
			int			u = u0 + (i >> 5);

			wt[j] = u < a.U ? u * a.KT * 32 + (i & 31) : -1;
		}
		{
			int			t = (int) threadIdx.x;
			int			u = u0 + (t >> 2);

			sc = t < UNITS * 4 && u < a.U ? u * a.KT * 32 + (t & 3) * 8 : -1;
		}
	}

	/* k-tile kt into a stage: the activation tile (swizzled) when tokens,
	 * the units' words and scales when weights */
	__device__ __forceinline__ void load(const gemm_args &a, unsigned char *stage, int kt, bool tokens,
										 bool weights) const
	{
		unsigned char *ws = stage + NTOK * 128;

		if (tokens)
#pragma unroll
			for (int j = 0; j < TOK; j++)
			{
				int			i = (int) threadIdx.x + j * GEMM_THREADS;
				int			r = i >> 3;

				g4c_cp_async16(stage + r * 128 + (((i & 7) ^ (r & 7)) * 16),
							   a.xb + (tok[j] < 0 ? 0 : tok[j] + kt * 64), tok[j] >= 0);
			}
		if (weights)
		{
#pragma unroll
			for (int j = 0; j < WT; j++)
				g4c_cp_async16(ws + (threadIdx.x + j * GEMM_THREADS) * 16,
							   a.tiles + (wt[j] < 0 ? 0 : wt[j] + kt * 32), wt[j] >= 0);
			if (threadIdx.x < UNITS * 4)
				g4c_cp_async16(ws + UNITS * 512 + threadIdx.x * 16, a.scales + (sc < 0 ? 0 : sc + kt * 32), sc >= 0);
		}
	}
};

/* The A fragment of k16 step s (0..3) of a unit's k-tile: (code - 8) · scale
 * in bf16, rows g and g + 8 (layout in cuda_common.cuh). */
__device__ __forceinline__ void
wg_dequant_step(const uint4 &w, uint32_t s_lo, uint32_t s_hi, int s, uint32_t af[4])
{
	int			grp = s >> 1,
				step = s & 1;
	uint32_t	wg = grp ? w.y : w.x;
	uint32_t	wg8 = grp ? w.w : w.z;
	uint32_t	lo = grp ? s_lo >> 16 : s_lo & 0xffff;
	uint32_t	hi = grp ? s_hi >> 16 : s_hi & 0xffff;

	lo |= lo << 16;
	hi |= hi << 16;
	af[0] = g4c_bf16_mul2(g4c_i4_pair(wg, 2 * step), lo);
	af[1] = g4c_bf16_mul2(g4c_i4_pair(wg8, 2 * step), hi);
	af[2] = g4c_bf16_mul2(g4c_i4_pair(wg, 2 * step + 1), lo);
	af[3] = g4c_bf16_mul2(g4c_i4_pair(wg8, 2 * step + 1), hi);
}

#endif							/* __CUDA_ARCH_FEAT_SM90_ALL */

/* Grid as gemm_kernel's: x token tiles of NTOK, y weight tiles of 8R units,
 * z K ranges of a.kr k-tiles. */
template <int NTOK, int R>
__global__ void __launch_bounds__(GEMM_THREADS, 2)
w4_wgmma_kernel(gemm_args a)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
	constexpr int UNITS = 8 * R;
	constexpr int STAGE = wg_stage_bytes<NTOK, R>();
	extern __shared__ __align__(1024) unsigned char wg_smem[];
	int			lane = threadIdx.x & 31;
	int			warp = threadIdx.x >> 5;
	int			wgi = warp >> 2,
				wq = warp & 3;
	int			m0 = blockIdx.x * NTOK;
	int			u0 = blockIdx.y * UNITS;
	int			kt0 = blockIdx.z * a.kr;
	int			nkt = min(a.kr, a.KT - kt0);
	float		acc[R][NTOK / 2];
	uint32_t	af[R][4][4];
	wg_copies<NTOK, R> cp;

	g4c_pdl_trigger();
	cp.init(a, m0, u0);
	/* the weights of the first stages are in flight before the activations
	 * of the previous kernel may be read: all in one cp.async group, then
	 * WG_STAGES - 3 empty ones, so that the count below holds from k-tile 0 */
#pragma unroll
	for (int st = 0; st < WG_STAGES - 2; st++)
		if (st < nkt)
			cp.load(a, wg_smem + st * STAGE, kt0 + st, false, true);
	g4c_pdl_wait();
#pragma unroll
	for (int st = 0; st < WG_STAGES - 2; st++)
		if (st < nkt)
			cp.load(a, wg_smem + st * STAGE, kt0 + st, true, false);
	g4c_cp_async_commit();
#pragma unroll
	for (int st = 0; st < WG_STAGES - 3; st++)
		g4c_cp_async_commit();

	for (int kt = 0; kt < nkt; kt++)
	{
		const unsigned char *stage = wg_smem + (kt % WG_STAGES) * STAGE;
		uint4		w[R];
		uint32_t	s_lo[R],
					s_hi[R];

		/* k-tile kt has landed, and every warp is past the wait for the
		 * wgmmas of k-tile kt - 2: their stage may be refilled */
		g4c_cp_async_wait<WG_STAGES - 3>();
		__syncthreads();
		if (kt + WG_STAGES - 2 < nkt)
			cp.load(a, wg_smem + ((kt + WG_STAGES - 2) % WG_STAGES) * STAGE, kt0 + kt + WG_STAGES - 2, true, true);
		g4c_cp_async_commit();
#pragma unroll
		for (int r = 0; r < R; r++)
		{
			int			uu = wgi * 4 * R + r * 4 + wq;	/* this warp's unit in the block */
			const uint32_t *sc = reinterpret_cast<const uint32_t *>(stage + NTOK * 128 + UNITS * 512 + uu * 64);

			w[r] = *reinterpret_cast<const uint4 *>(stage + NTOK * 128 + ((size_t) uu * 32 + lane) * 16);
			s_lo[r] = sc[lane >> 2];
			s_hi[r] = sc[(lane >> 2) + 8];
		}
		{
			uint64_t	desc = wg_desc((uint32_t) __cvta_generic_to_shared(stage));

			/* one wgmma group per k16 step: step s of this k-tile is
			 * dequantised as soon as step s of the previous one has read
			 * its A registers, while that k-tile's later steps still run */
#pragma unroll
			for (int s = 0; s < 4; s++)
			{
				wg_wait<3>();
#pragma unroll
				for (int r = 0; r < R; r++)
					wg_dequant_step(w[r], s_lo[r], s_hi[r], s, af[r][s]);
				wg_fence();
#pragma unroll
				for (int r = 0; r < R; r++)
					wg_mma<NTOK>(acc[r], af[r][s], desc + (uint64_t) (2 * s), kt > 0 || s > 0);	/* + 32 bytes of k */
				wg_commit();
			}
		}
	}
	wg_wait<0>();
	g4c_cp_async_wait<0>();

	/* D fragment: warp wq's rows 16 wq + g (+8), tokens 8j + 2t (+1) */
	{
		float	   *y = a.y + (size_t) blockIdx.z * (size_t) a.n * (size_t) a.N;
		int			g = lane >> 2,
					t = lane & 3;

#pragma unroll
		for (int r = 0; r < R; r++)
#pragma unroll
			for (int j = 0; j < NTOK / 8; j++)
#pragma unroll
				for (int e = 0; e < 4; e++)
				{
					int			row = (u0 + wgi * 4 * R + r * 4 + wq) * 16 + g + 8 * (e >> 1);
					int			tok = m0 + 8 * j + 2 * t + (e & 1);

					if (row < a.N && tok < a.n)
						y[(size_t) tok * (size_t) a.N + (size_t) row] = acc[r][4 * j + e];
				}
	}
#endif
}

/* Writes 1 where this build holds the kernel above for the device. */
__global__ void
w4_wgmma_probe_kernel(int *out)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
	*out = 1;
#else
	*out = 0;
#endif
}

int
g4c_wgmma_probe(g4_cuda *c, int cc_major, int cc_minor)
{
	int		   *d = NULL;
	int			h = 0;
	cudaError_t e;

	if (cc_major != 9 || cc_minor != 0)
		return 0;
	e = cudaMalloc((void **) &d, sizeof(int));
	if (e == cudaSuccess)
	{
		w4_wgmma_probe_kernel<<<1, 1, 0, c->stream>>>(d);
		e = cudaGetLastError();
	}
	if (e == cudaSuccess)
		e = cudaMemcpyAsync(&h, d, sizeof(int), cudaMemcpyDeviceToHost, c->stream);
	if (e == cudaSuccess)
		e = cudaStreamSynchronize(c->stream);
	if (d)
		cudaFree(d);
	if (e != cudaSuccess)
	{
		cudaGetLastError();		/* no sm_90a image here: the mma.sync gemm serves */
		return 0;
	}
	return h;
}

template <int NTOK, int R>
static int
wgmma_occupancy(g4_cuda *c)
{
	static int	blocks;

	if (blocks <= 0)
		blocks = g4c_blocks_per_sm(c, (const void *) w4_wgmma_kernel<NTOK, R>, GEMM_THREADS,
								   WG_STAGES * wg_stage_bytes<NTOK, R>());
	return blocks;
}

template <int NTOK, int R>
static int
wgmma_launch(g4_cuda *c, const g4_weight *w, const float *x, int n, float *y)
{
	return gemm_split_run(c, "matmul (int4 wgmma)", w4_wgmma_kernel<NTOK, R>, w, x, n, y, NTOK, 8 * R,
						  8.0 * R * (512 + 64), (size_t) (WG_STAGES * wg_stage_bytes<NTOK, R>()),
						  wgmma_occupancy<NTOK, R>(c));
}

int
g4c_matmul_i4_wgmma(g4_cuda *c, const g4_weight *w, const float *x, int n, float *y)
{
	/* wg_copies keeps its offsets in 32 bits */
	if ((double) w->units * (double) w->ktiles * 32.0 > 2147483647.0 ||
		(double) n * (double) w->ktiles * 64.0 > 2147483647.0)
		return n <= 64 ? gemm_launch<G4C_W_I4, 4>(c, w, x, n, y) : gemm_launch<G4C_W_I4, 8>(c, w, x, n, y);
	if (n <= 32)
		return wgmma_launch<32, 2>(c, w, x, n, y);
	if (n <= 64)
		return wgmma_launch<64, 2>(c, w, x, n, y);
	return wgmma_launch<128, 1>(c, w, x, n, y);
}
