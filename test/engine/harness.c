/*
 * harness.c — see harness.h.
 */
#include "harness.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "test.h"
#include "util.h"

const char *
h_fixture_model(void)
{
	const char *p = getenv("G4_FIXTURE_MODEL");

	return p && g4_is_dir(p) ? p : NULL;
}

const char *
h_assistant_of(const char *model, char *buf, size_t len)
{
	snprintf(buf, len, "%s-assistant", model);
	return g4_is_dir(buf) ? buf : NULL;
}

void
h_options(g4_options *o, const char *model)
{
	g4_options_default(o);
	o->model_path = model;
	o->backend = G4_BACKEND_CPU;
	o->threads = 2;
	o->kv_dtype = G4_KV_F32;
	o->max_model_len = 4096;
	o->max_num_seqs = 8;
	o->max_num_batched_tokens = 512;
	o->kv_pool_bytes = (size_t) 64 << 20;
}

int
h_model_copy(const char *model, const char *name, h_file_edit edit, void *ctx, char *out, size_t out_len)
{
	DIR		   *dir;
	struct dirent *de;
	int			rc = 0;

	snprintf(out, out_len, "%s/%s", g4_test_tmpdir(), name);
	mkdir(out, 0755);
	dir = opendir(model);
	if (!dir)
		return -1;
	while (rc == 0 && (de = readdir(dir)) != NULL)
	{
		char		src[4096],
					dst[4200];
		char	   *data;
		size_t		len;
		g4_err		err;
		FILE	   *f;

		snprintf(src, sizeof(src), "%s/%s", model, de->d_name);
		if (!g4_is_file(src))
			continue;			/* ".", ".." */
		snprintf(dst, sizeof(dst), "%s/%s", out, de->d_name);
		if (g4_read_file(src, &data, &len, &err) != G4_OK)
		{
			rc = -1;
			break;
		}
		if (edit)
			rc = edit(ctx, de->d_name, &data, &len);
		if (rc == 0)
		{
			f = fopen(dst, "wb");
			rc = f && fwrite(data, 1, len, f) == len ? 0 : -1;
			if (f && fclose(f) != 0)
				rc = -1;
		}
		free(data);
	}
	closedir(dir);
	return rc;
}

static h_result *
find(h_run *run, uint64_t id)
{
	int			i;

	for (i = 0; i < run->n; i++)
		if (run->r[i].id == id)
			return &run->r[i];
	return NULL;
}

static void
on_logits(void *ctx, uint64_t id, const float *logits, int vocab)
{
	h_result   *r = find(ctx, id);

	if (r && !r->first_logits)
	{
		r->first_logits = malloc((size_t) vocab * sizeof(float));
		if (r->first_logits)
			memcpy(r->first_logits, logits, (size_t) vocab * sizeof(float));
		r->vocab = vocab;
	}
}

static void
on_token(void *ctx, uint64_t id, int32_t token)
{
	h_result   *r = find(ctx, id);

	if (r && r->n_tokens < (int) G4_ARRAY_LEN(r->tokens))
		r->tokens[r->n_tokens++] = token;
}

static void
append(char **buf, size_t *len, const char *s, size_t n)
{
	char	   *p = realloc(*buf, *len + n + 1);

	if (!p)
		return;
	memcpy(p + *len, s, n);
	*len += n;
	p[*len] = '\0';
	*buf = p;
}

void
h_on_event(void *ctx, const g4_event *ev)
{
	h_result   *r = find(ctx, ev->seq_id);

	if (!r)
		return;
	switch (ev->kind)
	{
		case G4_EV_TEXT:
			if (ev->channel == G4_CHANNEL_REASONING)
				append(&r->reasoning, &r->reasoning_len, ev->text, ev->text_len);
			else
				append(&r->text, &r->text_len, ev->text, ev->text_len);
			break;
		case G4_EV_FINISH:
			r->finished = 1;
			r->finish_reason = ev->finish_reason;
			r->prompt_tokens = ev->prompt_tokens;
			r->completion_tokens = ev->completion_tokens;
			break;
		case G4_EV_ERROR:
			r->finished = 1;
			r->failed = 1;
			r->error_code = ev->error_code;
			snprintf(r->error, sizeof(r->error), "%s", ev->error_msg);
			break;
	}
}

void
h_attach(g4_engine *e, h_run *run)
{
	g4_set_hooks(e, on_logits, on_token, run);
}

void
h_attach_tokens(g4_engine *e, h_run *run)
{
	g4_set_hooks(e, NULL, on_token, run);
}

int
h_drain(g4_engine *e, h_run *run, int max_steps, g4_err *err)
{
	int			steps = 0;

	for (;;)
	{
		int			i,
					done = 1;
		int			rc;

		for (i = 0; i < run->n; i++)
			done &= run->r[i].finished;
		if (done)
			return 0;
		if (steps++ >= max_steps)
			return g4_fail(err, G4_ERR_INTERNAL, "not finished after %d steps", max_steps);
		rc = g4_step(e, h_on_event, run, err);
		if (rc < 0)
			return rc;
	}
}

int
h_failed_as(const char *what, int rc, const g4_err *err, int code, const char *s1, const char *s2)
{
	if (rc == code && err->code == code && (!s1 || strstr(err->msg, s1)) && (!s2 || strstr(err->msg, s2)))
		return 1;
	g4_test_fail(__FILE__, __LINE__, "%s: got %d \"%s\", expected %d with \"%s\"%s%s",
				 what, rc, err->msg, code, s1 ? s1 : "", s2 ? " and " : "", s2 ? s2 : "");
	return 0;
}

int
h_run_one(g4_engine *e, const g4_request *req, int max_steps, h_result *res, g4_err *err)
{
	h_run		run = {res, 1};
	int			rc;

	memset(res, 0, sizeof(*res));
	h_attach(e, &run);
	rc = g4_submit(e, req, &res->id, err);
	return rc != G4_OK ? rc : h_drain(e, &run, max_steps, err);
}

void
h_result_free(h_result *r)
{
	free(r->first_logits);
	free(r->text);
	free(r->reasoning);
	memset(r, 0, sizeof(*r));
}

void
h_token_request(g4_request *req, const int32_t *ids, int n, int max_tokens)
{
	memset(req, 0, sizeof(*req));
	req->input_kind = G4_INPUT_TOKENS;
	req->tokens = ids;
	req->n_tokens = n;
	req->max_tokens = max_tokens;
	g4_sampling_default(&req->sampling);
}

int
h_golden_load(const char *name, h_golden *g, char *why, size_t why_len)
{
	char		path[4096];
	char	   *text;
	size_t		len;
	g4_err		err;
	FILE	   *f;
	long		sz;

	memset(g, 0, sizeof(*g));
	snprintf(path, sizeof(path), "%s/test/golden/%s.json", g4_test_srcdir(), name);
	if (g4_read_file(path, &text, &len, &err) != G4_OK)
	{
		snprintf(why, why_len, "%s", err.msg);
		return -1;
	}
	g->doc = g4j_parse(text, len, &err);
	free(text);
	if (!g->doc)
	{
		snprintf(why, why_len, "%s: %s", path, err.msg);
		return -1;
	}
	snprintf(path, sizeof(path), "%s/test/golden/%s.bin", g4_test_srcdir(), name);
	f = fopen(path, "rb");
	if (!f)
		return 0;				/* no float data for this golden */
	fseek(f, 0, SEEK_END);
	sz = ftell(f);
	fseek(f, 0, SEEK_SET);
	g->data = malloc((size_t) sz);
	if (!g->data || fread(g->data, 1, (size_t) sz, f) != (size_t) sz)
	{
		fclose(f);
		snprintf(why, why_len, "cannot read %s", path);
		return -1;
	}
	fclose(f);
	g->n_floats = (size_t) sz / sizeof(float);
	return 0;
}

void
h_golden_free(h_golden *g)
{
	g4j_free(g->doc);
	free(g->data);
	memset(g, 0, sizeof(*g));
}

const g4j *
h_golden_case(const h_golden *g, const char *name)
{
	const g4j  *cases = g4j_get(g4j_root(g->doc), "cases");
	size_t		i;

	for (i = 0; i < g4j_len(cases); i++)
	{
		const char *n = g4j_get_str(g4j_at(cases, i), "name");

		if (n && strcmp(n, name) == 0)
			return g4j_at(cases, i);
	}
	return NULL;
}

int32_t *
h_ints(const g4j *arr, int *n)
{
	int32_t    *out = malloc((size_t) G4_MAX(g4j_len(arr), 1) * sizeof(int32_t));
	size_t		i;

	*n = (int) g4j_len(arr);
	if (!out)
		return NULL;
	for (i = 0; i < g4j_len(arr); i++)
		out[i] = (int32_t) g4j_int(g4j_at(arr, i), -1);
	return out;
}

double
h_max_abs_diff(const float *a, const float *b, int n, double *max_ref)
{
	double		m = 0.0,
				r = 0.0;
	int			i;

	for (i = 0; i < n; i++)
	{
		double		d = (double) a[i] - (double) b[i];

		if (d < 0)
			d = -d;
		if (d > m || d != d)
			m = d;
		if ((double) b[i] > r)
			r = b[i];
		if (-(double) b[i] > r)
			r = -(double) b[i];
	}
	if (max_ref)
		*max_ref = r;
	return m;
}

uint64_t
h_fnv1a64_file(const char *path)
{
	FILE	   *f = fopen(path, "rb");
	uint64_t	h = 0xcbf29ce484222325ull;
	unsigned char buf[65536];
	size_t		n;

	if (!f)
		return 0;
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
	{
		size_t		i;

		for (i = 0; i < n; i++)
			h = (h ^ buf[i]) * 0x100000001b3ull;
	}
	fclose(f);
	return h;
}

static void
put_le(uint8_t *p, uint32_t v, int bytes)
{
	int			i;

	for (i = 0; i < bytes; i++)
		p[i] = (uint8_t) (v >> (8 * i));
}

uint8_t *
h_float_wav(const float *frames, int64_t n, int channels, int rate, size_t *len)
{
	uint32_t	data = (uint32_t) ((size_t) n * channels * sizeof(float));
	uint8_t    *w = malloc(44 + (size_t) data);
	int64_t		i;

	if (!w)
		return NULL;
	memcpy(w, "RIFF", 4);
	put_le(w + 4, 36 + data, 4);
	memcpy(w + 8, "WAVEfmt ", 8);
	put_le(w + 16, 16, 4);
	put_le(w + 20, 3, 2);		/* WAVE_FORMAT_IEEE_FLOAT */
	put_le(w + 22, (uint32_t) channels, 2);
	put_le(w + 24, (uint32_t) rate, 4);
	put_le(w + 28, (uint32_t) rate * channels * 4, 4);
	put_le(w + 32, (uint32_t) channels * 4, 2);
	put_le(w + 34, 32, 2);
	memcpy(w + 36, "data", 4);
	put_le(w + 40, data, 4);
	for (i = 0; i < n * channels; i++)
	{
		uint32_t	bits;

		memcpy(&bits, &frames[i], 4);
		put_le(w + 44 + 4 * i, bits, 4);
	}
	*len = 44 + (size_t) data;
	return w;
}

int
h_kv_blocks_used(g4_engine *e)
{
	g4_stats	st;
	int			g,
				used = 0;

	g4_stats_get(e, &st);
	for (g = 0; g < st.n_groups; g++)
		used += (int) st.groups[g].blocks_used;
	return used;
}
