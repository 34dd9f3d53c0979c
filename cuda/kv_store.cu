/*
 * kv_store.cu — writing the step's K and V rows into the paged pool, in
 * every pool dtype, byte for byte as kv_codec.c encodes them.
 *
 * One block of 128 threads per (token, KV head).  turboquant_k8v4 rotates
 * with kvformat.h's Hadamard butterflies (a stage's butterflies in parallel,
 * a barrier between stages) and quantises with kvformat.h's scale and code
 * rules, so the bytes equal the CPU's.
 */
#include <math.h>

#include "cuda_common.cuh"

#define STORE_THREADS 128
#define STORE_MAX_HD 512

/* In place on x[0..n) in shared memory; all threads of the block call it. */
__device__ void
hadamard_smem(float *x, int n)
{
	for (int len = 1; len < n; len <<= 1)
	{
		for (int q = threadIdx.x; q < n / 2; q += blockDim.x)
			g4_hadamard_butterfly(x, len, q);
		__syncthreads();
	}
	{
		float		norm = g4_hadamard_norm(n);

		for (int i = threadIdx.x; i < n; i += blockDim.x)
			x[i] = __fmul_rn(x[i], norm);
	}
	__syncthreads();
}

/* max |x[i]| over [i0, i0 + len), every thread gets it. */
__device__ float
block_amax(const float *x, int i0, int len, float *red)
{
	float		m = 0.0f;
	int			lane = threadIdx.x & 31;
	int			w = threadIdx.x >> 5;

	for (int i = threadIdx.x; i < len; i += blockDim.x)
		m = fmaxf(m, fabsf(x[i0 + i]));
	m = g4c_warp_max(m);
	__syncthreads();
	if (lane == 0)
		red[w] = m;
	__syncthreads();
	m = lane < (int) (blockDim.x >> 5) ? red[lane] : 0.0f;
	return g4c_warp_max(m);
}

struct store_args
{
	int			dtype;
	int			k_eq_v;
	int			hd;
	int			n_kv_heads;
	uint8_t    *layer_base;		/* base + layer * layer_stride */
	size_t		layer_block_bytes;
	size_t		head_block_bytes;
	const int32_t *table;		/* [max_seqs][max_blocks] */
	int			max_blocks;
	const float *k;
	int			k_stride;
	const float *v;
	int			v_stride;
	const int32_t *pos;
	const int32_t *slot;
	unsigned   *status;
};

__global__ void __launch_bounds__(STORE_THREADS)
kv_store_kernel(store_args a)
{
	__shared__ float buf[STORE_MAX_HD];
	__shared__ float red[32];
	int			t = blockIdx.x / a.n_kv_heads;
	int			g = blockIdx.x % a.n_kv_heads;
	int			hd = a.hd;
	const float *k = a.k ? a.k + (size_t) t * (size_t) a.k_stride + (size_t) g * (size_t) hd : NULL;
	const float *v = a.v + (size_t) t * (size_t) a.v_stride + (size_t) g * (size_t) hd;
	int			p,
				off;
	int32_t		blk;
	uint8_t    *hb;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	p = a.pos[t];
	off = p % G4_KV_BLOCK_TOKENS;
	blk = a.table[(size_t) a.slot[t] * (size_t) a.max_blocks + (size_t) (p / G4_KV_BLOCK_TOKENS)];
	if (blk < 0)
	{
		if (threadIdx.x == 0)
			atomicOr(a.status, G4C_STATUS_KV_MISSING);
		return;
	}
	hb = a.layer_base + (size_t) blk * a.layer_block_bytes + (size_t) g * a.head_block_bytes;
	if (a.dtype == G4_KV_F32)
	{
		float	   *kp = (float *) hb;

		for (int i = threadIdx.x; i < hd; i += blockDim.x)
		{
			if (a.k_eq_v)
				kp[(size_t) off * hd + i] = v[i];
			else
			{
				kp[(size_t) off * hd + i] = k[i];
				kp[(size_t) (G4_KV_BLOCK_TOKENS + off) * hd + i] = v[i];
			}
		}
		return;
	}
	if (a.dtype == G4_KV_BF16)
	{
		uint16_t   *kp = (uint16_t *) hb;

		for (int i = threadIdx.x; i < hd; i += blockDim.x)
		{
			if (a.k_eq_v)
				kp[(size_t) off * hd + i] = g4_f32_to_bf16(v[i]);
			else
			{
				kp[(size_t) off * hd + i] = g4_f32_to_bf16(k[i]);
				kp[(size_t) (G4_KV_BLOCK_TOKENS + off) * hd + i] = g4_f32_to_bf16(v[i]);
			}
		}
		return;
	}
	/* turboquant_k8v4: the key (or, for k_eq_v layers, the plain value) as
	 * int8 with one scale */
	for (int i = threadIdx.x; i < hd; i += blockDim.x)
		buf[i] = a.k_eq_v ? v[i] : k[i];
	__syncthreads();
	if (!a.k_eq_v)
		hadamard_smem(buf, hd);
	{
		float		inv;
		uint16_t	s16 = g4_kv_scale(block_amax(buf, 0, hd, red), G4_KV_K8_LEVELS, &inv);
		int8_t	   *kq = (int8_t *) hb + (size_t) off * hd;

		for (int i = threadIdx.x; i < hd; i += blockDim.x)
			kq[i] = (int8_t) g4_kv_k8_code(buf[i], inv);
		if (threadIdx.x == 0)
			*(uint16_t *) (hb + g4_kv_tq_kscale_off(hd) + 2 * (size_t) off) = s16;
	}
	if (a.k_eq_v)
		return;
	__syncthreads();
	for (int i = threadIdx.x; i < hd; i += blockDim.x)
		buf[i] = v[i];
	__syncthreads();
	hadamard_smem(buf, hd);
	{
		int			G = g4_kv_v4_group(hd);
		uint8_t    *vq = hb + g4_kv_tq_v_off(hd) + (size_t) off * (size_t) (hd / 2);
		uint16_t   *vs = (uint16_t *) (hb + g4_kv_tq_vscale_off(hd) + (size_t) off * (size_t) (hd / G) * 2);

		for (int gi = 0; gi < hd / G; gi++)
		{
			float		inv;
			uint16_t	s16 = g4_kv_scale(block_amax(buf, gi * G, G, red), G4_KV_V4_STEPS, &inv);

			for (int i = threadIdx.x; i < G / 2; i += blockDim.x)
			{
				int			e = gi * G + 2 * i;

				vq[e / 2] = (uint8_t) (g4_kv_v4_code(buf[e], inv) | (g4_kv_v4_code(buf[e + 1], inv) << 4));
			}
			if (threadIdx.x == 0)
				vs[gi] = s16;
		}
	}
}

int
g4c_kv_store(g4_backend *be, const g4_kv_layer *L, const float *k, int k_stride, const float *v, int v_stride, int n)
{
	g4_cuda    *c = g4c_of(be);
	const g4_kv_pool_desc *kv = &c->kv;
	store_args	a;

	if (!c->kv_configured || L->head_dim > STORE_MAX_HD || L->head_dim < 2)
		return G4_ERR_INTERNAL;
	if (kv->dtype == G4_KV_TURBOQUANT_K8V4 && (L->head_dim & (L->head_dim - 1)) != 0)
		return G4_ERR_UNSUPPORTED;
	if (n <= 0)
		return G4_OK;
	a.dtype = kv->dtype;
	a.k_eq_v = L->k_eq_v;
	a.hd = L->head_dim;
	a.n_kv_heads = L->n_kv_heads;
	a.layer_base = kv->base[L->group] + (size_t) L->index * kv->layer_stride[L->group];
	a.layer_block_bytes = kv->layer_block_bytes[L->group];
	a.head_block_bytes = g4_kv_head_block_bytes(kv->dtype, L->head_dim, L->k_eq_v);
	a.table = kv->block_tables[L->group];
	a.max_blocks = kv->max_blocks_per_seq;
	a.k = L->k_eq_v ? NULL : k;
	a.k_stride = k_stride;
	a.v = v;
	a.v_stride = v_stride;
	a.pos = c->d_pos;
	a.slot = c->d_slot;
	a.status = c->d_status;
	return g4c_launch(c, "kv_store", kv_store_kernel, dim3(n * L->n_kv_heads), dim3(STORE_THREADS), 0, a);
}
