/*
 * bench_kv_quality.c — the KV dtypes' attention error at the Gemma 4 12B
 * shapes, as a proxy where no 12B weights are at hand.
 *
 * For each shape (sliding layers: 16 query heads over 8 KV heads of 256, K
 * and V stored; full layers: 16 query heads over 1 KV head of 512, K derived
 * from V as RoPE(V * k_norm)) and each context length (2k, 32k keys), random
 * Gaussian K and V are encoded into the pool format and decoded again
 * (kv_codec.c, the bytes every backend reads), and attention over every key
 * is computed in float64 from the decoded vectors and from the exact ones.
 * Reported: ||out - out_exact|| / ||out_exact|| over 8 decode queries per
 * query head.  Queries have a spread of scores like a trained model's (q
 * scaled by 2, scale 1/sqrt(D)), as in test_kv.
 *
 *   make CUDA=0 build/bench-kv_quality && build/bench-kv_quality
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "util.h"
#include "xorshift.h"

static uint64_t rng_state = 88172645463325252ull;

static float
nrand(void)
{
	double		u1 = (double) ((h_xorshift64(&rng_state) >> 11) + 1) * (1.0 / 9007199254740993.0);
	double		u2 = (double) (h_xorshift64(&rng_state) >> 11) * (1.0 / 9007199254740992.0);

	return (float) (sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

#define N_QUERIES 8

/* Attention of nq query rows (of one KV head) over n keys, in float64. */
static void
attend(const float *k, const float *v, int n, int hd, const float *q, int nq, double *out)
{
	double	   *sc = malloc(sizeof(double) * (size_t) n);
	double		scale = 1.0 / sqrt((double) hd);
	int			t,
				j,
				d;

	for (t = 0; t < nq; t++)
	{
		double		m = -INFINITY,
					sum = 0;
		double	   *o = out + (size_t) t * hd;

		for (j = 0; j < n; j++)
		{
			double		s = 0;

			for (d = 0; d < hd; d++)
				s += (double) q[(size_t) t * hd + d] * k[(size_t) j * hd + d];
			sc[j] = s * scale;
			m = fmax(m, sc[j]);
		}
		memset(o, 0, sizeof(double) * (size_t) hd);
		for (j = 0; j < n; j++)
		{
			double		p = exp(sc[j] - m);

			sum += p;
			for (d = 0; d < hd; d++)
				o[d] += p * v[(size_t) j * hd + d];
		}
		for (d = 0; d < hd; d++)
			o[d] /= sum;
	}
	free(sc);
}

/* K as attention sees it for a K-from-V layer: RoPE(v * k_norm) */
static void
key_from_value(const float *v, int hd, int pos, const float *knorm, const float *inv, float *k)
{
	int			d;

	for (d = 0; d < hd; d++)
		k[d] = v[d] * knorm[d];
	g4_rope_apply(k, hd, pos, inv);
}

static void
run(int hd, int heads, int kv_heads, int k_eq_v, int n)
{
	size_t		hb[3];
	float	   *k = malloc(sizeof(float) * (size_t) n * hd);
	float	   *v = malloc(sizeof(float) * (size_t) n * hd);
	float	   *dk = malloc(sizeof(float) * (size_t) n * hd);
	float	   *dv = malloc(sizeof(float) * (size_t) n * hd);
	float	   *q = malloc(sizeof(float) * (size_t) N_QUERIES * hd);
	double	   *ref = malloc(sizeof(double) * (size_t) N_QUERIES * hd);
	double	   *out = malloc(sizeof(double) * (size_t) N_QUERIES * hd);
	float	   *knorm = malloc(sizeof(float) * (size_t) hd);
	float	   *inv = malloc(sizeof(float) * (size_t) hd / 2);
	double		num[3] = {0},
				den = 0;
	int			dtype,
				g,
				j,
				i;

	for (dtype = 0; dtype < 3; dtype++)
		hb[dtype] = g4_kv_head_block_bytes(dtype, hd, k_eq_v);
	for (i = 0; i < hd; i++)
		knorm[i] = 0.5f + (float) ((i * 37) % 101) / 101.0f;
	/* Gemma 4's full layers rotate a quarter of the pairs */
	for (i = 0; i < hd / 2; i++)
		inv[i] = i < hd / 8 ? powf(1000000.0f, -2.0f * (float) i / (float) hd) : 0.0f;
	for (g = 0; g < kv_heads; g++)
	{
		uint8_t    *blk = malloc(hb[G4_KV_F32]);

		for (i = 0; i < n * hd; i++)
		{
			k[i] = nrand();
			v[i] = nrand();
		}
		if (k_eq_v)
			for (j = 0; j < n; j++)
				key_from_value(v + (size_t) j * hd, hd, j, knorm, inv, k + (size_t) j * hd);
		for (i = 0; i < N_QUERIES * hd; i++)
			q[i] = 2.0f * nrand();
		attend(k, v, n, hd, q, N_QUERIES, ref);
		for (i = 0; i < N_QUERIES * hd; i++)
			den += ref[i] * ref[i];
		for (dtype = G4_KV_BF16; dtype <= G4_KV_TURBOQUANT_K8V4; dtype++)
		{
			for (j = 0; j < n; j++)
			{
				int			off = j % G4_KV_BLOCK_TOKENS;
				float	   *kj = dk + (size_t) j * hd;
				float	   *vj = dv + (size_t) j * hd;

				g4_kv_encode_head(dtype, k_eq_v, hd, blk, off, k_eq_v ? NULL : k + (size_t) j * hd,
								  v + (size_t) j * hd);
				g4_kv_decode_k(dtype, k_eq_v, hd, blk, off, kj);
				g4_kv_decode_v(dtype, k_eq_v, hd, blk, off, vj);
				if (dtype == G4_KV_TURBOQUANT_K8V4 && !k_eq_v)
				{
					/* stored rotated: H is its own inverse */
					g4_hadamard(kj, hd);
					g4_hadamard(vj, hd);
				}
				if (k_eq_v)
					key_from_value(vj, hd, j, knorm, inv, kj);
			}
			attend(dk, dv, n, hd, q, N_QUERIES, out);
			/* the group's query heads are alike: its N_QUERIES rows stand
			 * for them */
			for (i = 0; i < N_QUERIES * hd; i++)
				num[dtype] += (out[i] - ref[i]) * (out[i] - ref[i]);
		}
		free(blk);
	}
	printf("head_dim %d%s, %2d query / %d KV heads, %6d keys: relative error bf16 %.5f, turboquant_k8v4 %.5f "
		   "(%zu / %zu / %zu bytes per token and head: f32 / bf16 / turboquant_k8v4)\n",
		   hd, k_eq_v ? " (K from V)" : "          ", heads, kv_heads, n, sqrt(num[G4_KV_BF16] / den),
		   sqrt(num[G4_KV_TURBOQUANT_K8V4] / den), hb[0] / G4_KV_BLOCK_TOKENS, hb[1] / G4_KV_BLOCK_TOKENS,
		   hb[2] / G4_KV_BLOCK_TOKENS);
	fflush(stdout);
	free(k);
	free(v);
	free(dk);
	free(dv);
	free(q);
	free(ref);
	free(out);
	free(knorm);
	free(inv);
}

int
main(void)
{
	static const int lens[] = {2048, 32768};
	size_t		i;

	for (i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
	{
		run(256, 16, 8, 0, lens[i]);	/* sliding layers */
		run(512, 16, 1, 1, lens[i]);	/* full layers */
	}
	return 0;
}
