/*
 * test_gpu_ops.c — every operation of the CUDA backend against the CPU
 * backend (the reference) on fresh random inputs of several shapes.
 *
 * Each check prints one line "PARITY op | case | metric | bound | ok" and
 * the bound it must meet, with the reason for that bound:
 *  - exact: integer / copy / encode operations must agree bit for bit
 *    (embedding rows, the draft model's input rows, logit-row gathering,
 *    the KV encodings, the sampler's and argmax's choice), and so must a
 *    matmul repeated on the same inputs;
 *  - float32-class: float32 arithmetic in another order (norms, RoPE with
 *    sincosf's 2-ulp error, float32 and split-bf16 matmuls): max |gpu - cpu|
 *    relative to the magnitude of the terms involved, 3e-5 at most;
 *  - bf16-class: the prefill / batched matmul rounds activations (and the
 *    int4 weights with their folded scale) to bf16, 2^-9 relative each, so
 *    |error| <= 2^-8 · Σ|w·x| (bound 8e-3 of that sum);
 *  - f16 attention: q, k, v and the probabilities rounded to f16 (2^-11
 *    relative); with f16-exact inputs only P's rounding remains (bound 2e-3
 *    of max|v|), on random Gemma-like inputs (scale 1, unit-RMS q and k) the
 *    score error is ~2^-11·sqrt(2·hd) standard deviations: bound 0.1 of
 *    max|v| (a figure; the exact-input case checks the logic).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "config.h"
#include "harness.h"
#include "media.h"
#include "model.h"
#include "quant.h"
#include "sampler.h"
#include "test.h"
#include "util.h"
#include "xorshift.h"

/* ---- backends, random numbers, reporting ------------------------------------ */

static g4_backend *cpu_be;
static g4_backend *gpu_be;

static int
backends(void)
{
	g4_err		err;

	if (!g4_backend_cuda_available())
		return 0;
	if (!cpu_be && g4_backend_cpu_create(0, &cpu_be, &err) != G4_OK)
		return 0;
	if (!gpu_be && g4_backend_cuda_create(0, &gpu_be, &err) != G4_OK)
	{
		printf("    cuda backend: %s\n", err.msg);
		return 0;
	}
	return 1;
}

#define NEED_GPU() do { if (!backends()) G4_SKIP("no CUDA device"); } while (0)

static uint64_t rs = 0x9e3779b97f4a7c15ull;

static void
reseed(uint64_t s)
{
	rs = s * 0x2545f4914f6cdd1dull + 1;
}

static uint64_t
rnd(void)
{
	return h_xorshift64(&rs);
}

static double
unif(void)
{
	return (double) (rnd() >> 11) * (1.0 / 9007199254740992.0);
}

static float
nrm(void)
{
	double		u1 = unif() + 1e-12,
				u2 = unif();

	return (float) (sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static void
fill_normal(float *x, size_t n, float std)
{
	size_t		i;

	for (i = 0; i < n; i++)
		x[i] = nrm() * std;
}

static int	n_checks,
			n_failed;

static void
report(const char *op, const char *label, double metric, double bound)
{
	int			ok = metric <= bound;	/* NaN fails */

	n_checks++;
	if (!ok)
		n_failed++;
	printf("PARITY %-18s | %-44s | %10.3e | %8.1e | %s\n", op, label, metric, bound, ok ? "ok" : "FAIL");
	if (!ok)
		g4_test_fail(__FILE__, __LINE__, "%s %s: %.3e exceeds %.1e", op, label, metric, bound);
}

static void *
gpu_alloc(size_t bytes)
{
	void	   *p = gpu_be->ops->alloc(gpu_be, bytes);

	if (!p)
	{
		fprintf(stderr, "GPU allocation of %zu bytes failed\n", bytes);
		exit(2);
	}
	return p;
}

static void *
gpu_copy(const void *h, size_t bytes)
{
	void	   *p = gpu_alloc(bytes);

	gpu_be->ops->upload(gpu_be, p, h, bytes);
	return p;
}

static void
gpu_get(void *h, const void *d, size_t bytes)
{
	g4_err		err;

	if (gpu_be->ops->download(gpu_be, h, d, bytes) != G4_OK || gpu_be->ops->sync(gpu_be, &err) != G4_OK)
	{
		g4_backend *be = gpu_be;

		be->ops->sync(be, &err);
		fprintf(stderr, "GPU failure: %s\n", err.msg);
		exit(2);
	}
}

/* Both backends see the same step metadata. */
static void
both_step(const g4_step_meta *m)
{
	if (cpu_be->ops->step_begin(cpu_be, m) != G4_OK || gpu_be->ops->step_begin(gpu_be, m) != G4_OK)
	{
		fprintf(stderr, "step_begin failed\n");
		exit(2);
	}
}

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

static void
meta_init(meta_buf *b, int n)
{
	int			g;

	memset(b, 0, sizeof(*b));
	b->n = n;
	b->token = calloc((size_t) n, 4);
	b->pos = calloc((size_t) n, 4);
	b->slot = calloc((size_t) n, 4);
	b->logit_rows = calloc((size_t) n, 4);
	for (g = 0; g < 2; g++)
	{
		b->lo[g] = calloc((size_t) n, 4);
		b->hi[g] = calloc((size_t) n, 4);
	}
}

static void
meta_free(meta_buf *b)
{
	int			g;

	free(b->token);
	free(b->pos);
	free(b->slot);
	free(b->logit_rows);
	for (g = 0; g < 2; g++)
	{
		free(b->lo[g]);
		free(b->hi[g]);
	}
}

static g4_step_meta
meta_of(const meta_buf *b)
{
	g4_step_meta m;
	int			g;

	memset(&m, 0, sizeof(m));
	m.n_tokens = b->n;
	m.token = b->token;
	m.pos = b->pos;
	m.slot = b->slot;
	for (g = 0; g < 2; g++)
	{
		m.lo[g] = b->lo[g];
		m.hi[g] = b->hi[g];
	}
	m.n_logits = b->n_logits;
	m.logit_rows = b->logit_rows;
	return m;
}

/* ---- random weights in every format ------------------------------------------- */

static void
put_f16(uint8_t *p, float v)
{
	uint16_t	h = g4_f32_to_f16(v);

	memcpy(p, &h, 2);
}

typedef struct
{
	g4_host_weight hw;
	void	   *data;
	uint16_t   *scales;
} host_w;

static void
host_w_make(host_w *w, int fmt, int64_t out, int64_t in)
{
	size_t		row = g4_wfmt_row_bytes(fmt, in);
	size_t		bytes = row * (size_t) out;
	uint8_t    *d = malloc(bytes);
	int64_t		r,
				i;
	float		std = 1.0f / sqrtf((float) in);

	memset(w, 0, sizeof(*w));
	for (i = 0; i < (int64_t) bytes; i++)
		d[i] = (uint8_t) rnd();
	switch (fmt)
	{
		case G4_W_F32:
			for (i = 0; i < out * in; i++)
				((float *) d)[i] = nrm() * std;
			break;
		case G4_W_F16:
			for (i = 0; i < out * in; i++)
				put_f16(d + 2 * i, nrm() * std);
			break;
		case G4_W_BF16:
			for (i = 0; i < out * in; i++)
				((uint16_t *) d)[i] = g4_f32_to_bf16(nrm() * std);
			break;
		case G4_W_I4G32:
			w->scales = malloc((size_t) out * (size_t) (in / 32) * 2);
			for (i = 0; i < out * (in / 32); i++)
				w->scales[i] = g4_f32_to_bf16(std / 4.6f * (float) (0.5 + unif()));
			break;
		default:
			{
				int			bs = g4_wfmt_block(fmt);
				size_t		bb = row / (size_t) (in / bs);

				for (r = 0; r < out; r++)
					for (i = 0; i < in / bs; i++)
					{
						uint8_t    *b = d + (size_t) r * row + (size_t) i * bb;

						/* sane scales: the other bytes stay random */
						if (fmt == G4_W_Q6_K)
							put_f16(b + 208, std / 32.0f * (float) (0.5 + unif()));
						else if (fmt == G4_W_Q4_K || fmt == G4_W_Q5_K)
						{
							put_f16(b, std / 64.0f * (float) (0.5 + unif()));
							put_f16(b + 2, std / 64.0f * (float) (0.5 + unif()));
						}
						else
						{
							put_f16(b, std / 8.0f * (float) (0.5 + unif()));
							if (fmt == G4_W_Q4_1 || fmt == G4_W_Q5_1)
								put_f16(b + 2, -std * (float) unif());
						}
					}
			}
	}
	w->data = d;
	w->hw.fmt = fmt;
	w->hw.out = out;
	w->hw.in = in;
	w->hw.data = d;
	w->hw.scales = w->scales;
}

static void
host_w_free(host_w *w)
{
	free(w->data);
	free(w->scales);
}

/* ---- matmul ----------------------------------------------------------------------- */

/* A weight (the parts fused) on both backends, with |W| on the CPU for the
 * error measure. */
typedef struct
{
	int			fmt;
	int			n_parts;
	int64_t		out;
	int64_t		in;
	host_w		hw[4];
	float	   *absw;
	g4_weight  *wc,
			   *wg,
			   *wa;
} mm_weight;

static void
mm_weight_make(mm_weight *m, int fmt, int n_parts, const int64_t *outs, int64_t in)
{
	g4_host_weight parts[4],
				abs_part;
	int64_t		r0 = 0;
	int			p;
	g4_err		err;

	memset(m, 0, sizeof(*m));
	m->fmt = fmt;
	m->n_parts = n_parts;
	m->in = in;
	for (p = 0; p < n_parts; p++)
	{
		host_w_make(&m->hw[p], fmt, outs[p], in);
		parts[p] = m->hw[p].hw;
		m->out += outs[p];
	}
	m->absw = malloc((size_t) m->out * (size_t) in * 4);
	/* Σ|w·x| per output, through the CPU backend on |W| and |x| */
	for (p = 0; p < n_parts; p++)
	{
		int64_t		r;

		for (r = 0; r < outs[p]; r++)
		{
			float	   *row = m->absw + (size_t) (r0 + r) * (size_t) in;
			int64_t		k;

			g4_dequant_row(fmt, (const uint8_t *) parts[p].data + (size_t) r * g4_wfmt_row_bytes(fmt, in),
						   parts[p].scales ? parts[p].scales + (size_t) r * (size_t) (in / 32) : NULL, in, row);
			for (k = 0; k < in; k++)
				row[k] = fabsf(row[k]);
		}
		r0 += outs[p];
	}
	abs_part.fmt = G4_W_F32;
	abs_part.out = m->out;
	abs_part.in = in;
	abs_part.data = m->absw;
	abs_part.scales = NULL;
	CHECK_OK(cpu_be->ops->weight_create(cpu_be, parts, n_parts, &m->wc, &err), &err);
	CHECK_OK(cpu_be->ops->weight_create(cpu_be, &abs_part, 1, &m->wa, &err), &err);
	CHECK_OK(gpu_be->ops->weight_create(gpu_be, parts, n_parts, &m->wg, &err), &err);
}

static void
mm_weight_free(mm_weight *m)
{
	int			p;

	gpu_be->ops->weight_destroy(gpu_be, m->wg);
	cpu_be->ops->weight_destroy(cpu_be, m->wc);
	cpu_be->ops->weight_destroy(cpu_be, m->wa);
	for (p = 0; p < m->n_parts; p++)
		host_w_free(&m->hw[p]);
	free(m->absw);
}

/* *worst: the worst error of the GPU's product yg = x·Wᵀ (n rows) relative
 * to Σ|w·x|, against the CPU backend's. */
static void
mm_error(const mm_weight *m, const float *x, int n, const float *yg, double *worst)
{
	size_t		ny = (size_t) n * (size_t) m->out;
	float	   *ax = malloc((size_t) n * (size_t) m->in * 4),
			   *yc = malloc(ny * 4),
			   *ya = malloc(ny * 4);
	size_t		i;
	g4_err		err;

	*worst = NAN;				/* fails the report if a CPU product fails */
	for (i = 0; i < (size_t) n * (size_t) m->in; i++)
		ax[i] = fabsf(x[i]);
	CHECK_OK(cpu_be->ops->matmul(cpu_be, m->wc, x, n, yc), &err);
	CHECK_OK(cpu_be->ops->matmul(cpu_be, m->wa, ax, n, ya), &err);
	*worst = 0.0;
	for (i = 0; i < ny; i++)
	{
		double		e = fabs((double) yg[i] - (double) yc[i]) / ((double) ya[i] + 1e-30);

		if (e > *worst || e != e)
			*worst = e;
	}
	free(ax);
	free(yc);
	free(ya);
}

/* One weight (the parts fused) against the CPU backend for each row count of
 * ns, fresh activations each time; then the same product again on the GPU,
 * which must be bit for bit the first (deterministic reductions). */
static void
matmul_cases(int fmt, int n_parts, const int64_t *outs, int64_t in, const int *ns, int count)
{
	mm_weight	m;
	int			c;
	g4_err		err;

	mm_weight_make(&m, fmt, n_parts, outs, in);
	for (c = 0; c < count; c++)
	{
		int			n = ns[c];
		size_t		ny = (size_t) n * (size_t) m.out;
		float	   *x = malloc((size_t) n * (size_t) in * 4),
				   *yg = malloc(ny * 4),
				   *yg2 = malloc(ny * 4);
		float	   *dx,
				   *dy,
				   *dy2;
		double		worst;
		size_t		i,
					differ = 0;
		char		label[128];
		int			bf16_class = (fmt == G4_W_I4G32 || fmt == G4_W_BF16) && in > 256 && n > 16;

		fill_normal(x, (size_t) n * (size_t) in, 1.0f);
		dx = gpu_copy(x, (size_t) n * (size_t) in * 4);
		dy = gpu_alloc(ny * 4);
		dy2 = gpu_alloc(ny * 4);
		/* NaN: every element must be written */
		gpu_be->ops->fill(gpu_be, dy, 0xff, ny * 4);
		gpu_be->ops->fill(gpu_be, dy2, 0xff, ny * 4);
		CHECK_OK(gpu_be->ops->matmul(gpu_be, m.wg, dx, n, dy), &err);
		CHECK_OK(gpu_be->ops->matmul(gpu_be, m.wg, dx, n, dy2), &err);
		gpu_get(yg, dy, ny * 4);
		gpu_get(yg2, dy2, ny * 4);
		mm_error(&m, x, n, yg, &worst);
		for (i = 0; i < ny; i++)
			if (memcmp(&yg[i], &yg2[i], 4) != 0)
				differ++;
		snprintf(label, sizeof(label), "%s n=%d out=%lld%s in=%lld%s", g4_wfmt_name(fmt), n, (long long) m.out,
				 n_parts > 1 ? " (fused)" : "", (long long) in, getenv("G4_MATMUL_I4") ? " (forced path)" : "");
		report("matmul", label, worst, bf16_class ? 8e-3 : 3e-5);
		/* exact: the count of outputs that differ between the two calls */
		report("matmul repeat", label, (double) differ, 0.0);
		gpu_be->ops->free(gpu_be, dx);
		gpu_be->ops->free(gpu_be, dy);
		gpu_be->ops->free(gpu_be, dy2);
		free(x);
		free(yg);
		free(yg2);
	}
	mm_weight_free(&m);
}

static void
matmul_case(int fmt, int n_parts, const int64_t *outs, int64_t in, int n)
{
	matmul_cases(fmt, n_parts, outs, in, &n, 1);
}

/* 1 to 16 rows run the int4 GEMV (gemv_w4.cu: 1, 2 or 4 n8 tiles of 4 rows
 * each), then the int4 gemm (matmul.cuh: 32, 64 or 128 token rows per block,
 * K split over blocks) and from 160 rows the bf16 dequantisation + cuBLASLt
 * (matmul_lt.cu); the choice is g4c_matmul_i4's.  The GEMV row counts fill
 * each tile count partly and wholly. */
G4_TEST(gpu_matmul_int4)
{
	static const int ns[] = {1, 2, 3, 4, 5, 8, 11, 12, 16, 17, 24, 40, 64, 100, 300};
	static const int gemv_ns[] = {1, 2, 3, 4, 5, 8, 11, 12, 16};
	size_t		i;

	NEED_GPU();
	reseed(1);
	for (i = 0; i < G4_ARRAY_LEN(ns); i++)
	{
		int64_t		o1[] = {4096};
		int64_t		o3[] = {512, 256, 256};
		int64_t		odd[] = {1000};
		int64_t		half[] = {520, 250};	/* in % 64 == 32: a half-padded last k-tile */

		matmul_case(G4_W_I4G32, 1, o1, 3840, ns[i]);
		matmul_case(G4_W_I4G32, 3, o3, 640, ns[i]);
		matmul_case(G4_W_I4G32, 1, odd, 1024, ns[i]);
		matmul_case(G4_W_I4G32, 2, half, 672, ns[i]);
	}
	{
		int64_t		down[] = {3840};
		int64_t		small[] = {64, 32, 32};

		matmul_case(G4_W_I4G32, 1, down, 15360, 1);
		matmul_case(G4_W_I4G32, 1, down, 15360, 16);
		matmul_case(G4_W_I4G32, 1, down, 15360, 200);
		matmul_case(G4_W_I4G32, 3, small, 64, 7);
		matmul_case(G4_W_I4G32, 3, small, 64, 139);
	}
	/* The 12B decode shapes at 1 to 16 rows (the GEMV, K split over blocks)
	 * and 17 to 256 (each block size of the gemm, K split), and a wide one,
	 * its rows and columns both padded, whose K stays unsplit up to 8 rows
	 * (282 unit groups: two splits are more blocks than the H200 holds at
	 * once) and for which no split is all resident at once at 9 to 16 rows
	 * (the GEMV's other split rule).  One weight each, the row counts in
	 * turn: the gate_up case's |W| copy (~470 MB) is built once. */
	{
		static const int decode_ns[] = {1, 2, 3, 4, 5, 8, 11, 12, 16, 17, 32, 33, 64, 65, 128, 256};
		static const int gu_ns[] = {1, 2, 3, 4, 5, 8, 11, 12, 16, 64, 256};
		int64_t		qkv[] = {4096, 1024, 1024};
		int64_t		gate_up[] = {15360, 15360};
		int64_t		down[] = {3840};
		int64_t		o[] = {3840};
		int64_t		wide[] = {36008};

		matmul_cases(G4_W_I4G32, 3, qkv, 3840, decode_ns, G4_ARRAY_LEN(decode_ns));
		matmul_cases(G4_W_I4G32, 2, gate_up, 3840, gu_ns, G4_ARRAY_LEN(gu_ns));
		matmul_cases(G4_W_I4G32, 1, down, 15360, decode_ns, G4_ARRAY_LEN(decode_ns));
		matmul_cases(G4_W_I4G32, 1, o, 4096, decode_ns, G4_ARRAY_LEN(decode_ns));
		matmul_cases(G4_W_I4G32, 1, wide, 672, gemv_ns, G4_ARRAY_LEN(gemv_ns));
	}
	/* The cuBLASLt path: by row count (520), and forced (G4_MATMUL_I4=lt)
	 * at counts the gemm serves, incl. a half-padded last k-tile */
	{
		static const int lt_ns[] = {17, 100, 300};
		int64_t		o1[] = {4096};
		int64_t		odd[] = {1000};
		int64_t		half[] = {520, 250};
		int64_t		down[] = {3840};

		matmul_case(G4_W_I4G32, 1, odd, 1024, 520);
		setenv("G4_MATMUL_I4", "lt", 1);
		matmul_cases(G4_W_I4G32, 1, o1, 3840, lt_ns, G4_ARRAY_LEN(lt_ns));
		matmul_cases(G4_W_I4G32, 2, half, 672, lt_ns, G4_ARRAY_LEN(lt_ns));
		matmul_case(G4_W_I4G32, 1, down, 15360, 200);
		unsetenv("G4_MATMUL_I4");
	}
}

/* The cuBLASLt path dequantises a weight once and keeps the last two in
 * slots (matmul_lt.cu), as the MLP's row slices call gate_up and down in
 * turn: three weights called A B A B C A B C (hits, then each slot refilled
 * in turn), then after a step_begin (which empties the slots) C A, each call
 * within the bf16 bound of the CPU's product and bit for bit its weight's
 * first product. */
G4_TEST(gpu_matmul_int4_dequantised_once)
{
	static const int order[] = {0, 1, 0, 1, 2, 0, 1, 2, -1, 2, 0};	/* -1: a step begins */
	int64_t		oa[] = {1000};
	int64_t		ob[] = {520, 250};	/* in % 64 == 32: a half-padded last k-tile */
	int64_t		oc[] = {4096};
	mm_weight	m[3];
	float	   *x[3],
			   *first[3];
	float	   *dx[3];
	const int	n = 200;
	size_t		k;
	int			j,
				calls = 0,
				stepped = 0;
	g4_err		err;

	NEED_GPU();
	reseed(13);
	mm_weight_make(&m[0], G4_W_I4G32, 1, oa, 1024);
	mm_weight_make(&m[1], G4_W_I4G32, 2, ob, 672);
	mm_weight_make(&m[2], G4_W_I4G32, 1, oc, 3840);
	for (j = 0; j < 3; j++)
	{
		x[j] = malloc((size_t) n * (size_t) m[j].in * 4);
		first[j] = NULL;
		fill_normal(x[j], (size_t) n * (size_t) m[j].in, 1.0f);
		dx[j] = gpu_copy(x[j], (size_t) n * (size_t) m[j].in * 4);
	}
	for (k = 0; k < G4_ARRAY_LEN(order); k++)
	{
		mm_weight  *w;
		size_t		ny;
		float	   *yg,
				   *dy;
		char		label[128];
		double		worst;

		if (order[k] < 0)
		{
			meta_buf	mb;
			g4_step_meta sm;

			meta_init(&mb, 1);
			sm = meta_of(&mb);
			both_step(&sm);
			meta_free(&mb);
			stepped = 1;
			continue;
		}
		w = &m[order[k]];
		ny = (size_t) n * (size_t) w->out;
		yg = malloc(ny * 4);
		dy = gpu_alloc(ny * 4);
		gpu_be->ops->fill(gpu_be, dy, 0xff, ny * 4);
		CHECK_OK(gpu_be->ops->matmul(gpu_be, w->wg, dx[order[k]], n, dy), &err);
		gpu_get(yg, dy, ny * 4);
		gpu_be->ops->free(gpu_be, dy);
		snprintf(label, sizeof(label), "call %d%s: weight %c n=%d out=%lld in=%lld", ++calls,
				 stepped ? " (after step_begin)" : "", 'A' + order[k], n, (long long) w->out, (long long) w->in);
		mm_error(w, x[order[k]], n, yg, &worst);
		report("matmul reused", label, worst, 8e-3);
		if (!first[order[k]])
			first[order[k]] = yg;
		else
		{
			size_t		i,
						differ = 0;

			for (i = 0; i < ny; i++)
				if (memcmp(&yg[i], &first[order[k]][i], 4) != 0)
					differ++;
			/* exact: the count of outputs that differ from the first call */
			report("matmul reused same", label, (double) differ, 0.0);
			free(yg);
		}
	}
	for (j = 0; j < 3; j++)
	{
		gpu_be->ops->free(gpu_be, dx[j]);
		free(x[j]);
		free(first[j]);
		mm_weight_free(&m[j]);
	}
}

G4_TEST(gpu_matmul_bf16)
{
	static const int ns[] = {1, 5, 16, 40, 64, 130};
	size_t		i;

	NEED_GPU();
	reseed(2);
	for (i = 0; i < G4_ARRAY_LEN(ns); i++)
	{
		int64_t		head[] = {9000};
		int64_t		two[] = {700, 300};

		matmul_case(G4_W_BF16, 1, head, 3840, ns[i]);
		matmul_case(G4_W_BF16, 2, two, 640, ns[i]);
	}
	{
		int64_t		tiny[] = {16384};

		matmul_case(G4_W_BF16, 1, tiny, 64, 1);
		matmul_case(G4_W_BF16, 1, tiny, 64, 9);
	}
}

G4_TEST(gpu_matmul_float_and_gguf)
{
	static const int fmts[] = {G4_W_F32, G4_W_F16, G4_W_Q8_0, G4_W_Q4_0, G4_W_Q4_K, G4_W_Q5_K, G4_W_Q6_K};
	size_t		i;

	NEED_GPU();
	reseed(3);
	for (i = 0; i < G4_ARRAY_LEN(fmts); i++)
	{
		int64_t		o[] = {300};

		matmul_case(fmts[i], 1, o, 512, 1);
		matmul_case(fmts[i], 1, o, 512, 13);
		matmul_case(fmts[i], 1, o, 512, 70);
	}
}

/* ---- embedding ------------------------------------------------------------------- */

static void
embed_case(int fmt, int64_t vocab, int64_t dim, int n)
{
	host_w		hw;
	g4_weight  *wc,
			   *wg;
	meta_buf	mb;
	g4_step_meta m;
	g4_err		err;
	float	   *oc = malloc((size_t) n * (size_t) dim * 4);
	float	   *og = malloc((size_t) n * (size_t) dim * 4);
	float	   *d;
	int			i;
	size_t		diff = 0;
	char		label[96];

	host_w_make(&hw, fmt, vocab, dim);
	meta_init(&mb, n);
	for (i = 0; i < n; i++)
		mb.token[i] = (i % 5 == 3) ? -1 : (int32_t) (rnd() % (uint64_t) vocab);
	mb.token[0] = (int32_t) vocab - 1;
	m = meta_of(&mb);
	both_step(&m);
	CHECK_OK(cpu_be->ops->weight_create(cpu_be, &hw.hw, 1, &wc, &err), &err);
	CHECK_OK(gpu_be->ops->weight_create(gpu_be, &hw.hw, 1, &wg, &err), &err);
	/* rows with token -1 are the caller's: both keep the sentinel */
	memset(oc, 0x7f, (size_t) n * (size_t) dim * 4);
	d = gpu_copy(oc, (size_t) n * (size_t) dim * 4);
	CHECK_OK(cpu_be->ops->embed(cpu_be, wc, 7.25f, oc), &err);
	CHECK_OK(gpu_be->ops->embed(gpu_be, wg, 7.25f, d), &err);
	gpu_get(og, d, (size_t) n * (size_t) dim * 4);
	for (i = 0; i < n * (int) dim; i++)
		diff += memcmp(&oc[i], &og[i], 4) != 0;
	snprintf(label, sizeof(label), "%s vocab=%lld dim=%lld n=%d (elements differing)", g4_wfmt_name(fmt),
			 (long long) vocab, (long long) dim, n);
	report("embed", label, (double) diff, 0);
	gpu_be->ops->free(gpu_be, d);
	gpu_be->ops->weight_destroy(gpu_be, wg);
	cpu_be->ops->weight_destroy(cpu_be, wc);
	host_w_free(&hw);
	meta_free(&mb);
	free(oc);
	free(og);
}

G4_TEST(gpu_embed)
{
	NEED_GPU();
	reseed(4);
	embed_case(G4_W_BF16, 5000, 3840, 17);
	embed_case(G4_W_BF16, 16384, 64, 9);
	embed_case(G4_W_I4G32, 1000, 640, 6);
	embed_case(G4_W_F32, 300, 64, 4);
	embed_case(G4_W_Q8_0, 1000, 640, 5);
	embed_case(G4_W_Q6_K, 700, 512, 3);
}

/* The draft model's input rows: embedding rows by device ids beside h rows. */
static void
embed_concat_case(int fmt, int64_t vocab, int64_t dim, int h_dim, int n)
{
	host_w		hw;
	g4_weight  *wc,
			   *wg;
	g4_err		err;
	size_t		width = (size_t) dim + (size_t) h_dim;
	int32_t    *ids = malloc((size_t) n * 4);
	float	   *h = malloc((size_t) n * (size_t) h_dim * 4);
	float	   *oc = malloc((size_t) n * width * 4);
	float	   *og = malloc((size_t) n * width * 4);
	int32_t    *dids;
	float	   *dh,
			   *d;
	size_t		i,
				diff = 0;
	char		label[96];

	host_w_make(&hw, fmt, vocab, dim);
	for (i = 0; i < (size_t) n; i++)
		ids[i] = (int32_t) (rnd() % (uint64_t) vocab);
	ids[0] = (int32_t) vocab - 1;
	fill_normal(h, (size_t) n * (size_t) h_dim, 3.0f);
	CHECK_OK(cpu_be->ops->weight_create(cpu_be, &hw.hw, 1, &wc, &err), &err);
	CHECK_OK(gpu_be->ops->weight_create(gpu_be, &hw.hw, 1, &wg, &err), &err);
	dids = gpu_copy(ids, (size_t) n * 4);
	dh = gpu_copy(h, (size_t) n * (size_t) h_dim * 4);
	d = gpu_alloc((size_t) n * width * 4);
	CHECK_OK(cpu_be->ops->embed_concat(cpu_be, wc, 7.25f, ids, h, h_dim, n, oc), &err);
	CHECK_OK(gpu_be->ops->embed_concat(gpu_be, wg, 7.25f, dids, dh, h_dim, n, d), &err);
	gpu_get(og, d, (size_t) n * width * 4);
	for (i = 0; i < (size_t) n * width; i++)
		diff += memcmp(&oc[i], &og[i], 4) != 0;
	snprintf(label, sizeof(label), "%s vocab=%lld dim=%lld+%d n=%d (elements differing)", g4_wfmt_name(fmt),
			 (long long) vocab, (long long) dim, h_dim, n);
	report("embed_concat", label, (double) diff, 0);
	gpu_be->ops->free(gpu_be, d);
	gpu_be->ops->free(gpu_be, dh);
	gpu_be->ops->free(gpu_be, dids);
	gpu_be->ops->weight_destroy(gpu_be, wg);
	cpu_be->ops->weight_destroy(cpu_be, wc);
	host_w_free(&hw);
	free(ids);
	free(h);
	free(oc);
	free(og);
}

/* The greedy choice left on the device, on random rows and on the rows that
 * test its rules: ties (the first wins), NaN at 0 (kept), NaN elsewhere
 * (never), all -inf (index 0). */
static void
argmax_case(int n, int vocab)
{
	g4_err		err;
	size_t		len = (size_t) n * (size_t) vocab;
	float	   *x = malloc(len * 4);
	int32_t    *ic = malloc((size_t) n * 4),
			   *ig = malloc((size_t) n * 4);
	float	   *dx;
	int32_t    *dids;
	int			r,
				i,
				diff = 0;
	char		label[96];

	fill_normal(x, len, 4.0f);
	for (r = 0; r < n; r++)
	{
		float	   *row = x + (size_t) r * (size_t) vocab;

		switch (r % 5)
		{
			case 1:				/* a tie of the largest value */
				row[vocab - 1] = 100.0f;
				row[vocab / 3] = 100.0f;
				break;
			case 2:
				row[0] = NAN;
				break;
			case 3:
				row[vocab / 2] = NAN;
				row[vocab - 2] = 50.0f;
				break;
			case 4:
				for (i = 0; i < vocab; i++)
					row[i] = -INFINITY;
				break;
			default:
				break;
		}
	}
	dx = gpu_copy(x, len * 4);
	dids = gpu_alloc((size_t) n * 4);
	CHECK_OK(cpu_be->ops->argmax(cpu_be, x, n, vocab, ic), &err);
	CHECK_OK(gpu_be->ops->argmax(gpu_be, dx, n, vocab, dids), &err);
	gpu_get(ig, dids, (size_t) n * 4);
	for (r = 0; r < n; r++)
		diff += ic[r] != ig[r];
	snprintf(label, sizeof(label), "n=%d vocab=%d (rows differing)", n, vocab);
	report("argmax", label, (double) diff, 0);
	gpu_be->ops->free(gpu_be, dx);
	gpu_be->ops->free(gpu_be, dids);
	free(x);
	free(ic);
	free(ig);
}

G4_TEST(gpu_draft_input_and_argmax)
{
	NEED_GPU();
	reseed(41);
	embed_concat_case(G4_W_BF16, 5000, 3840, 3840, 17);
	embed_concat_case(G4_W_I4G32, 1000, 640, 640, 6);
	embed_concat_case(G4_W_F32, 300, 64, 48, 4);
	embed_concat_case(G4_W_Q6_K, 700, 512, 256, 3);
	argmax_case(10, 262144);
	argmax_case(64, 1000);
	argmax_case(5, 7);
}

/* ---- row-wise operations ----------------------------------------------------------- */

static double
max_rel(const float *a, const float *ref, size_t n)
{
	double		m = 0.0,
				r = 0.0;
	size_t		i;

	for (i = 0; i < n; i++)
	{
		double		d = fabs((double) a[i] - (double) ref[i]);

		if (d > m || d != d)
			m = d;
		if (fabs((double) ref[i]) > r)
			r = fabs((double) ref[i]);
	}
	return m / (r > 0 ? r : 1.0);
}

G4_TEST(gpu_rmsnorm_and_residual)
{
	/* rows of a multiple of 4 floats up to 4,096 take the register kernel,
	 * 5,002 the loop */
	static const int shapes[][2] = {{1, 3840}, {7, 640}, {64, 64}, {3, 2048}, {130, 3840}, {2, 5002}};
	size_t		s;
	g4_err		err;

	NEED_GPU();
	reseed(5);
	for (s = 0; s < G4_ARRAY_LEN(shapes); s++)
	{
		int			rows = shapes[s][0],
					dim = shapes[s][1];
		size_t		n = (size_t) rows * (size_t) dim;
		float	   *x = malloc(n * 4),
				   *h = malloc(n * 4),
				   *w = malloc((size_t) dim * 4),
				   *yc = malloc(n * 4),
				   *yg = malloc(n * 4);
		float	   *dx,
				   *dh,
				   *dw,
				   *dy;
		char		label[96];
		int			variant;

		fill_normal(x, n, 3.0f);
		fill_normal(h, n, 20.0f);
		fill_normal(w, (size_t) dim, 1.0f);
		dx = gpu_copy(x, n * 4);
		dh = gpu_copy(h, n * 4);
		dw = gpu_copy(w, (size_t) dim * 4);
		dy = gpu_alloc(n * 4);
		for (variant = 0; variant < 3; variant++)
		{
			/* 0: weighted, 1: no weight, 2: in place */
			if (variant == 2)
			{
				memcpy(yc, x, n * 4);
				CHECK_OK(cpu_be->ops->rmsnorm(cpu_be, yc, w, rows, dim, 1e-6f, yc), &err);
				gpu_be->ops->upload(gpu_be, dy, x, n * 4);
				CHECK_OK(gpu_be->ops->rmsnorm(gpu_be, dy, dw, rows, dim, 1e-6f, dy), &err);
			}
			else
			{
				CHECK_OK(cpu_be->ops->rmsnorm(cpu_be, x, variant ? NULL : w, rows, dim, 1e-6f, yc), &err);
				CHECK_OK(gpu_be->ops->rmsnorm(gpu_be, dx, variant ? NULL : dw, rows, dim, 1e-6f, dy), &err);
			}
			gpu_get(yg, dy, n * 4);
			snprintf(label, sizeof(label), "rows=%d dim=%d %s", rows, dim,
					 variant == 0 ? "weighted" : variant == 1 ? "no weight" : "in place");
			report("rmsnorm", label, max_rel(yg, yc, n), 2e-6);
		}
		for (variant = 0; variant < 3; variant++)
		{
			/* 0: residual add, 1: with layer scalar, 2: with the next
			 * norm written over h */
			float		scale = variant == 1 ? 0.731f : 1.0f;
			float	   *hc = malloc(n * 4);

			memcpy(yc, x, n * 4);
			memcpy(hc, h, n * 4);
			CHECK_OK(cpu_be->ops->add_rmsnorm(cpu_be, yc, hc, w, rows, dim, 1e-6f, scale, variant == 2 ? x : NULL,
											  variant == 2 ? hc : NULL), &err);
			gpu_be->ops->upload(gpu_be, dy, x, n * 4);
			gpu_be->ops->upload(gpu_be, dh, h, n * 4);
			CHECK_OK(gpu_be->ops->add_rmsnorm(gpu_be, dy, dh, dw, rows, dim, 1e-6f, scale, variant == 2 ? dx : NULL,
											  variant == 2 ? dh : NULL), &err);
			gpu_get(yg, dy, n * 4);
			snprintf(label, sizeof(label), "rows=%d dim=%d %s", rows, dim,
					 variant == 0 ? "residual" : variant == 1 ? "scale=0.731" : "+ next norm");
			report("add_rmsnorm", label, max_rel(yg, yc, n), 2e-6);
			if (variant == 2)
			{
				gpu_get(yg, dh, n * 4);
				report("add_rmsnorm", "  the next norm (over h)", max_rel(yg, hc, n), 2e-6);
			}
			free(hc);
		}
		gpu_be->ops->free(gpu_be, dx);
		gpu_be->ops->free(gpu_be, dh);
		gpu_be->ops->free(gpu_be, dw);
		gpu_be->ops->free(gpu_be, dy);
		free(x);
		free(h);
		free(w);
		free(yc);
		free(yg);
	}
}

static void
inv_freq_for(int hd, int proportional, double theta, float *out)
{
	g4_attn_type a;

	memset(&a, 0, sizeof(a));
	a.head_dim = hd;
	a.rope_kind = proportional ? G4_ROPE_PROPORTIONAL : G4_ROPE_DEFAULT;
	a.rope_theta = theta;
	a.partial_rotary_factor = proportional ? 0.25 : 1.0;
	a.rope_factor = 1.0;
	g4_config_inv_freq(&a, out);
}

G4_TEST(gpu_head_norm_rope)
{
	static const struct
	{
		int			n,
					heads,
					hd,
					stride,
					weighted,
					rope,
					proportional;
	}			cases[] = {
		{5, 16, 256, 16 * 256 + 2 * 8 * 256, 1, 1, 0},
		{3, 1, 512, 16 * 512 + 512, 0, 1, 1},
		{9, 4, 16, 4 * 16 + 2 * 2 * 16, 1, 1, 0},
		{70, 8, 256, 8 * 256, 0, 0, 0},
		{4, 16, 512, 16 * 512, 1, 1, 1},
	};
	size_t		c;
	g4_err		err;

	NEED_GPU();
	reseed(6);
	for (c = 0; c < G4_ARRAY_LEN(cases); c++)
	{
		int			n = cases[c].n,
					hd = cases[c].hd;
		size_t		len = (size_t) n * (size_t) cases[c].stride;
		float	   *x = malloc(len * 4),
				   *yg = malloc(len * 4),
				   *w = malloc((size_t) hd * 4),
				   *f = malloc((size_t) hd / 2 * 4);
		float	   *dx,
				   *dw,
				   *df;
		meta_buf	mb;
		g4_step_meta m;
		char		label[96];
		int			i;

		meta_init(&mb, n);
		for (i = 0; i < n; i++)
			mb.pos[i] = i == 0 ? 262143 : (int32_t) (rnd() % 262144);
		m = meta_of(&mb);
		both_step(&m);
		fill_normal(x, len, 2.0f);
		fill_normal(w, (size_t) hd, 1.0f);
		inv_freq_for(hd, cases[c].proportional, cases[c].proportional ? 1e6 : 1e4, f);
		dx = gpu_copy(x, len * 4);
		dw = gpu_copy(w, (size_t) hd * 4);
		df = gpu_copy(f, (size_t) hd / 2 * 4);
		CHECK_OK(cpu_be->ops->head_norm_rope(cpu_be, x, n, cases[c].stride, cases[c].heads, hd,
											 cases[c].weighted ? w : NULL, 1e-6f, cases[c].rope ? f : NULL), &err);
		CHECK_OK(gpu_be->ops->head_norm_rope(gpu_be, dx, n, cases[c].stride, cases[c].heads, hd,
											 cases[c].weighted ? dw : NULL, 1e-6f, cases[c].rope ? df : NULL), &err);
		gpu_get(yg, dx, len * 4);
		snprintf(label, sizeof(label), "n=%d heads=%d hd=%d%s%s", n, cases[c].heads, hd,
				 cases[c].rope ? (cases[c].proportional ? " rope(partial)" : " rope") : "",
				 cases[c].weighted ? " weighted" : "");
		/* positions up to 262143: sincosf's 2 ulp on the angle's sine */
		report("head_norm_rope", label, max_rel(yg, x, len), 4e-6);
		gpu_be->ops->free(gpu_be, dx);
		gpu_be->ops->free(gpu_be, dw);
		gpu_be->ops->free(gpu_be, df);
		meta_free(&mb);
		free(x);
		free(yg);
		free(w);
		free(f);
	}
}

G4_TEST(gpu_geglu_softcap_gather)
{
	g4_err		err;
	int			s;

	NEED_GPU();
	reseed(7);
	for (s = 0; s < 2; s++)
	{
		int			n = s ? 70 : 3,
					ff = s ? 128 : 15360;
		size_t		len = (size_t) n * (size_t) ff;
		float	   *gu = malloc(2 * len * 4),
				   *oc = malloc(len * 4),
				   *og = malloc(len * 4);
		float	   *dgu = NULL,
				   *dout;
		char		label[64];

		fill_normal(gu, 2 * len, 2.5f);
		dgu = gpu_copy(gu, 2 * len * 4);
		dout = gpu_alloc(len * 4);
		CHECK_OK(cpu_be->ops->geglu(cpu_be, gu, n, ff, oc), &err);
		CHECK_OK(gpu_be->ops->geglu(gpu_be, dgu, n, ff, dout), &err);
		gpu_get(og, dout, len * 4);
		snprintf(label, sizeof(label), "n=%d ff=%d", n, ff);
		report("geglu", label, max_rel(og, oc, len), 2e-6);
		gpu_be->ops->free(gpu_be, dgu);
		gpu_be->ops->free(gpu_be, dout);
		free(gu);
		free(oc);
		free(og);
	}
	{
		size_t		len = (size_t) 3 * 262144 + 5;
		float	   *x = malloc(len * 4),
				   *y = malloc(len * 4);
		float	   *d;

		fill_normal(x, len, 40.0f);
		d = gpu_copy(x, len * 4);
		CHECK_OK(cpu_be->ops->softcap(cpu_be, x, len, 30.0f), &err);
		CHECK_OK(gpu_be->ops->softcap(gpu_be, d, len, 30.0f), &err);
		gpu_get(y, d, len * 4);
		report("softcap", "count=3x262144+5 cap=30", max_rel(y, x, len), 2e-6);
		gpu_be->ops->free(gpu_be, d);
		free(x);
		free(y);
	}
	{
		int			n = 40,
					dim = 3840;
		meta_buf	mb;
		g4_step_meta m;
		float	   *x = malloc((size_t) n * dim * 4),
				   *oc = malloc((size_t) 5 * dim * 4),
				   *og = malloc((size_t) 5 * dim * 4);
		float	   *dx,
				   *dout;
		static const int rows[] = {39, 0, 17, 17, 3};

		meta_init(&mb, n);
		mb.n_logits = 5;
		memcpy(mb.logit_rows, rows, sizeof(rows));
		m = meta_of(&mb);
		both_step(&m);
		fill_normal(x, (size_t) n * dim, 1.0f);
		dx = gpu_copy(x, (size_t) n * dim * 4);
		dout = gpu_alloc((size_t) 5 * dim * 4);
		CHECK_OK(cpu_be->ops->gather_logit_rows(cpu_be, x, dim, oc), &err);
		CHECK_OK(gpu_be->ops->gather_logit_rows(gpu_be, dx, dim, dout), &err);
		gpu_get(og, dout, (size_t) 5 * dim * 4);
		report("gather_logit_rows", "5 of 40 rows, dim 3840 (bytes differing)",
			   (double) (memcmp(oc, og, (size_t) 5 * dim * 4) != 0), 0);
		gpu_be->ops->free(gpu_be, dx);
		gpu_be->ops->free(gpu_be, dout);
		meta_free(&mb);
		free(x);
		free(oc);
		free(og);
	}
}

/* ---- sampling ------------------------------------------------------------------------ */

/* One sampling case: parameters and the generator the host draws from. */
typedef struct
{
	float		temperature,
				top_p,
				min_p;
	int			top_k;
} sample_params;

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + ts.tv_nsec * 1e-9;
}

/*
 * rows [n][vocab] sampled on the device with params[i % n_params] and the
 * draw of a generator seeded with seed0 + i; returns how many ids differ
 * from g4_sample's on the same row and generator.  *seconds: the device
 * call's wall time.
 */
static int
sample_case(const float *rows, int n, int vocab, const sample_params *params, int n_params, uint64_t seed0,
			const int32_t *suppress, int n_suppress, double *seconds)
{
	float	   *d = gpu_copy(rows, (size_t) n * vocab * 4);
	float	   *row = malloc((size_t) vocab * 4);
	g4_row_sampling *rs = calloc((size_t) n, sizeof(*rs));
	int32_t    *ids = malloc((size_t) n * sizeof(int32_t));
	g4_sampler_scratch sc;
	g4_err		err;
	double		t0;
	int			i,
				bad = 0;

	memset(&sc, 0, sizeof(sc));
	for (i = 0; i < n; i++)
	{
		const sample_params *p = &params[i % n_params];
		g4_rng		r;

		g4_rng_seed(&r, seed0 + (uint64_t) i);
		rs[i].temperature = p->temperature;
		rs[i].top_p = p->top_p;
		rs[i].min_p = p->min_p;
		rs[i].top_k = p->top_k;
		rs[i].u = p->temperature > 0.0f ? g4_rng_uniform(&r) : 0.0;
	}
	t0 = now_s();
	if (gpu_be->ops->sample(gpu_be, d, n, vocab, suppress, n_suppress, rs, ids) != G4_OK)
	{
		gpu_be->ops->sync(gpu_be, &err);
		fprintf(stderr, "device sampling failed: %s\n", err.msg);
		exit(2);
	}
	*seconds = now_s() - t0;
	for (i = 0; i < n; i++)
	{
		const sample_params *p = &params[i % n_params];
		g4_sampling sp;
		g4_rng		r;
		int32_t		want;

		g4_sampling_default(&sp);
		sp.temperature = p->temperature;
		sp.top_p = p->top_p;
		sp.min_p = p->min_p;
		sp.top_k = p->top_k;
		g4_rng_seed(&r, seed0 + (uint64_t) i);
		memcpy(row, rows + (size_t) i * vocab, (size_t) vocab * 4);
		want = g4_sample(row, vocab, &sp, NULL, suppress, n_suppress, &r, &sc);
		if (want != ids[i])
		{
			bad++;
			printf("    row %d (T %g, top_k %d, top_p %g, min_p %g, u %.9f): device %d, host %d\n", i,
				   (double) p->temperature, p->top_k, (double) p->top_p, (double) p->min_p, rs[i].u, ids[i], want);
		}
	}
	g4_sampler_scratch_free(&sc);
	gpu_be->ops->free(gpu_be, d);
	free(row);
	free(rs);
	free(ids);
	return bad;
}

/*
 * The device sampler against g4_sample: the same rows, parameters and draws.
 * Bound: no id differs.  Both sides compute e with float32 sub, div and
 * expf (CUDA's expf is within 2 ulp, the host's correctly rounded in most
 * cases) and sum the same integer weights, so an id can differ only where a
 * filter boundary or the draw falls within an ulp of an e: ~1e-7 per check,
 * not expected in a few hundred.
 */
G4_TEST(gpu_sample)
{
	static const sample_params params[] = {
		{0.0f, 1.0f, 0.0f, 0},		/* greedy */
		{1.0f, 1.0f, 0.0f, 0},		/* plain temperature */
		{0.7f, 0.95f, 0.0f, 0},
		{1.0f, 1.0f, 0.0f, 40},
		{1.3f, 0.9f, 0.0f, 64},
		{1.0f, 1.0f, 0.05f, 0},
		{0.8f, 0.5f, 0.02f, 3000},
		{2.0f, 0.999f, 0.0f, 1},
		{1.6f, 1.0f, 0.0f, 200000},
		{1.0f, 0.3f, 0.0f, 0},
	};
	int			np = (int) G4_ARRAY_LEN(params);
	int32_t		suppress[3] = {5, 262143, 100};
	int			vocab = 262144;
	int			n = 40;
	float	   *l = malloc((size_t) n * vocab * 4);
	double		secs;
	int			i,
				r,
				bad;
	char		label[96];

	NEED_GPU();
	if (!gpu_be->ops->sample)
		G4_SKIP("no device sampler");

	/* Gemma-like rows: normal logits soft-capped at 30, a few large ones */
	reseed(8);
	for (r = 0; r < n; r++)
	{
		float	   *x = l + (size_t) r * vocab;

		fill_normal(x, (size_t) vocab, 3.0f);
		for (i = 0; i < 20; i++)
			x[rnd() % (uint64_t) vocab] += (float) (8.0 + 8.0 * unif());
		for (i = 0; i < vocab; i++)
			x[i] = 30.0f * tanhf(x[i] / 30.0f);
	}
	/* a suppressed maximum, ties of the maximum, an all-equal row */
	l[2 * (size_t) vocab + 5] = 99.0f;
	l[3 * (size_t) vocab + 10] = l[3 * (size_t) vocab + 20000] = 50.0f;
	for (i = 0; i < vocab; i++)
		l[4 * (size_t) vocab + i] = 1.0f;
	bad = sample_case(l, n, vocab, params, np, 1000, suppress, 3, &secs);
	snprintf(label, sizeof(label), "%d rows x 262144, 10 settings (ids differing)", n);
	report("sample", label, (double) bad, 0);
	printf("    device sampler, %d rows x 262,144: %.2f ms (one call, copies included)\n", n, secs * 1e3);
	/* fewer rows: each split over more blocks (26 at 10 rows on 132 SMs;
	 * 40 rows take 6) */
	bad = sample_case(l, 10, vocab, params, np, 1500, suppress, 3, &secs);
	report("sample", "10 rows x 262144, 10 settings (ids differing)", (double) bad, 0);

	/* heavy ties: logits on a grid of 8 values, every filter cutting through them */
	for (r = 0; r < n; r++)
		for (i = 0; i < vocab; i++)
			l[(size_t) r * vocab + i] = (float) (rnd() % 8) * 0.5f;
	bad = sample_case(l, n, vocab, params, np, 2000, suppress, 3, &secs);
	report("sample", "40 rows of 8 tied values, 10 settings (ids differing)", (double) bad, 0);

	/* a small vocabulary (fewer ids than threads) */
	reseed(9);
	fill_normal(l, (size_t) n * 300, 2.0f);
	bad = sample_case(l, n, 300, params, np, 3000, suppress, 1, &secs);
	report("sample", "40 rows x 300, 10 settings (ids differing)", (double) bad, 0);

	/* the same call twice: the same ids */
	{
		static const sample_params one[] = {{1.0f, 0.95f, 0.0f, 0}};
		float	   *d = gpu_copy(l, (size_t) 8 * 300 * 4);
		float	   *d2 = gpu_copy(l, (size_t) 8 * 300 * 4);
		g4_row_sampling rs[8];
		int32_t		a[8],
					b[8];
		g4_err		err;

		for (i = 0; i < 8; i++)
		{
			rs[i].temperature = one[0].temperature;
			rs[i].top_p = one[0].top_p;
			rs[i].min_p = one[0].min_p;
			rs[i].top_k = one[0].top_k;
			rs[i].u = (i + 0.5) / 8.0;
		}
		CHECK_OK(gpu_be->ops->sample(gpu_be, d, 8, 300, NULL, 0, rs, a), &err);
		CHECK_OK(gpu_be->ops->sample(gpu_be, d2, 8, 300, NULL, 0, rs, b), &err);
		report("sample", "the same rows and draws twice (ids differing)", (double) (memcmp(a, b, sizeof(a)) != 0), 0);
		gpu_be->ops->free(gpu_be, d);
		gpu_be->ops->free(gpu_be, d2);
	}

	/* time at the serving shapes: 1 and 64 rows, top_p 0.95 */
	{
		static const sample_params tp[] = {{1.0f, 0.95f, 0.0f, 0}, {1.0f, 1.0f, 0.0f, 0}, {1.0f, 1.0f, 0.0f, 40}};
		int			k;

		for (k = 0; k < 3; k++)
		{
			float	   *big = malloc((size_t) 64 * vocab * 4);

			reseed(10);
			fill_normal(big, (size_t) 64 * vocab, 3.0f);
			bad = sample_case(big, 1, vocab, &tp[k], 1, 5000, NULL, 0, &secs);
			printf("    device sampler timing (T 1, top_p %g, top_k %d): 1 row %.3f ms", (double) tp[k].top_p,
				   tp[k].top_k, secs * 1e3);
			bad += sample_case(big, 64, vocab, &tp[k], 1, 6000, NULL, 0, &secs);
			printf(", 64 rows %.3f ms (copies included)\n", secs * 1e3);
			/* one row: the widest split (64 blocks) */
			snprintf(label, sizeof(label), "1 and 64 rows x 262144, top_p %g top_k %d (ids differing)",
					 (double) tp[k].top_p, tp[k].top_k);
			report("sample", label, (double) bad, 0);
			free(big);
		}
	}
	free(l);
}

/* ---- the KV pool: store and attention ------------------------------------------------ */

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
	float	   *dknorm[2],
			   *dinvf[2];		/* device */
} pool_t;

static void
pool_make(pool_t *P, int dtype, int small)
{
	int			g;

	memset(P, 0, sizeof(*P));
	P->dtype = dtype;
	P->heads = small ? 4 : 16;
	P->hd[0] = small ? 16 : 256;
	P->nkv[0] = small ? 2 : 8;
	P->hd[1] = small ? 32 : 512;
	P->nkv[1] = 1;
	P->keqv[1] = 1;
	P->layers[0] = 2;
	P->layers[1] = 2;
	P->max_seqs = 5;
	P->max_blocks = 4096 / 16 + 8;
	for (g = 0; g < 2; g++)
	{
		size_t		lbb = (size_t) P->nkv[g] * g4_kv_head_block_bytes(dtype, P->hd[g], P->keqv[g]);
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
		P->cpu.base[g] = malloc(bytes);
		init = P->cpu.base[g];
		/* random bytes are not valid f32/bf16 keys: small values there */
		if (dtype != G4_KV_TURBOQUANT_K8V4)
			memset(init, 0x11, bytes);
		else
			for (i = 0; i < bytes; i++)
				init[i] = (uint8_t) rnd();
		P->gpu.base[g] = gpu_copy(init, bytes);
		P->tables[g] = malloc(tb);
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
		P->knorm[g] = malloc((size_t) P->hd[g] * 4);
		P->invf[g] = malloc((size_t) P->hd[g] / 2 * 4);
		for (i = 0; i < (size_t) P->hd[g]; i++)
			P->knorm[g][i] = 1.0f + 0.2f * nrm();
		inv_freq_for(P->hd[g], g == 1, g == 1 ? 1e6 : 1e4, P->invf[g]);
		P->dknorm[g] = gpu_copy(P->knorm[g], (size_t) P->hd[g] * 4);
		P->dinvf[g] = gpu_copy(P->invf[g], (size_t) P->hd[g] / 2 * 4);
	}
	P->cpu.dtype = P->gpu.dtype = dtype;
	P->cpu.max_seqs = P->gpu.max_seqs = P->max_seqs;
	P->cpu.max_blocks_per_seq = P->gpu.max_blocks_per_seq = P->max_blocks;
	cpu_be->ops->kv_configure(cpu_be, &P->cpu);
	gpu_be->ops->kv_configure(gpu_be, &P->gpu);
}

static void
pool_free(pool_t *P)
{
	int			g;

	for (g = 0; g < 2; g++)
	{
		free(P->cpu.base[g]);
		free(P->tables[g]);
		free(P->knorm[g]);
		free(P->invf[g]);
		gpu_be->ops->free(gpu_be, P->gpu.base[g]);
		gpu_be->ops->free(gpu_be, P->gpu.block_tables[g]);
		gpu_be->ops->free(gpu_be, P->dknorm[g]);
		gpu_be->ops->free(gpu_be, P->dinvf[g]);
	}
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
	return L;
}

/* Store random K/V for n tokens (slots/positions in mb) into layer `index`
 * of group g on the CPU and, when `compare`, on the GPU; returns the bytes
 * of the layer that differ. */
static size_t
store_both(pool_t *P, meta_buf *mb, int g, int index, float kstd, int exact16, int compare)
{
	int			n = mb->n;
	int			hd = P->hd[g],
				nkv = P->nkv[g];
	int			stride = nkv * hd * 2 + 8;
	size_t		len = (size_t) n * (size_t) stride;
	float	   *kv = malloc(len * 4);
	float	   *dkv;
	g4_kv_layer Lc = layer_of(P, g, index, 0, 1.0f),
				Lg = layer_of(P, g, index, 1, 1.0f);
	g4_step_meta m = meta_of(mb);
	size_t		lbytes = P->cpu.layer_stride[g];
	uint8_t    *got = compare ? malloc(lbytes) : NULL;
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
	both_step(&m);
	if (cpu_be->ops->kv_store(cpu_be, &Lc, P->keqv[g] ? NULL : kv, stride, kv + nkv * hd, stride, n) != G4_OK)
	{
		fprintf(stderr, "kv_store failed\n");
		exit(2);
	}
	if (compare)
	{
		dkv = gpu_copy(kv, len * 4);
		if (gpu_be->ops->kv_store(gpu_be, &Lg, P->keqv[g] ? NULL : dkv, stride, dkv + nkv * hd, stride, n) != G4_OK)
		{
			fprintf(stderr, "kv_store failed\n");
			exit(2);
		}
		gpu_get(got, P->gpu.base[g] + (size_t) index * lbytes, lbytes);
		for (i = 0; i < lbytes; i++)
			diff += got[i] != P->cpu.base[g][(size_t) index * lbytes + i];
		gpu_be->ops->free(gpu_be, dkv);
	}
	free(kv);
	free(got);
	return diff;
}

static const char *
dtype_name(int d)
{
	return d == G4_KV_F32 ? "f32" : d == G4_KV_BF16 ? "bf16" : "turboquant_k8v4";
}

G4_TEST(gpu_kv_store_bytes)
{
	int			dtype,
				small;

	NEED_GPU();
	reseed(9);
	for (small = 0; small <= 1; small++)
		for (dtype = G4_KV_F32; dtype <= G4_KV_TURBOQUANT_K8V4; dtype++)
		{
			pool_t		P;
			meta_buf	mb;
			int			g,
						i;

			pool_make(&P, dtype, small);
			meta_init(&mb, 37);
			for (i = 0; i < mb.n; i++)
			{
				/* distinct (slot, position) pairs: the order of the writes is free */
				mb.slot[i] = i % P.max_seqs;
				mb.pos[i] = (int32_t) ((i / P.max_seqs) * 500 + (int) (rnd() % 500));
			}
			for (g = 0; g < 2; g++)
			{
				char		label[96];
				size_t		d = store_both(&P, &mb, g, 1, 1.5f, 0, 1);

				snprintf(label, sizeof(label), "%s hd=%d kv_heads=%d%s (bytes differing)", dtype_name(dtype), P.hd[g],
						 P.nkv[g], P.keqv[g] ? " k_eq_v" : "");
				report("kv_store", label, (double) d, 0);
			}
			meta_free(&mb);
			pool_free(&P);
		}
}

/* Fill the first `len[s]` positions of every slot on the CPU pool, copy the
 * pool bytes to the GPU pool (identical attention inputs). */
static void
fill_context(pool_t *P, int g, int index, const int *len, int exact16)
{
	int			s,
				total = 0,
				k = 0;
	meta_buf	mb;

	for (s = 0; s < P->max_seqs; s++)
		total += len[s];
	while (k < total)
	{
		int			chunk = G4_MIN(total - k, 2048);
		int			i;

		meta_init(&mb, chunk);
		for (i = 0; i < chunk; i++, k++)
		{
			int			kk = k,
						ss = 0;

			while (kk >= len[ss])
				kk -= len[ss++];
			mb.slot[i] = ss;
			mb.pos[i] = kk;
		}
		store_both(P, &mb, g, index, 1.0f, exact16, 0);
		meta_free(&mb);
	}
	gpu_be->ops->upload(gpu_be, P->gpu.base[g] + (size_t) index * P->cpu.layer_stride[g],
						P->cpu.base[g] + (size_t) index * P->cpu.layer_stride[g], P->cpu.layer_stride[g]);
}

typedef struct
{
	const char *name;
	int			n;
	/* per token: slot, pos, [lo, hi) */
	void		(*make) (meta_buf *mb, int g, int window);
} attn_shape;

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

static void
attn_case(pool_t *P, int g, const char *shape_name, int n, void (*make) (meta_buf *, int, int), int exact16,
		  double bound, const char *why)
{
	int			hd = P->hd[g];
	int			q_stride = P->heads * hd + 24;
	size_t		qlen = (size_t) n * (size_t) q_stride;
	size_t		olen = (size_t) n * (size_t) P->heads * (size_t) hd;
	float	   *q = malloc(qlen * 4),
			   *oc = malloc(olen * 4),
			   *og = malloc(olen * 4);
	float	   *dq,
			   *dout;
	meta_buf	mb;
	g4_step_meta m;
	float		scale = exact16 ? 0.125f : 1.0f;
	g4_kv_layer Lc = layer_of(P, g, 0, 0, scale),
				Lg = layer_of(P, g, 0, 1, scale);
	g4_err		err;
	size_t		i;
	char		label[128];
	double		vmax = 0.0,
				dmax = 0.0;

	meta_init(&mb, n);
	make(&mb, g, 1024);
	m = meta_of(&mb);
	both_step(&m);
	if (exact16)
		for (i = 0; i < qlen; i++)
			q[i] = (float) ((int) (rnd() % 33) - 16) / 8.0f;
	else
		fill_normal(q, qlen, 1.0f);
	dq = gpu_copy(q, qlen * 4);
	dout = gpu_alloc(olen * 4);
	gpu_be->ops->fill(gpu_be, dout, 0xff, olen * 4);
	CHECK_OK(cpu_be->ops->attention(cpu_be, &Lc, q, q_stride, n, oc), &err);
	CHECK_OK(gpu_be->ops->attention(gpu_be, &Lg, dq, q_stride, n, dout), &err);
	gpu_get(og, dout, olen * 4);
	for (i = 0; i < olen; i++)
	{
		double		d = fabs((double) og[i] - (double) oc[i]);

		if (d > dmax || d != d)
			dmax = d;
		if (fabs((double) oc[i]) > vmax)
			vmax = fabs((double) oc[i]);
	}
	snprintf(label, sizeof(label), "%s hd=%d gq=%d%s %s n=%d%s", dtype_name(P->dtype), hd, P->heads / P->nkv[g],
			 P->keqv[g] ? " k_eq_v" : "", shape_name, n, exact16 ? " exact-in" : "");
	report(why, label, dmax / (vmax > 0 ? vmax : 1.0), bound);
	gpu_be->ops->free(gpu_be, dq);
	gpu_be->ops->free(gpu_be, dout);
	meta_free(&mb);
	free(q);
	free(oc);
	free(og);
}

static void
attention_suite(int small, int exact16)
{
	int			dtype;
	static const int len[5] = {1, 37, 1500, 4096, 1100};

	for (dtype = G4_KV_F32; dtype <= G4_KV_TURBOQUANT_K8V4; dtype++)
	{
		pool_t		P;
		int			g;

		if (exact16 && dtype == G4_KV_TURBOQUANT_K8V4)
			continue;			/* decoded turboquant values are not f16-exact */
		pool_make(&P, dtype, small);
		if (exact16)
			for (g = 0; g < 2; g++)
			{
				int			i;

				/* powers of two and no rotation: K = V·k_norm stays exact */
				for (i = 0; i < P.hd[g]; i++)
					P.knorm[g][i] = (i % 3) ? 1.0f : 0.5f;
				memset(P.invf[g], 0, (size_t) P.hd[g] / 2 * 4);
				gpu_be->ops->upload(gpu_be, P.dknorm[g], P.knorm[g], (size_t) P.hd[g] * 4);
				gpu_be->ops->upload(gpu_be, P.dinvf[g], P.invf[g], (size_t) P.hd[g] / 2 * 4);
			}
		for (g = 0; g < 2; g++)
		{
			int			gq = P.heads / P.nkv[g];
			/* which kernel runs (choose_kernel, attention.cu): the decode
			 * kernel for turboquant head_dim 256 without k_eq_v when every
			 * token is its own sequence's; the prefill kernel for head_dim
			 * 256 without k_eq_v when the step's tiles hold 2 tokens or more
			 * on average (same f16 inputs and float32 accumulation as tensor
			 * cores: the same bound), unless G4_ATTN=tc keeps the tensor-core
			 * kernel; tensor cores for head dims 256/512 when gq >= 8 or the
			 * step has 2 tokens or more; float32 otherwise */
			int			dec = !small && dtype == G4_KV_TURBOQUANT_K8V4 && !P.keqv[g] && P.hd[g] == 256;
			const char *force = getenv("G4_ATTN");
			int			tc_one = !small && gq >= 8;
			int			tc_many = !small;
			int			pf = !small && !P.keqv[g] && P.hd[g] == 256 && !(force && strcmp(force, "tc") == 0);
			double		tc_bound = exact16 ? 2e-3 : 0.1;
			const char *many_prefill = pf ? "attention(prefill)" : tc_many ? "attention(tc)" : "attention(f32)";

			fill_context(&P, g, 0, len, exact16);
			attn_case(&P, g, "decode", 1, shape_decode, exact16, dec || tc_one ? tc_bound : 2e-5,
					  dec ? "attention(decode)" : tc_one ? "attention(tc)" : "attention(f32)");
			attn_case(&P, g, "decode", 4, shape_decode, exact16, tc_many ? tc_bound : 2e-5,
					  dec ? "attention(decode)" : tc_many ? "attention(tc)" : "attention(f32)");
			attn_case(&P, g, "prefill+decode", 98, shape_prefill, exact16, tc_many ? tc_bound : 2e-5, many_prefill);
			attn_case(&P, g, "prefill short", 12, shape_prefill, exact16, tc_many ? tc_bound : 2e-5, many_prefill);
			/* sliding: 1,100 tokens, enough 64-token tiles (17 × 8 KV
			 * heads) that no range is split on 132 SMs; full: 600 (150
			 * tiles of 4 tokens), to keep the CPU's reference short */
			if (!small)
				attn_case(&P, g, "prefill long at 1503", g == 0 ? 1100 : 600, shape_prefill_long, exact16, tc_bound,
						  many_prefill);
		}
		pool_free(&P);
	}
}

G4_TEST(gpu_attention_float32_kernel)
{
	NEED_GPU();
	reseed(10);
	attention_suite(1, 0);
}

G4_TEST(gpu_attention_gemma4_layers)
{
	NEED_GPU();
	reseed(11);
	attention_suite(0, 0);
}

G4_TEST(gpu_attention_exact_inputs)
{
	NEED_GPU();
	reseed(12);
	attention_suite(0, 1);
}

/* The decode kernel at every query-heads-per-KV-head count it takes (1, 2,
 * 4, 8: Gemma 4's sliding layers have 2, Gemma 3 270M's 4), against the
 * tensor-core kernel's bound (f16 queries, probabilities and values). */
G4_TEST(gpu_attention_decode_kernel)
{
	static const int len[5] = {1, 37, 1500, 4096, 1100};
	static const int heads[] = {8, 16, 32, 64};
	size_t		h;

	NEED_GPU();
	reseed(13);
	for (h = 0; h < sizeof(heads) / sizeof(heads[0]); h++)
	{
		pool_t		P;

		pool_make(&P, G4_KV_TURBOQUANT_K8V4, 0);
		P.heads = heads[h];		/* queries only: the pool keeps its 8 KV heads */
		fill_context(&P, 0, 0, len, 0);
		attn_case(&P, 0, "decode", 1, shape_decode, 0, 0.1, "attention(decode)");
		attn_case(&P, 0, "decode", 4, shape_decode, 0, 0.1, "attention(decode)");
		pool_free(&P);
	}
}

G4_TEST(gpu_zz_parity_summary)
{
	printf("PARITY-SUMMARY %d checks, %d failed\n", n_checks, n_failed);
	if (gpu_be)
		gpu_be->ops->destroy(gpu_be);
	if (cpu_be)
		cpu_be->ops->destroy(cpu_be);
	gpu_be = cpu_be = NULL;
}

/* ---- media embedders ------------------------------------------------------------------ */

G4_TEST(gpu_media_embed_ops)
{
	static const int shapes[][2] = {{1, 6912}, {280, 6912}, {64, 3840}, {5, 32}, {3, 5002}};
	const int	n_pos = 1120;
	size_t		s;
	g4_err		err;

	NEED_GPU();
	reseed(41);
	for (s = 0; s < G4_ARRAY_LEN(shapes); s++)
	{
		int			rows = shapes[s][0],
					dim = shapes[s][1];
		size_t		n = (size_t) rows * (size_t) dim;
		size_t		nt = (size_t) n_pos * 2 * (size_t) dim;
		float	   *x = malloc(n * 4),
				   *w = malloc((size_t) dim * 4),
				   *b = malloc((size_t) dim * 4),
				   *table = malloc(nt * 4),
				   *yc = malloc(n * 4),
				   *yg = malloc(n * 4);
		int32_t    *pos = malloc((size_t) rows * 2 * sizeof(int32_t));
		float	   *dx,
				   *dw,
				   *db,
				   *dt,
				   *dy;
		int32_t    *dp;
		char		label[96];
		int			r,
					inplace;

		fill_normal(x, n, 2.0f);
		for (r = 0; r < 8 && (size_t) r < n; r++)
			x[r] += 40.0f;		/* an offset mean: the variance must not cancel */
		fill_normal(w, (size_t) dim, 1.0f);
		fill_normal(b, (size_t) dim, 0.3f);
		fill_normal(table, nt, 0.02f);
		for (r = 0; r < rows; r++)
		{
			/* the last row is padding (-1, -1), one more has only x */
			pos[2 * r] = r == rows - 1 && rows > 1 ? -1 : (int32_t) (rnd() % n_pos);
			pos[2 * r + 1] = (r == rows - 1 && rows > 1) || r == 1 ? -1 : (int32_t) (rnd() % n_pos);
		}
		dx = gpu_copy(x, n * 4);
		dw = gpu_copy(w, (size_t) dim * 4);
		db = gpu_copy(b, (size_t) dim * 4);
		dt = gpu_copy(table, nt * 4);
		dp = gpu_copy(pos, (size_t) rows * 2 * sizeof(int32_t));
		dy = gpu_alloc(n * 4);
		for (inplace = 0; inplace < 2; inplace++)
		{
			if (inplace)
			{
				memcpy(yc, x, n * 4);
				CHECK_OK(cpu_be->ops->layernorm(cpu_be, yc, w, b, rows, dim, 1e-5f, yc), &err);
				gpu_be->ops->upload(gpu_be, dy, x, n * 4);
				CHECK_OK(gpu_be->ops->layernorm(gpu_be, dy, dw, db, rows, dim, 1e-5f, dy), &err);
			}
			else
			{
				CHECK_OK(cpu_be->ops->layernorm(cpu_be, x, w, b, rows, dim, 1e-5f, yc), &err);
				CHECK_OK(gpu_be->ops->layernorm(gpu_be, dx, dw, db, rows, dim, 1e-5f, dy), &err);
			}
			gpu_get(yg, dy, n * 4);
			snprintf(label, sizeof(label), "rows=%d dim=%d%s", rows, dim, inplace ? " in place" : "");
			report("layernorm", label, max_rel(yg, yc, n), 2e-6);
		}
		/* bias and position table: elementwise, identical roundings */
		memcpy(yc, x, n * 4);
		CHECK_OK(cpu_be->ops->add_bias(cpu_be, yc, b, rows, dim), &err);
		CHECK_OK(cpu_be->ops->add_pos2d(cpu_be, yc, table, pos, rows, dim), &err);
		gpu_be->ops->upload(gpu_be, dy, x, n * 4);
		CHECK_OK(gpu_be->ops->add_bias(gpu_be, dy, db, rows, dim), &err);
		CHECK_OK(gpu_be->ops->add_pos2d(gpu_be, dy, dt, dp, rows, dim), &err);
		gpu_get(yg, dy, n * 4);
		snprintf(label, sizeof(label), "rows=%d dim=%d bias + positions", rows, dim);
		report("add_bias_pos2d", label, max_rel(yg, yc, n), 0.0);
		gpu_be->ops->free(gpu_be, dx);
		gpu_be->ops->free(gpu_be, dw);
		gpu_be->ops->free(gpu_be, db);
		gpu_be->ops->free(gpu_be, dt);
		gpu_be->ops->free(gpu_be, dp);
		gpu_be->ops->free(gpu_be, dy);
		free(x);
		free(w);
		free(b);
		free(table);
		free(yc);
		free(yg);
		free(pos);
	}
}

/* The whole embedders of the fixture model on both backends, from a real
 * image and audio clip of test/fixtures/media. */
G4_TEST(gpu_media_embedders)
{
	static const struct
	{
		const char *file;
		int			kind;
	}			items[] = {{"photo_640x480.jpg", G4_MEDIA_IMAGE}, {"pcm16_16k_mono.wav", G4_MEDIA_AUDIO}};
	const char *model = h_fixture_model();
	g4_model   *mc = NULL,
			   *mg = NULL;
	g4_err		err;
	size_t		k;

	NEED_GPU();
	if (!model)
		G4_SKIP("G4_FIXTURE_MODEL not set");
	CHECK_OK(g4_model_load(model, cpu_be, &mc, 0, &err), &err);
	CHECK_OK(g4_model_load(model, gpu_be, &mg, 0, &err), &err);
	for (k = 0; k < G4_ARRAY_LEN(items); k++)
	{
		char		path[4096];
		char	   *data;
		size_t		len;
		g4_media	m;
		g4_media_limits lim = {G4_DEFAULT_SOFT_TOKENS, G4_DEFAULT_MAX_IMAGE_PIXELS, 60.0};
		g4_media_input in;
		size_t		n;
		float	   *rc,
				   *rg;

		snprintf(path, sizeof(path), "%s/test/fixtures/media/%s", g4_test_srcdir(), items[k].file);
		CHECK_OK(g4_read_file(path, &data, &len, &err), &err);
		m.kind = items[k].kind;
		m.data = (const uint8_t *) data;
		m.len = len;
		CHECK_OK(g4_media_prepare(&m, 1, &lim, &in, &err), &err);
		n = (size_t) in.n_tokens * (size_t) mc->cfg.hidden_size;
		rc = malloc(n * 4);
		rg = malloc(n * 4);
		CHECK_OK(g4_model_embed_media(mc, &in, rc, &err), &err);
		CHECK_OK(g4_model_embed_media(mg, &in, rg, &err), &err);
		/* an image's rows (280 here) go through the matmuls of more than 16
		 * rows, whose activations are rounded to bf16 (2^-9 each): the bound
		 * of that class, as for the matmuls themselves; the layer norms keep
		 * relative errors relative */
		report("media_embed", items[k].file, max_rel(rg, rc, n), 8e-3);
		free(rc);
		free(rg);
		free(data);
		g4_media_input_free(&in);
	}
	g4_model_free(mc);
	g4_model_free(mg);
}
