/*
 * dry_steps.h — the engine's largest steps, run through the backend dry
 * before the KV pool is sized (backend.h: dry_run).
 *
 * A backend keeps buffers that grow with a step's shape: its scratch, the
 * bf16 copies of the int4 weights a prefill multiplies on cuBLASLt, the
 * k_eq_v key and value rows, the sampler's partial results.  Grown while
 * serving, they would take memory the pool was given, and a growth that
 * fails fails every live request.  So g4_open runs the shapes below with
 * the backend dry, which grows what they need and launches nothing, and
 * only then gives the pool what the memory target leaves.
 */
#ifndef G4_DRY_STEPS_H
#define G4_DRY_STEPS_H

#include "backend.h"

/* `seqs` sequences of `tokens` consecutive tokens each, the last at
 * position end - 1; the last `logits` tokens of each want logits. */
typedef struct
{
	int			seqs;
	int			tokens;
	int			end;
	int			logits;
} g4_dry_part;

#define G4_DRY_PARTS 2

typedef struct
{
	const char *what;
	g4_dry_part part[G4_DRY_PARTS];	/* unused parts have seqs 0 */
} g4_dry_step;

/*
 * The step shapes at the engine's limits: a chunk of max_num_batched_tokens
 * from the start and at the window's end, chunks of many prompts, a chunk
 * beside every other slot decoding; and decoding and verifying at the
 * window's end for every number of sequences, since what a backend splits
 * a step's work into need not grow with the step (a step of 7 sequences
 * may take more partial results than one of 8).  Writes at most cap of
 * them to out (NULL: none); returns how many there are.
 */
int			g4_dry_step_shapes(const g4_engine *e, g4_dry_step *out, int cap);

/* A step's metadata arrays, sized for the engine's limits. */
typedef struct
{
	int32_t    *token,
			   *pos,
			   *slot,
			   *lo[G4_KVG_COUNT],
			   *hi[G4_KVG_COUNT],
			   *logit_rows;
} g4_dry_meta;

int			g4_dry_meta_alloc(const g4_engine *e, g4_dry_meta *b);
void		g4_dry_meta_free(g4_dry_meta *b);
/* The metadata of one shape: sequence i in slot i, the visible ranges the
 * scheduler gives a text prompt, token 0 everywhere. */
void		g4_dry_step_meta(const g4_engine *e, const g4_dry_step *st, g4_dry_meta *b,
							 g4_step_meta *meta);

/* Run every shape, a draft round for every number of drafting sequences
 * and the sampler at every number of rows through a backend that has
 * dry_run; nothing for one that has not. */
int			g4_dry_steps(g4_engine *e, g4_err *err);

#endif
