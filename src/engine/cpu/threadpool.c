/*
 * threadpool.c — worker threads sleeping on a condition variable between
 * parallel loops; items claimed with an atomic counter.
 */
#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct g4_pool
{
	int			n_threads;		/* including the caller */
	pthread_t  *threads;
	pthread_mutex_t mu;
	pthread_cond_t start;
	pthread_cond_t done;
	uint64_t	generation;		/* bumped for every loop */
	int			running;		/* workers still inside the current loop */
	int			stop;
	/* the current loop */
	g4_pool_fn	fn;
	void	   *ctx;
	int64_t		n;
	_Atomic int64_t next;
};

typedef struct
{
	g4_pool    *pool;
	int			index;
} worker_arg;

static void
run_items(g4_pool *p, int thread)
{
	for (;;)
	{
		int64_t		i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);

		if (i >= p->n)
			break;
		p->fn(p->ctx, i, thread);
	}
}

static void *
worker_main(void *arg)
{
	worker_arg *wa = arg;
	g4_pool    *p = wa->pool;
	int			index = wa->index;
	uint64_t	seen = 0;

	free(wa);
	pthread_mutex_lock(&p->mu);
	for (;;)
	{
		while (!p->stop && p->generation == seen)
			pthread_cond_wait(&p->start, &p->mu);
		if (p->stop)
			break;
		seen = p->generation;
		pthread_mutex_unlock(&p->mu);
		run_items(p, index);
		pthread_mutex_lock(&p->mu);
		if (--p->running == 0)
			pthread_cond_signal(&p->done);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

g4_pool *
g4_pool_create(int threads)
{
	g4_pool    *p = calloc(1, sizeof(g4_pool));
	int			i;

	if (!p)
		return NULL;
	if (threads < 1)
		threads = 1;
	p->n_threads = threads;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->start, NULL);
	pthread_cond_init(&p->done, NULL);
	p->threads = calloc((size_t) threads, sizeof(pthread_t));
	if (!p->threads)
	{
		g4_pool_destroy(p);
		return NULL;
	}
	for (i = 1; i < threads; i++)
	{
		worker_arg *wa = malloc(sizeof(worker_arg));

		if (!wa)
			break;
		wa->pool = p;
		wa->index = i;
		if (pthread_create(&p->threads[i], NULL, worker_main, wa) != 0)
		{
			free(wa);
			break;
		}
	}
	/* run with however many threads could be started */
	p->n_threads = i;
	return p;
}

void
g4_pool_destroy(g4_pool *p)
{
	int			i;

	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->stop = 1;
	pthread_cond_broadcast(&p->start);
	pthread_mutex_unlock(&p->mu);
	if (p->threads)
		for (i = 1; i < p->n_threads; i++)
			pthread_join(p->threads[i], NULL);
	free(p->threads);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->start);
	pthread_cond_destroy(&p->done);
	free(p);
}

int
g4_pool_threads(const g4_pool *p)
{
	return p->n_threads;
}

void
g4_pool_run(g4_pool *p, int64_t n, g4_pool_fn fn, void *ctx)
{
	if (n <= 0)
		return;
	if (p->n_threads == 1 || n == 1)
	{
		int64_t		i;

		for (i = 0; i < n; i++)
			fn(ctx, i, 0);
		return;
	}
	pthread_mutex_lock(&p->mu);
	p->fn = fn;
	p->ctx = ctx;
	p->n = n;
	atomic_store(&p->next, 0);
	p->running = p->n_threads - 1;
	p->generation++;
	pthread_cond_broadcast(&p->start);
	pthread_mutex_unlock(&p->mu);

	run_items(p, 0);

	pthread_mutex_lock(&p->mu);
	while (p->running > 0)
		pthread_cond_wait(&p->done, &p->mu);
	pthread_mutex_unlock(&p->mu);
}
