/*
 * quality.h — gemma4-run's quality measurements over real text, all built on
 * g4_score (teacher forcing):
 *
 *   perplexity   llama-perplexity's convention: the text is tokenised
 *                without BOS and cut into windows of ctx tokens whose first
 *                token is replaced by BOS; with stride = ctx (the default)
 *                windows do not overlap and the targets of the second half
 *                of each window are scored (ctx/2 - 1 per window); with a
 *                smaller stride windows start every stride tokens and the
 *                last stride targets of each are scored.  PPL = exp(mean
 *                NLL), its standard error exp(mean) * sd(NLL) / sqrt(N - 1).
 *   KL base      with f32 KV, the log-probabilities of every scored position
 *                are written to a file; with another KV dtype they are read
 *                back: mean KL(base || this), its 99th percentile and the
 *                share of positions whose most likely token agrees.
 *   needle       facts placed at several depths of a haystack of real text,
 *                asked for at the end; a fact is retrieved when every token
 *                of its answer is the most likely one.
 */
#ifndef G4_TOOLS_QUALITY_H
#define G4_TOOLS_QUALITY_H

#include "engine.h"

typedef struct
{
	const char *text_path;		/* the corpus */
	int			ctx;			/* window, tokens */
	int			stride;			/* 0: ctx */
	int			max_windows;	/* 0: as many as the text holds */
	const char *kl_base;		/* NULL: no KL report */
	int			record_base;	/* 1: write kl_base, 0: compare against it */
	int			needle_tokens;	/* needle mode when > 0: haystack length */
	const char *depths;			/* "0.1,0.5,0.9" */
} g4_quality_opts;

/* Statistics of a list of per-position KL values, for tests too. */
typedef struct
{
	double		mean;
	double		stderr_mean;
	double		p99;			/* nearest-rank 99th percentile */
	double		top1;			/* share of agreeing positions, 0..1 */
} g4_kl_summary;

/* KL(p || q) of two logit rows (log-softmax taken in double). */
double		g4_kl_logits(const float *p_logits, const float *q_logits, int vocab);

/* Summary of n KL values (sorted in place) with n_agree agreeing top-1s. */
void		g4_kl_summarise(double *kl, long n, long n_agree, g4_kl_summary *out);

/* What a perplexity run measured (KL fields only when comparing). */
typedef struct
{
	double		ppl;
	double		ppl_stderr;
	long		targets;
	g4_kl_summary kl;
} g4_ppl_result;

/* Both print their report on stdout; 0 on success.  out may be NULL. */
int			g4_run_perplexity(g4_engine *e, const g4_quality_opts *q, g4_ppl_result *out);
int			g4_run_needle(g4_engine *e, const g4_quality_opts *q);

#endif
