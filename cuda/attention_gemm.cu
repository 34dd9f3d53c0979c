/*
 * attention_gemm.cu — prefill attention of k_eq_v layers as two cuBLASLt
 * products around a softmax kernel.
 *
 * Full layers share one K/V head among all query heads (Gemma 4 12B: 16
 * heads of 512 over one KV head), so a prefill run's queries against its
 * keys are one large product, which cuBLASLt's warpgroup kernels run near
 * the tensor cores' rate where the tc kernel (attention.cu), bound by its
 * shared memory, reaches ~100 TFLOP/s (RESULTS.md, runs 106-).  For each
 * prefill run (backend_cuda.cu, keqv_tile_runs), in slices of its tokens
 * (slice_plan), each over its keys in blocks:
 *
 *   K, V    RoPE(v ⊙ k_norm) and v as f16 rows [KV head][key][hd], made
 *           once per layer from the pool (attn_keqv_rows_kernel: the tc
 *           kernel's own decoding, tc_store_block, into plain rows)
 *   Q       the slice's queries as f16 rows [KV head][token · gq][hd]
 *   per key block:
 *     S = Q·Kᵀ    float32 scores [KV head][row][keys of the block]
 *     P       exp(scale · s − m) over each row's keys [lo, hi) as f16,
 *             written over the first half of its own row of S, with m the
 *             row's running maximum; where m moved, the row's O and Σp so
 *             far scaled down to it
 *     O (+)= P·V  float32
 *   out = O / Σp
 *
 * The numerics are the tc kernel's (f16 q, k, v and P; float32 scores, sums
 * and outputs, an output rescaled where a later block raises a row's
 * maximum).  A block's scores take at most the scores budget
 * (ATTN_GEMM_SCORES_BYTES).
 */
#include <stdlib.h>
#include <string.h>

#include "attention.cuh"
#include "util.h"

/* Device memory for one key block's scores: a 2k-token chunk takes one
 * slice in one block (16 heads x 2,048 x 2,048 floats), a 16k chunk at any
 * context slices of 512 tokens in blocks of 8,192 keys. */
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

/* Four scores from key k0 + k (k a multiple of 4, k0 the block's first
 * key) times the scale, -inf outside [lo, hi) and past the block's ld. */
__device__ __forceinline__ float4
softmax_scores(const attn_args &a, const float *row, int k, int ld, int k0, int lo, int hi)
{
	float4		x = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
	int			kp = k0 + k;

	if (k < ld)
	{
		x = *reinterpret_cast<const float4 *>(row + k);
		x.x = kp >= lo && kp < hi ? x.x * a.scale : -INFINITY;
		x.y = kp + 1 >= lo && kp + 1 < hi ? x.y * a.scale : -INFINITY;
		x.z = kp + 2 >= lo && kp + 2 < hi ? x.z * a.scale : -INFINITY;
		x.w = kp + 3 >= lo && kp + 3 < hi ? x.w * a.scale : -INFINITY;
	}
	return x;
}

/* A row's running softmax state over the key blocks done so far: the
 * maximum and Σp relative to it (rows [n_kv][rows]). */
typedef struct
{
	float	   *max;
	float	   *sum;
} softmax_state;

/*
 * One block per row of S (blockIdx.x the row, blockIdx.y the KV head), over
 * the key block [k0, k0 + ld): the scores of keys outside the token's [lo,
 * hi) are -inf; with the row's running maximum m raised to cover the
 * block's, P = exp(s - m) as f16 over the first half of the row's own bytes
 * (halves [0, ld)), Σp added to the running sum, and where the maximum
 * moved the row's output so far (the previous blocks' O = P·V) and sum
 * scaled by exp(m_old - m), so that the next product adds to them.  The
 * first block (first) starts the state; its product overwrites O.  The
 * row's scores stay in registers (ld <= SOFTMAX_THREADS · 4E) between the
 * maximum and the exponentials; P is written once every thread has read
 * its scores (the barriers of the block maximum, and one more).
 */
template <int E>
__global__ void __launch_bounds__(SOFTMAX_THREADS)
attn_gemm_softmax_kernel(attn_args a, int t0, int rows, float *S, int ld, int k0, int first, softmax_state st, float *O)
{
	__shared__ float red[32];
	int			i = blockIdx.x,
				g = blockIdx.y;
	int			t = t0 + i / a.gq;
	size_t		gi = (size_t) g * (size_t) rows + (size_t) i;
	float	   *row = S + gi * (size_t) ld;
	uint16_t   *prow = reinterpret_cast<uint16_t *>(row);
	float4		v[E];
	float		m_old = -INFINITY,
				m = -INFINITY,
				sum = 0.0f,
				corr;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	if (!first)
		m_old = st.max[gi];
#pragma unroll
	for (int e = 0; e < E; e++)
	{
		v[e] = softmax_scores(a, row, (e * SOFTMAX_THREADS + (int) threadIdx.x) * 4, ld, k0, a.lo[t], a.hi[t]);
		m = fmaxf(m, fmaxf(fmaxf(v[e].x, v[e].y), fmaxf(v[e].z, v[e].w)));
	}
	m = fmaxf(g4c_block_max(m, red), m_old);
	/* the factor of what came before: rows whose keys were all masked so
	 * far have O = 0 and Σp = 0, whatever it is */
	corr = m_old == -INFINITY ? 0.0f : __expf(m_old - m);
#pragma unroll
	for (int e = 0; e < E; e++)
	{
		v[e].x = v[e].x == -INFINITY ? 0.0f : __expf(v[e].x - m);
		v[e].y = v[e].y == -INFINITY ? 0.0f : __expf(v[e].y - m);
		v[e].z = v[e].z == -INFINITY ? 0.0f : __expf(v[e].z - m);
		v[e].w = v[e].w == -INFINITY ? 0.0f : __expf(v[e].w - m);
		sum += (v[e].x + v[e].y) + (v[e].z + v[e].w);
	}
	__syncthreads();
#pragma unroll
	for (int e = 0; e < E; e++)
	{
		int			k = (e * SOFTMAX_THREADS + (int) threadIdx.x) * 4;

		if (k < ld)
			*reinterpret_cast<uint2 *>(prow + k) =
				make_uint2(g4c_pack_f16(v[e].x, v[e].y), g4c_pack_f16(v[e].z, v[e].w));
	}
	if (!first && corr != 1.0f)
	{
		float4	   *o = reinterpret_cast<float4 *>(O + gi * (size_t) a.hd);

		for (int d = threadIdx.x; d < a.hd / 4; d += SOFTMAX_THREADS)
		{
			float4		x = o[d];

			o[d] = make_float4(x.x * corr, x.y * corr, x.z * corr, x.w * corr);
		}
	}
	sum = g4c_block_sum(sum, red);
	if (threadIdx.x == 0)
	{
		st.max[gi] = m;
		st.sum[gi] = first ? sum : st.sum[gi] * corr + sum;
	}
}

typedef void (*attn_softmax_fn) (attn_args, int, int, float *, int, int, int, softmax_state, float *);

/* Keys of one block at most: what the softmax holds in registers. */
#define KEY_BLOCK_MAX (SOFTMAX_THREADS * 4 * 16)

/* The kernel whose registers hold a block of ld keys. */
static attn_softmax_fn
softmax_kernel(int ld)
{
	if (ld <= SOFTMAX_THREADS * 4)
		return attn_gemm_softmax_kernel<1>;
	if (ld <= SOFTMAX_THREADS * 8)
		return attn_gemm_softmax_kernel<2>;
	if (ld <= SOFTMAX_THREADS * 16)
		return attn_gemm_softmax_kernel<4>;
	if (ld <= SOFTMAX_THREADS * 32)
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
grid_rows_bytes(const attn_args *a, size_t grid)
{
	return 2 * (size_t) a->n_kv * 16 * grid * (size_t) a->hd * 2;
}

static size_t
rows_bytes(const g4_cuda *c, const attn_args *a)
{
	return grid_rows_bytes(a, (size_t) c->keqv_tile_grid);
}

/* Whether the products could serve the step's runs, their rows' bound
 * aside. */
static int
gemm_applies(const g4_cuda *c, const attn_args *a)
{
	static const char *env;
	static int	env_read;

	if (!env_read)
	{
		/* G4_ATTN_GEMM=off: the tc kernel serves the runs (benchmarks) */
		env = getenv("G4_ATTN_GEMM");
		env_read = 1;
	}
	return a->k_eq_v && c->n_tile_runs > 0 && rows_kernel(a->hd, a->dtype) && !(env && strcmp(env, "off") == 0);
}

int
g4c_attention_gemm_serves(const g4_cuda *c, const attn_args *a)
{
	return gemm_applies(c, a) && rows_bytes(c, a) <= ATTN_GEMM_ROWS_MAX_BYTES;
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

/*
 * How a run of `tokens` tokens over at most `keys` keys is cut: slices of
 * *tokens (equal but the last), each over its keys in blocks of at most
 * *block_keys, so that one block's scores (heads · tokens · keys floats)
 * take at most the budget.  All the tokens where all their keys fit (a 2k
 * chunk: one slice, one block); else at least SLICE_ROWS_MIN rows (tokens
 * times heads), whatever the context: O = P·V is a product of head_dim ×
 * rows over the block's keys, which fills the GPU only with that many
 * rows (rows cut to fit all keys shrank as the context grew: 128 tokens of
 * 16 heads at 32k, RESULTS.md, runs 135-).  keys_cap (tests) bounds the
 * blocks further.
 */
#define SLICE_ROWS_MIN 8192

static void
slice_plan(int tokens, int keys, int heads, size_t budget, int keys_cap, int *slice_tokens, int *block_keys)
{
	size_t		all = budget / ((size_t) heads * (size_t) G4_MAX(keys, 1) * 4);
	int			ts = (int) G4_MIN((size_t) tokens, G4_MAX(all, (size_t) G4_DIV_UP(SLICE_ROWS_MIN, heads)));
	size_t		kb;

	ts = G4_DIV_UP(tokens, G4_DIV_UP(tokens, G4_MAX(ts, 1)));
	kb = budget / ((size_t) heads * (size_t) ts * 4) / G4_KV_BLOCK_TOKENS * G4_KV_BLOCK_TOKENS;
	kb = G4_MIN(kb, (size_t) G4_MIN(keys_cap, KEY_BLOCK_MAX));
	*slice_tokens = ts;
	*block_keys = (int) G4_MAX(kb, (size_t) G4_KV_BLOCK_TOKENS);
}

/* A slice's scratch: the scores S [n_kv][rows][block keys] (P over them),
 * the queries qh [n_kv][rows][hd] f16, the output O [n_kv][rows][hd] and
 * the rows' running maxima and sums, each part 256-byte aligned.  Fills
 * the pointers when base is given; returns the bytes. */
typedef struct
{
	float	   *S;
	uint16_t   *qh;
	float	   *O;
	softmax_state st;
} slice_scratch;

static size_t
slice_layout(unsigned char *base, int n_kv, int rows, int keys, int hd, slice_scratch *sl)
{
	size_t		head_rows = (size_t) n_kv * (size_t) rows;
	size_t		parts[5] = {head_rows * (size_t) keys * 4, head_rows * (size_t) hd * 2, head_rows * (size_t) hd * 4,
	head_rows * 4, head_rows * 4};
	void	  **at[5] = {(void **) &sl->S, (void **) &sl->qh, (void **) &sl->O, (void **) &sl->st.max,
	(void **) &sl->st.sum};
	size_t		off = 0;

	for (int k = 0; k < 5; k++)
	{
		if (base)
			*at[k] = base + off;
		off += (parts[k] + 255) / 256 * 256;
	}
	return off;
}

/* One slice: the tokens [t0, t0 + n) of a run whose keys start at row
 * first_row of kimg / vimg, over their keys in blocks of block_keys. */
static int
attention_slice(g4_cuda *c, const attn_args *a, int t0, int n, int keys, int block_keys, const uint16_t *kimg,
				const uint16_t *vimg, size_t first_row, int rows_total, unsigned char *scratch)
{
	int			rows = n * a->gq;
	slice_scratch sl;

	slice_layout(scratch, a->n_kv, rows, G4_MIN(block_keys, keys), a->hd, &sl);
	if (g4c_launch(c, "attention (gemm queries)", attn_gemm_queries_kernel,
				   g4c_stride_grid(c, (size_t) a->n_kv * rows * (a->hd / 8), 8), dim3(256), 0, *a, t0, rows,
				   sl.qh) != G4_OK)
		return c->err_code;
	for (int k0 = 0; k0 < keys; k0 += block_keys)
	{
		int			kn = G4_MIN(block_keys, keys - k0);
		g4c_lt_product p;

		/* Sᵀ (keys x rows) = K (stored hd x keys, transposed) · Qᵀ */
		memset(&p, 0, sizeof(p));
		p.ab_f16 = 1;
		p.transa = 1;
		p.m = kn;
		p.n = rows;
		p.k = a->hd;
		p.lda = a->hd;
		p.ldb = a->hd;
		p.ldd = kn;
		p.batch = a->n_kv;
		p.sa = (int64_t) rows_total * a->hd;
		p.sb = (int64_t) rows * a->hd;
		p.sd = (int64_t) rows * kn;
		if (g4c_lt_gemm(c, &p, kimg + (first_row + (size_t) k0) * a->hd, sl.qh, sl.S) != G4_OK)
			return c->err_code;
		if (g4c_launch(c, "attention (gemm softmax)", softmax_kernel(kn), dim3((unsigned) rows, (unsigned) a->n_kv),
					   dim3(SOFTMAX_THREADS), 0, *a, t0, rows, sl.S, kn, k0, k0 == 0, sl.st, sl.O) != G4_OK)
			return c->err_code;
		/* Oᵀ (hd x rows) (+)= V (stored hd x keys) · Pᵀ (P's rows 2·kn
		 * halves apart) */
		memset(&p, 0, sizeof(p));
		p.ab_f16 = 1;
		p.accumulate = k0 > 0;
		p.m = a->hd;
		p.n = rows;
		p.k = kn;
		p.lda = a->hd;
		p.ldb = 2 * kn;
		p.ldd = a->hd;
		p.batch = a->n_kv;
		p.sa = (int64_t) rows_total * a->hd;
		p.sb = (int64_t) rows * kn * 2;
		p.sd = (int64_t) rows * a->hd;
		if (g4c_lt_gemm(c, &p, vimg + (first_row + (size_t) k0) * a->hd, sl.S, sl.O) != G4_OK)
			return c->err_code;
	}
	return g4c_launch(c, "attention (gemm output)", attn_gemm_out_kernel,
					  g4c_stride_grid(c, (size_t) a->n_kv * rows * (a->hd / 4), 8), dim3(256), 0, *a, t0, rows, sl.O,
					  sl.st.sum);
}

/* The scores' budget of a slice: G4_ATTN_GEMM_SCORES (bytes; tests and
 * benchmarks, read at every call), else ATTN_GEMM_SCORES_BYTES. */
static size_t
scores_budget(void)
{
	const char *env = getenv("G4_ATTN_GEMM_SCORES");

	return env ? (size_t) strtoull(env, NULL, 10) : ATTN_GEMM_SCORES_BYTES;
}

/*
 * Dry steps (backend.h): the rows' buffer for the largest grid a step of
 * this one's tokens may use: the dry step's own or, where its rows pass the
 * bound (the products then leave the step to the tc kernel), the largest
 * grid within the bound, which a step of fewer or shorter runs reaches.
 * And the scratch of any slice of a run of at most these tokens: a run
 * sees at least as many keys as it has tokens, which bounds how many
 * tokens slice_plan puts in one slice; the scores take at most the budget,
 * the queries and the output grow with the slice's rows.
 */
int
g4c_attention_gemm_dry(g4_cuda *c, const attn_args *a)
{
	size_t		grid = (size_t) c->keqv_tile_grid;
	size_t		budget = scores_budget();
	int			heads = a->n_kv * a->gq;
	int			tallest = 1;
	size_t		rows,
				keys;
	slice_scratch unused;

	if (!gemm_applies(c, a))
		return G4_OK;
	while (grid > 1 && grid_rows_bytes(a, grid) > ATTN_GEMM_ROWS_MAX_BYTES)
		grid /= 2;
	for (int n = G4_KV_BLOCK_TOKENS; n < c->n_tokens + G4_KV_BLOCK_TOKENS; n += G4_KV_BLOCK_TOKENS)
	{
		int			ts,
					kb;

		slice_plan(G4_MIN(n, c->n_tokens), n, heads, budget, KEY_BLOCK_MAX, &ts, &kb);
		tallest = G4_MAX(tallest, ts);
	}
	rows = (size_t) tallest * (size_t) a->gq;
	keys = G4_DIV_UP(budget, (size_t) a->n_kv * rows * 4);
	keys = G4_MAX(G4_DIV_UP(keys, G4_KV_BLOCK_TOKENS) * G4_KV_BLOCK_TOKENS, (size_t) G4_KV_BLOCK_TOKENS);
	if (!g4c_grow(c, &c->keqv_rows, &c->keqv_rows_bytes, grid_rows_bytes(a, grid), "k_eq_v key and value rows") ||
		!g4c_scratch(c, slice_layout(NULL, a->n_kv, (int) rows, (int) keys, a->hd, &unused)))
		return c->err_code;
	return G4_OK;
}

/* The attention of every token of the step's k_eq_v prefill runs into
 * a->out (the caller checked g4c_attention_gemm_serves). */
int
g4c_attention_gemm(g4_cuda *c, const attn_args *a)
{
	const int32_t *runs = c->h_meta + (c->d_tile_runs - c->d_meta);
	const int32_t *hi = c->h_meta + (c->d_hi[G4_KVG_FULL] - c->d_meta);
	/* G4_ATTN_GEMM_KEYS (keys per block, a multiple of 16): tests and
	 * benchmarks, read at every call */
	const char *keys_env = getenv("G4_ATTN_GEMM_KEYS");
	size_t		budget = scores_budget();
	int			keys_cap = keys_env ? atoi(keys_env) / G4_KV_BLOCK_TOKENS * G4_KV_BLOCK_TOKENS : KEY_BLOCK_MAX;
	int			heads = a->n_kv * a->gq;
	int			rows_total = 16 * c->keqv_tile_grid;
	size_t		need = 0;
	uint16_t   *kimg,
			   *vimg;
	unsigned char *scratch;
	int			r;

	if (keys_cap < G4_KV_BLOCK_TOKENS)
		keys_cap = KEY_BLOCK_MAX;
	/* the scratch of the largest slice (a run's keys: its record's) */
	for (r = 0; r < c->n_tile_runs; r++)
	{
		const int32_t *run = runs + G4C_RUN_INTS * r;
		int			keys = whole_blocks(run[3]),
					ts,
					kb;
		slice_scratch unused;

		slice_plan(run[5], keys, heads, budget, keys_cap, &ts, &kb);
		need = G4_MAX(need, slice_layout(NULL, a->n_kv, ts * a->gq, G4_MIN(kb, keys), a->hd, &unused));
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
		int			ts,
					kb;

		slice_plan(run[5], whole_blocks(run[3]), heads, budget, keys_cap, &ts, &kb);
		for (int t0 = run[4]; t0 < run[4] + run[5]; t0 += ts)
		{
			int			n = G4_MIN(ts, run[4] + run[5] - t0);
			int			keys = slice_keys(hi, t0, n);

			if (keys > 0 && attention_slice(c, a, t0, n, keys, kb, kimg, vimg, 16 * (size_t) run[1], rows_total,
											scratch) != G4_OK)
				return c->err_code;
		}
	}
	return G4_OK;
}
