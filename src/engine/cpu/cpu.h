/*
 * cpu.h — internals of the CPU backend (the reference implementation of
 * backend.h), shared by its operation files.
 */
#ifndef G4_CPU_H
#define G4_CPU_H

#include "backend.h"
#include "threadpool.h"

#define G4_CPU_MAX_PARTS 4

struct g4_weight
{
	int			n_parts;
	g4_host_weight parts[G4_CPU_MAX_PARTS];	/* data stays where the loader found it */
	int64_t		out;			/* sum of the parts' rows */
	int64_t		in;
	size_t		bytes;
};

typedef struct
{
	g4_backend	base;
	g4_pool    *pool;
	g4_kv_pool_desc kv;
	int			kv_configured;
	/* the current step (copied by step_begin) */
	int			n_tokens;
	int			n_logits;
	int			cap_tokens;
	int			cap_logits;
	int32_t    *token;
	int32_t    *pos;
	int32_t    *slot;
	int32_t    *lo[G4_KVG_COUNT];
	int32_t    *hi[G4_KVG_COUNT];
	int32_t    *logit_rows;
	/* attention split-KV scratch */
	float	   *scratch;
	size_t		scratch_len;
} g4_cpu;

static inline g4_cpu *
g4_cpu_of(g4_backend *be)
{
	return (g4_cpu *) be;
}

/* The largest head_dim of the KV pool's layers: the bound of the per-head
 * stack buffers of kv_codec.c, kv_store.c and attention.c. */
#define G4_CPU_MAX_HD 512

/* The head block of (layer L, sequence slot, position pos, KV head) in the
 * pool, NULL where the slot holds no block for pos. */
static inline uint8_t *
g4_cpu_head_block(const g4_cpu *c, const g4_kv_layer *L, int slot, int pos, int kv_head)
{
	const g4_kv_pool_desc *kv = &c->kv;
	int			g = L->group;
	int32_t		blk = kv->block_tables[g][(size_t) slot * (size_t) kv->max_blocks_per_seq +
										  (size_t) (pos / G4_KV_BLOCK_TOKENS)];
	size_t		hb = g4_kv_head_block_bytes(kv->dtype, L->head_dim, L->k_eq_v);

	if (blk < 0)
		return NULL;
	return kv->base[g] + (size_t) L->index * kv->layer_stride[g] + (size_t) blk * kv->layer_block_bytes[g] +
		(size_t) kv_head * hb;
}

/* operation entry points, by file (each the CPU reference of the
 * cuda/ file of the same name) */
/* elementwise.c */
int			g4_cpu_embed(g4_backend *be, const g4_weight *table, float scale, float *out);
int			g4_cpu_embed_concat(g4_backend *be, const g4_weight *table, float scale, const int32_t *ids,
								const float *h, int h_dim, int n, float *out);
int			g4_cpu_geglu(g4_backend *be, const float *gu, int n, int ff, float *out);
int			g4_cpu_matmul_geglu(g4_backend *be, const g4_weight *w, const float *x, int n, int ff, float *gu,
								float *out);
int			g4_cpu_gather_logit_rows(g4_backend *be, const float *x, int dim, float *out);
int			g4_cpu_softcap(g4_backend *be, float *x, size_t count, float cap);
/* norm_rope.c */
int			g4_cpu_rmsnorm(g4_backend *be, const float *x, const float *w, int rows, int dim,
						   float eps, float *y);
int			g4_cpu_head_norm_rope(g4_backend *be, float *x, int n, int stride, int hd,
								  const g4_head_run *runs, int n_runs, float eps, const g4_kv_layer *L);
int			g4_cpu_add_rmsnorm(g4_backend *be, float *x, const float *h, const float *w, int n,
							   int dim, float eps, float scale, const float *next_w, float *y);
/* sample.c */
int			g4_cpu_argmax(g4_backend *be, const float *logits, int n, int vocab, int32_t *ids);
/* embed_ops.c */
int			g4_cpu_layernorm(g4_backend *be, const float *x, const float *w, const float *b, int rows,
							 int dim, float eps, float *y);
int			g4_cpu_add_bias(g4_backend *be, float *x, const float *b, int rows, int dim);
int			g4_cpu_add_pos2d(g4_backend *be, float *x, const float *table, const int32_t *pos, int rows,
							 int dim);
/* matmul.c */
int			g4_cpu_matmul(g4_backend *be, const g4_weight *w, const float *x, int n, float *y);
/* kv_store.c */
int			g4_cpu_kv_store(g4_backend *be, const g4_kv_layer *L, const float *k, int k_stride,
							const float *v, int v_stride, int n);
/* attention.c */
int			g4_cpu_attention(g4_backend *be, const g4_kv_layer *L, const float *q, int q_stride,
							 int n, float *out);

/* kv_codec.c: the KV pool's element encodings (kvformat.h) */
void		g4_hadamard(float *x, int n);	/* in place, orthonormal */
void		g4_kv_encode_head(int dtype, int k_eq_v, int head_dim, uint8_t *head_block, int off,
							  const float *k, const float *v);
void		g4_kv_decode_k(int dtype, int k_eq_v, int head_dim, const uint8_t *head_block, int off,
						   float *k);
void		g4_kv_decode_v(int dtype, int k_eq_v, int head_dim, const uint8_t *head_block, int off,
						   float *v);

/* norm_rope.c: RoPE of one vector (rotate-half pairs j, j + hd/2) at a
 * position. */
void		g4_rope_apply(float *x, int hd, int pos, const float *inv_freq);

#endif
