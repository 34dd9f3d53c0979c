/*
 * matmul_lt.cu — int4 matmuls at prefill row counts through cuBLASLt: the
 * weight is dequantised into a bf16 matrix ((code - 8) · scale, one
 * rounding: the values the int4 gemm kernel feeds its tensor cores) and
 * multiplied by the bf16 activations with float32 accumulation.  The
 * dequantisation streams the weight (2.5 bytes per weight), which the
 * GEMM's speed repays only at many rows: the threshold is in g4c_matmul_i4
 * (matmul_w4.cu).
 *
 * A weight is dequantised at most once per step: two slots keep the last two
 * weights' bf16 matrices, so the MLP's row slices (model.c) reuse gate_up's
 * and down's.  step_begin empties them, so what a step graph records never
 * depends on an earlier step.  Device memory: the two largest bf16 matrices
 * at worst (at the 12B shape gate_up 236 MB + down 118 MB, in the order the
 * layers call them).
 *
 * The cuBLASLt handle and its workspace are made with the backend, so calls
 * recorded into a step graph allocate no device memory (a product shape's
 * plan, made at its first call, is host memory); g4c_lt_gemm serves the
 * attention's products too (attention_gemm.cu).
 */
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>

#include "matmul.cuh"

#define LT_WORKSPACE_BYTES ((size_t) 32 << 20)
/* the heuristic's algorithms kept per shape: G4_LT_ALGO=i (benchmarks)
 * takes the i-th instead of the first, for every product */
#define LT_ALGOS 8

/*
 * Dequantisation: one warp per item of 16 rows x DQ_TILES k-tiles.  Each
 * lane loads its 16-byte word group of every tile (the layout in
 * cuda_common.cuh: lane 4r + t holds rows r and r + 8 of both 32-column
 * groups, columns 8p + 2t and 8p + 2t + 1 for p = 0..3), writes the bf16
 * pairs to a shared row-major stage, and the warp then stores whole rows of
 * DQ_TILES · 128 bytes with 16-byte stores.  The grid fills the GPU and
 * strides over the items.
 */
#define DQ_TILES 4
#define DQ_WARPS 4
/* a stage row in 32-bit words; the 4 extra put the 8 rows that one shared
 * store instruction spans in different banks */
#define DQ_ROW_WORDS (DQ_TILES * 32 + 4)

__global__ void __launch_bounds__(DQ_WARPS * 32)
dequant_i4_kernel(const uint4 *packed, const uint32_t *scales, int rows, int KT, uint16_t *wb)
{
	__shared__ __align__(16) uint32_t stage[DQ_WARPS][16 * DQ_ROW_WORDS];
	int			lane = threadIdx.x & 31;
	int			r = lane >> 2,
				t = lane & 3;
	uint32_t   *st = stage[threadIdx.x >> 5];
	int			spans = (KT + DQ_TILES - 1) / DQ_TILES;
	size_t		items = (size_t) ((rows + 15) / 16) * (size_t) spans;
	size_t		Kp = (size_t) KT * 64;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	for (size_t it = (size_t) blockIdx.x * DQ_WARPS + (threadIdx.x >> 5); it < items;
		 it += (size_t) gridDim.x * DQ_WARPS)
	{
		int			U = (int) (it / (size_t) spans);
		int			kt0 = (int) (it - (size_t) U * (size_t) spans) * DQ_TILES;
		int			nt = min(DQ_TILES, KT - kt0);
		uint4		q[DQ_TILES];
		uint32_t	sc[DQ_TILES][2];	/* rows r, r + 8: group 0 low, group 1 high */

		/* every load first, then the arithmetic */
#pragma unroll
		for (int j = 0; j < DQ_TILES; j++)
			if (j < nt)
			{
				size_t		tile = (size_t) U * (size_t) KT + (size_t) (kt0 + j);

				q[j] = packed[tile * 32 + (size_t) lane];
				sc[j][0] = scales[tile * 16 + (size_t) r];
				sc[j][1] = scales[tile * 16 + (size_t) r + 8];
			}
#pragma unroll
		for (int j = 0; j < DQ_TILES; j++)
		{
			uint32_t	words[4] = {q[j].x, q[j].y, q[j].z, q[j].w};

			if (j >= nt)
				break;
#pragma unroll
			for (int wi = 0; wi < 4; wi++)
			{
				int			h = wi >> 1,
							G = wi & 1;
				float		s = g4_bf16_to_f32((uint16_t) (sc[j][h] >> (16 * G)));
				uint32_t   *dst = st + (r + 8 * h) * DQ_ROW_WORDS + j * 32 + G * 16 + t;

#pragma unroll
				for (int p = 0; p < 4; p++)
				{
					float		v0 = (float) ((int) ((words[wi] >> (4 * p)) & 15u) - 8) * s;
					float		v1 = (float) ((int) ((words[wi] >> (4 * (p + 4))) & 15u) - 8) * s;

					dst[4 * p] = g4c_pack_bf16(v0, v1);
				}
			}
		}
		__syncwarp();
		for (int row = 0; row < 16; row++)
		{
			int			R = U * 16 + row;

			if (R < rows && lane < nt * 8)
				reinterpret_cast<uint4 *>(wb + (size_t) R * Kp + (size_t) kt0 * 64)[lane] =
					reinterpret_cast<const uint4 *>(st + row * DQ_ROW_WORDS)[lane];
		}
		__syncwarp();			/* the stage is refilled by the next item */
	}
}

/*
 * Plans: each product shape's descriptors and the heuristic's algorithm,
 * made once.  A prefill step multiplies the same few shapes in every
 * layer; making them anew at every call (a descriptor, three layouts, a
 * preference and a heuristic query) is host work that short products, the
 * attention's over a chunk's first key blocks, may leave the GPU waiting
 * for.  LT_PLANS shapes, the least recently used one replaced.
 */
#define LT_PLANS 64

typedef struct
{
	g4c_lt_product key;			/* compared whole: no padding */
	cublasLtMatmulDesc_t op;
	cublasLtMatrixLayout_t la,
				lb,
				ld;
	cublasLtMatmulHeuristicResult_t heur[LT_ALGOS];
	int			found;
	uint64_t	used;			/* 0: empty */
} lt_plan;

struct g4c_lt_plans
{
	lt_plan		p[LT_PLANS];
	uint64_t	clock;
};

static void
plan_clear(lt_plan *pl)
{
	if (pl->ld)
		cublasLtMatrixLayoutDestroy(pl->ld);
	if (pl->lb)
		cublasLtMatrixLayoutDestroy(pl->lb);
	if (pl->la)
		cublasLtMatrixLayoutDestroy(pl->la);
	if (pl->op)
		cublasLtMatmulDescDestroy(pl->op);
	memset(pl, 0, sizeof(*pl));
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
	int			per_sm = 0;

	cublasStatus_t st = cublasLtCreate(&h);

	if (st != CUBLAS_STATUS_SUCCESS)
		return lt_fail(c, st, "handle");
	c->lt = h;
	c->lt_plans = (g4c_lt_plans *) calloc(1, sizeof(g4c_lt_plans));
	if (!c->lt_plans)
	{
		snprintf(c->err_msg, sizeof(c->err_msg), "out of memory");
		c->err_code = G4_ERR_NOMEM;
		return G4_ERR_NOMEM;
	}
	G4C_CHECK(c, cudaMalloc(&c->lt_ws, LT_WORKSPACE_BYTES));
	/* as many dequantisation blocks as are resident at once: the items are
	 * shared evenly, with no second wave */
	G4C_CHECK(c, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, dequant_i4_kernel, DQ_WARPS * 32, 0));
	c->lt_dequant_blocks = c->sm_count * (per_sm > 0 ? per_sm : 1);
	return G4_OK;
}

void
g4c_lt_held(const g4_cuda *c, size_t *workspace, size_t *slots)
{
	*workspace = c->lt_ws ? LT_WORKSPACE_BYTES : 0;
	*slots = c->lt_slot[0].bytes + c->lt_slot[1].bytes;
}

void
g4c_lt_free(g4_cuda *c)
{
	for (int i = 0; i < 2; i++)
		if (c->lt_slot[i].data)
			cudaFree(c->lt_slot[i].data);
	memset(c->lt_slot, 0, sizeof(c->lt_slot));
	if (c->lt_plans)
		for (int i = 0; i < LT_PLANS; i++)
			plan_clear(&c->lt_plans->p[i]);
	free(c->lt_plans);
	c->lt_plans = NULL;
	if (c->lt_ws)
		cudaFree(c->lt_ws);
	if (c->lt)
		cublasLtDestroy((cublasLtHandle_t) c->lt);
	c->lt_ws = NULL;
	c->lt = NULL;
}

void
g4c_lt_step_begin(g4_cuda *c)
{
	/* the slot choice too starts afresh: a step's first run sizes the slots
	 * for its recording */
	for (int i = 0; i < 2; i++)
	{
		c->lt_slot[i].weight = 0;
		c->lt_slot[i].used = 0;
	}
}

/* The bf16 matrix [out][ktiles · 64] of w: a slot's, when this step has
 * dequantised w already, else the least recently used slot's, refilled.
 * NULL after recording an error. */
static const uint16_t *
dequantised(g4_cuda *c, const g4_weight *w)
{
	int			N = (int) w->out;
	int			i = c->lt_slot[0].used <= c->lt_slot[1].used ? 0 : 1;
	size_t		items,
				blocks;

	for (int k = 0; k < 2; k++)
		if (c->lt_slot[k].weight == w->id)
		{
			c->lt_slot[k].used = ++c->lt_clock;
			return (const uint16_t *) c->lt_slot[k].data;
		}
	c->lt_slot[i].weight = 0;
	if (!g4c_grow(c, &c->lt_slot[i].data, &c->lt_slot[i].bytes, (size_t) N * (size_t) w->ktiles * 128,
				  "dequantised weight"))
		return NULL;
	items = (size_t) w->units * (size_t) ((w->ktiles + DQ_TILES - 1) / DQ_TILES);
	blocks = (items + DQ_WARPS - 1) / DQ_WARPS;
	if (blocks > (size_t) c->lt_dequant_blocks)
		blocks = (size_t) c->lt_dequant_blocks;
	if (g4c_launch(c, "matmul (int4 to bf16)", dequant_i4_kernel, dim3((unsigned) blocks), dim3(DQ_WARPS * 32), 0,
				   (const uint4 *) w->data, (const uint32_t *) w->scales, N, (int) w->ktiles,
				   (uint16_t *) c->lt_slot[i].data) != G4_OK)
		return NULL;
	c->lt_slot[i].weight = w->id;
	c->lt_slot[i].used = ++c->lt_clock;
	return (const uint16_t *) c->lt_slot[i].data;
}

#define LT_CHECK(c, call, what) do { cublasStatus_t _s = (call); \
	if (_s != CUBLAS_STATUS_SUCCESS) { rc = lt_fail((c), _s, (what)); goto done; } } while (0)

/* A plan for p's shape: its descriptors and the heuristic's first
 * LT_ALGOS algorithms (G4_LT_ALGO picks among them). */
static int
plan_make(g4_cuda *c, const g4c_lt_product *p, lt_plan *pl)
{
	cudaDataType_t ab = p->ab_f16 ? CUDA_R_16F : CUDA_R_16BF;
	cudaDataType_t dt = p->d_bf16 ? CUDA_R_16BF : CUDA_R_32F;
	cublasOperation_t ta = p->transa ? CUBLAS_OP_T : CUBLAS_OP_N;
	cublasLtMatmulPreference_t pref = NULL;
	size_t		ws = LT_WORKSPACE_BYTES;
	int			rc = G4_OK;

	memcpy(&pl->key, p, sizeof(*p));
	LT_CHECK(c, cublasLtMatmulDescCreate(&pl->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "descriptor");
	LT_CHECK(c, cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "descriptor");
	LT_CHECK(c, cublasLtMatrixLayoutCreate(&pl->la, ab, p->transa ? p->k : p->m, p->transa ? p->m : p->k, p->lda),
			 "layout");
	LT_CHECK(c, cublasLtMatrixLayoutCreate(&pl->lb, ab, p->k, p->n, p->ldb), "layout");
	LT_CHECK(c, cublasLtMatrixLayoutCreate(&pl->ld, dt, p->m, p->n, p->ldd), "layout");
	if (p->batch > 1)
	{
		const struct
		{
			cublasLtMatrixLayout_t l;
			int64_t		stride;
		}			b[3] = {{pl->la, p->sa}, {pl->lb, p->sb}, {pl->ld, p->sd}};

		for (int i = 0; i < 3; i++)
		{
			LT_CHECK(c, cublasLtMatrixLayoutSetAttribute(b[i].l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &p->batch,
														 sizeof(p->batch)), "layout");
			LT_CHECK(c, cublasLtMatrixLayoutSetAttribute(b[i].l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
														 &b[i].stride, sizeof(b[i].stride)), "layout");
		}
	}
	LT_CHECK(c, cublasLtMatmulPreferenceCreate(&pref), "preference");
	LT_CHECK(c, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
			 "preference");
	LT_CHECK(c, cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t) c->lt, pl->op, pl->la, pl->lb, pl->ld, pl->ld, pref,
											   LT_ALGOS, pl->heur, &pl->found), "heuristic");
	if (pl->found < 1)
		rc = lt_fail(c, CUBLAS_STATUS_NOT_SUPPORTED, "no algorithm");
done:
	if (pref)
		cublasLtMatmulPreferenceDestroy(pref);
	if (rc != G4_OK)
		plan_clear(pl);
	return rc;
}

/* The plan of p's shape, made when new (NULL after recording an error). */
static const lt_plan *
plan_for(g4_cuda *c, const g4c_lt_product *p)
{
	g4c_lt_plans *ps = c->lt_plans;
	lt_plan    *lru = &ps->p[0];

	for (int i = 0; i < LT_PLANS; i++)
	{
		lt_plan    *pl = &ps->p[i];

		if (pl->used && memcmp(&pl->key, p, sizeof(*p)) == 0)
		{
			pl->used = ++ps->clock;
			return pl;
		}
		if (pl->used < lru->used)
			lru = pl;
	}
	plan_clear(lru);
	if (plan_make(c, p, lru) != G4_OK)
		return NULL;
	lru->used = ++ps->clock;
	return lru;
}

/* One product on cuBLASLt (float32 accumulation), described in its
 * column-major terms: g4c_lt_product in cuda_common.cuh.  The heuristic's
 * first algorithm, or with G4_LT_ALGO=i (benchmarks) its i-th. */
int
g4c_lt_gemm(g4_cuda *c, const g4c_lt_product *p, const void *A, const void *B, void *D)
{
	const char *pick = getenv("G4_LT_ALGO");
	const lt_plan *pl;
	float		alpha = 1.0f,
				beta = p->accumulate ? 1.0f : 0.0f;
	int			algo;
	cublasStatus_t st;

	if (c->dry)
		return G4_OK;
	pl = plan_for(c, p);
	if (!pl)
		return c->err_code;
	algo = pick ? atoi(pick) : 0;
	algo = algo < 0 ? 0 : algo >= pl->found ? pl->found - 1 : algo;
	st = cublasLtMatmul((cublasLtHandle_t) c->lt, pl->op, &alpha, A, pl->la, B, pl->lb, &beta, D, pl->ld, D, pl->ld,
						&pl->heur[algo].algo, c->lt_ws, LT_WORKSPACE_BYTES, c->stream);
	return st == CUBLAS_STATUS_SUCCESS ? G4_OK : lt_fail(c, st, "matmul");
}

/* y[n][N] = x[n][K]·Wᵀ, float32 or (d_bf16) bf16.  Column-major, as cuBLAS
 * sees it: yᵀ (N x n) = W (N x Kp, stored as its transpose, Kp x N) times
 * xᵀ (Kp x n). */
static int
lt_product(g4_cuda *c, const g4_weight *w, const float *x, int n, void *y, int d_bf16)
{
	int			Kp = (int) w->ktiles * 64;
	int			N = (int) w->out;
	const uint16_t *xb;
	const uint16_t *wb;
	g4c_lt_product p;

	xb = g4c_matmul_input(c, x, n, (int) w->in, Kp, 0, NULL);
	if (!xb)
		return c->err_code;
	wb = dequantised(c, w);
	if (!wb)
		return c->err_code;
	memset(&p, 0, sizeof(p));
	p.d_bf16 = d_bf16;
	p.transa = 1;
	p.m = N;
	p.n = n;
	p.k = Kp;
	p.lda = Kp;
	p.ldb = Kp;
	p.ldd = N;
	p.batch = 1;
	return g4c_lt_gemm(c, &p, wb, xb, y);
}

int
g4c_matmul_i4_lt(g4_cuda *c, const g4_weight *w, const float *x, int n, float *y)
{
	return lt_product(c, w, x, n, y, 0);
}

/*
 * The MLP's gate/up product and GEGLU at prefill row counts: the product
 * leaves cuBLASLt rounded to bf16 (the down product reads GEGLU's output
 * as bf16 anyway), in the first half of gu's bytes, and GEGLU writes its
 * float32 output and, in the second half, the bf16 copy that down takes
 * (g4c_act_bf16_offer_in), whatever the rows: half the product's bytes
 * written and read again, and no conversion before down (a 2k prompt's
 * MLP slices of 1,024 rows: 252 MB a layer less; RESULTS.md, run 118).
 * gu [n][2ff] float32 holds both: 4·n·ff bytes of product, then 2·n·ff of
 * copy.
 */
int
g4c_matmul_geglu_i4_lt(g4_cuda *c, const g4_weight *w, const float *x, int n, float *gu, const g4c_geglu_after *gg)
{
	uint16_t   *prod = (uint16_t *) gu;
	uint16_t   *copy = prod + (size_t) n * 2 * (size_t) gg->ff;

	if (gg->ff % 8 != 0)
	{
		int			rc = lt_product(c, w, x, n, gu, 0);

		return rc != G4_OK ? rc : g4c_geglu(&c->base, gu, n, gg->ff, gg->out);
	}
	if (lt_product(c, w, x, n, prod, 1) != G4_OK)
		return c->err_code;
	return g4c_geglu_of_bf16(c, prod, n, gg->ff, gg->out, g4c_act_bf16_offer_in(c, gg->out, n, gg->ff, copy));
}
