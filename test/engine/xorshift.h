/*
 * xorshift.h — the pseudo-random stream of the tests and benchmarks
 * (Marsaglia's xorshift64): fast, seedable, and the same sequence on every
 * machine, so random inputs are reproducible.  Each caller keeps its state.
 */
#ifndef G4_XORSHIFT_H
#define G4_XORSHIFT_H

#include <math.h>
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

/* Uniform in [0, 1) with 53 random bits. */
static inline double
h_uniform(uint64_t *s)
{
	return (double) (h_xorshift64(s) >> 11) * (1.0 / 9007199254740992.0);
}

/* Standard normal (Box-Muller). */
static inline float
h_normal(uint64_t *s)
{
	double		u1 = h_uniform(s) + 1e-12,
				u2 = h_uniform(s);

	return (float) (sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

#endif
