/*
 * kvpool.h — the paged KV pool's bookkeeping on the host: block free lists
 * for the sliding and full layer groups, per-sequence block tables (mirrored
 * to the device), and truthful capacity figures.
 *
 * Sizing: the sliding group gets exactly what the live sequences can ever
 * need at once (each holds at most its window plus the prefill chunk in
 * flight); every remaining byte goes to the full group, whose blocks are
 * what long contexts consume.
 *
 * Prefix caching: a block may be shared by several slots (reference
 * counted) and may carry a content key (prefix_cache.c computes it) under
 * which a later sequence finds it.  A cached block whose last reference
 * goes stays cached but free: it is reused for other content only when no
 * plain free block is left, least recently released first.  Free cached
 * blocks form two tiers: ordinary ones are evicted before "kept" ones (the
 * sliding blocks of the last window before a prefix boundary several
 * sequences shared, see prefix_cache.c).  n_free counts every block an
 * allocation may take: plain free blocks and free cached ones.
 */
#ifndef G4_KVPOOL_H
#define G4_KVPOOL_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "model.h"

/* Prefix-cache bookkeeping of one layer group (per block unless noted). */
typedef struct
{
	int32_t    *ref;			/* slots whose table holds the block */
	uint64_t   *key;			/* content key while cached */
	uint8_t    *flags;			/* G4_KVB_* */
	int32_t    *lru_prev,
			   *lru_next;		/* free cached blocks, per tier, oldest first */
	int32_t		lru_head[2],
				lru_tail[2];
	int			n_tier[2];		/* free cached blocks per tier */
	int32_t    *bucket;			/* key -> first block, [bucket_mask + 1] */
	int32_t    *chain;			/* next block in the same bucket */
	uint32_t	bucket_mask;
	int			n_cached;		/* blocks holding a key, free or in use */
	int			keep_cap;		/* most blocks marked "kept" at once */
	int			n_kept;
	uint64_t	lookups;		/* blocks asked of the cache at admissions */
	uint64_t	hits;			/* blocks it supplied */
} g4_kv_cache_group;

enum
{
	G4_KVB_CACHED = 1,
	G4_KVB_KEEP = 2
};

typedef struct
{
	g4_backend *be;
	int			dtype;
	int			window;			/* sliding window in tokens */
	int			max_seqs;
	int			max_model_len;
	int			max_blocks_per_seq;
	g4_kv_pool_desc desc;		/* device side */
	/* per group */
	int			n_blocks[G4_KVG_COUNT];
	int			n_free[G4_KVG_COUNT];
	int32_t    *free_list[G4_KVG_COUNT];	/* plain (uncached) free blocks */
	int			n_plain[G4_KVG_COUNT];
	int			caching;		/* prefix caching on */
	g4_kv_cache_group cache[G4_KVG_COUNT];
	size_t		block_bytes[G4_KVG_COUNT];	/* all layers of the group */
	int32_t    *tables[G4_KVG_COUNT];	/* host mirror [max_seqs][max_blocks_per_seq] */
	int		   *sliding_first;	/* per slot: first sliding table entry that may be live */
	size_t		bytes_total;	/* the blocks */
	size_t		table_bytes_total;	/* the block tables on the device */
} g4_kvpool;

/* Bytes per token per layer group (all layers of the group). */
size_t		g4_kv_group_token_bytes(const g4_model *m, int dtype, int group);

/* The pool's layout for a backend, without its blocks (no memory): what a
 * backend needs to choose its kernels (dry_steps.c). */
void		g4_kvpool_layout(g4_kv_pool_desc *d, const g4_model *m, int dtype, int max_seqs, int max_model_len);

/* Create a pool of `budget` bytes of device memory (with the prefix cache's
 * bookkeeping when `caching`). */
int			g4_kvpool_init(g4_kvpool *p, g4_model *m, int dtype, size_t budget, int max_seqs,
						   int max_model_len, int max_batched_tokens, int caching, g4_err *err);
void		g4_kvpool_free(g4_kvpool *p);

/* Blocks of a group a sequence of n tokens holds in steady state. */
int			g4_kvpool_blocks_for(const g4_kvpool *p, int group, int n_tokens);

/* Ensure the blocks covering positions [from, to) of a slot are allocated;
 * fails (G4_ERR_BUSY) without allocating anything when the pool is short. */
int			g4_kvpool_ensure(g4_kvpool *p, int slot, int from, int to);

/* Free sliding blocks lying entirely before position `keep_from`. */
void		g4_kvpool_trim_window(g4_kvpool *p, int slot, int keep_from, int n_positions);

/* Free the blocks holding only positions >= keep of a slot that used
 * positions up to `used` (rejected speculative positions). */
void		g4_kvpool_truncate(g4_kvpool *p, int slot, int keep, int used);

/* Free every block of a slot (n_positions: how far the slot was used). */
void		g4_kvpool_release(g4_kvpool *p, int slot, int n_positions);

/* Blocks a slot holds in a group. */
int			g4_kvpool_slot_blocks(const g4_kvpool *p, int slot, int group, int n_positions);

/* Copy a slot's table entries [b0, b1) of a group to the device. */
int			g4_kvpool_sync_row(g4_kvpool *p, int slot, int group, int b0, int b1);

/* ---- prefix cache (only with p->caching) ---- */

/* The block cached under `key` in a group, or -1. */
int32_t		g4_kvpool_lookup(const g4_kvpool *p, int group, uint64_t key);

/* Put cached blocks into a slot's table at entries [b0, b0 + n) (entries
 * that must be unset) and take a reference on each. */
int			g4_kvpool_attach(g4_kvpool *p, int slot, int group, int b0, const int32_t *blocks, int n);

/* Give a block the slot computed the content key `key`; when another
 * block already holds that key, nothing changes.  Returns the block now
 * cached under the key. */
int32_t		g4_kvpool_register(g4_kvpool *p, int group, int32_t block, uint64_t key);

/* Withdraw a slot's blocks (positions below n_positions) from the cache:
 * no new prompt attaches them; they are freed as plain blocks when their
 * last holder lets go. */
void		g4_kvpool_forget(g4_kvpool *p, int slot, int n_positions);

/* Mark a cached block "kept": evicted only after every ordinary one.  At
 * most keep_cap blocks are kept; past it, the longest-free kept block goes
 * back to the ordinary tier (none free: the mark is not given). */
void		g4_kvpool_keep(g4_kvpool *p, int group, int32_t block);

/* How many more sequences of n tokens fit in the free blocks now. */
int64_t		g4_kvpool_fit(const g4_kvpool *p, int n_tokens);

#endif
