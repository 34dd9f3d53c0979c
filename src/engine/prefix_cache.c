/*
 * prefix_cache.c — sharing the KV blocks of common prompt prefixes.
 *
 * Keys.  Every full block of a prompt gets a content key: a keyed hash
 * (SipHash-2-4 under a random per-engine key, so users cannot craft
 * collisions) of the previous block's key, the block's 16 token ids, and,
 * for soft-token positions, a digest of their embedding rows and whether
 * each continues the previous position's bidirectional block.  Equal keys
 * therefore mean equal prompts up to the block's end, and equal K/V.  Only
 * full blocks of the prompt are cached; generated tokens never are.
 *
 * What is shared.  A sequence admitted with a hit of h blocks points its
 * tables at the cached blocks and starts prefill at position 16h; nothing
 * ever writes into a shared block, because a hit always ends at a block
 * boundary and the next position goes into a fresh block of its own (the
 * first divergent block is the first one the sequence writes).  A hit
 * never covers the whole prompt: the last prompt token is always computed,
 * its logits start the answer.
 *
 *  - Full-attention layers: blocks 0..h-1, the whole prefix.
 *  - Sliding-window layers: only the blocks covering the last W-1 positions
 *    before 16h (what a query at 16h can see).  Earlier sliding blocks are
 *    neither needed nor referenced.  A sliding block is referenced only
 *    while it is inside some sequence's window; after that it is free but
 *    still cached, until its memory is needed.
 *  - What is recomputed: everything from 16h on.  A hit needs both the full
 *    blocks of the prefix and the sliding blocks of its last window: the
 *    sliding K/V of a position depend on the whole prefix through the
 *    layers below, so a missing window cannot be rebuilt from the full
 *    blocks alone.  When the window before the longest full-layer hit is
 *    gone, the hit shrinks to the longest boundary whose window is still
 *    cached (possibly 0) and the rest is prefilled again.
 *  - A hit never ends inside a block of soft tokens: with bidirectional
 *    attention their K/V depend on the whole block.
 *
 * Blocks are registered once the step that computed them is done, so
 * requests admitted in the same step would all compute a prefix they
 * share; instead a request whose next block an admitted sequence is
 * prefilling waits for it (g4_prefix_pending).
 *
 * The collapse this avoids.  With plain LRU eviction the sliding blocks of
 * a shared prefix leave every window early (the sequences move on) and are
 * recycled by interleaved sequences long before the full-layer blocks; from
 * then on every hybrid hit is zero although the full layers still match
 * (vLLM issue #48435).  Here the sliding blocks of the last window before a
 * boundary that sequences were seen to share (a full-layer hit) are marked
 * "kept": the pool evicts them only after every ordinary free block, and
 * the sliding group has room for KEEP_WINDOWS such windows beyond what the
 * live sequences can ever use (kvpool.c).  A prefix's first sequence caches
 * its blocks; the second finds the full-layer blocks (and, if the window
 * survived, the sliding ones) and marks the window kept; from then on the
 * window survives any interleaving.
 */
#include "prefix_cache.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "engine_internal.h"
#include "util.h"

#define BT G4_KV_BLOCK_TOKENS

/* ---- SipHash-2-4 ---- */

#define ROTL(x, b) (uint64_t) (((x) << (b)) | ((x) >> (64 - (b))))

static void
sip_round(uint64_t v[4])
{
	v[0] += v[1];
	v[1] = ROTL(v[1], 13);
	v[1] ^= v[0];
	v[0] = ROTL(v[0], 32);
	v[2] += v[3];
	v[3] = ROTL(v[3], 16);
	v[3] ^= v[2];
	v[0] += v[3];
	v[3] = ROTL(v[3], 21);
	v[3] ^= v[0];
	v[2] += v[1];
	v[1] = ROTL(v[1], 17);
	v[1] ^= v[2];
	v[2] = ROTL(v[2], 32);
}

static uint64_t
siphash(const uint64_t key[2], const void *data, size_t len)
{
	const uint8_t *p = data;
	uint64_t	v[4] = {key[0] ^ 0x736f6d6570736575ull, key[1] ^ 0x646f72616e646f6dull,
	key[0] ^ 0x6c7967656e657261ull, key[1] ^ 0x7465646279746573ull};
	size_t		i,
				full = len & ~(size_t) 7;
	uint64_t	m;

	for (i = 0; i < full; i += 8)
	{
		m = g4_load_le(p + i, 8);
		v[3] ^= m;
		sip_round(v);
		sip_round(v);
		v[0] ^= m;
	}
	m = g4_load_le(p + full, len - full) | ((uint64_t) (len & 0xff) << 56);
	v[3] ^= m;
	sip_round(v);
	sip_round(v);
	v[0] ^= m;
	v[2] ^= 0xff;
	for (i = 0; i < 4; i++)
		sip_round(v);
	return v[0] ^ v[1] ^ v[2] ^ v[3];
}

void
g4_prefix_key_init(uint64_t key[2])
{
	if (getrandom(key, 2 * sizeof(uint64_t), 0) != (ssize_t) (2 * sizeof(uint64_t)))
	{
		/* no entropy source: still distinct per engine and per process */
		key[0] = (uint64_t) (g4_now() * 1e9) ^ (uint64_t) (uintptr_t) key;
		key[1] = siphash(key, key, sizeof(uint64_t));
	}
}

/* ---- keys of a prompt's blocks ---- */

/* What one block's key covers besides the previous key. */
typedef struct
{
	uint64_t	parent;
	int32_t		tok[BT];
	uint32_t	soft_mask;		/* positions taking an embedding row */
	uint32_t	joins_mask;		/* positions continuing the previous one's soft block */
	uint64_t	row_digest[BT];	/* of the soft positions, else 0 */
} block_content;

static int
compute_keys(g4_engine *e, g4_seq *s)
{
	size_t		H = (size_t) e->model->cfg.hidden_size;
	int			n = s->n_prompt / BT;
	int			next_embed = 0;
	uint64_t	parent = 0;
	int			i;

	s->block_hash = g4_malloc((size_t) G4_MAX(n, 1) * sizeof(uint64_t));
	if (!s->block_hash)
		return G4_ERR_NOMEM;
	for (i = 0; i < n; i++)
	{
		block_content c;
		int			j;

		memset(&c, 0, sizeof(c));
		c.parent = parent;
		memcpy(c.tok, s->tok + (size_t) i * BT, sizeof(c.tok));
		for (j = 0; j < BT; j++)
		{
			int			pos = i * BT + j;

			while (next_embed < s->n_embeds && s->embed_pos[next_embed] < pos)
				next_embed++;
			if (next_embed < s->n_embeds && s->embed_pos[next_embed] == pos)
			{
				c.soft_mask |= 1u << j;
				c.row_digest[j] = siphash(e->prefix_key, s->embed_rows + (size_t) next_embed * H, H * sizeof(float));
			}
			if (s->mm_block && pos > 0 && s->mm_block[pos] >= 0 && s->mm_block[pos - 1] == s->mm_block[pos])
				c.joins_mask |= 1u << j;
		}
		parent = s->block_hash[i] = siphash(e->prefix_key, &c, sizeof(c));
	}
	s->n_block_hash = n;
	return G4_OK;
}

/* ---- the hit ---- */

/* First sliding block a query at position pos sees (its window is
 * [pos - W + 1, pos]). */
static int
window_first_block(int W, int pos)
{
	int			lo = pos - W + 1;

	return lo <= 0 ? 0 : lo / BT;
}

/* The largest h <= blocks whose boundary 16h is not inside a block of soft
 * tokens. */
static int
soft_boundary(const g4_seq *s, int blocks)
{
	while (blocks > 0 && s->mm_block)
	{
		int			pos = blocks * BT;

		if (pos >= s->n_prompt || s->mm_block[pos] < 0 || s->mm_block[pos - 1] != s->mm_block[pos])
			break;
		blocks--;
	}
	return blocks;
}

/* The largest h <= blocks whose last window's sliding blocks are all
 * cached, scanning right to left: a missing block j rules out every
 * boundary whose window contains it, the next candidate is j itself. */
static int
sliding_fit(const g4_engine *e, const g4_seq *s, int blocks)
{
	int			W = e->model->cfg.sliding_window;
	int			h = blocks;

	while (h > 0)
	{
		int			lo = window_first_block(W, h * BT);
		int			j = h - 1;

		while (j >= lo && g4_kvpool_lookup(&e->kv, G4_KVG_SLIDING, s->block_hash[j]) >= 0)
			j--;
		if (j < lo)
			break;
		h = j;
	}
	return h;
}

/* Look up blocks [b0, b1) of s in a group and attach them to its slot. */
static int
attach_range(g4_engine *e, g4_seq *s, int group, int b0, int b1)
{
	int32_t    *blocks = g4_malloc((size_t) G4_MAX(b1 - b0, 1) * sizeof(int32_t));
	int			i,
				rc;

	if (!blocks)
		return G4_ERR_NOMEM;
	for (i = b0; i < b1; i++)
		blocks[i - b0] = g4_kvpool_lookup(&e->kv, group, s->block_hash[i]);
	rc = g4_kvpool_attach(&e->kv, s->slot, group, b0, blocks, b1 - b0);
	if (group == G4_KVG_SLIDING)
		for (i = b0; i < b1; i++)
			if (i >= s->keep_lo && i < s->keep_hi)
				g4_kvpool_keep(&e->kv, group, blocks[i - b0]);
	free(blocks);
	return rc;
}

int
g4_prefix_attach(g4_engine *e, g4_seq *s, g4_prefix_hit *hit)
{
	g4_kvpool  *p = &e->kv;
	int			W = e->model->cfg.sliding_window;
	int			has_sliding = p->desc.n_layers[G4_KVG_SLIDING] > 0;
	int			has_full = p->desc.n_layers[G4_KVG_FULL] > 0;
	int			m,
				full,
				h;
	int			rc;

	memset(hit, 0, sizeof(*hit));
	if (!p->caching)
		return G4_OK;
	if (!s->block_hash && compute_keys(e, s) != G4_OK)
		return G4_ERR_NOMEM;
	/* the last prompt token is always computed: its logits are needed */
	m = (s->n_prompt - 1) / BT;

	/* full layers: the longest run of cached blocks from the start */
	full = has_full ? 0 : m;
	while (full < m && g4_kvpool_lookup(p, G4_KVG_FULL, s->block_hash[full]) >= 0)
		full++;
	hit->lookups[G4_KVG_FULL] = has_full ? m : 0;
	full = soft_boundary(s, full);

	/* sliding layers: the window before the boundary must be cached too */
	h = full;
	if (has_sliding && full > 0)
	{
		/* sequences share this boundary: its window is worth keeping */
		s->keep_lo = window_first_block(W, full * BT);
		s->keep_hi = full;
		hit->lookups[G4_KVG_SLIDING] = full - s->keep_lo;
		for (;;)
		{
			int			fit = sliding_fit(e, s, soft_boundary(s, h));

			if (fit == h)
				break;
			h = fit;
		}
	}
	if (h == 0)
		return G4_OK;

	rc = has_full ? attach_range(e, s, G4_KVG_FULL, 0, h) : G4_OK;
	if (rc == G4_OK && has_sliding)
		rc = attach_range(e, s, G4_KVG_SLIDING, window_first_block(W, h * BT), h);
	if (rc != G4_OK)
	{
		/* leave nothing attached: the caller releases only hit->tokens,
		 * and a stale entry would have the slot's next sequence write
		 * into blocks cached under this prompt's keys */
		g4_kvpool_release(p, s->slot, h * BT);
		return rc;
	}
	hit->tokens = h * BT;
	hit->hits[G4_KVG_FULL] = has_full ? h : 0;
	hit->hits[G4_KVG_SLIDING] = has_sliding ? h - window_first_block(W, h * BT) : 0;
	return G4_OK;
}

int
g4_prefix_pending(g4_engine *e, g4_seq *s)
{
	int			m = (s->n_prompt - 1) / BT;
	int			i;

	if (!e->kv.caching || (!s->block_hash && compute_keys(e, s) != G4_OK))
		return 0;
	for (i = 0; i < e->n_seqs; i++)
	{
		const g4_seq *r = e->seqs[i];
		int			k = r->n_computed / BT;	/* r's first unfinished block */

		/* equal keys of block k mean equal prompts up to its end */
		if (r != s && r->slot >= 0 && r->block_hash && k < m && k < r->n_block_hash &&
			r->block_hash[k] == s->block_hash[k])
			return 1;
	}
	return 0;
}

void
g4_prefix_account(g4_engine *e, const g4_seq *s, const g4_prefix_hit *hit)
{
	int			g;

	if (!e->kv.caching)
		return;
	for (g = 0; g < G4_KVG_COUNT; g++)
	{
		e->kv.cache[g].lookups += (uint64_t) hit->lookups[g];
		e->kv.cache[g].hits += (uint64_t) hit->hits[g];
	}
	e->stats.prefix_query_tokens += (uint64_t) s->n_prompt;
	e->stats.prefix_hit_tokens += (uint64_t) hit->tokens;
}

void
g4_prefix_register(g4_engine *e, g4_seq *s, int from, int to)
{
	g4_kvpool  *p = &e->kv;
	int			last = G4_MIN(to / BT, s->n_block_hash);
	int			i,
				g;

	if (!p->caching || !s->block_hash || s->slot < 0)
		return;
	for (i = from / BT; i < last; i++)
		for (g = 0; g < G4_KVG_COUNT; g++)
		{
			int32_t		b = p->tables[g][(size_t) s->slot * (size_t) p->max_blocks_per_seq + (size_t) i];

			if (p->desc.n_layers[g] == 0 || b < 0)
				continue;
			b = g4_kvpool_register(p, g, b, s->block_hash[i]);
			if (g == G4_KVG_SLIDING && i >= s->keep_lo && i < s->keep_hi)
				g4_kvpool_keep(p, g, b);
		}
}
