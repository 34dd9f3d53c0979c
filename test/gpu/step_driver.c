/*
 * step_driver.c — see step_driver.h.
 */
#include "step_driver.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"
#include "util.h"

/* as engine.c's DEVICE_RESERVE */
#define RESERVE ((size_t) 512 << 20)

int
drv_open(drv *d, const char *path, g4_backend *be, int kv_dtype, size_t kv_bytes, int max_seqs, int max_model_len,
		 int max_tokens, g4_err *err)
{
	double		t0 = g4_now();
	int			rc;
	int			g;

	memset(d, 0, sizeof(*d));
	d->max_tokens = max_tokens;
	d->max_seqs = max_seqs;
	rc = g4_model_load(path, be, &d->m, 0, err);
	if (rc != G4_OK)
		return rc;
	rc = g4_workspace_init(d->m, max_tokens, max_seqs, &d->ws, err);
	if (rc != G4_OK)
		return rc;
	{
		char		name[128];
		size_t		free_b = 0,
					total = 0;
		double		left;

		/* a total of 0: host memory (the CPU side of a comparison), not capped */
		be->ops->device_info(be, name, sizeof(name), &free_b, &total);
		left = 0.95 * (double) total - (double) (total - free_b) - (double) RESERVE;
		if (total > 0 && (kv_bytes == 0 || (double) kv_bytes > left))
			kv_bytes = left > 0 ? (size_t) left : 0;
	}
	rc = g4_kvpool_init(&d->kv, d->m, kv_dtype, kv_bytes, max_seqs, max_model_len, max_tokens, 0, err);
	if (rc != G4_OK)
		return rc;
	d->token = g4_malloc((size_t) max_tokens * 4);
	d->pos = g4_malloc((size_t) max_tokens * 4);
	d->slot = g4_malloc((size_t) max_tokens * 4);
	d->logit_rows = g4_malloc((size_t) max_seqs * 4);
	for (g = 0; g < G4_KVG_COUNT; g++)
	{
		d->lo[g] = g4_malloc((size_t) max_tokens * 4);
		d->hi[g] = g4_malloc((size_t) max_tokens * 4);
	}
	if (!d->token || !d->pos || !d->slot || !d->logit_rows || !d->lo[0] || !d->lo[1] || !d->hi[0] || !d->hi[1])
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	/* arbitrary but valid contents for reserved, never-written positions */
	for (g = 0; g < G4_KVG_COUNT; g++)
		if (d->kv.desc.base[g])
			be->ops->fill(be, d->kv.desc.base[g], 0x11, (size_t) d->kv.n_blocks[g] * d->kv.block_bytes[g]);
	d->open_secs = g4_now() - t0;
	return be->ops->sync(be, err);
}

void
drv_close(drv *d)
{
	int			g;

	if (d->m)
	{
		if (d->kv.be)
			g4_kvpool_free(&d->kv);
		g4_workspace_free(d->m, &d->ws);
		g4_model_free(d->m);
	}
	free(d->token);
	free(d->pos);
	free(d->slot);
	free(d->logit_rows);
	for (g = 0; g < G4_KVG_COUNT; g++)
	{
		free(d->lo[g]);
		free(d->hi[g]);
	}
	memset(d, 0, sizeof(*d));
}

static void
trim(drv *d, int slot, int n_computed)
{
	int			keep = n_computed - d->m->cfg.sliding_window + 1;

	if (keep > 0)
		g4_kvpool_trim_window(&d->kv, slot, keep, n_computed);
}

int
drv_reserve(drv *d, int slot, int n, g4_err *err)
{
	int			p;

	for (p = 0; p < n; p += 4096)
	{
		int			e = G4_MIN(n, p + 4096);
		int			rc = g4_kvpool_ensure(&d->kv, slot, p, e);

		if (rc != G4_OK)
			return g4_fail(err, rc, "the KV pool cannot hold positions %d..%d of slot %d", p, e, slot);
		trim(d, slot, e);
	}
	return G4_OK;
}

void
drv_release(drv *d, int slot, int n_positions)
{
	g4_kvpool_release(&d->kv, slot, n_positions);
}

int
drv_step(drv *d, int n_items, const drv_item *items, const int32_t *tokens, g4_err *err)
{
	g4_backend *be = d->m->be;
	int			W = d->m->cfg.sliding_window;
	int			row = 0;
	int			k;
	g4_step_meta meta;
	int			rc;

	d->n_logits = 0;
	for (k = 0; k < n_items; k++)
	{
		const drv_item *it = &items[k];
		int			p;

		rc = g4_kvpool_ensure(&d->kv, it->slot, it->start, it->start + it->count);
		if (rc != G4_OK)
			return g4_fail(err, rc, "no KV blocks for slot %d positions %d..%d", it->slot, it->start,
						   it->start + it->count);
		for (p = it->start; p < it->start + it->count; p++, row++)
		{
			if (row >= d->max_tokens)
				return g4_fail(err, G4_ERR_INVALID, "more than %d tokens in a step", d->max_tokens);
			d->token[row] = tokens[row];
			d->pos[row] = p;
			d->slot[row] = it->slot;
			d->lo[G4_KVG_SLIDING][row] = G4_MAX(0, p - W + 1);
			d->hi[G4_KVG_SLIDING][row] = p + 1;
			d->lo[G4_KVG_FULL][row] = 0;
			d->hi[G4_KVG_FULL][row] = p + 1;
		}
		if (it->logits)
			d->logit_rows[d->n_logits++] = row - 1;
	}
	memset(&meta, 0, sizeof(meta));
	meta.n_tokens = row;
	meta.token = d->token;
	meta.pos = d->pos;
	meta.slot = d->slot;
	for (k = 0; k < G4_KVG_COUNT; k++)
	{
		meta.lo[k] = d->lo[k];
		meta.hi[k] = d->hi[k];
	}
	meta.n_logits = d->n_logits;
	meta.logit_rows = d->logit_rows;
	/* g4_model_forward records and replays step graphs itself */
	d->ws.no_graphs = !d->use_graphs;
	rc = g4_model_forward(d->m, &d->ws, &meta, NULL, err);
	if (rc != G4_OK)
	{
		g4_err		why;

		/* the backend's own account of the failure, when it has one */
		if (be->ops->sync(be, &why) != G4_OK)
			g4_fail_ctx(err, "%s", why.msg);
		return rc;
	}
	for (k = 0; k < n_items; k++)
		trim(d, items[k].slot, items[k].start + items[k].count);
	return G4_OK;
}

int
drv_logits(drv *d, float *host, g4_err *err)
{
	g4_backend *be = d->m->be;
	size_t		bytes = (size_t) d->n_logits * (size_t) d->m->cfg.vocab_size * sizeof(float);

	if (be->ops->download(be, host, d->ws.logits, bytes) != G4_OK)
		return be->ops->sync(be, err);
	return be->ops->sync(be, err);
}

int
drv_argmax(drv *d, int32_t *ids, g4_err *err)
{
	g4_backend *be = d->m->be;
	const g4_model_config *c = &d->m->cfg;
	int			V = c->vocab_size;
	int			i;

	if (be->ops->sample)
	{
		g4_row_sampling *rows = calloc((size_t) d->n_logits, sizeof(g4_row_sampling));
		int			rc;

		if (!rows)
			return g4_fail(err, G4_ERR_NOMEM, "out of memory");
		for (i = 0; i < d->n_logits; i++)
			rows[i].top_p = 1.0f;	/* temperature 0: greedy */
		rc = be->ops->sample(be, d->ws.logits, d->n_logits, V, c->suppress_ids, c->n_suppress, rows, ids);
		free(rows);
		if (rc != G4_OK)
		{
			int			rc2 = be->ops->sync(be, err);

			return rc2 != G4_OK ? rc2 : g4_fail(err, rc, "device sampling failed");
		}
		return be->ops->sync(be, err);
	}
	{
		float	   *l = malloc((size_t) d->n_logits * (size_t) V * sizeof(float));
		int			rc;

		if (!l)
			return g4_fail(err, G4_ERR_NOMEM, "out of memory");
		rc = drv_logits(d, l, err);
		/* the host sampler's greedy choice: suppressed ids at -inf, then
		 * g4_argmax (a row holding a NaN: G4_SAMPLE_NAN) */
		for (i = 0; rc == G4_OK && i < d->n_logits; i++)
		{
			float	   *row = l + (size_t) i * (size_t) V;
			int			s;

			for (s = 0; s < c->n_suppress; s++)
				if (c->suppress_ids[s] >= 0 && c->suppress_ids[s] < V)
					row[c->suppress_ids[s]] = -INFINITY;
			ids[i] = g4_argmax(row, V);
		}
		free(l);
		return rc;
	}
}
