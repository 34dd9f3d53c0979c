/*
 * kv_pool_diff.c — see kv_pool_diff.h.
 */
#include "kv_pool_diff.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "halfconv.h"
#include "kvformat.h"

/* Where an entry lies, for the first far difference's message. */
typedef struct
{
	h_kv_diff  *d;
	const g4_kv_layer *L;
	int			block,
				head,
				tok;
} entry_at;

/* A bf16 or f16 bit pattern as an integer in the order of the values it
 * encodes (both zeros 0): adjacent representable values are one apart. */
static long
ordered16(uint16_t h)
{
	return (h & 0x8000) ? -(long) (h & 0x7fff) : (long) h;
}

static long
dist16(uint16_t a, uint16_t b)
{
	return labs(ordered16(a) - ordered16(b));
}

static uint16_t
load16(const uint8_t *p)
{
	uint16_t	v;

	memcpy(&v, p, 2);
	return v;
}

/* Count one element or scale `by` codes apart; 1 when it differs.  `near`:
 * further than one code, yet within float32 noise of its vector (see
 * G4_KV_DIFF_NOISE), which is a flip too. */
static int
tally(const entry_at *at, long by, int near, long *flipped, const char *what, int elem, const char *values)
{
	h_kv_diff  *d = at->d;

	if (by == 0)
		return 0;
	if (by == 1 || near)
		(*flipped)++;
	else if (d->far++ == 0)
		snprintf(d->first_far, sizeof(d->first_far),
				 "%s %d of layer %d of group %d, block %d, head %d, token %d: %ld codes apart%s", what, elem,
				 at->L->index, at->L->group, at->block, at->head, at->tok, by, values);
	return 1;
}

/* The bf16 elements e[0..hd) of an entry in both images: float32 noise is
 * relative to the vector (a matmul's or a norm's rounding), so an element
 * small against the vector's largest magnitude may lie several of its own
 * ulps from the other side's and still be a flip. */
static int
diff_bf16_vector(const entry_at *at, const uint8_t *ha, const uint8_t *hb, size_t e, int hd, const char *what)
{
	float		largest = 0.0f;
	int			differ = 0,
				i;

	for (i = 0; i < hd; i++)
		largest = fmaxf(largest, fmaxf(fabsf(g4_bf16_to_f32(load16(ha + 2 * (e + (size_t) i)))),
									   fabsf(g4_bf16_to_f32(load16(hb + 2 * (e + (size_t) i))))));
	for (i = 0; i < hd; i++)
	{
		uint16_t	a = load16(ha + 2 * (e + (size_t) i)),
					b = load16(hb + 2 * (e + (size_t) i));
		float		va = g4_bf16_to_f32(a),
					vb = g4_bf16_to_f32(b);
		int			near;
		char		values[80] = "";

		if (a == b)
			continue;
		near = fabsf(va - vb) <= G4_KV_DIFF_NOISE * largest;
		/* the values only for the message of a first far difference */
		if (!near && at->d->far == 0)
			snprintf(values, sizeof(values), " (%.6g and %.6g; the vector's largest magnitude %.6g)", va, vb,
					 largest);
		differ |= tally(at, dist16(a, b), near, &at->d->codes_flipped, what, i, values);
	}
	return differ;
}

/* One (token, head) entry of a head block in each image; 1 when any of its
 * elements or scales differ. */
static int
diff_entry(const entry_at *at, int dtype, const uint8_t *ha, const uint8_t *hb)
{
	const g4_kv_layer *L = at->L;
	h_kv_diff  *d = at->d;
	int			hd = L->head_dim,
				t = at->tok,
				differ = 0,
				i;

	if (dtype == G4_KV_BF16)
	{
		int			part;

		/* K then V, each [16][hd]; a k_eq_v layer stores V alone */
		for (part = 0; part < (L->k_eq_v ? 1 : 2); part++)
			differ |= diff_bf16_vector(at, ha, hb, ((size_t) part * G4_KV_BLOCK_TOKENS + (size_t) t) * (size_t) hd, hd,
									   part ? "V element" : "K element");
		return differ;
	}

	/* turboquant_k8v4: int8 codes and one f16 scale (a k_eq_v layer's V) */
	{
		const int8_t *qa = (const int8_t *) ha + (size_t) t * (size_t) hd,
				   *qb = (const int8_t *) hb + (size_t) t * (size_t) hd;
		size_t		so = g4_kv_tq_kscale_off(hd) + 2 * (size_t) t;

		differ |= tally(at, dist16(load16(ha + so), load16(hb + so)), 0, &d->scales_flipped, "int8 scale", 0, "");
		for (i = 0; i < hd; i++)
			differ |= tally(at, labs((long) qa[i] - (long) qb[i]), 0, &d->codes_flipped, "int8 code", i, "");
	}
	if (!L->k_eq_v)
	{
		/* 4-bit value codes, two a byte, and a scale per group of G */
		int			G = g4_kv_v4_group(hd);
		size_t		vo = g4_kv_tq_v_off(hd) + (size_t) t * (size_t) (hd / 2),
					so = g4_kv_tq_vscale_off(hd) + (size_t) t * (size_t) (hd / G) * 2;

		for (i = 0; i < hd / G; i++)
			differ |= tally(at, dist16(load16(ha + so + 2 * (size_t) i), load16(hb + so + 2 * (size_t) i)),
							0, &d->scales_flipped, "value scale", i, "");
		for (i = 0; i < hd; i++)
		{
			int			sh = 4 * (i & 1);
			long		ca = (ha[vo + (size_t) i / 2] >> sh) & 15,
						cb = (hb[vo + (size_t) i / 2] >> sh) & 15;

			differ |= tally(at, labs(ca - cb), 0, &d->codes_flipped, "value code", i, "");
		}
	}
	return differ;
}

int
h_kv_pool_diff(const g4_kv_pool_desc *desc, const g4_kv_layer *layers, int n_layers,
			   const uint8_t *const a[G4_KVG_COUNT], const uint8_t *const b[G4_KVG_COUNT], h_kv_diff *out)
{
	int			l;

	memset(out, 0, sizeof(*out));
	if (desc->dtype != G4_KV_BF16 && desc->dtype != G4_KV_TURBOQUANT_K8V4)
		return -1;
	for (l = 0; l < n_layers; l++)
	{
		const g4_kv_layer *L = &layers[l];
		int			g = L->group;
		size_t		hbb = g4_kv_head_block_bytes(desc->dtype, L->head_dim, L->k_eq_v);
		entry_at	at;

		at.d = out;
		at.L = L;
		for (at.block = 0; at.block < desc->n_blocks[g]; at.block++)
			for (at.head = 0; at.head < L->n_kv_heads; at.head++)
			{
				size_t		off = (size_t) L->index * desc->layer_stride[g] +
					(size_t) at.block * desc->layer_block_bytes[g] + (size_t) at.head * hbb;

				out->entries += G4_KV_BLOCK_TOKENS;
				if (memcmp(a[g] + off, b[g] + off, hbb) == 0)
					continue;
				for (at.tok = 0; at.tok < G4_KV_BLOCK_TOKENS; at.tok++)
					out->entries_differ += diff_entry(&at, desc->dtype, a[g] + off, b[g] + off);
			}
	}
	return 0;
}
