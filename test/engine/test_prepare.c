/*
 * test_prepare.c — g4_prepare / g4_submit_prepared: a request prepared on
 * another thread while the engine steps gives the same tokens as one
 * submitted directly; a cancelled preparation stops with G4_ERR_CANCELLED;
 * plain-text content and control tokens in a raw prompt.
 */
#include <pthread.h>
#include <string.h>

#include "harness.h"
#include "test.h"

typedef struct
{
	g4_engine  *e;
	g4_request	req;
	const g4_cancel_flag *cancel;
	g4_prepared *p;
	g4_err		err;
	int			rc;
} prep_job;

static void *
prepare_thread(void *arg)
{
	prep_job   *j = arg;

	j->rc = g4_prepare(j->e, &j->req, j->cancel, &j->p, &j->err);
	return NULL;
}

static void
chat_request(g4_request *req, g4_message *msg, const char *content, int max_tokens)
{
	memset(req, 0, sizeof(*req));
	g4_sampling_default(&req->sampling);
	req->input_kind = G4_INPUT_CHAT;
	memset(msg, 0, sizeof(*msg));
	msg->role = G4_ROLE_USER;
	msg->content = content;
	req->messages = msg;
	req->n_messages = 1;
	req->max_tokens = max_tokens;
}

G4_TEST(engine_prepare_off_thread)
{
	static const int32_t ids[] = {2, 1000, 1001, 1002, 1003};
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	g4_request	busy;
	g4_message	msg;
	h_result	direct,
				prepared;
	h_run		run;
	prep_job	job;
	pthread_t	th;
	uint64_t	id;
	int			steps = 0;

	H_NEED_FIXTURE(model);
	h_options(&o, model);
	CHECK_OK(g4_open(&o, &e, &err), &err);

	/* the reference: submitted directly */
	memset(&job, 0, sizeof(job));
	chat_request(&job.req, &msg, "Tell me about the sea.", 12);
	CHECK_OK(h_run_one(e, &job.req, 1000, &direct, &err), &err);

	/* prepared on a thread while another request is being stepped */
	h_token_request(&busy, ids, 5, 40);
	memset(&prepared, 0, sizeof(prepared));
	run.r = &prepared;
	run.n = 1;
	h_attach(e, &run);
	CHECK_OK(g4_submit(e, &busy, &id, &err), &err);
	job.e = e;
	CHECK(pthread_create(&th, NULL, prepare_thread, &job) == 0);
	while (g4_has_work(e) && steps++ < 1000)
		CHECK(g4_step(e, h_on_event, &run, &err) >= 0);
	CHECK(pthread_join(th, NULL) == 0);
	CHECK_OK(job.rc, &job.err);
	CHECK_OK(g4_submit_prepared(e, job.p, &id, &err), &err);
	prepared.id = id;
	CHECK_OK(h_drain(e, &run, 1000, &err), &err);
	CHECK(prepared.finished);
	CHECK_INT(prepared.n_tokens, direct.n_tokens);
	CHECK(memcmp(prepared.tokens, direct.tokens, sizeof(int32_t) * (size_t) direct.n_tokens) == 0);
	h_result_free(&prepared);
	h_result_free(&direct);
	g4_close(e);
}

G4_TEST(engine_prepare_cancelled)
{
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	g4_message	msg;
	prep_job	job;
	g4_cancel_flag cancel = 1;

	H_NEED_FIXTURE(model);
	h_options(&o, model);
	CHECK_OK(g4_open(&o, &e, &err), &err);
	memset(&job, 0, sizeof(job));
	chat_request(&job.req, &msg, "Tell me about the sea.", 12);
	job.e = e;
	job.cancel = &cancel;
	prepare_thread(&job);
	CHECK_INT(job.rc, G4_ERR_CANCELLED);
	CHECK(job.p == NULL);
	cancel = 0;
	prepare_thread(&job);
	CHECK_OK(job.rc, &job.err);
	g4_prepared_free(job.p);
	CHECK(!g4_has_work(e));
	g4_close(e);
}

/* A raw prompt: special-token text is data unless control tokens are allowed. */
G4_TEST(engine_raw_prompt_control_tokens)
{
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	g4_request	req;
	h_result	plain,
				control;

	H_NEED_FIXTURE(model);
	h_options(&o, model);
	CHECK_OK(g4_open(&o, &e, &err), &err);
	memset(&req, 0, sizeof(req));
	g4_sampling_default(&req.sampling);
	req.input_kind = G4_INPUT_TEXT;
	req.prompt = "x<|turn>model\ny";
	req.max_tokens = 1;
	CHECK_OK(h_run_one(e, &req, 100, &plain, &err), &err);
	req.allow_control_tokens = 1;
	CHECK_OK(h_run_one(e, &req, 100, &control, &err), &err);
	/* <|turn> is one token when parsed, several as text */
	CHECK(plain.prompt_tokens > control.prompt_tokens);
	h_result_free(&plain);
	h_result_free(&control);
	g4_close(e);
}
