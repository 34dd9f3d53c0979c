/*
 * norm_rope.cu — RMSNorm over rows, per-head RMSNorm + rotate-half RoPE
 * (with the store of a layer's k and v heads into the KV pool, where
 * given the layer), and the residual add with post-norm and layer scalar.
 *
 * Numerics follow the CPU's norm_rope.c: the mean of squares is
 * accumulated in double, the factor is powf(mean + eps, -0.5), and each
 * product / sum the CPU rounds separately is rounded separately here (no
 * contraction into FMA).  RoPE angles are float32 pos * inv_freq with an
 * accurate sincosf (positions reach 262,143; the slow path of sincosf
 * handles them).
 */
#include <math.h>
#include <string.h>

#include "kv_store.cuh"

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

/* The runs of heads, by value: run r holds heads [first[r], first[r + 1])
 * of a token; store[r]: the kv_store row its heads are (G4_STORE_K,
 * G4_STORE_V), or 0. */
struct hnr_runs
{
	int			col[G4_HEAD_RUNS_MAX];
	int			first[G4_HEAD_RUNS_MAX + 1];
	int			store[G4_HEAD_RUNS_MAX];
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
 * One warp per (token, head of any run), in kv_store.cuh's layout: lane l
 * holds elements [l·P, l·P + P) of the head (P = hd / 32; below 32 elements
 * one each for the first hd lanes).  Rotate-half pairs element j with
 * j + hd/2, which lies in lane l ^ 16 at the same index (below 32 elements,
 * in lane l ± hd/2): each lane scales its own elements, takes its partner's
 * by one shuffle each, and computes its half of the rotation, with the
 * CPU's roundings.  The weights and the rotation's sines and cosines are
 * computed before the wait for the previous kernel (weights and
 * positions are never written by a kernel of the step: the positions are
 * uploaded before the step's first kernel), the two lanes of a pair
 * computing half of their shared angles each; the chain of the step waits
 * only for the loads of x and the sum.  A layer's q, k and v heads are one
 * launch, and where `D` is given the warp of a stored run's head then
 * writes it into the pool as kv_store would (kv_put_row): one launch for
 * what took two.
 */
template <int P>
__global__ void __launch_bounds__(128)
head_norm_rope_kernel(float *x, int n, int stride, int hd, hnr_runs R, int heads, float eps, int vec,
					  const int32_t *pos, kv_dest D)
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
	/* P > 1: the pair's upper lane holds elements j + hd/2 */
	bool		upper = P > 1 ? lane >= 16 : lane >= half;
	int			partner = P > 1 ? lane ^ 16 : lane < half ? lane + half : lane < hd ? lane - half : lane;
	float		wv[P],
				sn[P],
				cs[P],
				xv[P],
				y[P];
	bool		rot[P];
	double		ss = 0.0;
	float	   *xh;
	float		f;

	g4c_pdl_trigger();
#pragma unroll
	for (int i = 0; i < P; i++)
	{
		int			e = lane * P + i;
		int			j = e < half ? e : e - half;

		wv[i] = 1.0f;			/* no weight: x * f * 1 is x * f exactly */
		rot[i] = false;
		sn[i] = 0.0f;
		cs[i] = 1.0f;
		if (live && e < hd)
		{
			if (w)
				wv[i] = w[e];
			rot[i] = inv_freq && inv_freq[j] != 0.0f;
		}
	}
	if constexpr (P > 1)
	{
		/* the pair shares its angles: the lower lane computes the first
		 * half of them, the upper lane the second, and they swap */
#pragma unroll
		for (int k = 0; k < P / 2; k++)
		{
			/* element k (lower lane) or k + P/2 (upper), by selects: a
			 * runtime index would put the arrays in local memory */
			bool		mine = upper ? rot[k + P / 2] : rot[k];
			int			j = (lane & 15) * P + (upper ? k + P / 2 : k);
			float		s = 0.0f,
						co = 1.0f,
						so,
						coo;

			if (mine)
				sincosf(__fmul_rn((float) pos[t], inv_freq[j]), &s, &co);
			so = __shfl_xor_sync(0xffffffffu, s, 16);
			coo = __shfl_xor_sync(0xffffffffu, co, 16);
			sn[k] = upper ? so : s;
			cs[k] = upper ? coo : co;
			sn[k + P / 2] = upper ? s : so;
			cs[k + P / 2] = upper ? co : coo;
		}
	}
	else if (rot[0])
		sincosf(__fmul_rn((float) pos[t], inv_freq[lane < half ? lane : lane - half]), &sn[0], &cs[0]);
	g4c_pdl_wait();
	if (!live)
		return;
	xh = x + (size_t) t * (size_t) stride + (size_t) col;
	lane_load<P>(xv, xh, hd, vec);
#pragma unroll
	for (int i = 0; i < P; i++)
		ss += (double) xv[i] * xv[i];
	for (int o = 16; o > 0; o >>= 1)
		ss += __shfl_xor_sync(0xffffffffu, ss, o);
	f = rms_factor(ss, hd, eps);
#pragma unroll
	for (int i = 0; i < P; i++)
	{
		float		own = __fmul_rn(__fmul_rn(xv[i], f), wv[i]);
		float		other = __shfl_sync(0xffffffffu, own, partner);

		/* element j: u cos - v sin; element j + hd/2: v cos + u sin (u, v
		 * the scaled elements j and j + hd/2) */
		y[i] = !rot[i] ? own : upper ? __fadd_rn(__fmul_rn(own, cs[i]), __fmul_rn(other, sn[i]))
			: __fsub_rn(__fmul_rn(own, cs[i]), __fmul_rn(other, sn[i]));
	}
	lane_store<P>(y, xh, hd, vec);
	if (D.layer_base && pick3(R.store, r))
	{
		int			off;
		uint8_t    *hb = kv_head_bytes(D, t, h - pick3(R.first, r), &off);

		if (hb)
			kv_put_row<P>(D, hb, off, y, pick3(R.store, r));
	}
}

int
g4c_head_norm_rope(g4_backend *be, float *x, int n, int stride, int hd, const g4_head_run *runs, int n_runs,
				   float eps, const g4_kv_layer *L)
{
	g4_cuda    *c = g4c_of(be);
	void		(*kernel) (float *, int, int, int, hnr_runs, int, float, int, const int32_t *, kv_dest);
	hnr_runs	R;
	kv_dest		D;
	int			heads = 0,
				vec;
	int			p = hd <= 32 ? 1 : hd / 32;

	/* the layout's heads: even widths up to 32, and 32 P for P a power of
	 * two up to 16 */
	if (n_runs < 1 || n_runs > G4_HEAD_RUNS_MAX || hd % 2 != 0 || (hd > 32 && (hd % 32 != 0 || (p & (p - 1)) != 0)) ||
		p > 16)
		return G4_ERR_UNSUPPORTED;
	memset(&R, 0, sizeof(R));
	memset(&D, 0, sizeof(D));
	for (int r = 0; r < G4_HEAD_RUNS_MAX; r++)
	{
		R.first[r] = heads;
		if (r < n_runs)
		{
			R.col[r] = runs[r].col;
			R.w[r] = runs[r].w;
			R.inv_freq[r] = runs[r].inv_freq;
			R.store[r] = L ? runs[r].store : 0;
			heads += runs[r].heads;
		}
	}
	/* the runs past n_runs start at `heads`: no head selects them */
	for (int r = n_runs; r <= G4_HEAD_RUNS_MAX; r++)
		R.first[r] = heads;
	if (L)
	{
		int			rows = 0,
					rc;

		for (int r = 0; r < n_runs; r++)
			rows |= 1 << runs[r].store;
		/* every row kv_store writes in a marked run */
		if (!(rows & 1 << G4_STORE_V) || (!L->k_eq_v && !(rows & 1 << G4_STORE_K)))
			return G4_ERR_INTERNAL;
		rc = g4c_kv_dest(c, L, &D);
		if (rc != G4_OK)
			return rc;
	}
	if ((size_t) n * (size_t) heads == 0)
		return G4_OK;
	kernel = lane_kernel_of(p, head_norm_rope_kernel<1>, head_norm_rope_kernel<2>, head_norm_rope_kernel<4>,
							head_norm_rope_kernel<8>, head_norm_rope_kernel<16>);
	/* 16-byte loads where every head's row is aligned */
	vec = (uintptr_t) x % 16 == 0 && stride % 4 == 0 && hd % 4 == 0;
	for (int r = 0; r < n_runs; r++)
		vec = vec && runs[r].col % 4 == 0;
	return g4c_launch(c, "head_norm_rope", kernel, dim3((n * heads + 3) / 4), dim3(128), 0, x, n, stride, hd, R, heads,
					  eps, vec, (const int32_t *) c->d_pos, D);
}
