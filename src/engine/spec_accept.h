/*
 * spec_accept.h — speculative sampling's acceptance step: keeping a drafted
 * token or replacing it so that the emitted token is distributed exactly as
 * the target's own sampling distribution.
 *
 * For a draft d proposed with distribution q and the target's distribution
 * p at that position: accept d with probability min(1, p(d) / q(d)); on
 * rejection draw from the normalised residual max(0, p - q).  Drafts are
 * proposed greedily (the assistant's argmax), i.e. q is one-hot at d: the
 * acceptance probability is p(d) and the residual is p without d.
 */
#ifndef G4_SPEC_ACCEPT_H
#define G4_SPEC_ACCEPT_H

#include <stdint.h>

#include "sampler.h"

/*
 * p: the target's distribution [vocab]; q: the draft's [vocab], or NULL for
 * one-hot at d.  Takes one draw from rng for the test and, on rejection,
 * one more for the residual.  Returns the emitted token; *accepted says
 * whether it is d.
 */
int32_t		g4_spec_accept(const double *p, const double *q, int vocab, int32_t d, g4_rng *rng, int *accepted);

#endif
