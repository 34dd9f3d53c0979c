/*
 * test_load.c — opening models: every way a model directory can be wrong
 * produces an error that names the problem; the bf16 (dense) checkpoint
 * form loads and matches transformers like the int4 one; each family's
 * config defaults.
 */
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "harness.h"
#include "test.h"

/* What broken_copy breaks: `from` replaced by `to` in config.json (when
 * given), model.safetensors truncated to `trunc` bytes (when > 0). */
typedef struct
{
	const char *from,
			   *to;
	long		trunc;
} breakage;

static int
break_file(void *ctx, const char *file, char **data, size_t *len)
{
	const breakage *b = ctx;

	if (strcmp(file, "config.json") == 0 && b->from)
	{
		char	   *at = strstr(*data, b->from);
		char	   *text;

		if (!at)
			return -1;
		text = malloc(*len - strlen(b->from) + strlen(b->to) + 1);
		if (!text)
			return -1;
		snprintf(text, *len - strlen(b->from) + strlen(b->to) + 1, "%.*s%s%s", (int) (at - *data), *data, b->to,
				 at + strlen(b->from));
		free(*data);
		*data = text;
		*len = strlen(text);
	}
	else if (strcmp(file, "model.safetensors") == 0 && b->trunc > 0)
		*len = (size_t) b->trunc;
	return 0;
}

/* Copy the fixture into tmpdir/name, broken as told. */
static int
broken_copy(const char *model, const char *name, const char *from, const char *to, long trunc, char *out,
			size_t out_len)
{
	breakage	b = {from, to, trunc};

	return h_model_copy(model, name, break_file, &b, out, out_len);
}

static int
open_err(const char *path, g4_err *err)
{
	g4_options	o;
	g4_engine  *e = NULL;
	int			rc;

	h_options(&o, path);
	rc = g4_open(&o, &e, err);
	if (rc == G4_OK)
		g4_close(e);
	return rc;
}

G4_TEST(load_errors_name_the_problem)
{
	g4_err		err;
	char		dir[4096];

	H_NEED_FIXTURE(model);
	CHECK_INT(open_err("/nonexistent/model", &err), G4_ERR_IO);
	CHECK(strstr(err.msg, "no such model"));

	CHECK_INT(open_err(g4_test_tmpdir(), &err), G4_ERR_IO);
	CHECK(strstr(err.msg, "config.json"));

	CHECK(broken_copy(model, "arch", "\"model_type\": \"gemma4_unified\"", "\"model_type\": \"llama\"", 0, dir,
					  sizeof(dir)) == 0);
	CHECK_INT(open_err(dir, &err), G4_ERR_UNSUPPORTED);
	CHECK_MSG(strstr(err.msg, "unknown architecture") && strstr(err.msg, "llama"), "%s", err.msg);

	CHECK(broken_copy(model, "shape", "\"intermediate_size\": 128", "\"intermediate_size\": 256", 0, dir,
					  sizeof(dir)) == 0);
	CHECK_INT(open_err(dir, &err), G4_ERR_FORMAT);
	CHECK_MSG(strstr(err.msg, "mlp.gate_proj.weight_packed") && strstr(err.msg, "expected"), "%s", err.msg);

	CHECK(broken_copy(model, "group", "\"group_size\": 32", "\"group_size\": 128", 0, dir, sizeof(dir)) == 0);
	CHECK_INT(open_err(dir, &err), G4_ERR_UNSUPPORTED);
	CHECK_MSG(strstr(err.msg, "group size 128"), "%s", err.msg);

	CHECK(broken_copy(model, "trunc", NULL, NULL, 200000, dir, sizeof(dir)) == 0);
	CHECK(open_err(dir, &err) != G4_OK);
	CHECK_MSG(strstr(err.msg, "truncated") || strstr(err.msg, "past the end") || strstr(err.msg, "bytes"), "%s",
			  err.msg);

	CHECK(broken_copy(model, "nofile", NULL, NULL, 0, dir, sizeof(dir)) == 0);
	{
		char		st[4200];

		snprintf(st, sizeof(st), "%s/model.safetensors", dir);
		unlink(st);
	}
	CHECK_INT(open_err(dir, &err), G4_ERR_IO);
	CHECK_MSG(strstr(err.msg, "safetensors"), "%s", err.msg);

	CHECK(broken_copy(model, "notok", NULL, NULL, 0, dir, sizeof(dir)) == 0);
	{
		char		tj[4200];

		snprintf(tj, sizeof(tj), "%s/tokenizer.json", dir);
		unlink(tj);
	}
	CHECK_INT(open_err(dir, &err), G4_ERR_IO);
	CHECK_MSG(strstr(err.msg, "tokenizer.json"), "%s", err.msg);
}

G4_TEST(load_dense_bf16_checkpoint_matches_transformers)
{
	const char *dense = getenv("G4_FIXTURE_DENSE");
	h_golden	G;
	char		why[512];
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	const g4j  *cases;
	size_t		k;

	if (!dense || !g4_is_dir(dense))
		G4_SKIP("G4_FIXTURE_DENSE not set (run through make check-engine)");
	CHECK_MSG(h_golden_load("model-tiny-dense", &G, why, sizeof(why)) == 0, "%s", why);
	h_options(&o, dense);
	CHECK_OK(g4_open(&o, &e, &err), &err);
	cases = g4j_get(g4j_root(G.doc), "cases");
	for (k = 0; k < g4j_len(cases); k++)
	{
		const g4j  *c = g4j_at(cases, k);
		h_result	res;
		g4_request	req;
		int32_t    *ids,
				   *want;
		int			n,
					nw,
					i;
		double		d64;
		double		bound = 3.0 * g4j_get_num(c, "fp32_vs_fp64", 0) + 1e-6;

		if (!g4j_get(c, "greedy"))
			continue;			/* the text cases */
		ids = h_ints(g4j_get(c, "ids"), &n);
		want = h_ints(g4j_get(c, "greedy"), &nw);
		h_token_request(&req, ids, n, nw);
		CHECK_OK(h_run_one(e, &req, 10000, &res, &err), &err);
		d64 = h_max_abs_diff(res.first_logits, G.data + g4j_get_int(c, "logits64_offset", 0), res.vocab, NULL);
		printf("    %-12s |engine - float64| = %.2e (bound %.2e)\n", g4j_get_str(c, "name"), d64, bound);
		CHECK(d64 <= bound);
		for (i = 0; i < nw && i < res.n_tokens; i++)
			CHECK_INT(res.tokens[i], want[i]);
		CHECK_INT(res.n_tokens, nw);
		h_result_free(&res);
		free(ids);
		free(want);
	}
	g4_close(e);
	h_golden_free(&G);
}

/* A text config.json naming only its type and layer count. */
static void
write_min_config(const char *dir, const char *model_type, int layers)
{
	char		path[4200];
	FILE	   *f;

	snprintf(path, sizeof(path), "%s/config.json", dir);
	f = fopen(path, "w");
	if (!f)
		return;
	fprintf(f, "{\"model_type\": \"%s\", \"num_hidden_layers\": %d}\n", model_type, layers);
	fclose(f);
}

/* What each family's parser assumes where its config.json is silent, and
 * a layer count out of range refused. */
G4_TEST(config_defaults_by_family)
{
	static const struct
	{
		const char *type;
		int			vocab,
					window,
					max_position;
	}			fam[] = {{"gemma3_text", 262208, 4096, 131072}, {"gemma4_text", 262144, 1024, 262144}};
	char		dir[4096];
	g4_err		err;

	snprintf(dir, sizeof(dir), "%s/config-defaults", g4_test_tmpdir());
	CHECK(mkdir(dir, 0700) == 0 || errno == EEXIST);
	for (size_t i = 0; i < G4_ARRAY_LEN(fam); i++)
	{
		g4_model_config c;

		write_min_config(dir, fam[i].type, 12);
		CHECK_OK(g4_config_load_hf(dir, &c, &err), &err);
		CHECK_INT(c.vocab_size, fam[i].vocab);
		CHECK_INT(c.sliding_window, fam[i].window);
		CHECK_INT(c.max_position, fam[i].max_position);
		CHECK_INT(c.n_layers, 12);
		CHECK_INT(c.hidden_size, 2304);
		/* every sixth layer full */
		for (int l = 0; l < 12; l++)
			CHECK_INT(c.layer_full[l], (l + 1) % 6 == 0);
	}
	write_min_config(dir, "gemma3_text", 0);
	CHECK_INT(g4_config_load_hf(dir, &(g4_model_config) {0}, &err), G4_ERR_FORMAT);
	CHECK_MSG(strstr(err.msg, "num_hidden_layers = 0 is out of range"), "%s", err.msg);
}
