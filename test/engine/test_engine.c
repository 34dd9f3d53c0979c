/*
 * test_engine.c — the engine's request handling on the fixture model:
 * validation errors, cancellation, admission limits, KV accounting, the
 * sampler's options, stop strings and text streaming.
 */
#include <limits.h>
#include <math.h>

#include "harness.h"
#include "test.h"

static const int32_t prompt_ids[] = {2, 1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008, 1009};

G4_TEST(engine_rejects_bad_requests)
{
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	g4_request	req;
	uint64_t	id;
	int32_t		bad[2] = {2, 999999};
	g4_message	sys_late[2];

	H_NEED_FIXTURE(model);
	h_options(&o, model);
	o.max_model_len = 64;
	CHECK_OK(g4_open(&o, &e, &err), &err);

	h_token_request(&req, prompt_ids, 11, 8);
	req.sampling.temperature = -1.0f;
	CHECK_INT(g4_submit(e, &req, &id, &err), G4_ERR_INVALID);
	CHECK(strstr(err.msg, "temperature"));

	h_token_request(&req, prompt_ids, 11, 8);
	req.sampling.top_p = 0.0f;
	CHECK_INT(g4_submit(e, &req, &id, &err), G4_ERR_INVALID);
	CHECK(strstr(err.msg, "top_p"));

	h_token_request(&req, prompt_ids, 11, -3);
	CHECK_INT(g4_submit(e, &req, &id, &err), G4_ERR_INVALID);
	CHECK(strstr(err.msg, "max_tokens"));

	h_token_request(&req, prompt_ids, 11, 60);
	CHECK_INT(g4_submit(e, &req, &id, &err), G4_ERR_TOO_LONG);
	CHECK(strstr(err.msg, "context window"));

	/* prompt + max_tokens past INT_MAX: refused, not wrapped into a
	 * length the window and the pool seem to hold */
	h_token_request(&req, prompt_ids, 11, INT_MAX - 5);
	CHECK_INT(g4_submit(e, &req, &id, &err), G4_ERR_TOO_LONG);
	CHECK(strstr(err.msg, "context window") && strstr(err.msg, "2147483653"));

	h_token_request(&req, bad, 2, 4);
	CHECK_INT(g4_submit(e, &req, &id, &err), G4_ERR_INVALID);
	CHECK(strstr(err.msg, "outside the vocabulary"));

	memset(&req, 0, sizeof(req));
	g4_sampling_default(&req.sampling);
	req.input_kind = G4_INPUT_TEXT;
	req.prompt = "";
	CHECK_INT(g4_submit(e, &req, &id, &err), G4_ERR_INVALID);
	CHECK(strstr(err.msg, "empty"));

	{
		/* a prompt longer than the window */
		char		text[4096];
		int			i;

		for (i = 0; i < 4000; i += 4)
			memcpy(text + i, "abc ", 4);
		text[4000] = '\0';
		req.prompt = text;
		CHECK_INT(g4_submit(e, &req, &id, &err), G4_ERR_TOO_LONG);
		CHECK(strstr(err.msg, "prompt has"));
	}

	memset(sys_late, 0, sizeof(sys_late));
	sys_late[0].role = G4_ROLE_USER;
	sys_late[0].content = "hi";
	sys_late[1].role = G4_ROLE_SYSTEM;
	sys_late[1].content = "be brief";
	memset(&req, 0, sizeof(req));
	g4_sampling_default(&req.sampling);
	req.input_kind = G4_INPUT_CHAT;
	req.messages = sys_late;
	req.n_messages = 2;
	CHECK_INT(g4_submit(e, &req, &id, &err), G4_ERR_INVALID);
	CHECK(strstr(err.msg, "system"));

	{
		const char *stops[1] = {""};

		h_token_request(&req, prompt_ids, 11, 8);
		req.stop = stops;
		req.n_stop = 1;
		CHECK_INT(g4_submit(e, &req, &id, &err), G4_ERR_INVALID);
		CHECK(strstr(err.msg, "stop string"));
	}
	CHECK(!g4_has_work(e));
	CHECK_INT(h_kv_blocks_used(e), 0);
	g4_close(e);
}

G4_TEST(engine_request_that_can_never_fit_fails_at_submit)
{
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	g4_request	req;
	uint64_t	id;

	H_NEED_FIXTURE(model);
	h_options(&o, model);
	o.max_num_seqs = 2;
	o.max_num_batched_tokens = 16;
	/* sliding windows for 2 sequences plus 4 full blocks (64 tokens) */
	o.kv_pool_bytes = 9 * 16384 + 4 * 4096;
	CHECK_OK(g4_open(&o, &e, &err), &err);
	h_token_request(&req, prompt_ids, 11, 100);
	CHECK_INT(g4_submit(e, &req, &id, &err), G4_ERR_TOO_LONG);
	CHECK(strstr(err.msg, "KV blocks"));
	h_token_request(&req, prompt_ids, 11, 40);
	CHECK_OK(g4_submit(e, &req, &id, &err), &err);
	g4_close(e);
}

G4_TEST(engine_cancel_frees_blocks_at_once)
{
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	g4_request	req;
	h_result	res[3];
	h_run		run = {res, 3};
	int			i;

	H_NEED_FIXTURE(model);
	h_options(&o, model);
	CHECK_OK(g4_open(&o, &e, &err), &err);
	memset(res, 0, sizeof(res));
	h_attach(e, &run);
	for (i = 0; i < 3; i++)
	{
		h_token_request(&req, prompt_ids, 11, 200);
		CHECK_OK(g4_submit(e, &req, &res[i].id, &err), &err);
	}
	for (i = 0; i < 5; i++)
		CHECK(g4_step(e, h_on_event, &run, &err) >= 0);
	CHECK(h_kv_blocks_used(e) > 0);
	for (i = 0; i < 3; i++)
	{
		g4_cancel(e, res[i].id, h_on_event, &run);
		CHECK(res[i].finished);
		CHECK_INT(res[i].finish_reason, G4_FINISH_CANCELLED);
	}
	/* freed before the next step */
	CHECK_INT(h_kv_blocks_used(e), 0);
	CHECK(!g4_has_work(e));
	g4_cancel(e, 12345, h_on_event, &run);	/* unknown ids are ignored */
	for (i = 0; i < 3; i++)
		h_result_free(&res[i]);
	g4_close(e);
}

G4_TEST(engine_admission_respects_max_num_seqs)
{
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	g4_request	req;
	h_result	res[6];
	h_run		run = {res, 6};
	g4_stats	st;
	int			i;

	H_NEED_FIXTURE(model);
	h_options(&o, model);
	o.max_num_seqs = 2;
	CHECK_OK(g4_open(&o, &e, &err), &err);
	memset(res, 0, sizeof(res));
	h_attach(e, &run);
	for (i = 0; i < 6; i++)
	{
		h_token_request(&req, prompt_ids, 11, 12);
		CHECK_OK(g4_submit(e, &req, &res[i].id, &err), &err);
	}
	CHECK(g4_step(e, h_on_event, &run, &err) >= 0);
	g4_stats_get(e, &st);
	CHECK_INT(st.live_seqs, 2);
	CHECK_INT(st.waiting_seqs, 4);
	{
		g4_seq_info info[8];
		int			n = g4_seqs_get(e, info, 8);
		int			waiting = 0;

		CHECK_INT(n, 6);
		for (i = 0; i < n; i++)
			waiting += info[i].state == G4_SEQ_WAITING;
		CHECK_INT(waiting, 4);
	}
	CHECK_OK(h_drain(e, &run, 1000, &err), &err);
	g4_stats_get(e, &st);
	CHECK(st.batch_seqs_max == 2);
	CHECK_INT(st.requests_finished, 6);
	for (i = 1; i < 6; i++)
	{
		/* same prompt, greedy: same output whatever the batch */
		CHECK_INT(res[i].n_tokens, res[0].n_tokens);
		CHECK(memcmp(res[i].tokens, res[0].tokens, sizeof(int32_t) * (size_t) res[0].n_tokens) == 0);
	}
	CHECK_INT(h_kv_blocks_used(e), 0);
	for (i = 0; i < 6; i++)
		h_result_free(&res[i]);
	g4_close(e);
}

/* Under load the step budget goes to decoding first: while a long prompt is
 * prefilled in chunks, a running sequence gets a token every step (its
 * inter-token latency is one step), and the long prompt and a request
 * arriving behind it get their first tokens within the steps their prompts
 * need at the budget left by the decodes (time to first token bounded,
 * first come first served). */
G4_TEST(engine_decode_first_bounds_latency)
{
	enum
	{
		BUDGET = 16, LONG = 100
	};
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	g4_request	req;
	h_result	res[3];
	h_run		run = {res, 3};
	int32_t		long_ids[LONG];
	int			i,
				step,
				before,
				b_first = -1,
				c_first = -1;

	H_NEED_FIXTURE(model);
	h_options(&o, model);
	o.max_num_batched_tokens = BUDGET;
	CHECK_OK(g4_open(&o, &e, &err), &err);
	memset(res, 0, sizeof(res));
	h_attach(e, &run);
	for (i = 0; i < LONG; i++)
		long_ids[i] = prompt_ids[i % 11];
	/* A: decoding before the others arrive */
	h_token_request(&req, prompt_ids, 11, 60);
	CHECK_OK(g4_submit(e, &req, &res[0].id, &err), &err);
	CHECK(g4_step(e, h_on_event, &run, &err) >= 0);
	CHECK_INT(res[0].n_tokens, 1);
	/* B: a long prompt; C: a short one behind it */
	h_token_request(&req, long_ids, LONG, 2);
	CHECK_OK(g4_submit(e, &req, &res[1].id, &err), &err);
	h_token_request(&req, prompt_ids, 11, 2);
	CHECK_OK(g4_submit(e, &req, &res[2].id, &err), &err);
	for (step = 1; step <= 20 && c_first < 0; step++)
	{
		before = res[0].n_tokens;
		CHECK(g4_step(e, h_on_event, &run, &err) >= 0);
		if (!res[0].finished)
			CHECK_INT(res[0].n_tokens, before + 1);
		if (b_first < 0 && res[1].n_tokens > 0)
			b_first = step;
		if (c_first < 0 && res[2].n_tokens > 0)
			c_first = step;
	}
	/* B: 100 prompt tokens at 15 a step (one goes to A) = 7 steps; C's 11
	 * follow in the budget B leaves and the next step */
	CHECK(b_first > 0 && b_first <= (LONG + BUDGET - 2) / (BUDGET - 1));
	CHECK(c_first > 0 && c_first <= b_first + 1);
	CHECK_OK(h_drain(e, &run, 1000, &err), &err);
	CHECK_INT(h_kv_blocks_used(e), 0);
	for (i = 0; i < 3; i++)
		h_result_free(&res[i]);
	g4_close(e);
}

/*
 * A block of soft tokens as large as the step budget, behind a prompt that
 * decodes: the block cannot share a step with any decode, so while it
 * waits nobody new is admitted (else later arrivals' decodes could keep
 * the budget short of it for ever); it runs once the decodes admitted
 * before it end.  New short requests keep arriving all along.
 */
G4_TEST(engine_image_block_waits_for_the_budget_not_for_ever)
{
	enum
	{
		BUDGET = 16, N_IDS = 24, MAX_REQ = 48
	};
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	g4_request	req;
	h_result	res[MAX_REQ];
	h_run		run = {res, 0};
	int32_t		ids[N_IDS],
				mm[N_IDS],
				pos[BUDGET];
	float	   *rows;
	int			H,
				i,
				step;

	H_NEED_FIXTURE(model);
	h_options(&o, model);
	o.max_num_seqs = 4;
	o.max_num_batched_tokens = BUDGET;
	CHECK_OK(g4_open(&o, &e, &err), &err);
	H = e->model->cfg.hidden_size;
	memset(res, 0, sizeof(res));
	h_attach(e, &run);
	/* A decodes 30 tokens */
	h_token_request(&req, prompt_ids, 11, 30);
	run.n = 1;
	CHECK_OK(g4_submit(e, &req, &res[0].id, &err), &err);
	CHECK(g4_step(e, h_on_event, &run, &err) >= 0);
	/* B: 3 text tokens, a block of BUDGET soft tokens, 5 text tokens */
	for (i = 0; i < N_IDS; i++)
	{
		int			soft = i >= 3 && i < 3 + BUDGET;

		ids[i] = i == 0 ? 2 : soft ? prompt_ids[1] : prompt_ids[1 + i % 10];
		mm[i] = soft ? 0 : -1;
		if (soft)
			pos[i - 3] = i;
	}
	rows = calloc((size_t) BUDGET * (size_t) H, sizeof(float));
	CHECK(rows);
	for (i = 0; i < BUDGET * H; i++)
		rows[i] = 0.01f * (float) (i % 7);
	h_token_request(&req, ids, N_IDS, 4);
	run.n = 2;
	CHECK_OK(g4_submit_embeds(e, &req, BUDGET, pos, rows, mm, &res[1].id, &err), &err);
	for (step = 0; step < 200 && !res[1].finished && !res[1].failed; step++)
	{
		int			k,
					live = 0;

		/* a new short request whenever fewer than two others are live */
		for (k = 0; k < run.n; k++)
			live += k != 1 && !res[k].finished && !res[k].failed;
		if (live < 2 && run.n < MAX_REQ)
		{
			h_token_request(&req, prompt_ids, 11, 30);
			CHECK_OK(g4_submit(e, &req, &res[run.n].id, &err), &err);
			run.n++;
		}
		CHECK(g4_step(e, h_on_event, &run, &err) >= 0);
	}
	printf("    figure: the block's prompt finished after %d steps, %d other requests submitted\n", step,
		   run.n - 1);
	/* A's 30 tokens, then B's block and its 4 tokens */
	CHECK_MSG(res[1].finished && !res[1].failed, "the prompt with the block did not finish in %d steps", step);
	CHECK(step <= 30 + 8);
	CHECK_OK(h_drain(e, &run, 2000, &err), &err);
	CHECK_INT(h_kv_blocks_used(e), 0);
	for (i = 0; i < run.n; i++)
		h_result_free(&res[i]);
	free(rows);
	g4_close(e);
}

G4_TEST(engine_kv_accounting)
{
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	g4_stats	st;
	const g4_model *m;
	size_t		per_full;
	int			g;

	H_NEED_FIXTURE(model);
	h_options(&o, model);
	o.kv_dtype = G4_KV_TURBOQUANT_K8V4;
	o.max_model_len = 1024;
	CHECK_OK(g4_open(&o, &e, &err), &err);
	g4_stats_get(e, &st);
	CHECK_INT(st.n_groups, 2);
	for (g = 0; g < st.n_groups; g++)
	{
		CHECK_INT(st.groups[g].blocks_used, 0);
		CHECK(st.groups[g].blocks_total > 0);
		CHECK_INT(st.groups[g].block_tokens, G4_KV_BLOCK_TOKENS);
	}
	CHECK(st.kv_bytes_total > 0 && st.kv_bytes_total <= o.kv_pool_bytes);
	m = g4_engine_model(e);
	/* the fixture's full layers: one KV head of 32 stored once, 8-bit + f16 scale */
	per_full = g4_kv_group_token_bytes(m, G4_KV_TURBOQUANT_K8V4, G4_KVG_FULL);
	CHECK_INT(per_full, 2 * (32 + 2));
	/* fit counts full-context sequences against the free blocks, sliding
	 * layers at their window, bounded by max_num_seqs */
	{
		int64_t		full_blocks = st.groups[1].blocks_total;
		int64_t		expect = G4_MIN(full_blocks / (1024 / G4_KV_BLOCK_TOKENS), (int64_t) o.max_num_seqs);

		CHECK_INT(st.fit_full_context, expect);
	}
	g4_close(e);
}

/* The memory's uses add up to the stats' weights, pool and workspace, the
 * block tables aside; a short list keeps the first uses. */
G4_TEST(engine_memory_uses_add_up)
{
	static const char *const expect[] = {"weights", "assistant weights", "KV pool, sliding layers",
	"KV pool, full layers", "KV block tables", "activations", "assistant activations"};
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	g4_stats	st;
	g4_memory_use u[G4_MEMORY_USES_MAX];
	char		abuf[4096];
	size_t		weights = 0,
				pool = 0,
				workspace = 0;
	int			n;

	H_NEED_FIXTURE(model);
	h_options(&o, model);
	o.draft_model_path = h_assistant_of(model, abuf, sizeof(abuf));
	CHECK_MSG(o.draft_model_path, "no assistant beside %s", model);
	CHECK_OK(g4_open(&o, &e, &err), &err);
	g4_stats_get(e, &st);
	n = g4_memory_get(e, u, G4_MEMORY_USES_MAX);
	/* the CPU backend holds nothing of its own */
	CHECK_INT(n, (int) G4_ARRAY_LEN(expect));
	for (int i = 0; i < n; i++)
	{
		CHECK_STR(u[i].what, expect[i]);
		CHECK_MSG(u[i].bytes > 0, "%s: 0 bytes", u[i].what);
		if (strstr(u[i].what, "weights"))
			weights += u[i].bytes;
		else if (strncmp(u[i].what, "KV pool", 7) == 0)
			pool += u[i].bytes;
		else if (strstr(u[i].what, "activations"))
			workspace += u[i].bytes;
	}
	CHECK_INT(weights, st.weight_bytes);
	CHECK_INT(pool, st.kv_bytes_total);
	CHECK_INT(workspace, st.workspace_bytes);
	/* block tables: two groups of max_num_seqs rows of a whole window */
	CHECK_INT(u[4].bytes, 2 * (size_t) o.max_num_seqs * (size_t) (o.max_model_len / G4_KV_BLOCK_TOKENS) * 4);
	CHECK_INT(g4_memory_get(e, u, 3), 3);
	CHECK_STR(u[2].what, "KV pool, sliding layers");
	g4_close(e);
}

G4_TEST(engine_kv_turboquant_size_ratio)
{
	/* bytes per token and head: k8v4 against bf16 at the 12B's widths */
	size_t		bf16_256 = g4_kv_head_block_bytes(G4_KV_BF16, 256, 0);
	size_t		tq_256 = g4_kv_head_block_bytes(G4_KV_TURBOQUANT_K8V4, 256, 0);
	size_t		bf16_512 = g4_kv_head_block_bytes(G4_KV_BF16, 512, 0);
	size_t		tq_512 = g4_kv_head_block_bytes(G4_KV_TURBOQUANT_K8V4, 512, 0);

	printf("    figure: turboquant_k8v4 is %.3fx smaller than bf16 at head_dim 256, %.3fx at 512 "
		   "(K and V stored); %.3fx for a K-from-V vector of 512\n",
		   (double) bf16_256 / (double) tq_256, (double) bf16_512 / (double) tq_512,
		   (double) g4_kv_head_block_bytes(G4_KV_BF16, 512, 1) /
		   (double) g4_kv_head_block_bytes(G4_KV_TURBOQUANT_K8V4, 512, 1));
	/* the format's goal: at least 2.5x smaller than bf16 */
	CHECK((double) bf16_256 / (double) tq_256 >= 2.5);
	CHECK((double) bf16_512 / (double) tq_512 >= 2.5);
	CHECK_INT(tq_256, 16 * 402);
}

/* Run one request to completion and return its result. */
static void
run_one(g4_engine *e, g4_request *req, h_result *res)
{
	g4_err		err;

	if (h_run_one(e, req, 10000, res, &err) != 0)
	{
		res->failed = 1;
		snprintf(res->error, sizeof(res->error), "%s", err.msg);
	}
}

G4_TEST(engine_sampling_seed_and_options)
{
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	g4_request	req;
	h_result	a,
				b,
				c,
				greedy,
				k1;
	int			differs = 0,
				i;

	H_NEED_FIXTURE(model);
	h_options(&o, model);
	CHECK_OK(g4_open(&o, &e, &err), &err);
	h_token_request(&req, prompt_ids, 11, 24);
	req.sampling.temperature = 1.0f;
	req.sampling.seed = 42;
	req.sampling.has_seed = 1;
	run_one(e, &req, &a);
	run_one(e, &req, &b);
	req.sampling.seed = 43;
	run_one(e, &req, &c);
	CHECK(!a.failed && !b.failed && !c.failed);
	/* same seed, same output; another seed, another output */
	CHECK_INT(a.n_tokens, b.n_tokens);
	CHECK(memcmp(a.tokens, b.tokens, sizeof(int32_t) * (size_t) a.n_tokens) == 0);
	for (i = 0; i < a.n_tokens && i < c.n_tokens; i++)
		differs |= a.tokens[i] != c.tokens[i];
	CHECK(differs);
	/* top_k = 1 at any temperature is greedy */
	h_token_request(&req, prompt_ids, 11, 24);
	run_one(e, &req, &greedy);
	req.sampling.temperature = 5.0f;
	req.sampling.top_k = 1;
	run_one(e, &req, &k1);
	CHECK_INT(k1.n_tokens, greedy.n_tokens);
	CHECK(memcmp(k1.tokens, greedy.tokens, sizeof(int32_t) * (size_t) greedy.n_tokens) == 0);
	h_result_free(&a);
	h_result_free(&b);
	h_result_free(&c);
	h_result_free(&greedy);
	h_result_free(&k1);
	g4_close(e);
}

G4_TEST(engine_max_tokens_and_usage)
{
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	g4_request	req;
	h_result	r;

	H_NEED_FIXTURE(model);
	h_options(&o, model);
	CHECK_OK(g4_open(&o, &e, &err), &err);
	h_token_request(&req, prompt_ids, 11, 5);
	run_one(e, &req, &r);
	CHECK(!r.failed);
	CHECK_INT(r.prompt_tokens, 11);
	CHECK(r.completion_tokens <= 5);
	if (r.completion_tokens == 5)
		CHECK_INT(r.finish_reason, G4_FINISH_LENGTH);
	h_result_free(&r);
	g4_close(e);
}

G4_TEST(engine_stop_strings_cut_output)
{
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	g4_request	req;
	h_result	full,
				cut;
	const char *stops[1];
	char		needle[16];

	H_NEED_FIXTURE(model);
	h_options(&o, model);
	CHECK_OK(g4_open(&o, &e, &err), &err);
	h_token_request(&req, prompt_ids, 11, 40);
	run_one(e, &req, &full);
	CHECK(!full.failed && full.text && full.text_len > 12);
	/* stop on a piece from the middle of the greedy text */
	memcpy(needle, full.text + full.text_len / 2, 3);
	needle[3] = '\0';
	stops[0] = needle;
	req.stop = stops;
	req.n_stop = 1;
	run_one(e, &req, &cut);
	CHECK(!cut.failed);
	CHECK_INT(cut.finish_reason, G4_FINISH_STOP);
	/* output is the text before the first occurrence, stop string excluded */
	{
		const char *first = strstr(full.text, needle);

		CHECK(first);
		CHECK_INT(cut.text_len, first - full.text);
		CHECK(cut.text_len == 0 || memcmp(cut.text, full.text, cut.text_len) == 0);
	}
	h_result_free(&full);
	h_result_free(&cut);
	g4_close(e);
}

G4_TEST(engine_streamed_text_equals_detokenized_tokens)
{
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	g4_request	req;
	h_result	r;
	char	   *text = NULL;
	size_t		len = 0;

	H_NEED_FIXTURE(model);
	h_options(&o, model);
	CHECK_OK(g4_open(&o, &e, &err), &err);
	h_token_request(&req, prompt_ids, 11, 64);
	req.sampling.temperature = 1.0f;
	req.sampling.seed = 7;
	req.sampling.has_seed = 1;
	run_one(e, &req, &r);
	CHECK(!r.failed);
	CHECK_OK(g4_detokenize(e, r.tokens, r.n_tokens, &text, &len, &err), &err);
	CHECK_INT(r.text_len, len);
	CHECK(len == 0 || memcmp(r.text, text, len) == 0);
	free(text);
	h_result_free(&r);
	g4_close(e);
}

/*
 * A byte run the model ends with a channel token belongs to the channel
 * before it: "a" + the bytes of U+4E2D, then a thought, then "a" again
 * stream as content "a\xe4\xb8\xad" "a" and reasoning "b".
 */
G4_TEST(engine_byte_run_before_a_channel_token_stays_in_its_channel)
{
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	g4_request	req;
	g4_seq	   *s;
	h_result	r;
	h_run		run = {&r, 1};
	const char *const pieces[] = {"a", "<0xE4>", "<0xB8>", "<0xAD>", "<|channel>", "thought", "\n", "b",
	"<channel|>", "a"};
	size_t		i;

	H_NEED_FIXTURE(model);
	h_options(&o, model);
	CHECK_OK(g4_open(&o, &e, &err), &err);
	h_token_request(&req, prompt_ids, 11, 64);
	s = g4_seq_new(e, &req, &err);
	CHECK_MSG(s != NULL, "g4_seq_new: %s", err.msg);
	memset(&r, 0, sizeof(r));
	r.id = s->id;
	for (i = 0; i < G4_ARRAY_LEN(pieces); i++)
	{
		int32_t		id = g4_tok_id(e->tok, pieces[i]);

		CHECK_MSG(id >= 0, "no token %s in the fixture", pieces[i]);
		CHECK_INT(g4_seq_emit_token(e, s, id, h_on_event, &run), 0);
	}
	CHECK_INT(r.text_len, 5);
	CHECK(memcmp(r.text, "a\xe4\xb8\xad" "a", 5) == 0);
	CHECK_INT(r.reasoning_len, 1);
	CHECK(r.reasoning[0] == 'b');
	g4_seq_free(s);
	h_result_free(&r);
	g4_close(e);
}

G4_TEST(engine_penalties_change_choices)
{
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	g4_request	req;
	h_result	plain,
				pen;
	int			repeats_plain = 0,
				repeats_pen = 0,
				i,
				j;

	H_NEED_FIXTURE(model);
	h_options(&o, model);
	CHECK_OK(g4_open(&o, &e, &err), &err);
	h_token_request(&req, prompt_ids, 11, 48);
	run_one(e, &req, &plain);
	req.sampling.frequency_penalty = 2.0f;
	req.sampling.presence_penalty = 2.0f;
	req.sampling.repetition_penalty = 1.5f;
	run_one(e, &req, &pen);
	CHECK(!plain.failed && !pen.failed);
	for (i = 0; i < plain.n_tokens; i++)
		for (j = 0; j < i; j++)
			if (plain.tokens[i] == plain.tokens[j])
			{
				repeats_plain++;
				break;
			}
	for (i = 0; i < pen.n_tokens; i++)
		for (j = 0; j < i; j++)
			if (pen.tokens[i] == pen.tokens[j])
			{
				repeats_pen++;
				break;
			}
	printf("    repeated tokens: %d greedy, %d with penalties\n", repeats_plain, repeats_pen);
	CHECK(repeats_pen < repeats_plain || repeats_plain == 0);
	h_result_free(&plain);
	h_result_free(&pen);
	g4_close(e);
}

/* Sampler unit tests on synthetic logits. */
G4_TEST(sampler_filters)
{
	float		logits[8];
	g4_sampling p;
	g4_rng		rng;
	g4_sampler_scratch sc = {0};
	int			counts[8] = {0};
	int			i;
	int32_t		suppress[1] = {0};

	g4_rng_seed(&rng, 1);
	g4_sampling_default(&p);
	for (i = 0; i < 8; i++)
		logits[i] = (float) i;
	CHECK_INT(g4_sample(logits, 8, &p, NULL, NULL, 0, &rng, &sc), 7);
	/* suppressed ids are never chosen */
	for (i = 0; i < 8; i++)
		logits[i] = i == 0 ? 100.0f : 0.0f;
	CHECK(g4_sample(logits, 8, &p, NULL, suppress, 1, &rng, &sc) != 0);
	/* top_p keeps the smallest set reaching the mass: two equal top ids at
	 * 0.45 each, top_p 0.5 keeps both and nothing else */
	p.temperature = 1.0f;
	p.top_p = 0.5f;
	for (i = 0; i < 2000; i++)
	{
		float		l[8] = {0, 0, 0, 0, 0, 0, 5.0f, 5.0f};

		counts[g4_sample(l, 8, &p, NULL, NULL, 0, &rng, &sc)]++;
	}
	CHECK_INT(counts[0] + counts[1] + counts[2] + counts[3] + counts[4] + counts[5], 0);
	CHECK(counts[6] > 800 && counts[7] > 800);
	/* min_p drops ids below min_p times the best probability */
	memset(counts, 0, sizeof(counts));
	p.top_p = 1.0f;
	p.min_p = 0.5f;
	for (i = 0; i < 1000; i++)
	{
		float		l[8] = {0, 0, 0, 0, 0, 0, 1.0f, 1.2f};

		counts[g4_sample(l, 8, &p, NULL, NULL, 0, &rng, &sc)]++;
	}
	CHECK_INT(counts[0] + counts[1] + counts[2] + counts[3] + counts[4] + counts[5], 0);
	/* temperature: the empirical frequency follows softmax(l / T) */
	memset(counts, 0, sizeof(counts));
	p.min_p = 0.0f;
	p.temperature = 2.0f;
	for (i = 0; i < 20000; i++)
	{
		float		l[8] = {0, 0, 0, 0, 0, 0, 0, (float) (2.0 * log(3.0))};

		counts[g4_sample(l, 8, &p, NULL, NULL, 0, &rng, &sc)]++;
	}
	/* P(7) = 3 / (7 + 3) = 0.3 */
	CHECK_NEAR(counts[7] / 20000.0, 0.3, 0.02);
	/* top_k through equal values keeps the smaller ids (the sampling order
	 * every backend shares), each as likely */
	memset(counts, 0, sizeof(counts));
	p.temperature = 1.0f;
	p.top_k = 3;
	for (i = 0; i < 3000; i++)
	{
		float		l[8] = {0, 0, 0, 0, 0, 0, 0, 0};

		counts[g4_sample(l, 8, &p, NULL, NULL, 0, &rng, &sc)]++;
	}
	CHECK_INT(counts[3] + counts[4] + counts[5] + counts[6] + counts[7], 0);
	CHECK(counts[0] > 850 && counts[1] > 850 && counts[2] > 850);
	/* one draw per sampled token, also when nothing can be sampled: the
	 * generator stays in step with a device that receives the draws */
	{
		g4_rng		a,
					b;
		float		l[8];

		g4_rng_seed(&a, 5);
		g4_rng_seed(&b, 5);
		for (i = 0; i < 8; i++)
			l[i] = -INFINITY;
		g4_sample(l, 8, &p, NULL, NULL, 0, &a, &sc);
		g4_rng_uniform(&b);
		CHECK(g4_rng_next(&a) == g4_rng_next(&b));
	}
	g4_sampler_scratch_free(&sc);
}

/*
 * A row holding a NaN is no choice (G4_SAMPLE_NAN) wherever the NaN is, at
 * every setting (greedy, temperature, top-k, top-p, min-p, penalties), also
 * when a larger finite logit would win; g4_sample_dist refuses it
 * (G4_ERR_NUMERIC) and so does the backend's greedy choice.  A NaN at a
 * suppressed id is overwritten by the suppression: the row is chosen from.
 */
G4_TEST(sampler_nan_row_is_no_choice)
{
	static const struct
	{
		float		temperature,
					top_p,
					min_p,
					repetition_penalty;
		int			top_k;
	}			settings[] = {
		{0.0f, 1.0f, 0.0f, 1.0f, 0},	/* greedy */
		{1.0f, 1.0f, 0.0f, 1.0f, 0},	/* temperature */
		{0.7f, 1.0f, 0.0f, 1.0f, 3},	/* top-k */
		{1.0f, 0.5f, 0.0f, 1.0f, 0},	/* top-p */
		{1.0f, 1.0f, 0.2f, 1.0f, 0},	/* min-p */
		{0.8f, 0.9f, 0.05f, 1.3f, 4},	/* all of them, penalties too */
	};
	static const int nan_at[] = {0, 4, 7};	/* first, middle, last */
	static const int32_t prompt[] = {4, 7};
	float		l[8];
	double		probs[8];
	int32_t		ids[1];
	int32_t		suppress[1];
	g4_sampler_scratch sc = {0};
	g4_token_hist hist;
	g4_backend *be;
	g4_err		err;
	size_t		s,
				a;
	int			i;

	CHECK_OK(g4_hist_init(&hist, 8, prompt, 2), &err);
	CHECK_OK(g4_backend_cpu_create(1, &be, &err), &err);
	for (a = 0; a < G4_ARRAY_LEN(nan_at); a++)
	{
		for (s = 0; s < G4_ARRAY_LEN(settings); s++)
		{
			g4_sampling p;
			g4_rng		rng;
			int32_t		id;
			int			rc;

			g4_sampling_default(&p);
			p.temperature = settings[s].temperature;
			p.top_p = settings[s].top_p;
			p.min_p = settings[s].min_p;
			p.top_k = settings[s].top_k;
			p.repetition_penalty = settings[s].repetition_penalty;
			g4_rng_seed(&rng, 3);
			for (i = 0; i < 8; i++)
				l[i] = i == 5 ? 9.0f : 0.25f * (float) i;
			l[nan_at[a]] = NAN;
			id = g4_sample(l, 8, &p, &hist, NULL, 0, &rng, &sc);
			CHECK_MSG(id == G4_SAMPLE_NAN, "NaN at %d, setting %zu: g4_sample chose %d", nan_at[a], s, id);
			for (i = 0; i < 8; i++)
				l[i] = i == 5 ? 9.0f : 0.25f * (float) i;
			l[nan_at[a]] = NAN;
			rc = g4_sample_dist(l, 8, &p, &hist, NULL, 0, &sc, probs);
			CHECK_MSG(rc == G4_ERR_NUMERIC, "NaN at %d, setting %zu: g4_sample_dist returned %d", nan_at[a], s,
					  rc);
		}
		for (i = 0; i < 8; i++)
			l[i] = 0.25f * (float) i;
		l[nan_at[a]] = NAN;
		CHECK_OK(be->ops->argmax(be, l, 1, 8, ids), &err);
		CHECK_MSG(ids[0] == G4_SAMPLE_NAN, "NaN at %d: the backend's argmax chose %d", nan_at[a], ids[0]);
		/* suppressed, the NaN is gone: the largest of the others */
		{
			g4_sampling p;
			g4_rng		rng;

			g4_sampling_default(&p);
			g4_rng_seed(&rng, 3);
			suppress[0] = nan_at[a];
			CHECK_INT(g4_sample(l, 8, &p, NULL, suppress, 1, &rng, &sc), nan_at[a] == 7 ? 6 : 7);
			l[nan_at[a]] = NAN;
			p.temperature = 1.0f;
			p.top_k = 1;
			CHECK_INT(g4_sample(l, 8, &p, NULL, suppress, 1, &rng, &sc), nan_at[a] == 7 ? 6 : 7);
		}
	}
	be->ops->destroy(be);
	g4_hist_free(&hist);
	g4_sampler_scratch_free(&sc);
}
