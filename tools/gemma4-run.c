/*
 * gemma4-run — run the engine without PostgreSQL.
 *
 *   gemma4-run --model DIR|FILE.gguf --prompt TEXT [--max-tokens N]
 *              [--temperature T] [--top-p P] [--top-k K] [--seed S]
 *              [--chat] [--system TEXT] [--think] [--stream]
 *              [--kv-dtype f32|bf16|turboquant_k8v4] [--backend auto|cpu|cuda]
 *              [--threads N] [--max-model-len N] [--batch N]
 *              [--bench] [--bench-prompt-tokens N]
 *              [--image FILE] [--audio FILE] [--max-soft-tokens N]
 *              [--draft DIR] [--spec-tokens K] [--spec-max-batch N]
 *              [--bench-accept A]
 *   gemma4-run --model ... --perplexity FILE [--ctx N] [--stride S] [--windows N]
 *              [--kl-base FILE] [--kv-dtype ...]
 *   gemma4-run --model ... --needle FILE [--needle-tokens N] [--depths D,D,...]
 *
 * Prints the generated text (as it decodes with --stream).  --bench prints
 * prefill and decode throughput; --batch N runs N copies of the request at
 * once (continuous batching), --bench-prompt-tokens N replaces the prompt by
 * N synthetic tokens.  --image and --audio (each repeatable) add media in
 * the order given: they take the <|image|> / <|audio|> placeholders of the
 * prompt in turn, or go before the prompt text when it has none; --bench
 * then also prints media decoding and embedder times.  --draft DIR drafts K tokens per step (default 4) with
 * that MTP assistant and verifies them (speculative decoding; none while
 * more than N sequences decode); --bench-accept A (benchmarks only) accepts
 * exactly A drafts per step whatever the target says, so throughput can be
 * measured at a chosen acceptance with random weights.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "quality.h"

typedef struct
{
	int			stream;
	int			batch;
	int			show_reasoning;
	uint64_t   *ids;
	char	  **text;			/* accumulated output per request */
	size_t	   *text_len;
	int			done;
	int			failed;
	int			prompt_tokens;
	int			completion_tokens;
	double		first_token_at;	/* the first sequence's first sampled token */
	double		all_started_at; /* every sequence has sampled a token */
	double	   *first_at;		/* per request */
	int			n_started;
	int			generated_before_all; /* tokens sampled before all_started_at */
	int			in_reasoning;
} run_ctx;

static double
now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static int
index_of(run_ctx *r, uint64_t id)
{
	int			i;

	for (i = 0; i < r->batch; i++)
		if (r->ids[i] == id)
			return i;
	return -1;
}

static void
on_event(void *arg, const g4_event *ev)
{
	run_ctx    *r = arg;
	int			i = index_of(r, ev->seq_id);

	if (i < 0)
		return;
	switch (ev->kind)
	{
		case G4_EV_TEXT:
			if (r->stream && i == 0)
			{
				if (ev->channel == G4_CHANNEL_REASONING && !r->in_reasoning)
				{
					fputs("[thinking] ", stdout);
					r->in_reasoning = 1;
				}
				else if (ev->channel == G4_CHANNEL_CONTENT && r->in_reasoning)
				{
					fputs("\n[answer] ", stdout);
					r->in_reasoning = 0;
				}
				fwrite(ev->text, 1, ev->text_len, stdout);
				fflush(stdout);
			}
			if (ev->channel == G4_CHANNEL_CONTENT || r->show_reasoning)
			{
				char	   *p = realloc(r->text[i], r->text_len[i] + ev->text_len + 1);

				if (p)
				{
					memcpy(p + r->text_len[i], ev->text, ev->text_len);
					r->text_len[i] += ev->text_len;
					p[r->text_len[i]] = '\0';
					r->text[i] = p;
				}
			}
			break;
		case G4_EV_FINISH:
			r->done++;
			r->prompt_tokens += ev->prompt_tokens;
			r->completion_tokens += ev->completion_tokens;
			break;
		case G4_EV_ERROR:
			r->done++;
			r->failed++;
			fprintf(stderr, "request %d failed: %s\n", i + 1, ev->error_msg);
			break;
	}
}

/* When each request samples its first token (decoded to text or not). */
static void
note_first_tokens(g4_engine *e, run_ctx *r)
{
	g4_seq_info info[256];
	int			n = g4_seqs_get(e, info, 256);
	double		t = now();
	int			i,
				k;
	g4_stats	st;

	for (i = 0; i < r->batch; i++)
	{
		int			started = 1;	/* gone from the engine: it finished */

		if (r->first_at[i] != 0)
			continue;
		for (k = 0; k < n; k++)
			if (info[k].seq_id == r->ids[i])
				started = info[k].generated_tokens > 0;
		if (started)
		{
			r->first_at[i] = t;
			r->n_started++;
			if (r->first_token_at == 0)
				r->first_token_at = t;
		}
	}
	if (r->n_started == r->batch)
	{
		g4_stats_get(e, &st);
		r->all_started_at = t;
		r->generated_before_all = (int) st.tokens_generated;
	}
}

static void
usage(void)
{
	fprintf(stderr,
			"usage: gemma4-run --model DIR|FILE.gguf --prompt TEXT [--max-tokens N] [--temperature T]\n"
			"                  [--top-p P] [--top-k K] [--seed S] [--chat] [--system TEXT] [--think]\n"
			"                  [--stream] [--kv-dtype f32|bf16|turboquant_k8v4] [--backend auto|cpu|cuda]\n"
			"                  [--threads N] [--max-model-len N] [--batch N] [--bench]\n"
			"                  [--bench-prompt-tokens N] [--image FILE] [--audio FILE] [--max-soft-tokens N]\n"
			"                  [--draft DIR] [--spec-tokens K]\n"
			"                  [--spec-max-batch N] [--bench-accept A]\n"
			"       gemma4-run --model ... --perplexity FILE [--ctx N] [--stride S] [--windows N]\n"
			"                  [--kl-base FILE] [--kv-dtype ...] [--backend ...]\n"
			"       gemma4-run --model ... --needle FILE [--needle-tokens N] [--depths D,D,...]\n");
	exit(2);
}

/* Submit copy `copy` of the request; a synthetic prompt's second token
 * differs between copies (the first copy keeps it). */
static int
submit_copy(g4_engine *e, g4_request *req, int32_t *synthetic, int copy, uint64_t *id, g4_err *err)
{
	if (synthetic && req->n_tokens > 1)
		synthetic[1] = 1000 + (2919 + copy) % 5000;
	return g4_submit(e, req, id, err);
}

/* Read a whole media file; exits on failure. */
static void
read_media(const char *path, int kind, g4_media *m)
{
	FILE	   *f = fopen(path, "rb");
	long		n;
	uint8_t    *buf;

	if (!f || fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0)
	{
		fprintf(stderr, "gemma4-run: cannot read %s\n", path);
		exit(1);
	}
	buf = malloc((size_t) n + 1);
	if (!buf || fread(buf, 1, (size_t) n, f) != (size_t) n)
	{
		fprintf(stderr, "gemma4-run: cannot read %s\n", path);
		exit(1);
	}
	fclose(f);
	m->kind = kind;
	m->data = buf;
	m->len = (size_t) n;
}

int
main(int argc, char **argv)
{
	g4_options	o;
	g4_request	req;
	g4_engine  *e;
	g4_err		err;
	run_ctx		r;
	const char *prompt = NULL;
	const char *system = NULL;
	int			chat = 0;
	int			bench = 0;
	int			bench_prompt = 0;
	int32_t    *synthetic = NULL;
	g4_quality_opts quality;
	g4_message	msgs[2];
	g4_media   *media = NULL;
	int			n_media = 0;
	double		t0,
				t1;
	size_t		workspace_at_open;
	int			i;

	g4_options_default(&o);
	o.max_num_seqs = 1;
	o.max_model_len = 8192;		/* a command-line run needs no 256k window */
	memset(&req, 0, sizeof(req));
	g4_sampling_default(&req.sampling);
	req.max_tokens = 128;
	memset(&r, 0, sizeof(r));
	r.batch = 1;
	memset(&quality, 0, sizeof(quality));
	quality.ctx = 2048;
	for (i = 1; i < argc; i++)
	{
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

#define ARG(name) (strcmp(a, name) == 0 && v && (i++, 1))
		if (ARG("--model"))
			o.model_path = v;
		else if (ARG("--prompt"))
			prompt = v;
		else if (ARG("--system"))
			system = v;
		else if (ARG("--max-tokens"))
			req.max_tokens = atoi(v);
		else if (ARG("--temperature"))
			req.sampling.temperature = (float) atof(v);
		else if (ARG("--top-p"))
			req.sampling.top_p = (float) atof(v);
		else if (ARG("--top-k"))
			req.sampling.top_k = atoi(v);
		else if (ARG("--seed"))
		{
			req.sampling.seed = strtoull(v, NULL, 10);
			req.sampling.has_seed = 1;
		}
		else if (ARG("--kv-dtype"))
		{
			if (strcmp(v, "f32") == 0)
				o.kv_dtype = G4_KV_F32;
			else if (strcmp(v, "bf16") == 0)
				o.kv_dtype = G4_KV_BF16;
			else if (strcmp(v, "turboquant_k8v4") == 0)
				o.kv_dtype = G4_KV_TURBOQUANT_K8V4;
			else
				usage();
		}
		else if (ARG("--backend"))
			o.backend = strcmp(v, "cpu") == 0 ? G4_BACKEND_CPU : strcmp(v, "cuda") == 0 ? G4_BACKEND_CUDA :
				G4_BACKEND_AUTO;
		else if (ARG("--threads"))
			o.threads = atoi(v);
		else if (ARG("--max-model-len"))
			o.max_model_len = atoi(v);
		else if (ARG("--batch"))
			r.batch = atoi(v);
		else if (ARG("--bench-prompt-tokens"))
			bench_prompt = atoi(v);
		else if (ARG("--max-soft-tokens"))
			req.max_soft_tokens = atoi(v);
		else if ((strcmp(a, "--image") == 0 || strcmp(a, "--audio") == 0) && v)
		{
			media = realloc(media, (size_t) (n_media + 1) * sizeof(g4_media));
			if (!media)
				return 1;
			read_media(v, strcmp(a, "--image") == 0 ? G4_MEDIA_IMAGE : G4_MEDIA_AUDIO, &media[n_media++]);
			i++;
		}
		else if (ARG("--draft"))
			o.draft_model_path = v;
		else if (ARG("--spec-tokens"))
			o.num_speculative_tokens = atoi(v);
		else if (ARG("--spec-max-batch"))
			o.spec_max_batch = atoi(v);
		else if (ARG("--bench-accept"))
			o.bench_force_accept = atoi(v);
		else if (ARG("--perplexity"))
			quality.text_path = v;
		else if (ARG("--ctx"))
			quality.ctx = atoi(v);
		else if (ARG("--stride"))
			quality.stride = atoi(v);
		else if (ARG("--windows"))
			quality.max_windows = atoi(v);
		else if (ARG("--kl-base"))
			quality.kl_base = v;
		else if (ARG("--needle"))
		{
			quality.text_path = v;
			if (quality.needle_tokens == 0)
				quality.needle_tokens = 16384;
		}
		else if (ARG("--needle-tokens"))
			quality.needle_tokens = atoi(v);
		else if (ARG("--depths"))
			quality.depths = v;
		else if (strcmp(a, "--chat") == 0)
			chat = 1;
		else if (strcmp(a, "--think") == 0)
			req.enable_thinking = 1;
		else if (strcmp(a, "--stream") == 0)
			r.stream = 1;
		else if (strcmp(a, "--bench") == 0)
			bench = 1;
		else
			usage();
#undef ARG
	}
	if (!o.model_path || (!prompt && bench_prompt <= 0 && !quality.text_path) || r.batch < 1)
		usage();
	if (quality.text_path)
	{
		/* scoring: one sequence, the whole window in view */
		int			len = quality.needle_tokens > 0 ? quality.needle_tokens + 1024 : quality.ctx;

		if (o.max_model_len < len)
			o.max_model_len = len;
		quality.record_base = o.kv_dtype == G4_KV_F32;
	}
	/* scoring uses one slot, but computes logits in slices as tall as
	 * max_num_seqs rows: a few rows at once read the output embedding once */
	o.max_num_seqs = quality.text_path ? 16 : r.batch;
	o.verbose = 1;

	t0 = now();
	if (g4_open(&o, &e, &err) != G4_OK)
	{
		fprintf(stderr, "gemma4-run: %s\n", err.msg);
		return 1;
	}
	{
		g4_model_info mi;
		g4_stats	st;

		g4_model_info_get(e, &mi);
		g4_stats_get(e, &st);
		workspace_at_open = st.workspace_bytes;
		fprintf(stderr, "model %s (%s), %d layers, %.2f B parameters, %s backend on %s, KV %s, loaded in %.2fs\n",
				mi.architecture, mi.family, mi.n_layers, (double) mi.n_params / 1e9, st.backend, st.device,
				st.kv_dtype, now() - t0);
	}

	if (quality.text_path)
	{
		int			rc = quality.needle_tokens > 0 ? g4_run_needle(e, &quality) : g4_run_perplexity(e, &quality, NULL);

		g4_close(e);
		return rc;
	}
	if (bench_prompt > 0)
	{
		/* synthetic prompt: BOS then ordinary ids; each copy of a batch
		 * differs from its second token (submit_copy), so that prefill is
		 * timed, not the prefix cache */
		synthetic = malloc((size_t) bench_prompt * sizeof(int32_t));
		if (!synthetic)
			return 1;
		for (i = 0; i < bench_prompt; i++)
			synthetic[i] = i == 0 ? 2 : 1000 + (i * 7919) % 5000;
		req.input_kind = G4_INPUT_TOKENS;
		req.tokens = synthetic;
		req.n_tokens = bench_prompt;
	}
	else if (chat)
	{
		int			n = 0;

		memset(msgs, 0, sizeof(msgs));
		if (system)
		{
			msgs[n].role = G4_ROLE_SYSTEM;
			msgs[n].content = system;
			msgs[n].parts = NULL;
			n++;
		}
		msgs[n].role = G4_ROLE_USER;
		msgs[n].content = prompt;
		msgs[n].parts = NULL;
		n++;
		req.input_kind = G4_INPUT_CHAT;
		req.messages = msgs;
		req.n_messages = n;
	}
	else
	{
		req.input_kind = G4_INPUT_TEXT;
		req.prompt = prompt;
	}

	req.media = media;
	req.n_media = n_media;
	r.ids = calloc((size_t) r.batch, sizeof(uint64_t));
	r.first_at = calloc((size_t) r.batch, sizeof(double));
	r.text = calloc((size_t) r.batch, sizeof(char *));
	r.text_len = calloc((size_t) r.batch, sizeof(size_t));
	if (!r.ids || !r.text || !r.text_len || !r.first_at)
		return 1;
	t0 = now();
	for (i = 0; i < r.batch; i++)
		if (submit_copy(e, &req, synthetic, i, &r.ids[i], &err) != G4_OK)
		{
			fprintf(stderr, "gemma4-run: %s\n", err.msg);
			g4_close(e);
			return 1;
		}
	while (r.done < r.batch)
	{
		int			rc = g4_step(e, on_event, &r, &err);

		if (rc < 0)
		{
			fprintf(stderr, "gemma4-run: %s\n", err.msg);
			break;
		}
		if (r.n_started < r.batch)
			note_first_tokens(e, &r);
		if (rc == 0)
			break;
	}
	t1 = now();
	if (r.stream)
		fputc('\n', stdout);
	else
		for (i = 0; i < r.batch; i++)
		{
			if (r.batch > 1)
				printf("--- %d ---\n", i + 1);
			printf("%s\n", r.text[i] ? r.text[i] : "");
		}
	if (bench)
	{
		g4_stats	st;
		double		ttft = r.first_token_at > 0 ? r.first_token_at - t0 : t1 - t0;
		double		prefill = r.all_started_at > 0 ? r.all_started_at - t0 : t1 - t0;
		double		decode = t1 - (r.all_started_at > 0 ? r.all_started_at : t1);
		int			decoded = r.completion_tokens - r.generated_before_all;

		g4_stats_get(e, &st);
		/* prefill: until every prompt is in (its last chunk sampled a
		 * token); decode: from then on, every sequence generating */
		printf("prefill: %d tokens in %.3f s = %.1f tokens/s (time to first token %.3f s; %llu from the prefix cache)\n",
			   r.prompt_tokens, prefill, prefill > 0 ? r.prompt_tokens / prefill : 0.0, ttft,
			   (unsigned long long) st.prefix_hit_tokens);
		printf("decode:  %d tokens in %.3f s = %.1f tokens/s (%d sequence%s, %llu steps, mean batch %.1f)\n",
			   decoded, decode, decode > 0 ? decoded / decode : 0.0, r.batch, r.batch > 1 ? "s" : "",
			   (unsigned long long) st.steps, st.steps ? (double) st.batch_seqs_sum / (double) st.steps : 0.0);
		if (n_media > 0)
			printf("media:   %llu images, %.2f s of audio; decoding and preprocessing %.3f s, embedders %.3f s "
				   "(included in the time to first token)\n", (unsigned long long) st.images, st.audio_seconds,
				   st.media_decode_seconds, st.media_embed_seconds);
		if (st.spec_k > 0)
		{
			int			j;

			printf("drafts:  k %d, %llu drafted, %llu accepted (%.1f%%), %.2f tokens per verify step, "
				   "accepted by position:", st.spec_k, (unsigned long long) st.spec_drafted,
				   (unsigned long long) st.spec_accepted,
				   st.spec_drafted ? 100.0 * (double) st.spec_accepted / (double) st.spec_drafted : 0.0,
				   st.spec_verify_steps ? 1.0 + (double) st.spec_accepted / (double) st.spec_verify_steps : 0.0);
			for (j = 0; j < st.spec_k; j++)
				printf(" %.2f", st.spec_pos_drafted[j] ?
					   (double) st.spec_pos_accepted[j] / (double) st.spec_pos_drafted[j] : 0.0);
			printf("%s\n", o.bench_force_accept >= 0 ? " (forced)" : "");
			printf("assistant: %llu passes over %llu rows in %.3f s = %.3f ms per pass, %.1f us per draft token; "
				   "%.1f%% of the run\n", (unsigned long long) st.spec_draft_steps,
				   (unsigned long long) st.spec_draft_tokens, st.spec_draft_seconds,
				   st.spec_draft_steps ? 1e3 * st.spec_draft_seconds / (double) st.spec_draft_steps : 0.0,
				   st.spec_draft_tokens ? 1e6 * st.spec_draft_seconds / (double) st.spec_draft_tokens : 0.0,
				   t1 > t0 ? 100.0 * st.spec_draft_seconds / (t1 - t0) : 0.0);
		}
		/* the backend's buffers are sized at open (dry steps): a workspace
		 * larger now grew while serving */
		printf("memory:  weights %.1f MiB, KV pool %.1f MiB (%s), workspace %.1f MiB (%.1f MiB at open)\n",
			   (double) st.weight_bytes / 1048576.0, (double) st.kv_bytes_total / 1048576.0, st.kv_dtype,
			   (double) st.workspace_bytes / 1048576.0, (double) workspace_at_open / 1048576.0);
	}
	for (i = 0; i < r.batch; i++)
		free(r.text[i]);
	free(r.text);
	free(r.text_len);
	free(r.ids);
	free(r.first_at);
	free(synthetic);
	for (i = 0; i < n_media; i++)
		free((void *) media[i].data);
	free(media);
	g4_close(e);
	return r.failed ? 1 : 0;
}
