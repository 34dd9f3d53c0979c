/*
 * matmul_w4_wgmma.cu — int4 group-32 weights × bf16 activations on Hopper's
 * warpgroup MMA (wgmma.mma_async, sm_90a), for batched decode and short
 * prefill steps: 9 to 512 token rows, in tiles of up to 128 (g4c_matmul_i4
 * chooses).
 *
 * The weights are the A operand, dequantised in registers: the packed int4
 * tiles (cuda_common.cuh) are already in the A-fragment order of a 16-row
 * slice, which is what each warp of a warpgroup holds for m64nNk16.  The
 * token rows are the B operand, N = 16, 32, 64 or 128 of them, read by the
 * tensor cores straight from shared memory through a matrix descriptor: the
 * stage's activation tile (N rows of 64 bf16, 16-byte chunks XOR-swizzled by
 * row) is the K-major 128-byte-swizzle layout.  One wgmma then covers 64
 * weight rows × N tokens × 16 k, where mma.sync needed 8 to 32 instructions,
 * each fed by its own shared-memory loads: the mma.sync gemm spent ~400
 * instructions per warp and k-tile at 64 rows and ran at a third of the
 * tensor pipe, latency-bound (ncu, run 37).
 *
 * A block is two warpgroups (256 threads) over R × 128 weight rows; k-tiles
 * of 64 flow through a WG_STAGES-deep ring of shared-memory stages, each filled
 * by three tensor copies (cp.async.bulk.tensor: the activation tile, swizzled
 * by the copy itself, the 8R units' words and their scales) that one thread
 * issues and that complete on the stage's mbarrier.  The per-thread cp.async
 * copies they replace were 75 of the k-loop's 266 instructions per warp and
 * k-tile (SASS, run 66); without them a sliding layer's matmuls take 108.8
 * rather than 116.0 us at 64 rows, 130.3 / 152.0 at 128, 223.6 / 268.7 at
 * 256, and the same at 16 and 32 (run 72).  The weights of the first stages
 * are in flight before the wait for the previous kernel.
 * Per k-tile: one barrier (every warp is past k-tile kt - 2, whose stage is
 * then refilled), the wait for the stage's copies, the warp's weight words
 * from shared memory, then per k16 step: a wait for that step of the
 * previous k-tile (its A registers are reused), the dequantisation ((code -
 * 8) · scale, one rounding, as the mma.sync gemm) and R wgmmas committed as
 * a group, so that a step is dequantised while the previous k-tile's later
 * steps still run (one group per k-tile: 117.6 -> 116.9 us for a sliding
 * layer's matmuls at 64 rows, 158.4 -> 152.5 at 128; run 56).  K is split
 * over blocks and the partial sums added in range order as for the gemm
 * (gemm_split_finish): results are deterministic.
 */
#include <cudaTypedefs.h>

#include "matmul.cuh"
#include "wgmma.cuh"

/* Stages per block.  Four (two k-tiles in flight, 48 / 53 / 70 / 86 KB of
 * shared memory at 16 / 32 / 64 / 128 tokens) rather than five: alone the
 * kernel runs the same with 3 to 5, but in a step the smaller blocks are
 * resident beside the previous kernel's sooner (decode B=128 7,440 -> 7,937
 * tok/s, B=64 5,940 -> 6,013; run 76), and 6 or 8 stages at 64 / 32 tokens
 * were slower (run 75). */
#define WG_STAGES 4

/* Bytes of one stage: the activation tile, then 8R units' words and scales,
 * rounded to the 1024 bytes the swizzled tile's alignment needs. */
template <int NTOK, int R>
__host__ __device__ constexpr int
wg_stage_bytes(void)
{
	return (NTOK * 128 + 8 * R * (512 + 64) + 1023) / 1024 * 1024;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* acc (+)= A (64 weight rows × 16 k, registers) · B (16 k × NTOK tokens);
 * the first product of a block writes acc (accumulate 0) rather than adding
 * to zeros set by other instructions, which would serialise the wgmmas */
template <int NTOK>
__device__ __forceinline__ void wg_mma(float *acc, const uint32_t a[4], uint64_t desc, int accumulate);

template <>
__device__ __forceinline__ void
wg_mma<16>(float *d, const uint32_t a[4], uint64_t desc, int accumulate)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
				 "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 " WG_D8 ", "
				 "{%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
				 : WG_D8_OPS(d)
				 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
}

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

/* mbarrier and tensor-copy primitives (one stage's "full" barrier: one
 * arrival with the stage's byte count, completed by its copies) */
__device__ __forceinline__ void
wg_mbar_init(uint32_t bar)
{
	asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar) : "memory");
}

/* the initialisations visible to the copies' completions */
__device__ __forceinline__ void
wg_mbar_init_fence(void)
{
	asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void
wg_mbar_expect(uint32_t bar, uint32_t bytes)
{
	asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void
wg_mbar_wait(uint32_t bar, uint32_t parity)
{
	asm volatile("{\n.reg .pred p;\nWAIT:\n"
				 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
				 "@!p bra WAIT;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}

__device__ __forceinline__ void
wg_tma_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar)
{
	asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
				 " [%0], [%1, {%2, %3}], [%4];\n"
				 ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar) : "memory");
}

__device__ __forceinline__ void
wg_tma_3d(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2, uint32_t bar)
{
	asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
				 " [%0], [%1, {%2, %3, %4}], [%5];\n"
				 ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar) : "memory");
}

#endif							/* __CUDA_ARCH_FEAT_SM90_ALL */

/*
 * The tensor maps of a launch (host-encoded, passed by value): the bf16
 * activations [n][Kp] in boxes of NTOK rows × 64 k with the 128-byte swizzle
 * wgmma's descriptor reads; a unit's packed words [U][KT][512 bytes] and its
 * scales [U][KT][32 bf16] in boxes of 8R units of one k-tile, landing in
 * the stage as the units' 512-byte tiles then their 64-byte scale rows.
 * Rows and units past the end arrive as zeros (and are counted in the
 * stage's bytes): their products are never stored.
 */
struct wg_maps
{
	CUtensorMap x,
				w,
				s;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* k-tile kt of the block's weights (words, then scales) into a stage */
template <int NTOK, int R>
__device__ __forceinline__ void
wg_load_weights(const wg_maps &m, uint32_t stage, uint32_t bar, int u0, int kt)
{
	wg_tma_3d(stage + NTOK * 128, &m.w, 0, kt, u0, bar);
	wg_tma_3d(stage + NTOK * 128 + 8 * R * 512, &m.s, 0, kt, u0, bar);
}

/* k-tile kt of the block's activation tile into a stage */
__device__ __forceinline__ void
wg_load_tokens(const wg_maps &m, uint32_t stage, uint32_t bar, int m0, int kt)
{
	wg_tma_2d(stage, &m.x, kt * 64, m0, bar);
}

/* The A fragment of k16 step s (0..3) of a unit's k-tile: (code - 8) · scale
 * in bf16, rows g and g + 8 (layout in cuda_common.cuh). */
__device__ __forceinline__ void
wg_dequant_step(const uint4 &w, uint32_t s_lo, uint32_t s_hi, int s, uint32_t af[4])
{
	int			grp = s >> 1,
				step = s & 1;
	uint32_t	wg = grp ? w.y : w.x;
	uint32_t	wg8 = grp ? w.w : w.z;
	uint32_t	dup = grp ? 0x3232u : 0x1010u;	/* the group's bf16 scale in both halves */
	uint32_t	lo = __byte_perm(s_lo, 0, dup);
	uint32_t	hi = __byte_perm(s_hi, 0, dup);

	af[0] = g4c_bf16_mul2(g4c_i4_pair(wg, 2 * step), lo);
	af[1] = g4c_bf16_mul2(g4c_i4_pair(wg8, 2 * step), hi);
	af[2] = g4c_bf16_mul2(g4c_i4_pair(wg, 2 * step + 1), lo);
	af[3] = g4c_bf16_mul2(g4c_i4_pair(wg8, 2 * step + 1), hi);
}

#endif							/* __CUDA_ARCH_FEAT_SM90_ALL */

/* Blocks per SM the registers must allow: 3 for tiles of 16 tokens (74
 * registers, no spills), 2 for the others.  Held to 3, tiles of 32 tokens
 * (66 registers) made decode B=16 3 % slower (run 150). */
constexpr int
wg_min_blocks(int ntok)
{
	return ntok == 16 ? 3 : 2;
}

/* Grid as gemm_kernel's: x token tiles of NTOK, y weight tiles of 8R units,
 * z K ranges of a.kr k-tiles.  Shared memory: WG_STAGES stages, then their
 * mbarriers. */
template <int NTOK, int R>
__global__ void __launch_bounds__(GEMM_THREADS, wg_min_blocks(NTOK))
w4_wgmma_kernel(gemm_args a, const __grid_constant__ wg_maps m)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
	constexpr int UNITS = 8 * R;
	constexpr int STAGE = wg_stage_bytes<NTOK, R>();
	constexpr uint32_t TX = NTOK * 128 + UNITS * (512 + 64);	/* bytes a stage's copies bring */
	/* the swizzled tiles need 1024-byte alignment, which dynamic shared
	 * memory has only while the kernel declares no static shared memory */
	extern __shared__ __align__(1024) unsigned char wg_smem[];
	uint32_t	smem0 = (uint32_t) __cvta_generic_to_shared(wg_smem);
	uint32_t	bar0 = smem0 + WG_STAGES * STAGE;
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

	g4c_pdl_trigger();
	/* the weights of the first stages are in flight before the activations
	 * of the previous kernel may be read */
	if (threadIdx.x == 0)
	{
#pragma unroll
		for (int st = 0; st < WG_STAGES; st++)
			wg_mbar_init(bar0 + 8 * st);
		wg_mbar_init_fence();
#pragma unroll
		for (int st = 0; st < WG_STAGES - 2; st++)
			if (st < nkt)
			{
				wg_mbar_expect(bar0 + 8 * st, TX);
				wg_load_weights<NTOK, R>(m, smem0 + st * STAGE, bar0 + 8 * st, u0, kt0 + st);
			}
	}
	g4c_pdl_wait();
	if (threadIdx.x == 0)
#pragma unroll
		for (int st = 0; st < WG_STAGES - 2; st++)
			if (st < nkt)
				wg_load_tokens(m, smem0 + st * STAGE, bar0 + 8 * st, m0, kt0 + st);

	for (int kt = 0; kt < nkt; kt++)
	{
		int			slot = kt % WG_STAGES;
		const unsigned char *stage = wg_smem + slot * STAGE;
		uint4		w[R];
		uint32_t	s_lo[R],
					s_hi[R];

		/* every warp is past the wait for the wgmmas of k-tile kt - 2 (and
		 * the barriers' initialisation): their stage may be refilled */
		__syncthreads();
		if (threadIdx.x == 0 && kt + WG_STAGES - 2 < nkt)
		{
			int			st = (kt + WG_STAGES - 2) % WG_STAGES;

			wg_mbar_expect(bar0 + 8 * st, TX);
			wg_load_weights<NTOK, R>(m, smem0 + st * STAGE, bar0 + 8 * st, u0, kt0 + kt + WG_STAGES - 2);
			wg_load_tokens(m, smem0 + st * STAGE, bar0 + 8 * st, m0, kt0 + kt + WG_STAGES - 2);
		}
		/* the stage's n-th fill completes phase n of its barrier */
		wg_mbar_wait(bar0 + 8 * slot, (uint32_t) (kt / WG_STAGES) & 1u);
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
			uint64_t	desc = wg_desc(smem0 + slot * STAGE);

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

/* cuTensorMapEncodeTiled, from the driver through the runtime (the
 * backend links the runtime only); resolved by g4c_wgmma_probe */
static PFN_cuTensorMapEncodeTiled_v12000 wg_encode;

int
g4c_wgmma_probe(g4_cuda *c, int cc_major, int cc_minor)
{
	int		   *d = NULL;
	int			h = 0;
	cudaError_t e;
	cudaDriverEntryPointQueryResult q;

	if (cc_major != 9 || cc_minor != 0)
		return 0;
	if (!wg_encode &&
		(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **) &wg_encode, 12000, cudaEnableDefault,
										  &q) != cudaSuccess || q != cudaDriverEntryPointSuccess))
	{
		cudaGetLastError();
		wg_encode = NULL;
		return 0;				/* the mma.sync gemm serves */
	}
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

/* Shared memory of a block: the stages, then one mbarrier per stage. */
template <int NTOK, int R>
static constexpr size_t
wgmma_smem_bytes(void)
{
	return (size_t) (WG_STAGES * wg_stage_bytes<NTOK, R>() + 8 * WG_STAGES);
}

template <int NTOK, int R>
static int
wgmma_occupancy(g4_cuda *c)
{
	static int	blocks;

	if (blocks <= 0)
		blocks = g4c_blocks_per_sm(c, (const void *) w4_wgmma_kernel<NTOK, R>, GEMM_THREADS,
								   wgmma_smem_bytes<NTOK, R>());
	return blocks;
}

/* One tensor map over global memory at base: dims[0] innermost (elements),
 * strides in bytes of dims 1.., boxes of box[] elements. */
static bool
wg_map(CUtensorMap *map, CUtensorMapDataType type, int rank, const void *base, const cuuint64_t *dims,
	   const cuuint64_t *strides, const cuuint32_t *box, CUtensorMapSwizzle swizzle)
{
	const cuuint32_t ones[3] = {1, 1, 1};

	return wg_encode(map, type, (cuuint32_t) rank, const_cast<void *>(base), dims, strides, box, ones,
					 CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
					 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* The maps of a launch (wg_maps); false where the driver refuses a shape */
template <int NTOK, int R>
static bool
wgmma_maps(const gemm_args &a, wg_maps *m)
{
	cuuint64_t	KT = (cuuint64_t) a.KT,
				U = (cuuint64_t) a.U;
	const cuuint64_t x_dims[2] = {KT * 64, (cuuint64_t) a.n};
	const cuuint64_t x_strides[1] = {KT * 64 * 2};
	const cuuint32_t x_box[2] = {64, NTOK};
	const cuuint64_t w_dims[3] = {128, KT, U};
	const cuuint64_t w_strides[2] = {512, KT * 512};
	const cuuint32_t w_box[3] = {128, 1, 8 * R};
	const cuuint64_t s_dims[3] = {32, KT, U};
	const cuuint64_t s_strides[2] = {64, KT * 64};
	const cuuint32_t s_box[3] = {32, 1, 8 * R};

	return wg_map(&m->x, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, a.xb, x_dims, x_strides, x_box,
				  CU_TENSOR_MAP_SWIZZLE_128B) &&
		wg_map(&m->w, CU_TENSOR_MAP_DATA_TYPE_UINT32, 3, a.tiles, w_dims, w_strides, w_box,
			   CU_TENSOR_MAP_SWIZZLE_NONE) &&
		wg_map(&m->s, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, a.scales, s_dims, s_strides, s_box,
			   CU_TENSOR_MAP_SWIZZLE_NONE);
}

template <int NTOK, int R>
static int
wgmma_launch(g4_cuda *c, const g4_weight *w, const float *x, int n, float *y, const g4c_geglu_after *gg)
{
	gemm_plan	p;
	wg_maps		m;
	int			rc = gemm_split_prepare(c, w, x, n, y, NTOK, 8 * R, 8.0 * R * (512 + 64), wgmma_occupancy<NTOK, R>(c),
										&p);

	if (rc != G4_OK)
		return rc;
	if (!wgmma_maps<NTOK, R>(p.a, &m))	/* past the maps' 2^32 dims: no model comes near */
		return g4c_fail(c, cudaErrorInvalidValue, "matmul (int4 wgmma): tensor maps", __FILE__, __LINE__);
	if (g4c_launch(c, "matmul (int4 wgmma)", w4_wgmma_kernel<NTOK, R>, p.grid, dim3(GEMM_THREADS),
				   wgmma_smem_bytes<NTOK, R>(), p.a, m) != G4_OK)
		return c->err_code;
	return gemm_split_finish(c, &p, gg);
}

int
g4c_matmul_i4_wgmma(g4_cuda *c, const g4_weight *w, const float *x, int n, float *y, const g4c_geglu_after *gg)
{
	/* 33 to 64 rows of a weight with fewer 256-row tiles than half the SMs
	 * (o, down, qkv: 15 to 40 tiles, K split up to eight ways) in tiles of
	 * 128 rows: twice the tiles, so K splits fewer ways and fewer partial
	 * sums are written and added.  Measured (RESULTS.md, run 146): decode
	 * B=64 +0.9-1.4 %; gate_up's 120 tiles so too -5 %, and these weights
	 * at 9 to 32 rows -2 %. */
	if (n > 32 && n <= 64 && w->units < 8 * (int64_t) c->sm_count)
		return wgmma_launch<64, 1>(c, w, x, n, y, gg);
	/* 9 to 16 rows (the GEMV serves 1 to 8) in tiles of 16 tokens, not
	 * 32: decode B=16 +1.6 % (run 150) */
	if (n <= 16)
		return wgmma_launch<16, 2>(c, w, x, n, y, gg);
	if (n <= 32)
		return wgmma_launch<32, 2>(c, w, x, n, y, gg);
	if (n <= 64)
		return wgmma_launch<64, 2>(c, w, x, n, y, gg);
	return wgmma_launch<128, 1>(c, w, x, n, y, gg);
}
