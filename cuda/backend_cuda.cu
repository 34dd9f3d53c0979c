/*
 * backend_cuda.cu — the CUDA backend: device memory, weight upload and
 * repacking, the KV pool description, per-step metadata, whole-step graph
 * recording and replay, error reporting, and the operation table.
 *
 * One stream carries all work.  Every CUDA call is checked; the first
 * failure is kept and returned by sync(), and device allocations that fail
 * return NULL / G4_ERR_NOMEM to the caller.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"

extern "C" {
#include "quant.h"
#include "util.h"
}

/* ---- errors ---------------------------------------------------------------- */

int
g4c_fail(g4_cuda *c, cudaError_t e, const char *what, const char *file, int line)
{
	int			code = (e == cudaErrorMemoryAllocation) ? G4_ERR_NOMEM : G4_ERR_BACKEND;

	if (c->err_code == G4_OK)
	{
		const char *base = strrchr(file, '/');

		c->err_code = code;
		snprintf(c->err_msg, sizeof(c->err_msg), "CUDA error %s (%s) in %s at %s:%d", cudaGetErrorName(e),
				 cudaGetErrorString(e), what, base ? base + 1 : file, line);
	}
	return code;
}

static int
fail_msg(g4_cuda *c, int code, const char *msg)
{
	if (c->err_code == G4_OK)
	{
		c->err_code = code;
		snprintf(c->err_msg, sizeof(c->err_msg), "%s", msg);
	}
	return code;
}

/* ---- graphs (declared early: scratch growth invalidates them) --------------- */

static void
graphs_drop_all(g4_cuda *c)
{
	int			i;

	for (i = 0; i < G4C_MAX_GRAPHS; i++)
	{
		if (c->graphs[i].exec)
			cudaGraphExecDestroy(c->graphs[i].exec);
		memset(&c->graphs[i], 0, sizeof(c->graphs[i]));
	}
	c->cur_graph = -1;
}

/* A capture left open by a failed step is closed and discarded. */
static void
abort_capture(g4_cuda *c)
{
	cudaGraph_t g = NULL;

	if (!c->capturing)
		return;
	c->capturing = 0;
	if (cudaStreamEndCapture(c->stream, &g) == cudaSuccess && g)
		cudaGraphDestroy(g);
	cudaGetLastError();
	c->cur_graph = -1;
}

/* ---- scratch ------------------------------------------------------------------ */

void *
g4c_grow(g4_cuda *c, void **buf, size_t *have, size_t bytes, const char *what)
{
	void	   *p = NULL;
	cudaError_t e;
	char		msg[128];

	if (bytes <= *have)
		return *buf;
	if (c->capturing)
	{
		snprintf(msg, sizeof(msg), "CUDA %s would grow while a step graph is recorded", what);
		fail_msg(c, G4_ERR_INTERNAL, msg);
		return NULL;
	}
	bytes = (bytes + ((size_t) 1 << 20) - 1) & ~(((size_t) 1 << 20) - 1);
	/* queued kernels may still use the old buffer, and recorded graphs
	 * point at it */
	e = cudaStreamSynchronize(c->stream);
	if (e != cudaSuccess)
	{
		g4c_fail(c, e, "cudaStreamSynchronize", __FILE__, __LINE__);
		return NULL;
	}
	graphs_drop_all(c);
	if (*buf)
		cudaFree(*buf);
	*buf = NULL;
	*have = 0;
	e = cudaMalloc(&p, bytes);
	if (e != cudaSuccess)
	{
		cudaGetLastError();
		snprintf(msg, sizeof(msg), "cudaMalloc (%s)", what);
		g4c_fail(c, e, msg, __FILE__, __LINE__);
		return NULL;
	}
	*buf = p;
	*have = bytes;
	return p;
}

void *
g4c_scratch(g4_cuda *c, size_t bytes)
{
	return g4c_grow(c, &c->scratch, &c->scratch_bytes, bytes, "scratch");
}

unsigned *
g4c_counters(g4_cuda *c, size_t n)
{
	void	   *p = NULL;
	cudaError_t e;

	if (n <= c->counters_n)
		return c->counters;
	if (c->capturing)
	{
		fail_msg(c, G4_ERR_INTERNAL, "CUDA counters would grow while a step graph is recorded");
		return NULL;
	}
	n = (n + 4095) & ~(size_t) 4095;
	e = cudaStreamSynchronize(c->stream);
	if (e != cudaSuccess)
	{
		g4c_fail(c, e, "cudaStreamSynchronize", __FILE__, __LINE__);
		return NULL;
	}
	graphs_drop_all(c);
	if (c->counters)
		cudaFree(c->counters);
	c->counters = NULL;
	c->counters_n = 0;
	e = cudaMalloc(&p, n * sizeof(unsigned));
	if (e == cudaSuccess)
		e = cudaMemsetAsync(p, 0, n * sizeof(unsigned), c->stream);
	if (e != cudaSuccess)
	{
		cudaGetLastError();
		if (p)
			cudaFree(p);
		g4c_fail(c, e, "cudaMalloc (counters)", __FILE__, __LINE__);
		return NULL;
	}
	c->counters = (unsigned *) p;
	c->counters_n = n;
	return c->counters;
}

/* ---- lifecycle -------------------------------------------------------------- */

static void
cu_destroy(g4_backend *be)
{
	g4_cuda    *c = g4c_of(be);

	abort_capture(c);
	if (c->stream)
		cudaStreamSynchronize(c->stream);
	graphs_drop_all(c);
	if (c->d_meta)
		cudaFree(c->d_meta);
	if (c->h_meta)
		cudaFreeHost(c->h_meta);
	if (c->scratch)
		cudaFree(c->scratch);
	if (c->act_bf16)
		cudaFree(c->act_bf16);
	if (c->keqv_rows)
		cudaFree(c->keqv_rows);
	if (c->counters)
		cudaFree(c->counters);
	g4c_lt_free(c);
	if (c->h_ids)
		cudaFreeHost(c->h_ids);
	if (c->d_ids)
		cudaFree(c->d_ids);
	if (c->d_suppress)
		cudaFree(c->d_suppress);
	if (c->d_sample_work)
		cudaFree(c->d_sample_work);
	if (c->h_rows)
		cudaFreeHost(c->h_rows);
	if (c->d_rows)
		cudaFree(c->d_rows);
	if (c->d_status)
		cudaFree(c->d_status);
	if (c->h_status)
		cudaFreeHost(c->h_status);
	if (c->meta_done)
		cudaEventDestroy(c->meta_done);
	if (c->stream)
		cudaStreamDestroy(c->stream);
	cudaGetLastError();
	free(c);
}

static int
cu_held(g4_backend *be, g4_memory_use *out, int max)
{
	g4_cuda    *c = g4c_of(be);
	size_t		lt_workspace = 0,
				lt_slots = 0;
	int			n = 0;

	g4c_lt_held(c, &lt_workspace, &lt_slots);
	{
		const g4_memory_use uses[] = {
			{"scratch", c->scratch_bytes},
			{"dequantised int4 weights", lt_slots},
			{"k_eq_v key and value rows", c->keqv_rows_bytes},
			{"cuBLASLt workspace", lt_workspace},
			{"bf16 activation copy", c->act_bf16 ? G4C_ACT_BF16_BYTES : 0},
			{"step metadata and counters", c->meta_ints * sizeof(int32_t) + c->counters_n * sizeof(unsigned)},
			{"sampler", (size_t) c->cap_ids * sizeof(int32_t) + (size_t) c->cap_rows * sizeof(g4_row_sampling) +
			 (size_t) c->cap_suppress * sizeof(int32_t) + (size_t) c->cap_sample_work},
		};

		for (size_t i = 0; i < sizeof(uses) / sizeof(uses[0]) && n < max; i++)
			if (uses[i].bytes > 0)
				out[n++] = uses[i];
	}
	return n;
}

static void
cu_device_info(g4_backend *be, char *name, size_t name_len, size_t *free_bytes, size_t *total_bytes)
{
	g4_cuda    *c = g4c_of(be);
	size_t		f = 0,
				t = 0;
	cudaError_t e = cudaMemGetInfo(&f, &t);

	if (e != cudaSuccess)
	{
		g4c_fail(c, e, "cudaMemGetInfo", __FILE__, __LINE__);
		f = 0;
		t = 1;					/* "device memory, none free": never host sizing */
	}
	snprintf(name, name_len, "%s", c->name);
	*free_bytes = f;
	*total_bytes = t;
}

/* ---- memory ------------------------------------------------------------------- */

static void *
cu_alloc(g4_backend *be, size_t bytes)
{
	void	   *p = NULL;

	if (cudaMalloc(&p, bytes ? bytes : 256) != cudaSuccess)
	{
		cudaGetLastError();		/* an allocation failure is the caller's to report */
		return NULL;
	}
	return p;
}

static void
cu_free(g4_backend *be, void *p)
{
	g4_cuda    *c = g4c_of(be);
	cudaError_t e;

	if (!p)
		return;
	/* kernels still queued may use the memory */
	e = cudaStreamSynchronize(c->stream);
	if (e != cudaSuccess)
		g4c_fail(c, e, "cudaStreamSynchronize", __FILE__, __LINE__);
	e = cudaFree(p);
	if (e != cudaSuccess)
		g4c_fail(c, e, "cudaFree", __FILE__, __LINE__);
}

static int
cu_upload(g4_backend *be, void *dst, const void *src, size_t bytes)
{
	g4_cuda    *c = g4c_of(be);

	if (bytes == 0)
		return G4_OK;
	/* pageable sources are staged before the call returns */
	c->writes++;
	G4C_CHECK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
	return G4_OK;
}

static int
cu_download(g4_backend *be, void *dst, const void *src, size_t bytes)
{
	g4_cuda    *c = g4c_of(be);

	if (c->capturing)
		return fail_msg(c, G4_ERR_INTERNAL, "download inside a recorded step graph");
	if (bytes == 0)
		return G4_OK;
	G4C_CHECK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
	G4C_CHECK(c, cudaStreamSynchronize(c->stream));
	return c->err_code;
}

static int
cu_fill(g4_backend *be, void *dst, int byte, size_t bytes)
{
	g4_cuda    *c = g4c_of(be);

	c->writes++;
	G4C_CHECK(c, cudaMemsetAsync(dst, byte, bytes, c->stream));
	return G4_OK;
}

/* ---- weights ---------------------------------------------------------------- */

/* Staging rows in pieces of about this many bytes. */
#define STAGE_BYTES ((size_t) 64 << 20)

static int
weight_kind(const g4_host_weight *parts, int n_parts)
{
	int			i;
	int			all_i4 = 1,
				all_bf16 = 1;
	int64_t		in = parts[0].in;

	for (i = 0; i < n_parts; i++)
	{
		all_i4 &= parts[i].fmt == G4_W_I4G32 && parts[i].scales != NULL;
		all_bf16 &= parts[i].fmt == G4_W_BF16;
	}
	/* narrow matrices run in exact float32: their cost is negligible */
	if (in <= 256)
		return G4C_W_F32;
	if (all_i4 && in % 32 == 0)
		return G4C_W_I4;
	if (all_bf16 && in % 2 == 0)
		return G4C_W_BF16;
	return G4C_W_F32;
}

static int
upload_f32(g4_cuda *c, g4_weight *w, const g4_host_weight *p, int64_t row0, g4_err *err)
{
	size_t		row_bytes = (size_t) p->in * sizeof(float);
	int64_t		chunk = (int64_t) G4_MAX((size_t) 1, STAGE_BYTES / row_bytes);
	float	   *buf = NULL;
	size_t		src_row = g4_wfmt_row_bytes(p->fmt, p->in);
	int64_t		r0;
	cudaError_t e;

	if (src_row == 0)
		return g4_fail(err, G4_ERR_FORMAT, "a %s weight cannot have %lld columns", g4_wfmt_name(p->fmt),
					   (long long) p->in);
	e = cudaMallocHost((void **) &buf, (size_t) G4_MIN(chunk, p->out) * row_bytes);
	if (e != cudaSuccess)
	{
		cudaGetLastError();
		return g4_fail(err, G4_ERR_NOMEM, "out of pinned host memory staging a weight");
	}
	for (r0 = 0; r0 < p->out; r0 += chunk)
	{
		int64_t		rows = G4_MIN(chunk, p->out - r0);
		int64_t		r;

		for (r = 0; r < rows; r++)
			g4_dequant_row(p->fmt, (const uint8_t *) p->data + (size_t) (r0 + r) * src_row,
						   p->scales ? p->scales + (size_t) (r0 + r) * (size_t) (p->in / 32) : NULL, p->in,
						   buf + (size_t) r * (size_t) p->in);
		/* on the backend's stream (it does not synchronise with the legacy
		 * default stream), then wait: the pinned buffer is refilled next */
		e = cudaMemcpyAsync((float *) w->data + (size_t) (row0 + r0) * (size_t) w->in, buf, (size_t) rows * row_bytes,
							cudaMemcpyHostToDevice, c->stream);
		if (e == cudaSuccess)
			e = cudaStreamSynchronize(c->stream);
		if (e != cudaSuccess)
			break;
	}
	cudaFreeHost(buf);
	if (e != cudaSuccess)
	{
		g4c_fail(c, e, "cudaMemcpy (weight)", __FILE__, __LINE__);
		return g4_fail(err, G4_ERR_BACKEND, "%s", c->err_msg);
	}
	return G4_OK;
}

/* Upload raw rows of a part to a device staging buffer in pieces and repack
 * each piece with the format's pack kernel. */
static int
upload_packed(g4_cuda *c, g4_weight *w, const g4_host_weight *p, int64_t row0, g4_err *err)
{
	int			i4 = w->kind == G4C_W_I4;
	size_t		row_bytes = i4 ? (size_t) (p->in / 8) * 4 : (size_t) p->in * 2;
	size_t		srow_bytes = i4 ? (size_t) (p->in / 32) * 2 : 0;
	int64_t		chunk = (int64_t) G4_MAX((size_t) 1, STAGE_BYTES / (row_bytes + srow_bytes));
	void	   *raw = NULL;
	void	   *raw_s = NULL;
	int64_t		r0;
	int			rc = G4_OK;
	cudaError_t e;

	chunk = G4_MIN(chunk, p->out);
	e = cudaMalloc(&raw, (size_t) chunk * row_bytes);
	if (e == cudaSuccess && i4)
		e = cudaMalloc(&raw_s, (size_t) chunk * srow_bytes);
	for (r0 = 0; e == cudaSuccess && r0 < p->out; r0 += chunk)
	{
		int64_t		rows = G4_MIN(chunk, p->out - r0);

		e = cudaMemcpyAsync(raw, (const uint8_t *) p->data + (size_t) r0 * row_bytes, (size_t) rows * row_bytes,
							cudaMemcpyHostToDevice, c->stream);
		if (e == cudaSuccess && i4)
			e = cudaMemcpyAsync(raw_s, p->scales + (size_t) r0 * (size_t) (p->in / 32), (size_t) rows * srow_bytes,
								cudaMemcpyHostToDevice, c->stream);
		if (e != cudaSuccess)
			break;
		rc = i4 ? g4c_pack_i4(c, w, (const uint32_t *) raw, (const uint16_t *) raw_s, row0 + r0, rows)
			: g4c_pack_bf16(c, w, (const uint16_t *) raw, row0 + r0, rows);
		if (rc != G4_OK)
			break;
		/* the staging buffer is reused by the next piece */
		e = cudaStreamSynchronize(c->stream);
	}
	if (raw)
		cudaFree(raw);
	if (raw_s)
		cudaFree(raw_s);
	if (e != cudaSuccess)
	{
		cudaGetLastError();
		rc = g4c_fail(c, e, "weight upload", __FILE__, __LINE__);
	}
	if (rc != G4_OK)
		return g4_fail(err, rc, "uploading a weight to the GPU: %s", c->err_msg);
	return G4_OK;
}

static void
cu_weight_destroy(g4_backend *be, g4_weight *w)
{
	if (!w)
		return;
	cu_free(be, w->data);
	cu_free(be, w->scales);
	free(w);
}

static int
cu_weight_create(g4_backend *be, const g4_host_weight *parts, int n_parts, g4_weight **out, g4_err *err)
{
	g4_cuda    *c = g4c_of(be);
	g4_weight  *w;
	int			i;
	int64_t		row0 = 0;
	cudaError_t e = cudaSuccess;

	*out = NULL;
	if (n_parts < 1)
		return g4_fail(err, G4_ERR_INTERNAL, "a weight without parts");
	for (i = 0; i < n_parts; i++)
		if (parts[i].in != parts[0].in)
			return g4_fail(err, G4_ERR_INTERNAL, "fused weight parts have %lld and %lld columns",
						   (long long) parts[i].in, (long long) parts[0].in);
	w = (g4_weight *) calloc(1, sizeof(g4_weight));
	if (!w)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	w->id = ++c->weight_ids;
	w->kind = weight_kind(parts, n_parts);
	w->in = parts[0].in;
	for (i = 0; i < n_parts; i++)
		w->out += parts[i].out;
	w->units = G4_DIV_UP(w->out, 16);
	w->ktiles = G4_DIV_UP(w->in, 64);
	switch (w->kind)
	{
		case G4C_W_I4:
			w->bytes = (size_t) (w->units * w->ktiles) * (512 + 64);
			e = cudaMalloc(&w->data, (size_t) (w->units * w->ktiles) * 512);
			if (e == cudaSuccess)
				e = cudaMalloc((void **) &w->scales, (size_t) (w->units * w->ktiles) * 64);
			/* padding: code 8 (value 0), scale 0 */
			if (e == cudaSuccess)
				e = cudaMemsetAsync(w->data, 0x88, (size_t) (w->units * w->ktiles) * 512, c->stream);
			if (e == cudaSuccess)
				e = cudaMemsetAsync(w->scales, 0, (size_t) (w->units * w->ktiles) * 64, c->stream);
			break;
		case G4C_W_BF16:
			w->bytes = (size_t) (w->units * w->ktiles) * 2048;
			e = cudaMalloc(&w->data, w->bytes);
			if (e == cudaSuccess)
				e = cudaMemsetAsync(w->data, 0, w->bytes, c->stream);
			break;
		default:
			w->bytes = (size_t) w->out * (size_t) w->in * sizeof(float);
			e = cudaMalloc(&w->data, w->bytes);
			break;
	}
	if (e != cudaSuccess)
	{
		cudaGetLastError();
		cu_weight_destroy(be, w);
		return g4_fail(err, e == cudaErrorMemoryAllocation ? G4_ERR_NOMEM : G4_ERR_BACKEND,
					   "cannot allocate %.1f MiB of GPU memory for a %lldx%lld weight (%s)",
					   (double) w->bytes / 1048576.0, (long long) w->out, (long long) w->in, cudaGetErrorString(e));
	}
	for (i = 0; i < n_parts; i++)
	{
		int			rc = w->kind == G4C_W_F32 ? upload_f32(c, w, &parts[i], row0, err) :
			upload_packed(c, w, &parts[i], row0, err);

		if (rc != G4_OK)
		{
			cu_weight_destroy(be, w);
			return rc;
		}
		row0 += parts[i].out;
	}
	*out = w;
	return G4_OK;
}

static size_t
cu_weight_bytes(const g4_weight *w)
{
	return w->bytes;
}

/* ---- KV pool and step metadata ------------------------------------------------- */

static int
cu_kv_configure(g4_backend *be, const g4_kv_pool_desc *pool)
{
	g4_cuda    *c = g4c_of(be);

	c->kv = *pool;
	c->kv_configured = 1;
	return G4_OK;
}

static int
next_pow2(int v)
{
	int			p = 16;

	while (p < v && p < (1 << 30))
		p <<= 1;
	return p;
}

static uint64_t
mix(uint64_t h, uint64_t v)
{
	h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
	return h * 0xff51afd7ed558ccdull;
}

/*
 * The step's metadata arrays, each `stride` ints apart (the logit rows
 * `lstride`), laid out from the start of d_meta: token, pos, slot, lo and hi
 * per group, logit rows, the tile levels (stride + 1 each), tile bases, then
 * the k_eq_v runs (fewer than stride / G4C_KEQV_TILE_MIN_RUN runs of
 * G4C_RUN_INTS ints fit in the 4 * stride left).  The strides follow the
 * step's own size, not the buffers' capacity, so that only what the step
 * uses is copied (the whole buffer of a 16k-token capacity is 1.2 MB, ~50 µs
 * of a one-token step).  A step graph keeps the views it was recorded with:
 * its key holds n_tokens and n_logits, which fix the strides.
 */
static size_t
meta_layout_ints(int stride, int lstride)
{
	return (size_t) stride * 12 + (size_t) lstride + (size_t) G4C_TPC_LEVELS * (size_t) (stride + 1);
}

static int
meta_stride(int n)
{
	return (G4_MAX(n, 1) + 31) & ~31;
}

/* Point the device views at the layout of one step's strides. */
static void
meta_layout(g4_cuda *c, int stride, int lstride)
{
	int32_t    *d = c->d_meta;
	size_t		s = (size_t) stride;
	int			l;

	c->d_token = d;
	c->d_pos = d + s;
	c->d_slot = d + 2 * s;
	c->d_lo[0] = d + 3 * s;
	c->d_hi[0] = d + 4 * s;
	c->d_lo[1] = d + 5 * s;
	c->d_hi[1] = d + 6 * s;
	c->d_logit_rows = d + 7 * s;
	for (l = 0; l < G4C_TPC_LEVELS; l++)
		c->d_tiles[l] = d + 7 * s + (size_t) lstride + (size_t) l * (s + 1);
	c->d_tile_base = d + 7 * s + (size_t) lstride + (size_t) G4C_TPC_LEVELS * (s + 1);
	c->d_tile_runs = c->d_tile_base + s;
}

/* Grow the pinned and device metadata buffers to hold a step's layout
 * (never during a recording). */
static int
meta_reserve(g4_cuda *c, int stride, int lstride)
{
	size_t		ints = meta_layout_ints(stride, lstride);

	if (ints <= c->meta_ints && c->d_meta)
		return G4_OK;
	/* room for a 64-token step at least, and never less than before */
	ints = G4_MAX(G4_MAX(ints, meta_layout_ints(64, 64)), c->meta_ints);
	G4C_CHECK(c, cudaStreamSynchronize(c->stream));
	graphs_drop_all(c);
	if (c->d_meta)
		cudaFree(c->d_meta);
	if (c->h_meta)
		cudaFreeHost(c->h_meta);
	c->d_meta = NULL;
	c->h_meta = NULL;
	c->meta_ints = 0;
	G4C_CHECK(c, cudaMalloc((void **) &c->d_meta, ints * sizeof(int32_t)));
	G4C_CHECK(c, cudaMallocHost((void **) &c->h_meta, ints * sizeof(int32_t)));
	c->meta_ints = ints;
	return G4_OK;
}

/*
 * The prefill runs whose attention on k_eq_v layers is two cuBLASLt
 * products over key and value rows made once per layer (attention_gemm.cu):
 * each run of at least G4C_KEQV_TILE_MIN_RUN consecutive tokens of one
 * sequence whose full-group ranges start at key 0.  base[t]: the first tile of token t's run, or -1;
 * runs: (slot, first tile, tiles, keys, first token, tokens) per run.
 */
#define G4C_KEQV_TILE_MIN_RUN 64

static void
keqv_tile_runs(g4_cuda *c, const g4_step_meta *m, int32_t *base, int32_t *runs)
{
	int			n = m->n_tokens;
	int			t = 0;

	c->n_tile_runs = 0;
	c->n_keqv_tiles = 0;
	while (t < n)
	{
		int			e = t + 1,
					keys = m->hi[G4_KVG_FULL][t],
					from_zero = m->lo[G4_KVG_FULL][t] == 0;
		int			first = -1;

		while (e < n && m->slot[e] == m->slot[t] && m->pos[e] == m->pos[e - 1] + 1)
		{
			keys = G4_MAX(keys, m->hi[G4_KVG_FULL][e]);
			from_zero &= m->lo[G4_KVG_FULL][e] == 0;
			e++;
		}
		if (e - t >= G4C_KEQV_TILE_MIN_RUN && from_zero && keys > 0)
		{
			int32_t    *r = runs + G4C_RUN_INTS * (size_t) c->n_tile_runs++;

			first = c->n_keqv_tiles;
			r[0] = m->slot[t];
			r[1] = first;
			r[2] = (keys + G4_KV_BLOCK_TOKENS - 1) / G4_KV_BLOCK_TOKENS;
			r[3] = keys;
			r[4] = t;
			r[5] = e - t;
			c->n_keqv_tiles += r[2];
		}
		for (; t < e; t++)
			base[t] = first;
	}
	c->keqv_tile_grid = next_pow2(c->n_keqv_tiles);
}

static int
cu_step_begin(g4_backend *be, const g4_step_meta *m)
{
	g4_cuda    *c = g4c_of(be);
	int			n = m->n_tokens;
	int			cap,
				lcap;
	int32_t    *h;
	int			g,
				l,
				t;
	uint64_t	key;

	g4c_lt_step_begin(c);
	if (c->capturing)
	{
		/* the forward pass's own call, inside the recording that the
		 * engine's step_begin + graph_begin opened: the metadata is already
		 * in place.  A second one means that step failed: drop it. */
		if (c->capture_begins++ == 0)
			return G4_OK;
		abort_capture(c);
	}
	if (n < 0 || m->n_logits < 0)
		return G4_ERR_INTERNAL;
	cap = meta_stride(n);
	lcap = meta_stride(m->n_logits);
	if (meta_reserve(c, cap, lcap) != G4_OK)
		return c->err_code;
	/* the previous step's copy must have left the pinned buffer */
	G4C_CHECK(c, cudaEventSynchronize(c->meta_done));
	meta_layout(c, cap, lcap);
	h = c->h_meta;
	memcpy(h, m->token, (size_t) n * 4);
	memcpy(h + cap, m->pos, (size_t) n * 4);
	memcpy(h + 2 * (size_t) cap, m->slot, (size_t) n * 4);
	for (g = 0; g < G4_KVG_COUNT; g++)
	{
		int			longest = 0;

		memcpy(h + (3 + 2 * g) * (size_t) cap, m->lo[g], (size_t) n * 4);
		memcpy(h + (4 + 2 * g) * (size_t) cap, m->hi[g], (size_t) n * 4);
		for (t = 0; t < n; t++)
			longest = G4_MAX(longest, m->hi[g][t] - m->lo[g][t]);
		c->span_bucket[g] = next_pow2(longest);
	}
	if (m->n_logits > 0)
		memcpy(h + 7 * (size_t) cap, m->logit_rows, (size_t) m->n_logits * 4);
	/* attention tiles: runs of consecutive positions of one sequence, cut
	 * every 2^l tokens */
	for (l = 0; l < G4C_TPC_LEVELS; l++)
	{
		int32_t    *tiles = h + (c->d_tiles[l] - c->d_meta);
		int			nt = 0,
					start = 0;

		for (t = 0; t < n; t++)
			if (t == 0 || m->slot[t] != m->slot[t - 1] || m->pos[t] != m->pos[t - 1] + 1 ||
				t - start == (1 << l))
			{
				tiles[nt++] = t;
				start = t;
			}
		tiles[nt] = n;
		c->n_tiles[l] = nt;
	}
	keqv_tile_runs(c, m, h + (c->d_tile_base - c->d_meta), h + (c->d_tile_runs - c->d_meta));
	G4C_CHECK(c, cudaMemcpyAsync(c->d_meta, h, meta_layout_ints(cap, lcap) * sizeof(int32_t), cudaMemcpyHostToDevice,
								 c->stream));
	G4C_CHECK(c, cudaEventRecord(c->meta_done, c->stream));
	c->n_tokens = n;
	c->n_logits = m->n_logits;
	/* what the launch geometry of every operation of this step depends on */
	key = mix(mix(0x6734, (uint64_t) n), (uint64_t) m->n_logits);
	for (g = 0; g < G4_KVG_COUNT; g++)
		key = mix(key, (uint64_t) c->span_bucket[g]);
	for (l = 0; l < G4C_TPC_LEVELS; l++)
		key = mix(key, (uint64_t) c->n_tiles[l]);
	key = mix(mix(key, (uint64_t) c->n_tile_runs), (uint64_t) c->keqv_tile_grid);
	/* the runs' products on cuBLASLt (attention_gemm.cu): their first
	 * tokens and sizes are launch arguments, their keys (the ends of the
	 * tokens' ranges, slice by slice) the products' shapes */
	for (l = 0; l < c->n_tile_runs; l++)
	{
		const int32_t *r = h + (c->d_tile_runs - c->d_meta) + G4C_RUN_INTS * (size_t) l;

		key = mix(mix(key, (uint64_t) r[4]), (uint64_t) r[5]);
		for (t = r[4]; t < r[4] + r[5]; t++)
			key = mix(key, (uint64_t) m->hi[G4_KVG_FULL][t]);
	}
	c->step_key = key;
	return G4_OK;
}

/* ---- step graphs ---------------------------------------------------------------- */

static int
cu_graph_begin(g4_backend *be, uint64_t tag)
{
	g4_cuda    *c = g4c_of(be);
	/* the step's shape and what is issued for it: a forward step and a
	 * draft round of the same rows are different graphs */
	uint64_t	key = mix(c->step_key, tag);
	int			i,
				free_i = -1,
				lru = 0;

	if (c->capturing || c->err_code != G4_OK)
		return c->err_code != G4_OK ? c->err_code : G4_ERR_INTERNAL;
	c->cur_graph = -1;
	if (c->dry)
		return 0;				/* not a sighting: the step runs, dry */
	for (i = 0; i < G4C_MAX_GRAPHS; i++)
	{
		g4c_graph  *gr = &c->graphs[i];

		if (gr->uses > 0 && gr->key == key)
		{
			gr->last_use = ++c->graph_clock;
			gr->uses++;
			c->cur_graph = i;
			if (gr->exec)
				return 1;
			/* second sighting: the first run sized every scratch buffer */
			G4C_CHECK(c, cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
			c->capturing = 1;
			c->capture_begins = 0;
			return 0;
		}
		if (gr->uses == 0 && free_i < 0)
			free_i = i;
		if (c->graphs[i].last_use < c->graphs[lru].last_use)
			lru = i;
	}
	if (free_i < 0)
	{
		free_i = lru;
		if (c->graphs[lru].exec)
			cudaGraphExecDestroy(c->graphs[lru].exec);
		memset(&c->graphs[lru], 0, sizeof(c->graphs[lru]));
	}
	c->graphs[free_i].key = key;
	c->graphs[free_i].uses = 1;
	c->graphs[free_i].last_use = ++c->graph_clock;
	return 0;
}

static int
cu_graph_end(g4_backend *be, int failed)
{
	g4_cuda    *c = g4c_of(be);
	int			i = c->cur_graph;

	c->cur_graph = -1;
	if (failed)
	{
		/* an operation may fail without marking the backend failed: the
		 * part recorded before it is not the step, and is dropped with
		 * the sighting (the shape is recorded afresh next time) */
		abort_capture(c);
		if (i >= 0 && !c->graphs[i].exec)
			memset(&c->graphs[i], 0, sizeof(c->graphs[i]));
		return G4_OK;
	}
	if (c->capturing)
	{
		cudaGraph_t g = NULL;
		cudaGraphExec_t exec = NULL;
		cudaError_t e;

		c->capturing = 0;
		e = cudaStreamEndCapture(c->stream, &g);
		if (e == cudaSuccess && c->err_code == G4_OK)
			e = cudaGraphInstantiate(&exec, g, 0);
		if (g)
			cudaGraphDestroy(g);
		if (e != cudaSuccess)
			return g4c_fail(c, e, "recording a step graph", __FILE__, __LINE__);
		if (c->err_code != G4_OK)
		{
			/* an operation failed while recording: nothing ran */
			if (exec)
				cudaGraphExecDestroy(exec);
			return c->err_code;
		}
		c->graphs[i].exec = exec;
	}
	if (i >= 0 && c->graphs[i].exec)
	{
		c->writes++;
		G4C_CHECK(c, cudaGraphLaunch(c->graphs[i].exec, c->stream));
	}
	return G4_OK;
}

/* ---- sync ---------------------------------------------------------------------- */

static int
cu_sync(g4_backend *be, g4_err *err)
{
	g4_cuda    *c = g4c_of(be);
	cudaError_t e;

	if (c->capturing)
	{
		abort_capture(c);
		fail_msg(c, G4_ERR_INTERNAL, "sync inside a recorded step graph");
	}
	e = cudaMemcpyAsync(c->h_status, c->d_status, sizeof(unsigned), cudaMemcpyDeviceToHost, c->stream);
	if (e == cudaSuccess)
		e = cudaStreamSynchronize(c->stream);
	if (e != cudaSuccess)
		g4c_fail(c, e, "cudaStreamSynchronize", __FILE__, __LINE__);
	else if (*c->h_status != 0)
	{
		*c->h_status = 0;
		e = cudaMemsetAsync(c->d_status, 0, sizeof(unsigned), c->stream);
		if (e != cudaSuccess)
			g4c_fail(c, e, "cudaMemsetAsync", __FILE__, __LINE__);
		fail_msg(c, G4_ERR_INTERNAL, "a KV block the step reads or writes was not allocated");
	}
	if (c->err_code != G4_OK)
		return g4_fail(err, c->err_code, "%s", c->err_msg);
	return G4_OK;
}

static int
cu_dry_run(g4_backend *be, int on, g4_err *err)
{
	g4_cuda    *c = g4c_of(be);

	if (on && c->capturing)
		return g4_fail(err, G4_ERR_INTERNAL, "dry steps inside a recorded step graph");
	c->dry = on;
	/* a copy offered by a launch that did not run is no copy */
	c->act_bf16_of = NULL;
	return on ? G4_OK : cu_sync(be, err);
}

/* ---- the table -------------------------------------------------------------------- */

static const g4_backend_ops cuda_ops = {
	.name = "cuda",
	.destroy = cu_destroy,
	.device_info = cu_device_info,
	.held = cu_held,
	.dry_run = cu_dry_run,
	.alloc = cu_alloc,
	.free = cu_free,
	.upload = cu_upload,
	.download = cu_download,
	.fill = cu_fill,
	.weight_create = cu_weight_create,
	.weight_destroy = cu_weight_destroy,
	.weight_bytes = cu_weight_bytes,
	.kv_configure = cu_kv_configure,
	.step_begin = cu_step_begin,
	.embed = g4c_embed,
	.matmul = g4c_matmul,
	.rmsnorm = g4c_rmsnorm,
	.head_norm_rope = g4c_head_norm_rope,
	.kv_store = g4c_kv_store,
	.attention = g4c_attention,
	.geglu = g4c_geglu,
	.matmul_geglu = g4c_matmul_geglu,
	.add_rmsnorm = g4c_add_rmsnorm,
	.embed_concat = g4c_embed_concat,
	.argmax = g4c_argmax,
	.gather_logit_rows = g4c_gather_logit_rows,
	.softcap = g4c_softcap,
	.sync = cu_sync,
	.graph_begin = cu_graph_begin,
	.graph_end = cu_graph_end,
	.sample = g4c_sample,
	.layernorm = g4c_layernorm,
	.add_bias = g4c_add_bias,
	.add_pos2d = g4c_add_pos2d,
};

extern "C" int
g4_backend_cuda_available(void)
{
	int			n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess)
	{
		cudaGetLastError();
		return 0;
	}
	return n > 0;
}

extern "C" int
g4_backend_cuda_create(int device, g4_backend **out, g4_err *err)
{
	g4_cuda    *c;
	cudaDeviceProp prop;
	cudaError_t e;
	int			n = 0;

	*out = NULL;
	e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n == 0)
	{
		cudaGetLastError();
		return g4_fail(err, G4_ERR_UNSUPPORTED, "no CUDA device is usable (%s)",
					   e != cudaSuccess ? cudaGetErrorString(e) : "none found");
	}
	if (device < 0 || device >= n)
		return g4_fail(err, G4_ERR_INVALID, "CUDA device %d does not exist (%d found)", device, n);
	c = (g4_cuda *) calloc(1, sizeof(g4_cuda));
	if (!c)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	c->base.ops = &cuda_ops;
	c->device = device;
	c->cur_graph = -1;
	e = cudaSetDevice(device);
	if (e == cudaSuccess)
		e = cudaGetDeviceProperties(&prop, device);
	if (e == cudaSuccess && prop.major < 8)
	{
		free(c);
		return g4_fail(err, G4_ERR_UNSUPPORTED, "CUDA device %s has compute capability %d.%d; 8.0 or newer is needed",
					   prop.name, prop.major, prop.minor);
	}
	if (e == cudaSuccess)
		e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
	if (e == cudaSuccess)
		e = cudaEventCreateWithFlags(&c->meta_done, cudaEventDisableTiming);
	if (e == cudaSuccess)
		e = cudaMalloc((void **) &c->d_status, sizeof(unsigned));
	if (e == cudaSuccess)
		e = cudaMemsetAsync(c->d_status, 0, sizeof(unsigned), c->stream);
	if (e == cudaSuccess)
		e = cudaMallocHost((void **) &c->h_status, sizeof(unsigned));
	if (e == cudaSuccess)
		e = cudaMalloc(&c->act_bf16, G4C_ACT_BF16_BYTES);
	if (e != cudaSuccess)
	{
		cudaGetLastError();
		g4_fail(err, G4_ERR_BACKEND, "cannot start CUDA on device %d: %s", device, cudaGetErrorString(e));
		cu_destroy(&c->base);
		return err->code;
	}
	c->sm_count = prop.multiProcessorCount;
	c->pdl = prop.major >= 9;
	c->wgmma = g4c_wgmma_probe(c, prop.major, prop.minor);
	if (g4c_lt_init(c) != G4_OK)
	{
		g4_fail(err, G4_ERR_BACKEND, "cannot start cuBLASLt on device %d: %s", device, c->err_msg);
		cu_destroy(&c->base);
		return err->code;
	}
	snprintf(c->name, sizeof(c->name), "%.200s (cc %d.%d, %d SMs)", prop.name, prop.major, prop.minor, c->sm_count);
	*out = &c->base;
	return G4_OK;
}
