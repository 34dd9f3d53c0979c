/*
 * kvpool.h — the paged KV pool's bookkeeping on the host: block free lists
 * for the sliding and full layer groups, per-sequence block tables (mirrored
 * to the device), and truthful capacity figures.
 *
 * Sizing: the sliding group gets exactly what the live sequences can ever
 * need at once (each holds at most its window plus the prefill chunk in
 * flight); every remaining byte goes to the full group, whose blocks are
 * what long contexts consume.
 */
#ifndef G4_KVPOOL_H
#define G4_KVPOOL_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "model.h"

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
	int32_t    *free_list[G4_KVG_COUNT];
	size_t		block_bytes[G4_KVG_COUNT];	/* all layers of the group */
	int32_t    *tables[G4_KVG_COUNT];	/* host mirror [max_seqs][max_blocks_per_seq] */
	int		   *sliding_first;	/* per slot: first sliding table entry that may be live */
	size_t		bytes_total;
} g4_kvpool;

/* Bytes per token per layer group (all layers of the group). */
size_t		g4_kv_group_token_bytes(const g4_model *m, int dtype, int group);

/* Create a pool of `budget` bytes of device memory. */
int			g4_kvpool_init(g4_kvpool *p, g4_model *m, int dtype, size_t budget, int max_seqs,
						   int max_model_len, int max_batched_tokens, g4_err *err);
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

/* How many more sequences of n tokens fit in the free blocks now. */
int64_t		g4_kvpool_fit(const g4_kvpool *p, int n_tokens);

#endif
