/*
 * safetensors.c — safetensors reader (one file, or a sharded checkpoint
 * described by model.safetensors.index.json).
 *
 * File layout: u64 little-endian header length N | N bytes of JSON header |
 * tensor data.  The header maps each tensor name to
 * {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]} with offsets
 * relative to the start of the data section, plus an optional
 * "__metadata__" object of strings (ignored here).
 *
 * Each file is mapped; only its header is parsed (by the JSON reader, whose
 * document stays alive: tensor names point into it).  Every tensor is
 * checked: known dtype, non-negative shape, byte count equal to
 * numel * dtype size, range inside the file, no overlap with another tensor
 * of the same file.  Tensor data is not necessarily aligned to its dtype
 * (the format does not require it); readers must use unaligned loads.
 */
#include "safetensors.h"

#include <stdio.h>
#include <stdlib.h>

#include "json.h"
#include "util.h"

/* Same limit as the reference implementation: a header is metadata, never
 * more than 100 MB. */
#define ST_MAX_HEADER (100u * 1000u * 1000u)
#define ST_INDEX_NAME "model.safetensors.index.json"
#define ST_SINGLE_NAME "model.safetensors"

static const struct
{
	const char *name;
	size_t		size;
}			dtypes[G4_DT_COUNT] = {
	[G4_DT_F64] = {"F64", 8},
	[G4_DT_F32] = {"F32", 4},
	[G4_DT_F16] = {"F16", 2},
	[G4_DT_BF16] = {"BF16", 2},
	[G4_DT_I64] = {"I64", 8},
	[G4_DT_I32] = {"I32", 4},
	[G4_DT_I16] = {"I16", 2},
	[G4_DT_I8] = {"I8", 1},
	[G4_DT_U8] = {"U8", 1},
	[G4_DT_BOOL] = {"BOOL", 1},
	[G4_DT_F8_E4M3] = {"F8_E4M3", 1},
	[G4_DT_F8_E5M2] = {"F8_E5M2", 1},
};

const char *
g4_dtype_name(int dtype)
{
	if (dtype < 0 || dtype >= G4_DT_COUNT)
		return "unknown";
	return dtypes[dtype].name;
}

size_t
g4_dtype_size(int dtype)
{
	if (dtype < 0 || dtype >= G4_DT_COUNT)
		return 0;
	return dtypes[dtype].size;
}

static int
dtype_from_name(const char *s)
{
	int			i;

	for (i = 0; i < G4_DT_COUNT; i++)
		if (strcmp(s, dtypes[i].name) == 0)
			return i;
	return -1;
}

typedef struct
{
	char	   *path;
	g4_mmap		map;
	g4j_doc    *doc;
} st_file;

struct g4_safetensors
{
	char	   *path;			/* what the caller opened */
	st_file    *files;
	int			n_files;
	g4_st_tensor *tensors;
	size_t		n_tensors;
	size_t		cap_tensors;
	size_t	   *hash;			/* open addressing: tensor index + 1, 0 empty */
	size_t		hash_cap;
	size_t		data_bytes;
};

static uint64_t
hash_str(const char *s)
{
	uint64_t	h = 1469598103934665603ull;

	for (; *s; s++)
		h = (h ^ (uint8_t) *s) * 1099511628211ull;
	return h;
}

typedef struct
{
	size_t		begin;
	size_t		end;
	size_t		idx;
} span;

static int
cmp_span(const void *a, const void *b)
{
	const span *x = a,
			   *y = b;

	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	return x->end < y->end ? -1 : (x->end > y->end);
}

/* Write "[a, b, c]" into buf. */
static void
fmt_shape(char *buf, size_t len, int ndim, const int64_t *shape)
{
	size_t		n = 0;
	int			i;

	n += (size_t) snprintf(buf + n, len - n, "[");
	for (i = 0; i < ndim && n < len; i++)
		n += (size_t) snprintf(buf + n, len - n, "%s%lld", i ? ", " : "", (long long) shape[i]);
	if (n < len)
		snprintf(buf + n, len - n, "]");
}

/* A JSON syntax error in a header or index: the parser's message (line,
 * column) and code (G4_ERR_FORMAT, or G4_ERR_NOMEM) prefixed with the file. */
static int
bad_json(g4_err *err, const char *path, const char *what)
{
	if (!err)
		return G4_ERR_FORMAT;
	return g4_fail_ctx(err, "%s: %s", path, what);
}

/* Parse one file's header and append its tensors. */
static int
load_file(g4_safetensors *st, st_file *f, g4_err *err)
{
	const uint8_t *p;
	uint64_t	hlen = 0;
	size_t		data_start,
				data_size,
				nmem,
				i;
	const g4j  *root;
	span	   *spans = NULL;
	size_t		n_spans = 0;
	int			rc = G4_OK,
				b;

	if (!g4_is_file(f->path))
		return g4_fail(err, G4_ERR_IO, "safetensors file not found: %s", f->path);
	if ((rc = g4_mmap_open(f->path, &f->map, err)) != G4_OK)
		return rc;
	p = (const uint8_t *) f->map.data;
	if (f->map.size < 8)
		return g4_fail(err, G4_ERR_IO,
					   "%s: truncated: the header length needs 8 bytes, the file has %zu",
					   f->path, f->map.size);
	for (b = 0; b < 8; b++)
		hlen |= (uint64_t) p[b] << (8 * b);
	if (hlen > ST_MAX_HEADER)
		return g4_fail(err, G4_ERR_FORMAT,
					   "%s: header too large (%llu bytes, limit %u): not a safetensors file?",
					   f->path, (unsigned long long) hlen, ST_MAX_HEADER);
	if (hlen > f->map.size - 8)
		return g4_fail(err, G4_ERR_IO,
					   "%s: truncated: the header needs %llu bytes, the file has %zu",
					   f->path, (unsigned long long) (hlen + 8), f->map.size);
	data_start = 8 + (size_t) hlen;
	data_size = f->map.size - data_start;

	f->doc = g4j_parse((const char *) p + 8, (size_t) hlen, err);
	if (!f->doc)
		return bad_json(err, f->path, "bad header JSON");
	root = g4j_root(f->doc);
	if (!g4j_is(root, G4J_OBJECT))
		return g4_fail(err, G4_ERR_FORMAT, "%s: bad header: not a JSON object", f->path);

	nmem = g4j_len(root);
	if (st->n_tensors + nmem > st->cap_tensors)
	{
		size_t		cap = G4_MAX(st->cap_tensors * 2, st->n_tensors + nmem);
		g4_st_tensor *t = g4_realloc(st->tensors, cap * sizeof(g4_st_tensor));

		if (!t)
			return g4_fail(err, G4_ERR_NOMEM, "%s: out of memory", f->path);
		st->tensors = t;
		st->cap_tensors = cap;
	}
	spans = g4_malloc(nmem * sizeof(span));
	if (!spans)
		return g4_fail(err, G4_ERR_NOMEM, "%s: out of memory", f->path);

	for (i = 0; i < nmem; i++)
	{
		const char *name = g4j_str(g4j_key_at(root, i));
		const g4j  *v = g4j_value_at(root, i);
		const g4j  *shape,
				   *offs,
				   *o0,
				   *o1;
		const char *dts;
		g4_st_tensor *t;
		int64_t		numel = 1;
		int64_t		b0,
					b1;
		size_t		k;
		int			dt;
		char		sbuf[256];

		if (!name)
			continue;
		if (strcmp(name, "__metadata__") == 0)
			continue;
		if (!g4j_is(v, G4J_OBJECT))
		{
			rc = g4_fail(err, G4_ERR_FORMAT, "%s: bad header: entry '%s' is not an object",
						 f->path, name);
			goto out;
		}
		dts = g4j_get_str(v, "dtype");
		shape = g4j_get(v, "shape");
		offs = g4j_get(v, "data_offsets");
		if (!dts || !g4j_is(shape, G4J_ARRAY) || !g4j_is(offs, G4J_ARRAY))
		{
			rc = g4_fail(err, G4_ERR_FORMAT,
						 "%s: bad header: tensor '%s' needs \"dtype\", \"shape\" and \"data_offsets\"",
						 f->path, name);
			goto out;
		}
		dt = dtype_from_name(dts);
		if (dt < 0)
		{
			rc = g4_fail(err, G4_ERR_UNSUPPORTED, "%s: tensor '%s' has unsupported dtype %s",
						 f->path, name, dts);
			goto out;
		}
		if (g4j_len(shape) > G4_MAX_DIMS)
		{
			rc = g4_fail(err, G4_ERR_UNSUPPORTED, "%s: tensor '%s' has %zu dimensions (at most %d supported)",
						 f->path, name, g4j_len(shape), G4_MAX_DIMS);
			goto out;
		}
		t = &st->tensors[st->n_tensors];
		memset(t, 0, sizeof(*t));
		t->name = name;
		t->dtype = dt;
		t->ndim = (int) g4j_len(shape);
		t->file = f->path;
		for (k = 0; k < g4j_len(shape); k++)
		{
			const g4j  *d = g4j_at(shape, k);

			if (!g4j_is(d, G4J_NUMBER) || !d->is_integer || d->integer < 0)
			{
				rc = g4_fail(err, G4_ERR_FORMAT,
							 "%s: bad header: tensor '%s' has a shape entry that is not a non-negative integer",
							 f->path, name);
				goto out;
			}
			t->shape[k] = d->integer;
			if (d->integer != 0 && numel > INT64_MAX / 8 / d->integer)
			{
				rc = g4_fail(err, G4_ERR_FORMAT, "%s: tensor '%s' has an impossible shape",
							 f->path, name);
				goto out;
			}
			numel *= d->integer;
		}
		t->numel = numel;
		o0 = g4j_at(offs, 0);
		o1 = g4j_at(offs, 1);
		if (g4j_len(offs) != 2 || !g4j_is(o0, G4J_NUMBER) || !o0->is_integer ||
			!g4j_is(o1, G4J_NUMBER) || !o1->is_integer ||
			o0->integer < 0 || o1->integer < o0->integer)
		{
			rc = g4_fail(err, G4_ERR_FORMAT,
						 "%s: bad header: tensor '%s' needs data_offsets [begin, end] with 0 <= begin <= end",
						 f->path, name);
			goto out;
		}
		b0 = o0->integer;
		b1 = o1->integer;
		if ((uint64_t) b1 > data_size)
		{
			rc = g4_fail(err, G4_ERR_IO,
						 "%s: truncated: tensor '%s' needs %lld data bytes (up to file offset %llu), "
						 "the file has %zu (%zu of data)",
						 f->path, name, (long long) b1,
						 (unsigned long long) ((uint64_t) b1 + data_start),
						 f->map.size, data_size);
			goto out;
		}
		if ((uint64_t) (b1 - b0) != (uint64_t) numel * dtypes[dt].size)
		{
			fmt_shape(sbuf, sizeof(sbuf), t->ndim, t->shape);
			rc = g4_fail(err, G4_ERR_FORMAT,
						 "%s: tensor '%s' (%s %s) needs %llu bytes, data_offsets [%lld, %lld] give %lld",
						 f->path, name, dts, sbuf,
						 (unsigned long long) ((uint64_t) numel * dtypes[dt].size),
						 (long long) b0, (long long) b1, (long long) (b1 - b0));
			goto out;
		}
		t->data = p + data_start + b0;
		t->nbytes = (size_t) (b1 - b0);
		spans[n_spans].begin = (size_t) b0;
		spans[n_spans].end = (size_t) b1;
		spans[n_spans].idx = st->n_tensors;
		n_spans++;
		st->n_tensors++;
		st->data_bytes += t->nbytes;
	}

	/* tensors of one file must not share bytes (empty ones are exempt) */
	qsort(spans, n_spans, sizeof(span), cmp_span);
	{
		size_t		max_end = 0,
					max_idx = 0;

		for (i = 0; i < n_spans; i++)
		{
			if (spans[i].end == spans[i].begin)
				continue;
			if (spans[i].begin < max_end)
			{
				const g4_st_tensor *a = &st->tensors[max_idx];
				const g4_st_tensor *c = &st->tensors[spans[i].idx];

				rc = g4_fail(err, G4_ERR_FORMAT,
							 "%s: tensors '%s' (data bytes %zu..%zu) and '%s' (data bytes %zu..%zu) overlap",
							 f->path, a->name,
							 (size_t) ((const uint8_t *) a->data - p - data_start), max_end,
							 c->name, spans[i].begin, spans[i].end);
				goto out;
			}
			max_end = spans[i].end;
			max_idx = spans[i].idx;
		}
	}
out:
	free(spans);
	return rc;
}

/* Index all tensors by name; a name present twice is an error. */
static int
build_hash(g4_safetensors *st, g4_err *err)
{
	size_t		cap = 16;
	size_t		i;

	while (cap < 2 * st->n_tensors)
		cap *= 2;
	st->hash = g4_calloc(cap, sizeof(size_t));
	if (!st->hash)
		return g4_fail(err, G4_ERR_NOMEM, "%s: out of memory", st->path);
	st->hash_cap = cap;
	for (i = 0; i < st->n_tensors; i++)
	{
		const g4_st_tensor *t = &st->tensors[i];
		size_t		h = (size_t) hash_str(t->name) & (cap - 1);

		while (st->hash[h])
		{
			const g4_st_tensor *o = &st->tensors[st->hash[h] - 1];

			if (strcmp(o->name, t->name) == 0)
			{
				if (o->file == t->file)
					return g4_fail(err, G4_ERR_FORMAT, "%s: tensor '%s' appears twice",
								   t->file, t->name);
				return g4_fail(err, G4_ERR_FORMAT, "tensor '%s' appears in both %s and %s",
							   t->name, o->file, t->file);
			}
			h = (h + 1) & (cap - 1);
		}
		st->hash[h] = i + 1;
	}
	return G4_OK;
}

/* A shard name from the index must stay inside the model directory. */
static int
safe_shard_name(const char *s)
{
	const char *c;

	if (!s || !*s || s[0] == '/')
		return 0;
	for (c = s; *c; c++)
	{
		/* reject any ".." path component */
		if ((c == s || c[-1] == '/') && c[0] == '.' && c[1] == '.' &&
			(c[2] == '/' || c[2] == '\0'))
			return 0;
	}
	return 1;
}

static int
add_file(g4_safetensors *st, char *path, g4_err *err)
{
	st_file    *f = g4_realloc(st->files, (size_t) (st->n_files + 1) * sizeof(st_file));

	if (!f)
	{
		free(path);
		return g4_fail(err, G4_ERR_NOMEM, "out of memory opening %s", st->path);
	}
	st->files = f;
	memset(&f[st->n_files], 0, sizeof(st_file));
	f[st->n_files].path = path;
	st->n_files++;
	return load_file(st, &f[st->n_files - 1], err);
}

static int
open_index(g4_safetensors *st, const char *dir, const char *index_path, g4_err *err)
{
	char	   *text = NULL;
	size_t		len = 0;
	g4j_doc    *doc;
	const g4j  *wm;
	size_t		i,
				j;
	int			rc;

	if ((rc = g4_read_file(index_path, &text, &len, err)) != G4_OK)
		return rc;
	doc = g4j_parse(text, len, err);
	free(text);
	if (!doc)
		return bad_json(err, index_path, "bad JSON");
	wm = g4j_get(g4j_root(doc), "weight_map");
	if (!g4j_is(wm, G4J_OBJECT))
	{
		g4j_free(doc);
		return g4_fail(err, G4_ERR_FORMAT, "%s: no \"weight_map\" object", index_path);
	}

	/* open every distinct shard once, in order of first mention */
	for (i = 0; i < g4j_len(wm); i++)
	{
		const char *shard = g4j_str(g4j_value_at(wm, i));
		const char *tname = g4j_str(g4j_key_at(wm, i));
		int			seen = 0;
		char	   *path;

		if (!safe_shard_name(shard))
		{
			rc = g4_fail(err, G4_ERR_FORMAT, "%s: tensor '%s' maps to an invalid shard name '%s'",
						 index_path, tname ? tname : "?", shard ? shard : "(not a string)");
			goto out;
		}
		for (j = 0; j < i && !seen; j++)
			seen = strcmp(g4j_str(g4j_value_at(wm, j)), shard) == 0;
		if (seen)
			continue;
		path = g4_path_join(dir, shard);
		if (!path)
		{
			rc = g4_fail(err, G4_ERR_NOMEM, "out of memory opening %s", dir);
			goto out;
		}
		if (!g4_is_file(path))
		{
			rc = g4_fail(err, G4_ERR_IO,
						 "shard %s not found (the index %s lists it for tensor '%s')",
						 path, index_path, tname ? tname : "?");
			free(path);
			goto out;
		}
		if ((rc = add_file(st, path, err)) != G4_OK)
			goto out;
	}
	if ((rc = build_hash(st, err)) != G4_OK)
		goto out;

	/* every tensor the index names must be in the shard it names */
	for (i = 0; i < g4j_len(wm); i++)
	{
		const char *tname = g4j_str(g4j_key_at(wm, i));
		const char *shard = g4j_str(g4j_value_at(wm, i));
		const g4_st_tensor *t = g4_st_find(st, tname);
		char	   *want = g4_path_join(dir, shard);

		if (!want)
		{
			rc = g4_fail(err, G4_ERR_NOMEM, "out of memory opening %s", dir);
			goto out;
		}
		if (!t || strcmp(t->file, want) != 0)
		{
			if (!t)
				rc = g4_fail(err, G4_ERR_FORMAT,
							 "tensor '%s' is missing: the index %s says shard %s holds it, but it does not",
							 tname, index_path, shard);
			else
				rc = g4_fail(err, G4_ERR_FORMAT,
							 "tensor '%s': the index %s says shard %s holds it, but it is in %s",
							 tname, index_path, shard, t->file);
			free(want);
			goto out;
		}
		free(want);
	}
	if (st->n_files == 0)
		rc = g4_fail(err, G4_ERR_FORMAT, "%s: the weight map is empty", index_path);
out:
	g4j_free(doc);
	return rc;
}

int
g4_st_open(const char *path, g4_safetensors **out, g4_err *err)
{
	g4_safetensors *st;
	int			rc;

	*out = NULL;
	st = g4_calloc(1, sizeof(g4_safetensors));
	if (!st)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory opening %s", path);
	st->path = g4_strdup(path);
	if (!st->path)
	{
		free(st);
		return g4_fail(err, G4_ERR_NOMEM, "out of memory opening %s", path);
	}
	if (g4_is_dir(path))
	{
		char	   *index = g4_path_join(path, ST_INDEX_NAME);
		char	   *single = g4_path_join(path, ST_SINGLE_NAME);

		if (!index || !single)
		{
			free(index);
			free(single);
			g4_st_close(st);
			return g4_fail(err, G4_ERR_NOMEM, "out of memory opening %s", path);
		}
		/* a sharded checkpoint's index is authoritative */
		if (g4_is_file(index))
		{
			rc = open_index(st, path, index, err);
			free(single);
		}
		else if (g4_is_file(single))
		{
			rc = add_file(st, single, err);
			if (rc == G4_OK)
				rc = build_hash(st, err);
		}
		else
		{
			free(single);
			rc = g4_fail(err, G4_ERR_IO, "%s holds neither %s nor %s",
						 path, ST_SINGLE_NAME, ST_INDEX_NAME);
		}
		free(index);
	}
	else if (g4_is_file(path))
	{
		char	   *copy = g4_strdup(path);

		if (!copy)
			rc = g4_fail(err, G4_ERR_NOMEM, "out of memory opening %s", path);
		else if ((rc = add_file(st, copy, err)) == G4_OK)
			rc = build_hash(st, err);
	}
	else
		rc = g4_fail(err, G4_ERR_IO, "safetensors checkpoint not found: %s", path);

	if (rc != G4_OK)
	{
		g4_st_close(st);
		return rc;
	}
	*out = st;
	return G4_OK;
}

void
g4_st_close(g4_safetensors *st)
{
	int			i;

	if (!st)
		return;
	for (i = 0; i < st->n_files; i++)
	{
		g4j_free(st->files[i].doc);
		g4_mmap_close(&st->files[i].map);
		free(st->files[i].path);
	}
	free(st->files);
	free(st->tensors);
	free(st->hash);
	free(st->path);
	free(st);
}

const g4_st_tensor *
g4_st_find(const g4_safetensors *st, const char *name)
{
	size_t		h;

	if (!st || !name || !st->hash)
		return NULL;
	h = (size_t) hash_str(name) & (st->hash_cap - 1);
	while (st->hash[h])
	{
		const g4_st_tensor *t = &st->tensors[st->hash[h] - 1];

		if (strcmp(t->name, name) == 0)
			return t;
		h = (h + 1) & (st->hash_cap - 1);
	}
	return NULL;
}

size_t
g4_st_count(const g4_safetensors *st)
{
	return st ? st->n_tensors : 0;
}

const g4_st_tensor *
g4_st_at(const g4_safetensors *st, size_t i)
{
	return st && i < st->n_tensors ? &st->tensors[i] : NULL;
}

int
g4_st_expect(const g4_safetensors *st, const char *name, int dtype,
			 int ndim, const int64_t *shape, const g4_st_tensor **out,
			 g4_err *err)
{
	const g4_st_tensor *t = g4_st_find(st, name);

	if (out)
		*out = NULL;
	if (!t)
		return g4_fail(err, G4_ERR_FORMAT, "tensor '%s' not found in %s (%zu tensors in %d file%s)",
					   name, st->path, st->n_tensors, st->n_files, st->n_files == 1 ? "" : "s");
	if (dtype >= 0 && t->dtype != dtype)
		return g4_fail(err, G4_ERR_UNSUPPORTED, "tensor '%s' in %s has dtype %s, expected %s",
					   name, t->file, g4_dtype_name(t->dtype), g4_dtype_name(dtype));
	if (shape)
	{
		int			same = ndim == t->ndim;
		int			i;

		for (i = 0; same && i < ndim; i++)
			same = shape[i] == t->shape[i];
		if (!same)
		{
			char		want[256],
						have[256];

			fmt_shape(want, sizeof(want), ndim, shape);
			fmt_shape(have, sizeof(have), t->ndim, t->shape);
			return g4_fail(err, G4_ERR_FORMAT, "tensor '%s' in %s has shape %s, expected %s",
						   name, t->file, have, want);
		}
	}
	if (out)
		*out = t;
	return G4_OK;
}

size_t
g4_st_data_bytes(const g4_safetensors *st)
{
	return st ? st->data_bytes : 0;
}
