/*
 * step_driver.h — runs the engine's forward pass (g4_model_forward) step by
 * step on a backend without the scheduler: the GPU tests and benchmarks
 * choose each step's tokens, positions and sequences themselves, and can
 * use the backend's optional operations (step graphs, device sampling) that the
 * engine does not call yet.
 *
 * Metadata follows schedule.c for text: sliding layers see [p - W + 1,
 * p], full layers [0, p].  KV blocks are taken from a g4_kvpool exactly as
 * the scheduler does, and the sliding window is trimmed after each step.
 */
#ifndef G4_STEP_DRIVER_H
#define G4_STEP_DRIVER_H

#include "kvpool.h"
#include "model.h"

typedef struct
{
	int			slot;
	int			start;			/* first position */
	int			count;			/* tokens */
	int			logits;			/* wants the last token's logits */
} drv_item;

typedef struct
{
	g4_model   *m;
	g4_workspace ws;
	g4_kvpool	kv;
	int			max_tokens;
	int			max_seqs;
	int			use_graphs;		/* replay whole steps when the backend can */
	int32_t    *token,
			   *pos,
			   *slot,
			   *lo[G4_KVG_COUNT],
			   *hi[G4_KVG_COUNT],
			   *logit_rows;
	int			n_logits;
	double		open_secs;
} drv;

/* Load a model on `be` with a KV pool of kv_bytes, on a device no more than
 * its memory leaves at 95 % use (kv_bytes 0: that much). */
int			drv_open(drv *d, const char *path, g4_backend *be, int kv_dtype, size_t kv_bytes, int max_seqs,
					 int max_model_len, int max_tokens, g4_err *err);
void		drv_close(drv *d);

/* Reserve KV blocks for positions [0, n) of a slot without computing them
 * (benchmarks: a full-length context of arbitrary contents), trimming the
 * sliding window as a prefill would. */
int			drv_reserve(drv *d, int slot, int n, g4_err *err);

/* Issue one step (tokens[] in item order); does not wait. */
int			drv_step(drv *d, int n_items, const drv_item *items, const int32_t *tokens, g4_err *err);

/* Wait, then copy the step's logits [n_logits][vocab] to the host. */
int			drv_logits(drv *d, float *host, g4_err *err);

/* Wait, then the greedy token of each logit row (on the device when the
 * backend samples there, else on the host). */
int			drv_argmax(drv *d, int32_t *ids, g4_err *err);

/* Free every block of a slot. */
void		drv_release(drv *d, int slot, int n_positions);

#endif
