/*
 * engine.c — the engine's public API: opening a model on a backend with its
 * tokenizer and KV pool, submitting and cancelling requests, running steps,
 * and reporting statistics.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dry_steps.h"
#include "engine_internal.h"
#include "gguf.h"
#include "util.h"

#define G4_VERSION "0.1.0"

/* Device memory kept free beside weights, workspace, pool and the
 * backend's buffers the dry steps grew (dry_steps.h): library handles, and
 * growth past the dry steps' shapes. */
#define DEVICE_RESERVE ((size_t) 512 << 20)

const char *
g4_version(void)
{
	return G4_VERSION;
}

void
g4_options_default(g4_options *o)
{
	memset(o, 0, sizeof(*o));
	o->backend = G4_BACKEND_AUTO;
	o->max_model_len = 262144;
	o->gpu_memory_utilization = 0.95;
	o->kv_dtype = G4_KV_TURBOQUANT_K8V4;
	o->max_num_seqs = 16;
	o->max_num_batched_tokens = 16384;
	o->num_speculative_tokens = 4;
	o->mask_variant = G4_MASK_A;
	o->enable_prefix_caching = 1;
	o->spec_max_batch = G4_SPEC_MAX_BATCH_DEFAULT;
	o->bench_force_accept = -1;
}

void
g4_sampling_default(g4_sampling *s)
{
	memset(s, 0, sizeof(*s));
	s->temperature = 0.0f;
	s->top_p = 1.0f;
	s->repetition_penalty = 1.0f;
}

static const char *
kv_dtype_name(int d)
{
	switch (d)
	{
		case G4_KV_F32:
			return "f32";
		case G4_KV_BF16:
			return "bf16";
		case G4_KV_TURBOQUANT_K8V4:
			return "turboquant_k8v4";
	}
	return "?";
}

static int
open_backend(const g4_options *o, g4_backend **be, g4_err *err)
{
	switch (o->backend)
	{
		case G4_BACKEND_CPU:
			return g4_backend_cpu_create(o->threads, be, err);
		case G4_BACKEND_CUDA:
			return g4_backend_cuda_create(0, be, err);
		default:
			if (g4_backend_cuda_available())
				return g4_backend_cuda_create(0, be, err);
			return g4_backend_cpu_create(o->threads, be, err);
	}
}

static int
load_tokenizer(g4_engine *e, g4_err *err)
{
	const char *path = e->opts.model_path;

	if (e->model->gguf)
		return g4_tok_load_gguf(e->model->gguf, &e->tok, err);
	{
		char	   *tj = g4_path_join(path, "tokenizer.json");
		char	   *tc = g4_path_join(path, "tokenizer_config.json");
		int			rc;

		if (!tj || !tc)
			rc = g4_fail(err, G4_ERR_NOMEM, "out of memory");
		else if (!g4_is_file(tj))
			rc = g4_fail(err, G4_ERR_IO, "%s: missing tokenizer.json", path);
		else
			rc = g4_tok_load_json(tj, g4_is_file(tc) ? tc : NULL, &e->tok, err);
		free(tj);
		free(tc);
		return rc;
	}
}

static void
add_eos(g4_engine *e, int32_t id)
{
	int			i;

	if (id < 0 || e->n_eos >= (int) G4_ARRAY_LEN(e->eos))
		return;
	for (i = 0; i < e->n_eos; i++)
		if (e->eos[i] == id)
			return;
	e->eos[e->n_eos++] = id;
}

/* KV budget: what the memory-utilisation target leaves after everything
 * already resident (weights, workspace, other processes). */
static size_t
kv_budget(g4_engine *e)
{
	char		name[128];
	size_t		free_b = 0,
				total = 0;

	e->be->ops->device_info(e->be, name, sizeof(name), &free_b, &total);
	snprintf(e->device_name, sizeof(e->device_name), "%s", name);
	e->stats.device_bytes_total = total;
	if (total == 0)
	{
		/* host memory: what was asked, else room for every slot at full
		 * length, bounded by a quarter of the free memory */
		size_t		want = e->opts.kv_pool_bytes;

		if (want == 0)
		{
			size_t		per_token = 0;
			int			g;

			for (g = 0; g < G4_KVG_COUNT; g++)
				per_token += g4_kv_group_token_bytes(e->model, e->opts.kv_dtype, g);
			want = per_token * (size_t) e->max_model_len * (size_t) e->max_seqs + ((size_t) 64 << 20);
			if (free_b > 0 && want > free_b / 4)
				want = free_b / 4;
		}
		return want;
	}
	{
		double		target = (double) total * e->opts.gpu_memory_utilization;
		double		used = (double) (total - free_b);
		double		left = target - used - (double) DEVICE_RESERVE;

		return left > 0 ? (size_t) left : 0;
	}
}

/* The step's metadata and sampling arrays, sized for the largest step
 * (g4_close frees them). */
static int
step_arrays_alloc(g4_engine *e, g4_err *err)
{
	size_t		T = (size_t) e->max_batched;
	const g4_model_config *c = &e->model->cfg;
	int			g;

	e->st_token = g4_malloc(T * sizeof(int32_t));
	e->st_pos = g4_malloc(T * sizeof(int32_t));
	e->st_slot = g4_malloc(T * sizeof(int32_t));
	for (g = 0; g < G4_KVG_COUNT; g++)
	{
		e->st_lo[g] = g4_malloc(T * sizeof(int32_t));
		e->st_hi[g] = g4_malloc(T * sizeof(int32_t));
	}
	e->st_logit_rows = g4_malloc((size_t) e->max_logits * sizeof(int32_t));
	e->st_logit_seq = g4_malloc((size_t) e->max_logits * sizeof(g4_seq *));
	e->st_ids = g4_malloc((size_t) e->max_logits * sizeof(int32_t));
	e->st_samp = g4_malloc((size_t) e->max_logits * sizeof(g4_row_sampling));
	e->logits_host = g4_malloc((size_t) e->max_logits * (size_t) c->vocab_size * sizeof(float));
	e->slot_used = g4_calloc((size_t) e->max_seqs, 1);
	if (!e->st_token || !e->st_pos || !e->st_slot || !e->st_lo[0] || !e->st_lo[1] || !e->st_hi[0] ||
		!e->st_hi[1] || !e->st_logit_rows || !e->st_logit_seq || !e->st_ids || !e->st_samp || !e->logits_host ||
		!e->slot_used)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	return G4_OK;
}

int
g4_open(const g4_options *opts, g4_engine **out, g4_err *err)
{
	g4_engine  *e;
	const g4_model_config *c;
	int			rc;
	int			g;

	*out = NULL;
	if (!opts->model_path || !opts->model_path[0])
		return g4_fail(err, G4_ERR_INVALID, "no model path given");
	if (opts->max_num_seqs < 1 || opts->max_num_batched_tokens < 1)
		return g4_fail(err, G4_ERR_INVALID, "max_num_seqs and max_num_batched_tokens must be positive");
	if (opts->kv_dtype < G4_KV_F32 || opts->kv_dtype > G4_KV_TURBOQUANT_K8V4)
		return g4_fail(err, G4_ERR_INVALID, "unknown KV cache dtype %d", opts->kv_dtype);
	if (!(opts->gpu_memory_utilization > 0.0 && opts->gpu_memory_utilization <= 1.0))
		return g4_fail(err, G4_ERR_INVALID, "gpu_memory_utilization must be in (0, 1]");
	e = g4_calloc(1, sizeof(g4_engine));
	if (!e)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	e->opts = *opts;
	e->progress.fn = opts->progress;
	e->progress.ctx = opts->progress_ctx;
	e->channel_open = e->channel_close = -1;
	g4_rng_seed(&e->seeder, (uint64_t) (g4_now() * 1e9));
	g4_prefix_key_init(e->prefix_key);

	rc = open_backend(opts, &e->be, err);
	if (rc == G4_OK)
		rc = g4_model_load(opts->model_path, e->be, &e->model, opts->verbose, err);
	if (rc == G4_OK)
		rc = load_tokenizer(e, err);
	if (rc != G4_OK)
	{
		g4_close(e);
		return rc;
	}
	c = &e->model->cfg;
	e->model->progress = &e->progress;
	if (g4_tok_vocab_size(e->tok) > c->vocab_size)
	{
		rc = g4_fail(err, G4_ERR_FORMAT, "the tokenizer has %d tokens but the model's embedding only %d rows",
					 g4_tok_vocab_size(e->tok), c->vocab_size);
		g4_close(e);
		return rc;
	}
	/* the window is the smaller of the setting and what the model supports
	 * (a 32k model under the 262144 default runs at 32k) */
	e->max_model_len = opts->max_model_len > 0 ? G4_MIN(opts->max_model_len, c->max_position) : c->max_position;
	e->max_seqs = opts->max_num_seqs;
	e->max_batched = opts->max_num_batched_tokens;
	e->max_logits = e->max_seqs;

	/* stop ids: the model's eos list plus the chat format's end of turn */
	for (g = 0; g < c->n_eos; g++)
		add_eos(e, c->eos_ids[g]);
	add_eos(e, g4_tok_eos(e->tok));
	add_eos(e, g4_tok_id(e->tok, "<turn|>"));
	add_eos(e, g4_tok_id(e->tok, "<end_of_turn>"));
	e->channel_open = g4_tok_id(e->tok, "<|channel>");
	e->channel_close = g4_tok_id(e->tok, "<channel|>");
	e->chat_ok = g4_chat_init(e->tok, c->family == G4_FAMILY_GEMMA3 ? G4_CHAT_GEMMA3 : G4_CHAT_GEMMA4,
							  &e->chat, NULL) == G4_OK;

	rc = g4_spec_open(e, err);	/* may raise max_logits, extends the kept window */
	if (rc == G4_OK)
		rc = g4_workspace_init(e->model, e->max_batched, e->max_logits, &e->ws, err);
	if (rc == G4_OK)
		rc = step_arrays_alloc(e, err);
	if (rc == G4_OK)
		rc = g4_dry_steps(e, err);	/* the backend's buffers, before the pool */
	if (rc == G4_OK)
		rc = g4_kvpool_init(&e->kv, e->model, opts->kv_dtype, kv_budget(e), e->max_seqs, e->max_model_len,
							e->max_batched, opts->enable_prefix_caching != 0, err);
	if (rc != G4_OK)
	{
		g4_close(e);
		return rc;
	}
	snprintf(e->kv_dtype_name, sizeof(e->kv_dtype_name), "%s", kv_dtype_name(opts->kv_dtype));
	e->stats.max_num_seqs = e->max_seqs;
	e->stats.max_model_len = e->max_model_len;
	*out = e;
	return G4_OK;
}

void
g4_close(g4_engine *e)
{
	int			i;

	if (!e)
		return;
	for (i = 0; i < e->n_seqs; i++)
		g4_seq_free(e->seqs[i]);
	free(e->seqs);
	g4_spec_close(e);
	if (e->model)
	{
		if (e->kv.be)
			g4_kvpool_free(&e->kv);
		g4_workspace_free(e->model, &e->ws);
		g4_model_free(e->model);
	}
	if (e->tok)
		g4_tok_free(e->tok);
	if (e->be)
		e->be->ops->destroy(e->be);
	free(e->st_token);
	free(e->st_pos);
	free(e->st_slot);
	for (i = 0; i < G4_KVG_COUNT; i++)
	{
		free(e->st_lo[i]);
		free(e->st_hi[i]);
	}
	free(e->st_logit_rows);
	free(e->st_logit_seq);
	free(e->st_ids);
	free(e->st_samp);
	free(e->st_embed_index);
	free(e->st_embed_rows);
	free(e->logits_host);
	free(e->slot_used);
	g4_sampler_scratch_free(&e->scratch);
	free(e);
}

void
g4_model_info_get(const g4_engine *e, g4_model_info *info)
{
	const g4_model_config *c = &e->model->cfg;

	info->architecture = c->architecture;
	info->family = c->family == G4_FAMILY_GEMMA3 ? "gemma3" : "gemma4";
	info->vocab_size = c->vocab_size;
	info->n_layers = c->n_layers;
	info->hidden_size = c->hidden_size;
	info->max_model_len = e->max_model_len;
	info->n_params = e->model->n_params;
}

int
g4_tokenize(g4_engine *e, const char *text, size_t len, int add_bos, int32_t **ids, int *n_ids, g4_err *err)
{
	int			cap = 0;

	*ids = NULL;
	*n_ids = 0;
	return g4_tok_encode(e->tok, text, len, add_bos, ids, n_ids, &cap, err);
}

int
g4_detokenize(g4_engine *e, const int32_t *ids, int n_ids, char **text, size_t *len, g4_err *err)
{
	int			i;
	int			vocab = g4_tok_vocab_size(e->tok);

	for (i = 0; i < n_ids; i++)
		if (ids[i] < 0 || ids[i] >= vocab)
			return g4_fail(err, G4_ERR_INVALID, "token id %d at position %d is outside the vocabulary (0..%d)",
						   ids[i], i + 1, vocab - 1);
	return g4_tok_decode(e->tok, ids, n_ids, 1, text, len, err);
}

static int
add_seq(g4_engine *e, g4_seq *s, uint64_t *seq_id, g4_err *err)
{
	if (e->n_seqs == e->cap_seqs)
	{
		int			cap = e->cap_seqs ? e->cap_seqs * 2 : 64;
		g4_seq	  **p = realloc(e->seqs, (size_t) cap * sizeof(g4_seq *));

		if (!p)
			return g4_fail(err, G4_ERR_NOMEM, "out of memory");
		e->seqs = p;
		e->cap_seqs = cap;
	}
	s->id = ++e->next_id;
	e->seqs[e->n_seqs++] = s;
	*seq_id = s->id;
	return G4_OK;
}

/* A request prepared off the engine thread: its sequence, not yet queued. */
struct g4_prepared
{
	g4_seq	   *seq;
};

int
g4_prepare(g4_engine *e, const g4_request *req, const g4_cancel_flag *cancel, g4_prepared **out,
		   g4_err *err)
{
	g4_prepared *p = g4_calloc(1, sizeof(g4_prepared));

	*out = NULL;
	if (!p)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	p->seq = g4_seq_prepare(e, req, cancel, err);
	if (!p->seq)
	{
		free(p);
		return err->code;
	}
	*out = p;
	return G4_OK;
}

int
g4_submit_prepared(g4_engine *e, g4_prepared *p, uint64_t *seq_id, g4_err *err)
{
	g4_seq	   *s = p->seq;
	int			rc;

	free(p);
	g4_seq_admit(e, s);
	rc = g4_seq_embed_media(e, s, err);
	if (rc == G4_OK)
		rc = add_seq(e, s, seq_id, err);
	if (rc != G4_OK)
		g4_seq_free(s);
	return rc;
}

void
g4_prepared_free(g4_prepared *p)
{
	if (!p)
		return;
	g4_seq_free(p->seq);
	free(p);
}

int
g4_submit(g4_engine *e, const g4_request *req, uint64_t *seq_id, g4_err *err)
{
	g4_prepared *p;
	int			rc = g4_prepare(e, req, NULL, &p, err);

	if (rc != G4_OK)
		return rc;
	return g4_submit_prepared(e, p, seq_id, err);
}

int
g4_submit_embeds(g4_engine *e, const g4_request *req, int n_embeds, const int32_t *embed_pos,
				 const float *embed_rows, const int32_t *mm_block, uint64_t *seq_id, g4_err *err)
{
	g4_seq	   *s;
	size_t		H = (size_t) e->model->cfg.hidden_size;
	int			i;
	int			rc;

	if (req->input_kind != G4_INPUT_TOKENS)
		return g4_fail(err, G4_ERR_INVALID, "precomputed embeddings need a token-id prompt");
	s = g4_seq_new(e, req, err);
	if (!s)
		return err->code;
	for (i = 0; i < n_embeds; i++)
		if (embed_pos[i] < 0 || embed_pos[i] >= s->n_prompt || (i > 0 && embed_pos[i] <= embed_pos[i - 1]))
		{
			g4_seq_free(s);
			return g4_fail(err, G4_ERR_INVALID,
						   "embedding row %d targets position %d, outside the prompt or not after the previous row's",
						   i, embed_pos[i]);
		}
	s->n_embeds = n_embeds;
	if (n_embeds > 0)
	{
		s->embed_pos = g4_malloc((size_t) n_embeds * sizeof(int32_t));
		s->embed_rows = g4_malloc((size_t) n_embeds * H * sizeof(float));
		if (!s->embed_pos || !s->embed_rows)
		{
			g4_seq_free(s);
			return g4_fail(err, G4_ERR_NOMEM, "out of memory");
		}
		memcpy(s->embed_pos, embed_pos, (size_t) n_embeds * sizeof(int32_t));
		memcpy(s->embed_rows, embed_rows, (size_t) n_embeds * H * sizeof(float));
	}
	if (mm_block)
	{
		s->mm_block = g4_malloc((size_t) s->n_prompt * sizeof(int32_t));
		if (!s->mm_block)
		{
			g4_seq_free(s);
			return g4_fail(err, G4_ERR_NOMEM, "out of memory");
		}
		memcpy(s->mm_block, mm_block, (size_t) s->n_prompt * sizeof(int32_t));
		if (g4_seq_check_blocks(e, s, err) != G4_OK)
		{
			g4_seq_free(s);
			return err->code;
		}
	}
	rc = add_seq(e, s, seq_id, err);
	if (rc != G4_OK)
		g4_seq_free(s);
	return rc;
}

static void
remove_seq(g4_engine *e, g4_seq *s)
{
	int			i;

	for (i = 0; i < e->n_seqs; i++)
		if (e->seqs[i] == s)
		{
			memmove(&e->seqs[i], &e->seqs[i + 1], (size_t) (e->n_seqs - i - 1) * sizeof(g4_seq *));
			e->n_seqs--;
			break;
		}
	g4_seq_free(s);
}

void
g4_cancel(g4_engine *e, uint64_t seq_id, g4_event_fn fn, void *ctx)
{
	int			i;

	for (i = 0; i < e->n_seqs; i++)
		if (e->seqs[i]->id == seq_id)
		{
			g4_seq	   *s = e->seqs[i];

			g4_seq_finish(e, s, G4_FINISH_CANCELLED, fn, ctx);
			remove_seq(e, s);
			return;
		}
}

int
g4_has_work(const g4_engine *e)
{
	return e->n_seqs > 0;
}

/* Sequences whose events said they are done leave the engine here. */
typedef struct
{
	g4_event_fn fn;
	void	   *ctx;
	uint64_t   *done;
	int			n_done;
	int			cap_done;
} step_events;

static void
step_event(void *arg, const g4_event *ev)
{
	step_events *se = arg;

	if ((ev->kind == G4_EV_FINISH || ev->kind == G4_EV_ERROR) && se->n_done < se->cap_done)
		se->done[se->n_done++] = ev->seq_id;
	se->fn(se->ctx, ev);
}

static void
fail_all(g4_engine *e, const g4_err *why, g4_event_fn fn, void *ctx)
{
	while (e->n_seqs > 0)
	{
		g4_seq	   *s = e->seqs[0];

		g4_seq_fail(e, s, why->code, why->msg, fn, ctx);
		remove_seq(e, s);
	}
}

/* Rows without penalties are sampled on the device, so only token ids cross
 * to the host: g4_sample's choice, from the same draw of each sequence's
 * generator (taken here, in row order, as g4_sample would take it). */
static int
sample_on_device(g4_engine *e, int n_logits)
{
	int			i;

	if (!e->be->ops->sample || e->logits_hook)
		return 0;
	for (i = 0; i < n_logits; i++)
	{
		const g4_seq *s = e->st_logit_seq[i];

		/* sampled drafts are verified against the whole distribution */
		if (g4_sampling_needs_hist(&s->samp) || (s->n_draft > 0 && s->samp.temperature > 0.0f))
			return 0;
	}
	for (i = 0; i < n_logits; i++)
	{
		g4_seq	   *s = e->st_logit_seq[i];
		g4_row_sampling *r = &e->st_samp[i];

		r->temperature = s->samp.temperature;
		r->top_p = s->samp.top_p;
		r->min_p = s->samp.min_p;
		r->top_k = s->samp.top_k;
		r->u = s->samp.temperature > 0.0f ? g4_rng_uniform(&s->rng) : 0.0;
	}
	return 1;
}

int
g4_step(g4_engine *e, g4_event_fn fn, void *ctx, g4_err *err)
{
	g4_schedule sc;
	g4_step_meta meta;
	g4_embed_rows extra;
	step_events se;
	int			V = e->model->cfg.vocab_size;
	int			device_ids = 0;
	int			i,
				k;
	int			rc;

	if (e->n_seqs == 0)
		return 0;
	g4_progress_start(&e->progress);
	memset(&sc, 0, sizeof(sc));
	se.fn = fn;
	se.ctx = ctx;
	se.n_done = 0;
	se.cap_done = e->n_seqs;
	se.done = g4_malloc((size_t) se.cap_done * sizeof(uint64_t));
	if (!se.done)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");

	rc = g4_schedule_step(e, &sc, step_event, &se, err);
	if (rc == G4_OK && sc.n_items > 0)
		rc = g4_schedule_meta(e, &sc, &meta, &extra, err);
	if (rc == G4_OK && sc.n_items > 0)
		rc = g4_model_forward(e->model, &e->ws, &meta, extra.n ? &extra : NULL, err);
	device_ids = rc == G4_OK && sc.n_items > 0 && meta.n_logits > 0 && sample_on_device(e, meta.n_logits);
	if (device_ids)
		rc = e->be->ops->sample(e->be, e->ws.logits, meta.n_logits, V, e->model->cfg.suppress_ids,
								e->model->cfg.n_suppress, e->st_samp, e->st_ids);
	else if (rc == G4_OK && sc.n_items > 0 && meta.n_logits > 0)
		rc = e->be->ops->download(e->be, e->logits_host, e->ws.logits,
								  (size_t) meta.n_logits * (size_t) V * sizeof(float));
	if (rc == G4_OK && sc.n_items > 0)
		rc = e->be->ops->sync(e->be, err);
	if (rc != G4_OK)
	{
		/* an engine-wide failure: every live request gets the error */
		if (err->msg[0] == '\0')
			g4_fail(err, rc, "%s", g4_status_name(rc));
		fail_all(e, err, fn, ctx);
		g4_schedule_free(&sc);
		free(se.done);
		/* a backend still failed once the step is over stays so (the CUDA
		 * backend's failures last until it is made anew): a device fault,
		 * so that the caller starts a fresh engine rather than fail every
		 * later step */
		{
			g4_err		after;

			if (e->be->ops->sync(e->be, &after) != G4_OK)
				rc = G4_ERR_BACKEND;
		}
		return rc;
	}

	if (sc.n_items > 0)
	{
		const g4_model_config *c = &e->model->cfg;
		int			row = 0;		/* logits row */

		e->stats.steps++;
		e->stats.batch_seqs_sum += (uint64_t) sc.n_items;
		e->stats.batch_seqs_max = G4_MAX(e->stats.batch_seqs_max, (uint64_t) sc.n_items);
		e->stats.batch_tokens_max = G4_MAX(e->stats.batch_tokens_max, (uint64_t) sc.n_tokens);
		for (i = 0; i < sc.n_items; i++)
		{
			g4_seq	   *s = sc.items[i].seq;

			if (sc.items[i].n_draft > 0)
				continue;		/* verified below, then rolled back */
			if (s->n_computed < s->n_prompt)
				e->stats.tokens_prefilled += (uint64_t) G4_MIN(sc.items[i].count, s->n_prompt - s->n_computed);
			s->n_computed += sc.items[i].count;
			/* prefix caching: completed prompt blocks become findable (before
			 * the window trim below frees the oldest sliding ones) */
			g4_prefix_register(e, s, sc.items[i].start, s->n_computed);
			g4_seq_trim_window(e, s);
		}
		for (k = 0; k < sc.n_items; k++)
		{
			const g4_sched_item *it = &sc.items[k];
			g4_seq	   *s = it->seq;
			float	   *row_logits = e->logits_host + (size_t) row * (size_t) V;
			int32_t		id;

			if (!it->wants_logits)
				continue;
			if (it->n_draft > 0)
			{
				g4_spec_verify(e, it, row, device_ids, step_event, &se);
				row += 1 + it->n_draft;
				continue;
			}
			i = row++;
			if (device_ids)
				id = e->st_ids[i];
			else
			{
				if (e->logits_hook)
					e->logits_hook(e->hook_ctx, s->id, row_logits, V);
				id = g4_sample(row_logits, V, &s->samp, s->has_hist ? &s->hist : NULL, c->suppress_ids,
							   c->n_suppress, &s->rng, &e->scratch);
			}
			s->spec_row = g4_seq_emit_token(e, s, id, step_event, &se) ? -1 : i;
		}
	}
	for (i = 0; i < se.n_done; i++)
	{
		for (k = 0; k < e->n_seqs; k++)
			if (e->seqs[k]->id == se.done[i])
			{
				remove_seq(e, e->seqs[k]);
				break;
			}
	}
	/* the drafts the next step verifies, for the sequences still here */
	if (sc.n_items > 0 && meta.n_logits > 0)
	{
		rc = g4_spec_draft(e, err);
		if (rc != G4_OK)
		{
			fail_all(e, err, fn, ctx);
			g4_schedule_free(&sc);
			free(se.done);
			return rc;
		}
	}
	g4_schedule_free(&sc);
	free(se.done);
	return e->n_seqs;
}

size_t
g4_backend_held_bytes(g4_backend *be)
{
	g4_memory_use u[G4_MEMORY_USES_MAX];
	int			n = be->ops->held ? be->ops->held(be, u, G4_MEMORY_USES_MAX) : 0;
	size_t		sum = 0;

	for (int i = 0; i < n; i++)
		sum += u[i].bytes;
	return sum;
}

static void
memory_use(g4_memory_use *out, int max, int *n, const char *what, size_t bytes)
{
	if (bytes > 0 && *n < max)
	{
		out[*n].what = what;
		out[*n].bytes = bytes;
		(*n)++;
	}
}

int
g4_memory_get(const g4_engine *e, g4_memory_use *out, int max)
{
	const g4_kvpool *kv = &e->kv;
	int			n = 0;

	memory_use(out, max, &n, "weights", e->model->weight_bytes);
	memory_use(out, max, &n, "assistant weights", e->draft.m ? e->draft.m->weight_bytes : 0);
	memory_use(out, max, &n, "KV pool, sliding layers",
			   (size_t) kv->n_blocks[G4_KVG_SLIDING] * kv->block_bytes[G4_KVG_SLIDING]);
	memory_use(out, max, &n, "KV pool, full layers", (size_t) kv->n_blocks[G4_KVG_FULL] * kv->block_bytes[G4_KVG_FULL]);
	memory_use(out, max, &n, "KV block tables", kv->table_bytes_total);
	memory_use(out, max, &n, "activations", e->ws.bytes);
	memory_use(out, max, &n, "assistant activations", e->draft.buffer_bytes);
	if (e->be->ops->held && n < max)
	{
		g4_memory_use u[G4_MEMORY_USES_MAX];
		int			k = e->be->ops->held(e->be, u, G4_MEMORY_USES_MAX);

		for (int i = 0; i < k; i++)
			memory_use(out, max, &n, u[i].what, u[i].bytes);
	}
	return n;
}

void
g4_stats_get(const g4_engine *e, g4_stats *st)
{
	int			g;
	int			i;

	*st = e->stats;
	st->backend = e->be->ops->name;
	st->device = e->device_name;
	st->kv_dtype = e->kv_dtype_name;
	st->n_groups = 0;
	for (g = 0; g < G4_KVG_COUNT; g++)
	{
		g4_kv_group_stats *gs;

		if (e->kv.desc.n_layers[g] == 0)
			continue;
		gs = &st->groups[st->n_groups++];
		gs->name = g == G4_KVG_FULL ? "full" : "sliding";
		gs->layers = e->kv.desc.n_layers[g];
		gs->block_tokens = G4_KV_BLOCK_TOKENS;
		gs->blocks_total = e->kv.n_blocks[g];
		gs->blocks_used = e->kv.n_blocks[g] - e->kv.n_free[g];
		gs->block_bytes = e->kv.block_bytes[g];
		/* prefix caching */
		gs->blocks_cached = e->kv.cache[g].n_cached;
		gs->prefix_lookups = e->kv.cache[g].lookups;
		gs->prefix_hits = e->kv.cache[g].hits;
	}
	st->kv_bytes_total = e->kv.bytes_total;
	/* the draft model's weights and buffers with the target's */
	st->weight_bytes = e->model->weight_bytes + (e->draft.m ? e->draft.m->weight_bytes : 0);
	st->workspace_bytes = e->ws.bytes + e->draft.buffer_bytes + g4_backend_held_bytes(e->be);
	st->live_seqs = 0;
	st->waiting_seqs = 0;
	for (i = 0; i < e->n_seqs; i++)
	{
		if (e->seqs[i]->slot >= 0)
			st->live_seqs++;
		else
			st->waiting_seqs++;
	}
	st->fit_full_context = G4_MIN(g4_kvpool_fit(&e->kv, e->max_model_len),
								  (int64_t) (e->max_seqs - st->live_seqs));
}

int
g4_seqs_get(const g4_engine *e, g4_seq_info *out, int max)
{
	int			i;
	int			n = 0;

	for (i = 0; i < e->n_seqs && n < max; i++)
	{
		const g4_seq *s = e->seqs[i];
		g4_seq_info *o = &out[n++];

		o->seq_id = s->id;
		o->user_tag = s->user_tag;
		o->state = s->slot < 0 ? G4_SEQ_WAITING : (s->n_computed < s->n_prompt ? G4_SEQ_PREFILL : G4_SEQ_DECODE);
		o->prompt_tokens = s->n_prompt;
		o->prefilled_tokens = G4_MIN(s->n_computed, s->n_prompt);
		o->generated_tokens = s->n_generated;
		o->kv_blocks = s->slot < 0 ? 0 :
			g4_kvpool_slot_blocks(&e->kv, s->slot, G4_KVG_SLIDING, s->n_tok + 1) +
			g4_kvpool_slot_blocks(&e->kv, s->slot, G4_KVG_FULL, s->n_tok + 1);
		o->submitted_at = s->t_submit;
		o->first_token_at = s->t_first;
		o->last_token_at = s->t_last;
		o->media_tokens = s->n_embeds;
	}
	return n;
}

void
g4_set_hooks(g4_engine *e, void (*logits_fn) (void *ctx, uint64_t seq_id, const float *logits, int vocab),
			 void (*token_fn) (void *ctx, uint64_t seq_id, int32_t token), void *ctx)
{
	e->logits_hook = logits_fn;
	e->token_hook = token_fn;
	e->hook_ctx = ctx;
}

const g4_model *
g4_engine_model(const g4_engine *e)
{
	return e->model;
}

const g4_tokenizer *
g4_engine_tokenizer(const g4_engine *e)
{
	return e->tok;
}
