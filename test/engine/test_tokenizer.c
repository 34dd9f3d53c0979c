/*
 * test_tokenizer.c — the tokenizer against the Hugging Face goldens
 * (test/golden/tokenizer-*, written by test/reference/golden_tokenizer.py):
 * ids and decodes of a 10,000-string corpus and decodes of random id
 * sequences, for the committed fixture tokenizer (always) and the real
 * Gemma 3 tokenizer (when ../shared is present), streaming detokenisation,
 * byte fallback, added-token matching, and the GGUF vocabulary of the model
 * named by G4_GGUF_MODEL.
 */
#include "test.h"

#include <stdint.h>
#include <unistd.h>

#include "gguf.h"
#include "tokenizer.h"
#include "util.h"

/* ---- golden files ----------------------------------------------------- */

typedef struct
{
	char	   *data;			/* whole file, lines NUL-terminated in place */
	char	  **lines;
	int			n;
} lines_file;

/* Equal byte strings; empty ones may come with NULL pointers. */
static int
same_bytes(const void *a, size_t an, const void *b, size_t bn)
{
	return an == bn && (an == 0 || memcmp(a, b, an) == 0);
}

static void
lines_free(lines_file *f)
{
	free(f->data);
	free(f->lines);
	memset(f, 0, sizeof(*f));
}

/* Read a file and split it into lines (a final newline ends the last one). */
static int
lines_read(const char *path, lines_file *f)
{
	size_t		len,
				i;
	int			cap = 1024;
	g4_err		err;

	memset(f, 0, sizeof(*f));
	if (g4_read_file(path, &f->data, &len, &err) != 0)
		return -1;
	f->lines = malloc(sizeof(char *) * (size_t) cap);
	if (!f->lines)
		return -1;
	for (i = 0; i < len;)
	{
		char	   *nl = memchr(f->data + i, '\n', len - i);
		size_t		e = nl ? (size_t) (nl - f->data) : len;

		if (f->n == cap)
		{
			char	  **p = realloc(f->lines, sizeof(char *) * (size_t) cap * 2);

			if (!p)
				return -1;
			f->lines = p;
			cap *= 2;
		}
		f->data[e] = '\0';
		f->lines[f->n++] = f->data + i;
		i = e + 1;
	}
	return 0;
}

static char *
golden_path(const char *name)
{
	char		buf[4096];

	snprintf(buf, sizeof(buf), "%s/test/golden/%s", g4_test_srcdir(), name);
	return g4_strdup(buf);
}

static int
hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Undo the goldens' escaping of s[0..n) into out (reset first). */
static void
unescape(const char *s, size_t n, g4_buf *out)
{
	size_t		i;

	out->len = 0;
	g4_buf_reserve(out, n + 1);
	for (i = 0; i < n; i++)
	{
		char		c = s[i];

		if (c == '\\' && i + 1 < n)
		{
			char		e = s[++i];

			if (e == 't')
				c = '\t';
			else if (e == 'n')
				c = '\n';
			else if (e == 'r')
				c = '\r';
			else if (e == 'x' && i + 2 < n)
			{
				c = (char) (hexval(s[i + 1]) * 16 + hexval(s[i + 2]));
				i += 2;
			}
			else
				c = e;
		}
		g4_buf_append(out, &c, 1);
	}
	g4_buf_append(out, "", 1);
	out->len--;
}

/* dst = a copy of src */
static void
buf_copy(g4_buf *dst, const g4_buf *src)
{
	dst->len = 0;
	g4_buf_append(dst, src->data ? src->data : "", src->len + 1);
	dst->len = src->len;
}

/* Split a golden line into its three tab-separated fields. */
static int
split3(char *line, char **f0, char **f1, char **f2)
{
	char	   *a = strchr(line, '\t'),
			   *b;

	if (!a)
		return -1;
	b = strchr(a + 1, '\t');
	if (!b)
		return -1;
	*a = '\0';
	*b = '\0';
	*f0 = line;
	*f1 = a + 1;
	*f2 = b + 1;
	return 0;
}

static int
parse_ids(const char *s, int32_t **ids, int *n, int *cap)
{
	*n = 0;
	while (*s)
	{
		char	   *end;
		long		v = strtol(s, &end, 10);

		if (end == s)
			return -1;
		if (*n == *cap)
		{
			int			c = *cap ? *cap * 2 : 64;
			int32_t    *p = realloc(*ids, sizeof(int32_t) * (size_t) c);

			if (!p)
				return -1;
			*ids = p;
			*cap = c;
		}
		(*ids)[(*n)++] = (int32_t) v;
		s = end;
		while (*s == ' ')
			s++;
	}
	return 0;
}

/* Printable form of a string for failure messages. */
static const char *
show(const char *s, size_t n, char *buf, size_t size)
{
	size_t		i,
				o = 0;

	for (i = 0; i < n && o + 8 < size; i++)
	{
		unsigned char c = (unsigned char) s[i];

		if (c < 0x20 || c == 0x7F || c == '\\')
			o += (size_t) snprintf(buf + o, size - o, "\\x%02X", c);
		else
			buf[o++] = (char) c;
	}
	if (i < n && o + 4 < size)
		o += (size_t) snprintf(buf + o, size - o, "...");
	buf[o] = '\0';
	return buf;
}

static void
show_ids(const int32_t *ids, int n, char *buf, size_t size)
{
	size_t		o = 0;
	int			i;

	buf[0] = '\0';
	for (i = 0; i < n && o + 16 < size; i++)
		o += (size_t) snprintf(buf + o, size - o, "%s%d", i ? " " : "", ids[i]);
	if (i < n)
		snprintf(buf + o, size - o, " ...");
}

/* ---- tokenizers under test -------------------------------------------- */

static g4_tokenizer *
load_fixture(g4_err *err)
{
	char		tj[4096],
				tc[4096];
	g4_tokenizer *t = NULL;

	snprintf(tj, sizeof(tj), "%s/test/fixtures/tokenizer/tokenizer.json", g4_test_srcdir());
	snprintf(tc, sizeof(tc), "%s/test/fixtures/tokenizer/tokenizer_config.json", g4_test_srcdir());
	if (g4_tok_load_json(tj, tc, &t, err) != 0)
		return NULL;
	return t;
}

/*
 * The real Gemma 3 tokenizer from ../shared, decompressed with zcat into the
 * scratch folder (the tests have no gzip reader).  *why says why it is not
 * available when NULL is returned with err->code == 0.
 */
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
	g4_tokenizer *t = NULL;

	err->code = 0;
	*why = reason;
	if (!shared)
	{
		snprintf(reason, sizeof(reason), "../shared is absent: the real Gemma 3 tokenizer is not available");
		return NULL;
	}
	snprintf(src, sizeof(src), "%s/data/gemma3-tokenizer/tokenizer.json.gz", shared);
	snprintf(srcc, sizeof(srcc), "%s/data/gemma3-tokenizer/tokenizer_config.json.gz", shared);
	if (!g4_is_file(src))
	{
		snprintf(reason, sizeof(reason), "%s is missing", src);
		return NULL;
	}
	if (system("command -v zcat >/dev/null 2>&1") != 0)
	{
		snprintf(reason, sizeof(reason), "zcat is not installed: cannot unpack %s", src);
		return NULL;
	}
	snprintf(dst, sizeof(dst), "%s/gemma3-tokenizer.json", g4_test_tmpdir());
	snprintf(dstc, sizeof(dstc), "%s/gemma3-tokenizer_config.json", g4_test_tmpdir());
	snprintf(cmd, sizeof(cmd), "zcat '%s' > '%s' && zcat '%s' > '%s'", src, dst, srcc, dstc);
	if (system(cmd) != 0)
	{
		snprintf(reason, sizeof(reason), "zcat failed on %s", src);
		return NULL;
	}
	if (g4_tok_load_json(dst, dstc, &t, err) != 0)
		return NULL;
	return t;
}

/* ---- the corpus check ------------------------------------------------- */

/*
 * Encode every corpus string and compare ids, decode, skip-special decode
 * and the streaming decoder with the golden file.  Reports the first few
 * mismatches; returns the number of failing strings.
 */
static int
check_corpus(const g4_tokenizer *t, const char *golden_name, int check_skip_decode,
			 int *n_checked)
{
	char	   *cpath = golden_path("tokenizer-corpus.txt");
	char	   *gpath = golden_path(golden_name);
	lines_file	corpus,
				gold;
	g4_buf		text = {0},
				want = {0},
				want_skip = {0},
				stream = {0};
	int32_t    *ids = NULL,
			   *exp = NULL;
	int			n = 0,
				cap = 0,
				n_exp = 0,
				cap_exp = 0,
				bad = 0,
				i,
				first = 0;
	char		sb[512],
				sb2[512],
				ib[512],
				ib2[512];

	*n_checked = 0;
	if (lines_read(cpath, &corpus) != 0 || lines_read(gpath, &gold) != 0)
	{
		g4_test_fail(__FILE__, __LINE__, "cannot read %s or %s", cpath, gpath);
		free(cpath);
		free(gpath);
		return 1;
	}
	if (gold.n > 0 && strncmp(gold.lines[0], "# add_bos ", 10) == 0)
	{
		if (atoi(gold.lines[0] + 10) != g4_tok_add_bos(t))
		{
			g4_test_fail(__FILE__, __LINE__, "%s: add_bos default %d, expected %s", golden_name,
						 g4_tok_add_bos(t), gold.lines[0] + 10);
			bad++;
		}
		first = 1;
	}
	if (gold.n - first != corpus.n)
	{
		g4_test_fail(__FILE__, __LINE__, "%s has %d lines for %d corpus strings", golden_name,
					 gold.n - first, corpus.n);
		bad++;
	}
	for (i = 0; i < corpus.n && i + first < gold.n; i++)
	{
		char	   *f0,
				   *f1,
				   *f2;
		g4_err		err;
		char	   *dec = NULL,
				   *dec_skip = NULL;
		size_t		dl = 0,
					dsl = 0;
		int			ok = 1,
					k;
		g4_detok	d;

		unescape(corpus.lines[i], strlen(corpus.lines[i]), &text);
		if (split3(gold.lines[i + first], &f0, &f1, &f2) != 0 ||
			parse_ids(f0, &exp, &n_exp, &cap_exp) != 0)
		{
			g4_test_fail(__FILE__, __LINE__, "%s line %d is malformed", golden_name, i + first + 1);
			bad++;
			break;
		}
		if (strcmp(f1, "=") == 0)
			buf_copy(&want, &text);
		else
			unescape(f1, strlen(f1), &want);
		if (strcmp(f2, "=") == 0)
			buf_copy(&want_skip, &want);
		else
			unescape(f2, strlen(f2), &want_skip);

		n = 0;
		if (g4_tok_encode(t, text.data, text.len, 0, &ids, &n, &cap, &err) != 0)
		{
			if (bad < 5)
				g4_test_fail(__FILE__, __LINE__, "encode failed: %s", err.msg);
			bad++;
			continue;
		}
		if (!same_bytes(ids, sizeof(int32_t) * (size_t) n, exp, sizeof(int32_t) * (size_t) n_exp))
		{
			ok = 0;
			if (bad < 5)
			{
				show_ids(ids, n, ib, sizeof(ib));
				show_ids(exp, n_exp, ib2, sizeof(ib2));
				g4_test_fail(__FILE__, __LINE__, "%s string %d \"%s\": ids [%s], expected [%s]",
							 golden_name, i + 1, show(text.data, text.len, sb, sizeof(sb)), ib, ib2);
			}
		}
		/* decode the golden ids, so a decode check does not depend on encode */
		if (g4_tok_decode(t, exp, n_exp, 0, &dec, &dl, &err) != 0 ||
			g4_tok_decode(t, exp, n_exp, 1, &dec_skip, &dsl, &err) != 0)
		{
			ok = 0;
			if (bad < 5)
				g4_test_fail(__FILE__, __LINE__, "decode failed: %s", err.msg);
		}
		else
		{
			if (!same_bytes(dec, dl, want.data, want.len))
			{
				ok = 0;
				if (bad < 5)
					g4_test_fail(__FILE__, __LINE__, "%s string %d: decode \"%s\", expected \"%s\"",
								 golden_name, i + 1, show(dec, dl, sb, sizeof(sb)),
								 show(want.data, want.len, sb2, sizeof(sb2)));
			}
			if (check_skip_decode && !same_bytes(dec_skip, dsl, want_skip.data, want_skip.len))
			{
				ok = 0;
				if (bad < 5)
					g4_test_fail(__FILE__, __LINE__, "%s string %d: skip-special decode \"%s\", expected \"%s\"",
								 golden_name, i + 1, show(dec_skip, dsl, sb, sizeof(sb)),
								 show(want_skip.data, want_skip.len, sb2, sizeof(sb2)));
			}
			/* streaming, one id at a time, equals the whole decode */
			stream.len = 0;
			g4_detok_init(&d, t, 0);
			for (k = 0; k < n_exp; k++)
				g4_detok_push(&d, exp[k], &stream);
			g4_detok_finish(&d, &stream);
			if (!same_bytes(stream.data, stream.len, dec, dl))
			{
				ok = 0;
				if (bad < 5)
					g4_test_fail(__FILE__, __LINE__, "%s string %d: streamed \"%s\" differs from decode",
								 golden_name, i + 1, show(stream.data, stream.len, sb, sizeof(sb)));
			}
		}
		free(dec);
		free(dec_skip);
		if (!ok)
			bad++;
		(*n_checked)++;
	}
	free(ids);
	free(exp);
	g4_buf_free(&text);
	g4_buf_free(&want);
	g4_buf_free(&want_skip);
	g4_buf_free(&stream);
	lines_free(&corpus);
	lines_free(&gold);
	free(cpath);
	free(gpath);
	return bad;
}

/* Decode random id sequences (tokenizer-decode-*.tsv), whole and streamed. */
static int
check_decodes(const g4_tokenizer *t, const char *golden_name)
{
	char	   *gpath = golden_path(golden_name);
	lines_file	gold;
	g4_buf		want = {0},
				want_skip = {0},
				stream = {0};
	int32_t    *ids = NULL;
	int			n = 0,
				cap = 0,
				bad = 0,
				i,
				k,
				skip;
	char		sb[512],
				sb2[512];

	if (lines_read(gpath, &gold) != 0)
	{
		g4_test_fail(__FILE__, __LINE__, "cannot read %s", gpath);
		free(gpath);
		return 1;
	}
	for (i = 0; i < gold.n; i++)
	{
		char	   *f0,
				   *f1,
				   *f2;

		if (split3(gold.lines[i], &f0, &f1, &f2) != 0 || parse_ids(f0, &ids, &n, &cap) != 0)
		{
			g4_test_fail(__FILE__, __LINE__, "%s line %d is malformed", golden_name, i + 1);
			bad++;
			break;
		}
		unescape(f1, strlen(f1), &want);
		if (strcmp(f2, "=") == 0)
			buf_copy(&want_skip, &want);
		else
			unescape(f2, strlen(f2), &want_skip);
		for (skip = 0; skip <= 1; skip++)
		{
			const g4_buf *w = skip ? &want_skip : &want;
			char	   *dec = NULL;
			size_t		dl = 0;
			g4_err		err;
			g4_detok	d;

			if (g4_tok_decode(t, ids, n, skip, &dec, &dl, &err) != 0)
			{
				g4_test_fail(__FILE__, __LINE__, "decode failed: %s", err.msg);
				bad++;
				continue;
			}
			if (!same_bytes(dec, dl, w->data, w->len))
			{
				if (bad < 5)
					g4_test_fail(__FILE__, __LINE__, "%s line %d (skip %d): \"%s\", expected \"%s\"",
								 golden_name, i + 1, skip, show(dec, dl, sb, sizeof(sb)),
								 show(w->data, w->len, sb2, sizeof(sb2)));
				bad++;
			}
			stream.len = 0;
			g4_detok_init(&d, t, skip);
			for (k = 0; k < n; k++)
				g4_detok_push(&d, ids[k], &stream);
			g4_detok_finish(&d, &stream);
			if (!same_bytes(stream.data, stream.len, dec, dl))
			{
				if (bad < 5)
					g4_test_fail(__FILE__, __LINE__, "%s line %d (skip %d): streamed \"%s\" differs from decode \"%s\"",
								 golden_name, i + 1, skip, show(stream.data, stream.len, sb, sizeof(sb)),
								 show(dec, dl, sb2, sizeof(sb2)));
				bad++;
			}
			free(dec);
		}
	}
	free(ids);
	g4_buf_free(&want);
	g4_buf_free(&want_skip);
	g4_buf_free(&stream);
	lines_free(&gold);
	free(gpath);
	return bad;
}

/* ---- tests ------------------------------------------------------------ */

G4_TEST(tokenizer_fixture_corpus)
{
	g4_err		err;
	g4_tokenizer *t = load_fixture(&err);
	int			bad,
				n;

	CHECK_MSG(t != NULL, "loading the fixture tokenizer: %s", err.msg);
	CHECK_INT(g4_tok_vocab_size(t), 16384);
	bad = check_corpus(t, "tokenizer-fixture.tsv", 1, &n);
	g4_tok_free(t);
	CHECK_MSG(bad == 0, "%d of %d corpus strings differ from the goldens", bad, n);
	CHECK(n >= 10000);
}

G4_TEST(tokenizer_fixture_decode)
{
	g4_err		err;
	g4_tokenizer *t = load_fixture(&err);
	int			bad;

	CHECK_MSG(t != NULL, "loading the fixture tokenizer: %s", err.msg);
	bad = check_decodes(t, "tokenizer-decode-fixture.tsv");
	g4_tok_free(t);
	CHECK_MSG(bad == 0, "%d decodes differ from the goldens", bad);
}

G4_TEST(tokenizer_gemma3_corpus)
{
	g4_err		err;
	const char *why;
	g4_tokenizer *t = load_gemma3(&err, &why);
	int			bad,
				n;

	if (!t && err.code == 0)
		G4_SKIP(why);
	CHECK_MSG(t != NULL, "loading the Gemma 3 tokenizer: %s", err.msg);
	CHECK_INT(g4_tok_vocab_size(t), 262145);
	CHECK_INT(g4_tok_bos(t), 2);
	CHECK_INT(g4_tok_eos(t), 106);	/* tokenizer_config's eos_token, <end_of_turn> */
	CHECK_INT(g4_tok_pad(t), 0);
	bad = check_corpus(t, "tokenizer-gemma3.tsv", 1, &n);
	g4_tok_free(t);
	CHECK_MSG(bad == 0, "%d of %d corpus strings differ from the goldens", bad, n);
	CHECK(n >= 10000);
}

G4_TEST(tokenizer_gemma3_decode)
{
	g4_err		err;
	const char *why;
	g4_tokenizer *t = load_gemma3(&err, &why);
	int			bad;

	if (!t && err.code == 0)
		G4_SKIP(why);
	CHECK_MSG(t != NULL, "loading the Gemma 3 tokenizer: %s", err.msg);
	bad = check_decodes(t, "tokenizer-decode-gemma3.tsv");
	g4_tok_free(t);
	CHECK_MSG(bad == 0, "%d decodes differ from the goldens", bad);
}

/* Encode a string with the fixture and compare with expected token texts. */
static int
pieces_are(const g4_tokenizer *t, const char *text, const char *const *want, int n_want,
		   char *msg, size_t msize)
{
	int32_t    *ids = NULL;
	int			n = 0,
				cap = 0,
				i,
				ok = 1;
	g4_err		err;

	msg[0] = '\0';
	if (g4_tok_encode(t, text, strlen(text), 0, &ids, &n, &cap, &err) != 0)
	{
		snprintf(msg, msize, "encode failed: %.900s", err.msg);
		return 0;
	}
	if (n != n_want)
		ok = 0;
	for (i = 0; ok && i < n; i++)
	{
		size_t		len;
		const char *p = g4_tok_piece(t, ids[i], &len);

		if (!p || len != strlen(want[i]) || memcmp(p, want[i], len) != 0)
			ok = 0;
	}
	if (!ok)
	{
		size_t		o = 0;

		o += (size_t) snprintf(msg + o, msize - o, "\"%s\" gave", text);
		for (i = 0; i < n && o + 64 < msize; i++)
		{
			size_t		len;
			const char *p = g4_tok_piece(t, ids[i], &len);

			o += (size_t) snprintf(msg + o, msize - o, " [%.*s]", (int) len, p ? p : "?");
		}
	}
	free(ids);
	return ok;
}

G4_TEST(tokenizer_special_tokens)
{
	g4_err		err;
	g4_tokenizer *t = load_fixture(&err);
	char		msg[1024];
	int32_t    *ids = NULL;
	int			n = 0,
				cap = 0;

	CHECK_MSG(t != NULL, "loading the fixture tokenizer: %s", err.msg);
	/* the fixture's id layout */
	CHECK_INT(g4_tok_id(t, "<pad>"), 0);
	CHECK_INT(g4_tok_id(t, "<eos>"), 1);
	CHECK_INT(g4_tok_id(t, "<bos>"), 2);
	CHECK_INT(g4_tok_id(t, "<unk>"), 3);
	CHECK_INT(g4_tok_id(t, "<mask>"), 4);
	CHECK_INT(g4_tok_bos(t), 2);
	CHECK_INT(g4_tok_eos(t), 1);
	CHECK_INT(g4_tok_pad(t), 0);
	CHECK_INT(g4_tok_add_bos(t), 0);
	CHECK(g4_tok_id(t, "<|turn>") > 4);
	CHECK(g4_tok_is_special(t, g4_tok_id(t, "<|turn>")));
	CHECK(!g4_tok_is_special(t, g4_tok_id(t, "\n")));
	CHECK_INT(g4_tok_id(t, "no such token"), -1);

	{
		const char *w[] = {"<|turn>", "user", "\n", "Hello", "<turn|>", "\n"};

		CHECK_MSG(pieces_are(t, "<|turn>user\nHello<turn|>\n", w, 6, msg, sizeof(msg)), "%s", msg);
	}
	{
		/* longest match: "\n\n\n" is one added token, never split */
		const char *w[] = {"a", "\n\n\n", "b"};

		CHECK_MSG(pieces_are(t, "a\n\n\nb", w, 3, msg, sizeof(msg)), "%s", msg);
	}
	{
		/* an almost-special string is ordinary text */
		const char *w[] = {"<", "|", "turn"};

		CHECK_MSG(pieces_are(t, "<|turn", w, 3, msg, sizeof(msg)), "%s", msg);
	}

	/* add_bos prepends BOS; encode appends to what is there */
	CHECK_OK(g4_tok_encode(t, "Hi", 2, 1, &ids, &n, &cap, &err), &err);
	CHECK_INT(ids[0], 2);
	CHECK_OK(g4_tok_encode(t, "", 0, 1, &ids, &n, &cap, &err), &err);
	CHECK_INT(ids[n - 1], 2);
	free(ids);
	g4_tok_free(t);
}

G4_TEST(tokenizer_byte_fallback)
{
	g4_err		err;
	g4_tokenizer *t = load_fixture(&err);
	int32_t    *ids = NULL;
	int			n = 0,
				cap = 0,
				i;
	char	   *text = NULL;
	size_t		len;
	const char *cjk = "\xE4\xB8\xAD";	/* U+4E2D, absent from the fixture */
	g4_buf		out = {0};
	g4_detok	d;

	CHECK_MSG(t != NULL, "loading the fixture tokenizer: %s", err.msg);
	CHECK_OK(g4_tok_encode(t, cjk, 3, 0, &ids, &n, &cap, &err), &err);
	CHECK_INT(n, 3);
	for (i = 0; i < 3; i++)
	{
		char		name[8];

		snprintf(name, sizeof(name), "<0x%02X>", (unsigned char) cjk[i]);
		CHECK_INT(ids[i], g4_tok_id(t, name));
	}
	CHECK_OK(g4_tok_decode(t, ids, n, 0, &text, &len, &err), &err);
	CHECK_STR(text, cjk);
	free(text);

	/* streaming: nothing until the character is complete */
	g4_detok_init(&d, t, 0);
	CHECK_OK(g4_detok_push(&d, ids[0], &out), &err);
	CHECK_INT(out.len, 0);
	CHECK_OK(g4_detok_push(&d, ids[1], &out), &err);
	CHECK_INT(out.len, 0);
	CHECK_OK(g4_detok_push(&d, ids[2], &out), &err);
	CHECK_OK(g4_detok_push(&d, g4_tok_id(t, "a"), &out), &err);
	CHECK_OK(g4_detok_finish(&d, &out), &err);
	CHECK_INT(out.len, 4);
	CHECK(memcmp(out.data, "\xE4\xB8\xAD" "a", 4) == 0);

	/* a cut character at the end becomes one U+FFFD per byte */
	out.len = 0;
	g4_detok_init(&d, t, 0);
	CHECK_OK(g4_detok_push(&d, ids[0], &out), &err);
	CHECK_OK(g4_detok_push(&d, ids[1], &out), &err);
	CHECK_OK(g4_detok_finish(&d, &out), &err);
	CHECK_INT(out.len, 6);
	CHECK(memcmp(out.data, "\xEF\xBF\xBD\xEF\xBF\xBD", 6) == 0);

	/* a run that turns invalid spoils the valid character before it too
	 * (the reference decodes the whole run or none of it) */
	{
		int32_t		spoilt[4];

		spoilt[0] = g4_tok_id(t, "<0xE4>");
		spoilt[1] = g4_tok_id(t, "<0xB8>");
		spoilt[2] = g4_tok_id(t, "<0xAD>");
		spoilt[3] = g4_tok_id(t, "<0xFF>");
		CHECK_OK(g4_tok_decode(t, spoilt, 4, 0, &text, &len, &err), &err);
		CHECK_INT(len, 12);
		CHECK(memcmp(text, "\xEF\xBF\xBD", 3) == 0);
		free(text);
	}

	/* a long valid run (spills past the inline buffer) streams intact */
	{
		int32_t		run[40];
		const char *emoji = "\xF0\x9F\x98\x80";	/* 4 bytes, 10 times */

		for (i = 0; i < 40; i++)
		{
			char		name[8];

			snprintf(name, sizeof(name), "<0x%02X>", (unsigned char) emoji[i % 4]);
			run[i] = g4_tok_id(t, name);
		}
		out.len = 0;
		g4_detok_init(&d, t, 0);
		for (i = 0; i < 40; i++)
			CHECK_OK(g4_detok_push(&d, run[i], &out), &err);
		CHECK_INT(out.len, 0);
		CHECK_OK(g4_detok_finish(&d, &out), &err);
		CHECK_INT(out.len, 40);
		/* abandoned half way: g4_detok_free releases the spill */
		g4_detok_init(&d, t, 0);
		for (i = 0; i < 30; i++)
			CHECK_OK(g4_detok_push(&d, run[i], &out), &err);
		g4_detok_free(&d);
	}
	g4_buf_free(&out);
	free(ids);
	g4_tok_free(t);
}

G4_TEST(tokenizer_bad_files)
{
	g4_err		err;
	g4_tokenizer *t = NULL;
	char		path[4096];
	FILE	   *f;

	CHECK(g4_tok_load_json("/nonexistent/tokenizer.json", NULL, &t, &err) == G4_ERR_IO);
	CHECK(strstr(err.msg, "/nonexistent/tokenizer.json") != NULL);

	snprintf(path, sizeof(path), "%s/bad-tokenizer.json", g4_test_tmpdir());
	f = fopen(path, "w");
	CHECK(f != NULL);
	fputs("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", f);
	fclose(f);
	CHECK(g4_tok_load_json(path, NULL, &t, &err) == G4_ERR_UNSUPPORTED);
	CHECK(strstr(err.msg, "Unigram") != NULL);

	f = fopen(path, "w");
	CHECK(f != NULL);
	fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, "
		  "\"merges\": [\"a b\"]}}", f);
	fclose(f);
	CHECK(g4_tok_load_json(path, NULL, &t, &err) == G4_ERR_FORMAT);
	CHECK(strstr(err.msg, "merges[0]") != NULL);

	/* a BOS id past the vocabulary, from the post-processor */
	f = fopen(path, "w");
	CHECK(f != NULL);
	fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": []}, "
		  "\"post_processor\": {\"type\": \"TemplateProcessing\", "
		  "\"single\": [{\"SpecialToken\": {\"id\": \"<bos>\"}}, {\"Sequence\": {\"id\": \"A\"}}], "
		  "\"special_tokens\": {\"<bos>\": {\"ids\": [5]}}}}", f);
	fclose(f);
	CHECK(g4_tok_load_json(path, NULL, &t, &err) == G4_ERR_FORMAT);
	CHECK_MSG(strstr(err.msg, "outside the vocabulary") != NULL, "%s", err.msg);
	unlink(path);
}

/*
 * Added-token flags the Gemma files do not use (lstrip, rstrip, single_word,
 * normalized): tokenizer-flags.tsv starts with a JSON array of added tokens,
 * spliced in front of the fixture's added_tokens, then string/ids lines.
 */
G4_TEST(tokenizer_added_token_flags)
{
	char		src[4096],
				dst[4096];
	char	   *gpath = golden_path("tokenizer-flags.tsv");
	char	   *fixture = NULL;
	size_t		flen;
	lines_file	gold;
	g4_err		err;
	g4_tokenizer *t = NULL;
	const char *at;
	FILE	   *f;
	g4_buf		text = {0};
	int32_t    *ids = NULL,
			   *exp = NULL;
	int			n = 0,
				cap = 0,
				n_exp = 0,
				cap_exp = 0,
				i,
				bad = 0;
	size_t		alen;
	char		ib[512],
				ib2[512],
				sb[256];

	snprintf(src, sizeof(src), "%s/test/fixtures/tokenizer/tokenizer.json", g4_test_srcdir());
	snprintf(dst, sizeof(dst), "%s/flags-tokenizer.json", g4_test_tmpdir());
	CHECK_MSG(lines_read(gpath, &gold) == 0 && gold.n > 1, "cannot read %s", gpath);
	free(gpath);
	CHECK_OK(g4_read_file(src, &fixture, &flen, &err), &err);
	at = strstr(fixture, "\"added_tokens\":[");
	CHECK(at != NULL);
	at += strlen("\"added_tokens\":[");
	alen = strlen(gold.lines[0]);
	CHECK(alen > 2 && gold.lines[0][0] == '[' && gold.lines[0][alen - 1] == ']');
	f = fopen(dst, "w");
	CHECK(f != NULL);
	fwrite(fixture, 1, (size_t) (at - fixture), f);
	fwrite(gold.lines[0] + 1, 1, alen - 2, f);
	fputc(',', f);
	fwrite(at, 1, flen - (size_t) (at - fixture), f);
	fclose(f);
	free(fixture);
	CHECK_OK(g4_tok_load_json(dst, NULL, &t, &err), &err);
	unlink(dst);

	for (i = 1; i < gold.n; i++)
	{
		char	   *tab = strchr(gold.lines[i], '\t');

		if (!tab)
		{
			bad++;
			break;
		}
		unescape(gold.lines[i], (size_t) (tab - gold.lines[i]), &text);
		if (parse_ids(tab + 1, &exp, &n_exp, &cap_exp) != 0)
		{
			bad++;
			break;
		}
		n = 0;
		if (g4_tok_encode(t, text.data, text.len, 0, &ids, &n, &cap, &err) != 0 ||
			!same_bytes(ids, sizeof(int32_t) * (size_t) n, exp, sizeof(int32_t) * (size_t) n_exp))
		{
			show_ids(ids, n, ib, sizeof(ib));
			show_ids(exp, n_exp, ib2, sizeof(ib2));
			g4_test_fail(__FILE__, __LINE__, "\"%s\": ids [%s], expected [%s]",
						 show(text.data, text.len, sb, sizeof(sb)), ib, ib2);
			bad++;
		}
	}
	free(ids);
	free(exp);
	g4_buf_free(&text);
	lines_free(&gold);
	g4_tok_free(t);
	CHECK_MSG(bad == 0, "%d flag cases differ", bad);
}

/* ---- GGUF vocabulary -------------------------------------------------- */

G4_TEST(tokenizer_gguf_vocabulary)
{
	const char *path = getenv("G4_GGUF_MODEL");
	g4_gguf    *g = NULL;
	g4_tokenizer *t = NULL;
	g4_err		err;
	int			bad,
				n;

	if (!path || !path[0])
		G4_SKIP("G4_GGUF_MODEL is not set (a Gemma 3 GGUF, e.g. gemma-3-270m-q4_k_m.gguf)");
	if (!g4_is_file(path))
		G4_SKIP("G4_GGUF_MODEL names a file that does not exist");
	CHECK_OK(g4_gguf_open(path, &g, &err), &err);
	if (g4_tok_load_gguf(g, &t, &err) != 0)
	{
		g4_gguf_close(g);
		CHECK_MSG(0, "g4_tok_load_gguf: %s", err.msg);
	}
	g4_gguf_close(g);			/* the tokenizer keeps copies */
	CHECK_INT(g4_tok_vocab_size(t), 262144);
	CHECK_INT(g4_tok_bos(t), 2);
	CHECK_INT(g4_tok_eos(t), 1);
	CHECK_INT(g4_tok_pad(t), 0);
	CHECK_INT(g4_tok_add_bos(t), 1);
	CHECK_INT(g4_tok_id(t, "<start_of_turn>"), 105);
	CHECK(g4_tok_is_special(t, 105));

	/*
	 * The same ids as the Hugging Face tokenizer.json on the whole corpus;
	 * decodes compared without skipping specials (GGUF token types mark
	 * <mask> and <unusedN> as control tokens, which tokenizer.json does
	 * not count as special, and <start_of_image> the other way round).
	 */
	bad = check_corpus(t, "tokenizer-gemma3.tsv", 0, &n);
	g4_tok_free(t);
	CHECK_MSG(bad == 0, "%d of %d corpus strings differ from the Hugging Face goldens", bad, n);
	CHECK(n >= 10000);
}

/* ---- special tokens as plain text ------------------------------------- */

/*
 * Every special token of a tokenizer, between two letters, encoded as data
 * (g4_tok_encode_plain over the whole text): no special id comes out, and
 * the ids decode to the text itself; encoded normally, the token is found.
 * Returns the number of tokens that failed.
 */
static int
check_specials_plain(const g4_tokenizer *t, int *n_special)
{
	int			bad = 0;
	int			id;
	int32_t    *ids = NULL;
	int			cap = 0;
	g4_buf		text = {0};
	g4_err		err;

	*n_special = 0;
	for (id = 0; id < g4_tok_vocab_size(t); id++)
	{
		size_t		len;
		const char *piece;
		g4_tok_span all;
		int			n = 0,
					k,
					found = 0,
					leaked = 0;
		char	   *dec = NULL;
		size_t		dl = 0;

		if (!g4_tok_is_special(t, id) || !(piece = g4_tok_piece(t, id, &len)) || len == 0)
			continue;
		(*n_special)++;
		text.len = 0;
		if (g4_buf_puts(&text, "a") || g4_buf_append(&text, piece, len) || g4_buf_puts(&text, "b"))
			return -1;
		all.off = 0;
		all.len = text.len;
		if (g4_tok_encode_plain(t, text.data, text.len, 0, &all, 1, NULL, &ids, &n, &cap, &err) != 0 ||
			g4_tok_decode(t, ids, n, 0, &dec, &dl, &err) != 0)
		{
			bad++;
			continue;
		}
		for (k = 0; k < n; k++)
			leaked |= g4_tok_is_special(t, ids[k]);
		if (leaked || !same_bytes(dec, dl, text.data, text.len))
		{
			if (bad < 5)
				g4_test_fail(__FILE__, __LINE__, "special token %d \"%.*s\" as data: %s", id, (int) len, piece,
							 leaked ? "a special id came out" : "the ids do not decode to the text");
			bad++;
		}
		free(dec);
		n = 0;
		if (g4_tok_encode(t, text.data, text.len, 0, &ids, &n, &cap, &err) != 0)
			bad++;
		for (k = 0; k < n; k++)
			found |= ids[k] == id;
		if (!found)
		{
			if (bad < 5)
				g4_test_fail(__FILE__, __LINE__, "special token %d \"%.*s\" is not found as a control token",
							 id, (int) len, piece);
			bad++;
		}
	}
	free(ids);
	g4_buf_free(&text);
	return bad;
}

G4_TEST(tokenizer_specials_as_text_gemma4)
{
	g4_err		err;
	g4_tokenizer *t = load_fixture(&err);
	int			n,
				bad;

	CHECK_MSG(t != NULL, "fixture tokenizer: %s", err.msg);
	bad = check_specials_plain(t, &n);
	g4_tok_free(t);
	CHECK_MSG(bad == 0, "%d of %d special tokens leak through as control tokens", bad, n);
	CHECK_INT(n, 24);
}

G4_TEST(tokenizer_specials_as_text_gemma3)
{
	const char *path = getenv("G4_GGUF_MODEL");
	const char *why = NULL;
	g4_gguf    *g = NULL;
	g4_tokenizer *t;
	g4_err		err;
	int			n,
				bad;

	/* the tokenizer.json when present, else the GGUF vocabulary */
	t = load_gemma3(&err, &why);
	if (!t)
	{
		if (!path || !path[0] || !g4_is_file(path))
			G4_SKIP("neither ../shared nor G4_GGUF_MODEL: no Gemma 3 tokenizer");
		CHECK_OK(g4_gguf_open(path, &g, &err), &err);
		if (g4_tok_load_gguf(g, &t, &err) != 0)
			t = NULL;
		g4_gguf_close(g);
		CHECK_MSG(t != NULL, "g4_tok_load_gguf: %s", err.msg);
	}
	/* the chat format's control tokens are among them */
	CHECK(g4_tok_is_special(t, g4_tok_id(t, "<start_of_turn>")));
	CHECK(g4_tok_is_special(t, g4_tok_id(t, "<end_of_turn>")));
	bad = check_specials_plain(t, &n);
	g4_tok_free(t);
	CHECK_MSG(bad == 0, "%d of %d special tokens leak through as control tokens", bad, n);
	CHECK(n >= 5);
}
