/*
 * matmul_dense.cu — bf16 weights (the tied embedding / LM head and bf16
 * checkpoints) in tensor-core fragment order, and float32 weights (every
 * other format, dequantised exactly at upload, and narrow matrices) on the
 * CUDA cores in float32.
 *
 * Device memory: bf16 2 bytes per weight (columns padded to 64), float32 4
 * bytes per weight.
 */
#include "matmul.cuh"

/* ---- bf16 ---------------------------------------------------------------- */

/* One thread per (row, column pair): places W[r][k..k+1] in its fragment
 * register (layout in cuda_common.cuh). */
__global__ void
pack_bf16_kernel(const uint16_t *raw, int64_t rows, int64_t in, int64_t row0, int64_t ktiles, uint32_t *packed)
{
	int64_t		pairs = in / 2;
	int64_t		i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
	int64_t		r,
				k,
				R;
	int			rr,
				kk;
	size_t		tile;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	if (i >= rows * pairs)
		return;
	r = i / pairs;
	k = (i % pairs) * 2;
	R = row0 + r;
	rr = (int) (R & 15);
	kk = (int) (k & 15);
	tile = (size_t) ((R >> 4) * ktiles * 4 + (k >> 4));
	packed[(tile * 32 + (size_t) ((rr & 7) * 4 + ((kk & 7) >> 1))) * 4 + (size_t) ((rr >> 3) + 2 * (kk >> 3))] =
		(uint32_t) raw[r * in + k] | ((uint32_t) raw[r * in + k + 1] << 16);
}

int
g4c_pack_bf16(g4_cuda *c, g4_weight *w, const uint16_t *raw, int64_t row0, int64_t rows)
{
	int64_t		items = rows * (w->in / 2);

	if (items == 0)
		return G4_OK;
	return g4c_launch(c, "pack bf16 weight", pack_bf16_kernel, dim3((unsigned) ((items + 255) / 256)), dim3(256), 0,
					  raw, rows, w->in, row0, w->ktiles, (uint32_t *) w->data);
}

/*
 * bf16 weights by row count: skinny up to BF16_SKINNY_MAX_ROWS (split
 * activations, float32-class, as the int4 GEMV on Hopper), the gemm beyond
 * with 32, 64 or 128 token rows per block (activations rounded to bf16).
 * The gemm streams the weights faster at every row count (the 12B's 2 GB LM
 * head, RESULTS.md runs 110-111: 445 / 453 / 465 / 470 us at 1 / 8 / 12 /
 * 16 rows against the skinny kernel's 494 / 629 / 664 / 719); up to 8 rows
 * the skinny kernel stays for float32-class logits at small batch.
 */
#define BF16_SKINNY_MAX_ROWS 8

int
g4c_matmul_bf16(g4_cuda *c, const g4_weight *w, const float *x, int n, float *y)
{
	if (n <= 0)
		return G4_OK;
	if (n <= BF16_SKINNY_MAX_ROWS)
		return skinny_launch<G4C_W_BF16>(c, w, x, n, y);
	if (n <= 32)
		return gemm_launch<G4C_W_BF16, 2>(c, w, x, n, y, NULL);
	if (n <= 64)
		return gemm_launch<G4C_W_BF16, 4>(c, w, x, n, y, NULL);
	return gemm_launch<G4C_W_BF16, 8>(c, w, x, n, y, NULL);
}

/* ---- float32 --------------------------------------------------------------- */

#define SG_TILE 64
#define SG_K 16

/* 64 x 64 output tiles, 256 threads of 4 x 4 (tokens x outputs).  The one
 * float32 kernel at every row count: each output is one FMA chain over k in
 * order, so a row's result never depends on how many rows the call has (a
 * verify step's rows equal their decode steps'; a warp-per-row GEMV for few
 * rows summed lanes in another order, and its cost is negligible on the
 * narrow matrices this serves). */
__global__ void __launch_bounds__(256)
sgemm_f32_kernel(const float *W, const float *x, int n, int K, int N, float *y)
{
	__shared__ float xs[SG_K][SG_TILE + 1];
	__shared__ float ws[SG_K][SG_TILE + 1];
	int			t0 = blockIdx.y * SG_TILE;
	int			o0 = blockIdx.x * SG_TILE;
	int			tx = threadIdx.x & 15,
				ty = threadIdx.x >> 4;
	float		acc[4][4];

	g4c_pdl_trigger();
	g4c_pdl_wait();
	for (int i = 0; i < 4; i++)
		for (int j = 0; j < 4; j++)
			acc[i][j] = 0.0f;
	for (int k0 = 0; k0 < K; k0 += SG_K)
	{
		for (int i = threadIdx.x; i < SG_TILE * SG_K; i += blockDim.x)
		{
			int			r = i / SG_K,
						k = i % SG_K;
			int			kk = k0 + k;

			xs[k][r] = (t0 + r < n && kk < K) ? x[(size_t) (t0 + r) * (size_t) K + (size_t) kk] : 0.0f;
			ws[k][r] = (o0 + r < N && kk < K) ? W[(size_t) (o0 + r) * (size_t) K + (size_t) kk] : 0.0f;
		}
		__syncthreads();
#pragma unroll
		for (int k = 0; k < SG_K; k++)
		{
			float		a[4],
						b[4];

			for (int i = 0; i < 4; i++)
			{
				a[i] = xs[k][ty * 4 + i];
				b[i] = ws[k][tx * 4 + i];
			}
			for (int i = 0; i < 4; i++)
				for (int j = 0; j < 4; j++)
					acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
		}
		__syncthreads();
	}
	for (int i = 0; i < 4; i++)
		for (int j = 0; j < 4; j++)
		{
			int			t = t0 + ty * 4 + i,
						o = o0 + tx * 4 + j;

			if (t < n && o < N)
				y[(size_t) t * (size_t) N + (size_t) o] = acc[i][j];
		}
}

int
g4c_matmul_f32(g4_cuda *c, const g4_weight *w, const float *x, int n, float *y)
{
	int			K = (int) w->in,
				N = (int) w->out;

	if (n <= 0)
		return G4_OK;
	return g4c_launch(c, "matmul (float32)", sgemm_f32_kernel,
					  dim3((N + SG_TILE - 1) / SG_TILE, (n + SG_TILE - 1) / SG_TILE), dim3(256), 0,
					  (const float *) w->data, x, n, K, N, y);
}
