/*
 * backend.h — the compute interface between the engine and a device.
 *
 * The engine (model.c) expresses one forward step as a sequence of the
 * operations below.  Two implementations exist: src/engine/cpu/ (the
 * reference: simple, exact, multithreaded) and cuda/ (the fast one).  Every
 * CUDA operation is tested for parity against the CPU one.
 *
 * Conventions
 *  - Activations are float32 row-major matrices in device memory obtained from
 *    ops->alloc; "n" is a number of token rows.
 *  - Operations are ordered as issued and may run asynchronously; ops->sync
 *    waits and reports the first failure.  Operation return codes report
 *    launch-time failures only.
 *  - Per-token metadata of the current step (token ids, positions, sequence
 *    slots, visible key ranges, rows that need logits) is handed over once by
 *    ops->step_begin and read implicitly by the operations that need it.
 *  - Weights are uploaded once at load through ops->weight_create, which may
 *    concatenate several host matrices along the output dimension (fused QKV,
 *    fused gate/up) and repack them into whatever layout the device prefers.
 */
#ifndef G4_BACKEND_H
#define G4_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "kvformat.h"

/* Weight storage formats as found in checkpoints. */
typedef enum
{
	G4_W_F32 = 0,
	G4_W_F16,
	G4_W_BF16,
	G4_W_I4G32,					/* compressed-tensors pack-quantized int4, group 32:
								 * data int32 [out][in/8] (nibble i of word j is
								 * column 8j+i, code = q + 8), scales bf16
								 * [out][in/32] */
	G4_W_Q8_0,					/* GGUF block formats (ggml layouts): each row is
								 * in/block_size consecutive blocks */
	G4_W_Q4_0,
	G4_W_Q4_1,
	G4_W_Q5_0,
	G4_W_Q5_1,
	G4_W_Q4_K,
	G4_W_Q5_K,
	G4_W_Q6_K,
	G4_W_FORMAT_COUNT
} g4_wfmt;

const char *g4_wfmt_name(int fmt);

/* Bytes of one row of `in` elements in a format (scales excluded for I4G32). */
size_t		g4_wfmt_row_bytes(int fmt, int64_t in);

/* Elements per block for block formats (1 for plain formats). */
int			g4_wfmt_block(int fmt);

/* A weight matrix [out][in] in host memory (often a file mapping). */
typedef struct
{
	int			fmt;			/* g4_wfmt */
	int64_t		out;
	int64_t		in;
	const void *data;
	const uint16_t *scales;		/* G4_W_I4G32 only */
} g4_host_weight;

typedef struct g4_weight g4_weight; /* backend-owned */

/* One attention layer's view of the KV pool. */
typedef struct
{
	int			group;			/* G4_KVG_SLIDING or G4_KVG_FULL */
	int			index;			/* layer index within its group */
	int			n_heads;		/* query heads */
	int			n_kv_heads;
	int			head_dim;
	int			k_eq_v;			/* only V is stored; K = RoPE(V * k_norm_w) */
	float		scale;			/* multiplies q·k */
	const float *k_norm_w;		/* device, [head_dim]; k_eq_v only */
	const float *inv_freq;		/* device, [head_dim/2]; k_eq_v only */
	int			rope_pairs;		/* inv_freq's pairs [0, rope_pairs) rotate and none
								 * past them (g4_config_rope_pairs); k_eq_v only */
} g4_kv_layer;

/* Metadata of one step (host arrays; copied by step_begin). */
typedef struct
{
	int			n_tokens;
	const int32_t *token;		/* [n] token id, or -1 where an embedding row is supplied */
	const int32_t *pos;			/* [n] absolute position */
	const int32_t *slot;		/* [n] sequence slot: row of the block tables */
	const int32_t *lo[G4_KVG_COUNT];	/* [n] first visible key position */
	const int32_t *hi[G4_KVG_COUNT];	/* [n] one past the last visible key */
	int			n_logits;
	const int32_t *logit_rows;	/* [n_logits] rows whose logits are wanted */
} g4_step_meta;

/*
 * One logits row's sampling parameters (the device sampler's view of
 * g4_sampling).  The sampling order, shared by g4_sample and every backend:
 * greedy (the first largest logit) at temperature 0; else
 * e = exp((logit - max) / temperature), ids kept while e >= min_p (e > 0 when
 * min_p is 0), then the k largest, then the shortest run, in the order
 * "larger e first, smaller id first on ties", whose weight reaches top_p of
 * the kept weight; the draw walks the kept ids in id order and takes the first
 * at which the running weight exceeds u times the kept weight.  Weights are e
 * scaled by G4_SAMPLE_FIXED_ONE and truncated to integers, so every sum is
 * exact and independent of the order it is added in.
 */
#define G4_SAMPLE_FIXED_ONE 1099511627776.0f	/* 2^40 */

/*
 * The choice for a row holding a NaN once the suppressed ids are -inf, at
 * any temperature: no token.  Soft-capped logits of a finite forward pass
 * are finite (suppressed ids aside), so a NaN means the pass broke (bad
 * weights, an overflow, a kernel fault); the engine fails the sequence
 * (G4_ERR_NUMERIC) rather than emit a token chosen among garbage.  The test
 * rides on the scan for the largest logit that every choice makes anyway.
 */
#define G4_SAMPLE_NAN (-1)

typedef struct
{
	float		temperature;	/* 0: greedy */
	float		top_p;			/* (0, 1] */
	float		min_p;			/* [0, 1] */
	int32_t		top_k;			/* 0: no limit */
	double		u;				/* the sequence generator's draw in [0, 1); unused when greedy */
} g4_row_sampling;

typedef struct g4_backend g4_backend;

/* Heads that follow each other in a row (q, k or v of one layer), normalised
 * and rotated alike by head_norm_rope. */
typedef struct
{
	int			col;			/* the run's first float in the row */
	int			heads;
	const float *w;				/* RMSNorm weight [hd], or NULL: none */
	const float *inv_freq;		/* RoPE [hd/2], or NULL: no rotation */
	int			store;			/* the kv_store row its heads are, where
								 * head_norm_rope is given a layer:
								 * G4_STORE_K, G4_STORE_V or 0 */
} g4_head_run;

#define G4_STORE_K 1			/* kv_store's k argument */
#define G4_STORE_V 2			/* its v argument (a k_eq_v layer's only row) */

#define G4_HEAD_RUNS_MAX 3		/* q, k, v */

/* The graph tag of g4_model_forward's steps. */
#define G4_GRAPH_FORWARD 0

typedef struct
{
	const char *name;			/* "cpu", "cuda" */

	void		(*destroy) (g4_backend *be);
	/* Device name and memory; total 0 means "host memory". */
	void		(*device_info) (g4_backend *be, char *name, size_t name_len,
								size_t *free_bytes, size_t *total_bytes);
	/* Device memory the backend holds for its own use now (scratch, library
	 * workspaces, dequantised weight copies, staging), beside what alloc
	 * handed out, by use; returns how many uses, at most max.  Optional
	 * (NULL: none). */
	int			(*held) (g4_backend *be, g4_memory_use *out, int max);
	/* Dry steps (on = 1 until on = 0): the backend does the host side of
	 * every operation (its choices of kernels, and growing the buffers it
	 * keeps to what they need) and launches nothing.  The engine passes its
	 * largest steps through it before sizing the KV pool (dry_steps.c), so
	 * that what they grow is counted before the pool takes the memory
	 * left.  Optional (NULL: nothing grows with a step's shape); off
	 * returns the first failure, as sync does. */
	int			(*dry_run) (g4_backend *be, int on, g4_err *err);

	/* ---- memory ---- */
	void	   *(*alloc) (g4_backend *be, size_t bytes);	/* NULL when exhausted */
	void		(*free) (g4_backend *be, void *p);
	int			(*upload) (g4_backend *be, void *dst, const void *src, size_t bytes);
	int			(*download) (g4_backend *be, void *dst, const void *src, size_t bytes);
	int			(*fill) (g4_backend *be, void *dst, int byte, size_t bytes);

	/* ---- weights ---- */
	int			(*weight_create) (g4_backend *be, const g4_host_weight *parts, int n_parts,
								  g4_weight **out, g4_err *err);
	void		(*weight_destroy) (g4_backend *be, g4_weight *w);
	size_t		(*weight_bytes) (const g4_weight *w);	/* device bytes held */

	/* ---- step ---- */
	int			(*kv_configure) (g4_backend *be, const g4_kv_pool_desc *pool);
	int			(*step_begin) (g4_backend *be, const g4_step_meta *meta);

	/* ---- operations ---- */

	/* out[i] = table[token[i]] * scale for rows whose token >= 0. */
	int			(*embed) (g4_backend *be, const g4_weight *table, float scale, float *out);

	/* y[n][w.out] = x[n][w.in] · wᵀ */
	int			(*matmul) (g4_backend *be, const g4_weight *w, const float *x, int n, float *y);

	/* y = x / sqrt(mean(x²) + eps) * w over rows of `dim`; w may be NULL
	 * (no scale); y may alias x. */
	int			(*rmsnorm) (g4_backend *be, const float *x, const float *w, int rows, int dim,
							float eps, float *y);

	/* In place, for each of n tokens (rows of `stride` floats) and each head
	 * of width hd of the runs (at most G4_HEAD_RUNS_MAX): RMS-normalise
	 * (the run's weight, or none), then apply rotate-half RoPE at the token's
	 * position with the run's inv_freq[hd/2] (NULL: no rotation).  One
	 * operation for a layer's q, k and v heads.  With a layer L (else NULL),
	 * then kv_store of the normalised rows of the runs marked `store`, as
	 * kv_store(L, k, stride, v, stride, n) would: the two operations as one
	 * (every row kv_store writes must be in a marked run). */
	int			(*head_norm_rope) (g4_backend *be, float *x, int n, int stride, int hd,
								   const g4_head_run *runs, int n_runs, float eps, const g4_kv_layer *L);

	/* Write K and V rows of the step's tokens into the pool (k NULL when
	 * L->k_eq_v).  Row strides in floats. */
	int			(*kv_store) (g4_backend *be, const g4_kv_layer *L, const float *k, int k_stride,
							 const float *v, int v_stride, int n);

	/* out[n][heads*hd] = softmax(q·kᵀ·scale) v over each token's visible range. */
	int			(*attention) (g4_backend *be, const g4_kv_layer *L, const float *q, int q_stride,
							  int n, float *out);

	/* out[n][ff] = gelu_tanh(gu[:, :ff]) * gu[:, ff:] */
	int			(*geglu) (g4_backend *be, const float *gu, int n, int ff, float *out);

	/* out[n][ff] = geglu of x[n][w.in] · wᵀ (w: gate and up fused, w.out =
	 * 2 ff): matmul into gu then geglu, within matmul's bound at n rows
	 * (the CUDA backend's prefill row counts round the product to bf16
	 * first); gu [n][2ff] is the backend's to use and holds nothing defined
	 * afterwards. */
	int			(*matmul_geglu) (g4_backend *be, const g4_weight *w, const float *x, int n, int ff,
								 float *gu, float *out);

	/* x = (x + rmsnorm(h) * w) * scale   (residual add with post-norm); then,
	 * when y is not NULL, y = rmsnorm(x) * next_w, the next block's input
	 * norm, as rmsnorm would give it (y may alias h). */
	int			(*add_rmsnorm) (g4_backend *be, float *x, const float *h, const float *w,
								int n, int dim, float eps, float scale, const float *next_w, float *y);

	/* out[i] = [table[ids[i]] * scale, h[i]] for n rows: the embedding row
	 * exactly as embed gives it, then h's row of h_dim floats.  ids is device
	 * memory holding valid ids (tokens chosen on the device by argmax), or
	 * G4_SAMPLE_NAN, whose embedding part is zeros (a row after a NaN,
	 * whose outcome is dropped). */
	int			(*embed_concat) (g4_backend *be, const g4_weight *table, float scale, const int32_t *ids,
								 const float *h, int h_dim, int n, float *out);

	/* ids[i] = the index of the first largest element of row i of
	 * logits[n][vocab], G4_SAMPLE_NAN when the row holds a NaN (g4_sample's
	 * greedy choice, nothing suppressed); ids is device memory. */
	int			(*argmax) (g4_backend *be, const float *logits, int n, int vocab, int32_t *ids);

	/* out[i] = x[logit_rows[i]] for the step's logit rows */
	int			(*gather_logit_rows) (g4_backend *be, const float *x, int dim, float *out);

	/* x = cap * tanh(x / cap) */
	int			(*softcap) (g4_backend *be, float *x, size_t count, float cap);

	/* Wait for all issued work; report the first failure. */
	int			(*sync) (g4_backend *be, g4_err *err);

	/* ---- optional (NULL when a backend has none) ---- */

	/*
	 * Whole-step graphs.  After step_begin, graph_begin returns 1 when a
	 * graph recorded for a step of the same shape and tag exists: issue none
	 * of the step's operations and call graph_end, which replays it.  It
	 * returns 0 when the operations must be issued as usual (the backend may
	 * record them), followed by graph_end; a negative g4_status on failure.
	 * graph_end's `failed` says the step stopped at a failed operation:
	 * what was recorded of it is dropped, never kept or launched (it is
	 * not the step).
	 * Only for steps whose operations are a function of the step's shape and
	 * the tag: no upload, download or sync between the two calls.  The tag
	 * names the sequence of operations (G4_GRAPH_FORWARD for the model's
	 * step; the draft's rounds have their own).  A step_begin issued between
	 * them (g4_model_forward's own) changes nothing: the metadata given to
	 * the step_begin before graph_begin is the step's.
	 */
	int			(*graph_begin) (g4_backend *be, uint64_t tag);
	int			(*graph_end) (g4_backend *be, int failed);

	/* Token choice on the device, so only ids cross to the host: ids[i] is
	 * the token g4_sample chooses for logits row i with rows[i]'s parameters
	 * and uniform draw, the ids in suppress excluded (penalties are the
	 * host's: rows that need them are sampled there), or G4_SAMPLE_NAN for
	 * a row holding a NaN once they are.  logits: device, may be
	 * overwritten; suppress, rows and ids: host; ids are filled when the call
	 * returns. */
	int			(*sample) (g4_backend *be, float *logits, int n, int vocab, const int32_t *suppress,
						   int n_suppress, const g4_row_sampling *rows, int32_t *ids);

	/* ---- media embedders (every backend has these) ---- */

	/* y = (x - mean) / sqrt(var + eps) * w + b over rows of `dim` (biased
	 * variance; mean and variance accumulated in double, each product and
	 * sum rounded on its own); y may alias x. */
	int			(*layernorm) (g4_backend *be, const float *x, const float *w, const float *b, int rows,
							  int dim, float eps, float *y);

	/* x[r][i] += b[i] */
	int			(*add_bias) (g4_backend *be, float *x, const float *b, int rows, int dim);

	/* The factorised 2-D position embedding: x[r][i] += (table[px][0][i] +
	 * table[py][1][i]) with (px, py) = pos[r]; a negative coordinate adds
	 * nothing.  table [n_pos][2][dim] and pos [rows][2] (int32) are device
	 * memory; coordinates are < n_pos. */
	int			(*add_pos2d) (g4_backend *be, float *x, const float *table, const int32_t *pos, int rows,
							  int dim);
} g4_backend_ops;

struct g4_backend
{
	const g4_backend_ops *ops;
};

/* Constructors.  The CUDA one exists only when built with nvcc. */
int			g4_backend_cpu_create(int threads, g4_backend **out, g4_err *err);
int			g4_backend_cuda_create(int device, g4_backend **out, g4_err *err);
int			g4_backend_cuda_available(void);

#endif
