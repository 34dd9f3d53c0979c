/*
 * attention_gemm.cu — prefill attention of k_eq_v layers as two cuBLASLt
 * products around a softmax kernel.
 *
 * Full layers share one K/V head among all query heads (Gemma 4 12B: 16
 * heads of 512 over one KV head), so a prefill run's queries against its
 * keys are one large product, which cuBLASLt's warpgroup kernels run near
 * the tensor cores' rate where the tc kernel (attention.cu), bound by its
 * shared memory, reaches ~100 TFLOP/s (RESULTS.md, runs 106-).  For each
 * prefill run (backend_cuda.cu, keqv_tile_runs), in slices of its tokens:
 *
 *   K, V    RoPE(v ⊙ k_norm) and v as f16 rows [KV head][key][hd], made
 *           once per layer from the pool (attn_keqv_rows_kernel: the tc
 *           kernel's own decoding, tc_store_block, into plain rows)
 *   Q       the slice's queries as f16 rows [KV head][token · gq][hd]
 *   S = Q·Kᵀ    float32 scores [KV head][row][keys of the slice]
 *   P       exp(scale · s − max) over each row's keys [lo, hi) as f16,
 *           written over the first half of its own row of S; Σp in float32
 *   O = P·V     float32; out = O / Σp
 *
 * The numerics are the tc kernel's (f16 q, k, v and P; float32 scores, sums
 * and outputs), except that a row's maximum is its final one, so no partial
 * output is rescaled.  A slice's scores take at most the scores budget
 * (ATTN_GEMM_SCORES_BYTES): its tokens are as many as that allows at the
 * run's longest key range, and its keys those up to its last token's.
 */
#include <stdlib.h>
#include <string.h>

#include "attention.cuh"
#include "util.h"

/* Device memory for one slice's scores: 2k-token chunks take one slice
 * (16 heads x 2,048 x 2,048 floats), a 16k chunk at 32k of context slices
 * of 128 tokens.  G4_ATTN_GEMM_SCORES (bytes; tests and benchmarks) sets
 * another, read at every call. */
#define ATTN_GEMM_SCORES_BYTES ((size_t) 256 << 20)

/* The key and value rows of a step's runs, at most: 256k keys at hd 512
 * (a step's runs beyond it go to the tc kernel, which rebuilds every pool
 * block it reads). */
#define ATTN_GEMM_ROWS_MAX_BYTES ((size_t) 512 << 20)

#define SOFTMAX_THREADS 512

/* ---- K and V rows ------------------------------------------------------------------ */

/*
 * One block per (16-key tile, KV head) of the step's runs: tile i's keys
 * are rows 16i.. of K[g] and V[g]
 * ([n_kv][rows][HD] f16 each, rows = 16 · the grid), keys past the run's
 * zero.  Blocks past the last run's tiles do nothing.
 */
template <int HD, int DT>
__global__ void __launch_bounds__(128)
attn_keqv_rows_kernel(attn_args a, const int32_t *runs, int n_runs, int rows, uint16_t *kimg, uint16_t *vimg)
{
	int			tile = blockIdx.x;
	int			g = blockIdx.y;
	int			r = 0;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	while (r < n_runs && tile >= runs[G4C_RUN_INTS * r + 1] + runs[G4C_RUN_INTS * r + 2])
		r++;
	if (r < n_runs)
	{
		const int32_t *run = runs + G4C_RUN_INTS * r;
		int			b = tile - run[1];
		size_t		off = ((size_t) g * (size_t) rows + 16 * (size_t) tile) * HD;
		tc_raw<HD, DT, true, 1> raw;

		tc_load_raw<HD, DT, true, 1>(a, run[0], g, b, raw);
		tc_store_block<HD, DT, true, 1, true>(a, b, 0, run[3], raw, reinterpret_cast<unsigned char *>(kimg + off),
											   reinterpret_cast<unsigned char *>(vimg + off), a.knorm, a.inv_freq);
		if (!raw.ok && threadIdx.x == 0)
			atomicOr(a.status, G4C_STATUS_KV_MISSING);
	}
}

typedef void (*attn_rows_fn) (attn_args, const int32_t *, int, int, uint16_t *, uint16_t *);

static attn_rows_fn
rows_kernel(int hd, int dtype)
{
	if (hd != 512)
		return NULL;
	switch (dtype)
	{
		case G4_KV_F32:
			return attn_keqv_rows_kernel<512, G4_KV_F32>;
		case G4_KV_BF16:
			return attn_keqv_rows_kernel<512, G4_KV_BF16>;
		default:
			return attn_keqv_rows_kernel<512, G4_KV_TURBOQUANT_K8V4>;
	}
}

/* ---- a slice's queries, softmax and output -------------------------------------------- */

/* Element offset of head-row gi = g · rows + i of a slice (row i < rows =
 * tokens · gq of KV head g: token t0 + i / gq, query head g · gq + i % gq)
 * in a [token][stride] array of heads of hd. */
__device__ __forceinline__ size_t
slice_row_offset(const attn_args &a, int t0, int rows, size_t gi, int stride)
{
	int			i = (int) (gi % (size_t) rows),
				g = (int) (gi / (size_t) rows);

	return (size_t) (t0 + i / a.gq) * (size_t) stride + (size_t) (g * a.gq + i % a.gq) * (size_t) a.hd;
}

/* The slice's queries as f16 rows qh[g][i][hd]: one thread per 8 dims. */
__global__ void
attn_gemm_queries_kernel(attn_args a, int t0, int rows, uint16_t *qh)
{
	int			per_row = a.hd / 8;
	size_t		total = (size_t) a.n_kv * (size_t) rows * (size_t) per_row;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	for (size_t x = (size_t) blockIdx.x * blockDim.x + threadIdx.x; x < total; x += (size_t) gridDim.x * blockDim.x)
	{
		int			d = (int) (x % (size_t) per_row) * 8;
		size_t		gi = x / (size_t) per_row;
		const float *src = a.q + slice_row_offset(a, t0, rows, gi, a.q_stride) + d;
		float2		v[4];

#pragma unroll
		for (int k = 0; k < 4; k++)
			v[k] = reinterpret_cast<const float2 *>(src)[k];
		*reinterpret_cast<uint4 *>(qh + gi * (size_t) a.hd + d) =
			make_uint4(g4c_pack_f16(v[0].x, v[0].y), g4c_pack_f16(v[1].x, v[1].y), g4c_pack_f16(v[2].x, v[2].y),
					   g4c_pack_f16(v[3].x, v[3].y));
	}
}

/* Four scores from key k (a multiple of 4) times the scale, -inf outside
 * [lo, hi) and past the row. */
__device__ __forceinline__ float4
softmax_scores(const attn_args &a, const float *row, int k, int ld, int lo, int hi)
{
	float4		x = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);

	if (k < ld)
	{
		x = *reinterpret_cast<const float4 *>(row + k);
		x.x = k >= lo && k < hi ? x.x * a.scale : -INFINITY;
		x.y = k + 1 >= lo && k + 1 < hi ? x.y * a.scale : -INFINITY;
		x.z = k + 2 >= lo && k + 2 < hi ? x.z * a.scale : -INFINITY;
		x.w = k + 3 >= lo && k + 3 < hi ? x.w * a.scale : -INFINITY;
	}
	return x;
}

/*
 * One block per row of S (blockIdx.x the row, blockIdx.y the KV head): the
 * scores of keys outside the token's [lo, hi) are -inf, P = exp(s - max)
 * as f16 over the first half of the row's own bytes (halves [0, ld)), Σp
 * into rowsum.  The row is read in chunks of SOFTMAX_THREADS · 4E floats,
 * the first kept in registers between the two passes; a chunk's P covers
 * floats of the chunks before it (or its own, for the first), so every
 * thread's reads of those are done (the barrier) before it is written.
 */
template <int E>
__global__ void __launch_bounds__(SOFTMAX_THREADS)
attn_gemm_softmax_kernel(attn_args a, int t0, int rows, float *S, int ld, float *rowsum)
{
	constexpr int CH = SOFTMAX_THREADS * 4 * E;
	__shared__ float red[32];
	int			i = blockIdx.x,
				g = blockIdx.y;
	int			t = t0 + i / a.gq;
	float	   *row = S + ((size_t) g * (size_t) rows + (size_t) i) * (size_t) ld;
	uint16_t   *prow = reinterpret_cast<uint16_t *>(row);
	int			lo,
				hi;
	float4		v[E];			/* the first chunk's scores, then a chunk's P */
	float		m = -INFINITY,
				sum = 0.0f;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	lo = a.lo[t];
	hi = min(a.hi[t], ld);
	for (int c0 = 0; c0 < ld; c0 += CH)
#pragma unroll
		for (int e = 0; e < E; e++)
		{
			float4		x = softmax_scores(a, row, c0 + (e * SOFTMAX_THREADS + (int) threadIdx.x) * 4, ld, lo, hi);

			if (c0 == 0)
				v[e] = x;
			m = fmaxf(m, fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w)));
		}
	m = g4c_block_max(m, red);
	for (int c0 = 0; c0 < ld; c0 += CH)
	{
#pragma unroll
		for (int e = 0; e < E; e++)
		{
			float4		x = c0 == 0 ? v[e] : softmax_scores(a, row, c0 + (e * SOFTMAX_THREADS + (int) threadIdx.x) * 4,
														  ld, lo, hi);

			v[e].x = x.x == -INFINITY ? 0.0f : __expf(x.x - m);
			v[e].y = x.y == -INFINITY ? 0.0f : __expf(x.y - m);
			v[e].z = x.z == -INFINITY ? 0.0f : __expf(x.z - m);
			v[e].w = x.w == -INFINITY ? 0.0f : __expf(x.w - m);
			sum += (v[e].x + v[e].y) + (v[e].z + v[e].w);
		}
		__syncthreads();
#pragma unroll
		for (int e = 0; e < E; e++)
		{
			int			k = c0 + (e * SOFTMAX_THREADS + (int) threadIdx.x) * 4;

			if (k < ld)
				*reinterpret_cast<uint2 *>(prow + k) =
					make_uint2(g4c_pack_f16(v[e].x, v[e].y), g4c_pack_f16(v[e].z, v[e].w));
		}
	}
	sum = g4c_block_sum(sum, red);
	if (threadIdx.x == 0)
		rowsum[(size_t) g * (size_t) rows + (size_t) i] = sum;
}

typedef void (*attn_softmax_fn) (attn_args, int, int, float *, int, float *);

/* The kernel whose registers hold a row of ld floats, or the largest one,
 * which reads longer rows twice (contexts past 32k); `held` (keys, 2,048 to
 * 32,768) caps the choice, so that tests take the two-read path on short
 * rows too. */
static attn_softmax_fn
softmax_kernel(int ld, int held)
{
	if (ld <= SOFTMAX_THREADS * 4 || held <= SOFTMAX_THREADS * 4)
		return attn_gemm_softmax_kernel<1>;
	if (ld <= SOFTMAX_THREADS * 8 || held <= SOFTMAX_THREADS * 8)
		return attn_gemm_softmax_kernel<2>;
	if (ld <= SOFTMAX_THREADS * 16 || held <= SOFTMAX_THREADS * 16)
		return attn_gemm_softmax_kernel<4>;
	if (ld <= SOFTMAX_THREADS * 32 || held <= SOFTMAX_THREADS * 32)
		return attn_gemm_softmax_kernel<8>;
	return attn_gemm_softmax_kernel<16>;
}

/* out = O / Σp for the slice's rows: one thread per 4 dims. */
__global__ void
attn_gemm_out_kernel(attn_args a, int t0, int rows, const float *O, const float *rowsum)
{
	int			per_row = a.hd / 4;
	size_t		total = (size_t) a.n_kv * (size_t) rows * (size_t) per_row;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	for (size_t x = (size_t) blockIdx.x * blockDim.x + threadIdx.x; x < total; x += (size_t) gridDim.x * blockDim.x)
	{
		int			d = (int) (x % (size_t) per_row) * 4;
		size_t		gi = x / (size_t) per_row;
		float		l = rowsum[gi];
		float		inv = l > 0.0f ? 1.0f / l : 0.0f;
		float4		o = *reinterpret_cast<const float4 *>(O + gi * (size_t) a.hd + d);

		*reinterpret_cast<float4 *>(a.out + slice_row_offset(a, t0, rows, gi, a.out_stride) + d) =
			make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
	}
}

/* ---- dispatch ----------------------------------------------------------------------- */

/* Bytes of the K and V rows of the step's runs (c->keqv_rows): K then V,
 * [n_kv][16 · grid][hd] f16 each; 2 KB per key at the 12B's hd 512. */
static size_t
rows_bytes(const g4_cuda *c, const attn_args *a)
{
	return 2 * (size_t) a->n_kv * 16 * (size_t) c->keqv_tile_grid * (size_t) a->hd * 2;
}

int
g4c_attention_gemm_serves(const g4_cuda *c, const attn_args *a)
{
	static const char *env;
	static int	env_read;

	if (!env_read)
	{
		/* G4_ATTN_GEMM=off: the tc kernel serves the runs (benchmarks) */
		env = getenv("G4_ATTN_GEMM");
		env_read = 1;
	}
	return a->k_eq_v && c->n_tile_runs > 0 && rows_kernel(a->hd, a->dtype) && rows_bytes(c, a) <= ATTN_GEMM_ROWS_MAX_BYTES &&
		!(env && strcmp(env, "off") == 0);
}

/* Keys rounded up to whole 16-key blocks. */
static int
whole_blocks(int keys)
{
	return (keys + G4_KV_BLOCK_TOKENS - 1) / G4_KV_BLOCK_TOKENS * G4_KV_BLOCK_TOKENS;
}

/* Whole blocks covering the keys of the tokens [t0, t0 + n) (host copies
 * of their ranges). */
static int
slice_keys(const int32_t *hi, int t0, int n)
{
	int			keys = 0;

	for (int t = t0; t < t0 + n; t++)
		keys = G4_MAX(keys, hi[t]);
	return whole_blocks(keys);
}

/* A run's tokens per slice: as many as the scores budget holds at the
 * run's longest key range (keys). */
static int
slice_tokens(int tokens, int keys, int heads, size_t budget)
{
	size_t		per_token = (size_t) heads * (size_t) G4_MAX(keys, 1) * 4;

	return (int) G4_MAX((size_t) 1, G4_MIN((size_t) tokens, budget / per_token));
}

/* A slice's scratch: the scores S [n_kv][rows][keys] (P over them), the
 * queries qh [n_kv][rows][hd] f16, the output O [n_kv][rows][hd] and the
 * rows' sums, each part 256-byte aligned.  Fills the pointers when base is
 * given; returns the bytes. */
typedef struct
{
	float	   *S;
	uint16_t   *qh;
	float	   *O;
	float	   *rowsum;
} slice_scratch;

static size_t
slice_layout(unsigned char *base, int n_kv, int rows, int keys, int hd, slice_scratch *sl)
{
	size_t		head_rows = (size_t) n_kv * (size_t) rows;
	size_t		parts[4] = {head_rows * (size_t) keys * 4, head_rows * (size_t) hd * 2, head_rows * (size_t) hd * 4,
	head_rows * 4};
	void	  **at[4] = {(void **) &sl->S, (void **) &sl->qh, (void **) &sl->O, (void **) &sl->rowsum};
	size_t		off = 0;

	for (int k = 0; k < 4; k++)
	{
		if (base)
			*at[k] = base + off;
		off += (parts[k] + 255) / 256 * 256;
	}
	return off;
}

/* The attention of every token of the step's k_eq_v prefill runs into
 * a->out (the caller checked g4c_attention_gemm_serves). */
int
g4c_attention_gemm(g4_cuda *c, const attn_args *a)
{
	const int32_t *runs = c->h_meta + (c->d_tile_runs - c->d_meta);
	const int32_t *hi = c->h_meta + (c->d_hi[G4_KVG_FULL] - c->d_meta);
	const char *scores_env = getenv("G4_ATTN_GEMM_SCORES");
	const char *softmax_env = getenv("G4_ATTN_GEMM_SOFTMAX");
	size_t		budget = scores_env ? (size_t) strtoull(scores_env, NULL, 10) : ATTN_GEMM_SCORES_BYTES;
	int			held = softmax_env ? atoi(softmax_env) : 16 * SOFTMAX_THREADS * 4;
	int			heads = a->n_kv * a->gq;
	int			rows_total = 16 * c->keqv_tile_grid;
	size_t		need = 0;
	uint16_t   *kimg,
			   *vimg;
	unsigned char *scratch;
	int			r;

	/* the scratch of the largest slice (a run's keys: its record's) */
	for (r = 0; r < c->n_tile_runs; r++)
	{
		const int32_t *run = runs + G4C_RUN_INTS * r;
		int			keys = whole_blocks(run[3]);
		slice_scratch unused;

		need = G4_MAX(need, slice_layout(NULL, a->n_kv, slice_tokens(run[5], keys, heads, budget) * a->gq, keys,
										 a->hd, &unused));
	}
	kimg = (uint16_t *) g4c_grow(c, &c->keqv_rows, &c->keqv_rows_bytes, rows_bytes(c, a), "k_eq_v key and value rows");
	scratch = (unsigned char *) g4c_scratch(c, need);
	if (!kimg || !scratch)
		return c->err_code;
	vimg = kimg + (size_t) a->n_kv * (size_t) rows_total * (size_t) a->hd;
	if (g4c_launch(c, "attention (k_eq_v rows)", rows_kernel(a->hd, a->dtype),
				   dim3((unsigned) c->keqv_tile_grid, (unsigned) a->n_kv), dim3(128), 0, *a,
				   (const int32_t *) c->d_tile_runs, c->n_tile_runs, rows_total, kimg, vimg) != G4_OK)
		return c->err_code;
	for (r = 0; r < c->n_tile_runs; r++)
	{
		const int32_t *run = runs + G4C_RUN_INTS * r;
		int			ts = slice_tokens(run[5], whole_blocks(run[3]), heads, budget);
		size_t		first_row = 16 * (size_t) run[1];

		for (int t0 = run[4]; t0 < run[4] + run[5]; t0 += ts)
		{
			int			n = G4_MIN(ts, run[4] + run[5] - t0);
			int			rows = n * a->gq;
			int			keys = slice_keys(hi, t0, n);
			slice_scratch sl;
			g4c_lt_product p;

			if (keys <= 0)
				continue;
			slice_layout(scratch, a->n_kv, rows, keys, a->hd, &sl);
			if (g4c_launch(c, "attention (gemm queries)", attn_gemm_queries_kernel,
						   g4c_stride_grid(c, (size_t) a->n_kv * rows * (a->hd / 8), 8), dim3(256), 0, *a,
						   t0, rows, sl.qh) != G4_OK)
				return c->err_code;
			/* Sᵀ (keys x rows) = K (stored hd x keys, transposed) · Qᵀ */
			memset(&p, 0, sizeof(p));
			p.ab_f16 = 1;
			p.transa = 1;
			p.m = keys;
			p.n = rows;
			p.k = a->hd;
			p.lda = a->hd;
			p.ldb = a->hd;
			p.ldd = keys;
			p.batch = a->n_kv;
			p.sa = (int64_t) rows_total * a->hd;
			p.sb = (int64_t) rows * a->hd;
			p.sd = (int64_t) rows * keys;
			if (g4c_lt_gemm(c, &p, kimg + first_row * a->hd, sl.qh, sl.S) != G4_OK)
				return c->err_code;
			if (g4c_launch(c, "attention (gemm softmax)", softmax_kernel(keys, held),
						   dim3((unsigned) rows, (unsigned) a->n_kv), dim3(SOFTMAX_THREADS), 0, *a, t0, rows, sl.S, keys,
						   sl.rowsum) != G4_OK)
				return c->err_code;
			/* Oᵀ (hd x rows) = V (stored hd x keys) · Pᵀ (P's rows 2·keys halves apart) */
			memset(&p, 0, sizeof(p));
			p.ab_f16 = 1;
			p.m = a->hd;
			p.n = rows;
			p.k = keys;
			p.lda = a->hd;
			p.ldb = 2 * keys;
			p.ldd = a->hd;
			p.batch = a->n_kv;
			p.sa = (int64_t) rows_total * a->hd;
			p.sb = (int64_t) rows * keys * 2;
			p.sd = (int64_t) rows * a->hd;
			if (g4c_lt_gemm(c, &p, vimg + first_row * a->hd, sl.S, sl.O) != G4_OK)
				return c->err_code;
			if (g4c_launch(c, "attention (gemm output)", attn_gemm_out_kernel,
						   g4c_stride_grid(c, (size_t) a->n_kv * rows * (a->hd / 4), 8), dim3(256), 0, *a,
						   t0, rows, sl.O, sl.rowsum) != G4_OK)
				return c->err_code;
		}
	}
	return G4_OK;
}
