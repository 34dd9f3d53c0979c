/*
 * dry_steps.h — the engine's largest steps, run through the backend dry
 * before the KV pool is sized (backend.h: dry_run).
 *
 * A backend keeps buffers that grow with a step's shape: its scratch, the
 * bf16 copies of the int4 weights a prefill multiplies on cuBLASLt, the
 * k_eq_v key and value rows, the sampler's partial results.  Grown while
 * serving, they would take memory the pool was given, and a growth that
 * fails fails every live request.  So g4_open runs its largest steps with
 * the backend dry, which grows what they need and launches nothing, and
 * only then gives the pool what the memory target leaves.
 */
#ifndef G4_DRY_STEPS_H
#define G4_DRY_STEPS_H

#include "engine.h"

/* Run the largest steps (dry_steps.c), a draft round for every number of
 * drafting sequences and the sampler at every number of rows through a
 * backend that has dry_run; nothing for one that has not. */
int			g4_dry_steps(g4_engine *e, g4_err *err);

#endif
