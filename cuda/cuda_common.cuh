/*
 * cuda_common.cuh — internals of the CUDA backend shared by its files: the
 * backend state, device weight layouts, error recording, exact conversion
 * helpers (bit-identical to the CPU's util.h / kv_codec.c), warp
 * primitives, tensor-core fragment helpers, and the launchers each file
 * provides.
 *
 * Conventions: every kernel is launched on the backend's one stream;
 * launchers return G4_OK or G4_ERR_BACKEND and record the first CUDA error
 * in the state (ops->sync reports it).  Per-step metadata lives in fixed
 * device buffers filled by step_begin, so a recorded step graph can be
 * replayed after only the metadata copy.
 */
#ifndef G4_CUDA_COMMON_CUH
#define G4_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

extern "C" {
#include "backend.h"
#include "halfconv.h"		/* the conversions the CPU backend uses */
}

/* ---- device weight layouts ------------------------------------------------
 *
 * W_I4  int4 group-32, repacked into tensor-core fragment order.  Rows are
 *       padded to units of 16, columns to k-tiles of 64.  Tile (u, kt) holds
 *       rows 16u..16u+15 and columns 64kt..64kt+63 in 512 bytes: lane
 *       L = 4g + t (g = L/4, t = L%4) owns 16 bytes = four words
 *         [row g, group 2kt] [row g, group 2kt+1] [row g+8, 2kt] [row g+8, 2kt+1]
 *       and the word of (row, group G) holds the codes of columns
 *         nibble p = 0..3: 32G + 2t + 8p        nibble p + 4: that column + 1
 *       so ((word >> 4p) & 0x000F000F) | 0x43004300 is the bf16 pair
 *       {128 + code(c), 128 + code(c + 1)}: one m16n8k16 A fragment register
 *       (rows as M) or B fragment register (rows as N).  Tiles are stored
 *       unit-major ([u][kt]); scales bf16 per tile [16 rows][2 groups].
 * W_BF16 bf16 in fragment order: tile (u, ks) = rows 16u.., columns
 *       16ks.. in 512 bytes, lane L owns {W[g][2t..], W[g+8][2t..],
 *       W[g][2t+8..], W[g+8][2t+8..]} (an A fragment; as B: {0,2} rows g,
 *       {1,3} rows g+8).  Columns padded to 64, tiles unit-major.
 * W_F32 plain row-major float32 (every other format, dequantised exactly at
 *       upload, and I4/BF16 matrices with at most 256 columns, whose
 *       products then run in exact float32 arithmetic).
 */
enum
{
	G4C_W_I4 = 0,
	G4C_W_BF16 = 1,
	G4C_W_F32 = 2
};

struct g4_weight
{
	int			kind;			/* G4C_W_* */
	int64_t		out;			/* logical rows (sum of the parts) */
	int64_t		in;				/* logical columns */
	int64_t		units;			/* ceil(out / 16) (I4, BF16) */
	int64_t		ktiles;			/* ceil(in / 64) (I4, BF16) */
	void	   *data;			/* device */
	uint16_t   *scales;			/* device, I4 only */
	size_t		bytes;			/* device bytes held */
	uint64_t	id;				/* unique per backend, from 1: what caches of it key on */
};

#define G4C_MAX_GRAPHS 48
#define G4C_TPC_LEVELS 7		/* attention tiles of 1, 2, 4, ... 64 tokens */

typedef struct
{
	uint64_t	key;
	int			uses;			/* times this shape was seen */
	uint64_t	last_use;
	cudaGraphExec_t exec;		/* NULL until recorded */
} g4c_graph;

typedef struct
{
	g4_backend	base;
	int			device;
	cudaStream_t stream;
	int			sm_count;
	int			pdl;			/* programmatic dependent launch (Hopper and newer) */
	int			wgmma;			/* the sm_90a warpgroup-MMA kernels run here */
	char		name[256];

	/* first error, reported by sync */
	int			err_code;
	char		err_msg[512];
	/* failures found by kernels (a KV block missing): G4C_STATUS_* bits,
	 * read and cleared by sync */
	unsigned   *d_status;
	unsigned   *h_status;		/* pinned */

	/* KV pool */
	g4_kv_pool_desc kv;
	int			kv_configured;

	/* dry steps (backend.h: dry_run): no launch, no product, no graph */
	int			dry;

	/* the current step: host copies and fixed device buffers */
	int			n_tokens;
	int			n_logits;
	int32_t    *h_meta;			/* pinned */
	int32_t    *d_meta;			/* device */
	size_t		meta_ints;
	cudaEvent_t meta_done;		/* the pinned buffer may be refilled */
	/* device views into d_meta, laid out for the current step (meta_layout) */
	int32_t    *d_token, *d_pos, *d_slot, *d_lo[G4_KVG_COUNT], *d_hi[G4_KVG_COUNT];
	int32_t    *d_logit_rows;
	int32_t    *d_tiles[G4C_TPC_LEVELS];	/* first token of each tile, then n */
	int			n_tiles[G4C_TPC_LEVELS];
	int			span_bucket[G4_KVG_COUNT];	/* pow2 >= the longest visible range */
	/* k_eq_v prefill runs, whose attention attention_gemm.cu computes over
	 * f16 key and value rows made once per layer: per token its run's first
	 * 16-key tile or -1; per run G4C_RUN_INTS ints (slot, first tile,
	 * tiles, keys, first token, tokens), the host's copy in h_meta too */
	int32_t    *d_tile_base, *d_tile_runs;
	int			n_tile_runs;
	int			n_keqv_tiles;	/* 16-key tiles of all runs */
	int			keqv_tile_grid; /* the power of two above it: the rows
								 * kernel's grid and the rows' buffer, in the
								 * step graph's key */
	void	   *keqv_rows;		/* grows outside graph capture only */
	size_t		keqv_rows_bytes;

	/* scratch (grows outside graph capture only) */
	void	   *scratch;
	size_t		scratch_bytes;
	unsigned   *counters;		/* zeroed; merging blocks reset what they use */
	size_t		counters_n;

	/* the writes that may touch an activation (kernel launches, the
	 * upload and fill operations, graph replays; not the backend's own
	 * copies of step metadata and status words, nor cuBLASLt's product,
	 * which only a matmul makes, after its take): how long the bf16 copy
	 * below stands for its source */
	uint64_t	writes;
	/* the bf16 copy of a matmul input its producer wrote beside it
	 * (matmul_input.cu), G4C_ACT_BF16_BYTES made with the backend */
	void	   *act_bf16;
	void	   *act_bf16_at;	/* where the copy on offer lies: act_bf16 or a
								 * producer's own room (g4c_act_bf16_offer_in) */
	const float *act_bf16_of;	/* its float32 source, NULL: none */
	int			act_bf16_n,
				act_bf16_K;
	uint64_t	act_bf16_write; /* the producer's launch, as c->writes */

	/* cuBLASLt (matmul_lt.cu): handle, workspace, the products' plans */
	void	   *lt;
	void	   *lt_ws;
	struct g4c_lt_plans *lt_plans;
	/* int4 weights dequantised to bf16 for it: two slots, the least
	 * recently used one refilled, emptied by every step_begin */
	struct
	{
		void	   *data;
		size_t		bytes;
		uint64_t	weight;			/* g4_weight id, 0 when empty */
		uint64_t	used;
	}			lt_slot[2];
	uint64_t	lt_clock;
	int			lt_dequant_blocks;	/* its kernel's blocks resident at once */
	uint64_t	weight_ids;		/* the last g4_weight id given */

	/* step graphs */
	g4c_graph	graphs[G4C_MAX_GRAPHS];
	uint64_t	graph_clock;
	int			capturing;		/* recording into cur_graph */
	int			capture_begins; /* step_begin calls seen while recording */
	int			cur_graph;		/* index, or -1 */
	uint64_t	step_key;

	/* sampler staging (sample.cu) */
	int32_t    *h_ids;			/* pinned */
	int32_t    *d_ids;
	int			cap_ids;
	g4_row_sampling *h_rows;	/* pinned */
	g4_row_sampling *d_rows;
	int			cap_rows;
	int32_t    *d_suppress;
	int			cap_suppress;
	void	   *d_sample_work;	/* the passes' partial results */
	int			cap_sample_work;	/* bytes */
} g4_cuda;

static inline g4_cuda *
g4c_of(g4_backend *be)
{
	return (g4_cuda *) be;
}

#define G4C_STATUS_KV_MISSING 1u

/* ints per k_eq_v prefill run in d_tile_runs */
#define G4C_RUN_INTS 6

/* Record a CUDA failure (the first one wins); returns G4_ERR_BACKEND or
 * G4_ERR_NOMEM. */
int			g4c_fail(g4_cuda *c, cudaError_t e, const char *what, const char *file, int line);

#define G4C_CHECK(c, call) do { cudaError_t _e = (call); \
	if (_e != cudaSuccess) return g4c_fail((c), _e, #call, __FILE__, __LINE__); } while (0)

/* Scratch of at least `bytes` (256-byte aligned), or NULL after recording
 * an error (growth is refused while a graph is being recorded). */
void	   *g4c_scratch(g4_cuda *c, size_t bytes);
/* The same for any buffer the backend keeps between kernels: *buf grown to
 * at least `bytes` (the old contents lost; recorded graphs dropped). */
void	   *g4c_grow(g4_cuda *c, void **buf, size_t *have, size_t bytes, const char *what);
/* The largest bf16 copy of a matmul input kept (bytes): decode and verify
 * steps of up to ~1,000 rows of GEGLU's 15,360 columns; larger steps
 * (prefill) convert, where a conversion is a small part of a matmul. */
#define G4C_ACT_BF16_BYTES ((size_t) 32 << 20)

/* The buffer a kernel about to be launched may fill with the bf16 copy
 * ([n][K], g4_f32_to_bf16) of its float32 output y, for the matmul that
 * may follow (matmul_input.cu); NULL: none (K not a multiple of 64, or
 * larger than G4C_ACT_BF16_BYTES). */
uint16_t   *g4c_act_bf16_offer(g4_cuda *c, const float *y, int n, int K);
/* The same in room of the caller's ([n][K] bf16, any size), which must hold
 * its bytes until the next launch: the matmul that takes the copy. */
uint16_t   *g4c_act_bf16_offer_in(g4_cuda *c, const float *y, int n, int K, uint16_t *room);
/* Blocks of 256 threads for a grid-stride loop over `items`: one item a
 * thread, at most per_sm blocks per SM. */
static inline unsigned
g4c_stride_grid(const g4_cuda *c, size_t items, int per_sm)
{
	size_t		blocks = (items + 255) / 256;
	size_t		most = (size_t) c->sm_count * (size_t) per_sm;

	return (unsigned) (blocks < most ? blocks : most);
}

/* `n` zeroed counters. */
unsigned   *g4c_counters(g4_cuda *c, size_t n);

/* ---- warp helpers ---------------------------------------------------------- */

__device__ __forceinline__ float
g4c_warp_sum(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

__device__ __forceinline__ float
g4c_warp_max(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

/* Block-wide sum (blockDim.x a multiple of 32, at most 1024); every thread
 * gets the result.  `red` is 32 floats of shared memory. */
__device__ __forceinline__ float
g4c_block_sum(float v, float *red)
{
	int			lane = threadIdx.x & 31;
	int			w = threadIdx.x >> 5;
	int			nw = blockDim.x >> 5;

	v = g4c_warp_sum(v);
	__syncthreads();
	if (lane == 0)
		red[w] = v;
	__syncthreads();
	v = lane < nw ? red[lane] : 0.0f;
	return g4c_warp_sum(v);
}

/* Block-wide maximum, as g4c_block_sum. */
__device__ __forceinline__ float
g4c_block_max(float v, float *red)
{
	int			lane = threadIdx.x & 31;
	int			w = threadIdx.x >> 5;
	int			nw = blockDim.x >> 5;

	v = g4c_warp_max(v);
	__syncthreads();
	if (lane == 0)
		red[w] = v;
	__syncthreads();
	v = lane < nw ? red[lane] : -INFINITY;
	return g4c_warp_max(v);
}

/* ---- tensor-core fragments --------------------------------------------------- */

/* D = A(16x16 bf16) * B(16x8 bf16) + D, float32 accumulate. */
__device__ __forceinline__ void
g4c_mma_bf16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
				 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
				 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
				 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* GELU, tanh approximation, each product and sum rounded as the CPU's
 * (elementwise.c); shared by GEGLU and the matmul that applies it
 * (g4c_matmul_geglu) */
__device__ __forceinline__ float
g4c_gelu_tanh(float x)
{
	const float beta = 0.7978845608028654f;
	const float kappa = 0.044715f;
	float		inner = __fmul_rn(beta, __fadd_rn(x, __fmul_rn(__fmul_rn(__fmul_rn(kappa, x), x), x)));

	return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(inner)));
}

/* D = A(16x16 f16) * B(16x8 f16) + D, float32 accumulate. */
__device__ __forceinline__ void
g4c_mma_f16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
				 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
				 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
				 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two floats as an f16 pair, round to nearest even, saturated to ±65504
 * (never infinite). */
__device__ __forceinline__ uint32_t
g4c_pack_f16(float lo, float hi)
{
	__half2		p = __floats2half2_rn(fminf(fmaxf(lo, -65504.0f), 65504.0f), fminf(fmaxf(hi, -65504.0f), 65504.0f));

	return *reinterpret_cast<uint32_t *>(&p);
}

/* Two floats as a bf16 pair (lo in the low half), round to nearest even. */
__device__ __forceinline__ uint32_t
g4c_pack_bf16(float lo, float hi)
{
	__nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);

	return *reinterpret_cast<uint32_t *>(&p);
}

/* x = hi + lo + r with hi, lo bf16 pairs; |r| <= 2^-17 |x| */
__device__ __forceinline__ void
g4c_split_bf16(float x0, float x1, uint32_t *hi, uint32_t *lo)
{
	__nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
	float2		hf = __bfloat1622float2(h);

	*hi = *reinterpret_cast<uint32_t *>(&h);
	*lo = g4c_pack_bf16(x0 - hf.x, x1 - hf.y);
}

/* The Hadamard transform of N rows of hd floats (a power of two, at most
 * 32 P) held by a warp, in place: lane l holds elements [l·P, l·P + P) of
 * each (P = 1 below 32 elements: the first hd lanes, one each).  The stages
 * shorter than P are kvformat.h's butterflies inside the thread; a longer
 * stage `len` pairs lane l with lane l ^ (len / P), the lane of the lower
 * index taking a + b and the other a - b: the operations of g4_hadamard,
 * in its order, so the results are the CPU's bit for bit.  Each stage runs
 * over all N rows before the next: their shuffles' latencies overlap. */
template <int P, int N>
__device__ __forceinline__ void
hadamard_warp_rows(float x[N][P], int hd)
{
	int			lane = threadIdx.x & 31;
	int			data_lanes = P > 1 ? 32 : hd;
	float		norm = g4_hadamard_norm(hd);

	/* stages within the lane: a P-element transform of its own */
#pragma unroll
	for (int len = 1; len < P; len <<= 1)
#pragma unroll
		for (int n = 0; n < N; n++)
#pragma unroll
			for (int q = 0; q < P / 2; q++)
				g4_hadamard_butterfly(x[n], len, q);
	/* stage len = m·P: element i of lane l pairs with element i of lane
	 * l ^ m, the lower index being in the lane whose bit m is clear (a
	 * constant trip count, unrolled, when the head fills the warp) */
#pragma unroll
	for (int m = 1; m < data_lanes; m <<= 1)
	{
		bool		upper = (lane & m) != 0;

#pragma unroll
		for (int n = 0; n < N; n++)
#pragma unroll
			for (int i = 0; i < P; i++)
			{
				float		o = __shfl_xor_sync(0xffffffffu, x[n][i], m);

				x[n][i] = upper ? G4_KV_SUB(o, x[n][i]) : G4_KV_ADD(x[n][i], o);
			}
	}
#pragma unroll
	for (int n = 0; n < N; n++)
#pragma unroll
		for (int i = 0; i < P; i++)
			x[n][i] = G4_KV_MUL(x[n][i], norm);
}

/* One row (hadamard_warp_rows). */
template <int P>
__device__ __forceinline__ void
hadamard_warp(float x[P], int hd)
{
	hadamard_warp_rows<P, 1>(reinterpret_cast<float (*)[P]>(x), hd);
}

/* x = this lane's P elements [lane·P, lane·P + P) of a row of hd floats (0
 * past hd): the layout of hadamard_warp; by 16-byte loads where vec (the row
 * 16-byte aligned, P a multiple of 4). */
template <int P>
__device__ __forceinline__ void
lane_load(float x[P], const float *row, int hd, int vec)
{
	int			lane = threadIdx.x & 31;

	if constexpr (P % 4 == 0)
	{
		if (vec)
		{
#pragma unroll
			for (int i = 0; i < P; i += 4)
			{
				float4		f = *(const float4 *) (row + lane * P + i);

				x[i] = f.x;
				x[i + 1] = f.y;
				x[i + 2] = f.z;
				x[i + 3] = f.w;
			}
			return;
		}
	}
#pragma unroll
	for (int i = 0; i < P; i++)
		x[i] = lane * P + i < hd ? row[lane * P + i] : 0.0f;
}

/* The inverse of lane_load: this lane's P elements into the row (none past
 * hd). */
template <int P>
__device__ __forceinline__ void
lane_store(const float x[P], float *row, int hd, int vec)
{
	int			lane = threadIdx.x & 31;

	if constexpr (P % 4 == 0)
	{
		if (vec)
		{
#pragma unroll
			for (int i = 0; i < P; i += 4)
				*(float4 *) (row + lane * P + i) = make_float4(x[i], x[i + 1], x[i + 2], x[i + 3]);
			return;
		}
	}
#pragma unroll
	for (int i = 0; i < P; i++)
		if (lane * P + i < hd)
			row[lane * P + i] = x[i];
}

/* The bf16 pair (code - 8) of nibbles p and p + 4 of a packed I4 word:
 * {128 + c, 128 + c'} by (a & b) | c in one lop3 (written plainly, ptxas
 * emits two instructions), then one subtraction. */
__device__ __forceinline__ uint32_t
g4c_i4_pair(uint32_t w, int p)
{
	uint32_t	v;
	uint32_t	k = 0x43084308u;	/* bf16 pair {136, 136} */

	asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(v) : "r"(w >> (4 * p)), "n"(0x000F000F), "n"(0x43004300));
	__nv_bfloat162 r = __hsub2(*reinterpret_cast<__nv_bfloat162 *>(&v), *reinterpret_cast<__nv_bfloat162 *>(&k));

	return *reinterpret_cast<uint32_t *>(&r);
}

__device__ __forceinline__ uint32_t
g4c_bf16_mul2(uint32_t a, uint32_t s2)
{
	__nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162 *>(&a), *reinterpret_cast<__nv_bfloat162 *>(&s2));

	return *reinterpret_cast<uint32_t *>(&r);
}

__device__ __forceinline__ void
g4c_ldmatrix_x4(uint32_t r[4], const void *smem)
{
	uint32_t	a = (uint32_t) __cvta_generic_to_shared(smem);

	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
				 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ void
g4c_ldmatrix_x4_trans(uint32_t r[4], const void *smem)
{
	uint32_t	a = (uint32_t) __cvta_generic_to_shared(smem);

	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
				 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ void
g4c_cp_async16(void *smem, const void *gmem, bool pred)
{
	uint32_t	a = (uint32_t) __cvta_generic_to_shared(smem);
	int			n = pred ? 16 : 0;

	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(a), "l"(gmem), "r"(n));
}

__device__ __forceinline__ void
g4c_cp_async_commit(void)
{
	asm volatile("cp.async.commit_group;\n" ::);
}

template <int N>
__device__ __forceinline__ void
g4c_cp_async_wait(void)
{
	asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
}

/* Blocks of kernel fn one SM holds with `smem` bytes of dynamic shared
 * memory (opting in to more than 48 KiB first); 0 after recording an error.
 * Callers cache it per kernel. */
static inline int
g4c_blocks_per_sm(g4_cuda *c, const void *fn, int threads, int smem)
{
	int			b = 0;
	cudaError_t e = cudaSuccess;

	if (smem > 48 * 1024)
		e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
	if (e == cudaSuccess)
		e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, fn, threads, (size_t) smem);
	if (e != cudaSuccess)
	{
		g4c_fail(c, e, "occupancy", __FILE__, __LINE__);
		return 0;
	}
	return b > 0 ? b : 1;
}

/* ---- launching ----------------------------------------------------------------
 *
 * Every kernel is launched with programmatic stream serialisation where the
 * device has it: a kernel may be scheduled while its predecessor finishes.
 * Each kernel therefore starts with g4c_pdl_trigger() (its own successor may
 * be scheduled once all of its blocks run) and calls g4c_pdl_wait() (the
 * predecessor completed, its writes visible) before reading anything an
 * earlier kernel wrote, and unconditionally, so that completion stays
 * transitive along the stream.  Work that reads only weights may come
 * before the wait.
 */
__device__ __forceinline__ void
g4c_pdl_trigger(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void
g4c_pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/* Sum of a double over the block (every thread gets it); red holds 32. */
__device__ __forceinline__ double
g4c_block_sum_double(double v, double *red)
{
	int			lane = threadIdx.x & 31;
	int			w = threadIdx.x >> 5;
	int			nw = blockDim.x >> 5;

	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	__syncthreads();
	if (lane == 0)
		red[w] = v;
	__syncthreads();
	v = lane < nw ? red[lane] : 0.0;
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

template <typename... KArgs, typename... Args>
static inline int
g4c_launch(g4_cuda *c, const char *what, void (*kernel) (KArgs...), dim3 grid, dim3 block, size_t smem,
		   Args &&... args)
{
	cudaLaunchConfig_t cfg;
	cudaLaunchAttribute attr;
	cudaError_t e;

	cfg.gridDim = grid;
	cfg.blockDim = block;
	cfg.dynamicSmemBytes = smem;
	cfg.stream = c->stream;
	attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
	attr.val.programmaticStreamSerializationAllowed = 1;
	cfg.attrs = &attr;
	cfg.numAttrs = c->pdl ? 1 : 0;
	c->writes++;
	if (c->dry)
		return G4_OK;
	e = cudaLaunchKernelEx(&cfg, kernel, static_cast<Args &&>(args)...);
	if (e != cudaSuccess)
		return g4c_fail(c, e, what, __FILE__, __LINE__);
	return G4_OK;
}

/* ---- launchers, by file ------------------------------------------------------ */

/* elementwise.cu */
int			g4c_embed(g4_backend *be, const g4_weight *table, float scale, float *out);
int			g4c_embed_concat(g4_backend *be, const g4_weight *table, float scale, const int32_t *ids,
							 const float *h, int h_dim, int n, float *out);
int			g4c_geglu(g4_backend *be, const float *gu, int n, int ff, float *out);
/* GEGLU of a bf16 gate/up product gu [n][2ff] (ff a multiple of 8) into out
 * and its bf16 copy outb, NULL: none */
int			g4c_geglu_of_bf16(g4_cuda *c, const uint16_t *gu, int n, int ff, float *out, uint16_t *outb);
int			g4c_matmul_geglu(g4_backend *be, const g4_weight *w, const float *x, int n, int ff, float *gu,
							 float *out);
int			g4c_gather_logit_rows(g4_backend *be, const float *x, int dim, float *out);
int			g4c_softcap(g4_backend *be, float *x, size_t count, float cap);
/* embed_ops.cu */
int			g4c_layernorm(g4_backend *be, const float *x, const float *w, const float *b, int rows,
						  int dim, float eps, float *y);
int			g4c_add_bias(g4_backend *be, float *x, const float *b, int rows, int dim);
int			g4c_add_pos2d(g4_backend *be, float *x, const float *table, const int32_t *pos, int rows,
						  int dim);
/* sample.cu */
int			g4c_sample(g4_backend *be, float *logits, int n, int vocab, const int32_t *suppress,
					   int n_suppress, const g4_row_sampling *rows, int32_t *ids);
int			g4c_argmax(g4_backend *be, const float *logits, int n, int vocab, int32_t *ids);
/* norm_rope.cu */
int			g4c_rmsnorm(g4_backend *be, const float *x, const float *w, int rows, int dim,
						float eps, float *y);
int			g4c_head_norm_rope(g4_backend *be, float *x, int n, int stride, int hd, const g4_head_run *runs,
							   int n_runs, float eps, const g4_kv_layer *L);
int			g4c_add_rmsnorm(g4_backend *be, float *x, const float *h, const float *w, int n,
							int dim, float eps, float scale, const float *next_w, float *y);
/* kv_store.cu */
int			g4c_kv_store(g4_backend *be, const g4_kv_layer *L, const float *k, int k_stride,
						 const float *v, int v_stride, int n);
/* attention.cu */
int			g4c_attention(g4_backend *be, const g4_kv_layer *L, const float *q, int q_stride,
						  int n, float *out);
/* gemv_w4.cu */
int			g4c_gemv_i4(g4_cuda *c, const g4_weight *w, const float *x, int n, float *y);
/* matmul_w4.cu / matmul_dense.cu */
int			g4c_matmul(g4_backend *be, const g4_weight *w, const float *x, int n, float *y);

/* GEGLU over a matmul's output y [n][2ff] into out [n][ff], applied where
 * the matmul adds its partial sums (matmul.cuh) or after it */
typedef struct
{
	int			ff;
	float	   *out;
} g4c_geglu_after;

int			g4c_matmul_i4(g4_cuda *c, const g4_weight *w, const float *x, int n, float *y,
						  const g4c_geglu_after *gg);
/* matmul_lt.cu */
int			g4c_lt_init(g4_cuda *c);
void		g4c_lt_free(g4_cuda *c);
/* its workspace and the dequantised weights' slots, in bytes */
void		g4c_lt_held(const g4_cuda *c, size_t *workspace, size_t *slots);
void		g4c_lt_step_begin(g4_cuda *c);
int			g4c_matmul_i4_lt(g4_cuda *c, const g4_weight *w, const float *x, int n, float *y);
int			g4c_matmul_geglu_i4_lt(g4_cuda *c, const g4_weight *w, const float *x, int n, float *gu,
								   const g4c_geglu_after *gg);

/* One cuBLASLt product in column-major terms: per batch, D (m x n, float32
 * or bf16, leading dimension ldd) = op(A) · B (+ D where accumulate) with A
 * stored m x k (lda), or k x m when transa, and B stored k x n (ldb);
 * operands f16 or bf16, float32 accumulation; batch strides in elements. */
typedef struct
{
	int			ab_f16;			/* operands f16, else bf16 */
	int			d_bf16;			/* D rounded to bf16, else float32 */
	int			accumulate;		/* D += product, else D = product */
	int			transa;
	int			m,
				n,
				k;
	int			lda,
				ldb,
				ldd;
	int			batch;
	int64_t		sa,
				sb,
				sd;
} g4c_lt_product;

int			g4c_lt_gemm(g4_cuda *c, const g4c_lt_product *p, const void *A, const void *B, void *D);
int			g4c_matmul_bf16(g4_cuda *c, const g4_weight *w, const float *x, int n, float *y);
int			g4c_matmul_f32(g4_cuda *c, const g4_weight *w, const float *x, int n, float *y);
/* matmul_w4_wgmma.cu */
int			g4c_matmul_i4_wgmma(g4_cuda *c, const g4_weight *w, const float *x, int n, float *y,
								const g4c_geglu_after *gg);
int			g4c_wgmma_probe(g4_cuda *c, int cc_major, int cc_minor);
/* pack kernels (matmul_w4.cu / matmul_dense.cu): raw device rows [rows][in]
 * of a part placed at row `row0` of the packed weight */
int			g4c_pack_i4(g4_cuda *c, g4_weight *w, const uint32_t *raw, const uint16_t *raw_scales,
						int64_t row0, int64_t rows);
int			g4c_pack_bf16(g4_cuda *c, g4_weight *w, const uint16_t *raw, int64_t row0, int64_t rows);

#endif
