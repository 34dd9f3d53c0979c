/*
 * parity_attention.c — the KV pool's cases: the bytes kv_store writes, and
 * attention over the pool on decode and prefill steps.
 *
 * A pool has two layer groups as Gemma 4's: sliding (group 0: head_dim 256,
 * 8 KV heads) and full (group 1: head_dim 512, one KV head, K derived from
 * V), or small ones of the same structure (16 and 32, 2 and 1) that only
 * the float32 kernel serves.  Every slot's blocks are mapped to shuffled
 * pool blocks.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "parity.h"
#include "util.h"

typedef struct
{
	int			dtype;
	int			hd[2],
				nkv[2],
				keqv[2],
				heads;
	int			layers[2];
	int			max_seqs,
				max_blocks;
	int			n_blocks[2];
	g4_kv_pool_desc cpu,
				gpu;
	int32_t    *tables[2];		/* host */
	float	   *knorm[2],
			   *invf[2];		/* host */
	int			rope_pairs[2];	/* invf's rotated pairs, which lead */
	float	   *dknorm[2],
			   *dinvf[2];		/* device */
	int			filled[2];		/* fill_context done for the group */
} pool_t;

/* One definition of both pools' geometry, for the pool and for the labels. */
static void
pool_geometry(int small, int g, int *hd, int *nkv, int *keqv)
{
	*hd = g == 0 ? (small ? 16 : 256) : (small ? 32 : 512);
	*nkv = g == 0 ? (small ? 2 : 8) : 1;
	*keqv = g == 1;
}

static int
pool_heads(const pool_args *a)
{
	return a->heads ? a->heads : a->small ? 4 : 16;
}

static const char *
dtype_name(int d)
{
	return d == G4_KV_F32 ? "f32" : d == G4_KV_BF16 ? "bf16" : "turboquant_k8v4";
}

static void
pool_make(pool_t *P, const pool_args *a)
{
	int			g;

	memset(P, 0, sizeof(*P));
	P->dtype = a->dtype;
	/* query heads other than the pool's: the KV heads stay */
	P->heads = pool_heads(a);
	for (g = 0; g < 2; g++)
		pool_geometry(a->small, g, &P->hd[g], &P->nkv[g], &P->keqv[g]);
	P->layers[0] = 2;
	P->layers[1] = 2;
	P->max_seqs = 5;
	P->max_blocks = 4096 / 16 + 8;
	for (g = 0; g < 2; g++)
	{
		size_t		lbb = (size_t) P->nkv[g] * g4_kv_head_block_bytes(a->dtype, P->hd[g], P->keqv[g]);
		size_t		bytes,
					i;
		size_t		tb = (size_t) P->max_seqs * P->max_blocks * 4;
		uint8_t    *init;
		int			b;

		P->n_blocks[g] = P->max_seqs * P->max_blocks;
		bytes = lbb * (size_t) P->n_blocks[g] * (size_t) P->layers[g];
		P->cpu.layer_block_bytes[g] = P->gpu.layer_block_bytes[g] = lbb;
		P->cpu.layer_stride[g] = P->gpu.layer_stride[g] = lbb * (size_t) P->n_blocks[g];
		P->cpu.n_blocks[g] = P->gpu.n_blocks[g] = P->n_blocks[g];
		P->cpu.n_layers[g] = P->gpu.n_layers[g] = P->layers[g];
		P->cpu.base[g] = p_malloc(bytes);
		init = P->cpu.base[g];
		/* random bytes are not valid f32/bf16 keys: small values there */
		if (a->dtype != G4_KV_TURBOQUANT_K8V4)
			memset(init, 0x11, bytes);
		else
			for (i = 0; i < bytes; i++)
				init[i] = (uint8_t) rnd();
		P->gpu.base[g] = gpu_copy(init, bytes);
		P->tables[g] = p_malloc(tb);
		/* a shuffled mapping: slot s, block b -> distinct pool blocks */
		for (b = 0; b < P->max_seqs * P->max_blocks; b++)
			P->tables[g][b] = b;
		for (b = P->max_seqs * P->max_blocks - 1; b > 0; b--)
		{
			int			j = (int) (rnd() % (uint64_t) (b + 1));
			int32_t		t = P->tables[g][b];

			P->tables[g][b] = P->tables[g][j];
			P->tables[g][j] = t;
		}
		P->cpu.block_tables[g] = P->tables[g];
		P->gpu.block_tables[g] = gpu_copy(P->tables[g], tb);
		P->knorm[g] = p_malloc((size_t) P->hd[g] * 4);
		P->invf[g] = p_malloc((size_t) P->hd[g] / 2 * 4);
		for (i = 0; i < (size_t) P->hd[g]; i++)
			P->knorm[g][i] = 1.0f + 0.2f * nrm();
		P->rope_pairs[g] = inv_freq_for(P->hd[g], g == 1 && !a->full_rope, g == 1 ? 1e6 : 1e4, P->invf[g]);
		P->dknorm[g] = gpu_copy(P->knorm[g], (size_t) P->hd[g] * 4);
		P->dinvf[g] = gpu_copy(P->invf[g], (size_t) P->hd[g] / 2 * 4);
	}
	P->cpu.dtype = P->gpu.dtype = a->dtype;
	P->cpu.max_seqs = P->gpu.max_seqs = P->max_seqs;
	P->cpu.max_blocks_per_seq = P->gpu.max_blocks_per_seq = P->max_blocks;
	cpu_be->ops->kv_configure(cpu_be, &P->cpu);
	gpu_be->ops->kv_configure(gpu_be, &P->gpu);
}

static g4_kv_layer
layer_of(const pool_t *P, int g, int index, int gpu, float scale)
{
	g4_kv_layer L;

	memset(&L, 0, sizeof(L));
	L.group = g;
	L.index = index;
	L.n_heads = P->heads;
	L.n_kv_heads = P->nkv[g];
	L.head_dim = P->hd[g];
	L.k_eq_v = P->keqv[g];
	L.scale = scale;
	L.k_norm_w = gpu ? P->dknorm[g] : P->knorm[g];
	L.inv_freq = gpu ? P->dinvf[g] : P->invf[g];
	L.rope_pairs = P->rope_pairs[g];
	return L;
}

/* Store random K/V for n tokens (slots/positions in mb) into layer `index`
 * of group g on the CPU and, when `compare`, on the GPU; with `nans`, a NaN
 * in the keys of every fifth token and the values of every seventh (a
 * quantised slot stores a NaN scale for it).  Returns the bytes of the
 * layer that differ.  Called in a loop (fill_context): frees what it
 * makes. */
static size_t
store_both(pool_t *P, meta_buf *mb, int g, int index, float kstd, int exact16, int nans, int compare)
{
	int			n = mb->n;
	int			hd = P->hd[g],
				nkv = P->nkv[g];
	int			stride = nkv * hd * 2 + 8;
	size_t		len = (size_t) n * (size_t) stride;
	float	   *kv = p_malloc(len * 4);
	float	   *dkv;
	g4_kv_layer Lc = layer_of(P, g, index, 0, 1.0f),
				Lg = layer_of(P, g, index, 1, 1.0f);
	g4_step_meta m = meta_of(mb);
	size_t		lbytes = P->cpu.layer_stride[g];
	uint8_t    *got = compare ? p_malloc(lbytes) : NULL;
	size_t		diff = 0,
				i;

	if (exact16)
	{
		/* values exact in f16 and bf16: multiples of 1/16 below 4 */
		for (i = 0; i < len; i++)
			kv[i] = (float) ((int) (rnd() % 129) - 64) / 16.0f;
	}
	else
		fill_normal(kv, len, kstd);
	for (i = 0; nans && i < (size_t) n; i++)
	{
		float	   *row = kv + i * (size_t) stride;

		if (i % 5 == 0)
			row[(i * 13) % (size_t) (nkv * hd)] = NAN;
		if (i % 7 == 3)
			row[nkv * hd + (i * 29) % (size_t) (nkv * hd)] = NAN;
	}
	both_step(&m);
	if (cpu_be->ops->kv_store(cpu_be, &Lc, P->keqv[g] ? NULL : kv, stride, kv + nkv * hd, stride, n) != G4_OK)
		parity_abort("kv_store failed on the CPU");
	if (compare)
	{
		dkv = gpu_copy(kv, len * 4);
		if (gpu_be->ops->kv_store(gpu_be, &Lg, P->keqv[g] ? NULL : dkv, stride, dkv + nkv * hd, stride, n) != G4_OK)
			parity_abort("kv_store failed on the GPU");
		gpu_get(got, P->gpu.base[g] + (size_t) index * lbytes, lbytes);
		for (i = 0; i < lbytes; i++)
			diff += got[i] != P->cpu.base[g][(size_t) index * lbytes + i];
		p_free(dkv);
	}
	p_free(kv);
	p_free(got);
	return diff;
}

/* ---- kv_store: the bytes written --------------------------------------------------- */

/* A pool and 37 tokens of distinct (slot, position) pairs. */
typedef struct
{
	pool_t		P;
	meta_buf	mb;
} store_fixture;

/* A row of stores into layer group each[i]: its pool and what is counted. */
static int
store_label(const parity_row *r, int i, const char *counted, char *label, size_t size)
{
	int			hd,
				nkv,
				keqv;

	pool_geometry(r->a.pool.small, r->each[i], &hd, &nkv, &keqv);
	snprintf(label, size, "%s hd=%d kv_heads=%d%s%s (%s)", dtype_name(r->a.pool.dtype), hd, nkv,
			 keqv ? " k_eq_v" : "", r->a.pool.nans ? " NaN in some keys and values" : "", counted);
	return 1;
}

static int
kv_store_describe(const parity_row *r, int i, char *label, size_t size)
{
	return store_label(r, i, "bytes differing", label, size);
}

static void *
kv_store_setup(const parity_row *r)
{
	store_fixture *f = p_calloc(1, sizeof(*f));
	int			i;

	pool_make(&f->P, &r->a.pool);
	meta_init(&f->mb, 37);
	for (i = 0; i < f->mb.n; i++)
	{
		/* distinct (slot, position) pairs: the order of the writes is free */
		f->mb.slot[i] = i % f->P.max_seqs;
		f->mb.pos[i] = (int32_t) ((i / f->P.max_seqs) * 500 + (int) (rnd() % 500));
	}
	return f;
}

static void
kv_store_run(const parity_row *r, void *fx, int i, double *metric)
{
	store_fixture *f = fx;

	metric[0] = (double) store_both(&f->P, &f->mb, r->each[i], 1, 1.5f, 0, r->a.pool.nans, 1);
}

const parity_kind parity_kv_store = {
	.family = "kv_store",
	.describe = kv_store_describe,
	.setup = kv_store_setup,
	.run = kv_store_run,
};

/* ---- head_norm_rope with the store: one operation against the two ------------------- */

static int
hnr_store_describe(const parity_row *r, int i, char *label, size_t size)
{
	return store_label(r, i, "words of the rows and bytes of the pool differing", label, size);
}

/* A layer's q/k/v rows (g4_layer_head_runs' runs) through head_norm_rope
 * then kv_store into layer 0 of group g, and through head_norm_rope given
 * the layer into layer 1, both layers starting from the same bytes: the
 * GPU's two paths, exact (each against the CPU: the head_norm_rope and
 * kv_store rows). */
static void
hnr_store_run(const parity_row *r, void *fx, int i, double *metric)
{
	store_fixture *f = fx;
	pool_t	   *P = &f->P;
	int			g = r->each[i];
	int			n = f->mb.n,
				hd = P->hd[g],
				nkv = P->nkv[g],
				heads = P->heads;
	int			stride = (heads + (P->keqv[g] ? 1 : 2) * nkv) * hd;
	size_t		len = (size_t) n * (size_t) stride,
				lbytes = P->gpu.layer_stride[g];
	float	   *x = p_malloc(len * 4),
			   *xa = p_malloc(len * 4),
			   *xb = p_malloc(len * 4),
			   *qw = p_malloc((size_t) hd * 4);
	uint8_t    *la = p_malloc(lbytes),
			   *lb = p_malloc(lbytes);
	float	   *dx,
			   *dy,
			   *dqw;
	g4_kv_layer L0 = layer_of(P, g, 0, 1, 1.0f),
				L1 = layer_of(P, g, 1, 1, 1.0f);
	g4_step_meta m = meta_of(&f->mb);
	g4_head_run runs[G4_HEAD_RUNS_MAX];
	int			nr = 0;
	size_t		k;

	fill_normal(x, len, 2.0f);
	fill_normal(qw, (size_t) hd, 1.0f);
	dqw = gpu_copy(qw, (size_t) hd * 4);
	runs[nr++] = (g4_head_run) {0, heads, dqw, P->dinvf[g], 0};
	if (P->keqv[g])
		runs[nr++] = (g4_head_run) {heads * hd, nkv, NULL, NULL, G4_STORE_V};
	else
	{
		runs[nr++] = (g4_head_run) {heads * hd, nkv, P->dknorm[g], P->dinvf[g], G4_STORE_K};
		runs[nr++] = (g4_head_run) {(heads + nkv) * hd, nkv, NULL, NULL, G4_STORE_V};
	}
	gpu_get(la, P->gpu.base[g], lbytes);
	gpu_put(P->gpu.base[g] + lbytes, la, lbytes);
	both_step(&m);
	dx = gpu_copy(x, len * 4);
	dy = gpu_copy(x, len * 4);
	P_RUN(gpu_be, head_norm_rope, dx, n, stride, hd, runs, nr, 1e-6f, NULL);
	if (P->keqv[g])
		P_RUN(gpu_be, kv_store, &L0, NULL, 0, dx + heads * hd, stride, n);
	else
		P_RUN(gpu_be, kv_store, &L0, dx + heads * hd, stride, dx + (heads + nkv) * hd, stride, n);
	P_RUN(gpu_be, head_norm_rope, dy, n, stride, hd, runs, nr, 1e-6f, &L1);
	gpu_get(xa, dx, len * 4);
	gpu_get(xb, dy, len * 4);
	gpu_get(la, P->gpu.base[g], lbytes);
	gpu_get(lb, P->gpu.base[g] + lbytes, lbytes);
	metric[0] = count_differing_words(xa, xb, len);
	for (k = 0; k < lbytes; k++)
		metric[0] += la[k] != lb[k];
	p_free(x);
	p_free(xa);
	p_free(xb);
	p_free(qw);
	p_free(la);
	p_free(lb);
	p_free(dx);
	p_free(dy);
	p_free(dqw);
}

const parity_kind parity_head_norm_rope_store = {
	.family = "kv_store",
	.describe = hnr_store_describe,
	.setup = kv_store_setup,
	.run = hnr_store_run,
};

/* ---- attention --------------------------------------------------------------------- */

/* context lengths of the five slots */
static const int context_len[5] = {1, 37, 1500, 4096, 1100};

/* Fill the first context_len[s] positions of every slot on the CPU pool,
 * copy the pool bytes to the GPU pool (identical attention inputs), in
 * chunks of up to 2,048 tokens (one step's metadata, reused). */
static void
fill_context(pool_t *P, int g, int index, int exact16)
{
	int			s,
				total = 0,
				k = 0;
	meta_buf	mb;

	for (s = 0; s < P->max_seqs; s++)
		total += context_len[s];
	meta_init(&mb, G4_MIN(total, 2048));
	while (k < total)
	{
		int			chunk = G4_MIN(total - k, 2048);
		int			i;

		mb.n = chunk;
		for (i = 0; i < chunk; i++, k++)
		{
			int			kk = k,
						ss = 0;

			while (kk >= context_len[ss])
				kk -= context_len[ss++];
			mb.slot[i] = ss;
			mb.pos[i] = kk;
		}
		store_both(P, &mb, g, index, 1.0f, exact16, 0, 0);
	}
	gpu_put(P->gpu.base[g] + (size_t) index * P->cpu.layer_stride[g],
			P->cpu.base[g] + (size_t) index * P->cpu.layer_stride[g], P->cpu.layer_stride[g]);
}

/* four decodes at contexts 1, 37, 1500, 4096 (one alone: the 4096) */
static void
shape_decode(meta_buf *mb, int g, int window)
{
	static const int ctx[] = {1, 37, 1500, 4096};
	int			i;

	for (i = 0; i < mb->n; i++)
	{
		int			s = mb->n == 1 ? 3 : i % 4;
		int			p = ctx[s] - 1;

		mb->slot[i] = s;
		mb->pos[i] = p;
		mb->hi[g][i] = p + 1;
		mb->lo[g][i] = g == 0 ? G4_MAX(0, p - window + 1) : 0;
	}
}

/* a step of verify shape: 5 tokens of slot 2 (positions 1495..1499: the
 * last at the edge of its context), 8 of slot 4 (1092..1099) and 1 of slot
 * 3 (4095), each seeing the keys up to itself */
static void
shape_verify(meta_buf *mb, int g, int window)
{
	int			i;

	for (i = 0; i < mb->n; i++)
	{
		int			s = i < 5 ? 2 : i < 13 ? 4 : 3;
		int			p = i < 5 ? 1495 + i : i < 13 ? 1092 + (i - 5) : 4095;

		mb->slot[i] = s;
		mb->pos[i] = p;
		mb->hi[g][i] = p + 1;
		mb->lo[g][i] = g == 0 ? G4_MAX(0, p - window + 1) : 0;
	}
}

/* a prefill chunk of slot 4 (positions 900..) with a bidirectional block
 * (rows 20..29 see up to position 930), then two decodes */
static void
shape_prefill(meta_buf *mb, int g, int window)
{
	int			i,
				np = mb->n - 2;

	for (i = 0; i < np; i++)
	{
		int			p = 900 + i;

		mb->slot[i] = 4;
		mb->pos[i] = p;
		mb->hi[g][i] = p + 1;
		mb->lo[g][i] = g == 0 ? G4_MAX(0, p - window + 1) : 0;
		if (i >= 20 && i < 30)
		{
			mb->hi[g][i] = 930;
			mb->lo[g][i] = G4_MIN(mb->lo[g][i], 920);
		}
	}
	for (; i < mb->n; i++)
	{
		int			p = i == np ? 4095 : 1499;

		mb->slot[i] = i == np ? 3 : 2;
		mb->pos[i] = p;
		mb->hi[g][i] = p + 1;
		mb->lo[g][i] = g == 0 ? G4_MAX(0, p - window + 1) : 0;
	}
}

/* a long prefill chunk of slot 3 at positions 1503.. (not a multiple of 16:
 * tiles' keys start and end mid-block) */
static void
shape_prefill_long(meta_buf *mb, int g, int window)
{
	int			i;

	for (i = 0; i < mb->n; i++)
	{
		int			p = 1503 + i;

		mb->slot[i] = 3;
		mb->pos[i] = p;
		mb->hi[g][i] = p + 1;
		mb->lo[g][i] = g == 0 ? G4_MAX(0, p - window + 1) : 0;
	}
}

typedef struct
{
	const char *name;
	void		(*make) (meta_buf *mb, int g, int window);
	int			n[2];			/* tokens, by layer group */
} attn_step;

/* The long prefill: on sliding layers 1,100 tokens, enough
 * 64-token tiles (17 x 8 KV heads) that no range is split on 132 SMs; on
 * full layers 600 (150 tiles of 4 tokens), to keep the CPU's reference
 * short. */
static const attn_step attn_steps[] = {
	[ATT_DECODE_1] = {"decode", shape_decode, {1, 1}},
	[ATT_DECODE_4] = {"decode", shape_decode, {4, 4}},
	[ATT_PREFILL_DECODE] = {"prefill+decode", shape_prefill, {98, 98}},
	[ATT_PREFILL_SHORT] = {"prefill short", shape_prefill, {12, 12}},
	[ATT_PREFILL_LONG] = {"prefill long at 1503", shape_prefill_long, {1100, 600}},
	[ATT_VERIFY] = {"verify", shape_verify, {14, 14}},
};

static int
attention_describe(const parity_row *r, int i, char *label, size_t size)
{
	const pool_args *a = &r->a.pool;
	const attn_step *st = &attn_steps[r->each[i]];
	int			hd,
				nkv,
				keqv;

	pool_geometry(a->small, a->group, &hd, &nkv, &keqv);
	snprintf(label, size, "%s hd=%d gq=%d%s %s n=%d%s%s%s%s%s", dtype_name(a->dtype), hd, pool_heads(a) / nkv,
			 keqv ? " k_eq_v" : "", st->name, st->n[a->group], a->exact16 ? " exact-in" : "",
			 a->full_rope ? " full-rope" : "", a->gemm_scores ? " sliced" : "",
			 a->gemm_keys ? " key-blocks" : "", a->mma_sync ? " mma.sync" : "");
	/* a projection of 256 columns or fewer stays float32 on the device
	 * (nothing to take a copy): attention's check only */
	return pool_heads(a) * hd > 256 ? 2 : 1;
}

/* The pool of the rows that share it; each group's context filled when a
 * row first attends over it. */
static void *
attention_setup(const parity_row *r)
{
	const pool_args *a = &r->a.pool;
	pool_t	   *P = p_calloc(1, sizeof(*P));
	int			g;

	pool_make(P, a);
	if (a->exact16)
		for (g = 0; g < 2; g++)
		{
			int			i;

			/* powers of two and no rotation: K = V·k_norm stays exact */
			for (i = 0; i < P->hd[g]; i++)
				P->knorm[g][i] = (i % 3) ? 1.0f : 0.5f;
			memset(P->invf[g], 0, (size_t) P->hd[g] / 2 * 4);
			P->rope_pairs[g] = 0;
			gpu_put(P->dknorm[g], P->knorm[g], (size_t) P->hd[g] * 4);
			gpu_put(P->dinvf[g], P->invf[g], (size_t) P->hd[g] / 2 * 4);
		}
	return P;
}

/* The row's settings of the prefill kernels into the environment, which
 * the backend reads at every call (NULL: none). */
static void
attention_env(const pool_args *a)
{
	char		v[32];

	unsetenv("G4_ATTN_GEMM_SCORES");
	unsetenv("G4_ATTN_GEMM_KEYS");
	unsetenv("G4_ATTN_PREFILL");
	unsetenv("G4_ATTN_DECODE_FULL");
	if (a && a->mma_sync)
	{
		setenv("G4_ATTN_PREFILL", "mma", 1);
		setenv("G4_ATTN_DECODE_FULL", "mma", 1);
	}
	if (a && a->gemm_scores)
	{
		snprintf(v, sizeof(v), "%d", a->gemm_scores);
		setenv("G4_ATTN_GEMM_SCORES", v, 1);
	}
	if (a && a->gemm_keys)
	{
		snprintf(v, sizeof(v), "%d", a->gemm_keys);
		setenv("G4_ATTN_GEMM_KEYS", v, 1);
	}
}

/* metric 0: max |gpu - cpu| relative to max |cpu| of the output; 1: the
 * outputs of an int4 matmul over the GPU's output (as the o projection
 * follows attention; on the warpgroup-MMA kernel, or the mma.sync gemm,
 * at every row count: a path that reads bf16) that differ between its
 * first call, which takes the bf16 copy the attention kernels write
 * (matmul_input.cu), and its second, which converts */
static void
attention_run(const parity_row *r, void *fx, int i, double *metric)
{
	const pool_args *a = &r->a.pool;
	const attn_step *st = &attn_steps[r->each[i]];
	pool_t	   *P = fx;
	int			g = a->group,
				n = st->n[g];
	int			hd = P->hd[g];
	int			q_stride = P->heads * hd + 24;
	size_t		qlen = (size_t) n * (size_t) q_stride;
	size_t		olen = (size_t) n * (size_t) P->heads * (size_t) hd;
	size_t		ny = (size_t) n * 64;
	float	   *q = p_malloc(qlen * 4),
			   *oc = p_malloc(olen * 4),
			   *og = p_malloc(olen * 4),
			   *y = p_malloc(ny * 4),
			   *y2 = p_malloc(ny * 4);
	float	   *dq,
			   *dout,
			   *dy,
			   *dy2;
	g4_host_weight hw;
	g4_weight  *wo;
	meta_buf	mb;
	g4_step_meta m;
	float		scale = a->exact16 ? 0.125f : 1.0f;
	g4_kv_layer Lc,
				Lg;
	size_t		k;
	double		vmax = 0.0,
				dmax = 0.0;

	if (!P->filled[g])
	{
		fill_context(P, g, 0, a->exact16);
		P->filled[g] = 1;
	}
	Lc = layer_of(P, g, 0, 0, scale);
	Lg = layer_of(P, g, 0, 1, scale);
	meta_init(&mb, n);
	st->make(&mb, g, 1024);
	m = meta_of(&mb);
	both_step(&m);
	if (a->exact16)
		for (k = 0; k < qlen; k++)
			q[k] = (float) ((int) (rnd() % 33) - 16) / 8.0f;
	else
		fill_normal(q, qlen, 1.0f);
	dq = gpu_copy(q, qlen * 4);
	dout = gpu_alloc(olen * 4);
	gpu_be->ops->fill(gpu_be, dout, 0xff, olen * 4);
	/* the projection's weight and outputs made before the attention: any
	 * write to the device between the two ends the copy */
	host_weight_make(&hw, G4_W_I4G32, 64, (int64_t) P->heads * hd);
	wo = p_weight(gpu_be, &hw, 1);
	dy = gpu_alloc(ny * 4);
	dy2 = gpu_alloc(ny * 4);
	P_RUN(cpu_be, attention, &Lc, q, q_stride, n, oc);
	attention_env(a);
	P_RUN(gpu_be, attention, &Lg, dq, q_stride, n, dout);
	attention_env(NULL);
	matmul_force("wgmma");
	P_RUN(gpu_be, matmul, wo, dout, n, dy);
	P_RUN(gpu_be, matmul, wo, dout, n, dy2);
	matmul_force(matmul_initial_force());
	gpu_get(og, dout, olen * 4);
	gpu_get(y, dy, ny * 4);
	gpu_get(y2, dy2, ny * 4);
	metric[1] = count_differing_words(y, y2, ny);
	for (k = 0; k < olen; k++)
	{
		double		d = fabs((double) og[k] - (double) oc[k]);

		if (d > dmax || d != d)
			dmax = d;
		if (fabs((double) oc[k]) > vmax)
			vmax = fabs((double) oc[k]);
	}
	metric[0] = dmax / (vmax > 0 ? vmax : 1.0);
}

/* a row that failed midway may have left the matmul's path forced, or the
 * scores budget set */
static void
attention_teardown(void *fx)
{
	(void) fx;
	matmul_force(matmul_initial_force());
	attention_env(NULL);
}

/* one kind per family, so that each can be run alone (a name each) */
#define ATTENTION_KIND(family_) { \
	.family = family_, \
	.describe = attention_describe, \
	.setup = attention_setup, \
	.teardown = attention_teardown, \
	.run = attention_run, \
}

const parity_kind parity_attention_float32 = ATTENTION_KIND("attention_float32"),
			parity_attention_gemma4 = ATTENTION_KIND("attention_gemma4"),
			parity_attention_exact = ATTENTION_KIND("attention_exact"),
			parity_attention_decode = ATTENTION_KIND("attention_decode");
