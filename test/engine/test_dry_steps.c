/*
 * test_dry_steps.c — the largest steps g4_open passes through a backend
 * dry before sizing the KV pool (dry_steps.h), on the fixture target and
 * its assistant, through a recording backend: the CPU backend's table with
 * a dry_run, every operation a no-op that checks what it is given.
 *  - dry_run is switched on once and off once, and no operation runs
 *    outside it; the pool's layout, without memory, is configured first;
 *  - every step's metadata is one the scheduler or a draft round could
 *    give: tokens and logits rows within the workspace, each sequence's
 *    rows consecutive positions inside the window in a slot of its own,
 *    visible ranges within the window, logits rows ascending;
 *  - the steps reach the limits: max_num_batched_tokens tokens, the
 *    window's last position, decoding at the window's end once for every
 *    number of sequences, a verify step whose every row wants logits, a
 *    draft round, and the sampler once for every number of rows;
 *  - a backend without dry_run sees nothing; a failure while dry names the
 *    step and the backend's own account of it, and still switches dry_run
 *    off.
 */
#include "dry_steps.h"
#include "harness.h"
#include "test.h"

typedef struct
{
	g4_backend_ops ops;			/* the CPU table, recording */
	const g4_backend_ops *cpu;
	const g4_engine *e;
	int			dry;
	int			dry_on,
				dry_off;
	int			outside;		/* operations while not dry */
	int			layout_only;	/* kv_configure saw no memory */
	int			configured;
	int			steps;
	int			fail_at;		/* step_begin number that fails, or -1 */
	int			failed;			/* it did: dry_run(0) says why, as a backend does */
	char		bad[256];		/* the first bad metadata */
	int			most_tokens,
				most_slots,
				last_pos_seen,
				verify_seen,
				decoding[64],	/* decoding steps seen, by sequences */
				draft_seen;		/* a draft pass's own operation ran */
	int			sample_min,
				sample_max,
				samples;
} recorder;

static recorder R;

static int
note(void)
{
	if (!R.dry)
		R.outside++;
	return G4_OK;
}

static void
bad(const char *fmt, int a, int b)
{
	if (!R.bad[0])
		snprintf(R.bad, sizeof(R.bad), fmt, a, b);
}

static int
rec_kv_configure(g4_backend *be, const g4_kv_pool_desc *pool)
{
	R.configured++;
	R.layout_only = !pool->base[0] && !pool->base[1] && !pool->block_tables[0] && !pool->block_tables[1] &&
		pool->max_seqs == R.e->max_seqs;
	return G4_OK;
}

static void
check_meta(const g4_step_meta *m)
{
	const g4_engine *e = R.e;
	int			W = e->model->cfg.sliding_window;
	int			slots = 0,
				all_last = 1;

	if (m->n_tokens < 1 || m->n_tokens > e->max_batched)
		bad("step of %d tokens (most %d)", m->n_tokens, e->max_batched);
	if (m->n_logits < 1 || m->n_logits > e->max_logits)
		bad("%d logits rows (most %d)", m->n_logits, e->max_logits);
	for (int i = 0; i < m->n_logits; i++)
		if (m->logit_rows[i] < 0 || m->logit_rows[i] >= m->n_tokens ||
			(i > 0 && m->logit_rows[i] <= m->logit_rows[i - 1]))
			bad("logits row %d is %d", i, m->logit_rows[i]);
	for (int t = 0; t < m->n_tokens; t++)
	{
		int			p = m->pos[t];
		int			first = t == 0 || m->slot[t] != m->slot[t - 1];

		if (p < 0 || p >= e->max_model_len)
			bad("row %d at position %d", t, p);
		if (m->slot[t] < 0 || m->slot[t] >= e->max_seqs)
			bad("row %d in slot %d", t, m->slot[t]);
		if (!first && p != m->pos[t - 1] + 1)
			bad("row %d at position %d does not follow its sequence's", t, p);
		if (first)
		{
			slots++;
			/* slots of earlier sequences are not taken again */
			for (int u = 0; u < t; u++)
				if (m->slot[u] == m->slot[t])
					bad("row %d reuses slot %d", t, m->slot[t]);
		}
		for (int g = 0; g < G4_KVG_COUNT; g++)
		{
			if (m->lo[g][t] < 0 || m->lo[g][t] > m->hi[g][t])
				bad("row %d sees keys from %d", t, m->lo[g][t]);
			if (m->hi[g][t] > p + 1)
				bad("row %d sees keys up to %d, past itself", t, m->hi[g][t]);
		}
		if (m->lo[G4_KVG_FULL][t] != 0)
			bad("row %d's full range starts at %d", t, m->lo[G4_KVG_FULL][t]);
		if (m->hi[G4_KVG_SLIDING][t] - m->lo[G4_KVG_SLIDING][t] > W + 1)
			bad("row %d sees %d sliding keys", t, m->hi[G4_KVG_SLIDING][t] - m->lo[G4_KVG_SLIDING][t]);
		if (p == e->max_model_len - 1)
			R.last_pos_seen = 1;
		else
			all_last = 0;
	}
	R.most_tokens = G4_MAX(R.most_tokens, m->n_tokens);
	R.most_slots = G4_MAX(R.most_slots, slots);
	/* a verify step: every row of every sequence wants logits, k + 1 a
	 * sequence */
	if (m->n_logits == m->n_tokens && m->n_tokens == slots * (e->spec_k + 1) && slots > 1)
		R.verify_seen = 1;
	/* a decoding step: one row a sequence at the window's end, a target
	 * step's ranges (a draft round's full range stops before the row) */
	if (all_last && m->n_tokens == slots && slots < (int) G4_ARRAY_LEN(R.decoding) &&
		m->hi[G4_KVG_FULL][0] == e->max_model_len)
		R.decoding[slots]++;
}

static int
rec_step_begin(g4_backend *be, const g4_step_meta *meta)
{
	note();
	if (R.steps++ == R.fail_at)
	{
		R.failed = 1;
		return G4_ERR_NOMEM;
	}
	check_meta(meta);
	return G4_OK;
}

static int
rec_dry_run(g4_backend *be, int on, g4_err *err)
{
	if (on != !R.dry)
		bad("dry_run(%d) while dry is %d", on, R.dry);
	R.dry = on;
	if (on)
		R.dry_on++;
	else
		R.dry_off++;
	if (!on && R.failed)
		return g4_fail(err, G4_ERR_NOMEM, "cudaMalloc (scratch): out of memory");
	return G4_OK;
}

static int
rec_sample(g4_backend *be, float *logits, int n, int vocab, const int32_t *suppress, int n_suppress,
		   const g4_row_sampling *rows, int32_t *ids)
{
	R.sample_min = R.samples ? G4_MIN(R.sample_min, n) : n;
	R.sample_max = R.samples ? G4_MAX(R.sample_max, n) : n;
	R.samples++;
	if (n > R.e->max_logits)
		bad("sampler on %d rows (most %d)", n, R.e->max_logits);
	return note();
}

/* the operations of a forward pass and a draft round: nothing, noted */
static int rec_embed(g4_backend *be, const g4_weight *t, float s, float *o) { return note(); }
static int rec_matmul(g4_backend *be, const g4_weight *w, const float *x, int n, float *y) { return note(); }
static int rec_rmsnorm(g4_backend *be, const float *x, const float *w, int r, int d, float e, float *y) { return note(); }
static int rec_head_norm_rope(g4_backend *be, float *x, int n, int s, int hd, const g4_head_run *r, int nr, float e, const g4_kv_layer *L) { return note(); }
static int rec_kv_store(g4_backend *be, const g4_kv_layer *L, const float *k, int ks, const float *v, int vs, int n) { return note(); }
static int rec_attention(g4_backend *be, const g4_kv_layer *L, const float *q, int qs, int n, float *o) { return note(); }
static int rec_geglu(g4_backend *be, const float *gu, int n, int ff, float *o) { return note(); }
static int rec_matmul_geglu(g4_backend *be, const g4_weight *w, const float *x, int n, int ff, float *gu, float *o) { return note(); }
static int rec_add_rmsnorm(g4_backend *be, float *x, const float *h, const float *w, int n, int d, float e, float s, const float *nw, float *y) { return note(); }
static int rec_embed_concat(g4_backend *be, const g4_weight *t, float s, const int32_t *ids, const float *h, int hd, int n, float *o) { R.draft_seen = 1; return note(); }
static int rec_argmax(g4_backend *be, const float *l, int n, int v, int32_t *ids) { return note(); }
static int rec_gather_logit_rows(g4_backend *be, const float *x, int d, float *o) { return note(); }
static int rec_softcap(g4_backend *be, float *x, size_t n, float c) { return note(); }
static int rec_sync(g4_backend *be, g4_err *err) { return note(); }

/* The engine's backend recording from now on (restore before g4_close). */
static void
record(g4_engine *e, int with_dry_run, int fail_at)
{
	memset(&R, 0, sizeof(R));
	R.e = e;
	R.cpu = e->be->ops;
	R.fail_at = fail_at;
	R.ops = *R.cpu;
	R.ops.dry_run = with_dry_run ? rec_dry_run : NULL;
	R.ops.kv_configure = rec_kv_configure;
	R.ops.step_begin = rec_step_begin;
	R.ops.sample = rec_sample;
	R.ops.embed = rec_embed;
	R.ops.matmul = rec_matmul;
	R.ops.rmsnorm = rec_rmsnorm;
	R.ops.head_norm_rope = rec_head_norm_rope;
	R.ops.kv_store = rec_kv_store;
	R.ops.attention = rec_attention;
	R.ops.geglu = rec_geglu;
	R.ops.matmul_geglu = rec_matmul_geglu;
	R.ops.add_rmsnorm = rec_add_rmsnorm;
	R.ops.embed_concat = rec_embed_concat;
	R.ops.argmax = rec_argmax;
	R.ops.gather_logit_rows = rec_gather_logit_rows;
	R.ops.softcap = rec_softcap;
	R.ops.sync = rec_sync;
	e->be->ops = &R.ops;
}

/* The model with its assistant opened (*e NULL when it could not be, err
 * saying why), the dry steps run through the recording backend, the CPU
 * table put back; returns what g4_dry_steps returned. */
static int
dry_steps_recorded(const char *model, g4_engine **e, int with_dry_run, int fail_at, g4_err *err)
{
	static char abuf[4096];		/* the engine keeps the options' strings */
	g4_options	o;
	int			rc;

	h_options(&o, model);
	o.draft_model_path = h_assistant_of(model, abuf, sizeof(abuf));
	o.max_num_seqs = 8;
	o.max_num_batched_tokens = 512;
	if (g4_open(&o, e, err) != G4_OK)
	{
		*e = NULL;
		return err->code;
	}
	record(*e, with_dry_run, fail_at);
	rc = g4_dry_steps(*e, err);
	(*e)->be->ops = R.cpu;
	return rc;
}

G4_TEST(dry_steps_reach_the_limits_with_valid_steps)
{
	g4_engine  *e;
	g4_err		err;
	int			rc;

	H_NEED_FIXTURE(model);
	rc = dry_steps_recorded(model, &e, 1, -1, &err);
	CHECK_MSG(e, "open: %s", err.msg);
	CHECK_OK(rc, &err);
	CHECK(e->draft.m && e->spec_k > 0);
	CHECK_MSG(!R.bad[0], "%s", R.bad);
	CHECK_INT(R.dry_on, 1);
	CHECK_INT(R.dry_off, 1);
	CHECK_INT(R.outside, 0);
	CHECK_INT(R.configured, 1);
	CHECK(R.layout_only);
	CHECK_INT(R.most_tokens, e->max_batched);
	CHECK(R.last_pos_seen);
	CHECK_INT(R.most_slots, e->max_seqs);
	for (int n = 1; n <= e->max_seqs; n++)
		CHECK_MSG(R.decoding[n] == 1, "%d decoding steps of %d sequences", R.decoding[n], n);
	CHECK(R.verify_seen);
	CHECK(R.draft_seen);
	CHECK_INT(R.sample_min, 1);
	CHECK_INT(R.sample_max, e->max_logits);
	CHECK_INT(R.samples, e->max_logits);
	/* the engine still serves after its backend was dry */
	{
		static const int32_t ids[] = {2, 1000, 1001, 1002};
		g4_request	req;
		h_result	res;

		h_token_request(&req, ids, 4, 4);
		CHECK_OK(h_run_one(e, &req, 100, &res, &err), &err);
		CHECK_INT(res.n_tokens, 4);
		h_result_free(&res);
	}
	g4_close(e);
}

G4_TEST(dry_steps_need_a_backend_that_runs_dry)
{
	g4_engine  *e;
	g4_err		err;
	int			rc;

	H_NEED_FIXTURE(model);
	rc = dry_steps_recorded(model, &e, 0, -1, &err);
	CHECK_MSG(e, "open: %s", err.msg);
	CHECK_OK(rc, &err);
	CHECK_INT(R.steps, 0);
	CHECK_INT(R.configured, 0);
	CHECK_INT(R.outside, 0);
	g4_close(e);
}

G4_TEST(dry_steps_failure_names_the_step_and_ends_dry)
{
	g4_engine  *e;
	g4_err		err;
	int			rc;

	H_NEED_FIXTURE(model);
	rc = dry_steps_recorded(model, &e, 1, 1, &err);
	CHECK_MSG(e, "open: %s", err.msg);
	CHECK_INT(rc, G4_ERR_NOMEM);
	CHECK_INT(err.code, G4_ERR_NOMEM);
	CHECK_MSG(strstr(err.msg, "sizing the cpu backend's buffers for a chunk at the end of the window (512 tokens): "
					 "cudaMalloc (scratch): out of memory"), "%s", err.msg);
	CHECK_INT(R.dry, 0);
	CHECK_INT(R.dry_off, 1);
	CHECK_INT(R.steps, 2);
	g4_close(e);
}
