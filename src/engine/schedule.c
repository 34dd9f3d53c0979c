/*
 * schedule.c — continuous batching: which sequences run in the next step and
 * with how many tokens, the KV blocks they need, and the step's metadata.
 *
 * Policy (one step, a budget of max_num_batched_tokens tokens):
 *  1. every admitted sequence that is decoding gets its one token;
 *  2. then the decodes' drafts (speculative.c), oldest first, from the
 *     budget left, and from the free blocks the prefill chunks leave;
 *  3. admitted sequences still prefilling get chunks of their prompt, oldest
 *     first, never splitting an image's block of soft tokens (its tokens
 *     attend to each other, so they must be in the pool together).  While
 *     such a block does not fit the budget the decodes leave, the step
 *     drafts nothing and admits no one (prefill_blocked);
 *  4. waiting sequences are admitted in arrival order while a slot, budget
 *     and KV blocks are available; the first that does not fit stops
 *     admission, so nobody starves.  A sequence whose prompt starts with
 *     cached blocks (prefix_cache.c) is admitted with them already computed
 *     and prefills only the rest; one whose next blocks an admitted sequence
 *     is prefilling right now waits until they are cached (or that
 *     sequence is preempted), letting later arrivals go first.
 * When a running sequence needs a block and the pool is empty, the most
 * recently admitted sequence is preempted: its blocks are freed and it goes
 * back to waiting, to be recomputed from its tokens later (dropping its
 * references to shared blocks; its own prompt blocks stay cached, so its
 * readmission usually finds them).
 */
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "util.h"

void
g4_schedule_free(g4_schedule *sc)
{
	free(sc->items);
	memset(sc, 0, sizeof(*sc));
}

/* The positions a sequence's slot may hold blocks for: a verify step's
 * drafts may hold blocks past the tokens. */
static int
slot_positions(const g4_seq *s)
{
	return s->n_tok + 1 + s->n_draft;
}

void
g4_release_slot(g4_engine *e, g4_seq *s)
{
	if (s->slot < 0)
		return;
	g4_kvpool_release(&e->kv, s->slot, slot_positions(s));
	e->slot_used[s->slot] = 0;
	s->slot = -1;
}

void
g4_forget_slot(g4_engine *e, g4_seq *s)
{
	if (s->slot >= 0)
		g4_kvpool_forget(&e->kv, s->slot, slot_positions(s));
}

void
g4_seq_trim_window(g4_engine *e, g4_seq *s)
{
	/* the next query is at n_computed: older blocks leave the window (the
	 * pool's window includes what a draft model reads beyond it) */
	int			keep = s->n_computed - e->kv.window + 1;

	if (keep > 0 && s->slot >= 0)
		g4_kvpool_trim_window(&e->kv, s->slot, keep, s->n_computed);
}

static int
add_item(g4_schedule *sc, g4_seq *s, int start, int count, int wants_logits)
{
	if (sc->n_items == sc->cap_items)
	{
		int			cap = sc->cap_items ? sc->cap_items * 2 : 32;
		g4_sched_item *p = realloc(sc->items, (size_t) cap * sizeof(g4_sched_item));

		if (!p)
			return G4_ERR_NOMEM;
		sc->items = p;
		sc->cap_items = cap;
	}
	sc->items[sc->n_items].seq = s;
	sc->items[sc->n_items].start = start;
	sc->items[sc->n_items].count = count;
	sc->items[sc->n_items].wants_logits = wants_logits;
	sc->items[sc->n_items].n_draft = 0;
	sc->n_items++;
	sc->n_tokens += count;
	sc->n_logits += wants_logits;
	return G4_OK;
}

static int
scheduled(const g4_schedule *sc, const g4_seq *s)
{
	int			i;

	for (i = 0; i < sc->n_items; i++)
		if (sc->items[i].seq == s)
			return 1;
	return 0;
}

static void
preempt(g4_engine *e, g4_seq *s)
{
	e->stats.preemptions++;
	g4_release_slot(e, s);
	s->n_draft = 0;
	s->n_computed = 0;
	s->state = G4_SEQ_WAITING;
}

/* The youngest admitted sequence not yet part of this step, or NULL. */
static g4_seq *
preemption_victim(g4_engine *e, const g4_schedule *sc, const g4_seq *except)
{
	g4_seq	   *victim = NULL;
	int			i;

	for (i = 0; i < e->n_seqs; i++)
	{
		g4_seq	   *s = e->seqs[i];

		if (s->slot < 0 || s == except || scheduled(sc, s))
			continue;
		if (!victim || s->admit_order > victim->admit_order)
			victim = s;
	}
	return victim;
}

/* Make [from, to) of s writable, preempting younger sequences if needed. */
static int
reserve(g4_engine *e, g4_schedule *sc, g4_seq *s, int from, int to)
{
	for (;;)
	{
		int			rc = g4_kvpool_ensure(&e->kv, s->slot, from, to);
		g4_seq	   *victim;

		if (rc != G4_ERR_BUSY)
			return rc;
		victim = preemption_victim(e, sc, s);
		if (!victim || victim->admit_order < s->admit_order)
			return G4_ERR_BUSY;
		preempt(e, victim);
	}
}

/* Largest chunk <= want starting at `from` that does not split a block of
 * soft tokens; 0 when the block at `from` does not fit. */
static int
chunk_size(const g4_seq *s, int from, int want)
{
	int			end = from + want;

	if (!s->mm_block || end >= s->n_prompt || end <= from)
		return want;
	if (s->mm_block[end] >= 0 && s->mm_block[end - 1] == s->mm_block[end])
	{
		int			b = s->mm_block[end];

		while (end > from && s->mm_block[end - 1] == b)
			end--;
	}
	return end - from;
}

/* An admitted sequence in one step: its decode's item, and its drafts
 * (proposed, then the budget kept for them). */
typedef struct
{
	g4_seq	   *s;
	int			item;			/* its decode's item, or -1 */
	int			proposed;
	int			draft_budget;
} running_seq;

static int
cmp_admit(const void *a, const void *b)
{
	const g4_seq *x = ((const running_seq *) a)->s;
	const g4_seq *y = ((const running_seq *) b)->s;

	return x->admit_order < y->admit_order ? -1 : (x->admit_order > y->admit_order);
}

/*
 * Whether an admitted prompt's next block of soft tokens does not fit the
 * budget left after the decodes.  The step then drafts nothing and admits
 * no one, so that the budget grows as decodes end: otherwise the decodes
 * of later arrivals could keep it short of the block for ever.
 */
static int
prefill_blocked(const running_seq *running, int n_running, int budget)
{
	int			i;

	for (i = 0; i < n_running && budget > 0; i++)
	{
		const g4_seq *s = running[i].s;
		int			remaining = s->n_tok - s->n_computed;

		if (s->slot >= 0 && remaining > 1 && chunk_size(s, s->n_computed, G4_MIN(remaining, budget)) <= 0)
			return 1;
	}
	return 0;
}

/* Verify up to `want` of a scheduled decode's drafts in its item, from the
 * free blocks left (never another sequence's: a draft is a guess); *taken:
 * the drafts granted. */
static int
grant_drafts(g4_engine *e, g4_schedule *sc, g4_seq *s, int item, int want, int *taken)
{
	g4_sched_item *it = &sc->items[item];
	int			rc;

	*taken = 0;
	if (want <= 0)
		return G4_OK;
	rc = g4_kvpool_ensure(&e->kv, s->slot, it->start, it->start + 1 + want);
	if (rc != G4_OK)
		return rc == G4_ERR_BUSY ? G4_OK : rc;
	s->n_draft = want;
	it->count += want;
	it->n_draft = want;
	sc->n_tokens += want;
	sc->n_logits += want;
	*taken = want;
	return G4_OK;
}

int
g4_schedule_step(g4_engine *e, g4_schedule *sc, g4_event_fn fn, void *ctx, g4_err *err)
{
	int			budget = e->max_batched;
	running_seq *running;
	int			n_running = 0;
	int			blocked = 0;
	int			i;
	int			pass;
	int			rc = G4_OK;

	sc->n_items = 0;
	sc->n_tokens = 0;
	sc->n_logits = 0;
	running = g4_malloc((size_t) G4_MAX(e->n_seqs, 1) * sizeof(running_seq));
	if (!running)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	for (i = 0; i < e->n_seqs; i++)
		if (e->seqs[i]->slot >= 0)
			running[n_running++] = (running_seq) {e->seqs[i], -1, 0, 0};
	qsort(running, (size_t) n_running, sizeof(running_seq), cmp_admit);

	/* pass 0: each decode's token; 1: the budget of the decodes' drafts,
	 * verified in the same step; 2: prefill chunks.  Oldest first in each,
	 * so that every decode has its token before any sequence's drafts. */
	for (pass = 0; pass < 3; pass++)
	{
		if (pass == 1)
			blocked = prefill_blocked(running, n_running, budget);
		for (i = 0; i < n_running && budget > 0; i++)
		{
			running_seq *r = &running[i];
			g4_seq	   *s = r->s;
			int			remaining = s->n_tok - s->n_computed;
			int			count;

			if (s->slot < 0 || remaining <= 0 || (pass < 2) != (remaining == 1))
				continue;		/* preempted meanwhile, or not this pass */
			if (pass == 1)
			{
				/* the budget now; the blocks after the prefill chunks */
				if (r->item >= 0 && !blocked)
				{
					r->draft_budget = G4_MIN(r->proposed, budget);
					budget -= r->draft_budget;
				}
				continue;
			}
			if (pass == 0)
			{
				/* the drafts wait for pass 1 */
				r->proposed = s->n_draft;
				s->n_draft = 0;
			}
			count = pass == 0 ? 1 : chunk_size(s, s->n_computed, G4_MIN(remaining, budget));
			if (count <= 0)
				continue;
			rc = reserve(e, sc, s, s->n_computed, s->n_computed + count);
			if (rc == G4_ERR_BUSY)
			{
				/* nothing younger to evict: this one waits its turn again */
				preempt(e, s);
				rc = G4_OK;
				continue;
			}
			if (rc != G4_OK)
			{
				g4_fail(err, rc, "cannot allocate KV blocks");
				goto done;
			}
			if (add_item(sc, s, s->n_computed, count, s->n_computed + count >= s->n_tok) != G4_OK)
			{
				rc = g4_fail(err, G4_ERR_NOMEM, "out of memory");
				goto done;
			}
			if (pass == 0)
				r->item = sc->n_items - 1;
			s->state = pass == 0 ? G4_SEQ_DECODE : G4_SEQ_PREFILL;
			budget -= count;
		}
	}

	/* the drafts' blocks, from what the prefill chunks left: a draft is a
	 * guess, so it never makes a chunk preempt anyone; budget a draft does
	 * not get goes to admission */
	for (i = 0; i < n_running; i++)
	{
		running_seq *r = &running[i];
		int			taken = 0;

		if (r->draft_budget <= 0 || r->s->slot < 0)
			continue;
		rc = grant_drafts(e, sc, r->s, r->item, r->draft_budget, &taken);
		if (rc != G4_OK)
		{
			g4_fail(err, rc, "cannot allocate KV blocks");
			goto done;
		}
		budget += r->draft_budget - taken;
	}

	/* admission, in arrival order */
	for (i = 0; i < e->n_seqs && budget > 0 && !blocked; i++)
	{
		g4_seq	   *s = e->seqs[i];
		g4_prefix_hit hit;
		int			slot;
		int			start;
		int			count;

		if (s->slot >= 0 || scheduled(sc, s))
			continue;
		for (slot = 0; slot < e->max_seqs && e->slot_used[slot]; slot++)
			;
		if (slot == e->max_seqs)
			break;
		/* prefix caching: a prompt whose next blocks another sequence is
		 * prefilling right now waits for them (later arrivals go first)
		 * rather than computing the same blocks a second time */
		if (g4_prefix_pending(e, s))
			continue;
		s->slot = slot;
		/* prefix caching: the cached part of the prompt is not prefilled */
		rc = g4_prefix_attach(e, s, &hit);
		start = rc == G4_OK ? hit.tokens : 0;
		count = rc == G4_OK ? chunk_size(s, start, G4_MIN(s->n_tok - start, budget)) : 0;
		if (rc == G4_OK && count > 0)
			rc = g4_kvpool_ensure(&e->kv, slot, start, start + count);
		if (rc != G4_OK || count <= 0)
		{
			g4_kvpool_release(&e->kv, slot, start + G4_MAX(count, 0));
			s->slot = -1;
			if (rc == G4_OK || rc == G4_ERR_BUSY)
			{
				rc = G4_OK;
				break;
			}
			g4_fail(err, rc, "cannot allocate KV blocks");
			goto done;
		}
		g4_prefix_account(e, s, &hit);
		e->slot_used[slot] = 1;
		s->admit_order = ++e->next_admit;
		s->n_computed = start;
		s->state = G4_SEQ_PREFILL;
		if (add_item(sc, s, start, count, start + count == s->n_tok) != G4_OK)
		{
			rc = g4_fail(err, G4_ERR_NOMEM, "out of memory");
			goto done;
		}
		budget -= count;
	}
done:
	free(running);
	(void) fn;
	(void) ctx;
	return rc;
}

static int
ensure_embed_cap(g4_engine *e, int n)
{
	size_t		H = (size_t) e->model->cfg.hidden_size;

	if (n <= e->st_cap_embeds)
		return G4_OK;
	{
		int32_t    *ix = realloc(e->st_embed_index, (size_t) n * sizeof(int32_t));
		float	   *rows;

		if (!ix)
			return G4_ERR_NOMEM;
		e->st_embed_index = ix;
		rows = realloc(e->st_embed_rows, (size_t) n * H * sizeof(float));
		if (!rows)
			return G4_ERR_NOMEM;
		e->st_embed_rows = rows;
		e->st_cap_embeds = n;
	}
	return G4_OK;
}

void
g4_step_meta_view(const g4_engine *e, int n_tokens, int n_logits, g4_step_meta *meta)
{
	memset(meta, 0, sizeof(*meta));
	meta->n_tokens = n_tokens;
	meta->token = e->st_token;
	meta->pos = e->st_pos;
	meta->slot = e->st_slot;
	for (int g = 0; g < G4_KVG_COUNT; g++)
	{
		meta->lo[g] = e->st_lo[g];
		meta->hi[g] = e->st_hi[g];
	}
	meta->n_logits = n_logits;
	meta->logit_rows = e->st_logit_rows;
}

int
g4_schedule_meta(g4_engine *e, const g4_schedule *sc, g4_step_meta *meta, g4_embed_rows *extra, g4_err *err)
{
	const g4_model_config *c = &e->model->cfg;
	int			W = c->sliding_window;
	int			mask_b = e->opts.mask_variant == G4_MASK_B;
	size_t		H = (size_t) c->hidden_size;
	int			row = 0;
	int			n_logit = 0;
	int			n_extra = 0;
	int			k;

	for (k = 0; k < sc->n_items; k++)
	{
		const g4_sched_item *it = &sc->items[k];
		const g4_seq *s = it->seq;
		int			blk_s = -1,
					blk_e = -1;
		int			p;

		for (p = it->start; p < it->start + it->count; p++, row++)
		{
			int			b = (s->mm_block && c->bidirectional_vision && p < s->n_prompt) ? s->mm_block[p] : -1;
			int			ev = -1;
			int			lo_s,
						hi_s,
						hi_f;

			e->st_token[row] = g4_seq_token_at(s, p);
			e->st_pos[row] = p;
			e->st_slot[row] = s->slot;
			if (s->n_embeds > 0 && p < s->n_prompt)
			{
				/* embed_pos is sorted: binary search for position p */
				int			lo = 0,
							hi = s->n_embeds;

				while (lo < hi)
				{
					int			mid = (lo + hi) / 2;

					if (s->embed_pos[mid] < p)
						lo = mid + 1;
					else
						hi = mid;
				}
				if (lo < s->n_embeds && s->embed_pos[lo] == p)
					ev = lo;
			}
			if (ev >= 0)
			{
				if (ensure_embed_cap(e, n_extra + 1) != G4_OK)
					return g4_fail(err, G4_ERR_NOMEM, "out of memory");
				e->st_token[row] = -1;
				e->st_embed_index[n_extra] = row;
				memcpy(e->st_embed_rows + (size_t) n_extra * H, s->embed_rows + (size_t) ev * H, H * sizeof(float));
				n_extra++;
			}
			if (b >= 0 && (blk_s < 0 || p >= blk_e))
			{
				/* extent of this bidirectional block of soft tokens */
				blk_s = p;
				while (blk_s > 0 && s->mm_block[blk_s - 1] == b)
					blk_s--;
				blk_e = p + 1;
				while (blk_e < s->n_prompt && s->mm_block[blk_e] == b)
					blk_e++;
			}
			lo_s = G4_MAX(0, p - W + 1);
			hi_s = p + 1;
			hi_f = p + 1;
			if (b >= 0)
			{
				/* variant A ORs the block onto both layer kinds after the
				 * window; variant B keeps full layers causal and bounds the
				 * block by the window */
				hi_s = G4_MAX(hi_s, blk_e);
				if (!mask_b)
				{
					lo_s = G4_MAX(0, G4_MIN(lo_s, blk_s));
					hi_f = G4_MAX(hi_f, blk_e);
				}
			}
			e->st_lo[G4_KVG_SLIDING][row] = lo_s;
			e->st_hi[G4_KVG_SLIDING][row] = hi_s;
			e->st_lo[G4_KVG_FULL][row] = 0;
			e->st_hi[G4_KVG_FULL][row] = hi_f;
		}
		if (it->wants_logits)
		{
			/* a verify item has logits on every row: its token and drafts */
			int			r;

			for (r = row - 1 - it->n_draft; r < row; r++)
			{
				e->st_logit_rows[n_logit] = r;
				e->st_logit_seq[n_logit] = it->seq;
				n_logit++;
			}
		}
	}
	g4_step_meta_view(e, row, n_logit, meta);
	extra->n = n_extra;
	extra->row_index = e->st_embed_index;
	extra->rows = e->st_embed_rows;
	return G4_OK;
}
