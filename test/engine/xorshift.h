/*
 * xorshift.h — the pseudo-random stream of the tests and benchmarks
 * (Marsaglia's xorshift64): fast, seedable, and the same sequence on every
 * machine, so random inputs are reproducible.  Each caller keeps its state.
 */
#ifndef G4_XORSHIFT_H
#define G4_XORSHIFT_H

#include <stdint.h>

/* Advance *s and return the new state (never 0 for a nonzero seed). */
static inline uint64_t
h_xorshift64(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

#endif
