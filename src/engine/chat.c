/*
 * chat.c — the Gemma 4 and Gemma 3 chat prompt formats.
 *
 * The published Jinja templates are rendered by hand, statement for
 * statement, into text; media parts are then expanded the way the
 * processors do it, and the whole text is tokenised once.  With
 * allow_control_tokens, special-token strings inside message text become
 * special tokens, exactly as apply_chat_template followed by the processor
 * does; without it (what the SQL functions do by default) the content's
 * byte ranges are encoded with special tokens as plain text, so data cannot
 * close a turn or forge one (g4_tok_encode_plain).
 *
 * Gemma 4 (google/gemma-4 chat_template, llama.cpp models/templates/
 * gemma4.jinja), without tools:
 *   <bos>
 *   [<|turn>system\n [<|think|>] trim(SYSTEM) <turn|>\n]   when the first
 *       message is a system message or thinking is enabled
 *   per message: <|turn>ROLE\n CONTENT <turn|>\n   (ROLE user/model/system;
 *       user text trimmed, model text with <|channel>...<channel|> thought
 *       removed, then trimmed; each text part on its own)
 *   image part: \n\n<|image|>\n\n, audio part: <|audio|>, expanded by the
 *       processor to <|image> + n x <|image|> + <image|> (audio alike)
 *   generation prompt: <|turn>model\n, plus <|channel>thought\n<channel|>
 *       when thinking is disabled.
 *
 * Gemma 3 (tokenizer_config.json chat_template of google/gemma-3):
 *   <bos> (<start_of_turn>ROLE\n [FIRST_USER_PREFIX] trim(CONTENT)
 *   <end_of_turn>\n)* [<start_of_turn>model\n]; a leading system message
 *   becomes FIRST_USER_PREFIX = its text (untrimmed) + "\n\n"; roles must
 *   alternate user/model; an image part is <start_of_image>, expanded to
 *   \n\n<start_of_image> + n x <image_soft_token> + <end_of_image>\n\n.
 *
 * "trim" is Python's str.strip(): every character with str.isspace().
 */
#include "chat.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

/* Length of a str.isspace() character at s (n bytes left), or 0. */
static size_t
py_space_at(const unsigned char *s, size_t n)
{
	if (n >= 1 && ((s[0] >= 0x09 && s[0] <= 0x0D) || (s[0] >= 0x1C && s[0] <= 0x20)))
		return 1;
	if (n >= 2 && s[0] == 0xC2 && (s[1] == 0x85 || s[1] == 0xA0))
		return 2;
	if (n >= 3 && s[0] == 0xE1 && s[1] == 0x9A && s[2] == 0x80)	/* U+1680 */
		return 3;
	if (n >= 3 && s[0] == 0xE2 && s[1] == 0x80 &&
		((s[2] >= 0x80 && s[2] <= 0x8A) || s[2] == 0xA8 || s[2] == 0xA9 || s[2] == 0xAF))
		return 3;				/* U+2000..U+200A, U+2028, U+2029, U+202F */
	if (n >= 3 && s[0] == 0xE2 && s[1] == 0x81 && s[2] == 0x9F)	/* U+205F */
		return 3;
	if (n >= 3 && s[0] == 0xE3 && s[1] == 0x80 && s[2] == 0x80)	/* U+3000 */
		return 3;
	return 0;
}

/* Is there a str.isspace() character ending exactly at s[n]? */
static size_t
py_space_before(const unsigned char *s, size_t n)
{
	size_t		k;

	for (k = 1; k <= 3 && k <= n; k++)
	{
		size_t		l = py_space_at(s + n - k, k);

		if (l == k)
			return k;
	}
	return 0;
}

static int
append_trimmed(g4_buf *out, const char *text, size_t n)
{
	const unsigned char *s = (const unsigned char *) text;
	size_t		a = 0,
				b = n,
				l;

	while (a < b && (l = py_space_at(s + a, b - a)) > 0)
		a += l;
	while (b > a && (l = py_space_before(s, b)) > 0 && b - l >= a)
		b -= l;
	return g4_buf_append(out, text + a, b - a);
}

static const char *
memfind(const char *h, size_t hn, const char *needle)
{
	size_t		nn = strlen(needle),
				i;

	if (nn > hn)
		return NULL;
	for (i = 0; i + nn <= hn; i++)
		if (h[i] == needle[0] && memcmp(h + i, needle, nn) == 0)
			return h + i;
	return NULL;
}

/*
 * strip_thinking: split on "<channel|>"; of each part keep what precedes a
 * "<|channel>" (or all of it when there is none); join and trim.
 */
static int
append_model_text(g4_buf *out, const char *text, size_t n, g4_buf *tmp)
{
	const char *p = text,
			   *end = text + n;

	tmp->len = 0;
	for (;;)
	{
		const char *close = memfind(p, (size_t) (end - p), "<channel|>");
		const char *pe = close ? close : end;
		const char *open = memfind(p, (size_t) (pe - p), "<|channel>");

		if (g4_buf_append(tmp, p, (size_t) ((open ? open : pe) - p)) != 0)
			return -1;
		if (!close)
			break;
		p = close + strlen("<channel|>");
	}
	return append_trimmed(out, tmp->data ? tmp->data : "", tmp->len);
}

static int
append_repeat(g4_buf *out, const char *s, size_t len, int times)
{
	int			k;

	for (k = 0; k < times; k++)
		if (g4_buf_append(out, s, len) != 0)
			return -1;
	return 0;
}

/* A media item as the processor expands it. */
static int
append_media(const g4_tokenizer *tok, g4_buf *out, int begin, int soft, int end, int n,
			 const char *around)
{
	size_t		bl,
				sl,
				el;
	const char *b = g4_tok_piece(tok, begin, &bl);
	const char *s = g4_tok_piece(tok, soft, &sl);
	const char *e = g4_tok_piece(tok, end, &el);

	if (g4_buf_puts(out, around) != 0 || g4_buf_append(out, b, bl) != 0 ||
		append_repeat(out, s, sl, n) != 0 || g4_buf_append(out, e, el) != 0 ||
		g4_buf_puts(out, around) != 0)
		return -1;
	return 0;
}

int
g4_chat_expand_media(const g4_tokenizer *tok, const g4_chat_ids *ids, int kind, int n, g4_buf *out)
{
	if (kind == G4_MEDIA_IMAGE)
		return append_media(tok, out, ids->image_begin, ids->image_soft, ids->image_end, n, "");
	return append_media(tok, out, ids->audio_begin, ids->audio_soft, ids->audio_end, n, "");
}

/* The byte ranges of message content in the rendered text. */
typedef struct
{
	g4_tok_span *v;
	int			n;
	int			cap;
} span_list;

static int
push_span(span_list *l, size_t off, size_t len)
{
	if (l->n == l->cap)
	{
		int			cap = l->cap ? l->cap * 2 : 16;
		g4_tok_span *p = g4_realloc(l->v, sizeof(g4_tok_span) * (size_t) cap);

		if (!p)
			return -1;
		l->v = p;
		l->cap = cap;
	}
	l->v[l->n].off = off;
	l->v[l->n].len = len;
	l->n++;
	return 0;
}

/* Record out[from, out->len) as content; no-op without a list. */
static int
mark_content(span_list *l, const g4_buf *out, size_t from)
{
	if (!l || out->len == from)
		return 0;
	return push_span(l, from, out->len - from);
}


/* One text of a message as the template writes it (model text without its
 * thoughts, user text trimmed), recorded as content. */
static int
append_content(g4_buf *out, span_list *plain, const char *text, int model, g4_buf *tmp)
{
	size_t		from = out->len;
	const char *c = text ? text : "";
	int			rc = model ? append_model_text(out, c, strlen(c), tmp) : append_trimmed(out, c, strlen(c));

	return rc | mark_content(plain, out, from);
}

/* Piece text of a token id, or NULL (no such token, or empty). */
static const char *
piece_of(const g4_tokenizer *tok, int id, size_t *len)
{
	const char *p = id >= 0 ? g4_tok_piece(tok, id, len) : NULL;

	return p && *len > 0 ? p : NULL;
}

/* Offset of the first piece at or after pos, before end; end when none. */
static size_t
find_from(const char *text, size_t pos, size_t end, const char *piece, size_t len)
{
	const char *at = len <= end - pos ? memmem(text + pos, end - pos, piece, len) : NULL;

	return at ? (size_t) (at - text) : end;
}

/* Length of the media expansion (begin, then at least one soft token,
 * then end) starting at text + pos and ending by end, or 0. */
static size_t
expansion_at(const char *text, size_t pos, size_t end, const char *const piece[3], const size_t len[3])
{
	size_t		p = pos + len[0],
				n_soft = 0;

	while (p + len[1] <= end && memcmp(text + p, piece[1], len[1]) == 0)
	{
		p += len[1];
		n_soft++;
	}
	if (n_soft == 0 || p + len[2] > end || memcmp(text + p, piece[2], len[2]) != 0)
		return 0;
	return p + len[2] - pos;
}

int
g4_chat_spans_except_media(const g4_tokenizer *tok, const g4_chat_ids *ids, const char *text,
						   g4_tok_span **v, int *n, int *cap)
{
	const int	media[2][3] = {{ids->image_begin, ids->image_soft, ids->image_end},
	{ids->audio_begin, ids->audio_soft, ids->audio_end}};
	const char *piece[2][3];
	size_t		len[2][3];
	int			usable[2];
	span_list	out = {0};
	int			i,
				k,
				j;

	for (k = 0; k < 2; k++)
	{
		usable[k] = 1;
		for (j = 0; j < 3; j++)
			usable[k] &= (piece[k][j] = piece_of(tok, media[k][j], &len[k][j])) != NULL;
	}
	for (i = 0; i < *n; i++)
	{
		size_t		pos = (*v)[i].off,
					from = pos,
					end = (*v)[i].off + (*v)[i].len;
		size_t		next[2];

		/* each kind's next begin text, found once per position passed:
		 * one pass over the span whatever it holds */
		for (k = 0; k < 2; k++)
			next[k] = usable[k] ? find_from(text, pos, end, piece[k][0], len[k][0]) : end;
		while (pos < end)
		{
			size_t		run = 0;

			k = next[0] <= next[1] ? 0 : 1;
			if (next[k] >= end)
				break;
			pos = next[k];
			run = expansion_at(text, pos, end, piece[k], len[k]);
			/* only a whole expansion is the media's: a begin or end token's
			 * text alone in the data stays text (soft-token text in data
			 * is a placeholder, expanded by placement) */
			if (run > 0)
			{
				if (pos > from && push_span(&out, from, pos - from) != 0)
				{
					free(out.v);
					return -1;
				}
				from = pos + run;
			}
			pos += run > 0 ? run : 1;
			for (j = 0; j < 2; j++)
				if (next[j] < pos)
					next[j] = find_from(text, pos, end, piece[j][0], len[j][0]);
		}
		if (end > from && push_span(&out, from, end - from) != 0)
		{
			free(out.v);
			return -1;
		}
	}
	free(*v);
	*v = out.v;
	*n = out.n;
	*cap = out.cap;
	return 0;
}

static int
resolve(const g4_tokenizer *tok, const char *name, int required, int *id, g4_err *err)
{
	*id = g4_tok_id(tok, name);
	if (*id < 0 && required)
		return g4_fail(err, G4_ERR_UNSUPPORTED,
					   "the tokenizer has no \"%s\" token, which this chat format needs", name);
	return G4_OK;
}

int
g4_chat_init(const g4_tokenizer *tok, int format, g4_chat_ids *ids, g4_err *err)
{
	static const char *const g4_needed[] = {
		"<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|think|>"
	};
	static const char *const g3_needed[] = {"<start_of_turn>", "<end_of_turn>"};
	int			rc,
				dummy;
	size_t		k;

	memset(ids, 0, sizeof(*ids));
	ids->format = format;
	ids->bos = g4_tok_bos(tok);
	if (ids->bos < 0 && (rc = resolve(tok, "<bos>", 1, &ids->bos, err)) != G4_OK)
		return rc;
	if (format == G4_CHAT_GEMMA4)
	{
		for (k = 0; k < G4_ARRAY_LEN(g4_needed); k++)
			if ((rc = resolve(tok, g4_needed[k], 1, &dummy, err)) != G4_OK)
				return rc;
		resolve(tok, "<|image>", 0, &ids->image_begin, err);
		resolve(tok, "<|image|>", 0, &ids->image_soft, err);
		resolve(tok, "<image|>", 0, &ids->image_end, err);
		resolve(tok, "<|audio>", 0, &ids->audio_begin, err);
		resolve(tok, "<|audio|>", 0, &ids->audio_soft, err);
		resolve(tok, "<audio|>", 0, &ids->audio_end, err);
	}
	else if (format == G4_CHAT_GEMMA3)
	{
		for (k = 0; k < G4_ARRAY_LEN(g3_needed); k++)
			if ((rc = resolve(tok, g3_needed[k], 1, &dummy, err)) != G4_OK)
				return rc;
		resolve(tok, "<start_of_image>", 0, &ids->image_begin, err);
		resolve(tok, "<image_soft_token>", 0, &ids->image_soft, err);
		resolve(tok, "<end_of_image>", 0, &ids->image_end, err);
		ids->audio_begin = ids->audio_soft = ids->audio_end = -1;
	}
	else
		return g4_fail(err, G4_ERR_INVALID, "unknown chat format %d", format);
	/* a media kind is usable only with all three of its tokens */
	if (ids->image_begin < 0 || ids->image_soft < 0 || ids->image_end < 0)
		ids->image_begin = ids->image_soft = ids->image_end = -1;
	if (ids->audio_begin < 0 || ids->audio_soft < 0 || ids->audio_end < 0)
		ids->audio_begin = ids->audio_soft = ids->audio_end = -1;
	return G4_OK;
}

static const char *
role_name(int role)
{
	switch (role)
	{
		case G4_ROLE_SYSTEM:
			return "system";
		case G4_ROLE_USER:
			return "user";
		case G4_ROLE_MODEL:
			return "model";
	}
	return NULL;
}

/* Check the media parts of a message against what the format can show. */
static int
check_parts(const g4_chat_ids *ids, const g4_message *m, int i, g4_err *err)
{
	int			k;

	if (!role_name(m->role))
		return g4_fail(err, G4_ERR_INVALID, "message %d has an unknown role %d", i + 1, m->role);
	if (m->n_parts < 0 || (m->n_parts > 0 && !m->parts))
		return g4_fail(err, G4_ERR_INVALID, "message %d has a bad parts list", i + 1);
	for (k = 0; m->parts && k < m->n_parts; k++)
	{
		const g4_content_part *p = &m->parts[k];

		if (p->kind == G4_PART_TEXT)
			continue;
		if (p->kind != G4_PART_IMAGE && p->kind != G4_PART_AUDIO)
			return g4_fail(err, G4_ERR_INVALID, "message %d part %d has an unknown kind %d", i + 1, k + 1, p->kind);
		if (p->n_soft_tokens <= 0)
			return g4_fail(err, G4_ERR_INVALID, "message %d part %d: a media item needs n_soft_tokens > 0",
						   i + 1, k + 1);
		if (p->kind == G4_PART_IMAGE && ids->image_soft < 0)
			return g4_fail(err, G4_ERR_UNSUPPORTED, "message %d part %d: this tokenizer has no image tokens",
						   i + 1, k + 1);
		if (p->kind == G4_PART_AUDIO && ids->audio_soft < 0)
			return g4_fail(err, G4_ERR_UNSUPPORTED, "message %d part %d: this model has no audio input",
						   i + 1, k + 1);
	}
	return G4_OK;
}

static int
render_gemma4(const g4_tokenizer *tok, const g4_chat_ids *ids, const g4_message *msgs, int n,
			  int thinking, int gen, g4_buf *out, span_list *plain, g4_buf *tmp, g4_err *err)
{
	int			first = 0,
				i,
				k,
				rc = 0;

	if (msgs[0].role == G4_ROLE_SYSTEM || thinking)
	{
		rc |= g4_buf_puts(out, "<|turn>system\n");
		if (thinking)
			rc |= g4_buf_puts(out, "<|think|>");
		if (msgs[0].role == G4_ROLE_SYSTEM)
		{
			/* the template trims the content as a string; a list would be
			 * rendered as its Python repr, which nobody wants */
			if (msgs[0].parts)
				return g4_fail(err, G4_ERR_INVALID, "the system message must be plain text (content)");
			if (msgs[0].content)
				rc |= append_content(out, plain, msgs[0].content, 0, tmp);
			first = 1;
		}
		rc |= g4_buf_puts(out, "<turn|>\n");
	}
	for (i = first; i < n; i++)
	{
		const g4_message *m = &msgs[i];
		int			model = m->role == G4_ROLE_MODEL;

		rc |= g4_buf_puts(out, "<|turn>");
		rc |= g4_buf_puts(out, role_name(m->role));
		rc |= g4_buf_puts(out, "\n");
		if (!m->parts)
			rc |= append_content(out, plain, m->content, model, tmp);
		else
		{
			for (k = 0; k < m->n_parts; k++)
			{
				const g4_content_part *p = &m->parts[k];

				if (p->kind == G4_PART_TEXT)
					rc |= append_content(out, plain, p->text, model, tmp);
				else if (p->kind == G4_PART_IMAGE)
					rc |= append_media(tok, out, ids->image_begin, ids->image_soft, ids->image_end,
									   p->n_soft_tokens, "\n\n");
				else
					rc |= append_media(tok, out, ids->audio_begin, ids->audio_soft, ids->audio_end,
									   p->n_soft_tokens, "");
			}
		}
		rc |= g4_buf_puts(out, "<turn|>\n");
	}
	if (gen)
	{
		rc |= g4_buf_puts(out, "<|turn>model\n");
		if (!thinking)
			rc |= g4_buf_puts(out, "<|channel>thought\n<channel|>");
	}
	return rc ? g4_fail(err, G4_ERR_NOMEM, "out of memory rendering a chat prompt") : G4_OK;
}

static int
render_gemma3(const g4_tokenizer *tok, const g4_chat_ids *ids, const g4_message *msgs, int n,
			  int gen, g4_buf *out, span_list *plain, g4_buf *tmp, g4_err *err)
{
	const char *prefix = NULL;
	int			first = 0,
				i,
				k,
				rc = 0;

	if (msgs[0].role == G4_ROLE_SYSTEM)
	{
		/* the first part's text when given as parts */
		if (msgs[0].parts)
		{
			if (msgs[0].n_parts < 1 || msgs[0].parts[0].kind != G4_PART_TEXT)
				return g4_fail(err, G4_ERR_INVALID, "the system message must start with text");
			prefix = msgs[0].parts[0].text;
		}
		else
			prefix = msgs[0].content;
		if (!prefix)
			prefix = "";
		first = 1;
	}
	for (i = first; i < n; i++)
	{
		const g4_message *m = &msgs[i];

		if ((m->role == G4_ROLE_USER) != ((i - first) % 2 == 0))
			return g4_fail(err, G4_ERR_INVALID,
						   "Gemma 3 conversation roles must alternate user/model/user/model... (message %d)", i + 1);
		rc |= g4_buf_puts(out, "<start_of_turn>");
		rc |= g4_buf_puts(out, role_name(m->role));
		rc |= g4_buf_puts(out, "\n");
		if (i == first && prefix)
		{
			size_t		from = out->len;

			rc |= g4_buf_puts(out, prefix);
			rc |= mark_content(plain, out, from);
			rc |= g4_buf_puts(out, "\n\n");
		}
		if (!m->parts)
			rc |= append_content(out, plain, m->content, 0, tmp);
		else
		{
			for (k = 0; k < m->n_parts; k++)
			{
				const g4_content_part *p = &m->parts[k];

				if (p->kind == G4_PART_TEXT)
					rc |= append_content(out, plain, p->text, 0, tmp);
				else if (p->kind == G4_PART_IMAGE)
					rc |= append_media(tok, out, ids->image_begin, ids->image_soft, ids->image_end,
									   p->n_soft_tokens, "\n\n");
			}
		}
		rc |= g4_buf_puts(out, "<end_of_turn>\n");
	}
	if (gen)
		rc |= g4_buf_puts(out, "<start_of_turn>model\n");
	return rc ? g4_fail(err, G4_ERR_NOMEM, "out of memory rendering a chat prompt") : G4_OK;
}

int
g4_chat_encode(const g4_tokenizer *tok, const g4_chat_ids *ids, const g4_message *msgs,
			   int n_msgs, int enable_thinking, int add_generation_prompt, int allow_control_tokens,
			   const g4_cancel_flag *cancel, int32_t **out, int *n, int *cap, g4_err *err)
{
	g4_buf		text = {0},
				tmp = {0};
	span_list	spans = {0};
	span_list  *plain = allow_control_tokens == G4_TEXT_CONTROL ? NULL : &spans;
	size_t		bl;
	const char *bos;
	int			rc,
				i;

	if (n_msgs <= 0 || !msgs)
		return g4_fail(err, G4_ERR_INVALID, "a chat needs at least one message");
	for (i = 0; i < n_msgs; i++)
		if ((rc = check_parts(ids, &msgs[i], i, err)) != G4_OK)
			return rc;
	bos = g4_tok_piece(tok, ids->bos, &bl);
	if (!bos || g4_buf_append(&text, bos, bl) != 0)
	{
		g4_buf_free(&text);
		return bos ? g4_fail(err, G4_ERR_NOMEM, "out of memory rendering a chat prompt") :
			g4_fail(err, G4_ERR_INVALID, "chat ids have no valid BOS token");
	}
	if (ids->format == G4_CHAT_GEMMA4)
		rc = render_gemma4(tok, ids, msgs, n_msgs, enable_thinking, add_generation_prompt,
						   &text, plain, &tmp, err);
	else if (ids->format == G4_CHAT_GEMMA3)
	{
		for (i = 0; i < n_msgs; i++)
		{
			int			k;

			for (k = 0; msgs[i].parts && k < msgs[i].n_parts; k++)
				if (msgs[i].parts[k].kind == G4_PART_AUDIO)
				{
					g4_buf_free(&text);
					return g4_fail(err, G4_ERR_UNSUPPORTED, "message %d: Gemma 3 has no audio input", i + 1);
				}
		}
		rc = render_gemma3(tok, ids, msgs, n_msgs, add_generation_prompt, &text, plain, &tmp, err);
	}
	else
		rc = g4_fail(err, G4_ERR_INVALID, "unknown chat format %d", ids->format);
	if (rc == G4_OK && allow_control_tokens == G4_TEXT_DATA_BUT_MEDIA &&
		g4_chat_spans_except_media(tok, ids, text.data, &spans.v, &spans.n, &spans.cap) != 0)
		rc = g4_fail(err, G4_ERR_NOMEM, "out of memory rendering a chat prompt");
	if (rc == G4_OK)
		rc = g4_tok_encode_plain(tok, text.data, text.len, 0, spans.v, spans.n, cancel, out, n, cap, err);
	g4_buf_free(&text);
	g4_buf_free(&tmp);
	free(spans.v);
	return rc;
}
