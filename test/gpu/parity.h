/*
 * parity.h — the GPU parity table: every operation of the CUDA backend
 * against the CPU backend (the reference), as rows of one table
 * (parity_table.c) run by one loop (parity_run.c).
 *
 * A row names its kind (how to build inputs, run both backends and measure
 * the difference: the case functions, by family of operations in
 * parity_matmul.c, parity_rowwise.c, parity_sample.c, parity_attention.c and
 * parity_media.c), the shapes and dtypes in its arguments, the row counts or
 * variants it expands to, and for each check the operation printed, the
 * bound and why that bound.  Each expansion prints "PARITY op | label |
 * metric | bound | ok" per check.
 *
 * The helpers below are shared by the case functions.  A case that cannot
 * finish (a failed call, an allocation) calls parity_abort(), which returns
 * to the loop: the expansion's checks are reported failed and the next
 * expansion runs.  What a case makes through the helpers is freed by the
 * loop, finished or aborted (parity_list below).
 */
#ifndef G4_PARITY_H
#define G4_PARITY_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "quant.h"

/* ---- backends, random numbers, failures ---------------------------------------- */

extern g4_backend *cpu_be;
extern g4_backend *gpu_be;

/* Both backends created; 0 when there is no CUDA device. */
int			parity_backends(void);
void		parity_backends_destroy(void);

void		reseed(uint64_t s);
uint64_t	rnd(void);
double		unif(void);
float		nrm(void);
void		fill_normal(float *x, size_t n, float std);

void		parity_abort(const char *fmt,...) __attribute__((format(printf, 1, 2), noreturn));
void		parity_skip(const char *reason) __attribute__((noreturn));

/* Abort the case when a call that reports into *errp fails. */
#define P_OK(call, errp) do { if ((call) != G4_OK) \
	parity_abort("%s failed: %s", #call, (errp)->msg); } while (0)

/* be->ops->op(be, ...), aborting the case with the backend's error when it
 * fails. */
#define P_RUN(be, op, ...) do { if ((be)->ops->op((be), __VA_ARGS__) != G4_OK) \
	parity_op_failed((be), #op); } while (0)
void		parity_op_failed(g4_backend *be, const char *op) __attribute__((noreturn));

/* ---- what the cases make, freed by the loop ----------------------------------------- */

/*
 * Host buffers (p_malloc, p_calloc: meta_init's and host_weight_make's
 * among them), device buffers (gpu_alloc, gpu_copy) and weights on either
 * backend (p_weight) are recorded, as they are made, on the list in use:
 * inside a setup the fixture's, freed when the rows that share it are done
 * (after the kind's teardown, if any); inside an expansion the
 * expansion's, freed after it, whether it finished or aborted.  They are
 * freed the last made first (a CPU weight reads its host parts).  p_free
 * frees one of them at once: for what a loop makes again each time round.
 */
typedef struct parity_made parity_made;

typedef struct
{
	parity_made *made;
	int			n,
				cap;
} parity_list;

/* The list the helpers record on from now on (NULL: none, a case helper
 * called outside a setup or an expansion aborts). */
void		parity_list_use(parity_list *l);
void		parity_list_free(parity_list *l);

void	   *p_malloc(size_t bytes);
void	   *p_calloc(size_t n, size_t size);
g4_weight  *p_weight(g4_backend *be, const g4_host_weight *parts, int n_parts);
/* Free p (NULL: nothing), made on the list in use. */
void		p_free(void *p);

/* ---- device buffers and step metadata -------------------------------------------- */

void	   *gpu_alloc(size_t bytes);
void	   *gpu_copy(const void *h, size_t bytes);
void		gpu_get(void *h, const void *d, size_t bytes);
void		gpu_put(void *d, const void *h, size_t bytes);

/* A one-slot-per-token step: token ids, positions, full ranges. */
typedef struct
{
	int			n;
	int32_t    *token,
			   *pos,
			   *slot,
			   *lo[2],
			   *hi[2],
			   *logit_rows;
	int			n_logits;
} meta_buf;

void		meta_init(meta_buf *b, int n);
g4_step_meta meta_of(const meta_buf *b);
/* Both backends see the same step metadata. */
void		both_step(const g4_step_meta *m);

/* ---- the int4 matmul's path ------------------------------------------------------ */

/* G4_MATMUL_I4 as the process started (a path forced by whoever runs the
 * tests): what every case runs under unless it forces its own. */
const char *matmul_initial_force(void);
/* Force the int4 matmul's path (NULL: none). */
void		matmul_force(const char *path);

/* ---- random weights in every format, metrics ------------------------------------- */

/* A random weight [out][in] in format fmt, its data (and scales) made on
 * the list in use. */
void		host_weight_make(g4_host_weight *w, int fmt, int64_t out, int64_t in);

/* max |a - ref| relative to max |ref| */
double		max_rel(const float *a, const float *ref, size_t n);
/* the 4-byte words (floats bit for bit) of two arrays of n that differ */
double		count_differing_words(const void *a, const void *b, size_t n);
/* a head's inverse RoPE frequencies (proportional: a quarter of the pairs
 * rotate); returns the rotated pairs, which lead (g4_config_rope_pairs) */
int			inv_freq_for(int hd, int proportional, double theta, float *out);

/* ---- the table ---------------------------------------------------------------------- */

typedef struct
{
	int			fmt;
	int			n_parts;		/* parts fused into one weight */
	int64_t		outs[4];
	int64_t		in;
	const char *force;			/* G4_MATMUL_I4 for the row, or NULL */
} mm_args;

typedef struct
{
	mm_args		w[3];			/* weights A, B, C */
	int			n;
} mm_reuse_args;

typedef struct
{
	int			fmt;
	int64_t		vocab,
				dim;
	int			h_dim;			/* embed_concat: the h rows' width */
	int			n;
} embed_args;

/* rows x dim (argmax: rows x vocab; geglu: rows x ff; softcap: dim values) */
typedef struct
{
	int			rows,
				dim;
} shape_args;

typedef struct
{
	int			n,
				heads,
				hd,
				stride,
				weighted,
				rope,
				proportional,
				kv_heads,		/* > 0: a k run of that many heads after the q heads */
				k_eq_v,			/* that k run without weight or RoPE (else as q) */
				v_run;			/* and a v run of kv_heads without weight or RoPE */
} hnr_args;

enum
{
	LOGITS_GEMMA,				/* normal, soft-capped, a few large; the rules' rows */
	LOGITS_TIED,				/* 8 values on a grid */
	LOGITS_SMALL_VOCAB,			/* normal, 300 ids */
	LOGITS_NORMAL,				/* normal, 64 rows */
	LOGITS_NAN,					/* Gemma-like, each holding a NaN (parity_sample.c) */
};

/* sampling settings (parity_sample.c): the 10 in turn, or one of them */
enum
{
	SAMPLE_ALL_SETTINGS = -1,
	SAMPLE_PLAIN = 1,			/* temperature 1 */
	SAMPLE_TOP_K_40 = 3,
	SAMPLE_TOP_P_95 = 10,		/* temperature 1, top_p 0.95 */
};

typedef struct
{
	int			logits;
	int			vocab;
	int			setting;
	int			n_suppress;
	int			n,
				n_b;			/* rows of one or two calls (0: one) */
	uint64_t	seed,
				seed_b;			/* the draws' generators: seed + row */
} sample_args;

/* A KV pool: f32/bf16/turboquant, the 12B's layer groups or small ones,
 * f16-exact values, query heads (0: the pool's), RoPE over every pair of
 * the full layers (else proportional, as Gemma 4's), the scores budget of
 * the full layers' prefill products (G4_ATTN_GEMM_SCORES, bytes; 0: the
 * backend's), their keys per block (G4_ATTN_GEMM_KEYS; 0: the
 * backend's), and the mma.sync prefill and k_eq_v decode kernels where
 * the warpgroup-MMA ones would serve (G4_ATTN_PREFILL=mma,
 * G4_ATTN_DECODE_FULL=mma); kv_store only: NaN planted in some keys and
 * values (nans) */
typedef struct
{
	int			dtype,
				small,
				exact16,
				group,			/* the layer group attended over */
				heads,
				full_rope,
				gemm_scores,
				gemm_keys,
				mma_sync,
				nans;
} pool_args;

typedef struct
{
	const char *file;
	int			kind;
} media_args;

/* expansions: the variants of rmsnorm, add_rmsnorm and layernorm */
enum
{
	NORM_WEIGHTED, NORM_UNWEIGHTED, NORM_IN_PLACE,
	ADD_RESIDUAL, ADD_SCALED, ADD_NEXT_NORM,
	LAYERNORM_OUT, LAYERNORM_IN_PLACE,
};

/* expansions: the steps attention runs on (parity_attention.c) */
enum
{
	ATT_DECODE_1,				/* one decode at context 4096 */
	ATT_DECODE_4,				/* four decodes at contexts 1, 37, 1500, 4096 */
	ATT_PREFILL_DECODE,			/* 96 prefill tokens and two decodes */
	ATT_PREFILL_SHORT,			/* 10 prefill tokens and two decodes */
	ATT_PREFILL_LONG,			/* 1,100 (sliding) or 600 (full) at 1503 */
	ATT_VERIFY,					/* verify steps: 5, 8 and 1 tokens of three sequences */
};

/* expansions of the produced-input rows: PRODUCED_N * producer + rows */
enum
{
	PRODUCED_RMSNORM, PRODUCED_ADD_RMSNORM, PRODUCED_GEGLU,
	PRODUCED_THEN_UPLOAD,		/* rmsnorm, then new rows uploaded over its output */
	PRODUCED_THEN_KERNEL,		/* rmsnorm, then softcap in place on its output */
	PRODUCED_MATMUL_GEGLU,		/* a gate/up product and GEGLU (their copy in gu) */
};
#define PRODUCED_N 1000
#define PRODUCED(producer, n) (PRODUCED_N * PRODUCED_##producer + (n))

/* expansion of the reused-weight row: a step begins (else a weight index) */
#define STEP_BEGINS (-1)

typedef union
{
	mm_args		mm;
	mm_reuse_args reuse;
	embed_args	embed;
	shape_args	shape;
	hnr_args	hnr;
	sample_args sample;
	pool_args	pool;
	media_args	media;
} parity_args;

typedef struct
{
	const char *op;				/* the operation named on the PARITY line */
	const char *label;			/* a label of its own, or NULL: the expansion's */
	double		bound;
	const char *why;
} parity_check;

#define PARITY_MAX_EACH 16

typedef struct parity_row parity_row;

typedef struct
{
	const char *family;			/* the G4_TEST that runs it: gpu_parity_<family> */
	/* expansion i: its label; returns how many of the row's checks it
	 * reports (0: a step with nothing to compare) */
	int			(*describe) (const parity_row *r, int i, char *label, size_t size);
	/* what the row's expansions share, built once (NULL: nothing) */
	void	   *(*setup) (const parity_row *r);
	/* undoes what the setup did besides making on the fixture's list
	 * (NULL: nothing) */
	void		(*teardown) (void *fixture);
	/* expansion i: metric[k] for each check it reports */
	void		(*run) (const parity_row *r, void *fixture, int i, double *metric);
} parity_kind;

struct parity_row
{
	const parity_kind *kind;
	parity_args a;
	int			n_each;			/* expansions (0: one, i = 0) */
	int			each[PARITY_MAX_EACH];	/* their row counts, variants, shapes */
	parity_check check[2];
	uint64_t	seed;			/* reseeds the inputs' generator (0: goes on) */
	int			share;			/* rows in a run of the same kind and share
								 * (non-zero) use the first one's fixture: the
								 * arguments it is built from must agree */
};

#define EACH(...) .each = {__VA_ARGS__}, .n_each = (int) (sizeof((int[]) {__VA_ARGS__}) / sizeof(int))

extern const parity_row parity_table[];
extern const int parity_table_len;

/* Run (or with G4_PARITY_LIST=1 list) the rows of one family. */
void		parity_run_family(const char *family);
void		parity_summary(void);

extern const parity_kind parity_matmul_int4,
			parity_matmul_bf16,
			parity_matmul_float,
			parity_matmul_reused,
			parity_matmul_produced,
			parity_matmul_geglu,
			parity_matmul_geglu_bf16,
			parity_embed,
			parity_embed_concat,
			parity_argmax,
			parity_rmsnorm,
			parity_add_rmsnorm,
			parity_head_norm_rope,
			parity_geglu,
			parity_softcap,
			parity_gather,
			parity_sample,
			parity_sample_twice,
			parity_kv_store,
			parity_head_norm_rope_store,
			parity_attention_float32,
			parity_attention_gemma4,
			parity_attention_exact,
			parity_attention_decode,
			parity_layernorm,
			parity_add_bias_pos2d,
			parity_media_embed;

#endif
