/*
 * norm_rope.cu — RMSNorm over rows, per-head RMSNorm + rotate-half RoPE, and
 * the residual add with post-norm and layer scalar.
 *
 * Numerics follow ops_dense.c: the mean of squares is accumulated in double,
 * the factor is powf(mean + eps, -0.5), and each product / sum the CPU
 * rounds separately is rounded separately here (no contraction into FMA).
 * RoPE angles are float32 pos * inv_freq with an accurate sincosf
 * (positions reach 262,143; the slow path of sincosf handles them).
 */
#include <math.h>
#include <string.h>

#include "cuda_common.cuh"

#define NORM_THREADS 256

__device__ __forceinline__ float
rms_factor(double ss, int dim, float eps)
{
	return powf(__fadd_rn((float) (ss / dim), eps), -0.5f);
}

/* yb: y's bf16 copy, or NULL (g4c_act_bf16_offer) */
__global__ void __launch_bounds__(NORM_THREADS)
rmsnorm_kernel(const float *x, const float *w, int dim, float eps, float *y, uint16_t *yb)
{
	__shared__ double red[32];
	const float *xr = x + (size_t) blockIdx.x * (size_t) dim;
	float	   *yr = y + (size_t) blockIdx.x * (size_t) dim;
	double		ss = 0.0;
	float		f;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	for (int i = threadIdx.x; i < dim; i += blockDim.x)
		ss += (double) xr[i] * (double) xr[i];
	f = rms_factor(g4c_block_sum_double(ss, red), dim, eps);
	for (int i = threadIdx.x; i < dim; i += blockDim.x)
	{
		float		v = __fmul_rn(xr[i], f);

		v = w ? __fmul_rn(v, w[i]) : v;
		yr[i] = v;
		if (yb)
			yb[(size_t) blockIdx.x * (size_t) dim + i] = g4_f32_to_bf16(v);
	}
}

int
g4c_rmsnorm(g4_backend *be, const float *x, const float *w, int rows, int dim, float eps, float *y)
{
	g4_cuda    *c = g4c_of(be);

	if (rows <= 0)
		return G4_OK;
	return g4c_launch(c, "rmsnorm", rmsnorm_kernel, dim3(rows), dim3(NORM_THREADS), 0, x, w, dim, eps, y,
					  g4c_act_bf16_offer(c, y, rows, dim));
}

/* The residual add, and optionally the next block's input norm of the new
 * row (and its bf16 copy yb, if given): every element is read and written
 * by the same thread, so y may alias h (the sums between the passes are
 * block barriers). */
__global__ void __launch_bounds__(NORM_THREADS)
add_rmsnorm_kernel(float *x, const float *h, const float *w, int dim, float eps, float scale,
				   const float *next_w, float *y, uint16_t *yb)
{
	__shared__ double red[32];
	float	   *xr = x + (size_t) blockIdx.x * (size_t) dim;
	const float *hr = h + (size_t) blockIdx.x * (size_t) dim;
	double		ss = 0.0;
	float		f;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	for (int i = threadIdx.x; i < dim; i += blockDim.x)
		ss += (double) hr[i] * (double) hr[i];
	f = rms_factor(g4c_block_sum_double(ss, red), dim, eps);
	ss = 0.0;
	for (int i = threadIdx.x; i < dim; i += blockDim.x)
	{
		float		v = __fadd_rn(xr[i], __fmul_rn(__fmul_rn(hr[i], f), w[i]));

		v = scale == 1.0f ? v : __fmul_rn(v, scale);
		xr[i] = v;
		ss += (double) v * (double) v;
	}
	if (!y)
		return;
	f = rms_factor(g4c_block_sum_double(ss, red), dim, eps);
	y += (size_t) blockIdx.x * (size_t) dim;
	for (int i = threadIdx.x; i < dim; i += blockDim.x)
	{
		float		v = __fmul_rn(__fmul_rn(xr[i], f), next_w[i]);

		y[i] = v;
		if (yb)
			yb[(size_t) blockIdx.x * (size_t) dim + i] = g4_f32_to_bf16(v);
	}
}

/*
 * The same for rows of at most 4 float4 per thread (dim a multiple of 4):
 * every operand of the row is loaded at once into registers (the weights
 * before the wait for the previous kernel: no kernel of a step writes them),
 * so a one-row call waits for memory once instead of once per pass; the
 * arithmetic is the loop version's.
 */
__global__ void __launch_bounds__(NORM_THREADS)
add_rmsnorm_regs_kernel(float *x, const float *h, const float *w, int dim, float eps, float scale,
						const float *next_w, float *y, uint16_t *yb)
{
	__shared__ double red[32];
	const int	nv = dim / 4;
	float4	   *xr = reinterpret_cast<float4 *>(x + (size_t) blockIdx.x * (size_t) dim);
	const float4 *hr = reinterpret_cast<const float4 *>(h + (size_t) blockIdx.x * (size_t) dim);
	const float4 *w4 = reinterpret_cast<const float4 *>(w);
	const float4 *n4 = reinterpret_cast<const float4 *>(next_w);
	float4		hv[4],
				xv[4],
				wv[4],
				nv4[4];
	double		ss = 0.0;
	float		f;

	g4c_pdl_trigger();
#pragma unroll
	for (int j = 0; j < 4; j++)
	{
		int			i = threadIdx.x + j * NORM_THREADS;

		if (i < nv)
		{
			wv[j] = w4[i];
			if (y)
				nv4[j] = n4[i];
		}
	}
	g4c_pdl_wait();
#pragma unroll
	for (int j = 0; j < 4; j++)
	{
		int			i = threadIdx.x + j * NORM_THREADS;

		if (i < nv)
		{
			hv[j] = hr[i];
			xv[j] = xr[i];
			ss += (double) hv[j].x * hv[j].x + (double) hv[j].y * hv[j].y + (double) hv[j].z * hv[j].z +
				(double) hv[j].w * hv[j].w;
		}
	}
	f = rms_factor(g4c_block_sum_double(ss, red), dim, eps);
	ss = 0.0;
#pragma unroll
	for (int j = 0; j < 4; j++)
	{
		int			i = threadIdx.x + j * NORM_THREADS;

		if (i < nv)
		{
			float		v[4] = {hv[j].x, hv[j].y, hv[j].z, hv[j].w};
			const float xs[4] = {xv[j].x, xv[j].y, xv[j].z, xv[j].w};
			const float ws[4] = {wv[j].x, wv[j].y, wv[j].z, wv[j].w};

#pragma unroll
			for (int e = 0; e < 4; e++)
			{
				v[e] = __fadd_rn(xs[e], __fmul_rn(__fmul_rn(v[e], f), ws[e]));
				v[e] = scale == 1.0f ? v[e] : __fmul_rn(v[e], scale);
				ss += (double) v[e] * (double) v[e];
			}
			xv[j] = make_float4(v[0], v[1], v[2], v[3]);
			xr[i] = xv[j];
		}
	}
	if (!y)
		return;
	f = rms_factor(g4c_block_sum_double(ss, red), dim, eps);
	y += (size_t) blockIdx.x * (size_t) dim;
#pragma unroll
	for (int j = 0; j < 4; j++)
	{
		int			i = threadIdx.x + j * NORM_THREADS;

		if (i < nv)
		{
			float4		v = make_float4(__fmul_rn(__fmul_rn(xv[j].x, f), nv4[j].x),
										__fmul_rn(__fmul_rn(xv[j].y, f), nv4[j].y),
										__fmul_rn(__fmul_rn(xv[j].z, f), nv4[j].z),
										__fmul_rn(__fmul_rn(xv[j].w, f), nv4[j].w));

			reinterpret_cast<float4 *>(y)[i] = v;
			if (yb)
				reinterpret_cast<uint2 *>(yb + (size_t) blockIdx.x * (size_t) dim)[i] =
					make_uint2(g4_f32_to_bf16(v.x) | (uint32_t) g4_f32_to_bf16(v.y) << 16,
							   g4_f32_to_bf16(v.z) | (uint32_t) g4_f32_to_bf16(v.w) << 16);
		}
	}
}

int
g4c_add_rmsnorm(g4_backend *be, float *x, const float *h, const float *w, int n, int dim, float eps, float scale,
				const float *next_w, float *y)
{
	g4_cuda    *c = g4c_of(be);
	uint16_t   *yb;

	if (n <= 0)
		return G4_OK;
	yb = y ? g4c_act_bf16_offer(c, y, n, dim) : NULL;
	/* the register version reads and writes 16-byte vectors */
	if (dim % 4 == 0 && dim <= 16 * NORM_THREADS &&
		(((uintptr_t) x | (uintptr_t) h | (uintptr_t) w | (uintptr_t) next_w | (uintptr_t) y) & 15) == 0)
		return g4c_launch(c, "add_rmsnorm", add_rmsnorm_regs_kernel, dim3(n), dim3(NORM_THREADS), 0, x, h, w, dim,
						  eps, scale, next_w, y, yb);
	return g4c_launch(c, "add_rmsnorm", add_rmsnorm_kernel, dim3(n), dim3(NORM_THREADS), 0, x, h, w, dim, eps, scale,
					  next_w, y, yb);
}

#define HNR_PAIRS 8				/* rotation pairs per lane: head_dim up to 512 */

/* The runs of heads, by value: run r holds heads [first[r], first[r + 1])
 * of a token. */
struct hnr_runs
{
	int			col[G4_HEAD_RUNS_MAX];
	int			first[G4_HEAD_RUNS_MAX + 1];
	const float *w[G4_HEAD_RUNS_MAX];
	const float *inv_freq[G4_HEAD_RUNS_MAX];
};

/* a[r] for r in 0..2, by selects: indexing the parameter arrays by a
 * runtime value would copy them to local memory */
template <typename T>
__device__ __forceinline__ T
pick3(const T *a, int r)
{
	return r == 0 ? a[0] : r == 1 ? a[1] : a[2];
}

/*
 * One warp per (token, head of any run); lane handles the rotation pairs j,
 * j + hd/2 (j = lane + 32 p).  The weights and the rotation's sines and
 * cosines are computed before the wait for the previous kernel (weights and
 * positions are never written by a kernel of the step: the positions are
 * uploaded before the step's first kernel), and the head is held in
 * registers, so the chain of the step waits only for the loads of x and the
 * two sums.  A layer's q, k and v heads are one launch: two launches fewer
 * per layer than a launch per run.
 */
__global__ void
head_norm_rope_kernel(float *x, int n, int stride, int hd, hnr_runs R, int heads, float eps, const int32_t *pos)
{
	int			item = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
	int			lane = threadIdx.x & 31;
	int			half = hd / 2;
	bool		live = item < n * heads;
	int			t = live ? item / heads : 0;
	int			h = live ? item % heads : 0;
	int			r = (h >= R.first[1]) + (h >= R.first[2]);	/* absent runs start at `heads` */
	const float *w = pick3(R.w, r);
	const float *inv_freq = pick3(R.inv_freq, r);
	int			col = pick3(R.col, r) + (h - pick3(R.first, r)) * hd;
	float		wa[HNR_PAIRS],
				wb[HNR_PAIRS],
				sn[HNR_PAIRS],
				cs[HNR_PAIRS],
				a[HNR_PAIRS],
				b[HNR_PAIRS];
	bool		rot[HNR_PAIRS];
	double		ss = 0.0;
	float	   *xh;
	float		f;

	g4c_pdl_trigger();
#pragma unroll
	for (int p = 0; p < HNR_PAIRS; p++)
	{
		int			j = lane + 32 * p;

		rot[p] = false;
		wa[p] = wb[p] = 1.0f;	/* no weight: x * f * 1 is x * f exactly */
		if (live && j < half)
		{
			if (w)
			{
				wa[p] = w[j];
				wb[p] = w[j + half];
			}
			rot[p] = inv_freq && inv_freq[j] != 0.0f;
			if (rot[p])
				sincosf(__fmul_rn((float) pos[t], inv_freq[j]), &sn[p], &cs[p]);
		}
	}
	g4c_pdl_wait();
	if (!live)
		return;
	xh = x + (size_t) t * (size_t) stride + (size_t) col;
#pragma unroll
	for (int p = 0; p < HNR_PAIRS; p++)
	{
		int			j = lane + 32 * p;

		if (j < half)
		{
			a[p] = xh[j];
			b[p] = xh[j + half];
			ss += (double) a[p] * a[p] + (double) b[p] * b[p];
		}
	}
	for (int o = 16; o > 0; o >>= 1)
		ss += __shfl_xor_sync(0xffffffffu, ss, o);
	f = rms_factor(ss, hd, eps);
#pragma unroll
	for (int p = 0; p < HNR_PAIRS; p++)
	{
		int			j = lane + 32 * p;

		if (j < half)
		{
			float		u = __fmul_rn(__fmul_rn(a[p], f), wa[p]);
			float		v = __fmul_rn(__fmul_rn(b[p], f), wb[p]);

			if (rot[p])
			{
				xh[j] = __fsub_rn(__fmul_rn(u, cs[p]), __fmul_rn(v, sn[p]));
				xh[j + half] = __fadd_rn(__fmul_rn(v, cs[p]), __fmul_rn(u, sn[p]));
			}
			else
			{
				xh[j] = u;
				xh[j + half] = v;
			}
		}
	}
}

int
g4c_head_norm_rope(g4_backend *be, float *x, int n, int stride, int hd, const g4_head_run *runs, int n_runs,
				   float eps)
{
	g4_cuda    *c = g4c_of(be);
	hnr_runs	R;
	int			heads = 0;

	if (n_runs < 1 || n_runs > G4_HEAD_RUNS_MAX || hd % 2 != 0 || hd / 2 > 32 * HNR_PAIRS)
		return G4_ERR_UNSUPPORTED;
	memset(&R, 0, sizeof(R));
	for (int r = 0; r < G4_HEAD_RUNS_MAX; r++)
	{
		R.first[r] = heads;
		if (r < n_runs)
		{
			R.col[r] = runs[r].col;
			R.w[r] = runs[r].w;
			R.inv_freq[r] = runs[r].inv_freq;
			heads += runs[r].heads;
		}
	}
	/* the runs past n_runs start at `heads`: no head selects them */
	for (int r = n_runs; r <= G4_HEAD_RUNS_MAX; r++)
		R.first[r] = heads;
	if ((size_t) n * (size_t) heads == 0)
		return G4_OK;
	return g4c_launch(c, "head_norm_rope", head_norm_rope_kernel, dim3((n * heads + 3) / 4), dim3(128), 0, x, n,
					  stride, hd, R, heads, eps, (const int32_t *) c->d_pos);
}
