/*
 * bench_tokenizer.c — tokenizer throughput on one core: encode MB/s and
 * tokens/s of English text (as one long piece, and in 1 KiB prompts), and
 * decode tokens/s.  A benchmark, not a test: it prints numbers and checks
 * only that decode(encode(text)) gives the text back.
 *
 *   bench_tokenizer [tokenizer.json [tokenizer_config.json]] [-mb N]
 *
 * Without arguments it uses the fixture tokenizer under $G4_TEST_SRCDIR
 * (default "."); pass an unpacked Gemma tokenizer.json to measure the real
 * 262k vocabulary.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"
#include "util.h"
#include "xorshift.h"

static const char *const sentences[] = {
	"The committee met on Tuesday to discuss the budget for the coming year.",
	"She opened the window and listened to the rain falling on the old roof.",
	"Most of the data was stored in a relational database running on a single server.",
	"After the war, the town slowly rebuilt its bridges, schools and markets.",
	"He said that the results were encouraging, but more work would be needed.",
	"Researchers measured the temperature every hour for three consecutive weeks.",
	"The library is open from nine in the morning until eight in the evening.",
	"In 1998, the company moved its headquarters to a larger building downtown.",
	"Please make sure that every request is logged before it is processed.",
	"The children laughed as the dog chased its own tail around the garden.",
	"Economic growth depends on investment, education and stable institutions.",
	"Our hypothesis was that smaller models would generalize less well.",
	"The river flows north for about two hundred miles before reaching the sea.",
	"If the query returns no rows, the function raises an exception.",
	"They walked along the beach, talking about books, music and old friends.",
	"A new version of the software will be released early next month.",
};

/* Deterministic pseudo-English text of about n bytes. */
static char *
make_text(size_t n, size_t *len)
{
	char	   *s = malloc(n + 256);
	size_t		o = 0;
	uint64_t	x = 88172645463325252ull;

	if (!s)
		return NULL;
	while (o < n)
	{
		const char *p;
		size_t		l;

		p = sentences[h_xorshift64(&x) % G4_ARRAY_LEN(sentences)];
		l = strlen(p);
		memcpy(s + o, p, l);
		o += l;
		s[o++] = (x >> 20) % 7 == 0 ? '\n' : ' ';
	}
	s[o] = '\0';
	*len = o;
	return s;
}

int
main(int argc, char **argv)
{
	const char *tj = NULL,
			   *tc = NULL;
	char		defj[4096],
				defc[4096];
	double		mb = 4.0,
				t0,
				dt;
	g4_tokenizer *t = NULL;
	g4_err		err;
	char	   *text,
			   *dec = NULL;
	size_t		len,
				dl,
				off;
	int32_t    *ids = NULL;
	int			n = 0,
				cap = 0,
				i,
				reps;

	for (i = 1; i < argc; i++)
	{
		if (strcmp(argv[i], "-mb") == 0 && i + 1 < argc)
			mb = atof(argv[++i]);
		else if (!tj)
			tj = argv[i];
		else
			tc = argv[i];
	}
	if (!tj)
	{
		const char *src = getenv("G4_TEST_SRCDIR");

		snprintf(defj, sizeof(defj), "%s/test/fixtures/tokenizer/tokenizer.json", src ? src : ".");
		snprintf(defc, sizeof(defc), "%s/test/fixtures/tokenizer/tokenizer_config.json", src ? src : ".");
		tj = defj;
		tc = defc;
	}
	t0 = g4_now();
	if (g4_tok_load_json(tj, tc, &t, &err) != 0)
	{
		fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
		return 1;
	}
	printf("tokenizer %s: %d ids, loaded in %.3f s\n", tj, g4_tok_vocab_size(t), g4_now() - t0);

	text = make_text((size_t) (mb * 1e6), &len);
	if (!text)
	{
		fprintf(stderr, "bench_tokenizer: out of memory\n");
		return 1;
	}

	/* the whole text as one piece (no added tokens in it) */
	t0 = g4_now();
	if (g4_tok_encode(t, text, len, 0, &ids, &n, &cap, &err) != 0)
	{
		fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
		return 1;
	}
	dt = g4_now() - t0;
	printf("encode, one %.1f MB piece: %.2f MB/s, %.0f tokens/s (%d tokens, %.2f bytes/token)\n",
		   len / 1e6, len / 1e6 / dt, n / dt, n, (double) len / n);

	/* decode it back */
	t0 = g4_now();
	if (g4_tok_decode(t, ids, n, 0, &dec, &dl, &err) != 0)
	{
		fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
		return 1;
	}
	dt = g4_now() - t0;
	printf("decode: %.0f tokens/s, %.2f MB/s\n", n / dt, dl / 1e6 / dt);
	if (dl != len || memcmp(dec, text, len) != 0)
	{
		fprintf(stderr, "bench_tokenizer: decode(encode(text)) != text\n");
		return 1;
	}
	free(dec);

	/* 1 KiB prompts */
	reps = 0;
	n = 0;
	t0 = g4_now();
	for (off = 0; off + 1024 <= len; off += 1024, reps++)
	{
		n = 0;
		if (g4_tok_encode(t, text + off, 1024, 1, &ids, &n, &cap, &err) != 0)
		{
			fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
			return 1;
		}
	}
	dt = g4_now() - t0;
	printf("encode, %d prompts of 1 KiB: %.2f MB/s, %.0f prompts/s\n",
		   reps, reps * 1024 / 1e6 / dt, reps / dt);

	free(ids);
	free(text);
	g4_tok_free(t);
	return 0;
}
