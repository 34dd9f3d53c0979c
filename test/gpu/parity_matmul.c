/*
 * parity_matmul.c — the matmul cases: one weight (its parts fused) against
 * the CPU backend at each row count of its row, with the error relative to
 * Σ|w·x| (the CPU backend's product of |W| and |x|), and a gate/up product
 * through GEGLU with that bound carried through it; the same product again
 * on the GPU must be bit for bit the first (deterministic reductions); and
 * weights dequantised once and kept in slots across calls.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parity.h"

/* A weight (the parts fused) on both backends, with |W| on the CPU for the
 * error measure. */
typedef struct
{
	int64_t		out;
	int64_t		in;
	float	   *absw;
	g4_weight  *wc,
			   *wg,
			   *wa;
} mm_weight;

static int64_t
mm_out(const mm_args *a)
{
	int64_t		out = 0;
	int			p;

	for (p = 0; p < a->n_parts; p++)
		out += a->outs[p];
	return out;
}

static void
mm_weight_make(mm_weight *m, const mm_args *a)
{
	g4_host_weight parts[4],
				abs_part;
	int64_t		r0 = 0,
				in = a->in;
	int			p;

	memset(m, 0, sizeof(*m));
	m->in = in;
	for (p = 0; p < a->n_parts; p++)
	{
		host_weight_make(&parts[p], a->fmt, a->outs[p], in);
		m->out += a->outs[p];
	}
	m->absw = p_malloc((size_t) m->out * (size_t) in * 4);
	/* Σ|w·x| per output, through the CPU backend on |W| and |x| */
	for (p = 0; p < a->n_parts; p++)
	{
		int64_t		r;

		for (r = 0; r < a->outs[p]; r++)
		{
			float	   *row = m->absw + (size_t) (r0 + r) * (size_t) in;
			int64_t		k;

			g4_dequant_row(a->fmt, (const uint8_t *) parts[p].data + (size_t) r * g4_wfmt_row_bytes(a->fmt, in),
						   parts[p].scales ? parts[p].scales + (size_t) r * (size_t) (in / 32) : NULL, in, row);
			for (k = 0; k < in; k++)
				row[k] = fabsf(row[k]);
		}
		r0 += a->outs[p];
	}
	abs_part.fmt = G4_W_F32;
	abs_part.out = m->out;
	abs_part.in = in;
	abs_part.data = m->absw;
	abs_part.scales = NULL;
	m->wc = p_weight(cpu_be, parts, a->n_parts);
	m->wa = p_weight(cpu_be, &abs_part, 1);
	m->wg = p_weight(gpu_be, parts, a->n_parts);
}

/* The worst error of the GPU's product yg = x·Wᵀ (n rows) relative to
 * Σ|w·x|, against the CPU backend's. */
static double
mm_error(const mm_weight *m, const float *x, int n, const float *yg)
{
	size_t		ny = (size_t) n * (size_t) m->out;
	float	   *ax = p_malloc((size_t) n * (size_t) m->in * 4),
			   *yc = p_malloc(ny * 4),
			   *ya = p_malloc(ny * 4);
	double		worst = 0.0;
	size_t		i;

	for (i = 0; i < (size_t) n * (size_t) m->in; i++)
		ax[i] = fabsf(x[i]);
	P_RUN(cpu_be, matmul, m->wc, x, n, yc);
	P_RUN(cpu_be, matmul, m->wa, ax, n, ya);
	for (i = 0; i < ny; i++)
	{
		double		e = fabs((double) yg[i] - (double) yc[i]) / ((double) ya[i] + 1e-30);

		if (e > worst || e != e)
			worst = e;
	}
	return worst;
}

/* ---- one weight, row counts in turn ------------------------------------------------ */

static int
matmul_describe(const parity_row *r, int i, char *label, size_t size)
{
	const mm_args *a = &r->a.mm;

	snprintf(label, size, "%s n=%d out=%lld%s in=%lld%s", g4_wfmt_name(a->fmt), r->each[i], (long long) mm_out(a),
			 a->n_parts > 1 ? " (fused)" : "", (long long) a->in,
			 a->force || matmul_initial_force() ? " (forced path)" : "");
	return 2;
}

static void *
matmul_setup(const parity_row *r)
{
	mm_weight  *m = p_calloc(1, sizeof(*m));

	mm_weight_make(m, &r->a.mm);
	return m;
}

/* a row that failed midway may have left its path forced */
static void
matmul_teardown(void *fx)
{
	(void) fx;
	matmul_force(matmul_initial_force());
}

/* metric 0: the error against the CPU; 1: the outputs that differ between
 * two calls on the same inputs (fresh activations each row count) */
static void
matmul_run(const parity_row *r, void *fx, int i, double *metric)
{
	const mm_weight *m = fx;
	int			n = r->each[i];
	size_t		ny = (size_t) n * (size_t) m->out;
	float	   *x = p_malloc((size_t) n * (size_t) m->in * 4),
			   *yg = p_malloc(ny * 4),
			   *yg2 = p_malloc(ny * 4);
	float	   *dx,
			   *dy,
			   *dy2;

	fill_normal(x, (size_t) n * (size_t) m->in, 1.0f);
	dx = gpu_copy(x, (size_t) n * (size_t) m->in * 4);
	dy = gpu_alloc(ny * 4);
	dy2 = gpu_alloc(ny * 4);
	/* NaN: every element must be written */
	gpu_be->ops->fill(gpu_be, dy, 0xff, ny * 4);
	gpu_be->ops->fill(gpu_be, dy2, 0xff, ny * 4);
	/* the row's own path, not that of the row whose weight it shares */
	matmul_force(r->a.mm.force ? r->a.mm.force : matmul_initial_force());
	P_RUN(gpu_be, matmul, m->wg, dx, n, dy);
	P_RUN(gpu_be, matmul, m->wg, dx, n, dy2);
	matmul_force(matmul_initial_force());
	gpu_get(yg, dy, ny * 4);
	gpu_get(yg2, dy2, ny * 4);
	metric[0] = mm_error(m, x, n, yg);
	metric[1] = count_differing_words(yg, yg2, ny);
}

/* one kind per family, so that each can be run alone (a name each) */
#define MATMUL_KIND(family_) { \
	.family = family_, \
	.describe = matmul_describe, \
	.setup = matmul_setup, \
	.teardown = matmul_teardown, \
	.run = matmul_run, \
}

const parity_kind parity_matmul_int4 = MATMUL_KIND("matmul_int4"),
			parity_matmul_bf16 = MATMUL_KIND("matmul_bf16"),
			parity_matmul_float = MATMUL_KIND("matmul_float");

/* ---- weights dequantised once, kept in slots ------------------------------------- */

/* The three weights, their activations (host and device) and each one's
 * first product (once called). */
typedef struct
{
	mm_weight	m[3];
	float	   *x[3],
			   *dx[3],
			   *first[3];
	int			called[3];
} reuse_fixture;

static int
reused_describe(const parity_row *r, int i, char *label, size_t size)
{
	const mm_reuse_args *a = &r->a.reuse;
	int			w = r->each[i],
				calls = 0,
				stepped = 0,
				seen = 0,
				k;

	if (w == STEP_BEGINS)
		return 0;
	for (k = 0; k < i; k++)
	{
		calls += r->each[k] != STEP_BEGINS;
		stepped |= r->each[k] == STEP_BEGINS;
		seen |= r->each[k] == w;
	}
	snprintf(label, size, "call %d%s: weight %c n=%d out=%lld in=%lld", calls + 1, stepped ? " (after step_begin)" : "",
			 'A' + w, a->n, (long long) mm_out(&a->w[w]), (long long) a->w[w].in);
	return seen ? 2 : 1;
}

static void *
reused_setup(const parity_row *r)
{
	const mm_reuse_args *a = &r->a.reuse;
	reuse_fixture *f = p_calloc(1, sizeof(*f));
	int			j;

	for (j = 0; j < 3; j++)
		mm_weight_make(&f->m[j], &a->w[j]);
	for (j = 0; j < 3; j++)
	{
		size_t		len = (size_t) a->n * (size_t) a->w[j].in;

		f->x[j] = p_malloc(len * 4);
		fill_normal(f->x[j], len, 1.0f);
		f->dx[j] = gpu_copy(f->x[j], len * 4);
		f->first[j] = p_malloc((size_t) a->n * (size_t) f->m[j].out * 4);
	}
	return f;
}

/* metric 0: the error against the CPU; 1 (calls after a weight's first):
 * the outputs that differ from the first call's */
static void
reused_run(const parity_row *r, void *fx, int i, double *metric)
{
	reuse_fixture *f = fx;
	int			w = r->each[i],
				n = r->a.reuse.n;
	const mm_weight *m;
	size_t		ny;
	float	   *yg,
			   *dy;

	if (w == STEP_BEGINS)
	{
		meta_buf	mb;
		g4_step_meta sm;

		meta_init(&mb, 1);
		sm = meta_of(&mb);
		both_step(&sm);
		return;
	}
	m = &f->m[w];
	ny = (size_t) n * (size_t) m->out;
	yg = p_malloc(ny * 4);
	dy = gpu_alloc(ny * 4);
	gpu_be->ops->fill(gpu_be, dy, 0xff, ny * 4);
	P_RUN(gpu_be, matmul, m->wg, f->dx[w], n, dy);
	gpu_get(yg, dy, ny * 4);
	metric[0] = mm_error(m, f->x[w], n, yg);
	if (!f->called[w])
	{
		memcpy(f->first[w], yg, ny * 4);
		f->called[w] = 1;
	}
	else
		metric[1] = count_differing_words(yg, f->first[w], ny);
}

const parity_kind parity_matmul_reused = {
	.family = "matmul_int4",
	.describe = reused_describe,
	.setup = reused_setup,
	.run = reused_run,
};

/* ---- a matmul straight after the kernel that made its input ---------------------- */

/*
 * The norms and GEGLU write a bf16 copy of their output that the matmul
 * right after them reads instead of converting (matmul_input.cu).  Each
 * expansion (PRODUCED(producer, n)) runs the producer on the GPU, then the
 * matmul on its output twice: the first takes the copy, the second (the
 * first's launches end the copy) converts.  Metric 0: the first product
 * against the CPU's on the matmul's input; 1: the outputs that differ
 * between the two (the copy is the conversion's bytes: none may).  The
 * gate/up product and GEGLU at prefill rows leave their copy in their own
 * gu buffer rather than the backend's (matmul_lt.cu).  Two
 * expansions write the input again between the producer and the matmul
 * (an upload of new rows; a soft-cap in place): the copy no longer stands
 * for it, and a matmul that took it would miss metric 0's bound by far.
 */
static int
produced_describe(const parity_row *r, int i, char *label, size_t size)
{
	static const char *const names[] = {"rmsnorm", "add_rmsnorm", "geglu", "rmsnorm, then an upload of new rows",
	"rmsnorm, then a kernel writing its output", "matmul_geglu"};
	const mm_args *a = &r->a.mm;

	snprintf(label, size, "after %s: %s n=%d out=%lld in=%lld%s", names[r->each[i] / PRODUCED_N],
			 g4_wfmt_name(a->fmt), r->each[i] % PRODUCED_N, (long long) mm_out(a), (long long) a->in,
			 a->force ? " (forced path)" : "");
	return 2;
}

static void
produced_run(const parity_row *r, void *fx, int i, double *metric)
{
	const mm_weight *m = fx;
	int			producer = r->each[i] / PRODUCED_N,
				n = r->each[i] % PRODUCED_N;
	int			K = (int) m->in;
	size_t		nx = (size_t) n * (size_t) K,
				ny = (size_t) n * (size_t) m->out;
	float	   *in = p_malloc(nx * 2 * 4),
			   *w = p_malloc((size_t) K * 4),
			   *x = p_malloc(nx * 4),
			   *yg = p_malloc(ny * 4),
			   *yg2 = p_malloc(ny * 4);
	float	   *din,
			   *dw,
			   *dres,
			   *dx = gpu_alloc(nx * 4),
			   *dy = gpu_alloc(ny * 4),
			   *dy2 = gpu_alloc(ny * 4);

	fill_normal(in, nx * 2, 1.0f);
	fill_normal(w, (size_t) K, 1.0f);
	din = gpu_copy(in, nx * 2 * 4);
	dw = gpu_copy(w, (size_t) K * 4);
	dres = gpu_copy(in + nx, nx * 4);
	matmul_force(r->a.mm.force ? r->a.mm.force : matmul_initial_force());
	if (producer == PRODUCED_ADD_RMSNORM)
		P_RUN(gpu_be, add_rmsnorm, dres, din, dw, n, K, 1e-6f, 1.0f, dw, dx);
	else if (producer == PRODUCED_GEGLU)
		P_RUN(gpu_be, geglu, din, n, K, dx);
	else if (producer == PRODUCED_MATMUL_GEGLU)
	{
		/* gate and up of K outputs each over 640 inputs (the rows of in) */
		g4_host_weight parts[2];
		g4_weight  *gu_w;

		host_weight_make(&parts[0], G4_W_I4G32, K, 640);
		host_weight_make(&parts[1], G4_W_I4G32, K, 640);
		gu_w = p_weight(gpu_be, parts, 2);
		P_RUN(gpu_be, matmul_geglu, gu_w, din, n, K, gpu_alloc(nx * 2 * 4), dx);
	}
	else
		P_RUN(gpu_be, rmsnorm, din, dw, n, K, 1e-6f, dx);
	if (producer == PRODUCED_THEN_UPLOAD)
		gpu_put(dx, in + nx, nx * 4);
	else if (producer == PRODUCED_THEN_KERNEL)
		P_RUN(gpu_be, softcap, dx, nx, 0.5f);
	P_RUN(gpu_be, matmul, m->wg, dx, n, dy);
	P_RUN(gpu_be, matmul, m->wg, dx, n, dy2);
	matmul_force(matmul_initial_force());
	gpu_get(x, dx, nx * 4);
	gpu_get(yg, dy, ny * 4);
	gpu_get(yg2, dy2, ny * 4);
	metric[0] = mm_error(m, x, n, yg);
	metric[1] = count_differing_words(yg, yg2, ny);
}

const parity_kind parity_matmul_produced = {
	.family = "matmul_int4",
	.describe = produced_describe,
	.setup = matmul_setup,
	.teardown = matmul_teardown,
	.run = produced_run,
};

/* ---- the gate/up product and GEGLU as one operation ---------------------------- */

/*
 * matmul_geglu against matmul then geglu on the GPU, both checked against
 * the CPU on their own (the rows above and parity_rowwise.c): where the
 * int4 gemms split K, GEGLU is applied as the partial sums are added
 * (matmul.cuh), and the output must be bit for bit the composition's.  The
 * weight's two parts are gate and up, out = 2 ff.
 */
static void *
matmul_geglu_setup(const parity_row *r)
{
	const mm_args *a = &r->a.mm;
	g4_host_weight parts[2];
	int			p;

	for (p = 0; p < 2; p++)
		host_weight_make(&parts[p], a->fmt, a->outs[p], a->in);
	return p_weight(gpu_be, parts, 2);
}

static int
matmul_geglu_describe(const parity_row *r, int i, char *label, size_t size)
{
	const mm_args *a = &r->a.mm;

	snprintf(label, size, "%s n=%d ff=%lld in=%lld%s", g4_wfmt_name(a->fmt), r->each[i], (long long) a->outs[0],
			 (long long) a->in, a->force ? " (forced path)" : "");
	return 1;
}

/*
 * matmul_geglu on the GPU on fresh activations x [n][in] (returned), on the
 * row's path: its output into o [n][ff] (host); when o2 is given, also
 * matmul then geglu into o2.
 */
static float *
geglu_gpu_run(const parity_row *r, const g4_weight *w, int n, float *o, float *o2)
{
	int			ff = (int) r->a.mm.outs[0];
	size_t		nx = (size_t) n * (size_t) r->a.mm.in,
				ngu = (size_t) n * 2 * (size_t) ff,
				no = (size_t) n * (size_t) ff;
	float	   *x = p_malloc(nx * 4);
	float	   *dx,
			   *dgu = gpu_alloc(ngu * 4),
			   *dout = gpu_alloc(no * 4);

	fill_normal(x, nx, 1.0f);
	dx = gpu_copy(x, nx * 4);
	gpu_be->ops->fill(gpu_be, dout, 0xff, no * 4);
	matmul_force(r->a.mm.force ? r->a.mm.force : matmul_initial_force());
	P_RUN(gpu_be, matmul_geglu, w, dx, n, ff, dgu, dout);
	gpu_get(o, dout, no * 4);
	if (o2)
	{
		P_RUN(gpu_be, matmul, w, dx, n, dgu);
		P_RUN(gpu_be, geglu, dgu, n, ff, dout);
		gpu_get(o2, dout, no * 4);
	}
	matmul_force(matmul_initial_force());
	return x;
}

/* metric: the outputs that differ from matmul then geglu */
static void
matmul_geglu_run(const parity_row *r, void *fx, int i, double *metric)
{
	size_t		no = (size_t) r->each[i] * (size_t) r->a.mm.outs[0];
	float	   *o = p_malloc(no * 4),
			   *o2 = p_malloc(no * 4);

	geglu_gpu_run(r, fx, r->each[i], o, o2);
	metric[0] = count_differing_words(o, o2, no);
}

const parity_kind parity_matmul_geglu = {
	.family = "matmul_int4",
	.describe = matmul_geglu_describe,
	.setup = matmul_geglu_setup,
	.teardown = matmul_teardown,
	.run = matmul_geglu_run,
};

/* ---- the gate/up product rounded to bf16, then GEGLU ------------------------------ */

/* |gelu_tanh'| <= 1.13 everywhere (its extremes: 1.129 near 1.5, -0.129
 * near -1.5) */
#define GELU_SLOPE_MAX 1.13
/* the bf16-class bound of a product (parity_table.c's WHY_BF16) */
#define PRODUCT_EPS 8e-3

static double
gelu_tanh_ref(double x)
{
	return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

/*
 * matmul_geglu where the product is rounded to bf16 before GEGLU (cuBLASLt's
 * rows, matmul_lt.cu), against the CPU's matmul then GEGLU.  A product
 * error of at most ε·A (A = Σ|w·x| of the output) moves gelu(g)·u by at
 * most ε·(L·A_g·(|u| + ε·A_u) + |gelu(g)|·A_u), L the largest |gelu'|: the
 * metric is the worst |Δ| over that bracket with ε = PRODUCT_EPS inside,
 * so that it meets the product's own bound ε.
 */
static void
geglu_bf16_run(const parity_row *r, void *fx, int i, double *metric)
{
	const mm_weight *m = fx;
	int			n = r->each[i],
				ff = (int) r->a.mm.outs[0];
	size_t		nx = (size_t) n * (size_t) m->in,
				ngu = (size_t) n * 2 * (size_t) ff,
				no = (size_t) n * (size_t) ff;
	float	   *og = p_malloc(no * 4),
			   *ax = p_malloc(nx * 4),
			   *yc = p_malloc(ngu * 4),
			   *ya = p_malloc(ngu * 4);
	float	   *x = geglu_gpu_run(r, m->wg, n, og, NULL);
	double		worst = 0.0;
	size_t		k;

	for (k = 0; k < nx; k++)
		ax[k] = fabsf(x[k]);
	P_RUN(cpu_be, matmul, m->wc, x, n, yc);
	P_RUN(cpu_be, matmul, m->wa, ax, n, ya);
	for (k = 0; k < no; k++)
	{
		size_t		t = k / (size_t) ff,
					j = k % (size_t) ff;
		double		g = yc[t * 2 * ff + j],
					u = yc[t * 2 * ff + ff + j],
					ag = ya[t * 2 * ff + j],
					au = ya[t * 2 * ff + ff + j];
		double		ref = gelu_tanh_ref(g) * u;
		double		bracket = GELU_SLOPE_MAX * ag * (fabs(u) + PRODUCT_EPS * au) + fabs(gelu_tanh_ref(g)) * au;
		double		e = fabs((double) og[k] - ref) / (bracket + 1e-30);

		if (e > worst || e != e)
			worst = e;
	}
	metric[0] = worst;
}

const parity_kind parity_matmul_geglu_bf16 = {
	.family = "matmul_int4",
	.describe = matmul_geglu_describe,
	.setup = matmul_setup,
	.teardown = matmul_teardown,
	.run = geglu_bf16_run,
};
