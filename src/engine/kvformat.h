/*
 * kvformat.h — byte layout of the paged KV pool, shared by every backend.
 *
 * The pool has two groups of layers: "sliding" (window-limited layers) and
 * "full" (global layers).  Each group has its own array of blocks; a block
 * holds G4_KV_BLOCK_TOKENS consecutive token positions of one sequence for
 * every layer of the group.  A sequence owns one block table per group,
 * indexed by absolute position / G4_KV_BLOCK_TOKENS; sliding-group entries
 * that fell out of the window are recycled and set to -1.
 *
 * Memory of a group:  base + layer * layer_stride + block * layer_block_bytes
 * Inside one (layer, block), heads are stored one after another
 * (head-major), each head taking head_block_bytes:
 *
 *   f32   K[16][D] float, V[16][D] float                    (8·D bytes/token)
 *   bf16  K[16][D] bf16,  V[16][D] bf16                     (4·D bytes/token)
 *   turboquant_k8v4  (D a power of two; G = min(D, 128) values per V scale)
 *         Kq[16][D]      int8   key, Hadamard-rotated, symmetric
 *         Ks[16]         f16    key scale   = max|Hk| / 127
 *         Vq[16][D/2]    uint8  value, Hadamard-rotated, 4-bit codes:
 *                               byte j = element 2j (low nibble) | 2j+1 (high)
 *                               code c in 1..15 means (c - 8) * scale
 *         Vs[16][D/G]    f16    value scale per G elements = max|Hv| / 7
 *         -> D + 2 + D/2 + 2D/G bytes/token: 390 B at D=256 (bf16: 1024,
 *            2.63x smaller), 778 B at D=512 (2.63x).
 *
 * Layers whose key derives from the value (attention_k_eq_v: k = RoPE(v *
 * k_norm.weight)) store only V; attention rebuilds K on the fly:
 *   f32   V[16][D] float          bf16  V[16][D] bf16
 *   turboquant_k8v4  Vq[16][D] int8 (not rotated: RoPE must act on the
 *         plain vector), Vs[16] f16 = max|v| / 127  -> D + 2 bytes/token
 *
 * The Hadamard transform H is the orthonormal Sylvester matrix of size D
 * (entries ±1/sqrt(D)).  Since H is symmetric and orthonormal,
 * q·k = (Hq)·(Hk): a query is rotated once, keys are never un-rotated; and
 * Σ p_j v_j = H (Σ p_j (H v_j)): the inverse is applied once to the output.
 */
#ifndef G4_KVFORMAT_H
#define G4_KVFORMAT_H

#include <stddef.h>
#include <stdint.h>

#define G4_KV_BLOCK_TOKENS 16
#define G4_KV_V4_GROUP_MAX 128	/* elements per value scale, at most */

/* Elements per value scale for a head width. */
static inline int
g4_kv_v4_group(int head_dim)
{
	return head_dim < G4_KV_V4_GROUP_MAX ? head_dim : G4_KV_V4_GROUP_MAX;
}

enum
{
	G4_KVG_SLIDING = 0,
	G4_KVG_FULL = 1,
	G4_KVG_COUNT = 2
};

/* Bytes one head occupies in one block. */
static inline size_t
g4_kv_head_block_bytes(int dtype, int head_dim, int k_eq_v)
{
	size_t		t = G4_KV_BLOCK_TOKENS;
	size_t		d = (size_t) head_dim;

	switch (dtype)
	{
		case 0:					/* G4_KV_F32 */
			return t * d * 4 * (k_eq_v ? 1 : 2);
		case 1:					/* G4_KV_BF16 */
			return t * d * 2 * (k_eq_v ? 1 : 2);
		default:				/* G4_KV_TURBOQUANT_K8V4 */
			if (k_eq_v)
				return t * (d + 2);
			return t * (d + 2 + d / 2 + 2 * (d / (size_t) g4_kv_v4_group(head_dim)));
	}
}

/* Offsets of the parts of one head's block for turboquant_k8v4. */
static inline size_t g4_kv_tq_kscale_off(int head_dim)
{
	return (size_t) G4_KV_BLOCK_TOKENS * (size_t) head_dim;
}
static inline size_t g4_kv_tq_v_off(int head_dim)
{
	return g4_kv_tq_kscale_off(head_dim) + 2 * G4_KV_BLOCK_TOKENS;
}
static inline size_t g4_kv_tq_vscale_off(int head_dim)
{
	return g4_kv_tq_v_off(head_dim) + (size_t) G4_KV_BLOCK_TOKENS * (size_t) head_dim / 2;
}

/* Device-side description of the pool, filled by the engine. */
typedef struct
{
	int			dtype;			/* g4_kv_dtype */
	int			n_layers[G4_KVG_COUNT];
	int			n_blocks[G4_KVG_COUNT];
	size_t		layer_block_bytes[G4_KVG_COUNT];	/* one layer, one block */
	size_t		layer_stride[G4_KVG_COUNT]; /* n_blocks * layer_block_bytes */
	uint8_t    *base[G4_KVG_COUNT]; /* device memory */
	/* block tables: [max_seqs][max_blocks_per_seq] int32, device memory */
	int32_t    *block_tables[G4_KVG_COUNT];
	int			max_seqs;
	int			max_blocks_per_seq;
} g4_kv_pool_desc;

#endif
