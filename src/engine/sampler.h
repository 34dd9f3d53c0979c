/*
 * sampler.h — turning a row of logits into the next token on the host:
 * suppressed ids, repetition / presence / frequency penalties, temperature,
 * min-p, top-k, top-p, then a draw from a per-sequence seeded generator
 * (greedy when the temperature is 0).  The exact order and arithmetic are
 * stated with g4_row_sampling (backend.h): a device sampler makes the same
 * choice from the same draw.
 */
#ifndef G4_SAMPLER_H
#define G4_SAMPLER_H

#include <stdint.h>

#include "engine.h"

typedef struct
{
	uint64_t	s[4];			/* xoshiro256** state */
} g4_rng;

void		g4_rng_seed(g4_rng *r, uint64_t seed);
uint64_t	g4_rng_next(g4_rng *r);
double		g4_rng_uniform(g4_rng *r);	/* [0, 1) */

/* Per-sequence token statistics for penalties. */
typedef struct
{
	int			vocab;
	uint8_t    *in_prompt;		/* [vocab] 1 if the id occurs in the prompt */
	int32_t    *out_count;		/* [vocab] occurrences in the output */
} g4_token_hist;

int			g4_hist_init(g4_token_hist *h, int vocab, const int32_t *prompt, int n_prompt);
void		g4_hist_add_output(g4_token_hist *h, int32_t id);
void		g4_hist_free(g4_token_hist *h);

/* Scratch reused across calls (sorting buffers). */
typedef struct
{
	float	   *probs;
	int32_t    *idx;
	int			cap;
} g4_sampler_scratch;

void		g4_sampler_scratch_free(g4_sampler_scratch *s);

/* The index of the first largest of x[0..n), or G4_SAMPLE_NAN (backend.h)
 * when any element is NaN: the greedy choice, and the scan for the
 * largest logit that every choice starts with. */
int32_t		g4_argmax(const float *x, int n);

/* Choose the next token, or G4_SAMPLE_NAN for a row holding a NaN.  logits
 * (length vocab) is modified in place.  hist may be NULL when no penalty is
 * active. */
int32_t		g4_sample(float *logits, int vocab, const g4_sampling *p, const g4_token_hist *hist,
					  const int32_t *suppress, int n_suppress, g4_rng *rng, g4_sampler_scratch *scratch);

/* The distribution g4_sample draws from for these parameters: probs[vocab]
 * (0 outside the kept set; one-hot at the first largest logit when
 * greedy); G4_ERR_NUMERIC for a row holding a NaN.  logits is modified in
 * place; takes no draw. */
int			g4_sample_dist(float *logits, int vocab, const g4_sampling *p, const g4_token_hist *hist,
						   const int32_t *suppress, int n_suppress, g4_sampler_scratch *scratch,
						   double *probs);

/* True when the parameters need the token history. */
int			g4_sampling_needs_hist(const g4_sampling *p);

/* Validate sampling parameters; fills err with a message naming the field. */
int			g4_sampling_validate(const g4_sampling *p, g4_err *err);

#endif
