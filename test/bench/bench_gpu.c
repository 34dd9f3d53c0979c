/*
 * bench_gpu.c — throughput of the CUDA backend on a model of the real
 * Gemma 4 12B shape (gemma4-make-model --preset 12b, int4 w4a16 + bf16
 * embeddings), through the engine's forward pass (step_driver.c: the same
 * operations g4_model_forward issues, plus the backend's step graphs and
 * device argmax).
 *
 *   bench-gpu --model DIR [--what ops,decode,knockout,prefill,capacity] [--kv bf16|tq]
 *             [--ops-n 1,64,2048] [--ops-tokens T] [--matmul-n 17,32,...]
 *             [--lt-algos N] [--prefill-tokens 2048,32768]
 *
 * decode    B sequences (1, 16, 64) at contexts 2k / 32k: tokens/s and the
 *           bytes one step must read (weights + each sequence's visible KV)
 *           over the step time.  Contexts are reserved, not prefilled: the
 *           KV blocks are allocated and hold arbitrary (valid) values, which
 *           costs the same to read (benchmark only: drv_reserve).
 * prefill   one prompt of 2k / 32k tokens (--prefill-tokens: other lengths,
 *           up to MAX_LEN) in chunks of 16384: tokens/s and time to the
 *           first token; then eight 2k prompts in one step of 16,384
 *           tokens, as a table job's prompts arrive together.
 * ops       each operation of a decode step (n = 1 and 64) and of a 2k
 *           prefill chunk, timed alone: the per-kernel breakdown (--ops-n:
 *           other step sizes; up to 64 are decode steps at 2k, beyond one
 *           prefill chunk; --ops-tokens T: each of those decode sequences
 *           takes T tokens, the shape of a verify step of T - 1 drafts).
 * matmul    the int4 matmuls of a sliding layer at 17 to 2,048 rows through
 *           each int4 path that serves the row count (G4_MATMUL_I4=gemv /
 *           gemm / wgmma / lt): where g4c_matmul_i4's thresholds lie
 *           (--matmul-n: other row counts, the GEMV's from 1 to 16;
 *           --lt-algos N: cuBLASLt alone, with each of its heuristic's
 *           first N algorithms, G4_LT_ALGO).
 * knockout  each kind of operation's share of the recorded decode step
 *           (B = 1, 16, 64 at 2k) and of a 2k prompt's prefill: the step
 *           timed with that kind left out (bench_knockout), against the
 *           whole step.
 * capacity  for bf16 and turboquant_k8v4: how many 262,144-token sequences
 *           the pool's accounting says fit next to the weights at 95 % of
 *           device memory, then that many reserved at full length and
 *           decoded together.
 * Output: "BENCH key=value ..." lines, then a summary table.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "step_driver.h"
#include "util.h"
#include "xorshift.h"

#define MAX_TOKENS 16384
#define MAX_SEQS 256
#define MAX_LEN 262144

static g4_backend *be;
static drv	D;
static int	kv_dtype = G4_KV_TURBOQUANT_K8V4;
static char summary[96][200];
static int	n_summary;

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void
note(const char *fmt, ...)
{
	va_list		ap;

	if (n_summary >= (int) G4_ARRAY_LEN(summary))
		return;
	va_start(ap, fmt);
	vsnprintf(summary[n_summary++], sizeof(summary[0]), fmt, ap);
	va_end(ap);
}

static void
die(const g4_err *err, const char *what)
{
	fprintf(stderr, "bench-gpu: %s: %s\n", what, err ? err->msg : "");
	exit(1);
}

static uint64_t rs = 88172645463325252ull;

static int32_t
rand_token(void)
{
	return (int32_t) (h_xorshift64(&rs) % 200000) + 1000;
}

static const char *
kv_name(int d)
{
	return d == G4_KV_BF16 ? "bf16" : d == G4_KV_F32 ? "f32" : "turboquant_k8v4";
}

/* KV bytes one decode step of a sequence at context `ctx` reads */
static double
kv_read_bytes(int ctx)
{
	int			W = D.m->cfg.sliding_window;

	return (double) G4_MIN(ctx, W) * (double) g4_kv_group_token_bytes(D.m, kv_dtype, G4_KVG_SLIDING) +
		(double) ctx * (double) g4_kv_group_token_bytes(D.m, kv_dtype, G4_KVG_FULL);
}

/* ---- decode ---------------------------------------------------------------- */

static double
decode_run(int B, int ctx, int steps, int graphs, double *bytes_per_step)
{
	drv_item	it[MAX_SEQS];
	int32_t		tok[MAX_SEQS],
				ids[MAX_SEQS];
	g4_err		err;
	int			s,
				k;
	double		t0 = 0;

	for (s = 0; s < B; s++)
		if (drv_reserve(&D, s, ctx, &err) != G4_OK)
			die(&err, "reserve");
	D.use_graphs = graphs;
	for (k = 0; k < steps + 3; k++)
	{
		if (k == 3)
			t0 = g4_now();		/* graphs are recorded by now */
		for (s = 0; s < B; s++)
		{
			it[s].slot = s;
			it[s].start = ctx + k;
			it[s].count = 1;
			it[s].logits = 1;
			tok[s] = k ? ids[s] : rand_token();
		}
		if (drv_step(&D, B, it, tok, &err) != G4_OK || drv_argmax(&D, ids, &err) != G4_OK)
			die(&err, "decode step");
	}
	{
		double		dt = (g4_now() - t0) / steps;

		for (s = 0; s < B; s++)
			drv_release(&D, s, ctx + steps + 3);
		*bytes_per_step = (double) D.m->weight_bytes + (double) B * kv_read_bytes(ctx + 3 + steps / 2);
		return dt;
	}
}

static void
bench_decode(void)
{
	static const int cfg[][2] = {{1, 2048}, {1, 32768}, {16, 2048}, {16, 32768}, {64, 2048}, {64, 32768},
	{128, 2048}, {256, 2048}};
	size_t		i;

	for (i = 0; i < G4_ARRAY_LEN(cfg); i++)
	{
		int			B = cfg[i][0],
					ctx = cfg[i][1];
		double		bytes;
		double		dt = decode_run(B, ctx, B == 1 ? 64 : 24, 1, &bytes);

		printf("BENCH decode kv=%s batch=%d ctx=%d graphs=1 ms_per_step=%.3f tok_s=%.1f bytes_per_step=%.3e "
			   "achieved_TBs=%.3f floor_ms=%.3f\n", kv_name(kv_dtype), B, ctx, dt * 1e3, B / dt, bytes,
			   bytes / dt / 1e12, bytes / 4.3e12 * 1e3);
		note("decode B=%-3d ctx=%-6d %8.1f tok/s  %6.3f ms/step  %.2f TB/s (floor at 4.3 TB/s: %.3f ms)", B, ctx,
			 B / dt, dt * 1e3, bytes / dt / 1e12, bytes / 4.3e12 * 1e3);
		fflush(stdout);
		if (B == 1 && ctx == 2048)
		{
			double		dt0 = decode_run(1, 2048, 32, 0, &bytes);

			printf("BENCH decode kv=%s batch=1 ctx=2048 graphs=0 ms_per_step=%.3f tok_s=%.1f\n", kv_name(kv_dtype),
				   dt0 * 1e3, 1.0 / dt0);
			note("decode B=1   ctx=2048   %8.1f tok/s  %6.3f ms/step  without step graphs", 1.0 / dt0, dt0 * 1e3);
		}
	}
}

/* ---- prefill ----------------------------------------------------------------- */

/* seqs prompts of P tokens each (slots 0 ..), prefilled together in steps
 * of up to MAX_TOKENS tokens: seconds to their first tokens */
static double
prefill_run(int seqs, int P)
{
	int			per = G4_MIN(MAX_TOKENS / seqs, P);	/* tokens of each prompt a step */
	int32_t    *tok = malloc((size_t) seqs * (size_t) per * sizeof(int32_t));
	int32_t    *ids = malloc((size_t) seqs * sizeof(int32_t));
	drv_item   *it = malloc((size_t) seqs * sizeof(drv_item));
	g4_err		err;
	double		t0;

	if (!tok || !ids || !it || per < 1 || seqs > MAX_SEQS)
		die(NULL, "prefill: too many prompts");
	D.use_graphs = 0;
	t0 = g4_now();
	for (int p0 = 0; p0 < P; p0 += per)
	{
		int			count = G4_MIN(per, P - p0);

		for (int s = 0; s < seqs; s++)
		{
			it[s].slot = s;
			it[s].start = p0;
			it[s].count = count;
			it[s].logits = p0 + count == P;
		}
		for (int i = 0; i < seqs * count; i++)
			tok[i] = rand_token();
		if (drv_step(&D, seqs, it, tok, &err) != G4_OK)
			die(&err, "prefill step");
	}
	if (drv_argmax(&D, ids, &err) != G4_OK)
		die(&err, "prefill logits");
	t0 = g4_now() - t0;
	for (int s = 0; s < seqs; s++)
		drv_release(&D, s, P);
	free(tok);
	free(ids);
	free(it);
	return t0;
}

static void
bench_prefill(const int *lens, int n_lens)
{
	int			i;

	prefill_run(1, 2048);		/* warm-up: scratch buffers, module loading */
	for (i = 0; i < n_lens; i++)
	{
		double		best = 1e30;
		int			r;

		for (r = 0; r < (lens[i] <= 2048 ? 3 : 1); r++)
		{
			double		t = prefill_run(1, lens[i]);

			best = t < best ? t : best;
		}
		printf("BENCH prefill kv=%s tokens=%d ttft_s=%.4f tok_s=%.1f\n", kv_name(kv_dtype), lens[i], best,
			   lens[i] / best);
		note("prefill %6d tokens  %8.1f tok/s  time to first token %.3f s", lens[i], lens[i] / best, best);
		fflush(stdout);
	}
	{
		const int	seqs = MAX_TOKENS / 2048;
		double		best = 1e30;

		for (int r = 0; r < 3; r++)
			best = G4_MIN(best, prefill_run(seqs, 2048));
		printf("BENCH prefill kv=%s tokens=2048 prompts=%d step_s=%.4f tok_s=%.1f\n", kv_name(kv_dtype), seqs, best,
			   seqs * 2048 / best);
		note("prefill %d x 2048 tokens in one step  %8.1f tok/s  %.3f s", seqs, seqs * 2048 / best, best);
		fflush(stdout);
	}
}

/* ---- per-operation breakdown --------------------------------------------------- */

typedef struct
{
	const char *name;
	double		us;
	double		bytes;
	int			per_step;		/* times per step */
} op_time;

static double
time_op(int reps, void (*fn) (void *), void *arg)
{
	g4_err		err;
	double		t0;
	int			r;

	fn(arg);
	if (be->ops->sync(be, &err) != G4_OK)
		die(&err, "op");
	t0 = g4_now();
	for (r = 0; r < reps; r++)
		fn(arg);
	if (be->ops->sync(be, &err) != G4_OK)
		die(&err, "op");
	return (g4_now() - t0) / reps * 1e6;
}

typedef struct
{
	int			what;
	int			layer;
	int			n;
	const g4_weight *w;
	const float *in;			/* matmul operands: workspace buffers of the right size */
	float	   *out;
	int			which;			/* a layer's matmul (MM_*): w is the next such layer's on each call */
	int			geglu;			/* gate_up and GEGLU as one operation (matmul_geglu), as the step */
} op_arg;

enum
{
	MM_NONE, MM_QKV, MM_O, MM_GATE_UP, MM_DOWN
};

/* Matmul `which` of the next layer after l of l's kind (sliding or full).
 * Timed calls walk the layers so that each one dequantises its weight for
 * cuBLASLt, as a weight's first call in a step does: the backend keeps the
 * last two weights' bf16 copies (matmul_lt.cu), which one repeated weight
 * would always hit. */
static const g4_weight *
next_layer_weight(int *l, int which)
{
	const g4_model_config *c = &D.m->cfg;
	const g4_layer *ly;
	int			j = *l;

	do
		j = (j + 1) % c->n_layers;
	while (c->layer_full[j] != c->layer_full[*l]);
	*l = j;
	ly = &D.m->layers[j];
	return which == MM_QKV ? ly->qkv : which == MM_O ? ly->o : which == MM_GATE_UP ? ly->gate_up : ly->down;
}

enum
{
	OP_MATMUL, OP_RMSNORM, OP_HEADNORM, OP_ATTN, OP_ADDNORM, OP_EMBED, OP_SOFTCAP, OP_GATHER
};

static void
run_op(void *p)
{
	op_arg	   *a = p;
	const g4_layer *ly = &D.m->layers[a->layer];
	const g4_model_config *c = &D.m->cfg;
	const g4_kv_layer *kv = &ly->kv;
	int			stride = ly->q_dim + ly->kv_dim * (kv->k_eq_v ? 1 : 2);
	int			n = a->n;

	switch (a->what)
	{
		case OP_MATMUL:
			if (a->which != MM_NONE)
				a->w = next_layer_weight(&a->layer, a->which);
			if (a->geglu)
				be->ops->matmul_geglu(be, a->w, a->in, n, c->intermediate_size, a->out, D.ws.act);
			else
				be->ops->matmul(be, a->w, a->in, n, a->out);
			break;
		case OP_RMSNORM:
			be->ops->rmsnorm(be, D.ws.x, ly->attn_norm, n, c->hidden_size, 1e-6f, D.ws.h);
			break;
		case OP_HEADNORM:
			{
				g4_head_run runs[G4_HEAD_RUNS_MAX];
				int			n_runs = g4_layer_head_runs(c, ly, runs);

				/* with the store, as the model runs it (Gemma 4: v normalised) */
				be->ops->head_norm_rope(be, D.ws.qkv, n, stride, kv->head_dim, runs, n_runs, 1e-6f, kv);
			}
			break;
		case OP_ATTN:
			be->ops->attention(be, kv, D.ws.qkv, stride, n, D.ws.attn);
			break;
		case OP_ADDNORM:
			be->ops->add_rmsnorm(be, D.ws.x, D.ws.h, ly->post_attn_norm, n, c->hidden_size, 1e-6f, 1.0f,
								 ly->pre_ffn_norm, D.ws.h);
			break;
		case OP_EMBED:
			be->ops->embed(be, D.m->embed, D.m->embed_scale, D.ws.x);
			break;
		case OP_SOFTCAP:
			be->ops->softcap(be, D.ws.logits, (size_t) D.n_logits * (size_t) c->vocab_size, 30.0f);
			break;
		case OP_GATHER:
			be->ops->gather_logit_rows(be, D.ws.x, c->hidden_size, D.ws.lx);
			break;
	}
}

/* Set up a step (seqs sequences of tps tokens each at context ctx when
 * seqs <= 64, else one prefill chunk of seqs tokens), run it once, then time
 * its operations one by one. */
static void
breakdown(int seqs, int tps, int ctx)
{
	const g4_model_config *c = &D.m->cfg;
	int			decode = seqs <= 64;
	int			n = decode ? seqs * tps : seqs;
	int			sl = -1,
				fu = -1;
	int			i;
	int32_t    *tok = malloc((size_t) n * sizeof(int32_t));
	drv_item	it[64];
	int			n_items = decode ? seqs : 1;
	int			n_logits = decode ? n : 1;
	g4_err		err;
	double		total = 0;
	op_time		t[32];
	int			nt = 0;
	int			layers[2] = {0, 0};
	char		label[64];

	for (i = 0; i < c->n_layers; i++)
	{
		layers[c->layer_full[i]]++;
		if (c->layer_full[i] && fu < 0)
			fu = i;
		if (!c->layer_full[i] && sl < 0)
			sl = i;
	}
	for (i = 0; i < n; i++)
		tok[i] = rand_token();
	for (i = 0; i < n_items; i++)
	{
		if (decode && drv_reserve(&D, i, ctx, &err) != G4_OK)
			die(&err, "reserve");
		it[i].slot = i;
		it[i].start = decode ? ctx : 0;
		it[i].count = decode ? tps : n;
		it[i].logits = decode ? tps : 1;
	}
	D.use_graphs = 0;
	if (drv_step(&D, n_items, it, tok, &err) != G4_OK || be->ops->sync(be, &err) != G4_OK)
		die(&err, "breakdown step");
	/* the same step again so the metadata stays in place */
	if (drv_step(&D, n_items, it, tok, &err) != G4_OK || be->ops->sync(be, &err) != G4_OK)
		die(&err, "breakdown step");
	{
		static const struct
		{
			const char *name;
			int			what;
			int			kind;	/* 0 sliding layer, 1 full layer, 2 once per step; a
								 * matmul 10·m + that, or 32 / 42: the MLP's row
								 * slices after the first, its weight kept */
		}			ops[] = {
			{"rmsnorm (first layer, final)", OP_RMSNORM, 2},
			{"matmul qkv sliding", OP_MATMUL, 10},
			{"matmul qkv full", OP_MATMUL, 11},
			{"q/k/v norm+rope, kv_store sliding", OP_HEADNORM, 0},
			{"q/k/v norm+rope, kv_store full", OP_HEADNORM, 1},
			{"attention sliding", OP_ATTN, 0},
			{"attention full", OP_ATTN, 1},
			{"matmul o sliding", OP_MATMUL, 20},
			{"matmul o full", OP_MATMUL, 21},
			{"add_rmsnorm + next norm (x2/layer)", OP_ADDNORM, 0},
			{"matmul gate_up + geglu", OP_MATMUL, 30},
			{"matmul down", OP_MATMUL, 40},
			{"matmul gate_up + geglu, later MLP slices", OP_MATMUL, 32},
			{"matmul down, later MLP slices", OP_MATMUL, 42},
			{"embed", OP_EMBED, 2},
			{"gather logit rows", OP_GATHER, 2},
			{"matmul lm head", OP_MATMUL, 50},
			{"softcap", OP_SOFTCAP, 2},
		};
		size_t		k;

		for (k = 0; k < G4_ARRAY_LEN(ops); k++)
		{
			op_arg		a;
			int			per;
			double		bytes = 0;

			memset(&a, 0, sizeof(a));
			a.what = ops[k].what;
			a.n = n;
			a.layer = (ops[k].kind % 10 == 1 || ops[k].kind == 1) ? fu : sl;
			per = ops[k].kind == 2 ? 1 : layers[(ops[k].kind % 10 == 1 || ops[k].kind == 1) ? 1 : 0];
			if (ops[k].what == OP_RMSNORM)
				per = 2;
			if (ops[k].what == OP_ADDNORM)
				per = 2 * c->n_layers;
			if (ops[k].what == OP_MATMUL)
			{
				const g4_layer *ly = &D.m->layers[a.layer];
				int			later = ops[k].kind % 10 == 2;

				a.which = ops[k].kind / 10 <= MM_DOWN && !later ? ops[k].kind / 10 : MM_NONE;
				switch (ops[k].kind / 10)
				{
					case 1:
						a.w = ly->qkv;
						a.in = D.ws.h;
						a.out = D.ws.qkv;
						break;
					case 2:
						a.w = ly->o;
						a.in = D.ws.attn;
						a.out = D.ws.h;
						break;
					case 3:
						a.w = ly->gate_up;
						a.in = D.ws.h;
						a.out = D.ws.gu;
						a.geglu = 1;
						a.n = g4_mlp_slice_rows(&D.ws, n);
						per = c->n_layers * (later ? G4_DIV_UP(n, a.n) - 1 : 1);
						break;
					case 4:
						a.w = ly->down;
						a.in = D.ws.act;
						a.out = D.ws.h;
						a.n = g4_mlp_slice_rows(&D.ws, n);
						per = c->n_layers * (later ? G4_DIV_UP(n, a.n) - 1 : 1);
						break;
					default:
						a.w = D.m->embed;
						a.in = D.ws.lx;
						a.out = D.ws.logits;
						a.n = n_logits;
						per = 1;
				}
				bytes = (double) be->ops->weight_bytes(a.w);
			}
			if (per == 0)
				continue;		/* one MLP slice: no later ones */
			t[nt].name = ops[k].name;
			t[nt].us = time_op(decode ? 50 : 5, run_op, &a);
			t[nt].bytes = bytes;
			t[nt].per_step = per;
			total += t[nt].us * per;
			nt++;
		}
	}
	if (!decode)
		snprintf(label, sizeof(label), "prefill chunk n=%d", n);
	else if (tps == 1)
		snprintf(label, sizeof(label), "decode n=%d ctx=%d", n, ctx);
	else
		snprintf(label, sizeof(label), "verify n=%dx%d ctx=%d", seqs, tps, ctx);
	for (i = 0; i < nt; i++)
	{
		printf("BENCH op step=\"%s\" op=\"%s\" us=%.2f per_step=%d us_per_step=%.1f share=%.3f", label, t[i].name,
			   t[i].us, t[i].per_step, t[i].us * t[i].per_step, t[i].us * t[i].per_step / total);
		if (t[i].bytes > 0)
			printf(" weight_GBs=%.0f", t[i].bytes / (t[i].us * 1e-6) / 1e9);
		printf("\n");
	}
	printf("BENCH op step=\"%s\" op=\"sum of operations\" us_per_step=%.1f\n", label, total);
	note("ops %s: sum of single kernels %.3f ms/step", label, total / 1e3);
	if (decode)
		for (i = 0; i < n_items; i++)
			drv_release(&D, i, ctx + tps);
	free(tok);
}

/* ---- in-step breakdown by knockout ---------------------------------------------- */

/*
 * What each kind of operation costs inside the recorded step graph, where
 * `ops` (each kernel alone, back to back) overstates small kernels and
 * cannot see how neighbours overlap: the decode step is timed with one kind
 * left out (the backend's entry for it replaced by one that issues nothing,
 * the graphs recorded anew under another tag) and the difference to the
 * whole step is that kind's share.  Caveats: the data downstream of a
 * left-out operation is garbage (no operation's launch geometry depends on
 * data); leaving out a producer of the bf16 copy a matmul takes (norms,
 * GEGLU, attention) makes that matmul convert its input itself, about 1.2 us
 * more per matmul (run 80), counted against the kind; and the shares need
 * not add up to the step, since a left-out kernel also takes its waits and
 * overlaps with it.
 */
enum
{
	KO_NONE, KO_ATTN_SLIDING, KO_ATTN_FULL, KO_QKV, KO_O, KO_GATE_UP, KO_DOWN, KO_LM_HEAD, KO_NORMS,
	KO_ROPE_STORE, KO_COUNT
};

static const char *const ko_names[KO_COUNT] = {
	"(none)", "attention sliding", "attention full", "matmul qkv", "matmul o", "matmul gate_up + geglu",
	"matmul down", "matmul lm head", "rmsnorm, add_rmsnorm", "q/k/v norm+rope, kv_store"
};

static const g4_backend_ops *ko_real;
static g4_backend_ops ko_ops;
static int	ko_what;

static int
ko_graph_begin(g4_backend *b, uint64_t tag)
{
	return ko_real->graph_begin(b, tag ^ ((uint64_t) ko_what << 48));
}

/* which layer weight w is, or the LM head */
static int
ko_matmul_kind(const g4_weight *w)
{
	for (int l = 0; l < D.m->cfg.n_layers; l++)
	{
		const g4_layer *ly = &D.m->layers[l];

		if (w == ly->qkv)
			return KO_QKV;
		if (w == ly->o)
			return KO_O;
		if (w == ly->gate_up)
			return KO_GATE_UP;
		if (w == ly->down)
			return KO_DOWN;
	}
	return KO_LM_HEAD;
}

static int
ko_matmul(g4_backend *b, const g4_weight *w, const float *x, int n, float *y)
{
	return ko_matmul_kind(w) == ko_what ? G4_OK : ko_real->matmul(b, w, x, n, y);
}

static int
ko_matmul_geglu(g4_backend *b, const g4_weight *w, const float *x, int n, int ff, float *gu, float *out)
{
	return ko_what == KO_GATE_UP ? G4_OK : ko_real->matmul_geglu(b, w, x, n, ff, gu, out);
}

static int
ko_attention(g4_backend *b, const g4_kv_layer *L, const float *q, int q_stride, int n, float *out)
{
	int			kind = L->group == G4_KVG_SLIDING ? KO_ATTN_SLIDING : KO_ATTN_FULL;

	return kind == ko_what ? G4_OK : ko_real->attention(b, L, q, q_stride, n, out);
}

static int
ko_rmsnorm(g4_backend *b, const float *x, const float *w, int rows, int dim, float eps, float *y)
{
	return ko_what == KO_NORMS ? G4_OK : ko_real->rmsnorm(b, x, w, rows, dim, eps, y);
}

static int
ko_add_rmsnorm(g4_backend *b, float *x, const float *h, const float *w, int n, int dim, float eps, float scale,
			   const float *next_w, float *y)
{
	return ko_what == KO_NORMS ? G4_OK : ko_real->add_rmsnorm(b, x, h, w, n, dim, eps, scale, next_w, y);
}

static int
ko_head_norm_rope(g4_backend *b, float *x, int n, int stride, int hd, const g4_head_run *runs, int n_runs, float eps,
				  const g4_kv_layer *L)
{
	return ko_what == KO_ROPE_STORE ? G4_OK : ko_real->head_norm_rope(b, x, n, stride, hd, runs, n_runs, eps, L);
}

static int
ko_kv_store(g4_backend *b, const g4_kv_layer *L, const float *k, int k_stride, const float *v, int v_stride, int n)
{
	return ko_what == KO_ROPE_STORE ? G4_OK : ko_real->kv_store(b, L, k, k_stride, v, v_stride, n);
}

/* The prefill of one prompt of P tokens (no graph): best of three. */
static double
ko_time_prefill(int P)
{
	double		dt = 1e30;

	for (int r = 0; r < 3; r++)
		dt = G4_MIN(dt, prefill_run(1, P));
	return dt;
}

/* A recorded decode step of B sequences at 2k. */
static double
ko_time_decode(int B)
{
	double		bytes;

	return decode_run(B, 2048, B == 1 ? 64 : 24, 1, &bytes);
}

/* timer(arg) with each kind left out in turn, against the whole: printed
 * under key, summarised as "in <label>" */
static void
ko_sweep(const char *key, const char *label, double (*timer) (int), int arg)
{
	double		whole = 0;

	for (ko_what = KO_NONE; ko_what < KO_COUNT; ko_what++)
	{
		double		dt = timer(arg);

		if (ko_what == KO_NONE)
			whole = dt;
		printf("BENCH knockout kv=%s %s left_out=\"%s\" ms_per_step=%.3f in_step_ms=%.3f share=%.3f\n",
			   kv_name(kv_dtype), key, ko_names[ko_what], dt * 1e3, (whole - dt) * 1e3, (whole - dt) / whole);
		if (ko_what != KO_NONE)
			note("in %-12s %-28s %7.3f ms of %.3f", label, ko_names[ko_what], (whole - dt) * 1e3, whole * 1e3);
		fflush(stdout);
	}
}

static void
bench_knockout(void)
{
	static const int batches[] = {1, 16, 64};

	ko_real = be->ops;
	ko_ops = *ko_real;
	ko_ops.graph_begin = ko_graph_begin;
	ko_ops.matmul = ko_matmul;
	ko_ops.matmul_geglu = ko_matmul_geglu;
	ko_ops.attention = ko_attention;
	ko_ops.rmsnorm = ko_rmsnorm;
	ko_ops.add_rmsnorm = ko_add_rmsnorm;
	ko_ops.head_norm_rope = ko_head_norm_rope;
	ko_ops.kv_store = ko_kv_store;
	be->ops = &ko_ops;
	ko_sweep("prefill=2048", "prefill 2k", ko_time_prefill, 2048);
	for (size_t i = 0; i < G4_ARRAY_LEN(batches); i++)
	{
		char		key[32],
					label[32];

		snprintf(key, sizeof(key), "batch=%d ctx=2048", batches[i]);
		snprintf(label, sizeof(label), "step B=%-3d", batches[i]);
		ko_sweep(key, label, ko_time_decode, batches[i]);
	}
	ko_what = KO_NONE;
	be->ops = ko_real;
}

/* ---- int4 matmuls by row count ------------------------------------------------ */

/* A sliding layer's four int4 matmuls at n rows on the path G4_MATMUL_I4
 * (and G4_LT_ALGO) select, printed under `label`. */
static void
bench_matmul_layer(int n, const char *label)
{
	const g4_model_config *c = &D.m->cfg;
	const g4_layer *ly;
	int			sl = 0;
	double		sum = 0,
				bytes = 0,
				flops = 0;
	size_t		k;

	while (c->layer_full[sl])
		sl++;
	ly = &D.m->layers[sl];
	{
		struct
		{
			const char *name;
			int			which;
			const g4_weight *w;
			const float *in;
			float	   *out;
		}			mm[] = {
			{"qkv", MM_QKV, ly->qkv, D.ws.h, D.ws.qkv},
			{"o", MM_O, ly->o, D.ws.attn, D.ws.h},
			{"gate_up", MM_GATE_UP, ly->gate_up, D.ws.h, D.ws.gu},
			{"down", MM_DOWN, ly->down, D.ws.act, D.ws.h},
		};

		for (k = 0; k < G4_ARRAY_LEN(mm); k++)
		{
			op_arg		a;
			double		us,
						wb = (double) be->ops->weight_bytes(mm[k].w);

			memset(&a, 0, sizeof(a));
			a.what = OP_MATMUL;
			a.which = mm[k].which;
			a.layer = sl;
			a.n = n;
			a.w = mm[k].w;
			a.in = mm[k].in;
			a.out = mm[k].out;
			us = time_op(n <= 256 ? 40 : 10, run_op, &a);
			printf("BENCH matmul path=%s n=%d op=%s us=%.2f weight_TBs=%.2f TFLOPs=%.1f\n", label, n, mm[k].name, us,
				   wb / (us * 1e-6) / 1e12, 2.0 * n * wb * 2.0 / (us * 1e-6) / 1e12);
			sum += us;
			bytes += wb;
			flops += 2.0 * n * wb * 2.0;	/* ~2 weights per byte */
		}
	}
	printf("BENCH matmul path=%s n=%d op=\"sliding layer\" us=%.2f weight_TBs=%.2f TFLOPs=%.1f\n", label, n, sum,
		   bytes / (sum * 1e-6) / 1e12, flops / (sum * 1e-6) / 1e12);
	note("int4 %-5s n=%-5d sliding layer %8.1f us  %.2f TB/s  %.0f TFLOP/s", label, n, sum,
		 bytes / (sum * 1e-6) / 1e12, flops / (sum * 1e-6) / 1e12);
	fflush(stdout);
}

/* Every path at every row count it serves; with lt_algos > 0 only cuBLASLt,
 * once with each of the heuristic's first lt_algos algorithms ("lt#i"). */
static void
bench_matmul(const int *ns, int n_ns, int lt_algos)
{
	static const char *paths[] = {"gemv", "gemm", "wgmma", "lt"};
	size_t		i,
				p;

	for (i = 0; i < (size_t) n_ns; i++)
	{
		int			n = G4_MIN(ns[i], D.ws.mlp_rows);

		for (p = 0; p < G4_ARRAY_LEN(paths) && lt_algos <= 0; p++)
		{
			if (p == 0 && n > 16)
				continue;		/* the GEMV serves 1 to 16 rows */
			setenv("G4_MATMUL_I4", paths[p], 1);
			bench_matmul_layer(n, paths[p]);
		}
		for (p = 0; p < (size_t) lt_algos; p++)
		{
			char		k[16],
						label[16];

			snprintf(k, sizeof(k), "%d", (int) p);
			snprintf(label, sizeof(label), "lt#%d", (int) p);
			setenv("G4_MATMUL_I4", "lt", 1);
			setenv("G4_LT_ALGO", k, 1);
			bench_matmul_layer(n, label);
		}
	}
	unsetenv("G4_MATMUL_I4");
	unsetenv("G4_LT_ALGO");
}

/* ---- capacity ---------------------------------------------------------------- */

static void
bench_capacity(void)
{
	static const int dtypes[] = {G4_KV_BF16, G4_KV_TURBOQUANT_K8V4};
	size_t		k;

	for (k = 0; k < G4_ARRAY_LEN(dtypes); k++)
	{
		g4_err		err;
		int64_t		fit = 0;
		int			seqs = 1;
		int			s;
		char		name[128];
		size_t		free_b,
					total;
		double		left;

		/* the pool reserves sliding-window room for max_seqs sequences and
		 * gives the rest to the full group: find the largest max_seqs whose
		 * pool fits that many full-length sequences (binary search) */
		{
			int			lo = 1,
						hi = MAX_SEQS;

			while (lo <= hi)
			{
				int			mid = (lo + hi) / 2;

				g4_kvpool_free(&D.kv);
				be->ops->device_info(be, name, sizeof(name), &free_b, &total);
				left = 0.95 * (double) total - (double) (total - free_b) - (double) (512 << 20);
				if (g4_kvpool_init(&D.kv, D.m, dtypes[k], left > 0 ? (size_t) left : 0, mid, MAX_LEN, MAX_TOKENS, 0,
								   &err) != G4_OK)
					die(&err, "capacity pool");
				fit = g4_kvpool_fit(&D.kv, MAX_LEN);
				if (fit >= mid)
				{
					seqs = mid;
					lo = mid + 1;
				}
				else
					hi = mid - 1;
			}
			g4_kvpool_free(&D.kv);
			be->ops->device_info(be, name, sizeof(name), &free_b, &total);
			left = 0.95 * (double) total - (double) (total - free_b) - (double) (512 << 20);
			if (g4_kvpool_init(&D.kv, D.m, dtypes[k], left > 0 ? (size_t) left : 0, seqs, MAX_LEN, MAX_TOKENS, 0, &err) !=
				G4_OK)
				die(&err, "capacity pool");
			fit = g4_kvpool_fit(&D.kv, MAX_LEN);
		}
		kv_dtype = dtypes[k];
		printf("BENCH capacity kv=%s pool_GB=%.2f full_blocks=%d sliding_blocks=%d predicted_full_262k_seqs=%lld\n",
			   kv_name(dtypes[k]), (double) D.kv.bytes_total / 1e9, D.kv.n_blocks[G4_KVG_FULL],
			   D.kv.n_blocks[G4_KVG_SLIDING], (long long) fit);
		fflush(stdout);
		if (fit > MAX_SEQS)
			fit = MAX_SEQS;
		for (s = 0; s < fit; s++)
			if (drv_reserve(&D, s, MAX_LEN - 2, &err) != G4_OK)
			{
				printf("BENCH capacity kv=%s reserve_failed_at=%d (%s)\n", kv_name(dtypes[k]), s, err.msg);
				break;
			}
		{
			drv_item	it[MAX_SEQS];
			int32_t		tok[MAX_SEQS],
						ids[MAX_SEQS];
			int			n = s,
						step;
			double		t0 = 0,
						dt;

			D.use_graphs = 0;
			for (step = 0; step < 2; step++)
			{
				int			i;

				if (step == 1)
					t0 = g4_now();
				for (i = 0; i < n; i++)
				{
					it[i].slot = i;
					it[i].start = MAX_LEN - 2 + step;
					it[i].count = 1;
					it[i].logits = 1;
					tok[i] = step ? ids[i] : rand_token();
				}
				if (drv_step(&D, n, it, tok, &err) != G4_OK || drv_argmax(&D, ids, &err) != G4_OK)
					die(&err, "capacity decode");
			}
			dt = g4_now() - t0;
			printf("BENCH capacity kv=%s running_full_262k_seqs=%d decode_step_s=%.3f tok_s=%.1f kv_read_GB=%.1f\n",
				   kv_name(dtypes[k]), n, dt, n / dt, n * kv_read_bytes(MAX_LEN) / 1e9);
			note("capacity %s: %d of %lld predicted 262k-token sequences decoded together, %.3f s/step",
				 kv_name(dtypes[k]), n, (long long) fit, dt);
			for (s = 0; s < n; s++)
				drv_release(&D, s, MAX_LEN);
		}
		fflush(stdout);
	}
}

/* A comma-separated list of positive counts up to limit into out (at
 * most max of them). */
static int
parse_counts(const char *s, int *out, int max, int limit)
{
	int			n = 0;

	while (*s && n < max)
	{
		char	   *end;
		long		v = strtol(s, &end, 10);

		if (end == s || v <= 0 || v > limit)
		{
			fprintf(stderr, "bench-gpu: bad count list \"%s\"\n", s);
			exit(2);
		}
		out[n++] = (int) v;
		s = *end == ',' ? end + 1 : end;
	}
	return n;
}

int
main(int argc, char **argv)
{
	static const int ops_default[] = {1, 64, 2048};
	static const int matmul_default[] = {17, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 2048};
	static const int prefill_default[] = {2048, 32768};
	int			ops_n[16],
				matmul_n[16],
				prefill_n[16];
	int			n_ops = (int) G4_ARRAY_LEN(ops_default),
				n_matmul = (int) G4_ARRAY_LEN(matmul_default),
				n_prefill = (int) G4_ARRAY_LEN(prefill_default),
				ops_tokens = 1,
				lt_algos = 0;
	const char *model = NULL;
	const char *what = "ops,decode,knockout,prefill,capacity";
	g4_err		err;
	int			i;
	char		name[256];
	size_t		free_b,
				total;

	memcpy(ops_n, ops_default, sizeof(ops_default));
	memcpy(matmul_n, matmul_default, sizeof(matmul_default));
	memcpy(prefill_n, prefill_default, sizeof(prefill_default));
	for (i = 1; i < argc; i++)
	{
		if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
			model = argv[++i];
		else if (strcmp(argv[i], "--what") == 0 && i + 1 < argc)
			what = argv[++i];
		else if (strcmp(argv[i], "--kv") == 0 && i + 1 < argc)
		{
			i++;
			kv_dtype = strcmp(argv[i], "bf16") == 0 ? G4_KV_BF16 : G4_KV_TURBOQUANT_K8V4;
		}
		else if (strcmp(argv[i], "--ops-n") == 0 && i + 1 < argc)
			n_ops = parse_counts(argv[++i], ops_n, (int) G4_ARRAY_LEN(ops_n), MAX_TOKENS);
		else if (strcmp(argv[i], "--ops-tokens") == 0 && i + 1 < argc)
			ops_tokens = atoi(argv[++i]);
		else if (strcmp(argv[i], "--matmul-n") == 0 && i + 1 < argc)
			n_matmul = parse_counts(argv[++i], matmul_n, (int) G4_ARRAY_LEN(matmul_n), MAX_TOKENS);
		else if (strcmp(argv[i], "--lt-algos") == 0 && i + 1 < argc)
			lt_algos = atoi(argv[++i]);
		else if (strcmp(argv[i], "--prefill-tokens") == 0 && i + 1 < argc)
			n_prefill = parse_counts(argv[++i], prefill_n, (int) G4_ARRAY_LEN(prefill_n), MAX_LEN - 1);
	}
	if (!model || ops_tokens < 1 || ops_tokens > 8)
	{
		fprintf(stderr, "usage: bench-gpu --model DIR [--what ops,decode,knockout,prefill,capacity] [--kv bf16|tq] [--ops-n LIST] [--ops-tokens T] [--matmul-n LIST] [--lt-algos N] [--prefill-tokens LIST]\n");
		return 2;
	}
	if (g4_backend_cuda_create(0, &be, &err) != G4_OK)
		die(&err, "cuda");
	/* an 80 GiB pool, or what the device leaves, for the throughput runs;
	 * capacity re-sizes it */
	if (drv_open(&D, model, be, kv_dtype, (size_t) 80 << 30, MAX_SEQS, MAX_LEN, MAX_TOKENS, &err) != G4_OK)
		die(&err, "open");
	be->ops->device_info(be, name, sizeof(name), &free_b, &total);
	printf("BENCH setup device=\"%s\" weights_GB=%.3f workspace_GB=%.2f kv_pool_GB=%.2f load_s=%.1f free_GB=%.1f\n",
		   name, (double) D.m->weight_bytes / 1e9, (double) D.ws.bytes / 1e9, (double) D.kv.bytes_total / 1e9,
		   D.open_secs, (double) free_b / 1e9);
	fflush(stdout);
	if (strstr(what, "ops"))
		for (i = 0; i < n_ops; i++)
			breakdown(ops_n[i], ops_tokens, ops_n[i] <= 64 ? 2048 : 0);
	if (strstr(what, "matmul"))
		bench_matmul(matmul_n, n_matmul, lt_algos);
	if (strstr(what, "decode"))
		bench_decode();
	if (strstr(what, "knockout"))
		bench_knockout();
	if (strstr(what, "prefill"))
		bench_prefill(prefill_n, n_prefill);
	if (strstr(what, "capacity"))
		bench_capacity();
	printf("\n== bench-gpu summary (%s, kv %s) ==\n", name, kv_name(kv_dtype));
	for (i = 0; i < n_summary; i++)
		printf("  %s\n", summary[i]);
	drv_close(&D);
	be->ops->destroy(be);
	return 0;
}
