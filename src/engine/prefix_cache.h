/*
 * prefix_cache.h — sharing the KV blocks of common prompt prefixes between
 * sequences (see prefix_cache.c for what is shared on each layer kind).
 */
#ifndef G4_PREFIX_CACHE_H
#define G4_PREFIX_CACHE_H

#include <stdint.h>

typedef struct g4_engine g4_engine;
typedef struct g4_seq g4_seq;

/* What one admission found in the cache. */
typedef struct
{
	int			tokens;			/* prompt positions already computed (whole blocks) */
	int			lookups[2];		/* blocks asked of each group (G4_KVG_*) */
	int			hits[2];		/* blocks supplied */
} g4_prefix_hit;

/* The engine's secret hashing key (random per engine). */
void		g4_prefix_key_init(uint64_t key[2]);

/* At admission of s into its slot: put the longest usable cached prefix
 * into the slot's tables (taking references).  hit->tokens is where
 * prefill starts.  Fails only on memory or device errors, and then leaves
 * nothing attached. */
int			g4_prefix_attach(g4_engine *e, g4_seq *s, g4_prefix_hit *hit);

/* True when an admitted sequence is computing, but has not finished, the
 * next block of s's prompt that s would otherwise compute itself: s is
 * better admitted once that block is cached. */
int			g4_prefix_pending(g4_engine *e, g4_seq *s);

/* Count an admission's lookups and hits (once s is admitted). */
void		g4_prefix_account(g4_engine *e, const g4_seq *s, const g4_prefix_hit *hit);

/* After a step computed positions [from, to) of s: make the prompt blocks
 * it completed findable by later sequences. */
void		g4_prefix_register(g4_engine *e, g4_seq *s, int from, int to);

#endif
