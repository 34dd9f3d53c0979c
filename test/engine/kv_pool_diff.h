/*
 * kv_pool_diff.h — two images of a quantised KV pool, compared code by
 * code: which stored elements differ, and whether each difference is a
 * rounding flip (the neighbouring code, or a scale one f16 step away) or
 * something no rounding of nearly equal inputs can give.
 *
 * Two backends that compute a K or V value within float32 noise of each
 * other store the same code, except where the value lies within that noise
 * of a boundary between two codes: there each may take its side.  Such a
 * flip moves the element by one code step; a wrong encoding, index or
 * layout moves it by more, or touches bytes no flip touches.
 *
 * The noise is relative to the vector, not to each element: a bf16 element
 * small against its vector's largest magnitude has ulps far finer than the
 * noise and may lie several codes from the other side's.  Such an element
 * is a flip when the two values lie within G4_KV_DIFF_NOISE of the vector's
 * largest magnitude.  (A turboquant code is a step of the vector's own
 * scale, so its flips are one code apart.)
 */
#ifndef G4_KV_POOL_DIFF_H
#define G4_KV_POOL_DIFF_H

#include <stdint.h>

#include "backend.h"

/*
 * 2^-12 of the vector's largest magnitude: the inputs of the first layer
 * whose stored K/V differ agree within float32 noise, which at the model's
 * output is ~2.4e-5 relative (the f32 pool's first logits, GPU against CPU:
 * up to 9.4e-5 on the fixture's logits, whose largest is ~4); this is ten
 * times that, yet 1/32 of a bf16 step at the largest magnitude, where a
 * misplaced or misencoded element lies O(1) away.
 */
#define G4_KV_DIFF_NOISE 2.44140625e-4f

typedef struct
{
	long		entries;		/* (layer, block, head, token) entries compared */
	long		entries_differ; /* entries with any element or scale differing */
	long		codes_flipped;	/* elements one code (bf16: one ulp) apart, or
								 * several within the vector's noise */
	long		scales_flipped; /* turboquant scales one f16 step apart */
	long		far;			/* codes or scales further apart */
	char		first_far[256]; /* where the first far difference lies */
} h_kv_diff;

/*
 * Compare the pool images a[g] and b[g] (host copies of each group's
 * n_blocks * layer_block_bytes * n_layers bytes, laid out as desc says) of a
 * bf16 or turboquant_k8v4 pool, over every layer of layers[n_layers] (each
 * names its group and index).  Returns 0, or -1 for an f32 pool, which has
 * no codes.
 */
int			h_kv_pool_diff(const g4_kv_pool_desc *desc, const g4_kv_layer *layers, int n_layers,
						   const uint8_t *const a[G4_KVG_COUNT], const uint8_t *const b[G4_KVG_COUNT],
						   h_kv_diff *out);

#endif
