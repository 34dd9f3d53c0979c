/*
 * seq.c — one request's life in the engine: its prompt (raw text, chat
 * messages or token ids), validation against the window and the pool, its
 * sampling state, and the text it produces (streaming detokenisation, the
 * reasoning channel, stop strings, end conditions).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "media.h"
#include "media_prompt.h"
#include "util.h"

int
g4_seq_append(g4_seq *s, int32_t id)
{
	if (s->n_tok == s->cap_tok)
	{
		int			cap = s->cap_tok ? s->cap_tok * 2 : 64;
		int32_t    *p = realloc(s->tok, (size_t) cap * sizeof(int32_t));

		if (!p)
			return G4_ERR_NOMEM;
		s->tok = p;
		s->cap_tok = cap;
	}
	s->tok[s->n_tok++] = id;
	return G4_OK;
}

void
g4_seq_free(g4_seq *s)
{
	int			i;

	if (!s)
		return;
	free(s->tok);
	free(s->mm_block);
	free(s->embed_pos);
	free(s->embed_rows);
	free(s->block_hash);
	for (i = 0; i < s->n_media_in; i++)
		g4_media_input_free(&s->media_in[i]);
	free(s->media_in);
	g4_detok_free(&s->detok);	/* a stream cut short may hold a byte run */
	g4_hist_free(&s->hist);
	g4_buf_free(&s->piece);
	g4_buf_free(&s->held);
	for (i = 0; i < s->n_stop; i++)
		free(s->stop[i]);
	free(s->stop);
	free(s);
}

static int
tokenize_prompt(const g4_engine *e, g4_seq *s, const g4_request *req, const g4_cancel_flag *cancel, g4_err *err)
{
	int			vocab = e->model->cfg.vocab_size;
	int			i;

	switch (req->input_kind)
	{
		case G4_INPUT_TEXT:
			if (!req->prompt || req->prompt[0] == '\0')
				return g4_fail(err, G4_ERR_INVALID, "the prompt is empty");
			{
				/* the whole prompt is data unless control tokens are allowed
				 * (media expansions placed in it stay control tokens) */
				g4_tok_span *plain = g4_malloc(sizeof(g4_tok_span));
				int			n_plain = 0,
							cap_plain = 1,
							rc;

				if (!plain)
					return g4_fail(err, G4_ERR_NOMEM, "out of memory");
				plain[0].off = 0;
				plain[0].len = strlen(req->prompt);
				if (req->allow_control_tokens != G4_TEXT_CONTROL)
					n_plain = 1;
				if (req->allow_control_tokens == G4_TEXT_DATA_BUT_MEDIA &&
					g4_chat_spans_except_media(e->tok, &e->chat, req->prompt, &plain, &n_plain, &cap_plain) != 0)
				{
					free(plain);
					return g4_fail(err, G4_ERR_NOMEM, "out of memory");
				}
				rc = g4_tok_encode_plain(e->tok, req->prompt, strlen(req->prompt), 1, plain, n_plain, cancel,
										 &s->tok, &s->n_tok, &s->cap_tok, err);
				free(plain);
				return rc;
			}
		case G4_INPUT_CHAT:
			if (!e->chat_ok)
				return g4_fail(err, G4_ERR_UNSUPPORTED, "this model's tokenizer lacks the chat format's tokens");
			if (req->n_messages <= 0 || !req->messages)
				return g4_fail(err, G4_ERR_INVALID, "a chat request needs at least one message");
			for (i = 0; i < req->n_messages; i++)
			{
				const g4_message *m = &req->messages[i];

				if (m->role < G4_ROLE_SYSTEM || m->role > G4_ROLE_MODEL)
					return g4_fail(err, G4_ERR_INVALID, "message %d has an unknown role", i + 1);
				if (!m->parts && !m->content)
					return g4_fail(err, G4_ERR_INVALID, "message %d has no content", i + 1);
				if (m->role == G4_ROLE_SYSTEM && i > 0)
					return g4_fail(err, G4_ERR_INVALID, "a system message may only come first (message %d)", i + 1);
			}
			return g4_chat_encode(e->tok, &e->chat, req->messages, req->n_messages, req->enable_thinking, 1,
								  req->allow_control_tokens, cancel, &s->tok, &s->n_tok, &s->cap_tok, err);
		case G4_INPUT_TOKENS:
			if (req->n_tokens <= 0 || !req->tokens)
				return g4_fail(err, G4_ERR_INVALID, "the prompt has no tokens");
			for (i = 0; i < req->n_tokens; i++)
			{
				if (req->tokens[i] < 0 || req->tokens[i] >= vocab)
					return g4_fail(err, G4_ERR_INVALID, "token id %d at position %d is outside the vocabulary (0..%d)",
								   req->tokens[i], i, vocab - 1);
				if (g4_seq_append(s, req->tokens[i]) != G4_OK)
					return g4_fail(err, G4_ERR_NOMEM, "out of memory");
			}
			return G4_OK;
	}
	return g4_fail(err, G4_ERR_INVALID, "unknown input kind %d", req->input_kind);
}

/* Decode and preprocess the request's media, place them in the prompt,
 * tokenise it, and find the soft-token positions.  No backend work. */
static int
build_media_prompt(const g4_engine *e, g4_seq *s, const g4_request *req, const g4_cancel_flag *cancel,
				   g4_err *err)
{
	g4_media_limits lim;
	g4_media_prompt placed;
	int			n = req->n_media;
	int			number[2] = {0, 0};
	long long	soft = 0;
	int			i,
				rc;

	if (n < 0 || !req->media)
		return g4_fail(err, G4_ERR_INVALID, "n_media is %d but the media list is %s", n, req->media ? "set" : "NULL");
	if ((rc = g4_media_limits_from_request(req, &lim, err)) != G4_OK)
		return rc;
	for (i = 0; i < n; i++)
	{
		int			kind = req->media[i].kind;

		if (kind != G4_MEDIA_IMAGE && kind != G4_MEDIA_AUDIO)
			return g4_fail(err, G4_ERR_INVALID, "media item %d has an unknown kind %d", i + 1, kind);
		number[kind]++;
		if (kind == G4_MEDIA_IMAGE && (!e->model->vision || !e->chat_ok || e->chat.image_soft < 0))
			return g4_fail(err, G4_ERR_UNSUPPORTED, "image %d: this model takes no image input", number[kind]);
		if (kind == G4_MEDIA_AUDIO && (!e->model->audio_proj || !e->chat_ok || e->chat.audio_soft < 0))
			return g4_fail(err, G4_ERR_UNSUPPORTED, "audio %d: this model takes no audio input", number[kind]);
	}
	s->media_in = g4_calloc((size_t) n, sizeof(g4_media_input));
	if (!s->media_in)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	number[0] = number[1] = 0;
	/* cancel is polled inside each item (a row of pixels, a block of
	 * samples at a time), before its first row too */
	for (i = 0; i < n; i++)
	{
		int			kind = req->media[i].kind;

		if ((rc = g4_media_prepare(&req->media[i], ++number[kind], &lim, cancel, &s->media_in[i], err)) != G4_OK)
			return rc;
		s->n_media_in = i + 1;
		/* each item holds its soft tokens' inputs until the prompt is
		 * checked: past the window, refuse before decoding the rest */
		soft += s->media_in[i].n_tokens;
		if (soft >= e->max_model_len)
			return g4_fail(err, G4_ERR_TOO_LONG,
						   "the first %d media items take %lld soft tokens, more than the context window "
						   "(max_model_len) of %d holds", i + 1, soft, e->max_model_len);
	}
	if ((rc = g4_media_place(e->tok, &e->chat, req, s->media_in, n, &placed, err)) != G4_OK)
		return rc;
	/* the expansions placement wrote into the text are control tokens even
	 * where the text around them is data */
	if (!req->allow_control_tokens)
		placed.req.allow_control_tokens = G4_TEXT_DATA_BUT_MEDIA;
	rc = tokenize_prompt(e, s, &placed.req, cancel, err);
	g4_media_prompt_free(&placed);
	if (rc != G4_OK)
		return rc;
	return g4_media_locate(&e->chat, s->tok, s->n_tok, s->media_in, n, &s->embed_pos, &s->n_embeds, &s->mm_block,
						   err);
}

static int
build_prompt(const g4_engine *e, g4_seq *s, const g4_request *req, const g4_cancel_flag *cancel, g4_err *err)
{
	if (req->n_media != 0)
		return build_media_prompt(e, s, req, cancel, err);
	return tokenize_prompt(e, s, req, cancel, err);
}

int
g4_seq_check_blocks(const g4_engine *e, const g4_seq *s, g4_err *err)
{
	int			run = 0,
				i;

	for (i = 0; s->mm_block && i < s->n_prompt; i++)
	{
		run = (s->mm_block[i] >= 0 && i > 0 && s->mm_block[i - 1] == s->mm_block[i]) ? run + 1 : (s->mm_block[i] >= 0);
		if (run > e->max_batched)
			return g4_fail(err, G4_ERR_INVALID,
						   "an image of %d soft tokens exceeds max_num_batched_tokens (%d): lower max_soft_tokens "
						   "or raise max_num_batched_tokens", run, e->max_batched);
	}
	return G4_OK;
}

int
g4_seq_embed_media(g4_engine *e, g4_seq *s, g4_err *err)
{
	size_t		H = (size_t) e->model->cfg.hidden_size;
	double		t0 = g4_now();
	int			number[2] = {0, 0};
	int			i,
				rc;

	if (s->n_media_in == 0)
		return G4_OK;
	g4_progress_start(&e->progress);
	s->embed_rows = g4_malloc((size_t) G4_MAX(s->n_embeds, 1) * H * sizeof(float));
	if (!s->embed_rows)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory for %d soft-token rows", s->n_embeds);
	for (i = 0; i < s->n_media_in; i++)
	{
		g4_media_input *in = &s->media_in[i];

		/* numbered among the items of its kind, as g4_media_prepare does */
		number[in->kind]++;
		if ((rc = g4_model_embed_media(e->model, in, s->embed_rows + (size_t) in->row_offset * H, err)) != G4_OK)
			return g4_fail_ctx(err, "%s %d", in->kind == G4_MEDIA_IMAGE ? "image" : "audio", number[in->kind]);
		e->stats.images += in->kind == G4_MEDIA_IMAGE;
		e->stats.audio_seconds += in->seconds;
		e->stats.media_decode_seconds += in->decode_seconds;
		g4_media_input_free(in);
		g4_progress_tick(&e->progress);
	}
	free(s->media_in);
	s->media_in = NULL;
	s->n_media_in = 0;
	e->stats.media_embed_seconds += g4_now() - t0;
	return G4_OK;
}


/*
 * The part of a new sequence that needs no scheduler state: validation,
 * prompt building (tokenisation, chat format) and the per-sequence buffers.
 * It only reads what g4_open set up, so it may run on any thread, beside
 * g4_step (g4_prepare).
 */
g4_seq *
g4_seq_prepare(const g4_engine *e, const g4_request *req, const g4_cancel_flag *cancel, g4_err *err)
{
	g4_seq	   *s = g4_calloc(1, sizeof(g4_seq));
	int			window = e->max_model_len;
	int			i;

	if (!s)
	{
		g4_fail(err, G4_ERR_NOMEM, "out of memory");
		return NULL;
	}
	s->slot = -1;
	s->state = G4_SEQ_WAITING;
	s->samp = req->sampling;
	/* speculative decoding: allowed unless the request says no; the
	 * running acceptance starts optimistic (full k) */
	s->spec_off = req->disable_speculative != 0;
	s->spec_row = -1;
	s->spec_rate = (float) G4_SPEC_MAX_TOKENS;
	if (g4_sampling_validate(&s->samp, err) != G4_OK || build_prompt(e, s, req, cancel, err) != G4_OK)
	{
		g4_seq_free(s);
		return NULL;
	}
	s->n_prompt = s->n_tok;
	if (g4_seq_check_blocks(e, s, err) != G4_OK)
	{
		g4_seq_free(s);
		return NULL;
	}
	if (s->n_prompt >= window)
	{
		g4_fail(err, G4_ERR_TOO_LONG,
				"the prompt has %d tokens but the context window (max_model_len) is %d, leaving no room to generate",
				s->n_prompt, window);
		g4_seq_free(s);
		return NULL;
	}
	if (req->max_tokens < 0)
	{
		g4_fail(err, G4_ERR_INVALID, "max_tokens must be positive (got %d)", req->max_tokens);
		g4_seq_free(s);
		return NULL;
	}
	s->max_tokens = req->max_tokens > 0 ? req->max_tokens : window - s->n_prompt;
	if (req->max_tokens == 0 && req->max_tokens_cap > 0)
		s->max_tokens = G4_MIN(s->max_tokens, req->max_tokens_cap);
	/* compared as a difference: the sum may pass INT_MAX */
	if (s->max_tokens > window - s->n_prompt)
	{
		g4_fail(err, G4_ERR_TOO_LONG,
				"the context window (max_model_len) is %d tokens, but %lld were requested (%d in the prompt, %d to "
				"generate)", window, (long long) s->n_prompt + s->max_tokens, s->n_prompt, s->max_tokens);
		g4_seq_free(s);
		return NULL;
	}
	{
		/* a request the pool could never hold, even alone, is refused now
		 * rather than left waiting forever */
		int			need = G4_DIV_UP(s->n_prompt + s->max_tokens, G4_KV_BLOCK_TOKENS);

		if (e->kv.desc.n_layers[G4_KVG_FULL] > 0 && need > e->kv.n_blocks[G4_KVG_FULL])
		{
			g4_fail(err, G4_ERR_TOO_LONG,
					"%d tokens need %d KV blocks but the pool has %d (%d tokens); lower max_tokens or raise the KV pool size",
					s->n_prompt + s->max_tokens, need, e->kv.n_blocks[G4_KVG_FULL],
					e->kv.n_blocks[G4_KVG_FULL] * G4_KV_BLOCK_TOKENS);
			g4_seq_free(s);
			return NULL;
		}
	}
	if (req->n_stop > 0)
	{
		s->stop = g4_calloc((size_t) req->n_stop, sizeof(char *));
		if (!s->stop)
		{
			g4_fail(err, G4_ERR_NOMEM, "out of memory");
			g4_seq_free(s);
			return NULL;
		}
		for (i = 0; i < req->n_stop; i++)
		{
			if (!req->stop[i] || req->stop[i][0] == '\0')
			{
				g4_fail(err, G4_ERR_INVALID, "stop string %d is empty", i + 1);
				g4_seq_free(s);
				return NULL;
			}
			s->stop[i] = g4_strdup(req->stop[i]);
			s->n_stop = i + 1;
			if (!s->stop[i])
			{
				g4_fail(err, G4_ERR_NOMEM, "out of memory");
				g4_seq_free(s);
				return NULL;
			}
		}
	}
	if (g4_sampling_needs_hist(&s->samp))
	{
		if (g4_hist_init(&s->hist, e->model->cfg.vocab_size, s->tok, s->n_prompt) != G4_OK)
		{
			g4_fail(err, G4_ERR_NOMEM, "out of memory");
			g4_seq_free(s);
			return NULL;
		}
		s->has_hist = 1;
	}
	if (s->samp.has_seed)
		g4_rng_seed(&s->rng, s->samp.seed);
	g4_detok_init(&s->detok, e->tok, 1);
	s->channel = G4_CHANNEL_CONTENT;
	s->user_tag = req->user_tag;
	s->t_submit = g4_now();
	return s;
}

/* Engine thread: what a prepared sequence takes from the engine's state. */
void
g4_seq_admit(g4_engine *e, g4_seq *s)
{
	if (!s->samp.has_seed)
		g4_rng_seed(&s->rng, g4_rng_next(&e->seeder));
}

g4_seq *
g4_seq_new(g4_engine *e, const g4_request *req, g4_err *err)
{
	g4_seq	   *s = g4_seq_prepare(e, req, NULL, err);

	if (s)
		g4_seq_admit(e, s);
	return s;
}

static void
emit_text(g4_seq *s, const char *text, size_t len, int channel, g4_event_fn fn, void *ctx)
{
	g4_event	ev;

	if (len == 0)
		return;
	memset(&ev, 0, sizeof(ev));
	ev.kind = G4_EV_TEXT;
	ev.seq_id = s->id;
	ev.text = text;
	ev.text_len = len;
	ev.channel = channel;
	fn(ctx, &ev);
}

/* Length of the longest suffix of text that is a proper prefix of a stop
 * string: that much must be held back. */
static size_t
stop_holdback(const g4_seq *s, const char *text, size_t len)
{
	size_t		best = 0;
	int			i;

	for (i = 0; i < s->n_stop; i++)
	{
		size_t		sl = strlen(s->stop[i]);
		size_t		k;

		for (k = G4_MIN(sl - 1, len); k > best; k--)
			if (memcmp(text + len - k, s->stop[i], k) == 0)
			{
				best = k;
				break;
			}
	}
	return best;
}

/* Add content text; returns 1 when a stop string matched. */
static int
add_content(g4_seq *s, const char *text, size_t len, g4_event_fn fn, void *ctx)
{
	size_t		hold;
	int			i;

	if (s->n_stop == 0)
	{
		emit_text(s, text, len, G4_CHANNEL_CONTENT, fn, ctx);
		return 0;
	}
	if (g4_buf_append(&s->held, text, len) != G4_OK)
		return 0;
	{
		const char *first = NULL;

		for (i = 0; i < s->n_stop; i++)
		{
			const char *m = s->held.len ? memmem(s->held.data, s->held.len, s->stop[i], strlen(s->stop[i])) : NULL;

			if (m && (!first || m < first))
				first = m;
		}
		if (first)
		{
			emit_text(s, s->held.data, (size_t) (first - s->held.data), G4_CHANNEL_CONTENT, fn, ctx);
			s->held.len = 0;
			s->matched_stop = 1;
			return 1;
		}
	}
	hold = stop_holdback(s, s->held.data, s->held.len);
	emit_text(s, s->held.data, s->held.len - hold, G4_CHANNEL_CONTENT, fn, ctx);
	memmove(s->held.data, s->held.data + s->held.len - hold, hold);
	s->held.len = hold;
	return 0;
}

/* Route decoded text to the current channel. Returns 1 on a stop match. */
static int
route_text(g4_seq *s, const char *text, size_t len, g4_event_fn fn, void *ctx)
{
	if (s->in_channel_header)
	{
		/* the channel's name runs to the end of its line ("thought\n") */
		const char *nl = memchr(text, '\n', len);

		if (!nl)
			return 0;
		s->in_channel_header = 0;
		len -= (size_t) (nl + 1 - text);
		text = nl + 1;
	}
	if (s->channel == G4_CHANNEL_REASONING)
	{
		emit_text(s, text, len, G4_CHANNEL_REASONING, fn, ctx);
		return 0;
	}
	return add_content(s, text, len, fn, ctx);
}

void
g4_seq_finish(g4_engine *e, g4_seq *s, int reason, g4_event_fn fn, void *ctx)
{
	g4_event	ev;

	if (reason != G4_FINISH_CANCELLED && !s->matched_stop)
	{
		/* flush what the detokeniser and the stop matcher still hold */
		s->piece.len = 0;
		g4_detok_finish(&s->detok, &s->piece);
		if (s->piece.len)
			route_text(s, s->piece.data, s->piece.len, fn, ctx);
		/* text held as a possible stop-string start that never completed */
		emit_text(s, s->held.data, s->held.len, G4_CHANNEL_CONTENT, fn, ctx);
		s->held.len = 0;
	}
	g4_release_slot(e, s);
	memset(&ev, 0, sizeof(ev));
	ev.kind = G4_EV_FINISH;
	ev.seq_id = s->id;
	ev.finish_reason = reason;
	ev.prompt_tokens = s->n_prompt;
	ev.completion_tokens = s->n_generated;
	e->stats.requests_finished++;
	fn(ctx, &ev);
}

void
g4_seq_fail(g4_engine *e, g4_seq *s, int code, const char *msg, g4_event_fn fn, void *ctx)
{
	g4_event	ev;

	/* a NaN came out of this sequence's computation: its blocks, which may
	 * hold NaN keys and values, serve no other prompt */
	if (code == G4_ERR_NUMERIC)
		g4_forget_slot(e, s);
	g4_release_slot(e, s);
	memset(&ev, 0, sizeof(ev));
	ev.kind = G4_EV_ERROR;
	ev.seq_id = s->id;
	ev.error_code = code;
	ev.error_msg = msg;
	e->stats.requests_failed++;
	fn(ctx, &ev);
}

int
g4_is_eos(const g4_engine *e, int32_t id)
{
	int			i;

	for (i = 0; i < e->n_eos; i++)
		if (e->eos[i] == id)
			return 1;
	return 0;
}

int
g4_seq_emit_token(g4_engine *e, g4_seq *s, int32_t id, g4_event_fn fn, void *ctx)
{
	double		now = g4_now();

	if (id == G4_SAMPLE_NAN)
	{
		char		msg[160];

		snprintf(msg, sizeof(msg),
				 "the model produced a non-finite value: NaN in the logits choosing output token %d",
				 s->n_generated + 1);
		g4_seq_fail(e, s, G4_ERR_NUMERIC, msg, fn, ctx);
		return 1;
	}
	if (e->token_hook)
		e->token_hook(e->hook_ctx, s->id, id);
	if (s->n_generated == 0)
		s->t_first = now;
	s->t_last = now;
	s->n_generated++;
	e->stats.tokens_generated++;
	if (s->has_hist)
		g4_hist_add_output(&s->hist, id);
	if (g4_seq_append(s, id) != G4_OK)
	{
		g4_seq_fail(e, s, G4_ERR_NOMEM, "out of memory storing a generated token", fn, ctx);
		return 1;
	}
	if (g4_is_eos(e, id))
	{
		g4_seq_finish(e, s, G4_FINISH_STOP, fn, ctx);
		return 1;
	}
	if (id == e->channel_open || id == e->channel_close)
	{
		/* a byte run the channel token ends is the channel's before it */
		s->piece.len = 0;
		if (g4_detok_finish(&s->detok, &s->piece) == G4_OK && s->piece.len &&
			route_text(s, s->piece.data, s->piece.len, fn, ctx))
		{
			g4_seq_finish(e, s, G4_FINISH_STOP, fn, ctx);
			return 1;
		}
	}
	if (id == e->channel_open)
	{
		s->channel = G4_CHANNEL_REASONING;
		s->in_channel_header = 1;
	}
	else if (id == e->channel_close)
	{
		s->channel = G4_CHANNEL_CONTENT;
		s->in_channel_header = 0;
	}
	else
	{
		s->piece.len = 0;
		if (g4_detok_push(&s->detok, id, &s->piece) == G4_OK && s->piece.len &&
			route_text(s, s->piece.data, s->piece.len, fn, ctx))
		{
			g4_seq_finish(e, s, G4_FINISH_STOP, fn, ctx);
			return 1;
		}
	}
	if (s->n_generated >= s->max_tokens || s->n_tok >= e->max_model_len)
	{
		g4_seq_finish(e, s, G4_FINISH_LENGTH, fn, ctx);
		return 1;
	}
	return 0;
}
