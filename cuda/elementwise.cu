/*
 * elementwise.cu — embedding lookup (alone, or followed by given rows: the
 * draft model's input), GeGLU, logit-row gathering and soft-capping.
 *
 * Numerics as the CPU's elementwise.c: the embedding row is decoded
 * exactly and multiplied by the scale once; GELU is the tanh approximation
 * with an accurate tanhf; products and sums that the CPU rounds separately
 * are kept separate here (__fmul_rn / __fadd_rn are never contracted).
 */
#include <math.h>

#include "cuda_common.cuh"

/* ---- embedding ------------------------------------------------------------ */

/* Element (r, k) of a weight in its device layout (cuda_common.cuh). */
__device__ __forceinline__ float
weight_elem(int kind, const void *data, const uint16_t *scales, int64_t in, int64_t ktiles, int64_t r, int64_t k)
{
	int64_t		u = r >> 4;
	int			rr = (int) (r & 15);
	int			g = rr & 7,
				hi = rr >> 3;

	if (kind == G4C_W_F32)
		return ((const float *) data)[r * in + k];
	if (kind == G4C_W_BF16)
	{
		int64_t		ks = k >> 4;
		int			kk = (int) (k & 15);
		int			lane = g * 4 + ((kk & 7) >> 1);
		int			reg = hi + 2 * (kk >> 3);
		size_t		off = ((size_t) (u * ktiles * 4 + ks) * 32 + (size_t) lane) * 8 + (size_t) reg * 2 + (size_t) (kk & 1);

		return g4_bf16_to_f32(((const uint16_t *) data)[off]);
	}
	{
		int64_t		kt = k >> 6;
		int			G = (int) ((k >> 5) & 1);
		int			kin = (int) (k & 31);
		int			p = kin >> 3,
					t = (kin & 7) >> 1,
					b = kin & 1;
		int			lane = g * 4 + t;
		size_t		tile = (size_t) (u * ktiles + kt);
		uint32_t	word = ((const uint32_t *) data)[(tile * 32 + (size_t) lane) * 4 + (size_t) (hi * 2 + G)];
		int			code = (int) ((word >> (4 * (p + 4 * b))) & 15u);
		float		s = g4_bf16_to_f32(scales[(tile * 16 + (size_t) rr) * 2 + (size_t) G]);

		return (float) (code - 8) * s;
	}
}

__global__ void
embed_kernel(int kind, const void *data, const uint16_t *scales, int64_t out_rows, int64_t in, int64_t ktiles,
			 const int32_t *token, float scale, float *out)
{
	int			t = blockIdx.x;
	int64_t		k = (int64_t) blockIdx.y * blockDim.x + threadIdx.x;
	int32_t		tok;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	tok = token[t];
	if (tok < 0 || tok >= out_rows || k >= in)
		return;					/* supplied by the caller */
	out[(size_t) t * (size_t) in + (size_t) k] = __fmul_rn(weight_elem(kind, data, scales, in, ktiles, tok, k), scale);
}

int
g4c_embed(g4_backend *be, const g4_weight *w, float scale, float *out)
{
	g4_cuda    *c = g4c_of(be);
	dim3		grid(c->n_tokens, (unsigned) ((w->in + 255) / 256));

	if (c->n_tokens == 0)
		return G4_OK;
	return g4c_launch(c, "embed", embed_kernel, grid, dim3(256), 0, w->kind, (const void *) w->data,
					  (const uint16_t *) w->scales, w->out, w->in, w->ktiles, (const int32_t *) c->d_token, scale, out);
}

/* Rows [table[ids[t]] * scale, h[t]] (zeros for G4_SAMPLE_NAN):
 * blockIdx.y covers both parts. */
__global__ void
embed_concat_kernel(int kind, const void *data, const uint16_t *scales, int64_t out_rows, int64_t in, int64_t ktiles,
					const int32_t *ids, float scale, const float *h, int h_dim, float *out)
{
	int			t = blockIdx.x;
	int64_t		k = (int64_t) blockIdx.y * blockDim.x + threadIdx.x;
	float	   *dst = out + (size_t) t * (size_t) (in + h_dim);
	int32_t		tok;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	if (k >= in + h_dim)
		return;
	if (k >= in)
	{
		dst[k] = h[(size_t) t * (size_t) h_dim + (size_t) (k - in)];
		return;
	}
	tok = ids[t];
	/* valid by contract, or G4_SAMPLE_NAN: zeros (a row after a NaN) */
	dst[k] = tok >= 0 && tok < out_rows ? __fmul_rn(weight_elem(kind, data, scales, in, ktiles, tok, k), scale)
		: 0.0f;
}

int
g4c_embed_concat(g4_backend *be, const g4_weight *w, float scale, const int32_t *ids, const float *h, int h_dim,
				 int n, float *out)
{
	g4_cuda    *c = g4c_of(be);
	dim3		grid(n, (unsigned) ((w->in + h_dim + 255) / 256));

	if (n <= 0)
		return G4_OK;
	return g4c_launch(c, "embed_concat", embed_concat_kernel, grid, dim3(256), 0, w->kind, (const void *) w->data,
					  (const uint16_t *) w->scales, w->out, w->in, w->ktiles, ids, scale, h, h_dim, out);
}

/* ---- GeGLU ---------------------------------------------------------------- */

/* outb: out's bf16 copy, or NULL (g4c_act_bf16_offer) */
__global__ void
geglu_kernel(const float *gu, int n, int ff, float *out, uint16_t *outb)
{
	size_t		i = (size_t) blockIdx.x * blockDim.x + threadIdx.x;
	size_t		total = (size_t) n * (size_t) ff;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	for (; i < total; i += (size_t) gridDim.x * blockDim.x)
	{
		size_t		t = i / (size_t) ff;
		size_t		j = i - t * (size_t) ff;
		const float *row = gu + t * 2 * (size_t) ff;
		float		v = __fmul_rn(g4c_gelu_tanh(row[j]), row[j + (size_t) ff]);

		out[i] = v;
		if (outb)
			outb[i] = g4_f32_to_bf16(v);
	}
}

/* The same from a bf16 product (cuBLASLt's, matmul_lt.cu), eight elements
 * of a row per thread: 16-byte loads of gate and up, two float4 stores and
 * one of the copy. */
__global__ void
geglu_of_bf16_kernel(const uint16_t *gu, int n, int ff, float *out, uint16_t *outb)
{
	size_t		groups = (size_t) n * (size_t) (ff / 8);

	g4c_pdl_trigger();
	g4c_pdl_wait();
	for (size_t i = (size_t) blockIdx.x * blockDim.x + threadIdx.x; i < groups; i += (size_t) gridDim.x * blockDim.x)
	{
		size_t		t = i / (size_t) (ff / 8);
		size_t		j = (i - t * (size_t) (ff / 8)) * 8;
		const uint16_t *row = gu + t * 2 * (size_t) ff;
		uint4		g = *reinterpret_cast<const uint4 *>(row + j),
					u = *reinterpret_cast<const uint4 *>(row + (size_t) ff + j);
		uint32_t	gw[4] = {g.x, g.y, g.z, g.w},
					uw[4] = {u.x, u.y, u.z, u.w},
					bw[4];
		float		v[8];

#pragma unroll
		for (int e = 0; e < 8; e++)
		{
			float		ge = g4_bf16_to_f32((uint16_t) (gw[e / 2] >> (16 * (e & 1))));
			float		ue = g4_bf16_to_f32((uint16_t) (uw[e / 2] >> (16 * (e & 1))));

			v[e] = __fmul_rn(g4c_gelu_tanh(ge), ue);
		}
		*reinterpret_cast<float4 *>(out + t * (size_t) ff + j) = make_float4(v[0], v[1], v[2], v[3]);
		*reinterpret_cast<float4 *>(out + t * (size_t) ff + j + 4) = make_float4(v[4], v[5], v[6], v[7]);
		if (outb)
		{
#pragma unroll
			for (int e = 0; e < 4; e++)
				bw[e] = (uint32_t) g4_f32_to_bf16(v[2 * e]) | ((uint32_t) g4_f32_to_bf16(v[2 * e + 1]) << 16);
			*reinterpret_cast<uint4 *>(outb + t * (size_t) ff + j) = make_uint4(bw[0], bw[1], bw[2], bw[3]);
		}
	}
}

static unsigned
grid_for(const g4_cuda *c, size_t total, int threads)
{
	size_t		blocks = (total + (size_t) threads - 1) / (size_t) threads;
	size_t		cap = (size_t) c->sm_count * 16;

	return (unsigned) (blocks < cap ? (blocks > 0 ? blocks : 1) : cap);
}

int
g4c_geglu(g4_backend *be, const float *gu, int n, int ff, float *out)
{
	g4_cuda    *c = g4c_of(be);

	if (n <= 0)
		return G4_OK;
	return g4c_launch(c, "geglu", geglu_kernel, dim3(grid_for(c, (size_t) n * (size_t) ff, 256)), dim3(256), 0, gu, n,
					  ff, out, g4c_act_bf16_offer(c, out, n, ff));
}

int
g4c_geglu_of_bf16(g4_cuda *c, const uint16_t *gu, int n, int ff, float *out, uint16_t *outb)
{
	if (n <= 0)
		return G4_OK;
	if (ff % 8 != 0)
		return G4_ERR_UNSUPPORTED;
	return g4c_launch(c, "geglu (bf16 product)", geglu_of_bf16_kernel,
					  dim3(grid_for(c, (size_t) n * (size_t) (ff / 8), 256)), dim3(256), 0, gu, n, ff, out, outb);
}

/* ---- logit rows and soft-cap ---------------------------------------------------- */

__global__ void
gather_rows_kernel(const float *x, int dim, const int32_t *rows, float *out)
{
	const float *src;
	float	   *dst = out + (size_t) blockIdx.x * (size_t) dim;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	src = x + (size_t) rows[blockIdx.x] * (size_t) dim;
	for (int i = threadIdx.x; i < dim; i += blockDim.x)
		dst[i] = src[i];
}

int
g4c_gather_logit_rows(g4_backend *be, const float *x, int dim, float *out)
{
	g4_cuda    *c = g4c_of(be);

	if (c->n_logits == 0)
		return G4_OK;
	return g4c_launch(c, "gather_logit_rows", gather_rows_kernel, dim3(c->n_logits), dim3(256), 0, x, dim,
					  (const int32_t *) c->d_logit_rows, out);
}

__global__ void
softcap_kernel(float *x, size_t count, float cap)
{
	size_t		i = (size_t) blockIdx.x * blockDim.x + threadIdx.x;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	for (; i < count; i += (size_t) gridDim.x * blockDim.x)
		x[i] = __fmul_rn(tanhf(__fdiv_rn(x[i], cap)), cap);
}

int
g4c_softcap(g4_backend *be, float *x, size_t count, float cap)
{
	g4_cuda    *c = g4c_of(be);

	if (count == 0)
		return G4_OK;
	return g4c_launch(c, "softcap", softcap_kernel, dim3(grid_for(c, count, 256)), dim3(256), 0, x, count, cap);
}
