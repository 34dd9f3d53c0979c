/*
 * harness.h — helpers for engine-level tests: opening the fixture model,
 * running requests to completion while capturing logits and tokens, and
 * reading the committed transformers references.
 */
#ifndef G4_TEST_HARNESS_H
#define G4_TEST_HARNESS_H

#include "engine_internal.h"
#include "json.h"

/* Path of the generated fixture model (G4_FIXTURE_MODEL), or NULL. */
const char *h_fixture_model(void);

/* The fixture's MTP assistant, written beside it as "<model>-assistant"
 * (gemma4-make-model --assistant): its path in buf, or NULL when absent. */
const char *h_assistant_of(const char *model, char *buf, size_t len);

/* In an engine test (test.h's G4_SKIP): declares `model`, the fixture's
 * path, and skips without it. */
#define H_NEED_FIXTURE(model) \
	const char *model = h_fixture_model(); \
	if (!model) G4_SKIP("G4_FIXTURE_MODEL not set (run through make check-engine)")

/* In a CUDA test (test.h's G4_SKIP): skip without a device, the fixture
 * model or its assistant, whose path goes into the array abuf. */
#define H_NEED_CUDA_AND_ASSISTANT(model, abuf) \
	do { \
		if (!g4_backend_cuda_available()) \
			G4_SKIP("no CUDA device"); \
		if (!(model)) \
			G4_SKIP("G4_FIXTURE_MODEL not set"); \
		if (!h_assistant_of((model), (abuf), sizeof(abuf))) \
			G4_SKIP("no assistant beside the fixture (gemma4-make-model --preset tiny --assistant)"); \
	} while (0)

/* Engine options for tests: CPU backend, f32 KV, small pool. */
void		h_options(g4_options *o, const char *model);

/* Change one file's bytes on their way into a model's copy: *data
 * (malloc'd, NUL-terminated) may be edited in place, or replaced by another
 * malloc'd buffer, and *len changed.  Non-zero fails the copy. */
typedef int (*h_file_edit) (void *ctx, const char *file, char **data, size_t *len);

/* Copy the files of the model directory into tmpdir/name (its path in out),
 * each through edit when given; 0 on success. */
int			h_model_copy(const char *model, const char *name, h_file_edit edit, void *ctx, char *out,
						 size_t out_len);

/* Everything observed for one request. */
typedef struct
{
	uint64_t	id;
	int			finished;
	int			failed;
	int			finish_reason;
	int			error_code;
	char		error[1024];
	int32_t		tokens[1024];
	int			n_tokens;
	float	   *first_logits;	/* logits of the first sampled position (malloc'd) */
	int			vocab;
	char	   *text;			/* content text (malloc'd) */
	size_t		text_len;
	char	   *reasoning;
	size_t		reasoning_len;
	int			prompt_tokens;
	int			completion_tokens;
} h_result;

typedef struct
{
	h_result   *r;
	int			n;
} h_run;

/* Install the hooks that fill results, submit nothing. */
void		h_attach(g4_engine *e, h_run *run);
/* The same without the logits hook (first_logits stays NULL), which would
 * make the engine sample on the host: a backend that chooses tokens on the
 * device goes on doing so. */
void		h_attach_tokens(g4_engine *e, h_run *run);
/* Event callback filling the run's results. */
void		h_on_event(void *ctx, const g4_event *ev);
/* Step until every result is finished (or max_steps). Returns 0 on success. */
int			h_drain(g4_engine *e, h_run *run, int max_steps, g4_err *err);
/* Submit one request and step until it has finished (or max_steps); res is
 * cleared first.  Returns 0, or the failure of the submission or a step. */
int			h_run_one(g4_engine *e, const g4_request *req, int max_steps, h_result *res, g4_err *err);
void		h_result_free(h_result *r);

/* A failed call's outcome: rc and err->code are `code` and the message
 * holds s1 and s2 (either may be NULL); else reports a failure naming
 * `what` and returns 0. */
int			h_failed_as(const char *what, int rc, const g4_err *err, int code, const char *s1, const char *s2);

/* A token-id request with greedy sampling. */
void		h_token_request(g4_request *req, const int32_t *ids, int n, int max_tokens);

/* KV blocks in use, all layer groups (0 once every sequence is gone). */
int			h_kv_blocks_used(g4_engine *e);

/* The committed references of test/golden/<name>.json/.bin. */
typedef struct
{
	g4j_doc    *doc;
	float	   *data;
	size_t		n_floats;
} h_golden;

int			h_golden_load(const char *name, h_golden *g, char *why, size_t why_len);
void		h_golden_free(h_golden *g);
const g4j  *h_golden_case(const h_golden *g, const char *name);
/* int array field of a case, malloc'd */
int32_t    *h_ints(const g4j *arr, int *n);

/* max |a - b| and max |b| over n floats */
double		h_max_abs_diff(const float *a, const float *b, int n, double *max_ref);

/* FNV-1a 64 of a file; 0 when unreadable */
uint64_t	h_fnv1a64_file(const char *path);

/* An in-memory WAV (32-bit float) of n interleaved frames, malloc'd; NULL
 * when out of memory. */
uint8_t    *h_float_wav(const float *frames, int64_t n, int channels, int rate, size_t *len);

#endif
