/*
 * embed_ops.cu — the media embedders' row operations: LayerNorm with weight
 * and bias, bias add, and the factorised 2-D position embedding.
 *
 * Numerics follow ops_embed.c: mean and variance accumulated in double, each
 * float product and sum rounded on its own (no contraction into FMA).
 */
#include "cuda_common.cuh"

#define LN_THREADS 256

__global__ void __launch_bounds__(LN_THREADS)
layernorm_kernel(const float *x, const float *w, const float *b, int dim, float eps, float *y)
{
	__shared__ double red[32];
	const float *xr = x + (size_t) blockIdx.x * (size_t) dim;
	float	   *yr = y + (size_t) blockIdx.x * (size_t) dim;
	double		s = 0.0,
				ss = 0.0;
	float		mean,
				f;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	for (int i = threadIdx.x; i < dim; i += blockDim.x)
		s += (double) xr[i];
	mean = (float) (g4c_block_sum_double(s, red) / dim);
	for (int i = threadIdx.x; i < dim; i += blockDim.x)
	{
		double		d = (double) xr[i] - (double) mean;

		ss += d * d;
	}
	f = powf(__fadd_rn((float) (g4c_block_sum_double(ss, red) / dim), eps), -0.5f);
	for (int i = threadIdx.x; i < dim; i += blockDim.x)
	{
		float		v = __fmul_rn(__fsub_rn(xr[i], mean), f);

		yr[i] = __fadd_rn(__fmul_rn(v, w[i]), b[i]);
	}
}

int
g4c_layernorm(g4_backend *be, const float *x, const float *w, const float *b, int rows, int dim, float eps, float *y)
{
	g4_cuda    *c = g4c_of(be);

	if (rows <= 0)
		return G4_OK;
	return g4c_launch(c, "layernorm", layernorm_kernel, dim3(rows), dim3(LN_THREADS), 0, x, w, b, dim, eps, y);
}

__global__ void
add_bias_kernel(float *x, const float *b, int rows, int dim)
{
	size_t		i = (size_t) blockIdx.x * blockDim.x + threadIdx.x;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	if (i < (size_t) rows * dim)
		x[i] = __fadd_rn(x[i], b[i % dim]);
}

int
g4c_add_bias(g4_backend *be, float *x, const float *b, int rows, int dim)
{
	g4_cuda    *c = g4c_of(be);
	size_t		n = (size_t) rows * dim;

	if (n == 0)
		return G4_OK;
	return g4c_launch(c, "add_bias", add_bias_kernel, dim3((unsigned) ((n + 255) / 256)), dim3(256), 0, x, b,
					  rows, dim);
}

__global__ void
add_pos2d_kernel(float *x, const float *table, const int32_t *pos, int rows, int dim)
{
	size_t		i = (size_t) blockIdx.x * blockDim.x + threadIdx.x;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	if (i < (size_t) rows * dim)
	{
		size_t		r = i / dim,
					k = i % dim;
		int			px = pos[2 * r],
					py = pos[2 * r + 1];
		float		tx = px >= 0 ? table[((size_t) px * 2) * dim + k] : 0.0f;
		float		ty = py >= 0 ? table[((size_t) py * 2 + 1) * dim + k] : 0.0f;

		x[i] = __fadd_rn(x[i], __fadd_rn(tx, ty));
	}
}

int
g4c_add_pos2d(g4_backend *be, float *x, const float *table, const int32_t *pos, int rows, int dim)
{
	g4_cuda    *c = g4c_of(be);
	size_t		n = (size_t) rows * dim;

	if (n == 0)
		return G4_OK;
	return g4c_launch(c, "add_pos2d", add_pos2d_kernel, dim3((unsigned) ((n + 255) / 256)), dim3(256), 0, x, table,
					  pos, rows, dim);
}
