/*
 * parity_media.c — the media embedders' cases: their layer norm, bias and
 * 2-D position table on random rows, and the whole embedders of the fixture
 * model on a real image and audio clip of test/fixtures/media.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "media.h"
#include "model.h"
#include "parity.h"
#include "test.h"
#include "util.h"

/* ---- layer norm, bias and positions ------------------------------------------------- */

#define N_POS 1120				/* positions of the table, per axis */

/* Random rows (a few offset: the variance must not cancel), weight, bias, a
 * position table and each row's (x, y) positions, on both sides. */
typedef struct
{
	int			rows,
				dim;
	size_t		n;
	float	   *x,
			   *w,
			   *b,
			   *table,
			   *yc,
			   *yg;
	int32_t    *pos;
	float	   *dx,
			   *dw,
			   *db,
			   *dt,
			   *dy;
	int32_t    *dp;
} embed_ops_fixture;

static void *
embed_ops_setup(const parity_row *r)
{
	embed_ops_fixture *f = p_calloc(1, sizeof(*f));
	int			rows = r->a.shape.rows,
				dim = r->a.shape.dim,
				k;
	size_t		nt = (size_t) N_POS * 2 * (size_t) dim;

	f->rows = rows;
	f->dim = dim;
	f->n = (size_t) rows * (size_t) dim;
	f->x = p_malloc(f->n * 4);
	f->w = p_malloc((size_t) dim * 4);
	f->b = p_malloc((size_t) dim * 4);
	f->table = p_malloc(nt * 4);
	f->yc = p_malloc(f->n * 4);
	f->yg = p_malloc(f->n * 4);
	f->pos = p_malloc((size_t) rows * 2 * sizeof(int32_t));
	fill_normal(f->x, f->n, 2.0f);
	for (k = 0; k < 8 && (size_t) k < f->n; k++)
		f->x[k] += 40.0f;		/* an offset mean: the variance must not cancel */
	fill_normal(f->w, (size_t) dim, 1.0f);
	fill_normal(f->b, (size_t) dim, 0.3f);
	fill_normal(f->table, nt, 0.02f);
	for (k = 0; k < rows; k++)
	{
		/* the last row is padding (-1, -1), one more has only x */
		f->pos[2 * k] = k == rows - 1 && rows > 1 ? -1 : (int32_t) (rnd() % N_POS);
		f->pos[2 * k + 1] = (k == rows - 1 && rows > 1) || k == 1 ? -1 : (int32_t) (rnd() % N_POS);
	}
	f->dx = gpu_copy(f->x, f->n * 4);
	f->dw = gpu_copy(f->w, (size_t) dim * 4);
	f->db = gpu_copy(f->b, (size_t) dim * 4);
	f->dt = gpu_copy(f->table, nt * 4);
	f->dp = gpu_copy(f->pos, (size_t) rows * 2 * sizeof(int32_t));
	f->dy = gpu_alloc(f->n * 4);
	return f;
}

static int
layernorm_describe(const parity_row *r, int i, char *label, size_t size)
{
	snprintf(label, size, "rows=%d dim=%d%s", r->a.shape.rows, r->a.shape.dim,
			 r->each[i] == LAYERNORM_IN_PLACE ? " in place" : "");
	return 1;
}

static void
layernorm_run(const parity_row *r, void *fx, int i, double *metric)
{
	embed_ops_fixture *f = fx;

	if (r->each[i] == LAYERNORM_IN_PLACE)
	{
		memcpy(f->yc, f->x, f->n * 4);
		P_RUN(cpu_be, layernorm, f->yc, f->w, f->b, f->rows, f->dim, 1e-5f, f->yc);
		gpu_put(f->dy, f->x, f->n * 4);
		P_RUN(gpu_be, layernorm, f->dy, f->dw, f->db, f->rows, f->dim, 1e-5f, f->dy);
	}
	else
	{
		P_RUN(cpu_be, layernorm, f->x, f->w, f->b, f->rows, f->dim, 1e-5f, f->yc);
		P_RUN(gpu_be, layernorm, f->dx, f->dw, f->db, f->rows, f->dim, 1e-5f, f->dy);
	}
	gpu_get(f->yg, f->dy, f->n * 4);
	metric[0] = max_rel(f->yg, f->yc, f->n);
}

const parity_kind parity_layernorm = {
	.family = "media",
	.describe = layernorm_describe,
	.setup = embed_ops_setup,
	.run = layernorm_run,
};

static int
add_bias_pos2d_describe(const parity_row *r, int i, char *label, size_t size)
{
	snprintf(label, size, "rows=%d dim=%d bias + positions", r->a.shape.rows, r->a.shape.dim);
	return 1;
}

static void
add_bias_pos2d_run(const parity_row *r, void *fx, int i, double *metric)
{
	embed_ops_fixture *f = fx;

	memcpy(f->yc, f->x, f->n * 4);
	P_RUN(cpu_be, add_bias, f->yc, f->b, f->rows, f->dim);
	P_RUN(cpu_be, add_pos2d, f->yc, f->table, f->pos, f->rows, f->dim);
	gpu_put(f->dy, f->x, f->n * 4);
	P_RUN(gpu_be, add_bias, f->dy, f->db, f->rows, f->dim);
	P_RUN(gpu_be, add_pos2d, f->dy, f->dt, f->dp, f->rows, f->dim);
	gpu_get(f->yg, f->dy, f->n * 4);
	metric[0] = max_rel(f->yg, f->yc, f->n);
}

const parity_kind parity_add_bias_pos2d = {
	.family = "media",
	.describe = add_bias_pos2d_describe,
	.setup = embed_ops_setup,
	.run = add_bias_pos2d_run,
};

/* ---- the whole embedders of the fixture model ------------------------------------- */

typedef struct
{
	g4_model   *mc,
			   *mg;
} models_fixture;

static int
media_embed_describe(const parity_row *r, int i, char *label, size_t size)
{
	snprintf(label, size, "%s", r->a.media.file);
	return 1;
}

static void *
media_embed_setup(const parity_row *r)
{
	const char *model = h_fixture_model();
	models_fixture *f;
	g4_err		err;

	if (!model)
		parity_skip("G4_FIXTURE_MODEL not set");
	f = p_calloc(1, sizeof(*f));
	P_OK(g4_model_load(model, cpu_be, &f->mc, 0, &err), &err);
	P_OK(g4_model_load(model, gpu_be, &f->mg, 0, &err), &err);
	return f;
}

static void
media_embed_teardown(void *fx)
{
	models_fixture *f = fx;

	g4_model_free(f->mc);
	g4_model_free(f->mg);
}

static void
media_embed_run(const parity_row *r, void *fx, int i, double *metric)
{
	models_fixture *f = fx;
	char		path[4096];
	char	   *data;
	size_t		len,
				n;
	g4_media	m;
	g4_media_limits lim = {G4_DEFAULT_SOFT_TOKENS, G4_DEFAULT_MAX_IMAGE_PIXELS, 60.0};
	g4_media_input in;
	float	   *rc,
			   *rg;
	g4_err		err;

	snprintf(path, sizeof(path), "%s/test/fixtures/media/%s", g4_test_srcdir(), r->a.media.file);
	P_OK(g4_read_file(path, &data, &len, &err), &err);
	m.kind = r->a.media.kind;
	m.data = (const uint8_t *) data;
	m.len = len;
	P_OK(g4_media_prepare(&m, 1, &lim, NULL, &in, &err), &err);
	n = (size_t) in.n_tokens * (size_t) f->mc->cfg.hidden_size;
	rc = p_malloc(n * 4);
	rg = p_malloc(n * 4);
	P_OK(g4_model_embed_media(f->mc, &in, rc, &err), &err);
	P_OK(g4_model_embed_media(f->mg, &in, rg, &err), &err);
	metric[0] = max_rel(rg, rc, n);
	free(data);
	g4_media_input_free(&in);
}

const parity_kind parity_media_embed = {
	.family = "media",
	.describe = media_embed_describe,
	.setup = media_embed_setup,
	.teardown = media_embed_teardown,
	.run = media_embed_run,
};
