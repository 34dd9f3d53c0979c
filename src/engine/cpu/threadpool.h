/*
 * threadpool.h — a fixed pool of worker threads running parallel loops.
 *
 * g4_pool_run(pool, n, fn, ctx) calls fn(ctx, i) for every i in [0, n) on
 * the pool's threads and the caller's, and returns when all are done.
 * Items are handed out dynamically (an atomic counter), so uneven items
 * balance themselves.
 */
#ifndef G4_THREADPOOL_H
#define G4_THREADPOOL_H

#include <stdint.h>

typedef struct g4_pool g4_pool;
typedef void (*g4_pool_fn) (void *ctx, int64_t item, int thread);

/* threads: total threads including the caller (>= 1). */
g4_pool    *g4_pool_create(int threads);
void		g4_pool_destroy(g4_pool *p);
int			g4_pool_threads(const g4_pool *p);
void		g4_pool_run(g4_pool *p, int64_t n, g4_pool_fn fn, void *ctx);

#endif
