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

int
g4_kvpool_init(g4_kvpool *p, g4_model *m, int dtype, size_t budget, int max_seqs, int max_model_len,
			   int max_batched_tokens, g4_err *err)
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
	p->max_blocks_per_seq = G4_DIV_UP(max_model_len, G4_KV_BLOCK_TOKENS);
	for (g = 0; g < G4_KVG_COUNT; g++)
	{
		layers[g] = group_layers(m, g);
		p->desc.n_layers[g] = layers[g];
		p->desc.layer_block_bytes[g] = layer_block_bytes(m, dtype, g);
		p->block_bytes[g] = (size_t) layers[g] * p->desc.layer_block_bytes[g];
	}

	/* sliding: every live sequence's window plus the chunk being prefilled */
	if (layers[G4_KVG_SLIDING] > 0)
	{
		int64_t		per_seq = g4_kvpool_blocks_for(p, G4_KVG_SLIDING, max_model_len) + 1;
		int64_t		n = (int64_t) max_seqs * (per_seq + 1) +
			G4_DIV_UP(max_batched_tokens, G4_KV_BLOCK_TOKENS);

		n = G4_MIN(n, (int64_t) max_seqs * (p->max_blocks_per_seq + 1));
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
		p->n_free[g] = p->n_blocks[g];
	}
	p->sliding_first = g4_calloc((size_t) max_seqs, sizeof(int));
	if (!p->sliding_first)
	{
		g4_kvpool_free(p);
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	}
	p->desc.dtype = dtype;
	p->desc.max_seqs = max_seqs;
	p->desc.max_blocks_per_seq = p->max_blocks_per_seq;
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
	}
	free(p->sliding_first);
	memset(p, 0, sizeof(*p));
}

static int32_t *
entry(g4_kvpool *p, int group, int slot, int b)
{
	return &p->tables[group][(size_t) slot * (size_t) p->max_blocks_per_seq + (size_t) b];
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
				*e = p->free_list[g][--p->n_free[g]];
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
			p->free_list[g][p->n_free[g]++] = *e;
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
				p->free_list[g][p->n_free[g]++] = *e;
				*e = -1;
				changed = 1;
			}
		}
		if (changed)
			g4_kvpool_sync_row(p, slot, g, b0, b1);
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

		for (b = 0; b < nb; b++)
		{
			int32_t    *e = entry(p, g, slot, b);

			if (*e >= 0)
			{
				p->free_list[g][p->n_free[g]++] = *e;
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
