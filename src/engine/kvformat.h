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
 *   turboquant_k8v4  (D a power of two; G = min(D, 32) values per V scale)
 *         Kq[16][D]      int8   key, Hadamard-rotated, symmetric
 *         Ks[16]         f16    key scale   = max|Hk| / 127
 *         Vq[16][D/2]    uint8  value, Hadamard-rotated, 4-bit codes:
 *                               byte j = element 2j (low nibble) | 2j+1 (high)
 *                               code c in 0..15 means (2c - 15) * scale
 *         Vs[16][D/G]    f16    value scale per G elements = max|Hv| / 15
 *         -> D + 2 + D/2 + 2D/G bytes/token: 402 B at D=256 (bf16: 1024,
 *            2.55x smaller), 802 B at D=512 (2.55x).
 *         The values' 16 levels are the odd multiples of the scale, so all
 *         16 codes are used and the largest element lands on ±15·scale;
 *         groups of 32 adapt the step to the local range.  Measured on
 *         Gemma 3 270M against per-128 scales with 15 levels, this cuts the
 *         values' share of the KL divergence by ~40 % (test/bench/QUALITY.md).
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

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "halfconv.h"			/* G4_HOSTDEV and the f16 conversions */

#define G4_KV_BLOCK_TOKENS 16
#define G4_KV_V4_GROUP_MAX 32	/* elements per value scale, at most */

/*
 * Everything below is compiled for the host and the device alike: the pool's
 * bytes and what they decode to must not depend on the backend.  Each
 * arithmetic step is one IEEE operation in round-to-nearest (on the device
 * through the _rn intrinsics, which are never contracted into an FMA).
 */
#ifdef __CUDA_ARCH__
#define G4_KV_MUL(a, b) __fmul_rn((a), (b))
#define G4_KV_ADD(a, b) __fadd_rn((a), (b))
#define G4_KV_SUB(a, b) __fsub_rn((a), (b))
#define G4_KV_DIV(a, b) __fdiv_rn((a), (b))
#define G4_KV_SQRT(a) __fsqrt_rn(a)
#else
#define G4_KV_MUL(a, b) ((a) * (b))
#define G4_KV_ADD(a, b) ((a) + (b))
#define G4_KV_SUB(a, b) ((a) - (b))
#define G4_KV_DIV(a, b) ((a) / (b))
#define G4_KV_SQRT(a) sqrtf(a)
#endif

/* Elements per value scale for a head width. */
static inline G4_HOSTDEV int
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
static inline G4_HOSTDEV size_t
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
static inline G4_HOSTDEV size_t
g4_kv_tq_kscale_off(int head_dim)
{
	return (size_t) G4_KV_BLOCK_TOKENS * (size_t) head_dim;
}
static inline G4_HOSTDEV size_t
g4_kv_tq_v_off(int head_dim)
{
	return g4_kv_tq_kscale_off(head_dim) + 2 * G4_KV_BLOCK_TOKENS;
}
static inline G4_HOSTDEV size_t
g4_kv_tq_vscale_off(int head_dim)
{
	return g4_kv_tq_v_off(head_dim) + (size_t) G4_KV_BLOCK_TOKENS * (size_t) head_dim / 2;
}

/* ---- turboquant_k8v4 quantisation rules ---- */

#define G4_KV_K8_LEVELS 127.0f	/* key codes -127..127 */
#define G4_KV_V4_STEPS 15.0f	/* value codes 0..15 mean odd multiples -15..15 */

/* max(m, |x|), keeping a NaN (which fmaxf drops): a group holding one gets
 * a NaN scale, so that it decodes to NaN and the sequence reading it fails
 * with G4_ERR_NUMERIC, where finite codes made from it would pass unseen.
 * Also the reduction step over partial maxima (x >= 0 or NaN). */
static inline G4_HOSTDEV float
g4_kv_amax_step(float m, float x)
{
	float		a = fabsf(x);

	return (a > m || isnan(a)) ? a : m;
}

/* The f16 scale of a group whose largest magnitude is amax, rounded before
 * quantising so that encoder and decoder use the same scale; *inv = 1/scale
 * (0 for an all-zero group). */
static inline G4_HOSTDEV uint16_t
g4_kv_scale(float amax, float levels, float *inv)
{
	uint16_t	s16 = g4_f32_to_f16(G4_KV_DIV(amax, levels));
	float		s = g4_f16_to_f32(s16);

	*inv = s > 0.0f ? G4_KV_DIV(1.0f, s) : 0.0f;
	return s16;
}

/* Key code: rint(x / scale) (half to even), clamped. */
static inline G4_HOSTDEV int
g4_kv_k8_code(float x, float inv)
{
	float		r = rintf(G4_KV_MUL(x, inv));

	return (int) fminf(fmaxf(r, -G4_KV_K8_LEVELS), G4_KV_K8_LEVELS);
}

static inline G4_HOSTDEV float
g4_kv_k8_value(int code, float scale)
{
	return G4_KV_MUL((float) code, scale);
}

/* Value code: the odd multiple 2c - 15 of the scale nearest to x / scale,
 * i.e. c = floor(x / (2 scale) + 8) (ties go up), clamped to 0..15. */
static inline G4_HOSTDEV int
g4_kv_v4_code(float x, float inv)
{
	float		c = floorf(G4_KV_ADD(G4_KV_MUL(G4_KV_MUL(x, inv), 0.5f), 8.0f));

	return (int) fminf(fmaxf(c, 0.0f), 15.0f);
}

static inline G4_HOSTDEV float
g4_kv_v4_value(int code, float scale)
{
	return G4_KV_MUL((float) (2 * code - 15), scale);
}

/*
 * The Hadamard transform, as butterflies in Sylvester order: stage `len`
 * (1, 2, 4, ... n/2) combines pairs (j, j + len); butterfly q of a stage
 * (0 <= q < n/2) is independent of the stage's others, so serial code runs
 * them in order and device code in parallel with a barrier between stages,
 * with the same additions either way.  Then every element is multiplied by
 * g4_hadamard_norm(n) = 1/sqrt(n).
 */
static inline G4_HOSTDEV void
g4_hadamard_butterfly(float *x, int len, int q)
{
	int			j = (q / len) * 2 * len + (q % len);
	float		a = x[j];
	float		b = x[j + len];

	x[j] = G4_KV_ADD(a, b);
	x[j + len] = G4_KV_SUB(a, b);
}

static inline G4_HOSTDEV float
g4_hadamard_norm(int n)
{
	return G4_KV_DIV(1.0f, G4_KV_SQRT((float) n));
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
