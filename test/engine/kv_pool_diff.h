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
 */
#ifndef G4_KV_POOL_DIFF_H
#define G4_KV_POOL_DIFF_H

#include <stdint.h>

#include "backend.h"

typedef struct
{
	long		entries;		/* (layer, block, head, token) entries compared */
	long		entries_differ; /* entries with any element or scale differing */
	long		codes_flipped;	/* elements one code (bf16: one ulp) apart */
	long		scales_flipped; /* turboquant scales one f16 step apart */
	long		far;			/* codes or scales further apart */
	char		first_far[160]; /* where the first far difference lies */
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
