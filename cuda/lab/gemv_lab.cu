/*
 * gemv_lab.cu — an experiment for the int4 group-32 decode matmul (one
 * activation row), measured against the H200's copy bandwidth: does a
 * CUDA-core kernel reading the checkpoint's own layout ([N][K/8] int32 codes,
 * [N][K/32] bf16 scales) stream the weights near bandwidth where the current
 * tensor-core GEMV reaches 1.2–1.7 TB/s?
 *
 * Design (per 4.3 TB/s: ~16 weight bytes per clock per SM, ~33 weights):
 *  - x is staged in shared memory as float32, with the sum of each 32-wide
 *    group, so a group's dot is s * (sum(c * x) - 8 * sum(x)) with c the
 *    stored code 0..15: no per-weight subtraction;
 *  - codes become floats by byte permute into the mantissa of 2^23 and one
 *    subtraction (two operations per weight, no integer conversion);
 *  - each warp owns R rows; each lane reads one 16-byte group (32 codes) of
 *    each of its rows per step, so R independent 16-byte loads are in flight
 *    per lane; partial sums are reduced across the warp at the end.
 * Variant T stores x transposed so the lanes' shared-memory reads do not
 * conflict (in the plain layout all 32 lanes of a warp read the same bank).
 * Checked against a plain float64 reference kernel on random data; timed
 * with events over rotating weight copies larger than the L2.
 * Outcome (test/bench/RESULTS.md): 0.4-1.2 TB/s, slower than the engine's
 * tensor-core GEMV; kept to measure the next design against.
 *
 *   nvcc -O3 -gencode arch=compute_90,code=sm_90 -o gemv-lab cuda/lab/gemv_lab.cu && ./gemv-lab
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
	fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); exit(1); } } while (0)

/* plain reference: one thread per row, codes in order */
__global__ void
gemv_ref(const uint32_t *w, const __nv_bfloat16 *s, const float *x, float *y, int n, int k)
{
	int			r = blockIdx.x * blockDim.x + threadIdx.x;

	if (r >= n)
		return;
	double		acc = 0.0;

	for (int j = 0; j < k; j++)
	{
		uint32_t	word = w[(size_t) r * (k / 8) + j / 8];
		int			c = (int) ((word >> (4 * (j % 8))) & 15) - 8;

		acc += (double) c * (double) __bfloat162float(s[(size_t) r * (k / 32) + j / 32]) * (double) x[j];
	}
	y[r] = (float) acc;
}

/* x and its per-group sums into shared memory */
template <int THREADS>
__device__ void
stage_x(const float *x, int k, float *xs, float *gsum)
{
	for (int i = threadIdx.x; i < k; i += THREADS)
		xs[i] = x[i];
	__syncthreads();
	for (int g = threadIdx.x; g < k / 32; g += THREADS)
	{
		float		t = 0.0f;

		for (int i = 0; i < 32; i++)
			t += xs[32 * g + i];
		gsum[g] = t;
	}
	__syncthreads();
}

/* sum(c * x) over the 8 codes of one word against x[0..8) */
__device__ __forceinline__ float
word_dot(uint32_t w, const float *x)
{
	uint32_t	lo = w & 0x0F0F0F0Fu;		/* codes 0, 2, 4, 6 */
	uint32_t	hi = (w >> 4) & 0x0F0F0F0Fu;	/* codes 1, 3, 5, 7 */
	const float m = 8388608.0f;			/* 2^23: a byte in the mantissa is its value */
	float		acc;

	acc = (__uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7650)) - m) * x[0];
	acc = fmaf(__uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7650)) - m, x[1], acc);
	acc = fmaf(__uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7651)) - m, x[2], acc);
	acc = fmaf(__uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7651)) - m, x[3], acc);
	acc = fmaf(__uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7652)) - m, x[4], acc);
	acc = fmaf(__uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7652)) - m, x[5], acc);
	acc = fmaf(__uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7653)) - m, x[6], acc);
	acc = fmaf(__uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7653)) - m, x[7], acc);
	return acc;
}

template <int R, int WARPS>
__global__ void __launch_bounds__(32 * WARPS)
gemv_w4(const uint4 *w, const __nv_bfloat16 *s, const float *x, float *y, int n, int k)
{
	extern __shared__ float smem[];
	float	   *xs = smem;
	float	   *gsum = smem + k;
	int			groups = k / 32;
	int			lane = threadIdx.x & 31;
	int			row0 = (blockIdx.x * WARPS + (threadIdx.x >> 5)) * R;
	float		acc[R];

	stage_x<32 * WARPS>(x, k, xs, gsum);
#pragma unroll
	for (int r = 0; r < R; r++)
		acc[r] = 0.0f;
	if (row0 >= n)
		return;
	for (int g = lane; g < groups; g += 32)
	{
		uint4		q[R];
		float		sc[R];
		const float *xg = xs + 32 * g;

#pragma unroll
		for (int r = 0; r < R; r++)
		{
			int			row = min(row0 + r, n - 1);

			q[r] = __ldcs(&w[(size_t) row * groups + g]);	/* streamed once: evict first */
			sc[r] = __bfloat162float(s[(size_t) row * groups + g]);
		}
#pragma unroll
		for (int r = 0; r < R; r++)
		{
			float		d = word_dot(q[r].x, xg) + word_dot(q[r].y, xg + 8) +
				word_dot(q[r].z, xg + 16) + word_dot(q[r].w, xg + 24);

			acc[r] = fmaf(sc[r], d - 8.0f * gsum[g], acc[r]);
		}
	}
#pragma unroll
	for (int r = 0; r < R; r++)
	{
		float		v = acc[r];

		for (int o = 16; o > 0; o >>= 1)
			v += __shfl_xor_sync(0xffffffffu, v, o);
		if (lane == 0 && row0 + r < n)
			y[row0 + r] = v;
	}
}

/*
 * Variant T: x transposed in shared memory so that the 32 lanes, each on
 * its own group, read consecutive words (no bank conflicts): element e of
 * the group of lane l in warp step it lives at xt[(it * 32 + e) * 32 + l].
 */
template <int THREADS>
__device__ void
stage_x_t(const float *x, int k, float *xt, float *gsum)
{
	for (int i = threadIdx.x; i < k; i += THREADS)
	{
		int			it = i / 1024,
					l = (i % 1024) / 32,
					e = i % 32;

		xt[(it * 32 + e) * 32 + l] = x[i];
	}
	for (int g = threadIdx.x; g < k / 32; g += THREADS)
	{
		float		t = 0.0f;

		for (int i = 0; i < 32; i++)
			t += x[32 * g + i];
		gsum[g] = t;
	}
	__syncthreads();
}

__device__ __forceinline__ float
word_dot_t(uint32_t w, const float *xl, int e0)
{
	uint32_t	lo = w & 0x0F0F0F0Fu;
	uint32_t	hi = (w >> 4) & 0x0F0F0F0Fu;
	const float m = 8388608.0f;
	float		acc;

	acc = (__uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7650)) - m) * xl[(e0 + 0) * 32];
	acc = fmaf(__uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7650)) - m, xl[(e0 + 1) * 32], acc);
	acc = fmaf(__uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7651)) - m, xl[(e0 + 2) * 32], acc);
	acc = fmaf(__uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7651)) - m, xl[(e0 + 3) * 32], acc);
	acc = fmaf(__uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7652)) - m, xl[(e0 + 4) * 32], acc);
	acc = fmaf(__uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7652)) - m, xl[(e0 + 5) * 32], acc);
	acc = fmaf(__uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7653)) - m, xl[(e0 + 6) * 32], acc);
	acc = fmaf(__uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7653)) - m, xl[(e0 + 7) * 32], acc);
	return acc;
}

template <int R, int WARPS>
__global__ void __launch_bounds__(32 * WARPS)
gemv_w4_t(const uint4 *w, const __nv_bfloat16 *s, const float *x, float *y, int n, int k)
{
	extern __shared__ float smem[];
	int			groups = k / 32;
	int			iters = (groups + 31) / 32;
	float	   *xt = smem;
	float	   *gsum = smem + (size_t) iters * 1024;
	int			lane = threadIdx.x & 31;
	int			row0 = (blockIdx.x * WARPS + (threadIdx.x >> 5)) * R;
	float		acc[R];

	stage_x_t<32 * WARPS>(x, k, xt, gsum);
#pragma unroll
	for (int r = 0; r < R; r++)
		acc[r] = 0.0f;
	if (row0 >= n)
		return;
	for (int it = 0; it < iters; it++)
	{
		int			g = it * 32 + lane;
		uint4		q[R];
		float		sc[R];
		const float *xl = xt + it * 1024 + lane;

		if (g >= groups)
			break;
#pragma unroll
		for (int r = 0; r < R; r++)
		{
			int			row = min(row0 + r, n - 1);

			q[r] = __ldcs(&w[(size_t) row * groups + g]);
			sc[r] = __bfloat162float(s[(size_t) row * groups + g]);
		}
#pragma unroll
		for (int r = 0; r < R; r++)
		{
			float		d = word_dot_t(q[r].x, xl, 0) + word_dot_t(q[r].y, xl, 8) +
				word_dot_t(q[r].z, xl, 16) + word_dot_t(q[r].w, xl, 24);

			acc[r] = fmaf(sc[r], d - 8.0f * gsum[g], acc[r]);
		}
	}
#pragma unroll
	for (int r = 0; r < R; r++)
	{
		float		v = acc[r];

		for (int o = 16; o > 0; o >>= 1)
			v += __shfl_xor_sync(0xffffffffu, v, o);
		if (lane == 0 && row0 + r < n)
			y[row0 + r] = v;
	}
}

template <int R, int WARPS>
static void
launch_t(const uint4 *w, const __nv_bfloat16 *s, const float *x, float *y, int n, int k, cudaStream_t st)
{
	int			iters = (k / 32 + 31) / 32;
	size_t		smem = ((size_t) iters * 1024 + (size_t) (k / 32)) * sizeof(float);
	int			rows_per_block = R * WARPS;

	CHECK(cudaFuncSetAttribute(gemv_w4_t<R, WARPS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem));
	gemv_w4_t<R, WARPS><<<(n + rows_per_block - 1) / rows_per_block, 32 * WARPS, smem, st>>>(w, s, x, y, n, k);
}

typedef void (*launcher) (const uint4 *, const __nv_bfloat16 *, const float *, float *, int, int, cudaStream_t);

template <int R, int WARPS>
static void
launch(const uint4 *w, const __nv_bfloat16 *s, const float *x, float *y, int n, int k, cudaStream_t st)
{
	size_t		smem = (size_t) (k + k / 32) * sizeof(float);
	int			rows_per_block = R * WARPS;

	CHECK(cudaFuncSetAttribute(gemv_w4<R, WARPS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem));
	gemv_w4<R, WARPS><<<(n + rows_per_block - 1) / rows_per_block, 32 * WARPS, smem, st>>>(w, s, x, y, n, k);
}

int
main(void)
{
	const struct
	{
		const char *name;
		int			n,
					k;
	}			shapes[] = {
		{"qkv (sliding)", 8192, 3840}, {"o (sliding)", 3840, 4096}, {"gate_up", 30720, 3840},
		{"down", 3840, 15360}, {"q+k (full)", 8704, 3840}, {"o (full)", 3840, 8192},
	};
	const struct
	{
		const char *name;
		launcher	fn;
	}			variants[] = {
		{"R=4 warps=8", launch<4, 8>}, {"T R=2 w=8", launch_t<2, 8>}, {"T R=4 w=8", launch_t<4, 8>},
		{"T R=4 w=4", launch_t<4, 4>}, {"T R=8 w=4", launch_t<8, 4>},
	};
	const int	copies = 6;
	cudaStream_t st;
	cudaEvent_t e0,
				e1;
	double		step_us[8] = {0};

	CHECK(cudaStreamCreate(&st));
	CHECK(cudaEventCreate(&e0));
	CHECK(cudaEventCreate(&e1));
	printf("%-14s %-13s %10s %10s %8s %10s\n", "matrix", "variant", "us", "GB/s", "of 4.3", "rel.err");
	for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
	{
		int			n = shapes[si].n,
					k = shapes[si].k;
		size_t		wbytes = (size_t) n * k / 2;
		size_t		sbytes = (size_t) n * (k / 32) * 2;
		uint32_t   *h_w = (uint32_t *) malloc(wbytes);
		__nv_bfloat16 *h_s = (__nv_bfloat16 *) malloc(sbytes);
		float	   *h_x = (float *) malloc((size_t) k * 4);
		uint32_t   *d_w[copies];
		__nv_bfloat16 *d_s[copies];
		float	   *d_x,
				   *d_y,
				   *d_ref;
		float	   *h_y = (float *) malloc((size_t) n * 4),
				   *h_ref = (float *) malloc((size_t) n * 4);
		uint64_t	rs = 0x9e3779b97f4a7c15ull * (si + 1);

		for (size_t i = 0; i < wbytes / 4; i++)
		{
			rs ^= rs << 13;
			rs ^= rs >> 7;
			rs ^= rs << 17;
			h_w[i] = (uint32_t) rs;
		}
		for (size_t i = 0; i < sbytes / 2; i++)
			h_s[i] = __float2bfloat16(0.01f + 0.02f * (float) ((i * 2654435761u) % 1000) / 1000.0f);
		for (int i = 0; i < k; i++)
			h_x[i] = (float) ((i * 7919) % 2001 - 1000) / 1000.0f;
		for (int c = 0; c < copies; c++)
		{
			CHECK(cudaMalloc(&d_w[c], wbytes));
			CHECK(cudaMalloc(&d_s[c], sbytes));
			CHECK(cudaMemcpy(d_w[c], h_w, wbytes, cudaMemcpyHostToDevice));
			CHECK(cudaMemcpy(d_s[c], h_s, sbytes, cudaMemcpyHostToDevice));
		}
		CHECK(cudaMalloc(&d_x, (size_t) k * 4));
		CHECK(cudaMalloc(&d_y, (size_t) n * 4));
		CHECK(cudaMalloc(&d_ref, (size_t) n * 4));
		CHECK(cudaMemcpy(d_x, h_x, (size_t) k * 4, cudaMemcpyHostToDevice));
		gemv_ref<<<(n + 127) / 128, 128, 0, st>>>(d_w[0], d_s[0], d_x, d_ref, n, k);
		CHECK(cudaGetLastError());
		CHECK(cudaMemcpy(h_ref, d_ref, (size_t) n * 4, cudaMemcpyDeviceToHost));
		for (size_t vi = 0; vi < sizeof(variants) / sizeof(variants[0]); vi++)
		{
			double		num = 0,
						den = 0;
			float		ms;
			const int	reps = 60;

			CHECK(cudaMemset(d_y, 0xff, (size_t) n * 4));	/* poison: every row must be written */
			variants[vi].fn((const uint4 *) d_w[0], d_s[0], d_x, d_y, n, k, st);
			CHECK(cudaGetLastError());
			CHECK(cudaMemcpy(h_y, d_y, (size_t) n * 4, cudaMemcpyDeviceToHost));
			for (int i = 0; i < n; i++)
			{
				num += ((double) h_y[i] - h_ref[i]) * ((double) h_y[i] - h_ref[i]);
				den += (double) h_ref[i] * h_ref[i];
			}
			for (int i = 0; i < 10; i++)
				variants[vi].fn((const uint4 *) d_w[i % copies], d_s[i % copies], d_x, d_y, n, k, st);
			CHECK(cudaEventRecord(e0, st));
			for (int i = 0; i < reps; i++)
				variants[vi].fn((const uint4 *) d_w[i % copies], d_s[i % copies], d_x, d_y, n, k, st);
			CHECK(cudaEventRecord(e1, st));
			CHECK(cudaEventSynchronize(e1));
			CHECK(cudaEventElapsedTime(&ms, e0, e1));
			{
				double		us = 1000.0 * ms / reps;
				double		gbs = (double) (wbytes + sbytes) / (us * 1e-6) / 1e9;

				printf("%-14s %-13s %10.1f %10.0f %7.0f%% %10.2e\n", shapes[si].name, variants[vi].name, us, gbs,
					   100.0 * gbs / 4300.0, sqrt(num / den));
				/* per step: 40 sliding + 8 full layers */
				step_us[vi] += us * (si == 0 || si == 1 ? 40 : si == 4 || si == 5 ? 8 : 48);
			}
		}
		for (int c = 0; c < copies; c++)
		{
			CHECK(cudaFree(d_w[c]));
			CHECK(cudaFree(d_s[c]));
		}
		CHECK(cudaFree(d_x));
		CHECK(cudaFree(d_y));
		CHECK(cudaFree(d_ref));
		free(h_w);
		free(h_s);
		free(h_x);
		free(h_y);
		free(h_ref);
	}
	for (size_t vi = 0; vi < sizeof(variants) / sizeof(variants[0]); vi++)
		printf("variant %-13s: int4 matmuls of one 12B decode step %.0f us (current kernel: 4,073 us)\n",
			   variants[vi].name, step_us[vi]);
	return 0;
}
