/*
 * bench_quant.c — single-core throughput of the weight-format kernels.
 *
 * For every format, a weight matrix of about --mb megabytes (default 64, far
 * larger than the caches, as in real decoding) with rows of --in elements
 * (default 2048) is multiplied with n = 1 and n = 8 activation rows by
 * calling g4_dot_row once per weight row, as the CPU backend's matmul does.
 * Reported: weight bytes read per second (GB/s), for the AVX2 kernels and
 * the portable scalar ones, plus g4_dequant_row.
 *
 *   cc -std=c11 -D_GNU_SOURCE -O2 -Isrc/engine -o /tmp/bench_quant \
 *       test/bench/bench_quant.c src/engine/quant.c src/engine/util.c -lm
 *   /tmp/bench_quant [--in N] [--mb M] [--secs S]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "quant.h"
#include "util.h"
#include "xorshift.h"


static uint64_t rng_state = 88172645463325252ull;

static uint64_t
rng(void)
{
	return h_xorshift64(&rng_state);
}

static void
put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t) v;
	p[1] = (uint8_t) (v >> 8);
}

/* Random quants with sane (normal, small) scales, so no NaN/denormal
 * arithmetic distorts the timing. */
static void
fill(int fmt, uint8_t *data, size_t nbytes, int64_t in, int64_t rows)
{
	size_t		i;
	int			bs = g4_wfmt_block(fmt);

	for (i = 0; i < nbytes; i++)
		data[i] = (uint8_t) rng();
	if (fmt == G4_W_F32)
	{
		for (i = 0; i < nbytes / 4; i++)
		{
			float		f = (float) ((int) (rng() % 2001) - 1000) / 1000.0f;

			memcpy(data + 4 * i, &f, 4);
		}
		return;
	}
	if (fmt == G4_W_F16 || fmt == G4_W_BF16)
	{
		for (i = 0; i < nbytes / 2; i++)
		{
			float		f = (float) ((int) (rng() % 2001) - 1000) / 1000.0f;

			put16(data + 2 * i, fmt == G4_W_F16 ? g4_f32_to_f16(f) : g4_f32_to_bf16(f));
		}
		return;
	}
	if (fmt == G4_W_I4G32)
		return;
	{
		size_t		bb = g4_wfmt_row_bytes(fmt, bs);
		size_t		nb = (size_t) (in / bs) * (size_t) rows;
		uint16_t	d = g4_f32_to_f16(0.01f);

		for (i = 0; i < nb; i++)
		{
			uint8_t    *b = data + i * bb;

			if (fmt == G4_W_Q6_K)
				put16(b + 208, d);
			else
				put16(b, d);
			if (fmt == G4_W_Q4_1 || fmt == G4_W_Q5_1 || fmt == G4_W_Q4_K || fmt == G4_W_Q5_K)
				put16(b + 2, d);
		}
	}
}

typedef struct
{
	int			fmt;
	int64_t		in;
	int64_t		rows;
	size_t		row_bytes;
	uint8_t    *data;
	uint16_t   *scales;
	float	   *x;
	float	   *out;
	float	   *deq;
} bench;

/* One pass over the matrix; mode -1 = dequantise, else n rows. */
static void
pass(const bench *b, int path, int n)
{
	int64_t		r;
	int64_t		ngroups = (b->in + 31) / 32;

	for (r = 0; r < b->rows; r++)
	{
		const uint8_t *row = b->data + (size_t) r * b->row_bytes;
		const uint16_t *sc = b->scales ? b->scales + r * ngroups : NULL;

		if (n < 0)
			g4_dequant_row_path(path, b->fmt, row, sc, b->in, b->deq);
		else
			g4_dot_row_path(path, b->fmt, row, sc, b->in, b->x, b->in, n, b->out + r * 8, 1);
	}
}

/* Best of three timed runs of about secs/3 each (the machine may be
 * shared; the best run is the least disturbed one). */
static double
measure(const bench *b, int path, int n, double secs)
{
	double		best = 0.0;
	int			rep;

	pass(b, path, n);			/* warm up (page in, caches) */
	for (rep = 0; rep < 3; rep++)
	{
		double		t0 = g4_now(),
					t;
		int			passes = 0;

		do
		{
			pass(b, path, n);
			passes++;
			t = g4_now() - t0;
		} while (t < secs / 3);
		best = G4_MAX(best, (double) b->row_bytes * (double) b->rows * passes / t / 1e9);
	}
	return best;
}

int
main(int argc, char **argv)
{
	int64_t		in = 2048;
	double		mb = 64;
	double		secs = 0.5;
	int			simd = g4_quant_simd_available();
	int			fmt,
				i;

	for (i = 1; i + 1 < argc; i += 2)
	{
		if (strcmp(argv[i], "--in") == 0)
			in = atoll(argv[i + 1]);
		else if (strcmp(argv[i], "--mb") == 0)
			mb = atof(argv[i + 1]);
		else if (strcmp(argv[i], "--secs") == 0)
			secs = atof(argv[i + 1]);
		else
		{
			fprintf(stderr, "usage: %s [--in N] [--mb M] [--secs S]\n", argv[0]);
			return 2;
		}
	}
	if (in <= 0 || in % 256 != 0)
	{
		fprintf(stderr, "--in must be a positive multiple of 256\n");
		return 2;
	}

	printf("weight GB/s, one core, rows of %lld, ~%.0f MB matrix, g4_dot_row per row%s\n",
		   (long long) in, mb, simd ? "" : " (no AVX2: SIMD columns use the scalar path)");
	printf("%-6s %6s | %8s %8s %8s | %8s %8s %8s\n", "format", "bits/w",
		   "avx2 n=1", "avx2 n=8", "avx2 deq", "scal n=1", "scal n=8", "scal deq");
	for (fmt = 0; fmt < G4_W_FORMAT_COUNT; fmt++)
	{
		bench		b;
		size_t		total;
		double		r[6];
		int64_t		k;

		memset(&b, 0, sizeof(b));
		b.fmt = fmt;
		b.in = in;
		b.row_bytes = g4_wfmt_row_bytes(fmt, in);
		b.rows = (int64_t) (mb * 1e6 / (double) b.row_bytes);
		if (b.rows < 1)
			b.rows = 1;
		total = b.row_bytes * (size_t) b.rows;
		b.data = malloc(total);
		b.x = malloc(sizeof(float) * (size_t) (in * 8));
		b.out = malloc(sizeof(float) * (size_t) (b.rows * 8));
		b.deq = malloc(sizeof(float) * (size_t) in);
		if (fmt == G4_W_I4G32)
			b.scales = malloc(sizeof(uint16_t) * (size_t) (b.rows * ((in + 31) / 32)));
		if (!b.data || !b.x || !b.out || !b.deq || (fmt == G4_W_I4G32 && !b.scales))
		{
			fprintf(stderr, "out of memory\n");
			return 1;
		}
		fill(fmt, b.data, total, in, b.rows);
		if (b.scales)
			for (k = 0; k < b.rows * ((in + 31) / 32); k++)
				b.scales[k] = g4_f32_to_bf16(0.01f + (float) (rng() % 100) * 1e-4f);
		for (k = 0; k < in * 8; k++)
			b.x[k] = (float) ((int) (rng() % 2001) - 1000) / 1000.0f;

		r[0] = measure(&b, 1, 1, secs);
		r[1] = measure(&b, 1, 8, secs);
		r[2] = measure(&b, 1, -1, secs);
		r[3] = measure(&b, 0, 1, secs);
		r[4] = measure(&b, 0, 8, secs);
		r[5] = measure(&b, 0, -1, secs);
		printf("%-6s %6.2f | %8.2f %8.2f %8.2f | %8.2f %8.2f %8.2f\n", g4_wfmt_name(fmt),
			   8.0 * (double) b.row_bytes / (double) in + (fmt == G4_W_I4G32 ? 0.5 : 0.0),
			   r[0], r[1], r[2], r[3], r[4], r[5]);
		fflush(stdout);
		free(b.data);
		free(b.x);
		free(b.out);
		free(b.deq);
		free(b.scales);
	}
	return 0;
}
