/*
 * matmul_lt.cu — int4 matmuls at prefill row counts through cuBLASLt: the
 * weight is dequantised into a bf16 scratch matrix ((code - 8) · scale, one
 * rounding: the values the int4 gemm kernel feeds its tensor cores) and
 * multiplied by the bf16 activations with float32 accumulation.  The
 * dequantisation streams the weight once per call (2.5 bytes per weight),
 * which the GEMM's speed repays only at many rows: the threshold is in
 * g4c_matmul_i4 (matmul_w4.cu).
 *
 * The cuBLASLt handle and its workspace are made with the backend, so calls
 * recorded into a step graph allocate nothing.
 */
#include <cublasLt.h>

#include "matmul.cuh"

#define LT_WORKSPACE_BYTES ((size_t) 32 << 20)

/* One thread per 8 consecutive columns of one row: the four words of the
 * row's group in lanes 4g..4g+3 (layout in cuda_common.cuh) hold columns
 * 8p + 2t (nibble p) and 8p + 2t + 1 (nibble p + 4) for t = 0..3. */
__global__ void
dequant_i4_kernel(const uint32_t *packed, const uint16_t *scales, int rows, int KT, uint16_t *wb)
{
	int			Kp8 = KT * 8;
	size_t		total = (size_t) rows * (size_t) Kp8;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	for (size_t i = (size_t) blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t) gridDim.x * blockDim.x)
	{
		int			R = (int) (i / (size_t) Kp8);
		int			c8 = (int) (i - (size_t) R * (size_t) Kp8);
		int			G = c8 >> 2,
					p = c8 & 3;
		int			rr = R & 15;
		size_t		tile = (size_t) (R >> 4) * (size_t) KT + (size_t) (G >> 1);
		int			wi = (rr >> 3) * 2 + (G & 1);
		float		s = g4_bf16_to_f32(scales[(tile * 16 + (size_t) rr) * 2 + (size_t) (G & 1)]);
		uint32_t	out[4];

#pragma unroll
		for (int t = 0; t < 4; t++)
		{
			uint32_t	word = packed[(tile * 32 + (size_t) ((rr & 7) * 4 + t)) * 4 + (size_t) wi];
			float		v0 = (float) ((int) ((word >> (4 * p)) & 15u) - 8) * s;
			float		v1 = (float) ((int) ((word >> (4 * (p + 4))) & 15u) - 8) * s;

			out[t] = g4c_pack_bf16(v0, v1);
		}
		reinterpret_cast<uint4 *>(wb)[i] = make_uint4(out[0], out[1], out[2], out[3]);
	}
}

static int
lt_fail(g4_cuda *c, cublasStatus_t st, const char *what)
{
	if (c->err_code == G4_OK)
	{
		c->err_code = G4_ERR_BACKEND;
		snprintf(c->err_msg, sizeof(c->err_msg), "cuBLASLt %s: status %d", what, (int) st);
	}
	return G4_ERR_BACKEND;
}

int
g4c_lt_init(g4_cuda *c)
{
	cublasLtHandle_t h = NULL;

	cublasStatus_t st = cublasLtCreate(&h);

	if (st != CUBLAS_STATUS_SUCCESS)
		return lt_fail(c, st, "handle");
	c->lt = h;
	G4C_CHECK(c, cudaMalloc(&c->lt_ws, LT_WORKSPACE_BYTES));
	return G4_OK;
}

void
g4c_lt_free(g4_cuda *c)
{
	if (c->lt_ws)
		cudaFree(c->lt_ws);
	if (c->lt)
		cublasLtDestroy((cublasLtHandle_t) c->lt);
	c->lt_ws = NULL;
	c->lt = NULL;
}

#define LT_CHECK(c, call, what) do { cublasStatus_t _s = (call); \
	if (_s != CUBLAS_STATUS_SUCCESS) { rc = lt_fail((c), _s, (what)); goto done; } } while (0)

/* y[n][N] = x[n][K]·Wᵀ.  Column-major, as cuBLAS sees it: yᵀ (N x n) =
 * W (N x Kp, stored as its transpose, Kp x N) times xᵀ (Kp x n). */
int
g4c_matmul_i4_lt(g4_cuda *c, const g4_weight *w, const float *x, int n, float *y)
{
	int			Kp = (int) w->ktiles * 64;
	int			N = (int) w->out;
	size_t		xb_bytes = ((size_t) n * (size_t) Kp * 2 + 255) & ~(size_t) 255;
	unsigned char *scratch = (unsigned char *) g4c_scratch(c, xb_bytes + (size_t) N * (size_t) Kp * 2);
	uint16_t   *xb,
			   *wb;
	cublasLtMatmulDesc_t op = NULL;
	cublasLtMatrixLayout_t la = NULL,
				lb = NULL,
				ld = NULL;
	cublasLtMatmulPreference_t pref = NULL;
	cublasLtMatmulHeuristicResult_t heur;
	cublasOperation_t ta = CUBLAS_OP_T;
	size_t		ws = LT_WORKSPACE_BYTES;
	int			found = 0;
	float		alpha = 1.0f,
				beta = 0.0f;
	int			rc = G4_OK;

	if (!scratch)
		return c->err_code;
	xb = (uint16_t *) scratch;
	wb = (uint16_t *) (scratch + xb_bytes);
	if (g4c_to_bf16(c, x, n, (int) w->in, Kp, xb) != G4_OK)
		return c->err_code;
	{
		size_t		total = (size_t) N * (size_t) w->ktiles * 8;
		size_t		blocks = (total + 255) / 256;

		if (blocks > (size_t) c->sm_count * 16)
			blocks = (size_t) c->sm_count * 16;
		if (g4c_launch(c, "matmul (int4 to bf16)", dequant_i4_kernel, dim3((unsigned) blocks), dim3(256), 0,
					   (const uint32_t *) w->data, (const uint16_t *) w->scales, N, (int) w->ktiles, wb) != G4_OK)
			return c->err_code;
	}
	LT_CHECK(c, cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "descriptor");
	LT_CHECK(c, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "descriptor");
	LT_CHECK(c, cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, Kp, N, Kp), "layout");
	LT_CHECK(c, cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, Kp, n, Kp), "layout");
	LT_CHECK(c, cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, N, n, N), "layout");
	LT_CHECK(c, cublasLtMatmulPreferenceCreate(&pref), "preference");
	LT_CHECK(c, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
			 "preference");
	LT_CHECK(c, cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t) c->lt, op, la, lb, ld, ld, pref, 1, &heur, &found),
			 "heuristic");
	if (found < 1)
	{
		rc = lt_fail(c, CUBLAS_STATUS_NOT_SUPPORTED, "no algorithm");
		goto done;
	}
	LT_CHECK(c, cublasLtMatmul((cublasLtHandle_t) c->lt, op, &alpha, wb, la, xb, lb, &beta, y, ld, y, ld,
							   &heur.algo, c->lt_ws, LT_WORKSPACE_BYTES, c->stream), "matmul");
done:
	if (pref)
		cublasLtMatmulPreferenceDestroy(pref);
	if (ld)
		cublasLtMatrixLayoutDestroy(ld);
	if (lb)
		cublasLtMatrixLayoutDestroy(lb);
	if (la)
		cublasLtMatrixLayoutDestroy(la);
	if (op)
		cublasLtMatmulDescDestroy(op);
	return rc;
}
