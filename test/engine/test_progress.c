/*
 * test_progress.c — progress reports of long calls (g4_options.progress):
 * a step that runs for a while reports on the caller's thread, from inside
 * the step, no more often than G4_PROGRESS_INTERVAL; a short step reports
 * nothing.
 */
#include <pthread.h>

#include "harness.h"
#include "test.h"

#define LONG_PROMPT 2048		/* one chunk: a step of about a second on two threads */

typedef struct
{
	pthread_t	caller;
	int			in_step;		/* set by the test around g4_step */
	int			calls;
	int			outside_step;
	int			other_thread;
} progress_seen;

static void
on_progress(void *ctx)
{
	progress_seen *p = ctx;

	p->calls++;
	p->outside_step += !p->in_step;
	p->other_thread += !pthread_equal(pthread_self(), p->caller);
}

/* One step under watch; returns its duration in seconds, or -1. */
static double
watched_step(g4_engine *e, progress_seen *seen, h_run *run, g4_err *err)
{
	double		t0 = g4_now();
	int			rc;

	seen->in_step = 1;
	rc = g4_step(e, h_on_event, run, err);
	seen->in_step = 0;
	return rc < 0 ? -1.0 : g4_now() - t0;
}

G4_TEST(engine_progress_reported_during_a_long_step)
{
	const char *model = h_fixture_model();
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	g4_request	req;
	h_result	res[2];
	h_run		run = {res, 2};
	progress_seen seen;
	int32_t		ids[LONG_PROMPT];
	double		t;
	int			before;
	int			i;

	if (!model)
		G4_SKIP("G4_FIXTURE_MODEL not set (run through make check-engine)");
	memset(&seen, 0, sizeof(seen));
	seen.caller = pthread_self();
	h_options(&o, model);
	o.max_num_batched_tokens = LONG_PROMPT;
	o.progress = on_progress;
	o.progress_ctx = &seen;
	CHECK_OK(g4_open(&o, &e, &err), &err);
	memset(res, 0, sizeof(res));
	h_attach(e, &run);

	/* the whole prompt in one step, which the CPU backend's worker threads
	 * share */
	ids[0] = 2;
	for (i = 1; i < LONG_PROMPT; i++)
		ids[i] = 1000 + i % 4000;
	h_token_request(&req, ids, LONG_PROMPT, 1);
	CHECK_OK(g4_submit(e, &req, &res[0].id, &err), &err);
	t = watched_step(e, &seen, &run, &err);
	CHECK_MSG(t >= 0, "the long step failed: %s", err.msg);
	CHECK(res[0].finished);
	CHECK_MSG(t > 2 * G4_PROGRESS_INTERVAL, "the long step took only %.3f s: too short to report", t);
	CHECK_MSG(seen.calls >= 1, "a step of %.3f s made no progress report", t);
	CHECK_INT(seen.outside_step, 0);
	CHECK_INT(seen.other_thread, 0);
	/* rate-limited: the first report G4_PROGRESS_INTERVAL into the step,
	 * each next one at least that much later */
	CHECK_MSG(seen.calls <= (int) (t / G4_PROGRESS_INTERVAL), "%d reports in a step of %.3f s", seen.calls, t);

	/* a short step reports nothing, however long ago the last report was */
	before = seen.calls;
	h_token_request(&req, ids, 11, 1);
	CHECK_OK(g4_submit(e, &req, &res[1].id, &err), &err);
	t = watched_step(e, &seen, &run, &err);
	CHECK_MSG(t >= 0, "the short step failed: %s", err.msg);
	CHECK(res[1].finished);
	if (t < G4_PROGRESS_INTERVAL)
		CHECK_INT(seen.calls, before);

	for (i = 0; i < 2; i++)
		h_result_free(&res[i]);
	g4_close(e);
}
