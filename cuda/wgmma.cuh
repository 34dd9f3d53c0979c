/*
 * wgmma.cuh — Hopper's warpgroup MMA (wgmma.mma_async, sm_90a): the
 * primitives the int4 matmul (matmul_w4_wgmma.cu) and the prefill attention
 * (attention_prefill.cu) share.  Everything here exists only where the
 * build targets sm_90a; callers guard their kernel bodies the same way and
 * the backend runs them only where g4c_wgmma_probe found the image.
 *
 * Shared-memory operands are tiles of 128-byte rows in the 128-byte
 * swizzle: the 16-byte chunk c of row r sits at chunk c ^ (r & 7) of its
 * row, and each 8-row atom (1024 bytes) starts 1024-byte aligned.
 *   - K-major (wg_desc): a row holds 64 consecutive k of one m or n; a
 *     k16 step further along the row is the start address + 32 bytes.
 *   - MN-major (wg_desc_mn, with the transpose bit: B, or A read from
 *     shared memory): a row holds 64 consecutive m or n of one k, 8 k per
 *     atom.  Used with 64 of them only, so the stride between 64-wide
 *     blocks never enters, and both of the descriptor's offsets carry the
 *     one stride left, between the atoms of 8 k.
 */
#ifndef G4_WGMMA_CUH
#define G4_WGMMA_CUH

#include <stdint.h>

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

/* Ordinary shared-memory stores made visible to the wgmmas (the async
 * proxy) that read them after the next barrier. */
__device__ __forceinline__ void
wg_fence_proxy(void)
{
	asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* Pins n registers an asynchronous wgmma writes: code after a wg_wait
 * that reads them is ordered after it. */
__device__ __forceinline__ void
wg_fence_regs(float *r, int n)
{
#pragma unroll
	for (int i = 0; i < n; i++)
		asm volatile("" : "+f"(r[i])::"memory");
}

/* Descriptor of a K-major tile at shared address addr: 8-row atoms 1024
 * bytes apart. */
__device__ __forceinline__ uint64_t
wg_desc(uint32_t addr)
{
	return (uint64_t) ((addr & 0x3FFFF) >> 4) | ((uint64_t) 1 << 16) | ((uint64_t) (1024 >> 4) << 32) |
		((uint64_t) 1 << 62);
}

/* Descriptor of an MN-major tile of n = 64 at addr: atoms of 8 k 1024 bytes
 * apart (in both offsets, see above). */
__device__ __forceinline__ uint64_t
wg_desc_mn(uint32_t addr)
{
	return (uint64_t) ((addr & 0x3FFFF) >> 4) | ((uint64_t) (1024 >> 4) << 16) | ((uint64_t) (1024 >> 4) << 32) |
		((uint64_t) 1 << 62);
}

#define WG_D24 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
	"%16, %17, %18, %19, %20, %21, %22, %23}"
#define WG_D24_OPS(d) "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
	"+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), \
	"+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), \
	"+f"(d[23])
#define WG_D32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
	"%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_D32_OPS(d) WG_D24_OPS(d), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), \
	"+f"(d[29]), "+f"(d[30]), "+f"(d[31])

#define WG_D8 "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define WG_D8_OPS(d) "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])

/* d (+)= A · B, 64 × 16 × 16 in f16 with float32 accumulation, both in
 * shared memory: B K-major, A K-major or (TA) MN-major. */
template <int TA>
__device__ __forceinline__ void
wg_mma_f16_ss16(float *d, uint64_t da, uint64_t db, int accumulate)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
				 "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 " WG_D8 ", %8, %9, p, 1, 1, %11, 0;\n}\n"
				 : WG_D8_OPS(d)
				 : "l"(da), "l"(db), "r"(accumulate), "n"(TA));
}

/* d (+)= A · B, 64 × 48 × 16 in f16 with float32 accumulation, A and B
 * K-major in shared memory; accumulate 0 overwrites d. */
__device__ __forceinline__ void
wg_mma_f16_ss48(float *d, uint64_t da, uint64_t db, int accumulate)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n"
				 "wgmma.mma_async.sync.aligned.m64n48k16.f32.f16.f16 " WG_D24 ", %24, %25, p, 1, 1, 0, 0;\n}\n"
				 : WG_D24_OPS(d)
				 : "l"(da), "l"(db), "r"(accumulate));
}

/* d (+)= A · B, 64 × 64 × 16 in f16 with float32 accumulation, A in
 * registers (the m64k16 fragment), B MN-major in shared memory. */
__device__ __forceinline__ void
wg_mma_f16_rs64_mn(float *d, const uint32_t a[4], uint64_t db, int accumulate)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
				 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " WG_D32 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
				 : WG_D32_OPS(d)
				 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
}

#endif							/* __CUDA_ARCH_FEAT_SM90_ALL */

#endif							/* G4_WGMMA_CUH */
