/*
 * kvpool.c — block allocation for the paged KV pool.
 */
#include "kvpool.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

static int
group_layers(const g4_model *m, int group)
{
	int			i,
				n = 0;

	for (i = 0; i < m->cfg.n_layers; i++)
		n += (m->layers[i].kv.group == group);
	return n;
}

static size_t
layer_block_bytes(const g4_model *m, int dtype, int group)
{
	const g4_attn_type *a = &m->cfg.attn[group == G4_KVG_FULL ? 1 : 0];

	return (size_t) a->n_kv_heads * g4_kv_head_block_bytes(dtype, a->head_dim, a->k_eq_v);
}

size_t
g4_kv_group_token_bytes(const g4_model *m, int dtype, int group)
{
	return (size_t) group_layers(m, group) * layer_block_bytes(m, dtype, group) / G4_KV_BLOCK_TOKENS;
}

int
g4_kvpool_blocks_for(const g4_kvpool *p, int group, int n_tokens)
{
	int			all = G4_DIV_UP(n_tokens, G4_KV_BLOCK_TOKENS);

	if (group == G4_KVG_SLIDING)
	{
		/* a window of W tokens at any offset spans at most this many blocks */
		int			win = G4_DIV_UP(p->window - 1, G4_KV_BLOCK_TOKENS) + 1;

		return G4_MIN(all, win);
	}
	return all;
}

/* Sliding windows the prefix cache may keep beyond what live sequences use:
 * a shared prefix is only usable with the sliding blocks of its last
 * window (prefix_cache.c), so that many survive even with every slot full.
 * The room is added only where it costs at most 1/KEEP_COST_SHARE of the
 * pool (a small pool keeps its capacity; kept windows then live on the
 * sliding group's ordinary slack). */
#define KEEP_WINDOWS 2
#define KEEP_COST_SHARE 64

static int
cache_init(g4_kvpool *p, int g)
{
	g4_kv_cache_group *c = &p->cache[g];
	size_t		n = (size_t) G4_MAX(p->n_blocks[g], 1);
	uint32_t	nb = 1;
	int			i;

	while (nb < 2 * n && nb < (1u << 30))
		nb <<= 1;
	c->ref = g4_calloc(n, sizeof(int32_t));
	c->key = g4_calloc(n, sizeof(uint64_t));
	c->flags = g4_calloc(n, 1);
	c->lru_prev = g4_malloc(n * sizeof(int32_t));
	c->lru_next = g4_malloc(n * sizeof(int32_t));
	c->chain = g4_malloc(n * sizeof(int32_t));
	c->bucket = g4_malloc((size_t) nb * sizeof(int32_t));
	if (!c->ref || !c->key || !c->flags || !c->lru_prev || !c->lru_next || !c->chain || !c->bucket)
		return G4_ERR_NOMEM;
	c->bucket_mask = nb - 1;
	for (i = 0; i < (int) nb; i++)
		c->bucket[i] = -1;
	c->lru_head[0] = c->lru_head[1] = c->lru_tail[0] = c->lru_tail[1] = -1;
	return G4_OK;
}

static void
cache_free(g4_kv_cache_group *c)
{
	free(c->ref);
	free(c->key);
	free(c->flags);
	free(c->lru_prev);
	free(c->lru_next);
	free(c->chain);
	free(c->bucket);
}

void
g4_kvpool_layout(g4_kv_pool_desc *d, const g4_model *m, int dtype, int max_seqs, int max_model_len)
{
	int			g;

	memset(d, 0, sizeof(*d));
	d->dtype = dtype;
	d->max_seqs = max_seqs;
	d->max_blocks_per_seq = G4_DIV_UP(max_model_len, G4_KV_BLOCK_TOKENS);
	for (g = 0; g < G4_KVG_COUNT; g++)
	{
		d->n_layers[g] = group_layers(m, g);
		d->layer_block_bytes[g] = layer_block_bytes(m, dtype, g);
	}
}

int
g4_kvpool_init(g4_kvpool *p, g4_model *m, int dtype, size_t budget, int max_seqs, int max_model_len,
			   int max_batched_tokens, int caching, g4_err *err)
{
	g4_backend *be = m->be;
	int			g;
	int			layers[G4_KVG_COUNT];
	size_t		sliding_bytes;

	memset(p, 0, sizeof(*p));
	p->be = be;
	p->dtype = dtype;
	/* an assistant reads a little further back than the target's window */
	p->window = m->cfg.sliding_window + m->sliding_keep_extra;
	p->max_seqs = max_seqs;
	p->max_model_len = max_model_len;
	p->caching = caching;
	g4_kvpool_layout(&p->desc, m, dtype, max_seqs, max_model_len);
	p->max_blocks_per_seq = p->desc.max_blocks_per_seq;
	for (g = 0; g < G4_KVG_COUNT; g++)
	{
		layers[g] = p->desc.n_layers[g];
		p->block_bytes[g] = (size_t) layers[g] * p->desc.layer_block_bytes[g];
	}

	/* sliding: every live sequence's window plus the chunk being prefilled */
	if (layers[G4_KVG_SLIDING] > 0)
	{
		int64_t		per_seq = g4_kvpool_blocks_for(p, G4_KVG_SLIDING, max_model_len) + 1;
		int64_t		n = (int64_t) max_seqs * (per_seq + 1) +
			G4_DIV_UP(max_batched_tokens, G4_KV_BLOCK_TOKENS);

		n = G4_MIN(n, (int64_t) max_seqs * (p->max_blocks_per_seq + 1));
		if (caching && (size_t) (KEEP_WINDOWS * (per_seq - 1)) * p->block_bytes[G4_KVG_SLIDING] <=
			budget / KEEP_COST_SHARE)
			n += KEEP_WINDOWS * (per_seq - 1);
		p->n_blocks[G4_KVG_SLIDING] = (int) n;
	}
	sliding_bytes = (size_t) p->n_blocks[G4_KVG_SLIDING] * p->block_bytes[G4_KVG_SLIDING];
	if (sliding_bytes > budget)
		return g4_fail(err, G4_ERR_NOMEM,
					   "a KV pool of %.1f MiB cannot hold the sliding windows of %d sequences (%.1f MiB needed)",
					   (double) budget / 1048576.0, max_seqs, (double) sliding_bytes / 1048576.0);
	if (layers[G4_KVG_FULL] > 0)
	{
		size_t		n = (budget - sliding_bytes) / p->block_bytes[G4_KVG_FULL];

		/* no use for more blocks than every slot at full length */
		n = G4_MIN(n, (size_t) max_seqs * (size_t) p->max_blocks_per_seq);
		if (n > INT32_MAX)
			n = INT32_MAX;
		p->n_blocks[G4_KVG_FULL] = (int) n;
	}

	for (g = 0; g < G4_KVG_COUNT; g++)
	{
		size_t		bytes = (size_t) p->n_blocks[g] * p->block_bytes[g];
		size_t		table_bytes = (size_t) max_seqs * (size_t) p->max_blocks_per_seq * sizeof(int32_t);
		int			i;

		p->desc.n_blocks[g] = p->n_blocks[g];
		p->desc.layer_stride[g] = (size_t) p->n_blocks[g] * p->desc.layer_block_bytes[g];
		if (bytes > 0)
		{
			p->desc.base[g] = be->ops->alloc(be, bytes);
			if (!p->desc.base[g])
			{
				g4_kvpool_free(p);
				return g4_fail(err, G4_ERR_NOMEM, "cannot allocate %zu MiB of %s memory for the %s KV blocks",
							   bytes >> 20, be->ops->name, g == G4_KVG_FULL ? "full" : "sliding");
			}
		}
		p->bytes_total += bytes;
		p->desc.block_tables[g] = be->ops->alloc(be, table_bytes);
		p->table_bytes_total += table_bytes;
		p->tables[g] = g4_malloc(table_bytes);
		p->free_list[g] = g4_malloc((size_t) G4_MAX(p->n_blocks[g], 1) * sizeof(int32_t));
		if (!p->desc.block_tables[g] || !p->tables[g] || !p->free_list[g])
		{
			g4_kvpool_free(p);
			return g4_fail(err, G4_ERR_NOMEM, "out of memory for KV block tables");
		}
		memset(p->tables[g], 0xff, table_bytes);
		if (be->ops->upload(be, p->desc.block_tables[g], p->tables[g], table_bytes) != G4_OK)
		{
			g4_kvpool_free(p);
			return g4_fail(err, G4_ERR_BACKEND, "cannot initialise the KV block tables");
		}
		/* hand out low block ids first */
		for (i = 0; i < p->n_blocks[g]; i++)
			p->free_list[g][i] = p->n_blocks[g] - 1 - i;
		p->n_free[g] = p->n_plain[g] = p->n_blocks[g];
		if (caching && cache_init(p, g) != G4_OK)
		{
			g4_kvpool_free(p);
			return g4_fail(err, G4_ERR_NOMEM, "out of memory for the prefix cache's tables");
		}
	}
	if (caching)
		p->cache[G4_KVG_SLIDING].keep_cap = KEEP_WINDOWS * g4_kvpool_blocks_for(p, G4_KVG_SLIDING, max_model_len);
	p->sliding_first = g4_calloc((size_t) max_seqs, sizeof(int));
	if (!p->sliding_first)
	{
		g4_kvpool_free(p);
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	}
	if (be->ops->kv_configure(be, &p->desc) != G4_OK)
	{
		g4_kvpool_free(p);
		return g4_fail(err, G4_ERR_BACKEND, "the %s backend refused the KV pool layout", be->ops->name);
	}
	return G4_OK;
}

void
g4_kvpool_free(g4_kvpool *p)
{
	int			g;

	for (g = 0; g < G4_KVG_COUNT; g++)
	{
		if (p->desc.base[g])
			p->be->ops->free(p->be, p->desc.base[g]);
		if (p->desc.block_tables[g])
			p->be->ops->free(p->be, p->desc.block_tables[g]);
		free(p->tables[g]);
		free(p->free_list[g]);
		cache_free(&p->cache[g]);
	}
	free(p->sliding_first);
	memset(p, 0, sizeof(*p));
}

static int32_t *
entry(g4_kvpool *p, int group, int slot, int b)
{
	return &p->tables[group][(size_t) slot * (size_t) p->max_blocks_per_seq + (size_t) b];
}

/* ---- free cached blocks: two LRU tiers ---- */

static void
lru_unlink(g4_kv_cache_group *c, int32_t b, int tier)
{
	int32_t		pv = c->lru_prev[b],
				nx = c->lru_next[b];

	if (pv >= 0)
		c->lru_next[pv] = nx;
	else
		c->lru_head[tier] = nx;
	if (nx >= 0)
		c->lru_prev[nx] = pv;
	else
		c->lru_tail[tier] = pv;
	c->n_tier[tier]--;
}

/* Append at the most recent end of a tier (at_oldest: at the other end). */
static void
lru_push(g4_kv_cache_group *c, int32_t b, int tier, int at_oldest)
{
	if (at_oldest)
	{
		c->lru_prev[b] = -1;
		c->lru_next[b] = c->lru_head[tier];
		if (c->lru_head[tier] >= 0)
			c->lru_prev[c->lru_head[tier]] = b;
		else
			c->lru_tail[tier] = b;
		c->lru_head[tier] = b;
	}
	else
	{
		c->lru_next[b] = -1;
		c->lru_prev[b] = c->lru_tail[tier];
		if (c->lru_tail[tier] >= 0)
			c->lru_next[c->lru_tail[tier]] = b;
		else
			c->lru_head[tier] = b;
		c->lru_tail[tier] = b;
	}
	c->n_tier[tier]++;
}

static int
tier_of(const g4_kv_cache_group *c, int32_t b)
{
	return (c->flags[b] & G4_KVB_KEEP) != 0;
}

/* Forget a cached block's key (it is about to hold other content). */
static void
uncache(g4_kv_cache_group *c, int32_t b)
{
	int32_t    *pp = &c->bucket[c->key[b] & c->bucket_mask];

	while (*pp != b)
		pp = &c->chain[*pp];
	*pp = c->chain[b];
	c->n_cached--;
	c->n_kept -= tier_of(c, b);
	c->flags[b] = 0;
}

/* A free block for new content: a plain one, else the least recently freed
 * ordinary cached one, else the least recently freed kept one. */
static int32_t
take_block(g4_kvpool *p, int g)
{
	g4_kv_cache_group *c = &p->cache[g];
	int32_t		b;
	int			tier;

	p->n_free[g]--;
	if (p->n_plain[g] > 0)
		b = p->free_list[g][--p->n_plain[g]];
	else
	{
		tier = c->n_tier[0] > 0 ? 0 : 1;
		b = c->lru_head[tier];
		lru_unlink(c, b, tier);
		uncache(c, b);
	}
	if (p->caching)
		c->ref[b] = 1;
	return b;
}

/* A slot lets go of a block: the last reference frees it, keeping its
 * content findable when it is cached. */
static void
drop_block(g4_kvpool *p, int g, int32_t b)
{
	g4_kv_cache_group *c = &p->cache[g];

	if (p->caching && --c->ref[b] > 0)
		return;
	p->n_free[g]++;
	if (p->caching && (c->flags[b] & G4_KVB_CACHED))
		lru_push(c, b, tier_of(c, b), 0);
	else
		p->free_list[g][p->n_plain[g]++] = b;
}

int
g4_kvpool_ensure(g4_kvpool *p, int slot, int from, int to)
{
	int			g;
	int			need[G4_KVG_COUNT] = {0, 0};
	int			b0 = from / G4_KV_BLOCK_TOKENS;
	int			b1 = G4_DIV_UP(to, G4_KV_BLOCK_TOKENS);
	int			b;

	if (to <= from)
		return G4_OK;
	if (b1 > p->max_blocks_per_seq)
		return G4_ERR_TOO_LONG;
	for (g = 0; g < G4_KVG_COUNT; g++)
		if (p->desc.n_layers[g] > 0)
			for (b = b0; b < b1; b++)
				need[g] += (*entry(p, g, slot, b) < 0);
	for (g = 0; g < G4_KVG_COUNT; g++)
		if (need[g] > p->n_free[g])
			return G4_ERR_BUSY;
	for (g = 0; g < G4_KVG_COUNT; g++)
	{
		int			changed = 0;

		if (p->desc.n_layers[g] == 0)
			continue;
		for (b = b0; b < b1; b++)
		{
			int32_t    *e = entry(p, g, slot, b);

			if (*e < 0)
			{
				*e = take_block(p, g);
				changed = 1;
			}
		}
		if (changed && g4_kvpool_sync_row(p, slot, g, b0, b1) != G4_OK)
			return G4_ERR_BACKEND;
	}
	return G4_OK;
}

void
g4_kvpool_trim_window(g4_kvpool *p, int slot, int keep_from, int n_positions)
{
	int			g = G4_KVG_SLIDING;
	int			first = p->sliding_first[slot];
	int			last = keep_from / G4_KV_BLOCK_TOKENS;	/* blocks < last are entirely before */
	int			b;

	if (p->desc.n_layers[g] == 0 || last <= first)
		return;
	last = G4_MIN(last, G4_DIV_UP(n_positions, G4_KV_BLOCK_TOKENS));
	for (b = first; b < last; b++)
	{
		int32_t    *e = entry(p, g, slot, b);

		if (*e >= 0)
		{
			drop_block(p, g, *e);
			*e = -1;
		}
	}
	if (last > first)
	{
		g4_kvpool_sync_row(p, slot, g, first, last);
		p->sliding_first[slot] = last;
	}
}

void
g4_kvpool_truncate(g4_kvpool *p, int slot, int keep, int used)
{
	int			b0 = G4_DIV_UP(keep, G4_KV_BLOCK_TOKENS);
	int			b1 = G4_MIN(G4_DIV_UP(used, G4_KV_BLOCK_TOKENS), p->max_blocks_per_seq);
	int			g;

	for (g = 0; g < G4_KVG_COUNT; g++)
	{
		int			b,
					changed = 0;

		for (b = b0; b < b1; b++)
		{
			int32_t    *e = entry(p, g, slot, b);

			if (*e >= 0)
			{
				drop_block(p, g, *e);
				*e = -1;
				changed = 1;
			}
		}
		if (changed)
			g4_kvpool_sync_row(p, slot, g, b0, b1);
	}
}

void
g4_kvpool_forget(g4_kvpool *p, int slot, int n_positions)
{
	int			nb = G4_MIN(G4_DIV_UP(n_positions, G4_KV_BLOCK_TOKENS), p->max_blocks_per_seq);
	int			g,
				b;

	if (!p->caching)
		return;
	for (g = 0; g < G4_KVG_COUNT; g++)
		for (b = 0; b < nb; b++)
		{
			int32_t		blk = *entry(p, g, slot, b);

			/* held by the slot, so in no free list */
			if (blk >= 0 && (p->cache[g].flags[blk] & G4_KVB_CACHED))
				uncache(&p->cache[g], blk);
		}
}

void
g4_kvpool_release(g4_kvpool *p, int slot, int n_positions)
{
	int			g;
	int			nb = G4_MIN(G4_DIV_UP(n_positions, G4_KV_BLOCK_TOKENS), p->max_blocks_per_seq);

	for (g = 0; g < G4_KVG_COUNT; g++)
	{
		int			b;

		/* last block first: a prefix's tail is evicted before its head */
		for (b = nb - 1; b >= 0; b--)
		{
			int32_t    *e = entry(p, g, slot, b);

			if (*e >= 0)
			{
				drop_block(p, g, *e);
				*e = -1;
			}
		}
		if (nb > 0)
			g4_kvpool_sync_row(p, slot, g, 0, nb);
	}
	p->sliding_first[slot] = 0;
}

int
g4_kvpool_slot_blocks(const g4_kvpool *p, int slot, int group, int n_positions)
{
	int			nb = G4_MIN(G4_DIV_UP(n_positions, G4_KV_BLOCK_TOKENS), p->max_blocks_per_seq);
	int			b,
				n = 0;
	int			first = group == G4_KVG_SLIDING ? p->sliding_first[slot] : 0;

	for (b = first; b < nb; b++)
		n += p->tables[group][(size_t) slot * (size_t) p->max_blocks_per_seq + (size_t) b] >= 0;
	return n;
}

int
g4_kvpool_sync_row(g4_kvpool *p, int slot, int group, int b0, int b1)
{
	size_t		off = (size_t) slot * (size_t) p->max_blocks_per_seq + (size_t) b0;

	if (b1 <= b0)
		return G4_OK;
	return p->be->ops->upload(p->be, p->desc.block_tables[group] + off, p->tables[group] + off,
							  (size_t) (b1 - b0) * sizeof(int32_t));
}

int64_t
g4_kvpool_fit(const g4_kvpool *p, int n_tokens)
{
	int64_t		fit = INT64_MAX;
	int			g;

	for (g = 0; g < G4_KVG_COUNT; g++)
	{
		int			per;

		if (p->desc.n_layers[g] == 0)
			continue;
		per = g4_kvpool_blocks_for(p, g, n_tokens);
		if (per > 0)
			fit = G4_MIN(fit, (int64_t) p->n_free[g] / per);
	}
	return fit == INT64_MAX ? 0 : fit;
}

/* ---- prefix cache ---- */

int32_t
g4_kvpool_lookup(const g4_kvpool *p, int group, uint64_t key)
{
	const g4_kv_cache_group *c = &p->cache[group];
	int32_t		b;

	for (b = c->bucket[key & c->bucket_mask]; b >= 0; b = c->chain[b])
		if (c->key[b] == key)
			return b;
	return -1;
}

int
g4_kvpool_attach(g4_kvpool *p, int slot, int group, int b0, const int32_t *blocks, int n)
{
	g4_kv_cache_group *c = &p->cache[group];
	int			i;

	for (i = 0; i < n; i++)
	{
		int32_t		b = blocks[i];

		if (c->ref[b]++ == 0)
		{
			/* a free cached block comes back into use */
			lru_unlink(c, b, tier_of(c, b));
			p->n_free[group]--;
		}
		*entry(p, group, slot, b0 + i) = b;
	}
	if (group == G4_KVG_SLIDING)
		p->sliding_first[slot] = b0;
	return g4_kvpool_sync_row(p, slot, group, b0, b0 + n);
}

int32_t
g4_kvpool_register(g4_kvpool *p, int group, int32_t block, uint64_t key)
{
	g4_kv_cache_group *c = &p->cache[group];
	int32_t		have = g4_kvpool_lookup(p, group, key);
	uint32_t	h = key & c->bucket_mask;

	if (have >= 0 || (c->flags[block] & G4_KVB_CACHED))
		return have >= 0 ? have : block;
	c->key[block] = key;
	c->flags[block] = G4_KVB_CACHED;
	c->chain[block] = c->bucket[h];
	c->bucket[h] = block;
	c->n_cached++;
	return block;
}

void
g4_kvpool_keep(g4_kvpool *p, int group, int32_t block)
{
	g4_kv_cache_group *c = &p->cache[group];
	int			is_free = c->ref[block] == 0;

	if (c->flags[block] != G4_KVB_CACHED)
		return;					/* already kept, or not cached */
	if (c->n_kept >= c->keep_cap)
	{
		int32_t		old = c->lru_head[1];

		if (old < 0)
			return;
		/* the longest-free kept block becomes the next ordinary victim */
		lru_unlink(c, old, 1);
		c->flags[old] &= (uint8_t) ~G4_KVB_KEEP;
		c->n_kept--;
		lru_push(c, old, 0, 1);
	}
	if (is_free)
		lru_unlink(c, block, 0);
	c->flags[block] |= G4_KVB_KEEP;
	c->n_kept++;
	if (is_free)
		lru_push(c, block, 1, 0);
}
