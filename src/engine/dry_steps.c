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

/* `seqs` sequences of `tokens` consecutive tokens each, the last at
 * position end - 1; the last `logits` tokens of each want logits. */
typedef struct
{
	int			seqs;
	int			tokens;
	int			end;
	int			logits;
} dry_part;

#define DRY_PARTS 2

typedef struct
{
	const char *what;
	dry_part	part[DRY_PARTS];	/* unused parts have seqs 0 */
} dry_step;

typedef struct
{
	dry_step   *out;
	int			cap;
	int			n;
} shape_list;

static void
add(shape_list *l, const char *what, dry_part a, dry_part b)
{
	if (a.seqs < 1 || a.tokens < 1)
		return;
	if (l->n < l->cap)
	{
		dry_step   *st = &l->out[l->n];

		st->what = what;
		st->part[0] = a;
		st->part[1] = b.seqs > 0 && b.tokens > 0 ? b : (dry_part) {0, 0, 0, 0};
	}
	l->n++;
}

/*
 * The step shapes at the engine's limits: a chunk of max_num_batched_tokens
 * from the start and at the window's end, chunks of many prompts, a chunk
 * beside every other slot decoding; and decoding and verifying at the
 * window's end for every number of sequences, since what a backend splits
 * a step's work into need not grow with the step (a step of 7 sequences
 * may take more partial results than one of 8).  Writes at most cap of
 * them to out (NULL: none); returns how many there are.
 */
static int
step_shapes(const g4_engine *e, dry_step *out, int cap)
{
	int			T = e->max_batched;
	int			L = e->max_model_len;
	int			S = e->max_seqs;
	int			k = e->draft.m ? e->spec_k : 0;
	int			chunk = G4_MIN(T, L);
	int			runs = G4_MAX(1, G4_MIN(S, T / DRY_RUN_TOKENS));
	shape_list	l = {out, out ? cap : 0, 0};
	const dry_part none = {0, 0, 0, 0};

	add(&l, "a prompt's first chunk", (dry_part) {1, chunk, chunk, 1}, none);
	add(&l, "a chunk at the end of the window", (dry_part) {1, chunk, L, 1}, none);
	if (runs > 1)
		add(&l, "chunks of many prompts at the end of the window", (dry_part) {runs, G4_MIN(T / runs, L), L, 1},
			none);
	if (S > 1 && T > S - 1)
		add(&l, "a chunk beside every other slot decoding", (dry_part) {S - 1, 1, L, 1},
			(dry_part) {1, G4_MIN(T - (S - 1), L), L, 1});
	for (int n = 1; n <= G4_MIN(S, T); n++)
		add(&l, "decoding", (dry_part) {n, 1, L, 1}, none);
	if (k > 0)
		for (int n = 1; n <= G4_MIN(G4_MIN(S, e->opts.spec_max_batch), T / (k + 1)); n++)
			add(&l, "verifying drafts", (dry_part) {n, k + 1, L, k + 1}, none);
	return l.n;
}

/* The metadata of one shape in the engine's step arrays: sequence i in
 * slot i, the visible ranges the scheduler gives a text prompt (config.c
 * holds a model with sliding layers to a positive window), token 0
 * everywhere. */
static void
step_meta(g4_engine *e, const dry_step *st, g4_step_meta *meta)
{
	int			W = e->model->cfg.sliding_window;
	int			row = 0,
				n_logits = 0,
				seq = 0;

	for (int p = 0; p < DRY_PARTS; p++)
	{
		const dry_part *part = &st->part[p];

		for (int i = 0; i < part->seqs; i++, seq++)
			for (int t = 0; t < part->tokens; t++, row++)
			{
				int			pos = part->end - part->tokens + t;

				e->st_token[row] = 0;
				e->st_pos[row] = pos;
				e->st_slot[row] = seq;
				e->st_lo[G4_KVG_SLIDING][row] = G4_MAX(0, pos - W + 1);
				e->st_hi[G4_KVG_SLIDING][row] = pos + 1;
				e->st_lo[G4_KVG_FULL][row] = 0;
				e->st_hi[G4_KVG_FULL][row] = pos + 1;
				if (t >= part->tokens - part->logits)
					e->st_logit_rows[n_logits++] = row;
			}
	}
	g4_step_meta_view(e, row, n_logits, meta);
}

/* What a dry step that failed was, for the error. */
#define WHAT_LEN 160

/* A draft round of k passes for n sequences at the window's end (their
 * rows of ws.lx: the first ones). */
static int
dry_draft(g4_engine *e, int n, g4_err *err)
{
	int			L = e->max_model_len;
	g4_step_meta meta;

	for (int i = 0; i < n; i++)
	{
		int32_t		lo[G4_KVG_COUNT],
					hi[G4_KVG_COUNT];

		g4_draft_ranges(L - 1, e->model->cfg.sliding_window, lo, hi);
		e->st_token[i] = 0;
		e->st_pos[i] = L - 1;
		e->st_slot[i] = i;
		e->st_logit_rows[i] = i;
		for (int g = 0; g < G4_KVG_COUNT; g++)
		{
			e->st_lo[g][i] = lo[g];
			e->st_hi[g][i] = hi[g];
		}
	}
	g4_step_meta_view(e, n, n, &meta);
	return g4_draft_round(&e->draft, &meta, e->ws.lx, e->spec_k, e->spec_ids, err);
}

/* Draft rounds for every number of drafting sequences. */
static int
dry_drafts(g4_engine *e, char *what, g4_err *err)
{
	int			most = G4_MIN(G4_MIN(e->max_seqs, e->opts.spec_max_batch), G4_MIN(e->draft.max_rows, e->max_batched));
	int			rc = G4_OK;

	if (!e->draft.m || e->spec_k < 1)
		return G4_OK;
	for (int n = 1; n <= most && rc == G4_OK; n++)
		if ((rc = dry_draft(e, n, err)) != G4_OK)
			snprintf(what, WHAT_LEN, "a draft round of %d sequences", n);
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
	int			rc = G4_OK;

	if (!be->ops->sample)
		return G4_OK;
	for (int i = 0; i < N; i++)
	{
		/* every pass of the sampler: temperature, min-p, top-k, top-p */
		memset(&e->st_samp[i], 0, sizeof(e->st_samp[i]));
		e->st_samp[i].temperature = 1.0f;
		e->st_samp[i].top_p = 0.9f;
		e->st_samp[i].min_p = 0.05f;
		e->st_samp[i].top_k = 40;
		e->st_samp[i].u = 0.5;
	}
	for (int n = 1; n <= N && rc == G4_OK; n++)
		if ((rc = be->ops->sample(be, e->ws.logits, n, c->vocab_size, c->suppress_ids, c->n_suppress, e->st_samp,
								  e->st_ids)) != G4_OK)
		{
			g4_fail(err, rc, "%s backend: sample failed", be->ops->name);
			snprintf(what, WHAT_LEN, "the sampler on %d rows", n);
		}
	return rc;
}

int
g4_dry_steps(g4_engine *e, g4_err *err)
{
	g4_backend *be = e->be;
	g4_kv_pool_desc layout;
	dry_step   *shapes;
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
	n = step_shapes(e, NULL, 0);
	shapes = g4_malloc((size_t) n * sizeof(dry_step));
	if (!shapes)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	step_shapes(e, shapes, n);
	t0 = g4_now();
	rc = be->ops->dry_run(be, 1, err);
	for (int i = 0; i < n && rc == G4_OK; i++)
	{
		g4_step_meta meta;

		step_meta(e, &shapes[i], &meta);
		rc = g4_model_forward(e->model, &e->ws, &meta, NULL, err);
		if (rc != G4_OK)
			snprintf(what, sizeof(what), "%s (%d tokens)", shapes[i].what, meta.n_tokens);
	}
	if (rc == G4_OK)
		rc = dry_drafts(e, what, err);
	if (rc == G4_OK)
		rc = dry_sample(e, what, err);
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
