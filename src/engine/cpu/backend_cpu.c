/*
 * backend_cpu.c — the CPU backend: host memory as device memory, weights used
 * in place (file mappings), operations run synchronously on a thread pool.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu.h"
#include "quant.h"
#include "util.h"

static void
cpu_destroy(g4_backend *be)
{
	g4_cpu	   *c = g4_cpu_of(be);
	int			g;

	g4_pool_destroy(c->pool);
	free(c->token);
	free(c->pos);
	free(c->slot);
	for (g = 0; g < G4_KVG_COUNT; g++)
	{
		free(c->lo[g]);
		free(c->hi[g]);
	}
	free(c->logit_rows);
	free(c->scratch);
	free(c);
}

static void
cpu_device_info(g4_backend *be, char *name, size_t name_len, size_t *free_bytes, size_t *total_bytes)
{
	long		pages = sysconf(_SC_AVPHYS_PAGES);
	long		page = sysconf(_SC_PAGESIZE);

	snprintf(name, name_len, "cpu (%d threads)", g4_pool_threads(g4_cpu_of(be)->pool));
	*free_bytes = pages > 0 && page > 0 ? (size_t) pages * (size_t) page : 0;
	*total_bytes = 0;
}

static void *
cpu_alloc(g4_backend *be, size_t bytes)
{
	void	   *p = NULL;

	if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
		return NULL;
	return p;
}

static void
cpu_free(g4_backend *be, void *p)
{
	free(p);
}

static int
cpu_upload(g4_backend *be, void *dst, const void *src, size_t bytes)
{
	memmove(dst, src, bytes);
	return G4_OK;
}

static int
cpu_fill(g4_backend *be, void *dst, int byte, size_t bytes)
{
	memset(dst, byte, bytes);
	return G4_OK;
}

static int
cpu_weight_create(g4_backend *be, const g4_host_weight *parts, int n_parts, g4_weight **out, g4_err *err)
{
	g4_weight  *w;
	int			i;

	if (n_parts < 1 || n_parts > G4_CPU_MAX_PARTS)
		return g4_fail(err, G4_ERR_INTERNAL, "a weight has %d parts (1..%d)", n_parts, G4_CPU_MAX_PARTS);
	w = g4_calloc(1, sizeof(g4_weight));
	if (!w)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	w->in = parts[0].in;
	for (i = 0; i < n_parts; i++)
	{
		if (parts[i].in != parts[0].in)
		{
			free(w);
			return g4_fail(err, G4_ERR_INTERNAL, "fused weight parts have %lld and %lld columns",
						   (long long) parts[i].in, (long long) parts[0].in);
		}
		w->parts[i] = parts[i];
		w->out += parts[i].out;
		w->bytes += (size_t) parts[i].out * g4_wfmt_row_bytes(parts[i].fmt, parts[i].in);
		if (parts[i].fmt == G4_W_I4G32)
			w->bytes += (size_t) parts[i].out * (size_t) (parts[i].in / 32) * 2;
	}
	w->n_parts = n_parts;
	*out = w;
	return G4_OK;
}

static void
cpu_weight_destroy(g4_backend *be, g4_weight *w)
{
	free(w);
}

static size_t
cpu_weight_bytes(const g4_weight *w)
{
	return w->bytes;
}

static int
cpu_kv_configure(g4_backend *be, const g4_kv_pool_desc *pool)
{
	g4_cpu	   *c = g4_cpu_of(be);

	c->kv = *pool;
	c->kv_configured = 1;
	return G4_OK;
}

static int
grow(int32_t **p, int cap)
{
	int32_t    *q = realloc(*p, (size_t) (cap > 0 ? cap : 1) * sizeof(int32_t));

	if (!q)
		return G4_ERR_NOMEM;
	*p = q;
	return G4_OK;
}

static int
cpu_step_begin(g4_backend *be, const g4_step_meta *m)
{
	g4_cpu	   *c = g4_cpu_of(be);
	size_t		n = (size_t) m->n_tokens * sizeof(int32_t);
	int			g;

	if (m->n_tokens > c->cap_tokens)
	{
		if (grow(&c->token, m->n_tokens) || grow(&c->pos, m->n_tokens) || grow(&c->slot, m->n_tokens) ||
			grow(&c->lo[0], m->n_tokens) || grow(&c->hi[0], m->n_tokens) ||
			grow(&c->lo[1], m->n_tokens) || grow(&c->hi[1], m->n_tokens))
			return G4_ERR_NOMEM;
		c->cap_tokens = m->n_tokens;
	}
	if (m->n_logits > c->cap_logits)
	{
		if (grow(&c->logit_rows, m->n_logits))
			return G4_ERR_NOMEM;
		c->cap_logits = m->n_logits;
	}
	c->n_tokens = m->n_tokens;
	c->n_logits = m->n_logits;
	memcpy(c->token, m->token, n);
	memcpy(c->pos, m->pos, n);
	memcpy(c->slot, m->slot, n);
	for (g = 0; g < G4_KVG_COUNT; g++)
	{
		memcpy(c->lo[g], m->lo[g], n);
		memcpy(c->hi[g], m->hi[g], n);
	}
	if (m->n_logits > 0)
		memcpy(c->logit_rows, m->logit_rows, (size_t) m->n_logits * sizeof(int32_t));
	return G4_OK;
}

static int
cpu_sync(g4_backend *be, g4_err *err)
{
	return G4_OK;
}

static const g4_backend_ops cpu_ops = {
	.name = "cpu",
	.destroy = cpu_destroy,
	.device_info = cpu_device_info,
	.alloc = cpu_alloc,
	.free = cpu_free,
	.upload = cpu_upload,
	.download = cpu_upload,
	.fill = cpu_fill,
	.weight_create = cpu_weight_create,
	.weight_destroy = cpu_weight_destroy,
	.weight_bytes = cpu_weight_bytes,
	.kv_configure = cpu_kv_configure,
	.step_begin = cpu_step_begin,
	.embed = g4_cpu_embed,
	.matmul = g4_cpu_matmul,
	.rmsnorm = g4_cpu_rmsnorm,
	.head_norm_rope = g4_cpu_head_norm_rope,
	.kv_store = g4_cpu_kv_store,
	.attention = g4_cpu_attention,
	.geglu = g4_cpu_geglu,
	.matmul_geglu = g4_cpu_matmul_geglu,
	.add_rmsnorm = g4_cpu_add_rmsnorm,
	.embed_concat = g4_cpu_embed_concat,
	.argmax = g4_cpu_argmax,
	.gather_logit_rows = g4_cpu_gather_logit_rows,
	.softcap = g4_cpu_softcap,
	.sync = cpu_sync,
	.layernorm = g4_cpu_layernorm,
	.add_bias = g4_cpu_add_bias,
	.add_pos2d = g4_cpu_add_pos2d,
};

int
g4_backend_cpu_create(int threads, g4_backend **out, g4_err *err)
{
	g4_cpu	   *c = g4_calloc(1, sizeof(g4_cpu));

	if (!c)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	if (threads <= 0)
	{
		long		n = sysconf(_SC_NPROCESSORS_ONLN);

		threads = n > 0 ? (int) n : 1;
	}
	c->pool = g4_pool_create(threads);
	if (!c->pool)
	{
		free(c);
		return g4_fail(err, G4_ERR_NOMEM, "cannot start %d CPU threads", threads);
	}
	c->base.ops = &cpu_ops;
	*out = &c->base;
	return G4_OK;
}
