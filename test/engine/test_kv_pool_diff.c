/*
 * test_kv_pool_diff.c — the pool comparison the GPU tests rely on
 * (kv_pool_diff.c): two images encoded from nearly equal inputs differ
 * only by rounding flips, which it counts as such (a bf16 element small
 * against its vector may flip by several of its own ulps); a code or scale
 * moved further is reported as far, with its place.
 */
#include <math.h>
#include <stdlib.h>

#include "cpu/cpu.h"
#include "kv_pool_diff.h"
#include "test.h"
#include "xorshift.h"

#define N_BLOCKS 3

static uint64_t rng_state = 0x51f0aa7e5d3c2b19ull;

/* Two layers, one per group: a sliding one (head_dim 32, two KV heads, K
 * and V) and a full one (head_dim 64, one KV head, K from V). */
static void
two_layers(int dtype, g4_kv_pool_desc *desc, g4_kv_layer L[2])
{
	int			g;

	memset(desc, 0, sizeof(*desc));
	memset(L, 0, 2 * sizeof(g4_kv_layer));
	desc->dtype = dtype;
	L[0].group = G4_KVG_SLIDING;
	L[0].head_dim = 32;
	L[0].n_kv_heads = 2;
	L[1].group = G4_KVG_FULL;
	L[1].head_dim = 64;
	L[1].n_kv_heads = 1;
	L[1].k_eq_v = 1;
	for (g = 0; g < G4_KVG_COUNT; g++)
	{
		desc->n_layers[g] = 1;
		desc->n_blocks[g] = N_BLOCKS;
		desc->layer_block_bytes[g] = (size_t) L[g].n_kv_heads *
			g4_kv_head_block_bytes(dtype, L[g].head_dim, L[g].k_eq_v);
		desc->layer_stride[g] = N_BLOCKS * desc->layer_block_bytes[g];
	}
}

/*
 * Encode every entry of both layers into img[0] from random vectors and into
 * img[1] from the same vectors with each element moved by up to `rel` of
 * itself (another backend's float32 noise, much enlarged so that flips
 * occur).  rel = 5e-5 keeps every difference a rounding flip: a rotated
 * element of width 32 moves by at most rel * |x| (its 2-norm), under 1 % of
 * a key step (|x| / (127 sqrt 32) at least) and the largest magnitude by at
 * most rel sqrt(32) = 2.8e-4 relative, under one f16 step of a scale
 * (2^-11 to 2^-10).
 */
static void
encode_pair(const g4_kv_pool_desc *desc, const g4_kv_layer L[2], double rel, uint8_t *img[2][G4_KVG_COUNT])
{
	int			g;

	for (g = 0; g < G4_KVG_COUNT; g++)
	{
		int			hd = L[g].head_dim;
		size_t		hbb = g4_kv_head_block_bytes(desc->dtype, hd, L[g].k_eq_v);
		int			blk,
					h,
					t,
					i;

		for (blk = 0; blk < N_BLOCKS; blk++)
			for (h = 0; h < L[g].n_kv_heads; h++)
				for (t = 0; t < G4_KV_BLOCK_TOKENS; t++)
				{
					float		k[2][64],
								v[2][64];
					size_t		off = (size_t) blk * desc->layer_block_bytes[g] + (size_t) h * hbb;
					int			s;

					for (i = 0; i < hd; i++)
					{
						k[0][i] = h_normal(&rng_state) * 2.0f;
						v[0][i] = h_normal(&rng_state);
						k[1][i] = (float) (k[0][i] * (1.0 + rel * (2.0 * h_uniform(&rng_state) - 1.0)));
						v[1][i] = (float) (v[0][i] * (1.0 + rel * (2.0 * h_uniform(&rng_state) - 1.0)));
					}
					for (s = 0; s < 2; s++)
						g4_kv_encode_head(desc->dtype, L[g].k_eq_v, hd, img[s][g] + off, t,
										  L[g].k_eq_v ? NULL : k[s], v[s]);
				}
	}
}

G4_TEST(kv_pool_diff_counts_rounding_flips_and_finds_far_codes)
{
	int			dtype;

	for (dtype = G4_KV_BF16; dtype <= G4_KV_TURBOQUANT_K8V4; dtype++)
	{
		g4_kv_pool_desc desc;
		g4_kv_layer L[2];
		uint8_t    *img[2][G4_KVG_COUNT];
		h_kv_diff	d;
		int			g,
					s;
		long		entries = (long) N_BLOCKS * G4_KV_BLOCK_TOKENS * (2 + 1);

		two_layers(dtype, &desc, L);
		for (s = 0; s < 2; s++)
			for (g = 0; g < G4_KVG_COUNT; g++)
			{
				img[s][g] = calloc(1, desc.layer_stride[g]);
				CHECK(img[s][g]);
			}

		/* the same inputs: nothing differs */
		encode_pair(&desc, L, 0.0, img);
		CHECK_INT(h_kv_pool_diff(&desc, L, 2, (const uint8_t *const *) img[0], (const uint8_t *const *) img[1], &d),
				  0);
		CHECK_INT(d.entries, entries);
		CHECK_INT(d.entries_differ, 0);

		/* nearly equal inputs: flips only, and some of them */
		encode_pair(&desc, L, 5e-5, img);
		CHECK_INT(h_kv_pool_diff(&desc, L, 2, (const uint8_t *const *) img[0], (const uint8_t *const *) img[1], &d),
				  0);
		printf("    figure: %s, %ld of %ld entries differ: %ld codes and %ld scales one step apart\n",
			   dtype == G4_KV_BF16 ? "bf16" : "turboquant_k8v4", d.entries_differ, d.entries, d.codes_flipped,
			   d.scales_flipped);
		CHECK_MSG(d.far == 0, "a rounding flip reported as far: %s", d.first_far);
		CHECK(d.codes_flipped > 0 && d.entries_differ > 0 && d.entries_differ <= entries);

		/* an element of the full layer's token 5 in block 2 set two codes
		 * (bf16: two ulps of 1.0) from the first image's; for bf16, another
		 * element of the same vector three ulps apart at 2^-15, a flip
		 * within the vector's noise */
		{
			size_t		at = 2 * desc.layer_block_bytes[G4_KVG_FULL];
			uint8_t    *e0 = img[0][G4_KVG_FULL] + at,
					   *e1 = img[1][G4_KVG_FULL] + at;

			if (dtype == G4_KV_BF16)
			{
				const uint16_t x[2][2] = {{0x3f80, 0x3800}, {0x3f82, 0x3803}};
				int			s2;

				for (s2 = 0; s2 < 2; s2++)
				{
					memcpy((s2 ? e1 : e0) + 2 * (5 * 64 + 7), &x[s2][0], 2);
					memcpy((s2 ? e1 : e0) + 2 * (5 * 64 + 9), &x[s2][1], 2);
				}
			}
			else
			{
				int8_t		q = (int8_t) e0[5 * 64 + 7];

				e1[5 * 64 + 7] = (uint8_t) (int8_t) (q > 0 ? q - 2 : q + 2);
			}
		}
		CHECK_INT(h_kv_pool_diff(&desc, L, 2, (const uint8_t *const *) img[0], (const uint8_t *const *) img[1], &d),
				  0);
		CHECK_MSG(d.far == 1, "%ld far differences, expected 1", d.far);
		CHECK_MSG(strstr(d.first_far, " 7 of layer 0 of group 1, block 2, head 0, token 5") != NULL,
				  "placed at: %s", d.first_far);

		for (s = 0; s < 2; s++)
			for (g = 0; g < G4_KVG_COUNT; g++)
				free(img[s][g]);
	}
}

G4_TEST(kv_pool_diff_refuses_f32)
{
	g4_kv_pool_desc desc;
	g4_kv_layer L[2];
	h_kv_diff	d;
	const uint8_t *none[G4_KVG_COUNT] = {NULL, NULL};

	two_layers(G4_KV_F32, &desc, L);
	CHECK_INT(h_kv_pool_diff(&desc, L, 2, none, none, &d), -1);
}
