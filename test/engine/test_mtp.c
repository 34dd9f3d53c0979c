/*
 * test_mtp.c — MTP speculative decoding on the fixture target and its
 * assistant (gemma4-make-model --assistant).
 *
 * Proposals: the assistant's drafting round against transformers 5.17
 * (test/golden/mtp-tiny*.*, written by test/reference/golden_mtp.py).  Both
 * sides compute in float32 from the same weights; as in test_model.c the
 * engine's logits must be as close to the float64 reference as
 * transformers' own float32 run is, within a factor of 3 (+1e-6), and the
 * proposed ids must be identical.  A drafting round's choices made on the
 * device equal those made on the host from the downloaded logits.  A
 * mismatched assistant is refused.
 *
 * The engine with drafting: greedy outputs identical to those without (each
 * KV dtype, alone and batched, with the assistant's drafts and with oracle
 * drafts accepting 0..k per step; under preemption); 1,000 steps of rejected
 * drafts leave the KV pool as without drafting; stop strings, end of
 * sequence and max_tokens inside an accepted run; speculative sampling's
 * output distribution (chi-square at 0.1 %); seeded sampled runs repeat;
 * the per-request and batch-size controls.
 */
#include <math.h>

#include "cpu/cpu.h"
#include "draft.h"
#include "harness.h"
#include "spec_accept.h"
#include "test.h"
#include "xorshift.h"

#define ERR_FACTOR 3.0
#define ERR_FLOOR 1e-6

/* In a test with model, abuf and assistant: skip without the fixture model,
 * fail without the assistant written beside it. */
#define NEED_ASSISTANT() \
	do { \
		if (!model) \
			G4_SKIP("G4_FIXTURE_MODEL not set (run through make check-engine)"); \
		assistant = h_assistant_of(model, abuf, sizeof(abuf)); \
		CHECK_MSG(assistant, "no assistant beside %s", model); \
	} while (0)

/* Rows of a rig's prefill that keep their hidden state (and draft rows). */
#define RIG_ROWS 4

/* Target + KV pool + assistant driven without the scheduler. */
typedef struct
{
	g4_model   *t;
	g4_model   *a;
	g4_workspace ws;
	g4_kvpool	kv;
	g4_draft	d;
} mtp_rig;

static int
rig_open(mtp_rig *r, const char *model, const char *assistant, g4_backend *be, g4_err *err)
{
	memset(r, 0, sizeof(*r));
	if (g4_model_load(model, be, &r->t, 0, err) != G4_OK ||
		g4_model_load_assistant(assistant, be, &r->a, err) != G4_OK ||
		g4_workspace_init(r->t, 256, RIG_ROWS, &r->ws, err) != G4_OK ||
		g4_kvpool_init(&r->kv, r->t, G4_KV_F32, (size_t) 8 << 20, 1, 512, 256, 0, err) != G4_OK ||
		g4_draft_init(&r->d, r->a, r->t, 4, err) != G4_OK)
		return err->code;
	return G4_OK;
}

static void
rig_close(mtp_rig *r)
{
	g4_draft_free(&r->d);
	if (r->kv.be)
		g4_kvpool_free(&r->kv);
	if (r->t)
		g4_workspace_free(r->t, &r->ws);
	g4_model_free(r->a);
	g4_model_free(r->t);
}

/* Prefill ids in slot 0 in one step; for each of the n_rows positions
 * rows[], leave b[] (the target's greedy choice, suppressed ids masked) and
 * the final-normed hidden state in row j of r->ws.lx. */
static int
rig_prefill(mtp_rig *r, const int32_t *ids, int n, const int32_t *rows, int n_rows, int32_t *b, g4_err *err)
{
	const g4_model_config *c = &r->t->cfg;
	g4_backend *be = r->t->be;
	size_t		V = (size_t) c->vocab_size;
	int32_t		pos[256],
				slot[256],
				lo[2][256],
				hi[2][256];
	g4_step_meta meta;
	float	   *logits = g4_malloc((size_t) RIG_ROWS * V * sizeof(float));
	int			p,
				j,
				i;

	if (!logits || n > 256 || n_rows > RIG_ROWS)
	{
		free(logits);
		return g4_fail(err, G4_ERR_INVALID, "prompt too long for the rig");
	}
	for (p = 0; p < n; p++)
	{
		pos[p] = p;
		slot[p] = 0;
		lo[G4_KVG_SLIDING][p] = G4_MAX(0, p - c->sliding_window + 1);
		hi[G4_KVG_SLIDING][p] = p + 1;
		lo[G4_KVG_FULL][p] = 0;
		hi[G4_KVG_FULL][p] = p + 1;
	}
	memset(&meta, 0, sizeof(meta));
	meta.n_tokens = n;
	meta.token = ids;
	meta.pos = pos;
	meta.slot = slot;
	for (j = 0; j < 2; j++)
	{
		meta.lo[j] = lo[j];
		meta.hi[j] = hi[j];
	}
	meta.n_logits = n_rows;
	meta.logit_rows = rows;
	if (g4_kvpool_ensure(&r->kv, 0, 0, n) != G4_OK)
	{
		free(logits);
		return g4_fail(err, G4_ERR_NOMEM, "KV pool too small");
	}
	if (g4_model_forward(r->t, &r->ws, &meta, NULL, err) != G4_OK ||
		be->ops->download(be, logits, r->ws.logits, (size_t) n_rows * V * sizeof(float)) != G4_OK ||
		be->ops->sync(be, err) != G4_OK)
	{
		free(logits);
		return err->code ? err->code : G4_ERR_BACKEND;
	}
	for (i = 0; i < n_rows; i++)
	{
		float	   *row = logits + (size_t) i * V;

		for (j = 0; j < c->n_suppress; j++)
			row[c->suppress_ids[j]] = -INFINITY;
		b[i] = 0;
		for (j = 1; j < (int) V; j++)
			if (row[j] > row[b[i]])
				b[i] = j;
	}
	free(logits);
	return G4_OK;
}

/* Draft rows for positions rows[j] + 1 of slot 0, tokens tok[]. */
typedef struct
{
	int32_t		pos[RIG_ROWS],
				slot[RIG_ROWS],
				lo[2][RIG_ROWS],
				hi[2][RIG_ROWS],
				hrow[RIG_ROWS];
	g4_step_meta meta;
} draft_rows;

static void
draft_rows_make(draft_rows *dr, const mtp_rig *r, const int32_t *rows, const int32_t *tok, int n)
{
	int			j,
				g;

	memset(dr, 0, sizeof(*dr));
	for (j = 0; j < n; j++)
	{
		int32_t		lo[2],
					hi[2];

		dr->pos[j] = rows[j] + 1;
		dr->slot[j] = 0;
		dr->hrow[j] = j;
		g4_draft_ranges(dr->pos[j], r->t->cfg.sliding_window, lo, hi);
		for (g = 0; g < 2; g++)
		{
			dr->lo[g][j] = lo[g];
			dr->hi[g][j] = hi[g];
		}
	}
	dr->meta.n_tokens = n;
	dr->meta.token = tok;
	dr->meta.pos = dr->pos;
	dr->meta.slot = dr->slot;
	for (g = 0; g < 2; g++)
	{
		dr->meta.lo[g] = dr->lo[g];
		dr->meta.hi[g] = dr->hi[g];
	}
	dr->meta.n_logits = n;
	dr->meta.logit_rows = dr->hrow;
}

static void
check_proposals(const char *model, const char *golden_name)
{
	char		abuf[4096];
	const char *assistant = h_assistant_of(model, abuf, sizeof(abuf));
	h_golden	G;
	char		why[512];
	g4_backend *be;
	mtp_rig		r;
	g4_err		err;
	const g4j  *cases;
	size_t		k;
	int			K;

	CHECK_MSG(assistant, "no assistant beside %s (make check-engine writes it)", model);
	CHECK_MSG(h_golden_load(golden_name, &G, why, sizeof(why)) == 0, "golden: %s", why);
	{
		char		path[4200];
		char		hex[32];
		const char *want = g4j_get_str(g4j_root(G.doc), "assistant_safetensors_fnv1a64");

		snprintf(path, sizeof(path), "%s/model.safetensors", assistant);
		snprintf(hex, sizeof(hex), "%016llx", (unsigned long long) h_fnv1a64_file(path));
		CHECK_MSG(want && strcmp(hex, want) == 0,
				  "the generated assistant (%s) differs from the one the references were recorded on (%s): "
				  "rerun test/reference/golden_mtp.py", hex, want ? want : "?");
	}
	CHECK_OK(g4_backend_cpu_create(2, &be, &err), &err);
	CHECK_OK(rig_open(&r, model, assistant, be, &err), &err);
	K = (int) g4j_get_int(g4j_root(G.doc), "k", 0);
	cases = g4j_get(g4j_root(G.doc), "cases");
	for (k = 0; k < g4j_len(cases); k++)
	{
		const g4j  *c = g4j_at(cases, k);
		const char *name = g4j_get_str(c, "name");
		int			V = r.a->cfg.vocab_size;
		int			n,
					nd,
					step;
		int32_t    *ids = h_ints(g4j_get(c, "ids"), &n);
		int32_t    *drafts = h_ints(g4j_get(c, "drafts"), &nd);
		float	   *lg = g4_malloc((size_t) V * sizeof(float));
		double		bound = ERR_FACTOR * g4j_get_num(c, "fp32_vs_fp64", 0) + ERR_FLOOR;
		double		worst64 = 0,
					worst32 = 0;
		int32_t		token,
					last = n - 1;
		draft_rows	dr;

		CHECK_INT(nd, K);
		g4_kvpool_release(&r.kv, 0, 512);
		CHECK_OK(rig_prefill(&r, ids, n, &last, 1, &token, &err), &err);
		CHECK_MSG(token == g4j_get_int(c, "next", -1), "%s: target chose %d, transformers %lld", name, token,
				  (long long) g4j_get_int(c, "next", -1));
		draft_rows_make(&dr, &r, &last, &token, 1);
		CHECK_OK(g4_draft_begin(&r.d, &dr.meta, r.ws.lx, &err), &err);
		for (step = 0; step < K; step++)
		{
			int32_t		id;
			size_t		off = (size_t) g4j_get_int(c, "logits_offset", 0) + (size_t) step * (size_t) V;
			size_t		off64 = (size_t) g4j_get_int(c, "logits64_offset", 0) + (size_t) step * (size_t) V;
			double		d32,
						d64;

			CHECK_OK(g4_draft_pass(&r.d, step, &err), &err);
			CHECK_OK(be->ops->download(be, lg, r.d.logits, (size_t) V * sizeof(float)), &err);
			CHECK_OK(be->ops->download(be, &id, r.d.ids + step + 1, sizeof(int32_t)), &err);
			d32 = h_max_abs_diff(lg, G.data + off, V, NULL);
			d64 = h_max_abs_diff(lg, G.data + off64, V, NULL);
			worst32 = G4_MAX(worst32, d32);
			worst64 = G4_MAX(worst64, d64);
			CHECK_MSG(d64 <= bound, "%s step %d: assistant logits are %.3g from the float64 reference (bound %.3g)",
					  name, step, d64, bound);
			CHECK_MSG(id == drafts[step], "%s step %d: proposed %d, transformers %d", name, step, id, drafts[step]);
		}
		printf("    %-12s %d proposals equal; |engine - float64| = %.2e (bound %.2e), |engine - transformers| = %.2e\n",
			   name, K, worst64, bound, worst32);
		free(ids);
		free(drafts);
		free(lg);
	}
	rig_close(&r);
	be->ops->destroy(be);
	h_golden_free(&G);
}

G4_TEST(mtp_proposals_match_transformers)
{
	const char *model = h_fixture_model();

	if (!model)
		G4_SKIP("G4_FIXTURE_MODEL not set (run through make check-engine)");
	check_proposals(model, "mtp-tiny");
}

G4_TEST(mtp_proposals_match_transformers_bf16_checkpoint)
{
	const char *model = getenv("G4_FIXTURE_DENSE");

	if (!model || !g4_is_dir(model))
		G4_SKIP("G4_FIXTURE_DENSE not set (run through make check-engine)");
	check_proposals(model, "mtp-tiny-dense");
}

/*
 * A round chooses each pass's token on the device and feeds it to the next
 * pass there: its proposals, last logits and projected states are those of
 * the same passes with the choice made on the host from downloaded logits
 * (the path rounds replaced), for several rows at once; and the device-side
 * input rows are the embedding op's rows beside h_prev, as the host built
 * them.
 */
G4_TEST(mtp_device_choice_matches_host_choice)
{
	const char *model = h_fixture_model();
	char		abuf[4096];
	const char *assistant;
	h_golden	G;
	char		why[512];
	g4_backend *be;
	mtp_rig		r;
	g4_err		err;
	int32_t    *ids;
	int			n,
				V,
				B,
				pass,
				j;
	const int	k = 4;
	int32_t		rows[3],
				tok[3],
				dev_ids[4 * 3],
				host_ids[4 * 3];
	float	   *lg_dev,
			   *lg_host,
			   *hp_dev,
			   *hp_host,
			   *emb,
			   *in_ref,
			   *in_op;
	draft_rows	dr;

	NEED_ASSISTANT();
	CHECK_MSG(h_golden_load("mtp-tiny", &G, why, sizeof(why)) == 0, "golden: %s", why);
	CHECK_OK(g4_backend_cpu_create(2, &be, &err), &err);
	CHECK_OK(rig_open(&r, model, assistant, be, &err), &err);
	ids = h_ints(g4j_get(h_golden_case(&G, "past_window"), "ids"), &n);
	CHECK_MSG(n >= 8, "the golden prompt past_window has %d tokens, 8 needed", n);
	V = r.a->cfg.vocab_size;
	B = r.a->cfg.backbone_hidden;
	rows[0] = n - 1;
	rows[1] = n - 3;
	rows[2] = n - 7;
	CHECK_OK(rig_prefill(&r, ids, n, rows, 3, tok, &err), &err);
	draft_rows_make(&dr, &r, rows, tok, 3);
	lg_dev = g4_malloc((size_t) 3 * V * sizeof(float));
	lg_host = g4_malloc((size_t) 3 * V * sizeof(float));
	hp_dev = g4_malloc((size_t) 3 * B * sizeof(float));
	hp_host = g4_malloc((size_t) 3 * B * sizeof(float));
	emb = be->ops->alloc(be, (size_t) 3 * B * sizeof(float));
	in_ref = g4_malloc((size_t) 3 * 2 * B * sizeof(float));
	in_op = g4_malloc((size_t) 3 * 2 * B * sizeof(float));
	CHECK_MSG(lg_dev && lg_host && hp_dev && hp_host && emb && in_ref && in_op, "out of memory");

	/* the round */
	CHECK_OK(g4_draft_round(&r.d, &dr.meta, r.ws.lx, k, dev_ids, &err), &err);
	CHECK_OK(be->ops->download(be, lg_dev, r.d.logits, (size_t) 3 * V * sizeof(float)), &err);
	CHECK_OK(be->ops->download(be, hp_dev, r.d.h_prev, (size_t) 3 * B * sizeof(float)), &err);

	/* pass by pass, choosing on the host */
	CHECK_OK(g4_draft_begin(&r.d, &dr.meta, r.ws.lx, &err), &err);
	CHECK_OK(be->ops->embed(be, r.t->embed, r.t->embed_scale, emb), &err);
	CHECK_OK(be->ops->download(be, in_op, emb, (size_t) 3 * B * sizeof(float)), &err);
	CHECK_OK(be->ops->download(be, hp_host, r.d.h_prev, (size_t) 3 * B * sizeof(float)), &err);
	for (j = 0; j < 3; j++)
	{
		memcpy(in_ref + (size_t) j * 2 * B, in_op + (size_t) j * B, (size_t) B * sizeof(float));
		memcpy(in_ref + (size_t) j * 2 * B + B, hp_host + (size_t) j * B, (size_t) B * sizeof(float));
	}
	for (pass = 0; pass < k; pass++)
	{
		CHECK_OK(g4_draft_pass(&r.d, pass, &err), &err);
		if (pass == 0)
		{
			/* the input the first pass built on the device */
			CHECK_OK(be->ops->download(be, in_op, r.d.in, (size_t) 3 * 2 * B * sizeof(float)), &err);
			CHECK_MSG(memcmp(in_op, in_ref, (size_t) 3 * 2 * B * sizeof(float)) == 0,
					  "embed_concat differs from the embedding rows beside h_prev");
		}
		CHECK_OK(be->ops->download(be, lg_host, r.d.logits, (size_t) 3 * V * sizeof(float)), &err);
		for (j = 0; j < 3; j++)
		{
			const float *row = lg_host + (size_t) j * V;
			int			best = 0,
						i;

			for (i = 1; i < V; i++)
				if (row[i] > row[best])
					best = i;
			host_ids[pass * 3 + j] = best;
		}
		CHECK_OK(be->ops->upload(be, r.d.ids + (size_t) (pass + 1) * 3, host_ids + pass * 3, 3 * sizeof(int32_t)),
				 &err);
	}
	CHECK_OK(be->ops->download(be, hp_host, r.d.h_prev, (size_t) 3 * B * sizeof(float)), &err);
	for (pass = 0; pass < k; pass++)
		for (j = 0; j < 3; j++)
			CHECK_MSG(dev_ids[pass * 3 + j] == host_ids[pass * 3 + j],
					  "row %d pass %d: the device chose %d, the host %d", j, pass, dev_ids[pass * 3 + j],
					  host_ids[pass * 3 + j]);
	CHECK_MSG(memcmp(lg_dev, lg_host, (size_t) 3 * V * sizeof(float)) == 0, "the last pass's logits differ");
	CHECK_MSG(memcmp(hp_dev, hp_host, (size_t) 3 * B * sizeof(float)) == 0, "the projected states differ");
	printf("    3 rows x %d passes: device and host choices equal (%d %d %d ...)\n", k, dev_ids[0], dev_ids[1],
		   dev_ids[2]);
	be->ops->free(be, emb);
	free(lg_dev);
	free(lg_host);
	free(hp_dev);
	free(hp_host);
	free(in_ref);
	free(in_op);
	free(ids);
	rig_close(&r);
	be->ops->destroy(be);
	h_golden_free(&G);
}

/* A mismatched assistant is refused at load, saying what differs. */
G4_TEST(mtp_mismatched_assistant_refused)
{
	const char *model = h_fixture_model();
	char		abuf[4096];
	const char *assistant;
	g4_backend *be;
	g4_model   *t,
			   *a;
	g4_draft	d;
	g4_err		err;
	int			rc;

	NEED_ASSISTANT();
	CHECK_OK(g4_backend_cpu_create(1, &be, &err), &err);
	CHECK_OK(g4_model_load(model, be, &t, 0, &err), &err);
	CHECK_OK(g4_model_load_assistant(assistant, be, &a, &err), &err);
	a->cfg.backbone_hidden = t->cfg.hidden_size * 2;
	rc = g4_draft_init(&d, a, t, 1, &err);
	h_failed_as("hidden size mismatch", rc, &err, G4_ERR_INVALID, "hidden size", NULL);
	a->cfg.backbone_hidden = t->cfg.hidden_size;
	a->cfg.attn[1].head_dim *= 2;
	rc = g4_draft_init(&d, a, t, 1, &err);
	h_failed_as("K/V geometry mismatch", rc, &err, G4_ERR_INVALID, "full layers", NULL);
	a->cfg.attn[1].head_dim /= 2;
	a->cfg.vocab_size--;
	rc = g4_draft_init(&d, a, t, 1, &err);
	h_failed_as("vocabulary mismatch", rc, &err, G4_ERR_INVALID, "vocabulary", NULL);
	g4_model_free(a);
	/* a target given as the draft model, and the reverse */
	rc = g4_model_load_assistant(model, be, &a, &err);
	h_failed_as("target as draft", rc, &err, G4_ERR_UNSUPPORTED, "not an MTP assistant", NULL);
	rc = g4_model_load(assistant, be, &a, 0, &err);
	h_failed_as("draft as target", rc, &err, G4_ERR_UNSUPPORTED, "draft (assistant) model", NULL);
	g4_model_free(t);
	be->ops->destroy(be);
}

/* ---- the engine with drafting ------------------------------------------ */

#define N_CASES 5
static const char *const case_names[N_CASES] = {"one_token", "short", "past_window", "long", "code"};

/* Oracle drafts: each sequence's known continuation (prompt + output), the
 * first (first_pos % (n + 1)) drafts right and the rest wrong, so every
 * accepted length 0..k occurs. */
typedef struct
{
	uint64_t	id[N_CASES];
	int32_t    *full[N_CASES];
	int			n_full[N_CASES];
	int			vocab;
} oracle;

static void
oracle_drafts(void *ctx, uint64_t seq_id, int first_pos, int32_t *drafts, int n)
{
	oracle	   *o = ctx;
	int			k,
				j;

	for (k = 0; k < N_CASES; k++)
		if (o->id[k] == seq_id)
			for (j = 0; j < n && first_pos + j < o->n_full[k]; j++)
			{
				int32_t		right = o->full[k][first_pos + j];

				drafts[j] = j < first_pos % (n + 1) ? right : (right + 1) % o->vocab;
			}
}

/* Run the golden cases (64 greedy tokens each) on an engine; tokens[k]
 * receives case k's output.  together: all submitted at once (a batch of
 * mixed lengths), else one at a time.  o: oracle drafts (NULL: the
 * assistant's). */
static void
run_cases(const g4_options *opt, int together, oracle *o, int32_t out[N_CASES][1024], int n_out[N_CASES],
		  g4_stats *st)
{
	h_golden	G;
	char		why[512];
	g4_engine  *e;
	g4_err		err;
	h_result	res[N_CASES];
	h_run		run;
	int32_t    *ids[N_CASES];
	int			n_ids[N_CASES];
	int			k;

	CHECK_MSG(h_golden_load("model-tiny", &G, why, sizeof(why)) == 0, "golden: %s", why);
	memset(res, 0, sizeof(res));
	CHECK_OK(g4_open(opt, &e, &err), &err);
	run.r = res;
	run.n = 0;
	h_attach(e, &run);
	if (o)
		g4_set_draft_hook(e, oracle_drafts, o);
	for (k = 0; k < N_CASES; k++)
	{
		const g4j  *c = h_golden_case(&G, case_names[k]);
		g4_request	req;

		ids[k] = h_ints(g4j_get(c, "ids"), &n_ids[k]);
		h_token_request(&req, ids[k], n_ids[k], 64);
		run.n = k + 1;
		CHECK_OK(g4_submit(e, &req, &res[k].id, &err), &err);
		if (o)
			o->id[k] = res[k].id;
		if (!together)
			CHECK_OK(h_drain(e, &run, 100000, &err), &err);
	}
	CHECK_OK(h_drain(e, &run, 100000, &err), &err);
	for (k = 0; k < N_CASES; k++)
	{
		CHECK_MSG(!res[k].failed && res[k].finished, "%s: %s", case_names[k], res[k].error);
		memcpy(out[k], res[k].tokens, (size_t) res[k].n_tokens * sizeof(int32_t));
		n_out[k] = res[k].n_tokens;
		free(ids[k]);
		h_result_free(&res[k]);
	}
	g4_stats_get(e, st);
	g4_close(e);
	h_golden_free(&G);
}

static void
print_spec_stats(const char *what, const g4_stats *st)
{
	int			j;

	printf("    %-34s drafted %llu, accepted %llu (%.1f%%), %llu verify steps, per position:", what,
		   (unsigned long long) st->spec_drafted, (unsigned long long) st->spec_accepted,
		   st->spec_drafted ? 100.0 * (double) st->spec_accepted / (double) st->spec_drafted : 0.0,
		   (unsigned long long) st->spec_verify_steps);
	for (j = 0; j < G4_SPEC_MAX_TOKENS && st->spec_pos_drafted[j]; j++)
		printf(" %llu/%llu", (unsigned long long) st->spec_pos_accepted[j],
			   (unsigned long long) st->spec_pos_drafted[j]);
	printf("\n");
}

static void
check_same_outputs(const char *what, int32_t a[N_CASES][1024], const int na[N_CASES], int32_t b[N_CASES][1024],
				   const int nb[N_CASES])
{
	int			k,
				i;

	for (k = 0; k < N_CASES; k++)
	{
		for (i = 0; i < na[k] && i < nb[k]; i++)
			CHECK_MSG(a[k][i] == b[k][i], "%s, %s: token %d is %d with drafting, %d without", what, case_names[k], i,
					  a[k][i], b[k][i]);
		CHECK_MSG(na[k] == nb[k], "%s, %s: %d tokens with drafting, %d without", what, case_names[k], na[k], nb[k]);
	}
}

static int32_t plain[3][N_CASES][1024];
static int	n_plain[3][N_CASES];
static int32_t drafted[N_CASES][1024];
static int	n_drafted[N_CASES];

/* Greedy output with drafting equals the output without, for each KV
 * dtype, one sequence at a time and all five together (mixed lengths):
 * with the assistant's own drafts (on random weights nearly all rejected:
 * rollback every step) and with oracle drafts accepting 0..k per step. */
static void
check_greedy_identical(int dtype, const char *name)
{
	const char *model = h_fixture_model();
	char		abuf[4096];
	const char *assistant;
	g4_options	o;
	g4_stats	st;
	oracle		orc;
	int			together,
				k;
	char		what[128];

	NEED_ASSISTANT();
	h_options(&o, model);
	o.kv_dtype = dtype;
	run_cases(&o, 0, NULL, plain[dtype], n_plain[dtype], &st);
	CHECK_MSG(st.spec_drafted == 0, "drafting without a draft model");
	o.draft_model_path = assistant;
	for (together = 0; together < 2; together++)
	{
		snprintf(what, sizeof(what), "KV %s, %s, assistant", name, together ? "batched" : "alone");
		run_cases(&o, together, NULL, drafted, n_drafted, &st);
		print_spec_stats(what, &st);
		CHECK_MSG(st.spec_drafted > 0, "%s: nothing was drafted", what);
		check_same_outputs(what, drafted, n_drafted, plain[dtype], n_plain[dtype]);

		snprintf(what, sizeof(what), "KV %s, %s, oracle", name, together ? "batched" : "alone");
		memset(&orc, 0, sizeof(orc));
		orc.vocab = 16384;
		{
			h_golden	G;
			char		why[512];

			CHECK_MSG(h_golden_load("model-tiny", &G, why, sizeof(why)) == 0, "golden: %s", why);
			for (k = 0; k < N_CASES; k++)
			{
				int			n;
				int32_t    *ids = h_ints(g4j_get(h_golden_case(&G, case_names[k]), "ids"), &n);

				orc.full[k] = g4_malloc((size_t) (n + n_plain[dtype][k]) * sizeof(int32_t));
				memcpy(orc.full[k], ids, (size_t) n * sizeof(int32_t));
				memcpy(orc.full[k] + n, plain[dtype][k], (size_t) n_plain[dtype][k] * sizeof(int32_t));
				orc.n_full[k] = n + n_plain[dtype][k];
				free(ids);
			}
			h_golden_free(&G);
		}
		run_cases(&o, together, &orc, drafted, n_drafted, &st);
		print_spec_stats(what, &st);
		CHECK_MSG(st.spec_accepted > 0, "%s: no draft was accepted", what);
		check_same_outputs(what, drafted, n_drafted, plain[dtype], n_plain[dtype]);
		for (k = 0; k < N_CASES; k++)
			free(orc.full[k]);
	}
}

G4_TEST(mtp_greedy_identical_kv_f32)
{
	check_greedy_identical(G4_KV_F32, "f32");
}

G4_TEST(mtp_greedy_identical_kv_bf16)
{
	check_greedy_identical(G4_KV_BF16, "bf16");
}

G4_TEST(mtp_greedy_identical_kv_turboquant)
{
	check_greedy_identical(G4_KV_TURBOQUANT_K8V4, "turboquant_k8v4");
}

/* ---- rollback ---------------------------------------------------------- */

/* Sliding blocks a slot holds at n computed positions when the pool keeps
 * `window` positions back (g4_seq_trim_window's rule). */
static int
sliding_blocks_expected(int n, int window)
{
	int			keep = n - window + 1;
	int			first = keep > 0 ? keep / G4_KV_BLOCK_TOKENS : 0;

	return G4_DIV_UP(n, G4_KV_BLOCK_TOKENS) - first;
}

/* The decoded K and V of every position the target can still read are
 * equal in the two pools (a: without drafting, b: with). */
static int
kv_contents_equal(const g4_engine *a, const g4_seq *sa, const g4_engine *b, const g4_seq *sb, int n)
{
	const g4_model *m = a->model;
	int			i;

	for (i = 0; i < m->cfg.n_layers; i++)
	{
		const g4_kv_layer *L = &m->layers[i].kv;
		int			g = L->group;
		int			p0 = g == G4_KVG_SLIDING ? G4_MAX(0, n - m->cfg.sliding_window + 1) : 0;
		int			p,
					h;

		for (p = p0; p < n; p++)
			for (h = 0; h < L->n_kv_heads; h++)
			{
				const g4_kvpool *pools[2] = {&a->kv, &b->kv};
				const g4_seq *seqs[2] = {sa, sb};
				float		k[2][512],
							v[2][512];
				int			x;

				for (x = 0; x < 2; x++)
				{
					const g4_kvpool *kv = pools[x];
					int32_t		blk = kv->tables[g][(size_t) seqs[x]->slot * (size_t) kv->max_blocks_per_seq +
												   (size_t) (p / G4_KV_BLOCK_TOKENS)];
					const uint8_t *hb;

					if (blk < 0)
					{
						g4_test_fail(__FILE__, __LINE__, "layer %d position %d: no block (%s)", i, p,
									 x ? "drafting" : "plain");
						return 0;
					}
					hb = kv->desc.base[g] + (size_t) L->index * kv->desc.layer_stride[g] +
						(size_t) blk * kv->desc.layer_block_bytes[g] +
						(size_t) h * g4_kv_head_block_bytes(kv->dtype, L->head_dim, L->k_eq_v);
					g4_kv_decode_k(kv->dtype, L->k_eq_v, L->head_dim, hb, p % G4_KV_BLOCK_TOKENS, k[x]);
					g4_kv_decode_v(kv->dtype, L->k_eq_v, L->head_dim, hb, p % G4_KV_BLOCK_TOKENS, v[x]);
				}
				if (memcmp(k[0], k[1], (size_t) L->head_dim * sizeof(float)) != 0 ||
					memcmp(v[0], v[1], (size_t) L->head_dim * sizeof(float)) != 0)
				{
					g4_test_fail(__FILE__, __LINE__, "layer %d position %d head %d: K/V differ after rollback", i,
								 p, h);
					return 0;
				}
			}
	}
	return 1;
}

static void
noop_event(void *ctx, const g4_event *ev)
{
	(void) ctx;
	(void) ev;
}

/* n_steps steps in which every draft is rejected: after each, the KV
 * pool's accounting matches a run without drafting (full blocks equal,
 * sliding blocks as the window rule says, nothing leaked at the end) and
 * every readable position's K/V is equal. */
static void
check_zero_acceptance(int dtype, int n_steps)
{
	const char *model = h_fixture_model();
	char		abuf[4096];
	const char *assistant;
	g4_options	o;
	g4_engine  *a,
			   *b;
	g4_err		err;
	h_golden	G;
	char		why[512];
	int32_t    *ids;
	int			n_ids;
	int			steps = 0;
	g4_stats	sa,
				sb;

	NEED_ASSISTANT();
	CHECK_MSG(h_golden_load("model-tiny", &G, why, sizeof(why)) == 0, "golden: %s", why);
	ids = h_ints(g4j_get(h_golden_case(&G, "past_window"), "ids"), &n_ids);
	h_options(&o, model);
	o.kv_dtype = dtype;
	CHECK_OK(g4_open(&o, &a, &err), &err);
	o.draft_model_path = assistant;
	o.bench_force_accept = 0;
	CHECK_OK(g4_open(&o, &b, &err), &err);
	while (steps < n_steps)
	{
		g4_request	req;
		uint64_t	ia,
					ib;

		h_token_request(&req, ids, n_ids, n_steps);
		/* penalties keep the greedy output from settling into a loop */
		req.sampling.repetition_penalty = 1.3f;
		CHECK_OK(g4_submit(a, &req, &ia, &err), &err);
		CHECK_OK(g4_submit(b, &req, &ib, &err), &err);
		while (g4_has_work(a) && steps < n_steps)
		{
			const g4_seq *x,
					   *y;
			int			ra = g4_step(a, noop_event, NULL, &err);
			int			rb = g4_step(b, noop_event, NULL, &err);

			CHECK_MSG(ra >= 0 && rb >= 0, "step failed: %s", err.msg);
			CHECK_MSG(ra == rb, "step %d: %d live sequences without drafting, %d with", steps, ra, rb);
			steps++;
			if (ra == 0)
				break;
			x = a->seqs[0];
			y = b->seqs[0];
			CHECK_MSG(x->n_tok == y->n_tok && memcmp(x->tok, y->tok, (size_t) x->n_tok * sizeof(int32_t)) == 0,
					  "step %d: the outputs differ", steps);
			CHECK_INT(y->n_computed, x->n_computed);
			g4_stats_get(a, &sa);
			g4_stats_get(b, &sb);
			CHECK_MSG(sa.groups[1].blocks_used == sb.groups[1].blocks_used,
					  "step %d: %lld full blocks used without drafting, %lld with", steps,
					  (long long) sa.groups[1].blocks_used, (long long) sb.groups[1].blocks_used);
			CHECK_INT(sa.groups[0].blocks_used, sliding_blocks_expected(x->n_computed, a->kv.window));
			CHECK_INT(sb.groups[0].blocks_used, sliding_blocks_expected(y->n_computed, b->kv.window));
			if (steps % 97 == 0 || steps == n_steps)
				CHECK_MSG(kv_contents_equal(a, x, b, y, x->n_computed), "step %d", steps);
		}
		if (g4_has_work(a))
		{
			g4_cancel(a, ia, noop_event, NULL);
			g4_cancel(b, ib, noop_event, NULL);
		}
	}
	g4_stats_get(a, &sa);
	g4_stats_get(b, &sb);
	printf("    %d steps, %llu drafts, %llu accepted; blocks in use after: %lld + %lld / %lld + %lld\n", steps,
		   (unsigned long long) sb.spec_drafted, (unsigned long long) sb.spec_accepted,
		   (long long) sa.groups[0].blocks_used, (long long) sa.groups[1].blocks_used,
		   (long long) sb.groups[0].blocks_used, (long long) sb.groups[1].blocks_used);
	CHECK_MSG(sb.spec_drafted >= (uint64_t) (3 * n_steps) && sb.spec_accepted == 0,
			  "drafting did not happen as forced");
	CHECK_MSG(sa.groups[0].blocks_used + sa.groups[1].blocks_used == 0 &&
			  sb.groups[0].blocks_used + sb.groups[1].blocks_used == 0, "blocks leaked");
	free(ids);
	h_golden_free(&G);
	g4_close(a);
	g4_close(b);
}

G4_TEST(mtp_zero_acceptance_rollback_kv_f32)
{
	check_zero_acceptance(G4_KV_F32, 1000);
}

G4_TEST(mtp_zero_acceptance_rollback_kv_bf16)
{
	/* the compressed formats for fewer steps: the rollback is the same */
	check_zero_acceptance(G4_KV_BF16, 250);
}

G4_TEST(mtp_zero_acceptance_rollback_kv_turboquant)
{
	check_zero_acceptance(G4_KV_TURBOQUANT_K8V4, 250);
}

/* ---- ends inside an accepted run --------------------------------------- */

/* Oracle drafts that are all right (the whole run is accepted). */
typedef struct
{
	uint64_t	id;
	const int32_t *full;
	int			n_full;
} perfect_oracle;

static void
perfect_drafts(void *ctx, uint64_t seq_id, int first_pos, int32_t *drafts, int n)
{
	perfect_oracle *o = ctx;
	int			j;

	if (seq_id == o->id)
		for (j = 0; j < n && first_pos + j < o->n_full; j++)
			drafts[j] = o->full[first_pos + j];
}

/* One request on a fresh engine (with an extra end-of-sequence id when
 * extra_eos >= 0; with perfect drafts when o is not NULL). */
static void
run_one(const g4_options *opt, const g4_request *req, int32_t extra_eos, perfect_oracle *o, h_result *res)
{
	g4_engine  *e;
	g4_err		err;

	CHECK_OK(g4_open(opt, &e, &err), &err);
	if (extra_eos >= 0)
		e->eos[e->n_eos++] = extra_eos;
	if (o)
		g4_set_draft_hook(e, perfect_drafts, o);
	memset(res, 0, sizeof(*res));
	{
		h_run		run = {res, 1};

		h_attach(e, &run);
		CHECK_OK(g4_submit(e, req, &res->id, &err), &err);
		if (o)
			o->id = res->id;
		CHECK_OK(h_drain(e, &run, 10000, &err), &err);
	}
	g4_close(e);
}

static void
check_same_result(const char *what, const h_result *a, const h_result *b)
{
	CHECK_MSG(!a->failed && !b->failed && a->finished && b->finished, "%s: did not finish", what);
	CHECK_MSG(a->n_tokens == b->n_tokens && memcmp(a->tokens, b->tokens, (size_t) a->n_tokens * 4) == 0,
			  "%s: %d tokens with drafting, %d without, or different ones", what, a->n_tokens, b->n_tokens);
	CHECK_MSG(a->finish_reason == b->finish_reason, "%s: finish reason %d with drafting, %d without", what,
			  a->finish_reason, b->finish_reason);
	CHECK_MSG(a->text_len == b->text_len && (a->text_len == 0 || memcmp(a->text, b->text, a->text_len) == 0),
			  "%s: the text differs", what);
}

/* A stop string, an end-of-sequence id and max_tokens falling inside a run
 * of accepted drafts end the output exactly where they end it without
 * drafting. */
G4_TEST(mtp_ends_inside_accepted_runs)
{
	const char *model = h_fixture_model();
	char		abuf[4096];
	const char *assistant;
	g4_options	plain_o,
				spec_o;
	h_golden	G;
	char		why[512];
	int32_t    *ids;
	int			n_ids;
	g4_request	req;
	h_result	base,
				a,
				b;
	perfect_oracle orc;
	int32_t    *full;
	char		stop[8];
	const char *stops[1] = {stop};
	int			cut;

	NEED_ASSISTANT();
	CHECK_MSG(h_golden_load("model-tiny", &G, why, sizeof(why)) == 0, "golden: %s", why);
	ids = h_ints(g4j_get(h_golden_case(&G, "long"), "ids"), &n_ids);
	h_options(&plain_o, model);
	spec_o = plain_o;
	spec_o.draft_model_path = assistant;
	h_token_request(&req, ids, n_ids, 64);
	run_one(&plain_o, &req, -1, NULL, &base);
	CHECK_MSG(base.n_tokens == 64 && base.text_len > 40, "the plain run gave %d tokens", base.n_tokens);
	full = g4_malloc((size_t) (n_ids + 64) * sizeof(int32_t));
	memcpy(full, ids, (size_t) n_ids * sizeof(int32_t));
	memcpy(full + n_ids, base.tokens, 64 * sizeof(int32_t));
	orc.full = full;
	orc.n_full = n_ids + 64;

	/* max_tokens: 4 + 5 + 2, ending two tokens into a run of five */
	h_token_request(&req, ids, n_ids, 11);
	run_one(&plain_o, &req, -1, NULL, &a);
	run_one(&spec_o, &req, -1, &orc, &b);
	check_same_result("max_tokens", &b, &a);
	h_result_free(&a);
	h_result_free(&b);

	/* an end-of-sequence id first produced as the 13th token */
	h_token_request(&req, ids, n_ids, 64);
	for (cut = 12; cut < 64; cut++)
	{
		int			j,
					seen = 0;

		for (j = 0; j < cut; j++)
			seen |= base.tokens[j] == base.tokens[cut];
		if (!seen)
			break;
	}
	run_one(&plain_o, &req, base.tokens[cut], NULL, &a);
	run_one(&spec_o, &req, base.tokens[cut], &orc, &b);
	CHECK_INT(a.n_tokens, cut + 1);
	check_same_result("end of sequence", &b, &a);
	h_result_free(&a);
	h_result_free(&b);

	/* a stop string from the middle of the text */
	memcpy(stop, base.text + base.text_len / 2, 3);
	stop[3] = '\0';
	req.stop = stops;
	req.n_stop = 1;
	run_one(&plain_o, &req, -1, NULL, &a);
	run_one(&spec_o, &req, -1, &orc, &b);
	CHECK_MSG(a.n_tokens < 64, "the stop string \"%s\" did not stop the plain run", stop);
	check_same_result("stop string", &b, &a);
	printf("    max_tokens 11, end of sequence at token %d, stop string at token %d: identical\n", cut + 1,
		   a.n_tokens);
	h_result_free(&a);
	h_result_free(&b);

	h_result_free(&base);
	free(full);
	free(ids);
	h_golden_free(&G);
}

/* ---- speculative sampling ---------------------------------------------- */

/*
 * Chi-square goodness of fit of counts[n] against probabilities p[n] (N
 * draws in all; ids of probability 0 must have no draws).  Significance
 * 0.001: the statistic must stay below the chi-square quantile 0.999 of df
 * = (ids of nonzero probability) - 1 degrees of freedom, from the
 * Wilson-Hilferty approximation df (1 - 2/(9 df) + z sqrt(2/(9 df)))^3 with
 * z = 3.0902 (within 1 % of the table for df >= 3).  The draws are seeded,
 * so the outcome is fixed: the test passes or fails the same way on every
 * machine.
 */
static void
check_chi_square(const char *what, const long *counts, const double *p, int n, long N)
{
	double		chi2 = 0.0;
	int			df = -1;
	double		crit;
	int			i;

	for (i = 0; i < n; i++)
	{
		if (p[i] <= 0.0)
		{
			CHECK_MSG(counts[i] == 0, "%s: id %d has probability 0 but was drawn %ld times", what, i, counts[i]);
			continue;
		}
		chi2 += ((double) counts[i] - (double) N * p[i]) * ((double) counts[i] - (double) N * p[i]) /
			((double) N * p[i]);
		df++;
	}
	{
		double		a = 2.0 / (9.0 * df);

		crit = df * pow(1.0 - a + 3.0902 * sqrt(a), 3.0);
	}
	printf("    %-44s chi-square %.3f, %d degrees of freedom, 0.1%% critical value %.2f\n", what, chi2, df, crit);
	CHECK_MSG(chi2 < crit, "%s: the emitted tokens are not distributed as the target (chi-square %.2f >= %.2f)",
			  what, chi2, crit);
}

/* Accept/resample with a forced draft distribution: the emitted token is
 * distributed as the target's, whatever the drafts' distribution. */
G4_TEST(mtp_speculative_sampling_distribution)
{
	enum
	{
		V = 12
	};
	const long	N = 400000;
	double		p[V],
				q[V];
	long		counts[V];
	g4_rng		draft_rng,
				rng;
	uint64_t	x = 0x9e3779b97f4a7c15ull;
	double		sp = 0,
				sq = 0;
	long		t;
	int			i,
				mode;

	/* p with two impossible ids (outside a kept set); q unrelated, with
	 * mass on an id p excludes */
	for (i = 0; i < V; i++)
	{
		p[i] = (i == 3 || i == 7) ? 0.0 : 0.05 + (double) (h_xorshift64(&x) % 1000) / 1000.0;
		q[i] = 0.02 + (double) (h_xorshift64(&x) % 1000) / 1000.0;
		sp += p[i];
		sq += q[i];
	}
	for (i = 0; i < V; i++)
	{
		p[i] /= sp;
		q[i] /= sq;
	}
	for (mode = 0; mode < 3; mode++)
	{
		long		accepted = 0;

		memset(counts, 0, sizeof(counts));
		g4_rng_seed(&draft_rng, 11);
		g4_rng_seed(&rng, 12);
		for (t = 0; t < N; t++)
		{
			int32_t		d;
			int			acc;
			int32_t		id;

			if (mode == 0)
			{
				/* d drawn from q */
				double		u = g4_rng_uniform(&draft_rng),
							c = 0;

				for (d = 0; d < V - 1; d++)
					if ((c += q[d]) > u)
						break;
				id = g4_spec_accept(p, q, V, d, &rng, &acc);
			}
			else
			{
				/* greedy drafts: q one-hot at the target's likeliest id,
				 * or at an id the target excludes */
				d = mode == 1 ? 0 : 3;
				if (mode == 1)
					for (i = 1; i < V; i++)
						if (p[i] > p[d])
							d = i;
				id = g4_spec_accept(p, NULL, V, d, &rng, &acc);
			}
			CHECK_MSG(id >= 0 && id < V, "emitted id %d", id);
			counts[id]++;
			accepted += acc;
		}
		check_chi_square(mode == 0 ? "drafts from a forced distribution" :
						 mode == 1 ? "greedy drafts (one-hot q at the mode)" : "greedy drafts of an excluded id",
						 counts, p, V, N);
		printf("      accepted %.1f%%\n", 100.0 * (double) accepted / (double) N);
	}
}

/* g4_sample_dist is the distribution g4_sample draws from. */
G4_TEST(mtp_sample_dist_matches_sampler)
{
	enum
	{
		V = 64
	};
	const long	N = 200000;
	float		logits[V],
				work[V];
	double		p[V];
	long		counts[V];
	g4_sampling s;
	g4_sampler_scratch sc = {0};
	g4_rng		rng;
	uint64_t	x = 77;
	long		t;
	int			i,
				cfg;

	for (i = 0; i < V; i++)
		logits[i] = (float) (h_xorshift64(&x) % 4000) / 1000.0f;
	for (cfg = 0; cfg < 3; cfg++)
	{
		g4_sampling_default(&s);
		s.temperature = cfg == 2 ? 0.7f : 1.0f;
		s.top_k = cfg == 1 ? 20 : 0;
		s.top_p = cfg == 2 ? 0.9f : 1.0f;
		s.min_p = cfg == 0 ? 0.05f : 0.0f;
		memcpy(work, logits, sizeof(work));
		CHECK_INT(g4_sample_dist(work, V, &s, NULL, NULL, 0, &sc, p), G4_OK);
		memset(counts, 0, sizeof(counts));
		g4_rng_seed(&rng, 5);
		for (t = 0; t < N; t++)
		{
			memcpy(work, logits, sizeof(work));
			counts[g4_sample(work, V, &s, NULL, NULL, 0, &rng, &sc)]++;
		}
		check_chi_square(cfg == 0 ? "min_p 0.05" : cfg == 1 ? "top_k 20" : "temperature 0.7, top_p 0.9", counts, p,
						 V, N);
	}
	g4_sampler_scratch_free(&sc);
}

/* Seeded sampled runs with drafting repeat exactly (the assistant's drafts
 * and oracle drafts, which get accepted), alone and batched. */
G4_TEST(mtp_seeded_sampling_repeats)
{
	const char *model = h_fixture_model();
	char		abuf[4096];
	const char *assistant;
	g4_options	o;
	h_golden	G;
	char		why[512];
	int32_t    *ids;
	int			n_ids;
	g4_request	req;
	h_result	r[3];
	perfect_oracle orc;
	int			k;

	NEED_ASSISTANT();
	CHECK_MSG(h_golden_load("model-tiny", &G, why, sizeof(why)) == 0, "golden: %s", why);
	ids = h_ints(g4j_get(h_golden_case(&G, "code"), "ids"), &n_ids);
	h_options(&o, model);
	o.draft_model_path = assistant;
	h_token_request(&req, ids, n_ids, 48);
	req.sampling.temperature = 0.8f;
	req.sampling.top_k = 8;
	req.sampling.seed = 1234;
	req.sampling.has_seed = 1;
	run_one(&o, &req, -1, NULL, &r[0]);
	run_one(&o, &req, -1, NULL, &r[1]);
	check_same_result("seeded, assistant drafts", &r[1], &r[0]);
	/* oracle: the first run's continuation, accepted with probability p(d) */
	orc.n_full = n_ids + r[0].n_tokens;
	{
		int32_t    *full = g4_malloc((size_t) orc.n_full * sizeof(int32_t));

		memcpy(full, ids, (size_t) n_ids * sizeof(int32_t));
		memcpy(full + n_ids, r[0].tokens, (size_t) r[0].n_tokens * sizeof(int32_t));
		orc.full = full;
		run_one(&o, &req, -1, &orc, &r[2]);
		h_result_free(&r[1]);
		run_one(&o, &req, -1, &orc, &r[1]);
		check_same_result("seeded, oracle drafts", &r[1], &r[2]);
		free(full);
	}
	for (k = 0; k < 3; k++)
		h_result_free(&r[k]);
	free(ids);
	h_golden_free(&G);
}

/* Controls: a request can turn drafting off; num_speculative_tokens = 0
 * loads no draft model; above the batch limit nobody drafts. */
G4_TEST(mtp_controls)
{
	const char *model = h_fixture_model();
	char		abuf[4096];
	const char *assistant;
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	g4_stats	st;
	int32_t		ids[3] = {2, 696, 5157};
	g4_request	req;
	h_result	r[3];
	h_run		run = {r, 0};
	int			k;

	NEED_ASSISTANT();
	h_options(&o, model);
	o.draft_model_path = assistant;
	h_token_request(&req, ids, 3, 8);

	req.disable_speculative = 1;
	CHECK_OK(g4_open(&o, &e, &err), &err);
	memset(r, 0, sizeof(r));
	h_attach(e, &run);
	run.n = 1;
	CHECK_OK(g4_submit(e, &req, &r[0].id, &err), &err);
	CHECK_OK(h_drain(e, &run, 1000, &err), &err);
	g4_stats_get(e, &st);
	CHECK_MSG(st.spec_k == 4 && st.spec_drafted == 0, "k %d, %llu drafted for a request that disabled drafting",
			  st.spec_k, (unsigned long long) st.spec_drafted);
	h_result_free(&r[0]);

	/* three sequences decoding, a limit of two: no drafts while all three
	 * decode */
	g4_close(e);
	o.spec_max_batch = 2;
	CHECK_OK(g4_open(&o, &e, &err), &err);
	memset(r, 0, sizeof(r));
	h_attach(e, &run);
	req.disable_speculative = 0;
	for (k = 0; k < 3; k++)
	{
		run.n = k + 1;
		CHECK_OK(g4_submit(e, &req, &r[k].id, &err), &err);
	}
	CHECK_OK(h_drain(e, &run, 1000, &err), &err);
	g4_stats_get(e, &st);
	CHECK_MSG(st.spec_drafted == 0, "%llu drafted above the batch limit", (unsigned long long) st.spec_drafted);
	for (k = 0; k < 3; k++)
		h_result_free(&r[k]);
	g4_close(e);

	o.spec_max_batch = G4_SPEC_MAX_BATCH_DEFAULT;
	o.num_speculative_tokens = 0;
	CHECK_OK(g4_open(&o, &e, &err), &err);
	CHECK_MSG(e->draft.m == NULL, "a draft model was loaded with num_speculative_tokens = 0");
	g4_close(e);

	o.num_speculative_tokens = G4_SPEC_MAX_TOKENS + 1;
	h_failed_as("too many speculative tokens", g4_open(&o, &e, &err), &err, G4_ERR_INVALID,
				"num_speculative_tokens", NULL);
	o.num_speculative_tokens = 4;
	o.draft_model_path = model;
	h_failed_as("a target as the draft model", g4_open(&o, &e, &err), &err, G4_ERR_UNSUPPORTED,
				"not an MTP assistant", NULL);
}

/* The memory figures count the assistant: its weights with the target's,
 * its buffers with the workspace. */
G4_TEST(mtp_assistant_in_the_memory_figures)
{
	const char *model = h_fixture_model();
	char		abuf[4096];
	const char *assistant;
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	g4_stats	without,
				with;

	NEED_ASSISTANT();
	h_options(&o, model);
	CHECK_OK(g4_open(&o, &e, &err), &err);
	g4_stats_get(e, &without);
	g4_close(e);
	o.draft_model_path = assistant;
	CHECK_OK(g4_open(&o, &e, &err), &err);
	g4_stats_get(e, &with);
	CHECK_INT(with.weight_bytes - without.weight_bytes, e->draft.m->weight_bytes);
	/* the CPU backend holds nothing beside what it hands out */
	CHECK_INT(with.workspace_bytes, e->ws.bytes + e->draft.buffer_bytes);
	CHECK(e->draft.m->weight_bytes > 0 && e->draft.buffer_bytes > 0);
	g4_close(e);
}

/* Five sequences decoding with drafts accepted in full (k = 4) where the
 * step budget (16) holds 5 tokens plus 11 drafts: every sequence has its
 * token in every step, and only the budget the decodes leave goes to
 * drafts, oldest first. */
G4_TEST(mtp_every_decode_has_its_token_before_any_drafts)
{
	enum
	{
		N_SEQ = 5, STEPS = 12
	};
	const char *model = h_fixture_model();
	char		abuf[4096];
	const char *assistant;
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	int32_t		ids[3] = {2, 696, 5157};
	g4_request	req;
	h_result	r[N_SEQ];
	h_run		run = {r, N_SEQ};
	int			k,
				step;

	NEED_ASSISTANT();
	h_options(&o, model);
	o.draft_model_path = assistant;
	o.num_speculative_tokens = 4;
	o.bench_force_accept = 4;
	o.max_num_seqs = N_SEQ;
	o.max_num_batched_tokens = 16;
	CHECK_OK(g4_open(&o, &e, &err), &err);
	memset(r, 0, sizeof(r));
	h_attach(e, &run);
	h_token_request(&req, ids, 3, 200);
	for (k = 0; k < N_SEQ; k++)
		CHECK_OK(g4_submit(e, &req, &r[k].id, &err), &err);
	/* the first step prefills all five (15 tokens) and samples a token of
	 * each; then each step decodes every one */
	for (step = 1; step <= STEPS; step++)
	{
		CHECK(g4_step(e, h_on_event, &run, &err) >= 0);
		for (k = 0; k < N_SEQ; k++)
			CHECK_MSG(r[k].n_tokens >= step, "step %d: sequence %d has %d tokens", step, k, r[k].n_tokens);
	}
	printf("    figure: tokens after %d steps:", STEPS);
	for (k = 0; k < N_SEQ; k++)
		printf(" %d", r[k].n_tokens);
	printf("\n");
	/* 11 drafts a step went to the oldest: more tokens than the youngest */
	CHECK(r[0].n_tokens > r[N_SEQ - 1].n_tokens);
	for (k = 0; k < N_SEQ; k++)
		h_result_free(&r[k]);
	g4_close(e);
}

/* Preemption with drafting: a pool too small for the five sequences at
 * once (16 full blocks of 16 tokens; together they need 36), all submitted
 * together, with oracle drafts so long runs are accepted; the outputs stay
 * transformers' greedy continuations. */
G4_TEST(mtp_preemption_keeps_results_exact)
{
	const char *model = h_fixture_model();
	char		abuf[4096];
	const char *assistant;
	g4_options	o;
	g4_stats	st;
	oracle		orc;
	h_golden	G;
	char		why[512];
	int			k;

	NEED_ASSISTANT();
	CHECK_MSG(h_golden_load("model-tiny", &G, why, sizeof(why)) == 0, "golden: %s", why);
	memset(&orc, 0, sizeof(orc));
	orc.vocab = 16384;
	for (k = 0; k < N_CASES; k++)
	{
		const g4j  *c = h_golden_case(&G, case_names[k]);
		int			n,
					ng;
		int32_t    *ids = h_ints(g4j_get(c, "ids"), &n);
		int32_t    *want = h_ints(g4j_get(c, "greedy"), &ng);

		orc.full[k] = g4_malloc((size_t) (n + ng) * sizeof(int32_t));
		memcpy(orc.full[k], ids, (size_t) n * sizeof(int32_t));
		memcpy(orc.full[k] + n, want, (size_t) ng * sizeof(int32_t));
		orc.n_full[k] = n + ng;
		memcpy(plain[0][k], want, (size_t) ng * sizeof(int32_t));
		n_plain[0][k] = ng;
		free(ids);
		free(want);
	}
	h_options(&o, model);
	o.draft_model_path = assistant;
	o.max_num_seqs = 5;
	o.max_num_batched_tokens = 16;
	o.kv_pool_bytes = 336 * 1024 + 16 * 4096;	/* 16 full blocks */
	run_cases(&o, 1, &orc, drafted, n_drafted, &st);
	print_spec_stats("preempting pool, oracle", &st);
	printf("    %llu preemptions\n", (unsigned long long) st.preemptions);
	CHECK_MSG(st.preemptions > 0, "the pool was large enough: nothing was preempted");
	CHECK_MSG(st.spec_accepted > 0, "no draft was accepted");
	check_same_outputs("preempting pool", drafted, n_drafted, plain[0], n_plain[0]);
	for (k = 0; k < N_CASES; k++)
		free(orc.full[k]);
	h_golden_free(&G);
}

/* The engine's greedy output with drafting equals transformers' assisted
 * generation (generate with the assistant model, greedy), all prompts
 * together. */
G4_TEST(mtp_greedy_matches_transformers_assisted_generation)
{
	const char *model = h_fixture_model();
	char		abuf[4096];
	const char *assistant;
	h_golden	G;
	char		why[512];
	const g4j  *cases;
	g4_options	o;
	g4_stats	st;
	int			k;

	NEED_ASSISTANT();
	CHECK_MSG(h_golden_load("mtp-tiny", &G, why, sizeof(why)) == 0, "golden: %s", why);
	cases = g4j_get(g4j_root(G.doc), "assisted_generation");
	CHECK_INT(g4j_len(cases), N_CASES);
	h_options(&o, model);
	o.draft_model_path = assistant;
	run_cases(&o, 1, NULL, drafted, n_drafted, &st);
	print_spec_stats("assistant, batched", &st);
	for (k = 0; k < N_CASES; k++)
	{
		const g4j  *c = g4j_at(cases, (size_t) k);
		int			n;
		int32_t    *want = h_ints(g4j_get(c, "greedy"), &n);

		CHECK_STR(g4j_get_str(c, "name"), case_names[k]);
		memcpy(plain[0][k], want, (size_t) n * sizeof(int32_t));
		n_plain[0][k] = n;
		free(want);
	}
	check_same_outputs("transformers assisted generation", drafted, n_drafted, plain[0], n_plain[0]);
	h_golden_free(&G);
}
