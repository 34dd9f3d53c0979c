/*
 * matmul_w4.cu — int4 group-32 weights (compressed-tensors pack-quantized):
 * the repacking into tensor-core fragment order at upload, the matmul entry
 * point for every device weight kind, and the int4 kernel choice by row
 * count (g4c_matmul_i4).
 *
 * Device memory of an int4 weight: exactly the checkpoint's bytes (0.5 byte
 * per weight + one bf16 scale per 32), rows padded to 16 and columns to 64.
 */
#include <stdlib.h>
#include <string.h>

#include "matmul.cuh"

/* One thread per (row, group of 32 columns, t): builds the packed word of
 * lane (row % 8) * 4 + t (layout in cuda_common.cuh). */
__global__ void
pack_i4_kernel(const uint32_t *raw, const uint16_t *raw_scales, int64_t rows, int64_t in, int64_t row0,
			   int64_t ktiles, uint32_t *packed, uint16_t *scales)
{
	int64_t		groups = in / 32;
	int64_t		i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
	int64_t		r,
				G,
				R;
	int			t,
				rr;
	const uint32_t *src;
	uint32_t	word = 0;
	size_t		tile;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	if (i >= rows * groups * 4)
		return;
	t = (int) (i & 3);
	G = (i >> 2) % groups;
	r = (i >> 2) / groups;
	R = row0 + r;
	rr = (int) (R & 15);
	src = raw + r * (in / 8) + G * 4;
	for (int p = 0; p < 4; p++)
	{
		uint32_t	w = src[p];

		word |= ((w >> (8 * t)) & 15u) << (4 * p);
		word |= ((w >> (8 * t + 4)) & 15u) << (4 * (p + 4));
	}
	tile = (size_t) ((R >> 4) * ktiles + (G >> 1));
	packed[(tile * 32 + (size_t) ((rr & 7) * 4 + t)) * 4 + (size_t) ((rr >> 3) * 2 + (G & 1))] = word;
	if (t == 0)
		scales[(tile * 16 + (size_t) rr) * 2 + (size_t) (G & 1)] = raw_scales[r * groups + G];
}

int
g4c_pack_i4(g4_cuda *c, g4_weight *w, const uint32_t *raw, const uint16_t *raw_scales, int64_t row0, int64_t rows)
{
	int64_t		items = rows * (w->in / 32) * 4;

	if (items == 0)
		return G4_OK;
	return g4c_launch(c, "pack int4 weight", pack_i4_kernel, dim3((unsigned) ((items + 255) / 256)), dim3(256), 0,
					  raw, raw_scales, rows, w->in, row0, w->ktiles, (uint32_t *) w->data, w->scales);
}

/*
 * The int4 kernel by row count n (figures: test/bench/RESULTS.md, "int4
 * matmuls by row count"):
 *   n <= I4_GEMV_MAX_ROWS     the GEMV (gemv_w4.cu): weights streamed once,
 *                             split bf16 activations (float32-class); on
 *                             Hopper up to I4_GEMV_MAX_ROWS_HOPPER, where
 *                             the two are within 5 % and the GEMV keeps its
 *                             float32-class sums, the warpgroup-MMA kernel
 *                             beyond (a sliding layer's matmuls at 16 rows:
 *                             GEMV 116.8 us, wgmma 79.5; at 8: 81.6 / 77.6,
 *                             at 4: 57.8 / 75.6; run 56);
 *   n <= I4_WGMMA_MAX_ROWS    on Hopper, the warpgroup-MMA kernel
 *                             (matmul_w4_wgmma.cu), 16, 32, 64 or 128 tokens
 *                             per block (tiles of 128 above), K split to
 *                             fill the GPU (bf16 activations: bf16-class);
 *                             cuBLASLt beyond;
 *   n <  I4_LT_MIN_ROWS       elsewhere, the mma.sync gemm (matmul.cuh),
 *                             likewise with 32 / 64 / 128 rows;
 *   beyond                    dequantised to bf16 + cuBLASLt (matmul_lt.cu).
 * G4_MATMUL_I4=gemv, =gemm, =wgmma or =lt forces a path wherever it serves
 * the row count (the GEMV up to its 16 rows, wgmma on Hopper at any count,
 * in tiles of 128 rows above 128), so that benchmarks can time them on the
 * same shapes.
 */
#define I4_GEMV_MAX_ROWS 16
#define I4_GEMV_MAX_ROWS_HOPPER 8
/* a sliding layer's matmuls: wgmma 268 / cuBLASLt 376 us at 256 rows,
 * 480 / 519 at 512 (run 62) */
#define I4_WGMMA_MAX_ROWS 512
/* without wgmma: gemm 306 / cuBLASLt 343 us at 128 rows, 488 / 377 us at
 * 192 (run 22) */
#define I4_LT_MIN_ROWS 160

/* With gg, GEGLU of the product into gg->out: in the gemms' partial sums
 * where K is split, else after the product. */
int
g4c_matmul_i4(g4_cuda *c, const g4_weight *w, const float *x, int n, float *y, const g4c_geglu_after *gg)
{
	/* read at every call (~0.1 us beside a launch) so that bench-gpu can
	 * switch paths within one process */
	const char *force = getenv("G4_MATMUL_I4");
	int			rc;

	if (n <= 0)
		return G4_OK;
	if (force && strcmp(force, "gemv") != 0 && strcmp(force, "gemm") != 0 && strcmp(force, "wgmma") != 0 &&
		strcmp(force, "lt") != 0)
		force = NULL;
	if (n <= I4_GEMV_MAX_ROWS &&
		(force ? strcmp(force, "gemv") == 0 : n <= (c->wgmma ? I4_GEMV_MAX_ROWS_HOPPER : I4_GEMV_MAX_ROWS)))
		rc = g4c_gemv_i4(c, w, x, n, y);
	else if (force ? strcmp(force, "lt") == 0 : n > (c->wgmma ? I4_WGMMA_MAX_ROWS : I4_LT_MIN_ROWS - 1))
		return gg ? g4c_matmul_geglu_i4_lt(c, w, x, n, y, gg) : g4c_matmul_i4_lt(c, w, x, n, y);
	else if (c->wgmma && (force ? strcmp(force, "wgmma") == 0 : n <= I4_WGMMA_MAX_ROWS))
		return g4c_matmul_i4_wgmma(c, w, x, n, y, gg);
	else if (n <= 32)
		return gemm_launch<G4C_W_I4, 2>(c, w, x, n, y, gg);
	else if (n <= 64)
		return gemm_launch<G4C_W_I4, 4>(c, w, x, n, y, gg);
	else
		return gemm_launch<G4C_W_I4, 8>(c, w, x, n, y, gg);
	if (rc != G4_OK || !gg)
		return rc;
	return g4c_geglu(&c->base, y, n, gg->ff, gg->out);
}

int
g4c_matmul(g4_backend *be, const g4_weight *w, const float *x, int n, float *y)
{
	g4_cuda    *c = g4c_of(be);

	switch (w->kind)
	{
		case G4C_W_I4:
			return g4c_matmul_i4(c, w, x, n, y, NULL);
		case G4C_W_BF16:
			return g4c_matmul_bf16(c, w, x, n, y);
		default:
			return g4c_matmul_f32(c, w, x, n, y);
	}
}

/* The MLP's gate/up product and GEGLU: int4 weights apply GEGLU where
 * their K split's partial sums are added (one kernel fewer per layer in
 * decode steps); the rest as the two operations. */
int
g4c_matmul_geglu(g4_backend *be, const g4_weight *w, const float *x, int n, int ff, float *gu, float *out)
{
	g4_cuda    *c = g4c_of(be);
	g4c_geglu_after gg = {ff, out};
	int			rc;

	if (w->kind == G4C_W_I4)
		return g4c_matmul_i4(c, w, x, n, gu, &gg);
	rc = g4c_matmul(be, w, x, n, gu);
	return rc != G4_OK ? rc : g4c_geglu(be, gu, n, ff, out);
}
