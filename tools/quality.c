/*
 * quality.c — perplexity, KL divergence against an f32-KV base and needle
 * retrieval over real text (see quality.h for the conventions).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quality.h"
#include "util.h"

#define KL_MAGIC "G4KLBAS1"

/* log of the softmax denominator, and the first largest entry */
static double
log_sum_exp(const float *x, int n, int *argmax)
{
	double		m = x[0],
				s = 0;
	int			i,
				best = 0;

	for (i = 1; i < n; i++)
		if (x[i] > m)
		{
			m = x[i];
			best = i;
		}
	for (i = 0; i < n; i++)
		s += exp((double) x[i] - m);
	if (argmax)
		*argmax = best;
	return m + log(s);
}

double
g4_kl_logits(const float *p, const float *q, int vocab)
{
	double		lp = log_sum_exp(p, vocab, NULL);
	double		lq = log_sum_exp(q, vocab, NULL);
	double		kl = 0;
	int			i;

	for (i = 0; i < vocab; i++)
	{
		double		a = (double) p[i] - lp;

		kl += exp(a) * (a - ((double) q[i] - lq));
	}
	return kl > 0 ? kl : 0;		/* rounding can leave -1e-17 for equal rows */
}

static int
cmp_double(const void *a, const void *b)
{
	double		x = *(const double *) a,
				y = *(const double *) b;

	return x < y ? -1 : x > y;
}

void
g4_kl_summarise(double *kl, long n, long n_agree, g4_kl_summary *out)
{
	double		s = 0,
				s2 = 0;
	long		i;

	memset(out, 0, sizeof(*out));
	if (n <= 0)
		return;
	for (i = 0; i < n; i++)
	{
		s += kl[i];
		s2 += kl[i] * kl[i];
	}
	out->mean = s / (double) n;
	if (n > 1)
		out->stderr_mean = sqrt(fmax(s2 / (double) n - out->mean * out->mean, 0) / (double) (n - 1));
	qsort(kl, (size_t) n, sizeof(double), cmp_double);
	/* nearest rank: the smallest value with at least 99 % at or below it */
	out->p99 = kl[(long) ceil(0.99 * (double) n) - 1];
	out->top1 = (double) n_agree / (double) n;
}

/* ---- perplexity and KL ---------------------------------------------- */

typedef struct
{
	const int32_t *win;			/* the window's tokens */
	int			ctx;
	double		nll_sum,
				nll_sq;
	long		n;
	/* KL */
	FILE	   *base;
	int			record;
	float	   *base_row;
	double	   *kl;
	long		n_kl,
				cap_kl,
				n_agree;
	int			failed;
} ppl_state;

static void
on_logits(void *arg, int pos, const float *logits, int vocab)
{
	ppl_state  *st = arg;
	int			top;
	double		lse,
				nll;

	if (pos + 1 >= st->ctx || st->failed)
		return;
	lse = log_sum_exp(logits, vocab, &top);
	nll = lse - (double) logits[st->win[pos + 1]];
	st->nll_sum += nll;
	st->nll_sq += nll * nll;
	st->n++;
	if (!st->base)
		return;
	if (st->record)
	{
		if (fwrite(logits, sizeof(float), (size_t) vocab, st->base) != (size_t) vocab)
			st->failed = 1;
		return;
	}
	if (fread(st->base_row, sizeof(float), (size_t) vocab, st->base) != (size_t) vocab)
	{
		st->failed = 1;
		return;
	}
	if (st->n_kl == st->cap_kl)
	{
		long		cap = st->cap_kl ? st->cap_kl * 2 : 4096;
		double	   *p = realloc(st->kl, (size_t) cap * sizeof(double));

		if (!p)
		{
			st->failed = 1;
			return;
		}
		st->kl = p;
		st->cap_kl = cap;
	}
	st->kl[st->n_kl++] = g4_kl_logits(st->base_row, logits, vocab);
	{
		int			base_top;

		log_sum_exp(st->base_row, vocab, &base_top);
		st->n_agree += base_top == top;
	}
}

/* 64-bit FNV-1a of the scored material, so a base file is only ever
 * compared with a run over the same tokens and windows */
static uint64_t
fingerprint(const int32_t *tok, int n, int ctx, int stride, int vocab)
{
	uint64_t	h = 1469598103934665603ull;
	int32_t		head[3] = {ctx, stride, vocab};
	const unsigned char *p;
	size_t		i;

	p = (const unsigned char *) head;
	for (i = 0; i < sizeof(head); i++)
		h = (h ^ p[i]) * 1099511628211ull;
	p = (const unsigned char *) tok;
	for (i = 0; i < (size_t) n * sizeof(int32_t); i++)
		h = (h ^ p[i]) * 1099511628211ull;
	return h;
}

static int
tokenize_file(g4_engine *e, const char *path, int32_t **tok, int *n)
{
	size_t		len = 0;
	char	   *text = NULL;
	g4_err		err;

	if (g4_read_file(path, &text, &len, &err) != G4_OK)
	{
		fprintf(stderr, "gemma4-run: %s\n", err.msg);
		return -1;
	}
	if (g4_tokenize(e, text, len, 0, tok, n, &err) != G4_OK)
	{
		fprintf(stderr, "gemma4-run: %s\n", err.msg);
		free(text);
		return -1;
	}
	free(text);
	return 0;
}

static int
bos_id(g4_engine *e)
{
	int32_t    *ids = NULL;
	int			n = 0;
	g4_err		err;
	int			bos = -1;

	if (g4_tokenize(e, "", 0, 1, &ids, &n, &err) == G4_OK && n == 1)
		bos = ids[0];
	free(ids);
	return bos;
}

int
g4_run_perplexity(g4_engine *e, const g4_quality_opts *q, g4_ppl_result *out)
{
	g4_model_info mi;
	int32_t    *tok = NULL;
	int32_t    *win = NULL;
	int			n_tok = 0;
	int			ctx = q->ctx;
	int			stride = q->stride > 0 ? q->stride : ctx;
	int			n_windows,
				w;
	int			bos = bos_id(e);
	ppl_state	st;
	g4_err		err;
	int			rc = 1;

	g4_model_info_get(e, &mi);
	memset(&st, 0, sizeof(st));
	if (ctx < 4 || stride > ctx || stride < 1 || bos < 0)
	{
		fprintf(stderr, "gemma4-run: --ctx must be at least 4 and --stride between 1 and --ctx\n");
		return 1;
	}
	if (tokenize_file(e, q->text_path, &tok, &n_tok) != 0)
		return 1;
	n_windows = n_tok < ctx ? 0 : 1 + (n_tok - ctx) / stride;
	if (stride == ctx)
		n_windows = n_tok / ctx;
	if (q->max_windows > 0 && n_windows > q->max_windows)
		n_windows = q->max_windows;
	if (n_windows < 1)
	{
		fprintf(stderr, "gemma4-run: %s holds %d tokens, fewer than one window of %d\n", q->text_path, n_tok, ctx);
		free(tok);
		return 1;
	}
	fprintf(stderr, "perplexity: %d tokens, %d windows of %d tokens, stride %d\n", n_tok, n_windows, ctx, stride);
	win = malloc((size_t) ctx * sizeof(int32_t));
	st.base_row = malloc((size_t) mi.vocab_size * sizeof(float));
	if (!win || !st.base_row)
		goto done;
	st.win = win;
	st.ctx = ctx;
	if (q->kl_base)
	{
		uint64_t	fp = fingerprint(tok, (n_windows - 1) * stride + ctx, ctx, stride, mi.vocab_size);
		char		magic[8];
		uint64_t	got;

		st.record = q->record_base;
		st.base = fopen(q->kl_base, st.record ? "wb" : "rb");
		if (!st.base)
		{
			fprintf(stderr, "gemma4-run: cannot open %s\n", q->kl_base);
			goto done;
		}
		if (st.record)
		{
			if (fwrite(KL_MAGIC, 1, 8, st.base) != 8 || fwrite(&fp, sizeof(fp), 1, st.base) != 1)
				goto done;
		}
		else if (fread(magic, 1, 8, st.base) != 8 || memcmp(magic, KL_MAGIC, 8) != 0 ||
				 fread(&got, sizeof(got), 1, st.base) != 1 || got != fp)
		{
			fprintf(stderr, "gemma4-run: %s was not recorded for this text, model, --ctx and --stride\n",
					q->kl_base);
			goto done;
		}
	}
	for (w = 0; w < n_windows; w++)
	{
		int			first = stride == ctx ? ctx / 2 : ctx - 1 - stride;

		memcpy(win, tok + (size_t) w * stride, (size_t) ctx * sizeof(int32_t));
		win[0] = bos;
		if (g4_score(e, win, ctx - 1, first, on_logits, &st, &err) != G4_OK)
		{
			fprintf(stderr, "gemma4-run: %s\n", err.msg);
			goto done;
		}
		if (st.failed)
		{
			fprintf(stderr, "gemma4-run: reading or writing %s failed\n", q->kl_base);
			goto done;
		}
		{
			double		mean = st.nll_sum / (double) st.n;

			fprintf(stderr, "  window %d/%d: running PPL %.4f over %ld targets\n", w + 1, n_windows, exp(mean),
					st.n);
		}
	}
	{
		double		mean = st.nll_sum / (double) st.n;
		double		var = st.n > 1 ? fmax(st.nll_sq / (double) st.n - mean * mean, 0) / (double) (st.n - 1) : 0;

		printf("PPL = %.4f +/- %.4f  (%ld targets, %d windows of %d, stride %d)\n", exp(mean), exp(mean) * sqrt(var),
			   st.n, n_windows, ctx, stride);
		if (out)
		{
			memset(out, 0, sizeof(*out));
			out->ppl = exp(mean);
			out->ppl_stderr = exp(mean) * sqrt(var);
			out->targets = st.n;
		}
	}
	if (q->kl_base && st.record)
		printf("recorded the logits of %ld positions in %s\n", st.n, q->kl_base);
	else if (q->kl_base)
	{
		g4_kl_summary ks;

		g4_kl_summarise(st.kl, st.n_kl, st.n_agree, &ks);
		printf("KL vs base: mean %.6f +/- %.6f, 99th percentile %.6f; top-1 agreement %.4f %% (%ld of %ld)\n",
			   ks.mean, ks.stderr_mean, ks.p99, 100.0 * ks.top1, st.n_agree, st.n_kl);
		if (out)
			out->kl = ks;
	}
	rc = 0;
done:
	if (st.base && fclose(st.base) != 0 && rc == 0)
	{
		fprintf(stderr, "gemma4-run: writing %s failed\n", q->kl_base);
		rc = 1;
	}
	free(st.kl);
	free(st.base_row);
	free(win);
	free(tok);
	return rc;
}

/* ---- needle retrieval ------------------------------------------------ */

static const char *const needle_keys[] = {"red", "blue", "green", "yellow", "purple", "orange", "silver", "black"};
static const char *const needle_codes[] = {"48213", "90571", "36428", "71905", "25384", "83617", "59042", "14796"};
#define MAX_NEEDLES 8

typedef struct
{
	const int32_t *seq;
	int			ans_start[MAX_NEEDLES];
	int			ans_len[MAX_NEEDLES];
	int			n;
	int			ok[MAX_NEEDLES];
	double		logp[MAX_NEEDLES];
} needle_state;

static void
on_needle_logits(void *arg, int pos, const float *logits, int vocab)
{
	needle_state *st = arg;
	int			i;

	for (i = 0; i < st->n; i++)
	{
		int			target;
		int			top;
		double		lse;

		/* the logits at pos predict pos + 1 */
		if (pos + 1 < st->ans_start[i] || pos + 1 >= st->ans_start[i] + st->ans_len[i])
			continue;
		target = st->seq[pos + 1];
		lse = log_sum_exp(logits, vocab, &top);
		st->logp[i] += (double) logits[target] - lse;
		if (top != target)
			st->ok[i] = 0;
	}
}

/* Append the tokens of text to seq (capacity checked by the caller). */
static int
append_text(g4_engine *e, const char *text, int32_t *seq, int *n, int cap)
{
	int32_t    *ids = NULL;
	int			k = 0;
	g4_err		err;

	if (g4_tokenize(e, text, strlen(text), 0, &ids, &k, &err) != G4_OK || *n + k > cap)
	{
		free(ids);
		return -1;
	}
	memcpy(seq + *n, ids, (size_t) k * sizeof(int32_t));
	*n += k;
	free(ids);
	return k;
}

int
g4_run_needle(g4_engine *e, const g4_quality_opts *q)
{
	int32_t    *hay = NULL;
	int32_t    *seq = NULL;
	int			n_hay = 0;
	int			n = 0;
	int			cap;
	double		depth[MAX_NEEDLES];
	int			at[MAX_NEEDLES];
	int			n_depths = 0;
	needle_state st;
	const char *p = q->depths ? q->depths : "0.1,0.3,0.5,0.7,0.9";
	int			i,
				h;
	int			first_question;
	g4_err		err;
	int			rc = 1;
	char		line[256];

	while (*p && n_depths < MAX_NEEDLES)
	{
		char	   *end;

		depth[n_depths] = strtod(p, &end);
		if (end == p || depth[n_depths] < 0 || depth[n_depths] > 1)
		{
			fprintf(stderr, "gemma4-run: --depths takes fractions in [0, 1] separated by commas\n");
			return 1;
		}
		n_depths++;
		p = *end == ',' ? end + 1 : end;
	}
	if (tokenize_file(e, q->text_path, &hay, &n_hay) != 0)
		return 1;
	if (n_hay < q->needle_tokens)
	{
		fprintf(stderr, "gemma4-run: %s holds %d tokens, fewer than the haystack of %d\n", q->text_path, n_hay,
				q->needle_tokens);
		free(hay);
		return 1;
	}
	cap = q->needle_tokens + 64 * MAX_NEEDLES + 256;
	seq = malloc((size_t) cap * sizeof(int32_t));
	if (!seq)
		goto done;
	memset(&st, 0, sizeof(st));
	st.seq = seq;
	st.n = n_depths;
	seq[n++] = bos_id(e);
	/* the haystack with needle i placed after depth[i] of it */
	for (h = 0; h <= q->needle_tokens; h++)
	{
		int			k;

		for (k = 0; k < n_depths; k++)
			if ((int) (depth[k] * q->needle_tokens) == h)
			{
				at[k] = n;
				snprintf(line, sizeof(line), "\nThe secret code of the %s door is %s.\n", needle_keys[k],
						 needle_codes[k]);
				if (append_text(e, line, seq, &n, cap) < 0)
					goto done;
			}
		if (h < q->needle_tokens)
			seq[n++] = hay[h];
	}
	if (append_text(e, "\n\nThe secret codes of the doors mentioned above:\n", seq, &n, cap) < 0)
		goto done;
	first_question = n;
	for (i = 0; i < n_depths; i++)
	{
		int			k;

		snprintf(line, sizeof(line), "The secret code of the %s door is", needle_keys[i]);
		if (append_text(e, line, seq, &n, cap) < 0)
			goto done;
		st.ans_start[i] = n;
		snprintf(line, sizeof(line), " %s", needle_codes[i]);
		if ((k = append_text(e, line, seq, &n, cap)) < 0 || append_text(e, ".\n", seq, &n, cap) < 0)
			goto done;
		st.ans_len[i] = k;
		st.ok[i] = 1;
	}
	fprintf(stderr, "needle: %d tokens (haystack %d tokens of %s), %d facts\n", n, q->needle_tokens,
			q->text_path, n_depths);
	if (g4_score(e, seq, n, first_question, on_needle_logits, &st, &err) != G4_OK)
	{
		fprintf(stderr, "gemma4-run: %s\n", err.msg);
		goto done;
	}
	{
		int			found = 0;

		for (i = 0; i < n_depths; i++)
		{
			printf("depth %.2f (position %d): %s, log p(answer) = %.4f\n", depth[i], at[i],
				   st.ok[i] ? "retrieved" : "MISSED", st.logp[i]);
			found += st.ok[i];
		}
		printf("needle: %d of %d retrieved in %d tokens\n", found, n_depths, n);
	}
	rc = 0;
done:
	if (rc != 0 && seq)
		fprintf(stderr, "gemma4-run: building the needle prompt failed\n");
	free(seq);
	free(hay);
	return rc;
}
