/*
 * test_chat.c — g4_chat_encode against the transformers goldens
 * (test/golden/chat-*.json from test/reference/golden_chat.py): the Gemma 4
 * format with the fixture tokenizer (always) and the Gemma 3 format with the
 * real Gemma 3 tokenizer (when ../shared is present), plus the errors the
 * formats raise.
 */
#include "test.h"

#include <stdint.h>

#include "chat.h"
#include "json.h"
#include "tokenizer.h"
#include "util.h"

static g4_tokenizer *
load_tok(const char *json_path, const char *config_path, g4_err *err)
{
	g4_tokenizer *t = NULL;

	if (g4_tok_load_json(json_path, config_path, &t, err) != 0)
		return NULL;
	return t;
}

static g4_tokenizer *
load_fixture(g4_err *err)
{
	char		tj[4096],
				tc[4096];

	snprintf(tj, sizeof(tj), "%s/test/fixtures/tokenizer/tokenizer.json", g4_test_srcdir());
	snprintf(tc, sizeof(tc), "%s/test/fixtures/tokenizer/tokenizer_config.json", g4_test_srcdir());
	return load_tok(tj, tc, err);
}

/* Gemma 3 from ../shared, unpacked with zcat; NULL + *why when unavailable. */
static g4_tokenizer *
load_gemma3(g4_err *err, const char **why)
{
	static char reason[4096 + 256];
	const char *shared = g4_test_shareddir();
	char		src[4096],
				srcc[4096],
				dst[4096],
				dstc[4096],
				cmd[4 * 4096 + 256];

	err->code = 0;
	*why = reason;
	if (!shared)
	{
		snprintf(reason, sizeof(reason), "../shared is absent: the real Gemma 3 tokenizer is not available");
		return NULL;
	}
	snprintf(src, sizeof(src), "%s/data/gemma3-tokenizer/tokenizer.json.gz", shared);
	snprintf(srcc, sizeof(srcc), "%s/data/gemma3-tokenizer/tokenizer_config.json.gz", shared);
	if (!g4_is_file(src) || !g4_is_file(srcc))
	{
		snprintf(reason, sizeof(reason), "%s is missing", src);
		return NULL;
	}
	if (system("command -v zcat >/dev/null 2>&1") != 0)
	{
		snprintf(reason, sizeof(reason), "zcat is not installed: cannot unpack %s", src);
		return NULL;
	}
	snprintf(dst, sizeof(dst), "%s/chat-gemma3-tokenizer.json", g4_test_tmpdir());
	snprintf(dstc, sizeof(dstc), "%s/chat-gemma3-tokenizer_config.json", g4_test_tmpdir());
	snprintf(cmd, sizeof(cmd), "zcat '%s' > '%s' && zcat '%s' > '%s'", src, dst, srcc, dstc);
	if (system(cmd) != 0)
	{
		snprintf(reason, sizeof(reason), "zcat failed on %s", src);
		return NULL;
	}
	return load_tok(dst, dstc, err);
}

static int
role_of(const char *name)
{
	if (strcmp(name, "system") == 0)
		return G4_ROLE_SYSTEM;
	if (strcmp(name, "user") == 0)
		return G4_ROLE_USER;
	if (strcmp(name, "model") == 0)
		return G4_ROLE_MODEL;
	return -1;
}

/*
 * Run every conversation of a golden file; returns the number that differ
 * (the first few are reported).
 */
static int
check_chats(const g4_tokenizer *tok, int format, const char *golden, int *n_conv)
{
	char		path[4096];
	char	   *text = NULL;
	size_t		len;
	g4_err		err;
	g4j_doc    *doc;
	const g4j  *convs;
	g4_chat_ids ids;
	size_t		c;
	int			bad = 0;

	*n_conv = 0;
	snprintf(path, sizeof(path), "%s/test/golden/%s", g4_test_srcdir(), golden);
	if (g4_read_file(path, &text, &len, &err) != 0)
	{
		g4_test_fail(__FILE__, __LINE__, "%s", err.msg);
		return 1;
	}
	doc = g4j_parse(text, len, &err);
	free(text);
	if (!doc)
	{
		g4_test_fail(__FILE__, __LINE__, "%s: %s", path, err.msg);
		return 1;
	}
	if (g4_chat_init(tok, format, &ids, &err) != 0)
	{
		g4_test_fail(__FILE__, __LINE__, "g4_chat_init: %s", err.msg);
		g4j_free(doc);
		return 1;
	}
	convs = g4j_get(g4j_root(doc), "conversations");
	for (c = 0; c < g4j_len(convs); c++)
	{
		const g4j  *conv = g4j_at(convs, c);
		const g4j  *jm = g4j_get(conv, "messages");
		const g4j  *want = g4j_get(conv, "ids");
		const char *name = g4j_get_str(conv, "name");
		size_t		nm = g4j_len(jm),
					i,
					k;
		g4_message *msgs = calloc(nm, sizeof(*msgs));
		g4_content_part *parts;
		size_t		n_parts_total = 0;
		int32_t    *out = NULL;
		int			n = 0,
					cap = 0,
					ok = 1;

		for (i = 0; i < nm; i++)
			n_parts_total += g4j_len(g4j_get(g4j_at(jm, i), "parts"));
		parts = calloc(n_parts_total + 1, sizeof(*parts));
		if (!msgs || !parts)
		{
			g4_test_fail(__FILE__, __LINE__, "out of memory");
			free(msgs);
			free(parts);
			bad++;
			break;
		}
		n_parts_total = 0;
		for (i = 0; i < nm; i++)
		{
			const g4j  *m = g4j_at(jm, i);
			const g4j  *jp = g4j_get(m, "parts");

			msgs[i].role = role_of(g4j_get_str(m, "role"));
			msgs[i].content = g4j_get_str(m, "content");
			if (jp)
			{
				msgs[i].parts = parts + n_parts_total;
				msgs[i].n_parts = (int) g4j_len(jp);
				for (k = 0; k < g4j_len(jp); k++)
				{
					const g4j  *p = g4j_at(jp, k);
					const char *type = g4j_get_str(p, "type");
					g4_content_part *cp = &parts[n_parts_total++];

					if (strcmp(type, "text") == 0)
					{
						cp->kind = G4_PART_TEXT;
						cp->text = g4j_get_str(p, "text");
					}
					else
					{
						cp->kind = strcmp(type, "image") == 0 ? G4_PART_IMAGE : G4_PART_AUDIO;
						cp->n_soft_tokens = (int) g4j_get_int(p, "n", 0);
					}
				}
			}
		}
		/* "ids": control tokens allowed (the reference's own rendering);
		 * "ids_plain": special-token text in message content as plain text */
		for (k = 0; k < 2 && ok; k++)
		{
			const g4j  *w = k == 0 ? want : g4j_get(conv, "ids_plain");

			if (!w)
				continue;
			n = 0;
			if (g4_chat_encode(tok, &ids, msgs, (int) nm, g4j_get_bool(conv, "enable_thinking", 0),
							   g4j_get_bool(conv, "add_generation_prompt", 0), k == 0, NULL,
							   &out, &n, &cap, &err) != 0)
			{
				g4_test_fail(__FILE__, __LINE__, "%s: g4_chat_encode failed: %s", name, err.msg);
				ok = 0;
			}
			else if ((size_t) n != g4j_len(w))
				ok = 0;
			else
			{
				for (i = 0; i < (size_t) n; i++)
					if (out[i] != g4j_int(g4j_at(w, i), -1))
						ok = 0;
			}
			if (!ok)
				want = w;
		}
		if (!ok)
		{
			if (bad < 5)
			{
				char	   *dec = NULL;
				size_t		dl;

				if (g4_tok_decode(tok, out, n, 0, &dec, &dl, &err) == 0)
					g4_test_fail(__FILE__, __LINE__, "%s: %d ids (expected %zu), rendered as \"%s\", expected \"%s\"",
								 name, n, g4j_len(want), dec, g4j_get_str(conv, "text"));
				free(dec);
			}
			bad++;
		}
		(*n_conv)++;
		free(out);
		free(msgs);
		free(parts);
	}
	g4j_free(doc);
	return bad;
}

G4_TEST(chat_gemma4_goldens)
{
	g4_err		err;
	g4_tokenizer *t = load_fixture(&err);
	int			bad,
				n;

	CHECK_MSG(t != NULL, "loading the fixture tokenizer: %s", err.msg);
	bad = check_chats(t, G4_CHAT_GEMMA4, "chat-gemma4.json", &n);
	g4_tok_free(t);
	CHECK_MSG(bad == 0, "%d of %d conversations differ", bad, n);
	CHECK(n >= 20);
}

G4_TEST(chat_gemma3_goldens)
{
	g4_err		err;
	const char *why;
	g4_tokenizer *t = load_gemma3(&err, &why);
	int			bad,
				n;

	if (!t && err.code == 0)
		G4_SKIP(why);
	CHECK_MSG(t != NULL, "loading the Gemma 3 tokenizer: %s", err.msg);
	bad = check_chats(t, G4_CHAT_GEMMA3, "chat-gemma3.json", &n);
	g4_tok_free(t);
	CHECK_MSG(bad == 0, "%d of %d conversations differ", bad, n);
	CHECK(n >= 10);
}

G4_TEST(chat_ids_and_errors)
{
	g4_err		err;
	g4_tokenizer *t = load_fixture(&err);
	g4_chat_ids ids;
	g4_message	msgs[3];
	g4_content_part part;
	int32_t    *out = NULL;
	int			n = 0,
				cap = 0;

	CHECK_MSG(t != NULL, "loading the fixture tokenizer: %s", err.msg);
	CHECK_OK(g4_chat_init(t, G4_CHAT_GEMMA4, &ids, &err), &err);
	CHECK_INT(ids.bos, 2);
	CHECK_INT(ids.image_begin, g4_tok_id(t, "<|image>"));
	CHECK_INT(ids.image_soft, g4_tok_id(t, "<|image|>"));
	CHECK_INT(ids.image_end, g4_tok_id(t, "<image|>"));
	CHECK_INT(ids.audio_begin, g4_tok_id(t, "<|audio>"));
	CHECK_INT(ids.audio_soft, g4_tok_id(t, "<|audio|>"));
	CHECK_INT(ids.audio_end, g4_tok_id(t, "<audio|>"));

	/* the fixture has no Gemma 3 turn markers */
	CHECK(g4_chat_init(t, G4_CHAT_GEMMA3, &ids, &err) == G4_ERR_UNSUPPORTED);
	CHECK(strstr(err.msg, "<start_of_turn>") != NULL);
	CHECK_OK(g4_chat_init(t, G4_CHAT_GEMMA4, &ids, &err), &err);

	memset(msgs, 0, sizeof(msgs));
	CHECK(g4_chat_encode(t, &ids, msgs, 0, 0, 1, 1, NULL, &out, &n, &cap, &err) == G4_ERR_INVALID);

	/* a media item without a soft-token count */
	part.kind = G4_PART_IMAGE;
	part.text = NULL;
	part.n_soft_tokens = 0;
	msgs[0].role = G4_ROLE_USER;
	msgs[0].parts = &part;
	msgs[0].n_parts = 1;
	CHECK(g4_chat_encode(t, &ids, msgs, 1, 0, 1, 1, NULL, &out, &n, &cap, &err) == G4_ERR_INVALID);
	CHECK(strstr(err.msg, "n_soft_tokens") != NULL);

	/* output is appended */
	msgs[0].parts = NULL;
	msgs[0].n_parts = 0;
	msgs[0].content = "Hello";
	CHECK_OK(g4_chat_encode(t, &ids, msgs, 1, 0, 1, 1, NULL, &out, &n, &cap, &err), &err);
	CHECK(n > 5);
	CHECK_INT(out[0], 2);
	{
		int			first = n;

		CHECK_OK(g4_chat_encode(t, &ids, msgs, 1, 0, 1, 1, NULL, &out, &n, &cap, &err), &err);
		CHECK_INT(n, 2 * first);
		CHECK_INT(out[first], 2);
	}
	free(out);
	g4_tok_free(t);
}

/* Count an id in ids[0..n). */
static int
count_id(const int32_t *ids, int n, int id)
{
	int			i,
				c = 0;

	for (i = 0; i < n; i++)
		c += ids[i] == id;
	return c;
}

/*
 * Content with media placed in it (G4_TEXT_DATA_BUT_MEDIA): only whole
 * expansions (begin, soft tokens, end) are control tokens; a begin or end
 * token's text alone in the data stays text.  A content of many lone begin
 * texts is scanned in one pass: the spans left are counted, not timed.
 */
G4_TEST(chat_media_spans_only_whole_expansions)
{
	g4_err		err;
	g4_tokenizer *t = load_fixture(&err);
	g4_chat_ids ids;
	g4_message	msg;
	g4_buf		text = {0};
	int32_t    *out = NULL;
	int			n = 0,
				cap = 0,
				i;

	CHECK_MSG(t != NULL, "loading the fixture tokenizer: %s", err.msg);
	CHECK_OK(g4_chat_init(t, G4_CHAT_GEMMA4, &ids, &err), &err);
	/* data: a lone begin, a lone end and a begin + end with no soft token
	 * around one real expansion of three soft tokens */
	CHECK(g4_buf_puts(&text, "data: <|image> <audio|> <|audio><audio|> before ") == 0);
	CHECK(g4_chat_expand_media(t, &ids, G4_MEDIA_IMAGE, 3, &text) == 0);
	CHECK(g4_buf_puts(&text, " after <image|>") == 0);
	memset(&msg, 0, sizeof(msg));
	msg.role = G4_ROLE_USER;
	msg.content = text.data;
	CHECK_OK(g4_chat_encode(t, &ids, &msg, 1, 0, 1, G4_TEXT_DATA_BUT_MEDIA, NULL, &out, &n, &cap, &err), &err);
	CHECK_INT(count_id(out, n, ids.image_begin), 1);
	CHECK_INT(count_id(out, n, ids.image_soft), 3);
	CHECK_INT(count_id(out, n, ids.image_end), 1);
	CHECK_INT(count_id(out, n, ids.audio_begin), 0);
	CHECK_INT(count_id(out, n, ids.audio_end), 0);
	free(out);
	g4_buf_free(&text);

	/* 100,000 lone begin texts and one expansion: two spans of data */
	{
		g4_tok_span *v = g4_malloc(sizeof(g4_tok_span));
		int			nv = 1,
					capv = 1;
		size_t		half;

		for (i = 0; i < 50000; i++)
			CHECK(g4_buf_puts(&text, "<|image>") == 0);
		half = text.len;
		CHECK(g4_chat_expand_media(t, &ids, G4_MEDIA_AUDIO, 2, &text) == 0);
		for (i = 0; i < 50000; i++)
			CHECK(g4_buf_puts(&text, "<|image>") == 0);
		CHECK(v);
		v[0].off = 0;
		v[0].len = text.len;
		CHECK_INT(g4_chat_spans_except_media(t, &ids, text.data, &v, &nv, &capv), 0);
		CHECK_INT(nv, 2);
		CHECK_INT(v[0].off, 0);
		CHECK_INT(v[0].len, half);
		CHECK_INT(v[1].off + v[1].len, text.len);
		CHECK_INT(text.len - v[1].off, half);
		free(v);
		g4_buf_free(&text);
	}
	g4_tok_free(t);
}

G4_TEST(chat_gemma3_errors)
{
	g4_err		err;
	const char *why;
	g4_tokenizer *t = load_gemma3(&err, &why);
	g4_chat_ids ids;
	g4_message	msgs[2];
	g4_content_part part;
	int32_t    *out = NULL;
	int			n = 0,
				cap = 0;

	if (!t && err.code == 0)
		G4_SKIP(why);
	CHECK_MSG(t != NULL, "loading the Gemma 3 tokenizer: %s", err.msg);
	CHECK_OK(g4_chat_init(t, G4_CHAT_GEMMA3, &ids, &err), &err);
	CHECK_INT(ids.image_begin, 255999);
	CHECK_INT(ids.image_soft, 262144);
	CHECK_INT(ids.image_end, 256000);
	CHECK_INT(ids.audio_soft, -1);

	/* roles must alternate */
	memset(msgs, 0, sizeof(msgs));
	msgs[0].role = G4_ROLE_USER;
	msgs[0].content = "a";
	msgs[1].role = G4_ROLE_USER;
	msgs[1].content = "b";
	CHECK(g4_chat_encode(t, &ids, msgs, 2, 0, 1, 1, NULL, &out, &n, &cap, &err) == G4_ERR_INVALID);
	CHECK(strstr(err.msg, "alternate") != NULL);

	/* no audio in Gemma 3 */
	part.kind = G4_PART_AUDIO;
	part.text = NULL;
	part.n_soft_tokens = 4;
	msgs[0].content = NULL;
	msgs[0].parts = &part;
	msgs[0].n_parts = 1;
	CHECK(g4_chat_encode(t, &ids, msgs, 1, 0, 1, 1, NULL, &out, &n, &cap, &err) == G4_ERR_UNSUPPORTED);
	free(out);
	g4_tok_free(t);
}
