/*
 * dry_steps.c — the engine's largest steps, run through the backend dry
 * (see dry_steps.h).
 */
#include "dry_steps.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"

/* the shortest run of a sequence's tokens the k_eq_v prefill attention
 * takes apart (cuda/backend_cuda.cu): the most such runs a step holds at
 * the window's end is what its key and value rows grow with */
#define DRY_RUN_TOKENS 64

typedef struct
{
	g4_dry_step *out;
	int			cap;
	int			n;
} shape_list;

static void
add(shape_list *l, const char *what, g4_dry_part a, g4_dry_part b)
{
	if (a.seqs < 1 || a.tokens < 1)
		return;
	if (l->n < l->cap)
	{
		g4_dry_step *st = &l->out[l->n];

		st->what = what;
		st->part[0] = a;
		st->part[1] = b.seqs > 0 && b.tokens > 0 ? b : (g4_dry_part) {0, 0, 0, 0};
	}
	l->n++;
}

int
g4_dry_step_shapes(const g4_engine *e, g4_dry_step *out, int cap)
{
	int			T = e->max_batched;
	int			L = e->max_model_len;
	int			S = e->max_seqs;
	int			k = e->draft.m ? e->spec_k : 0;
	int			chunk = G4_MIN(T, L);
	int			runs = G4_MAX(1, G4_MIN(S, T / DRY_RUN_TOKENS));
	shape_list	l = {out, out ? cap : 0, 0};
	const g4_dry_part none = {0, 0, 0, 0};

	add(&l, "a prompt's first chunk", (g4_dry_part) {1, chunk, chunk, 1}, none);
	add(&l, "a chunk at the end of the window", (g4_dry_part) {1, chunk, L, 1}, none);
	if (runs > 1)
		add(&l, "chunks of many prompts at the end of the window", (g4_dry_part) {runs, G4_MIN(T / runs, L), L, 1},
			none);
	if (S > 1 && T > S - 1)
		add(&l, "a chunk beside every other slot decoding", (g4_dry_part) {S - 1, 1, L, 1},
			(g4_dry_part) {1, G4_MIN(T - (S - 1), L), L, 1});
	for (int n = 1; n <= G4_MIN(S, T); n++)
		add(&l, "decoding", (g4_dry_part) {n, 1, L, 1}, none);
	if (k > 0)
		for (int n = 1; n <= G4_MIN(G4_MIN(S, e->opts.spec_max_batch), T / (k + 1)); n++)
			add(&l, "verifying drafts", (g4_dry_part) {n, k + 1, L, k + 1}, none);
	return l.n;
}

int
g4_dry_meta_alloc(const g4_engine *e, g4_dry_meta *b)
{
	size_t		T = (size_t) e->max_batched;
	int			g;

	memset(b, 0, sizeof(*b));
	b->token = g4_calloc(T, sizeof(int32_t));
	b->pos = g4_malloc(T * sizeof(int32_t));
	b->slot = g4_malloc(T * sizeof(int32_t));
	b->logit_rows = g4_malloc((size_t) G4_MAX(e->max_logits, 1) * sizeof(int32_t));
	for (g = 0; g < G4_KVG_COUNT; g++)
	{
		b->lo[g] = g4_malloc(T * sizeof(int32_t));
		b->hi[g] = g4_malloc(T * sizeof(int32_t));
	}
	if (!b->token || !b->pos || !b->slot || !b->logit_rows || !b->lo[0] || !b->lo[1] || !b->hi[0] || !b->hi[1])
	{
		g4_dry_meta_free(b);
		return G4_ERR_NOMEM;
	}
	return G4_OK;
}

void
g4_dry_meta_free(g4_dry_meta *b)
{
	int			g;

	free(b->token);
	free(b->pos);
	free(b->slot);
	free(b->logit_rows);
	for (g = 0; g < G4_KVG_COUNT; g++)
	{
		free(b->lo[g]);
		free(b->hi[g]);
	}
	memset(b, 0, sizeof(*b));
}

/* The step metadata over b's arrays. */
static void
view(g4_dry_meta *b, int n_tokens, int n_logits, g4_step_meta *meta)
{
	memset(meta, 0, sizeof(*meta));
	meta->n_tokens = n_tokens;
	meta->token = b->token;
	meta->pos = b->pos;
	meta->slot = b->slot;
	for (int g = 0; g < G4_KVG_COUNT; g++)
	{
		meta->lo[g] = b->lo[g];
		meta->hi[g] = b->hi[g];
	}
	meta->n_logits = n_logits;
	meta->logit_rows = b->logit_rows;
}

void
g4_dry_step_meta(const g4_engine *e, const g4_dry_step *st, g4_dry_meta *b, g4_step_meta *meta)
{
	int			W = e->model->cfg.sliding_window;
	int			row = 0,
				n_logits = 0,
				seq = 0;

	for (int p = 0; p < G4_DRY_PARTS; p++)
	{
		const g4_dry_part *part = &st->part[p];

		for (int i = 0; i < part->seqs; i++, seq++)
			for (int t = 0; t < part->tokens; t++, row++)
			{
				int			pos = part->end - part->tokens + t;

				b->pos[row] = pos;
				b->slot[row] = seq;
				b->lo[G4_KVG_SLIDING][row] = W > 0 ? G4_MAX(0, pos - W + 1) : 0;
				b->hi[G4_KVG_SLIDING][row] = pos + 1;
				b->lo[G4_KVG_FULL][row] = 0;
				b->hi[G4_KVG_FULL][row] = pos + 1;
				if (t >= part->tokens - part->logits)
					b->logit_rows[n_logits++] = row;
			}
	}
	view(b, row, n_logits, meta);
}

/* A draft round of k passes for n sequences at the window's end (their
 * rows of ws.lx: the first ones). */
static int
dry_draft(g4_engine *e, int n, g4_dry_meta *b, int32_t *ids, g4_err *err)
{
	int			L = e->max_model_len;
	g4_step_meta meta;

	for (int i = 0; i < n; i++)
	{
		int32_t		lo[G4_KVG_COUNT],
					hi[G4_KVG_COUNT];

		g4_draft_ranges(L - 1, e->model->cfg.sliding_window, lo, hi);
		b->pos[i] = L - 1;
		b->slot[i] = i;
		b->logit_rows[i] = i;
		for (int g = 0; g < G4_KVG_COUNT; g++)
		{
			b->lo[g][i] = lo[g];
			b->hi[g][i] = hi[g];
		}
	}
	view(b, n, n, &meta);
	return g4_draft_round(&e->draft, &meta, e->ws.lx, e->spec_k, ids, err);
}

/* What a dry step that failed was, for the error. */
#define WHAT_LEN 160

/* Draft rounds for every number of drafting sequences. */
static int
dry_drafts(g4_engine *e, g4_dry_meta *b, char *what, g4_err *err)
{
	int			most = G4_MIN(G4_MIN(e->max_seqs, e->opts.spec_max_batch), G4_MIN(e->draft.max_rows, e->max_batched));
	int32_t    *ids;
	int			rc = G4_OK;

	if (!e->draft.m || e->spec_k < 1 || most < 1)
		return G4_OK;
	ids = g4_malloc((size_t) e->spec_k * (size_t) most * sizeof(int32_t));
	if (!ids)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	for (int n = 1; n <= most && rc == G4_OK; n++)
		if ((rc = dry_draft(e, n, b, ids, err)) != G4_OK)
			snprintf(what, WHAT_LEN, "a draft round of %d sequences", n);
	free(ids);
	return rc;
}

/* The device sampler at every number of rows up to max_logits: its
 * partial results grow with rows times the blocks each row is split over,
 * which shrink as rows grow. */
static int
dry_sample(g4_engine *e, char *what, g4_err *err)
{
	g4_backend *be = e->be;
	const g4_model_config *c = &e->model->cfg;
	int			N = e->max_logits;
	g4_row_sampling *rows;
	int32_t    *ids;
	int			rc = G4_OK;

	if (!be->ops->sample)
		return G4_OK;
	rows = g4_calloc((size_t) N, sizeof(g4_row_sampling));
	ids = g4_calloc((size_t) N, sizeof(int32_t));
	if (!rows || !ids)
	{
		free(rows);
		free(ids);
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	}
	for (int i = 0; i < N; i++)
	{
		/* every pass of the sampler: temperature, min-p, top-k, top-p */
		rows[i].temperature = 1.0f;
		rows[i].top_p = 0.9f;
		rows[i].min_p = 0.05f;
		rows[i].top_k = 40;
		rows[i].u = 0.5;
	}
	for (int n = 1; n <= N && rc == G4_OK; n++)
		if ((rc = be->ops->sample(be, e->ws.logits, n, c->vocab_size, c->suppress_ids, c->n_suppress, rows, ids)) !=
			G4_OK)
		{
			g4_fail(err, rc, "%s backend: sample failed", be->ops->name);
			snprintf(what, WHAT_LEN, "the sampler on %d rows", n);
		}
	free(rows);
	free(ids);
	return rc;
}

int
g4_dry_steps(g4_engine *e, g4_err *err)
{
	g4_backend *be = e->be;
	g4_kv_pool_desc layout;
	g4_dry_step *shapes;
	g4_dry_meta b;
	g4_err		off_err;
	char		what[WHAT_LEN] = "";
	int			n,
				rc;
	double		t0;

	if (!be->ops->dry_run)
		return G4_OK;
	/* the kernels are chosen by the pool's layout; its blocks are not read */
	g4_kvpool_layout(&layout, e->model, e->opts.kv_dtype, e->max_seqs, e->max_model_len);
	if (be->ops->kv_configure(be, &layout) != G4_OK)
		return g4_fail(err, G4_ERR_BACKEND, "the %s backend refused the KV pool layout", be->ops->name);
	n = g4_dry_step_shapes(e, NULL, 0);
	shapes = g4_malloc((size_t) n * sizeof(g4_dry_step));
	if (!shapes || g4_dry_meta_alloc(e, &b) != G4_OK)
	{
		free(shapes);
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	}
	g4_dry_step_shapes(e, shapes, n);
	t0 = g4_now();
	rc = be->ops->dry_run(be, 1, err);
	for (int i = 0; i < n && rc == G4_OK; i++)
	{
		g4_step_meta meta;

		g4_dry_step_meta(e, &shapes[i], &b, &meta);
		rc = g4_model_forward(e->model, &e->ws, &meta, NULL, err);
		if (rc != G4_OK)
			snprintf(what, sizeof(what), "%s (%d tokens)", shapes[i].what, meta.n_tokens);
	}
	if (rc == G4_OK)
		rc = dry_drafts(e, &b, what, err);
	if (rc == G4_OK)
		rc = dry_sample(e, what, err);
	g4_dry_meta_free(&b);
	free(shapes);
	/* always back to launching; a backend that failed says why (a growth
	 * out of memory), where the operation only said that it failed */
	if (be->ops->dry_run(be, 0, &off_err) != G4_OK)
	{
		*err = off_err;
		rc = off_err.code;
	}
	if (rc != G4_OK && what[0])
		g4_fail_ctx(err, "sizing the %s backend's buffers for %s", be->ops->name, what);
	if (rc == G4_OK && e->opts.verbose)
		fprintf(stderr, "sized the %s backend's buffers for %d steps in %.3f s: %.1f MiB\n", be->ops->name, n,
				g4_now() - t0, (double) g4_backend_held_bytes(be) / 1048576.0);
	return rc;
}
