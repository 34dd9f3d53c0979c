/*
 * parity_rowwise.c — the cases of the operations on rows: embedding rows
 * (with the draft model's h rows beside them), argmax, RMS norms (with the
 * residual), the heads' norm and RoPE, GeGLU, soft-capping and the gathering
 * of logit rows.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parity.h"
#include "util.h"

/* ---- embedding rows --------------------------------------------------------------- */

static int
embed_describe(const parity_row *r, int i, char *label, size_t size)
{
	const embed_args *a = &r->a.embed;

	snprintf(label, size, "%s vocab=%lld dim=%lld n=%d (elements differing)", g4_wfmt_name(a->fmt),
			 (long long) a->vocab, (long long) a->dim, a->n);
	return 1;
}

static void
embed_run(const parity_row *r, void *fx, int i, double *metric)
{
	const embed_args *a = &r->a.embed;
	int			n = a->n;
	size_t		len = (size_t) n * (size_t) a->dim;
	g4_host_weight hw;
	g4_weight  *wc,
			   *wg;
	meta_buf	mb;
	g4_step_meta m;
	float	   *oc = p_malloc(len * 4),
			   *og = p_malloc(len * 4);
	float	   *d;
	int			k;

	host_weight_make(&hw, a->fmt, a->vocab, a->dim);
	meta_init(&mb, n);
	for (k = 0; k < n; k++)
		mb.token[k] = (k % 5 == 3) ? -1 : (int32_t) (rnd() % (uint64_t) a->vocab);
	mb.token[0] = (int32_t) a->vocab - 1;
	m = meta_of(&mb);
	both_step(&m);
	wc = p_weight(cpu_be, &hw, 1);
	wg = p_weight(gpu_be, &hw, 1);
	/* rows with token -1 are the caller's: both keep the sentinel */
	memset(oc, 0x7f, len * 4);
	d = gpu_copy(oc, len * 4);
	P_RUN(cpu_be, embed, wc, 7.25f, oc);
	P_RUN(gpu_be, embed, wg, 7.25f, d);
	gpu_get(og, d, len * 4);
	metric[0] = count_differing_words(oc, og, len);
}

const parity_kind parity_embed = {
	.family = "rowwise",
	.describe = embed_describe,
	.run = embed_run,
};

/* The draft model's input rows: embedding rows by device ids beside h rows. */
static int
embed_concat_describe(const parity_row *r, int i, char *label, size_t size)
{
	const embed_args *a = &r->a.embed;

	snprintf(label, size, "%s vocab=%lld dim=%lld+%d n=%d (elements differing)", g4_wfmt_name(a->fmt),
			 (long long) a->vocab, (long long) a->dim, a->h_dim, a->n);
	return 1;
}

static void
embed_concat_run(const parity_row *r, void *fx, int i, double *metric)
{
	const embed_args *a = &r->a.embed;
	int			n = a->n;
	g4_host_weight hw;
	g4_weight  *wc,
			   *wg;
	size_t		width = (size_t) a->dim + (size_t) a->h_dim;
	int32_t    *ids = p_malloc((size_t) n * 4);
	float	   *h = p_malloc((size_t) n * (size_t) a->h_dim * 4);
	float	   *oc = p_malloc((size_t) n * width * 4);
	float	   *og = p_malloc((size_t) n * width * 4);
	int32_t    *dids;
	float	   *dh,
			   *d;
	int			k;

	host_weight_make(&hw, a->fmt, a->vocab, a->dim);
	for (k = 0; k < n; k++)
		ids[k] = (int32_t) (rnd() % (uint64_t) a->vocab);
	ids[0] = (int32_t) a->vocab - 1;
	ids[1] = G4_SAMPLE_NAN;		/* a row after a NaN: zeros */
	fill_normal(h, (size_t) n * (size_t) a->h_dim, 3.0f);
	wc = p_weight(cpu_be, &hw, 1);
	wg = p_weight(gpu_be, &hw, 1);
	dids = gpu_copy(ids, (size_t) n * 4);
	dh = gpu_copy(h, (size_t) n * (size_t) a->h_dim * 4);
	/* both outputs start as the same garbage: every element is written */
	memset(oc, 0x7f, (size_t) n * width * 4);
	d = gpu_copy(oc, (size_t) n * width * 4);
	P_RUN(cpu_be, embed_concat, wc, 7.25f, ids, h, a->h_dim, n, oc);
	P_RUN(gpu_be, embed_concat, wg, 7.25f, dids, dh, a->h_dim, n, d);
	gpu_get(og, d, (size_t) n * width * 4);
	metric[0] = count_differing_words(oc, og, (size_t) n * width);
}

const parity_kind parity_embed_concat = {
	.family = "rowwise",
	.describe = embed_concat_describe,
	.run = embed_concat_run,
};

/* ---- argmax --------------------------------------------------------------------------- */

static int
argmax_describe(const parity_row *r, int i, char *label, size_t size)
{
	snprintf(label, size, "n=%d vocab=%d (rows differing)", r->a.shape.rows, r->a.shape.dim);
	return 1;
}

/* The greedy choice left on the device, on random rows and on the rows that
 * test its rules: ties (the first wins), a NaN at the first, a middle or
 * the last id (G4_SAMPLE_NAN on both sides, also beside a larger value),
 * all -inf (index 0). */
static void
argmax_run(const parity_row *r, void *fx, int i, double *metric)
{
	int			n = r->a.shape.rows,
				vocab = r->a.shape.dim;
	size_t		len = (size_t) n * (size_t) vocab;
	float	   *x = p_malloc(len * 4);
	int32_t    *ic = p_malloc((size_t) n * 4),
			   *ig = p_malloc((size_t) n * 4);
	float	   *dx;
	int32_t    *dids;
	int			k,
				j,
				diff = 0;

	fill_normal(x, len, 4.0f);
	for (k = 0; k < n; k++)
	{
		float	   *row = x + (size_t) k * (size_t) vocab;

		switch (k % 6)
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
				for (j = 0; j < vocab; j++)
					row[j] = -INFINITY;
				break;
			case 5:
				row[vocab - 1] = NAN;
				break;
			default:
				break;
		}
	}
	dx = gpu_copy(x, len * 4);
	dids = gpu_alloc((size_t) n * 4);
	P_RUN(cpu_be, argmax, x, n, vocab, ic);
	P_RUN(gpu_be, argmax, dx, n, vocab, dids);
	gpu_get(ig, dids, (size_t) n * 4);
	/* the same ids, and the NaN rows' the contract's on both */
	for (k = 0; k < n; k++)
		diff += ic[k] != ig[k] || ((k % 6 == 2 || k % 6 == 3 || k % 6 == 5) && ic[k] != G4_SAMPLE_NAN);
	metric[0] = (double) diff;
}

const parity_kind parity_argmax = {
	.family = "rowwise",
	.describe = argmax_describe,
	.run = argmax_run,
};

/* ---- RMS norms -------------------------------------------------------------------------- */

/* Random rows x (std 3), residual rows h (std 20) and a weight, on both sides. */
typedef struct
{
	int			rows,
				dim;
	size_t		n;
	float	   *x,
			   *h,
			   *w,
			   *yc,
			   *yg;
	float	   *dx,
			   *dh,
			   *dw,
			   *dy;
} norm_fixture;

static void *
norm_setup(const parity_row *r)
{
	norm_fixture *f = p_calloc(1, sizeof(*f));

	f->rows = r->a.shape.rows;
	f->dim = r->a.shape.dim;
	f->n = (size_t) f->rows * (size_t) f->dim;
	f->x = p_malloc(f->n * 4);
	f->h = p_malloc(f->n * 4);
	f->w = p_malloc((size_t) f->dim * 4);
	f->yc = p_malloc(f->n * 4);
	f->yg = p_malloc(f->n * 4);
	fill_normal(f->x, f->n, 3.0f);
	fill_normal(f->h, f->n, 20.0f);
	fill_normal(f->w, (size_t) f->dim, 1.0f);
	f->dx = gpu_copy(f->x, f->n * 4);
	f->dh = gpu_copy(f->h, f->n * 4);
	f->dw = gpu_copy(f->w, (size_t) f->dim * 4);
	f->dy = gpu_alloc(f->n * 4);
	return f;
}

static int
rmsnorm_describe(const parity_row *r, int i, char *label, size_t size)
{
	int			v = r->each[i];

	snprintf(label, size, "rows=%d dim=%d %s", r->a.shape.rows, r->a.shape.dim,
			 v == NORM_WEIGHTED ? "weighted" : v == NORM_UNWEIGHTED ? "no weight" : "in place");
	return 1;
}

static void
rmsnorm_run(const parity_row *r, void *fx, int i, double *metric)
{
	norm_fixture *f = fx;
	int			v = r->each[i];

	if (v == NORM_IN_PLACE)
	{
		memcpy(f->yc, f->x, f->n * 4);
		P_RUN(cpu_be, rmsnorm, f->yc, f->w, f->rows, f->dim, 1e-6f, f->yc);
		gpu_put(f->dy, f->x, f->n * 4);
		P_RUN(gpu_be, rmsnorm, f->dy, f->dw, f->rows, f->dim, 1e-6f, f->dy);
	}
	else
	{
		int			weighted = v == NORM_WEIGHTED;

		P_RUN(cpu_be, rmsnorm, f->x, weighted ? f->w : NULL, f->rows, f->dim, 1e-6f, f->yc);
		P_RUN(gpu_be, rmsnorm, f->dx, weighted ? f->dw : NULL, f->rows, f->dim, 1e-6f, f->dy);
	}
	gpu_get(f->yg, f->dy, f->n * 4);
	metric[0] = max_rel(f->yg, f->yc, f->n);
}

const parity_kind parity_rmsnorm = {
	.family = "rowwise",
	.describe = rmsnorm_describe,
	.setup = norm_setup,
	.run = rmsnorm_run,
};

static int
add_rmsnorm_describe(const parity_row *r, int i, char *label, size_t size)
{
	int			v = r->each[i];

	snprintf(label, size, "rows=%d dim=%d %s", r->a.shape.rows, r->a.shape.dim,
			 v == ADD_RESIDUAL ? "residual" : v == ADD_SCALED ? "scale=0.731" : "+ next norm");
	return v == ADD_NEXT_NORM ? 2 : 1;
}

/* metric 0: the sum; 1 (ADD_NEXT_NORM): the next norm written over h */
static void
add_rmsnorm_run(const parity_row *r, void *fx, int i, double *metric)
{
	norm_fixture *f = fx;
	int			v = r->each[i];
	int			next = v == ADD_NEXT_NORM;
	float		scale = v == ADD_SCALED ? 0.731f : 1.0f;
	float	   *hc = p_malloc(f->n * 4);

	memcpy(f->yc, f->x, f->n * 4);
	memcpy(hc, f->h, f->n * 4);
	P_RUN(cpu_be, add_rmsnorm, f->yc, hc, f->w, f->rows, f->dim, 1e-6f, scale, next ? f->x : NULL,
								  next ? hc : NULL);
	gpu_put(f->dy, f->x, f->n * 4);
	gpu_put(f->dh, f->h, f->n * 4);
	P_RUN(gpu_be, add_rmsnorm, f->dy, f->dh, f->dw, f->rows, f->dim, 1e-6f, scale, next ? f->dx : NULL,
								  next ? f->dh : NULL);
	gpu_get(f->yg, f->dy, f->n * 4);
	metric[0] = max_rel(f->yg, f->yc, f->n);
	if (next)
	{
		gpu_get(f->yg, f->dh, f->n * 4);
		metric[1] = max_rel(f->yg, hc, f->n);
	}
}

const parity_kind parity_add_rmsnorm = {
	.family = "rowwise",
	.describe = add_rmsnorm_describe,
	.setup = norm_setup,
	.run = add_rmsnorm_run,
};

/* ---- the heads' norm and RoPE ----------------------------------------------------------- */

static int
head_norm_rope_describe(const parity_row *r, int i, char *label, size_t size)
{
	const hnr_args *a = &r->a.hnr;

	snprintf(label, size, "n=%d heads=%d hd=%d%s%s%s%s", a->n, a->heads, a->hd,
			 a->rope ? (a->proportional ? " rope(partial)" : " rope") : "", a->weighted ? " weighted" : "",
			 a->kv_heads ? (a->k_eq_v ? " +k(raw)" : " +k") : "", a->v_run ? " +v" : "");
	return 1;
}

static void
head_norm_rope_run(const parity_row *r, void *fx, int i, double *metric)
{
	const hnr_args *a = &r->a.hnr;
	int			n = a->n,
				hd = a->hd;
	size_t		len = (size_t) n * (size_t) a->stride;
	float	   *x = p_malloc(len * 4),
			   *yg = p_malloc(len * 4),
			   *w = p_malloc((size_t) (hd + 1) * 4),	/* q's weight at w, k's at w + 1 */
			   *f = p_malloc((size_t) hd / 2 * 4);
	float	   *dx,
			   *dw,
			   *df;
	meta_buf	mb;
	g4_step_meta m;
	int			k;

	meta_init(&mb, n);
	/* positions up to 262143 */
	for (k = 0; k < n; k++)
		mb.pos[k] = k == 0 ? 262143 : (int32_t) (rnd() % 262144);
	m = meta_of(&mb);
	both_step(&m);
	fill_normal(x, len, 2.0f);
	fill_normal(w, (size_t) hd + 1, 1.0f);
	inv_freq_for(hd, a->proportional, a->proportional ? 1e6 : 1e4, f);
	dx = gpu_copy(x, len * 4);
	dw = gpu_copy(w, (size_t) (hd + 1) * 4);
	df = gpu_copy(f, (size_t) hd / 2 * 4);
	{
		/* the runs of a layer's q/k/v row (g4_layer_head_runs), on the
		 * host's arrays for the CPU and the device's for the GPU */
		g4_head_run rc[G4_HEAD_RUNS_MAX],
					rg[G4_HEAD_RUNS_MAX];
		int			nr = 0;

		rc[nr] = (g4_head_run) {0, a->heads, a->weighted ? w : NULL, a->rope ? f : NULL, 0};
		rg[nr++] = (g4_head_run) {0, a->heads, a->weighted ? dw : NULL, a->rope ? df : NULL, 0};
		if (a->kv_heads)
		{
			int			raw = a->k_eq_v;

			rc[nr] = (g4_head_run) {a->heads * hd, a->kv_heads, raw ? NULL : w + 1, raw ? NULL : f, 0};
			rg[nr++] = (g4_head_run) {a->heads * hd, a->kv_heads, raw ? NULL : dw + 1, raw ? NULL : df, 0};
		}
		if (a->v_run)
		{
			rc[nr] = (g4_head_run) {(a->heads + a->kv_heads) * hd, a->kv_heads, NULL, NULL, 0};
			rg[nr++] = (g4_head_run) {(a->heads + a->kv_heads) * hd, a->kv_heads, NULL, NULL, 0};
		}
		P_RUN(cpu_be, head_norm_rope, x, n, a->stride, hd, rc, nr, 1e-6f, NULL);
		P_RUN(gpu_be, head_norm_rope, dx, n, a->stride, hd, rg, nr, 1e-6f, NULL);
	}
	gpu_get(yg, dx, len * 4);
	metric[0] = max_rel(yg, x, len);
}

const parity_kind parity_head_norm_rope = {
	.family = "rowwise",
	.describe = head_norm_rope_describe,
	.run = head_norm_rope_run,
};

/* ---- GeGLU, soft-capping, logit rows ----------------------------------------------- */

static int
geglu_describe(const parity_row *r, int i, char *label, size_t size)
{
	snprintf(label, size, "n=%d ff=%d", r->a.shape.rows, r->a.shape.dim);
	return 1;
}

static void
geglu_run(const parity_row *r, void *fx, int i, double *metric)
{
	int			n = r->a.shape.rows,
				ff = r->a.shape.dim;
	size_t		len = (size_t) n * (size_t) ff;
	float	   *gu = p_malloc(2 * len * 4),
			   *oc = p_malloc(len * 4),
			   *og = p_malloc(len * 4);
	float	   *dgu,
			   *dout;

	fill_normal(gu, 2 * len, 2.5f);
	dgu = gpu_copy(gu, 2 * len * 4);
	dout = gpu_alloc(len * 4);
	P_RUN(cpu_be, geglu, gu, n, ff, oc);
	P_RUN(gpu_be, geglu, dgu, n, ff, dout);
	gpu_get(og, dout, len * 4);
	metric[0] = max_rel(og, oc, len);
}

const parity_kind parity_geglu = {
	.family = "rowwise",
	.describe = geglu_describe,
	.run = geglu_run,
};

/* rows x dim values and 5 more: a tail past any vector width */
static int
softcap_describe(const parity_row *r, int i, char *label, size_t size)
{
	snprintf(label, size, "count=%dx%d+5 cap=30", r->a.shape.rows, r->a.shape.dim);
	return 1;
}

static void
softcap_run(const parity_row *r, void *fx, int i, double *metric)
{
	size_t		len = (size_t) r->a.shape.rows * (size_t) r->a.shape.dim + 5;
	float	   *x = p_malloc(len * 4),
			   *y = p_malloc(len * 4);
	float	   *d;

	fill_normal(x, len, 40.0f);
	d = gpu_copy(x, len * 4);
	P_RUN(cpu_be, softcap, x, len, 30.0f);
	P_RUN(gpu_be, softcap, d, len, 30.0f);
	gpu_get(y, d, len * 4);
	metric[0] = max_rel(y, x, len);
}

const parity_kind parity_softcap = {
	.family = "rowwise",
	.describe = softcap_describe,
	.run = softcap_run,
};

/* the rows gathered: the last, the first, one twice, out of order */
static const int gather_rows[] = {39, 0, 17, 17, 3};

static int
gather_describe(const parity_row *r, int i, char *label, size_t size)
{
	snprintf(label, size, "%d of %d rows, dim %d (bytes differing)", (int) G4_ARRAY_LEN(gather_rows),
			 r->a.shape.rows, r->a.shape.dim);
	return 1;
}

/* metric: 1 when any byte differs */
static void
gather_run(const parity_row *r, void *fx, int i, double *metric)
{
	int			n = r->a.shape.rows,
				dim = r->a.shape.dim,
				k = (int) G4_ARRAY_LEN(gather_rows);
	size_t		out = (size_t) k * (size_t) dim * 4;
	meta_buf	mb;
	g4_step_meta m;
	float	   *x = p_malloc((size_t) n * (size_t) dim * 4),
			   *oc = p_malloc(out),
			   *og = p_malloc(out);
	float	   *dx,
			   *dout;

	meta_init(&mb, n);
	mb.n_logits = k;
	memcpy(mb.logit_rows, gather_rows, sizeof(gather_rows));
	m = meta_of(&mb);
	both_step(&m);
	fill_normal(x, (size_t) n * (size_t) dim, 1.0f);
	dx = gpu_copy(x, (size_t) n * (size_t) dim * 4);
	dout = gpu_alloc(out);
	P_RUN(cpu_be, gather_logit_rows, x, dim, oc);
	P_RUN(gpu_be, gather_logit_rows, dx, dim, dout);
	gpu_get(og, dout, out);
	metric[0] = (double) (memcmp(oc, og, out) != 0);
}

const parity_kind parity_gather = {
	.family = "rowwise",
	.describe = gather_describe,
	.run = gather_run,
};
