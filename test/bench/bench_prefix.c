/*
 * bench_prefix.c — prefill saved by the prefix cache: N requests whose
 * prompts share a P-token prefix (an instruction) followed by D tokens of
 * their own (a document), run through the engine with the cache off and on.
 *
 *   bench-prefix [--model FILE|DIR] [--backend cpu|cuda] [--threads N]
 *                [--kv-dtype f32|bf16|turboquant_k8v4] [--requests N]
 *                [--prefix P] [--doc D] [--max-tokens G] [--max-num-seqs S]
 *                [--max-batched T] [--unrelated K] [--max-model-len L]
 *
 * --unrelated K submits K prompts sharing nothing after each shared one
 * (traffic that cycles the pool between two uses of the prefix).  Prints
 * the prefill tokens computed and saved, how many times the prefix's whole
 * blocks were prefilled (per 64 requests), the wall time, and whether the
 * greedy outputs are the same with the cache on and off.  Figures only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"

typedef struct
{
	uint64_t   *ids;
	int			n;
	int			done;
	int			failed;
} bench_run;

static double
now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static void
on_event(void *ctx, const g4_event *ev)
{
	bench_run  *r = ctx;

	if (ev->kind == G4_EV_FINISH || ev->kind == G4_EV_ERROR)
	{
		r->done++;
		if (ev->kind == G4_EV_ERROR)
		{
			r->failed++;
			fprintf(stderr, "bench-prefix: request failed: %s\n", ev->error_msg);
		}
	}
}

/* Each request's output text, to compare the runs. */
typedef struct
{
	bench_run  *r;
	char	  **text;
	size_t	   *len;
} text_ctx;

static void
on_text(void *ctx, const g4_event *ev)
{
	text_ctx   *t = ctx;
	int			i;

	if (ev->kind == G4_EV_TEXT)
		for (i = 0; i < t->r->n; i++)
			if (t->r->ids[i] == ev->seq_id)
			{
				char	   *p = realloc(t->text[i], t->len[i] + ev->text_len + 1);

				if (!p)
					break;
				memcpy(p + t->len[i], ev->text, ev->text_len);
				t->len[i] += ev->text_len;
				p[t->len[i]] = '\0';
				t->text[i] = p;
				break;
			}
	on_event(t->r, ev);
}

static void
usage(void)
{
	fprintf(stderr, "usage: bench-prefix [--model FILE|DIR] [--backend cpu|cuda] [--threads N]\n"
			"                    [--kv-dtype f32|bf16|turboquant_k8v4] [--requests N] [--prefix P] [--doc D]\n"
			"                    [--max-tokens G] [--max-num-seqs S] [--max-batched T] [--unrelated K]\n"
			"                    [--max-model-len L]\n");
	exit(2);
}

typedef struct
{
	g4_options	o;
	int			requests;
	int			prefix;
	int			doc;
	int			max_tokens;
	int			unrelated;
} bench_cfg;

/* One prompt: BOS, then the shared prefix (when `shared`), then tokens
 * particular to `variant`. */
static void
make_prompt(int32_t *ids, const bench_cfg *c, int shared, int variant)
{
	int			n = c->prefix + c->doc;
	int			i;

	ids[0] = 2;
	for (i = 1; i < n; i++)
	{
		int			own = !shared || i >= c->prefix;
		uint32_t	x = (uint32_t) i * 2654435761u + (own ? (uint32_t) (variant + 1) * 40503u : 0u);

		ids[i] = 1000 + (int32_t) ((x >> 7) % 5000u);
	}
}

static int
run_once(const bench_cfg *c, int caching, char **text, size_t *len, g4_stats *st, double *seconds)
{
	g4_options	o = c->o;
	g4_engine  *e;
	g4_err		err;
	bench_run	r;
	text_ctx	t;
	int			total = c->requests * (1 + c->unrelated);
	int			n = c->prefix + c->doc;
	int32_t    *ids = malloc((size_t) n * sizeof(int32_t));
	double		t0;
	int			i,
				k;

	if (!ids)
		return 1;
	o.enable_prefix_caching = caching;
	if (g4_open(&o, &e, &err) != G4_OK)
	{
		fprintf(stderr, "bench-prefix: %s\n", err.msg);
		free(ids);
		return 1;
	}
	memset(&r, 0, sizeof(r));
	r.n = total;
	r.ids = calloc((size_t) total, sizeof(uint64_t));
	if (!r.ids)
		return 1;
	t.r = &r;
	t.text = text;
	t.len = len;
	t0 = now();
	for (i = 0, k = 0; i < c->requests; i++)
	{
		int			j;

		for (j = 0; j <= c->unrelated; j++, k++)
		{
			g4_request	req;

			make_prompt(ids, c, j == 0, j == 0 ? i : 100000 + k);
			memset(&req, 0, sizeof(req));
			g4_sampling_default(&req.sampling);
			req.input_kind = G4_INPUT_TOKENS;
			req.tokens = ids;
			req.n_tokens = n;
			req.max_tokens = c->max_tokens;
			if (g4_submit(e, &req, &r.ids[k], &err) != G4_OK)
			{
				fprintf(stderr, "bench-prefix: %s\n", err.msg);
				g4_close(e);
				return 1;
			}
		}
	}
	while (r.done < total)
		if (g4_step(e, on_text, &t, &err) < 0)
		{
			fprintf(stderr, "bench-prefix: %s\n", err.msg);
			break;
		}
	*seconds = now() - t0;
	g4_stats_get(e, st);
	g4_close(e);
	free(r.ids);
	free(ids);
	return r.failed > 0 || r.done < total;
}

int
main(int argc, char **argv)
{
	bench_cfg	c;
	int			total;
	int			caching;
	char	  **text[2];
	size_t	   *len[2];
	int			i;

	setvbuf(stdout, NULL, _IOLBF, 0);
	memset(&c, 0, sizeof(c));
	g4_options_default(&c.o);
	c.o.model_path = "build/models/gemma-3-270m-q4_k_m.gguf";
	c.o.max_model_len = 4096;
	c.o.max_num_seqs = 8;
	c.o.max_num_batched_tokens = 2048;
	c.requests = 32;
	c.prefix = 1000;
	c.doc = 100;
	c.max_tokens = 4;
	for (i = 1; i < argc; i++)
	{
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

#define ARG(name) (strcmp(a, name) == 0 && v && (i++, 1))
		if (ARG("--model"))
			c.o.model_path = v;
		else if (ARG("--backend"))
			c.o.backend = strcmp(v, "cuda") == 0 ? G4_BACKEND_CUDA : G4_BACKEND_CPU;
		else if (ARG("--threads"))
			c.o.threads = atoi(v);
		else if (ARG("--kv-dtype"))
			c.o.kv_dtype = strcmp(v, "f32") == 0 ? G4_KV_F32 : strcmp(v, "bf16") == 0 ? G4_KV_BF16 :
				G4_KV_TURBOQUANT_K8V4;
		else if (ARG("--requests"))
			c.requests = atoi(v);
		else if (ARG("--prefix"))
			c.prefix = atoi(v);
		else if (ARG("--doc"))
			c.doc = atoi(v);
		else if (ARG("--max-tokens"))
			c.max_tokens = atoi(v);
		else if (ARG("--max-num-seqs"))
			c.o.max_num_seqs = atoi(v);
		else if (ARG("--max-batched"))
			c.o.max_num_batched_tokens = atoi(v);
		else if (ARG("--unrelated"))
			c.unrelated = atoi(v);
		else if (ARG("--max-model-len"))
			c.o.max_model_len = atoi(v);
		else
			usage();
#undef ARG
	}
	if (c.requests < 1 || c.prefix < 1 || c.doc < 1 || c.max_tokens < 1 || c.unrelated < 0)
		usage();
	total = c.requests * (1 + c.unrelated);
	printf("%d requests sharing a %d-token prefix, %d tokens of their own, %d generated, %d unrelated after each; "
		   "max_num_seqs %d, max_num_batched_tokens %d\n",
		   c.requests, c.prefix, c.doc, c.max_tokens, c.unrelated, c.o.max_num_seqs, c.o.max_num_batched_tokens);
	for (caching = 0; caching < 2; caching++)
	{
		g4_stats	st;
		double		sec;
		/* ideally every shared request after the first prefills only from
		 * the block where its own tokens start */
		int			shared_blocks_tokens = c.prefix / 16 * 16;
		double		ideal = (double) total * (double) (c.prefix + c.doc) -
			(double) (c.requests - 1) * (double) shared_blocks_tokens;
		double		prefills;

		text[caching] = calloc((size_t) total, sizeof(char *));
		len[caching] = calloc((size_t) total, sizeof(size_t));
		if (!text[caching] || !len[caching])
			return 1;
		if (run_once(&c, caching, text[caching], len[caching], &st, &sec) != 0)
			return 1;
		/* every whole-block prefill of the prefix beyond the first one */
		prefills = 1.0 + ((double) st.tokens_prefilled - ideal) / (double) (shared_blocks_tokens > 0 ? shared_blocks_tokens : 1);
		printf("cache %-3s %s on %s, KV %s: prefilled %llu tokens, %llu from the cache (%.1f%% of %llu prompt "
			   "tokens); the prefix's blocks prefilled %.2f times = %.2f per 64 requests; %.2f s, %.3f requests/s\n",
			   caching ? "on:" : "off:", st.backend, st.device, st.kv_dtype, (unsigned long long) st.tokens_prefilled,
			   (unsigned long long) st.prefix_hit_tokens,
			   100.0 * (double) st.prefix_hit_tokens / ((double) total * (double) (c.prefix + c.doc)),
			   (unsigned long long) total * (unsigned long long) (c.prefix + c.doc), prefills,
			   prefills * 64.0 / (double) c.requests, sec, (double) total / sec);
		if (caching)
			for (i = 0; i < st.n_groups; i++)
				printf("          %s group: %lld blocks cached of %lld, %llu of %llu blocks looked up found\n",
					   st.groups[i].name, (long long) st.groups[i].blocks_cached,
					   (long long) st.groups[i].blocks_total, (unsigned long long) st.groups[i].prefix_hits,
					   (unsigned long long) st.groups[i].prefix_lookups);
	}
	{
		int			same = 0;

		for (i = 0; i < total; i++)
			same += len[0][i] == len[1][i] && (len[0][i] == 0 || memcmp(text[0][i], text[1][i], len[0][i]) == 0);
		printf("greedy outputs identical with the cache on and off: %d of %d\n", same, total);
	}
	return 0;
}
