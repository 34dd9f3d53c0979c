/*
 * bench_membw.c — this machine's memory read bandwidth, the floor for
 * memory-bound CPU decoding: every thread sums its share of a buffer much
 * larger than the caches, several times; the best pass is reported.
 *
 *   bench-membw [MiB] [threads]
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct
{
	const uint64_t *p;
	size_t		n;
	uint64_t	sum;
} part;

static void *
reader(void *arg)
{
	part	   *pt = arg;
	uint64_t	s0 = 0,
				s1 = 0,
				s2 = 0,
				s3 = 0;
	size_t		i;

	/* four independent sums keep several loads in flight */
	for (i = 0; i + 4 <= pt->n; i += 4)
	{
		s0 += pt->p[i];
		s1 += pt->p[i + 1];
		s2 += pt->p[i + 2];
		s3 += pt->p[i + 3];
	}
	pt->sum = s0 + s1 + s2 + s3;
	return NULL;
}

static double
now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

int
main(int argc, char **argv)
{
	size_t		mib = argc > 1 ? (size_t) atol(argv[1]) : 1024;
	long		ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	int			threads = argc > 2 ? atoi(argv[2]) : (int) (ncpu > 0 ? ncpu : 1);
	size_t		bytes = mib << 20;
	size_t		words = bytes / 8;
	uint64_t   *buf = malloc(bytes);
	double		best = 0;
	int			pass;
	uint64_t	total = 0;

	if (!buf || threads < 1 || threads > 256)
	{
		fprintf(stderr, "usage: bench-membw [MiB] [threads]\n");
		return 1;
	}
	memset(buf, 1, bytes);
	for (pass = 0; pass < 5; pass++)
	{
		pthread_t	th[256];
		part		pt[256];
		double		t0 = now(),
					dt;
		int			i;

		for (i = 0; i < threads; i++)
		{
			pt[i].p = buf + words / (size_t) threads * (size_t) i;
			pt[i].n = words / (size_t) threads;
			pthread_create(&th[i], NULL, reader, &pt[i]);
		}
		for (i = 0; i < threads; i++)
		{
			pthread_join(th[i], NULL);
			total += pt[i].sum;
		}
		dt = now() - t0;
		if (bytes / dt > best)
			best = (double) bytes / dt;
	}
	printf("memory read bandwidth: %.2f GB/s (%d threads, %zu MiB buffer, best of 5; checksum %llu)\n",
		   best / 1e9, threads, mib, (unsigned long long) (total & 0xff));
	free(buf);
	return 0;
}
