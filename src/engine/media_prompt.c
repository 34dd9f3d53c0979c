/*
 * media_prompt.c — where a request's media go in its prompt, and which
 * prompt positions take their soft-token rows.
 *
 * Placement (Gemma4UnifiedProcessor + the Gemma 4 chat template):
 *  - every "<|image|>" / "<|audio|>" in the prompt text or in a message's
 *    text, and every image / audio part of a message, takes the next media
 *    item of its kind (images and audio keep their own order, so separate
 *    image and audio lists place naturally); a text placeholder expands to
 *    begin + N soft tokens + end (the processor's replacement), a part is
 *    rendered by the chat format (an image part with its blank lines);
 *  - with no placeholder at all, the items become parts at the start of the
 *    last user message (chat), or expansions right after BOS (raw text);
 *  - placeholders and items must then be equally many.
 * After tokenisation each run of soft tokens is matched with the next item
 * of its kind (and must have its length); soft-token rows are laid out in
 * prompt order; image runs become bidirectional blocks, audio stays causal.
 */
#include <stdlib.h>
#include <string.h>

#include "media_prompt.h"
#include "util.h"

static const char *const placeholder[2] = {"<|image|>", "<|audio|>"};

static const char *
kind_name(int kind)
{
	return kind == G4_MEDIA_IMAGE ? "image" : "audio";
}

/* Next placeholder at or after p: its kind, or -1 when none. */
static int
next_placeholder(const char *p, const char **at)
{
	const char *a = strstr(p, placeholder[0]);
	const char *b = strstr(p, placeholder[1]);

	if (!a && !b)
		return -1;
	if (a && (!b || a < b))
	{
		*at = a;
		return G4_MEDIA_IMAGE;
	}
	*at = b;
	return G4_MEDIA_AUDIO;
}

static int
count_placeholders(const char *text)
{
	const char *at;
	int			n = 0,
				k;

	while (text && (k = next_placeholder(text, &at)) >= 0)
	{
		n++;
		text = at + strlen(placeholder[k]);
	}
	return n;
}

/* The next item of `kind` at or after cursor[kind], or -1. */
static int
next_of_kind(const g4_media_input *in, int n_in, int kind, int *cursor)
{
	while (cursor[kind] < n_in && in[cursor[kind]].kind != kind)
		cursor[kind]++;
	return cursor[kind] < n_in ? cursor[kind]++ : -1;
}

/* Take the next item for a placeholder of `kind`; *taken counts them. */
static int
take(const g4_media_input *in, int n_in, int kind, int *next, g4_err *err)
{
	int			i = next_of_kind(in, n_in, kind, next + 1);

	if (i < 0)
		return g4_fail(err, G4_ERR_INVALID, "the prompt has more %s placeholders than %s items", kind_name(kind),
					   kind_name(kind));
	next[0]++;
	return i;
}

/* Keep a string alive for the placed request. */
static const char *
keep(g4_media_prompt *p, g4_buf *b, g4_err *err)
{
	char	  **k = g4_realloc(p->strings, (size_t) (p->n_strings + 1) * sizeof(char *));

	if (!k || g4_buf_append(b, "", 1) != 0)
	{
		if (k)
			p->strings = k;
		g4_buf_free(b);
		g4_fail(err, G4_ERR_NOMEM, "out of memory");
		return NULL;
	}
	p->strings = k;
	p->strings[p->n_strings++] = b->data;
	return b->data;
}

/* Text with its placeholders expanded (consuming items). */
static const char *
expand_text(g4_media_prompt *p, const g4_tokenizer *tok, const g4_chat_ids *ids, const char *text,
			const g4_media_input *in, int n_in, int *next, g4_err *err)
{
	g4_buf		b = {0};
	const char *at;
	int			k;

	if (!text || count_placeholders(text) == 0)
		return text;
	while ((k = next_placeholder(text, &at)) >= 0)
	{
		int			i = take(in, n_in, k, next, err);

		if (i < 0 || g4_buf_append(&b, text, (size_t) (at - text)) != 0 ||
			g4_chat_expand_media(tok, ids, k, in[i].n_tokens, &b) != 0)
		{
			g4_buf_free(&b);
			if (i >= 0)
				g4_fail(err, G4_ERR_NOMEM, "out of memory");
			return NULL;
		}
		text = at + strlen(placeholder[k]);
	}
	if (g4_buf_puts(&b, text) != 0)
	{
		g4_buf_free(&b);
		g4_fail(err, G4_ERR_NOMEM, "out of memory");
		return NULL;
	}
	return keep(p, &b, err);
}

void
g4_media_prompt_free(g4_media_prompt *p)
{
	int			i;

	for (i = 0; i < p->n_strings; i++)
		free(p->strings[i]);
	free(p->strings);
	for (i = 0; p->msgs && i < p->req.n_messages; i++)
		free((void *) p->msgs[i].parts);
	free(p->msgs);
	memset(p, 0, sizeof(*p));
}

static int
place_text(g4_media_prompt *p, const g4_tokenizer *tok, const g4_chat_ids *ids, const g4_media_input *in,
		   int n_in, int *next, g4_err *err)
{
	const char *prompt = p->req.prompt ? p->req.prompt : "";

	if (count_placeholders(prompt) == 0)
	{
		g4_buf		b = {0};
		int			i;

		for (i = 0; i < n_in; i++)
			if (g4_chat_expand_media(tok, ids, in[i].kind, in[i].n_tokens, &b) != 0)
			{
				g4_buf_free(&b);
				return g4_fail(err, G4_ERR_NOMEM, "out of memory");
			}
		if (g4_buf_puts(&b, prompt) != 0)
		{
			g4_buf_free(&b);
			return g4_fail(err, G4_ERR_NOMEM, "out of memory");
		}
		*next = n_in;
		p->req.prompt = keep(p, &b, err);
		return p->req.prompt ? G4_OK : err->code;
	}
	p->req.prompt = expand_text(p, tok, ids, prompt, in, n_in, next, err);
	return p->req.prompt ? G4_OK : err->code;
}

static int
chat_placeholders(const g4_request *req)
{
	int			i,
				k,
				n = 0;

	for (i = 0; i < req->n_messages; i++)
	{
		const g4_message *m = &req->messages[i];

		if (!m->parts)
			n += count_placeholders(m->content);
		for (k = 0; m->parts && k < m->n_parts; k++)
			n += m->parts[k].kind == G4_PART_TEXT ? count_placeholders(m->parts[k].text) : 1;
	}
	return n;
}

static int
place_chat(g4_media_prompt *p, const g4_tokenizer *tok, const g4_chat_ids *ids, const g4_media_input *in,
		   int n_in, int *next, g4_err *err)
{
	const g4_request *req = &p->req;
	int			n = req->n_messages;
	int			lead = chat_placeholders(req) == 0 ? n_in : 0;	/* items put before the last user text */
	int			last_user = -1;
	int			i,
				k;

	for (i = 0; i < n; i++)
		if (req->messages[i].role == G4_ROLE_USER)
			last_user = i;
	if (lead > 0 && last_user < 0)
		return g4_fail(err, G4_ERR_INVALID, "media need a user message to go in");
	p->msgs = g4_calloc((size_t) n, sizeof(g4_message));
	if (!p->msgs)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	for (i = 0; i < n; i++)
	{
		const g4_message *m = &req->messages[i];
		int			extra = i == last_user ? lead : 0;
		int			np = (m->parts ? m->n_parts : 1) + extra;
		g4_content_part *parts;
		int			j = 0;

		p->msgs[i] = *m;
		p->msgs[i].parts = NULL;	/* only parts allocated here are ever freed */
		p->msgs[i].n_parts = 0;
		if (!m->parts && extra == 0)
		{
			if (m->content && !(p->msgs[i].content = expand_text(p, tok, ids, m->content, in, n_in, next, err)))
				return err->code;
			continue;
		}
		parts = g4_calloc((size_t) np, sizeof(g4_content_part));
		if (!parts)
			return g4_fail(err, G4_ERR_NOMEM, "out of memory");
		p->msgs[i].parts = parts;
		p->msgs[i].n_parts = np;
		for (k = 0; k < extra; k++, j++)
		{
			parts[j].kind = in[k].kind == G4_MEDIA_IMAGE ? G4_PART_IMAGE : G4_PART_AUDIO;
			parts[j].n_soft_tokens = in[k].n_tokens;
		}
		if (extra)
			*next = n_in;
		if (!m->parts)
		{
			parts[j].kind = G4_PART_TEXT;
			parts[j].text = m->content ? m->content : "";
			continue;
		}
		for (k = 0; k < m->n_parts; k++, j++)
		{
			parts[j] = m->parts[k];
			if (parts[j].kind == G4_PART_TEXT)
			{
				if (parts[j].text && !(parts[j].text = expand_text(p, tok, ids, parts[j].text, in, n_in, next, err)))
					return err->code;
			}
			else if (parts[j].kind == G4_PART_IMAGE || parts[j].kind == G4_PART_AUDIO)
			{
				int			t = take(in, n_in, parts[j].kind == G4_PART_IMAGE ? G4_MEDIA_IMAGE : G4_MEDIA_AUDIO,
									 next, err);

				if (t < 0)
					return err->code;
				parts[j].n_soft_tokens = in[t].n_tokens;
			}
		}
	}
	p->req.messages = p->msgs;
	return G4_OK;
}

int
g4_media_place(const g4_tokenizer *tok, const g4_chat_ids *ids, const g4_request *req, const g4_media_input *in,
			   int n_in, g4_media_prompt *p, g4_err *err)
{
	int			next[3] = {0, 0, 0};	/* items taken; next image, next audio */
	int			rc;

	memset(p, 0, sizeof(*p));
	p->req = *req;
	if (req->input_kind == G4_INPUT_TEXT)
		rc = place_text(p, tok, ids, in, n_in, next, err);
	else if (req->input_kind == G4_INPUT_CHAT && req->messages && req->n_messages > 0)
		rc = place_chat(p, tok, ids, in, n_in, next, err);
	else
		rc = g4_fail(err, G4_ERR_INVALID, "media need a text or chat prompt (not token ids)");
	if (rc == G4_OK && next[0] != n_in)
		rc = g4_fail(err, G4_ERR_INVALID, "the prompt has %d media placeholders for %d media items", next[0], n_in);
	if (rc != G4_OK)
		g4_media_prompt_free(p);
	return rc;
}

int
g4_media_locate(const g4_chat_ids *ids, const int32_t *tok, int n, g4_media_input *in, int n_in,
				int32_t **embed_pos, int *n_embeds, int32_t **mm_block, g4_err *err)
{
	int			cursor[2] = {0, 0};
	int			found = 0,
				block = 0,
				total = 0,
				e = 0,
				any_image = 0,
				i;

	*embed_pos = NULL;
	*mm_block = NULL;
	*n_embeds = 0;
	for (i = 0; i < n_in; i++)
	{
		total += in[i].n_tokens;
		any_image |= in[i].kind == G4_MEDIA_IMAGE;
	}
	*embed_pos = g4_malloc((size_t) G4_MAX(total, 1) * sizeof(int32_t));
	if (any_image)
		*mm_block = g4_malloc((size_t) n * sizeof(int32_t));
	if (!*embed_pos || (any_image && !*mm_block))
	{
		g4_fail(err, G4_ERR_NOMEM, "out of memory");
		goto fail;
	}
	for (i = 0; i < n;)
	{
		int			kind = tok[i] == ids->image_soft ? G4_MEDIA_IMAGE : tok[i] == ids->audio_soft ? G4_MEDIA_AUDIO : -1;
		int			run = 0,
					item;

		if (kind < 0)
		{
			if (*mm_block)
				(*mm_block)[i] = -1;
			i++;
			continue;
		}
		while (i + run < n && tok[i + run] == tok[i])
			run++;
		item = next_of_kind(in, n_in, kind, cursor);
		if (item < 0 || in[item].n_tokens != run)
		{
			g4_fail(err, G4_ERR_INVALID, "the prompt holds %s soft-token text that does not match its media items "
					"(write one <|image|> or <|audio|> per item, nothing else)", kind_name(kind));
			goto fail;
		}
		in[item].row_offset = e;
		for (; run > 0; run--, i++)
		{
			(*embed_pos)[e++] = i;
			if (*mm_block)
				(*mm_block)[i] = kind == G4_MEDIA_IMAGE ? block : -1;
		}
		block += kind == G4_MEDIA_IMAGE;
		found++;
	}
	if (found != n_in)
	{
		g4_fail(err, G4_ERR_INVALID, "%d of %d media items found no place in the prompt", n_in - found, n_in);
		goto fail;
	}
	*n_embeds = e;
	return G4_OK;
fail:
	free(*embed_pos);
	free(*mm_block);
	*embed_pos = *mm_block = NULL;
	return err->code;
}
