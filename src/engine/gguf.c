/*
 * gguf.c — GGUF (versions 2 and 3) reader.
 *
 * File layout (all little-endian):
 *   "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv x { string key | u32 type | value }
 *   n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml type |
 *                 u64 offset }
 *   padding to general.alignment (default 32) | tensor data
 * A string is u64 length + bytes (no NUL); an array is u32 element type +
 * u64 count + elements (arrays may nest).
 *
 * The file is mapped read-only.  Every length read from it is checked
 * against the bytes that remain before it is used or allocated for, so a
 * truncated or hostile file yields an error, never a crash or a huge
 * allocation.  Keys and string values are copied (NUL-terminated) into an
 * arena; numeric arrays and tensor data point into the mapping, and are not
 * necessarily aligned (numeric arrays follow strings of any length).
 *
 * Arrays of arrays: arr_type is G4_GGUF_ARRAY and arr_data points to arr_len
 * g4_gguf_kv elements (key NULL) describing the inner arrays.
 */
#include "gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend.h"
#include "util.h"

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4
#define GGUF_MAX_NESTING 8		/* arrays of arrays of ... */
#define GGUF_MAX_KEY 65535		/* the format's limit on key length */

/* ---- ggml types: names, block sizes, block bytes ----------------------- */

typedef struct
{
	const char *name;
	int			block;			/* 0: unknown type */
	int			bytes;
} ggml_type_info;

#define TN(n) [n] = {"type " #n, 0, 0}

static const ggml_type_info ggml_types[64] = {
	TN(4), TN(5), TN(31), TN(32), TN(33), TN(36), TN(37), TN(38),
	TN(42), TN(43), TN(44), TN(45), TN(46), TN(47), TN(48), TN(49),
	TN(50), TN(51), TN(52), TN(53), TN(54), TN(55), TN(56), TN(57),
	TN(58), TN(59), TN(60), TN(61), TN(62), TN(63),
	[0] = {"F32", 1, 4},
	[1] = {"F16", 1, 2},
	[2] = {"Q4_0", 32, 18},
	[3] = {"Q4_1", 32, 20},
	[6] = {"Q5_0", 32, 22},
	[7] = {"Q5_1", 32, 24},
	[8] = {"Q8_0", 32, 34},
	[9] = {"Q8_1", 32, 36},
	[10] = {"Q2_K", 256, 84},
	[11] = {"Q3_K", 256, 110},
	[12] = {"Q4_K", 256, 144},
	[13] = {"Q5_K", 256, 176},
	[14] = {"Q6_K", 256, 210},
	[15] = {"Q8_K", 256, 292},
	[16] = {"IQ2_XXS", 256, 66},
	[17] = {"IQ2_XS", 256, 74},
	[18] = {"IQ3_XXS", 256, 98},
	[19] = {"IQ1_S", 256, 50},
	[20] = {"IQ4_NL", 32, 18},
	[21] = {"IQ3_S", 256, 110},
	[22] = {"IQ2_S", 256, 82},
	[23] = {"IQ4_XS", 256, 136},
	[24] = {"I8", 1, 1},
	[25] = {"I16", 1, 2},
	[26] = {"I32", 1, 4},
	[27] = {"I64", 1, 8},
	[28] = {"F64", 1, 8},
	[29] = {"IQ1_M", 256, 56},
	[30] = {"BF16", 1, 2},
	[34] = {"TQ1_0", 256, 54},
	[35] = {"TQ2_0", 256, 66},
	[39] = {"MXFP4", 32, 17},
	[40] = {"NVFP4", 64, 36},
	[41] = {"Q1_0", 128, 18},
};

#undef TN

const char *
g4_ggml_type_name(int ggml_type)
{
	if (ggml_type < 0 || ggml_type >= (int) G4_ARRAY_LEN(ggml_types))
		return "unknown type";
	return ggml_types[ggml_type].name;
}

static const ggml_type_info *
ggml_info(uint32_t type)
{
	if (type >= G4_ARRAY_LEN(ggml_types) || ggml_types[type].block == 0)
		return NULL;
	return &ggml_types[type];
}

int
g4_gguf_wfmt(int ggml_type)
{
	switch (ggml_type)
	{
		case G4_GGML_F32:
			return G4_W_F32;
		case G4_GGML_F16:
			return G4_W_F16;
		case G4_GGML_BF16:
			return G4_W_BF16;
		case G4_GGML_Q8_0:
			return G4_W_Q8_0;
		case G4_GGML_Q4_0:
			return G4_W_Q4_0;
		case G4_GGML_Q4_1:
			return G4_W_Q4_1;
		case G4_GGML_Q5_0:
			return G4_W_Q5_0;
		case G4_GGML_Q5_1:
			return G4_W_Q5_1;
		case G4_GGML_Q4_K:
			return G4_W_Q4_K;
		case G4_GGML_Q5_K:
			return G4_W_Q5_K;
		case G4_GGML_Q6_K:
			return G4_W_Q6_K;
	}
	return -1;
}

static const char *
kv_type_name(int type)
{
	static const char *const names[] = {
		"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string",
		"array", "u64", "i64", "f64"
	};

	if (type < 0 || type >= (int) G4_ARRAY_LEN(names))
		return "?";
	return names[type];
}

/* Size of a fixed-size value type; 0 for string/array/unknown. */
static size_t
kv_scalar_size(uint32_t type)
{
	switch (type)
	{
		case G4_GGUF_U8:
		case G4_GGUF_I8:
		case G4_GGUF_BOOL:
			return 1;
		case G4_GGUF_U16:
		case G4_GGUF_I16:
			return 2;
		case G4_GGUF_U32:
		case G4_GGUF_I32:
		case G4_GGUF_F32:
			return 4;
		case G4_GGUF_U64:
		case G4_GGUF_I64:
		case G4_GGUF_F64:
			return 8;
	}
	return 0;
}

/* ---- arena for keys, strings and descriptor arrays --------------------- */

typedef struct arena_block
{
	struct arena_block *next;
	size_t		used;
	size_t		cap;
	max_align_t data[];
} arena_block;

typedef struct
{
	arena_block *head;
	int			n_blocks;
} arena;

static void *
arena_alloc(arena *a, size_t n)
{
	arena_block *b = a->head;
	size_t		need = (n + 15) & ~(size_t) 15;

	if (!b || b->cap - b->used < need)
	{
		/* blocks grow from 64 KiB to 2 MiB: small files stay small */
		size_t		cap = G4_MAX(need, (size_t) 65536 << G4_MIN(a->n_blocks, 5));

		b = g4_malloc(sizeof(arena_block) + cap);
		if (!b)
			return NULL;
		b->next = a->head;
		b->used = 0;
		b->cap = cap;
		a->head = b;
		a->n_blocks++;
	}
	b->used += need;
	return (char *) b->data + (b->used - need);
}

static void
arena_free(arena *a)
{
	while (a->head)
	{
		arena_block *n = a->head->next;

		free(a->head);
		a->head = n;
	}
}

/* ---- the reader ---------------------------------------------------------- */

struct g4_gguf
{
	char	   *path;
	g4_mmap		map;
	uint32_t	version;
	size_t		alignment;
	size_t		data_offset;
	arena		mem;
	g4_gguf_kv *kv;
	size_t		n_kv;
	g4_gguf_tensor *tensors;
	size_t		n_tensors;
	size_t	   *kv_hash;		/* open addressing: index + 1, 0 empty */
	size_t		kv_hash_cap;
	size_t	   *t_hash;
	size_t		t_hash_cap;
};

typedef struct
{
	const uint8_t *p;
	size_t		size;
	size_t		pos;
	g4_gguf    *g;
	g4_err	   *err;
	const char *what;			/* item being read, for messages */
} cursor;

static int
truncated(cursor *c, size_t need)
{
	return g4_fail(c->err, G4_ERR_IO,
				   "%s: truncated while reading %s: needs %zu bytes at offset %zu, file has %zu",
				   c->g->path, c->what, need, c->pos, c->size);
}

static int
rd_bytes(cursor *c, size_t n, const uint8_t **out)
{
	if (n > c->size - c->pos)
		return truncated(c, n);
	*out = c->p + c->pos;
	c->pos += n;
	return G4_OK;
}

static int
rd_u32(cursor *c, uint32_t *v)
{
	const uint8_t *b = NULL;
	int			rc = rd_bytes(c, 4, &b);

	if (rc)
		return rc;
	*v = (uint32_t) b[0] | ((uint32_t) b[1] << 8) | ((uint32_t) b[2] << 16) |
		((uint32_t) b[3] << 24);
	return G4_OK;
}

static int
rd_u64(cursor *c, uint64_t *v)
{
	uint32_t	lo,
				hi;
	int			rc;

	if ((rc = rd_u32(c, &lo)) || (rc = rd_u32(c, &hi)))
		return rc;
	*v = (uint64_t) lo | ((uint64_t) hi << 32);
	return G4_OK;
}

/* A string: copied, NUL-terminated, into the arena. */
static int
rd_str(cursor *c, const char **out, size_t *len)
{
	uint64_t	n;
	const uint8_t *b = NULL;
	char	   *s;
	int			rc;

	if ((rc = rd_u64(c, &n)))
		return rc;
	if (n > c->size - c->pos)
	{
		c->pos -= 8;
		return g4_fail(c->err, G4_ERR_IO,
					   "%s: truncated while reading %s: string of %llu bytes at offset %zu, file has %zu",
					   c->g->path, c->what, (unsigned long long) n, c->pos, c->size);
	}
	if ((rc = rd_bytes(c, (size_t) n, &b)))
		return rc;
	s = arena_alloc(&c->g->mem, (size_t) n + 1);
	if (!s)
		return g4_fail(c->err, G4_ERR_NOMEM, "%s: out of memory", c->g->path);
	memcpy(s, b, (size_t) n);
	s[n] = '\0';
	*out = s;
	if (len)
		*len = (size_t) n;
	return G4_OK;
}

/* Decode a scalar of `type` at b into kv->v. */
static void
set_scalar(g4_gguf_kv *kv, uint32_t type, const uint8_t *b)
{
	switch (type)
	{
		case G4_GGUF_U8:
		case G4_GGUF_U16:
		case G4_GGUF_U32:
		case G4_GGUF_U64:
		case G4_GGUF_BOOL:
			kv->v.u = g4_load_le(b, kv_scalar_size(type));
			break;
		case G4_GGUF_I8:
			kv->v.i = (int8_t) b[0];
			break;
		case G4_GGUF_I16:
			kv->v.i = (int16_t) g4_load_le(b, 2);
			break;
		case G4_GGUF_I32:
			kv->v.i = (int32_t) g4_load_le(b, 4);
			break;
		case G4_GGUF_I64:
			kv->v.i = (int64_t) g4_load_le(b, 8);
			break;
		case G4_GGUF_F32:
			{
				uint32_t	u = (uint32_t) g4_load_le(b, 4);
				float		f;

				memcpy(&f, &u, 4);
				kv->v.f = f;
				break;
			}
		case G4_GGUF_F64:
			{
				uint64_t	u = g4_load_le(b, 8);
				double		f;

				memcpy(&f, &u, 8);
				kv->v.f = f;
				break;
			}
	}
}

/* The value part of a key/value pair or of an inner array; type is known. */
static int
rd_value(cursor *c, uint32_t type, g4_gguf_kv *kv, int depth)
{
	int			rc;

	kv->type = (int) type;
	if (type == G4_GGUF_STRING)
		return rd_str(c, &kv->str, &kv->str_len);
	if (type != G4_GGUF_ARRAY)
	{
		size_t		sz = kv_scalar_size(type);
		const uint8_t *b = NULL;

		if (sz == 0)
			return g4_fail(c->err, G4_ERR_FORMAT, "%s: %s has unknown value type %u",
						   c->g->path, c->what, type);
		if ((rc = rd_bytes(c, sz, &b)))
			return rc;
		set_scalar(kv, type, b);
		return G4_OK;
	}
	else
	{
		uint32_t	et;
		uint64_t	n;
		size_t		remain;

		if (depth >= GGUF_MAX_NESTING)
			return g4_fail(c->err, G4_ERR_FORMAT, "%s: %s: arrays nested deeper than %d",
						   c->g->path, c->what, GGUF_MAX_NESTING);
		if ((rc = rd_u32(c, &et)) || (rc = rd_u64(c, &n)))
			return rc;
		kv->arr_type = (int) et;
		kv->arr_len = n;
		remain = c->size - c->pos;
		if (et == G4_GGUF_STRING)
		{
			const char **strs;
			size_t	   *lens;
			uint64_t	i;

			/* each element takes at least its 8-byte length */
			if (n > remain / 8)
				return g4_fail(c->err, G4_ERR_IO,
							   "%s: truncated while reading %s: %llu strings cannot fit in the %zu bytes left",
							   c->g->path, c->what, (unsigned long long) n, remain);
			strs = arena_alloc(&c->g->mem, (size_t) n * sizeof(char *));
			lens = arena_alloc(&c->g->mem, (size_t) n * sizeof(size_t));
			if (!strs || !lens)
				return g4_fail(c->err, G4_ERR_NOMEM, "%s: out of memory", c->g->path);
			for (i = 0; i < n; i++)
				if ((rc = rd_str(c, &strs[i], &lens[i])))
					return rc;
			kv->arr_strs = strs;
			kv->arr_str_lens = lens;
			return G4_OK;
		}
		if (et == G4_GGUF_ARRAY)
		{
			g4_gguf_kv *items;
			uint64_t	i;

			/* each inner array takes at least 12 bytes (type + count) */
			if (n > remain / 12)
				return g4_fail(c->err, G4_ERR_IO,
							   "%s: truncated while reading %s: %llu arrays cannot fit in the %zu bytes left",
							   c->g->path, c->what, (unsigned long long) n, remain);
			items = arena_alloc(&c->g->mem, (size_t) n * sizeof(g4_gguf_kv));
			if (!items)
				return g4_fail(c->err, G4_ERR_NOMEM, "%s: out of memory", c->g->path);
			memset(items, 0, (size_t) n * sizeof(g4_gguf_kv));
			for (i = 0; i < n; i++)
				if ((rc = rd_value(c, G4_GGUF_ARRAY, &items[i], depth + 1)))
					return rc;
			kv->arr_data = items;
			return G4_OK;
		}
		else
		{
			size_t		sz = kv_scalar_size(et);
			const uint8_t *b = NULL;

			if (sz == 0)
				return g4_fail(c->err, G4_ERR_FORMAT, "%s: %s is an array of unknown type %u",
							   c->g->path, c->what, et);
			if (n > remain / sz)
				return g4_fail(c->err, G4_ERR_IO,
							   "%s: truncated while reading %s: %llu elements of %zu bytes at offset %zu, file has %zu",
							   c->g->path, c->what, (unsigned long long) n, sz, c->pos, c->size);
			if ((rc = rd_bytes(c, (size_t) n * sz, &b)))
				return rc;
			kv->arr_data = b;
			return G4_OK;
		}
	}
}

static uint64_t
hash_str(const char *s)
{
	uint64_t	h = 1469598103934665603ull;

	for (; *s; s++)
		h = (h ^ (uint8_t) *s) * 1099511628211ull;
	return h;
}

/* Build an open-addressing index of names; fails on a duplicate. */
static int
build_hash(const char *const *names, size_t n, size_t **out, size_t *out_cap,
		   size_t *dup)
{
	size_t		cap = 16;
	size_t	   *tab;
	size_t		i;

	while (cap < 2 * n)
		cap *= 2;
	tab = g4_calloc(cap, sizeof(size_t));
	if (!tab)
		return G4_ERR_NOMEM;
	for (i = 0; i < n; i++)
	{
		size_t		h = (size_t) hash_str(names[i]) & (cap - 1);

		while (tab[h])
		{
			if (strcmp(names[tab[h] - 1], names[i]) == 0)
			{
				free(tab);
				*dup = i;
				return G4_ERR_FORMAT;
			}
			h = (h + 1) & (cap - 1);
		}
		tab[h] = i + 1;
	}
	*out = tab;
	*out_cap = cap;
	return G4_OK;
}

typedef struct
{
	uint64_t	off;
	uint64_t	end;
	size_t		idx;
} span;

static int
cmp_span(const void *a, const void *b)
{
	const span *x = a,
			   *y = b;

	if (x->off != y->off)
		return x->off < y->off ? -1 : 1;
	return x->end < y->end ? -1 : (x->end > y->end);
}

static int
parse(g4_gguf *g, g4_err *err)
{
	cursor		c = {(const uint8_t *) g->map.data, g->map.size, 0, g, err, "the header"};
	const uint8_t *magic = NULL;
	uint64_t	n_tensors,
				n_kv,
				i;
	const char **names = NULL;
	size_t		dup;
	span	   *spans = NULL;
	int			rc;

	if (c.size < 4 || memcmp(c.p, GGUF_MAGIC, 4) != 0)
	{
		char		shown[16] = "";
		size_t		k,
					n = 0;

		for (k = 0; k < 4 && k < c.size; k++)
			n += (size_t) snprintf(shown + n, sizeof(shown) - n, k ? " %02x" : "%02x", c.p[k]);
		return g4_fail(err, G4_ERR_FORMAT, "%s is not a GGUF file (magic %s, expected \"GGUF\")",
					   g->path, c.size ? shown : "missing");
	}
	rc = rd_bytes(&c, 4, &magic);
	if (rc == G4_OK)
		rc = rd_u32(&c, &g->version);
	if (rc)
		return rc;
	if (g->version != 2 && g->version != 3)
	{
		if ((g->version & 0xFFFF) == 0 && ((g->version >> 24) == 2 || (g->version >> 24) == 3))
			return g4_fail(err, G4_ERR_UNSUPPORTED, "%s: big-endian GGUF files are not supported",
						   g->path);
		if (g->version == 1)
			return g4_fail(err, G4_ERR_UNSUPPORTED,
						   "%s: GGUF version 1 is not supported (need version 2 or 3)", g->path);
		return g4_fail(err, G4_ERR_FORMAT, "%s: unknown GGUF version %u (need 2 or 3)",
					   g->path, g->version);
	}
	if ((rc = rd_u64(&c, &n_tensors)) || (rc = rd_u64(&c, &n_kv)))
		return rc;

	/*
	 * A key/value takes at least 13 bytes, a tensor info at least 24: larger
	 * counts mean a truncated file (or a corrupt count; the two cannot be
	 * told apart) and are refused before anything is allocated for them.
	 */
	if (n_kv > (c.size - c.pos) / 13 || n_tensors > (c.size - c.pos - n_kv * 13) / 24)
		return g4_fail(err, G4_ERR_IO,
					   "%s: truncated or corrupt: the header claims %llu metadata entries and %llu tensors, "
					   "impossible in the %zu bytes that follow it",
					   g->path, (unsigned long long) n_kv, (unsigned long long) n_tensors,
					   c.size - c.pos);

	g->kv = g4_calloc((size_t) n_kv, sizeof(g4_gguf_kv));
	g->tensors = g4_calloc((size_t) n_tensors, sizeof(g4_gguf_tensor));
	if (!g->kv || !g->tensors)
		return g4_fail(err, G4_ERR_NOMEM, "%s: out of memory", g->path);

	/* metadata */
	for (i = 0; i < n_kv; i++)
	{
		g4_gguf_kv *kv = &g->kv[i];
		char		what[192];
		uint64_t	klen;
		uint32_t	type;

		snprintf(what, sizeof(what), "metadata entry %llu", (unsigned long long) i);
		c.what = what;
		if ((rc = rd_u64(&c, &klen)))
			return rc;
		if (klen > GGUF_MAX_KEY)
			return g4_fail(err, G4_ERR_FORMAT, "%s: metadata entry %llu has a key of %llu bytes",
						   g->path, (unsigned long long) i, (unsigned long long) klen);
		c.pos -= 8;
		if ((rc = rd_str(&c, &kv->key, NULL)))
			return rc;
		snprintf(what, sizeof(what), "metadata key '%.150s'", kv->key);
		if ((rc = rd_u32(&c, &type)))
			return rc;
		if ((rc = rd_value(&c, type, kv, 0)))
			return rc;
		g->n_kv++;
	}

	/* alignment */
	{
		const g4_gguf_kv *a = NULL;

		for (i = 0; i < n_kv; i++)
			if (strcmp(g->kv[i].key, "general.alignment") == 0)
				a = &g->kv[i];
		g->alignment = GGUF_DEFAULT_ALIGNMENT;
		if (a)
		{
			uint64_t	v;

			if (a->type == G4_GGUF_U8 || a->type == G4_GGUF_U16 ||
				a->type == G4_GGUF_U32 || a->type == G4_GGUF_U64)
				v = a->v.u;
			else if (a->type == G4_GGUF_I8 || a->type == G4_GGUF_I16 ||
					 a->type == G4_GGUF_I32 || a->type == G4_GGUF_I64)
				v = a->v.i > 0 ? (uint64_t) a->v.i : 0;
			else
				return g4_fail(err, G4_ERR_FORMAT, "%s: general.alignment has type %s, expected an integer",
							   g->path, kv_type_name(a->type));
			if (v == 0 || (v & (v - 1)) != 0 || v > ((uint64_t) 1 << 30))
				return g4_fail(err, G4_ERR_FORMAT,
							   "%s: general.alignment is %llu, expected a power of two",
							   g->path, (unsigned long long) v);
			g->alignment = (size_t) v;
		}
	}

	/* tensor infos */
	spans = g4_malloc((size_t) n_tensors * sizeof(span));
	if (!spans)
		return g4_fail(err, G4_ERR_NOMEM, "%s: out of memory", g->path);
	for (i = 0; i < n_tensors; i++)
	{
		g4_gguf_tensor *t = &g->tensors[i];
		const ggml_type_info *ti;
		char		what[192];
		uint32_t	nd,
					type;
		uint64_t	off,
					nel = 1,
					rows,
					row_bytes;
		uint32_t	d;

		snprintf(what, sizeof(what), "tensor info %llu", (unsigned long long) i);
		c.what = what;
		if ((rc = rd_str(&c, &t->name, NULL)))
			goto done;
		snprintf(what, sizeof(what), "tensor info of '%.150s'", t->name);
		if ((rc = rd_u32(&c, &nd)))
			goto done;
		if (nd == 0 || nd > GGUF_MAX_DIMS)
		{
			rc = g4_fail(err, G4_ERR_FORMAT, "%s: tensor '%s' has %u dimensions (1 to %d allowed)",
						 g->path, t->name, nd, GGUF_MAX_DIMS);
			goto done;
		}
		t->ndim = (int) nd;
		for (d = 0; d < GGUF_MAX_DIMS; d++)
			t->ne[d] = 1;
		for (d = 0; d < nd; d++)
		{
			uint64_t	ne;

			if ((rc = rd_u64(&c, &ne)))
				goto done;
			if (ne > (uint64_t) INT64_MAX || (ne != 0 && nel > (uint64_t) INT64_MAX / ne))
			{
				rc = g4_fail(err, G4_ERR_FORMAT,
							 "%s: tensor '%s' has an impossible size (dimension %u is %llu)",
							 g->path, t->name, d, (unsigned long long) ne);
				goto done;
			}
			t->ne[d] = (int64_t) ne;
			nel *= ne;
		}
		if ((rc = rd_u32(&c, &type)) || (rc = rd_u64(&c, &off)))
			goto done;
		t->ggml_type = (int) type;
		ti = ggml_info(type);
		if (!ti)
		{
			rc = g4_fail(err, G4_ERR_UNSUPPORTED, "%s: tensor '%s' has unsupported ggml type %u (%s)",
						 g->path, t->name, type, g4_ggml_type_name((int) type));
			goto done;
		}
		if (t->ne[0] % ti->block != 0)
		{
			rc = g4_fail(err, G4_ERR_FORMAT,
						 "%s: tensor '%s' of type %s has %lld columns, not a multiple of the block size %d",
						 g->path, t->name, ti->name, (long long) t->ne[0], ti->block);
			goto done;
		}
		rows = t->ne[0] ? nel / (uint64_t) t->ne[0] : 0;
		row_bytes = (uint64_t) (t->ne[0] / ti->block) * (uint64_t) ti->bytes;
		if (row_bytes != 0 && rows > (uint64_t) (SIZE_MAX / 2) / row_bytes)
		{
			rc = g4_fail(err, G4_ERR_FORMAT, "%s: tensor '%s' is too large", g->path, t->name);
			goto done;
		}
		t->nbytes = (size_t) (row_bytes * rows);
		if (off % g->alignment != 0)
		{
			rc = g4_fail(err, G4_ERR_FORMAT,
						 "%s: tensor '%s' has offset %llu, not a multiple of the alignment %zu",
						 g->path, t->name, (unsigned long long) off, g->alignment);
			goto done;
		}
		if (off > (uint64_t) (SIZE_MAX / 2))
		{
			rc = g4_fail(err, G4_ERR_FORMAT, "%s: tensor '%s' has offset %llu, past any file",
						 g->path, t->name, (unsigned long long) off);
			goto done;
		}
		spans[i].off = off;
		spans[i].end = off + t->nbytes;	/* both < SIZE_MAX/2: no overflow */
		spans[i].idx = (size_t) i;
		g->n_tensors++;
	}

	/* data section: starts at the next multiple of the alignment */
	g->data_offset = c.pos;
	if (g->data_offset % g->alignment)
		g->data_offset += g->alignment - g->data_offset % g->alignment;
	for (i = 0; i < n_tensors; i++)
	{
		g4_gguf_tensor *t = &g->tensors[i];
		size_t		avail = g->data_offset <= c.size ? c.size - g->data_offset : 0;

		if (spans[i].end > avail)
		{
			rc = g4_fail(err, G4_ERR_IO,
						 "%s: truncated: tensor '%s' (%s, %zu bytes) needs file bytes %llu..%llu, the file has %zu",
						 g->path, t->name, g4_ggml_type_name(t->ggml_type), t->nbytes,
						 (unsigned long long) (g->data_offset + spans[i].off),
						 (unsigned long long) (g->data_offset + spans[i].end), c.size);
			goto done;
		}
		t->data = (const uint8_t *) g->map.data + g->data_offset + spans[i].off;
	}

	/* no two non-empty tensors may share bytes */
	if (n_tensors > 1)
	{
		uint64_t	max_end = 0;
		size_t		max_idx = 0;

		qsort(spans, (size_t) n_tensors, sizeof(span), cmp_span);
		for (i = 0; i < n_tensors; i++)
		{
			if (spans[i].end == spans[i].off)
				continue;
			if (spans[i].off < max_end)
			{
				const g4_gguf_tensor *a = &g->tensors[max_idx];
				const g4_gguf_tensor *b = &g->tensors[spans[i].idx];

				rc = g4_fail(err, G4_ERR_FORMAT,
							 "%s: tensors '%s' (data bytes %llu..%llu) and '%s' (data bytes %llu..%llu) overlap",
							 g->path, a->name,
							 (unsigned long long) ((const uint8_t *) a->data - (const uint8_t *) g->map.data - g->data_offset),
							 (unsigned long long) max_end, b->name,
							 (unsigned long long) spans[i].off, (unsigned long long) spans[i].end);
				goto done;
			}
			max_end = spans[i].end;
			max_idx = spans[i].idx;
		}
	}

	/* name indexes */
	names = g4_malloc((size_t) G4_MAX(n_kv, n_tensors) * sizeof(char *));
	if (!names)
	{
		rc = g4_fail(err, G4_ERR_NOMEM, "%s: out of memory", g->path);
		goto done;
	}
	for (i = 0; i < n_kv; i++)
		names[i] = g->kv[i].key;
	rc = build_hash(names, (size_t) n_kv, &g->kv_hash, &g->kv_hash_cap, &dup);
	if (rc == G4_ERR_FORMAT)
		g4_fail(err, rc, "%s: duplicate metadata key '%s'", g->path, names[dup]);
	if (rc == G4_OK)
	{
		for (i = 0; i < n_tensors; i++)
			names[i] = g->tensors[i].name;
		rc = build_hash(names, (size_t) n_tensors, &g->t_hash, &g->t_hash_cap, &dup);
		if (rc == G4_ERR_FORMAT)
			g4_fail(err, rc, "%s: duplicate tensor name '%s'", g->path, names[dup]);
	}
	if (rc == G4_ERR_NOMEM)
		g4_fail(err, rc, "%s: out of memory", g->path);
done:
	free(names);
	free(spans);
	return rc;
}

int
g4_gguf_open(const char *path, g4_gguf **out, g4_err *err)
{
	g4_gguf    *g;
	int			rc;

	*out = NULL;
	g = g4_calloc(1, sizeof(g4_gguf));
	if (!g)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory opening %s", path);
	g->path = g4_strdup(path);
	if (!g->path)
	{
		free(g);
		return g4_fail(err, G4_ERR_NOMEM, "out of memory opening %s", path);
	}
	if (!g4_is_file(path))
	{
		rc = g4_is_dir(path)
			? g4_fail(err, G4_ERR_IO, "%s is a directory, not a GGUF file", path)
			: g4_fail(err, G4_ERR_IO, "GGUF file not found: %s", path);
		g4_gguf_close(g);
		return rc;
	}
	if ((rc = g4_mmap_open(path, &g->map, err)) != G4_OK ||
		(rc = parse(g, err)) != G4_OK)
	{
		g4_gguf_close(g);
		return rc;
	}
	*out = g;
	return G4_OK;
}

void
g4_gguf_close(g4_gguf *g)
{
	if (!g)
		return;
	g4_mmap_close(&g->map);
	arena_free(&g->mem);
	free(g->kv);
	free(g->tensors);
	free(g->kv_hash);
	free(g->t_hash);
	free(g->path);
	free(g);
}

uint32_t
g4_gguf_version(const g4_gguf *g)
{
	return g->version;
}

size_t
g4_gguf_kv_count(const g4_gguf *g)
{
	return g->n_kv;
}

const g4_gguf_kv *
g4_gguf_kv_at(const g4_gguf *g, size_t i)
{
	return i < g->n_kv ? &g->kv[i] : NULL;
}

static size_t
lookup(const size_t *tab, size_t cap, const char *name, const char *(*name_of) (const g4_gguf *, size_t),
	   const g4_gguf *g)
{
	size_t		h;

	if (!tab || !name)
		return 0;
	h = (size_t) hash_str(name) & (cap - 1);
	while (tab[h])
	{
		if (strcmp(name_of(g, tab[h] - 1), name) == 0)
			return tab[h];
		h = (h + 1) & (cap - 1);
	}
	return 0;
}

static const char *
kv_name(const g4_gguf *g, size_t i)
{
	return g->kv[i].key;
}

static const char *
tensor_name(const g4_gguf *g, size_t i)
{
	return g->tensors[i].name;
}

const g4_gguf_kv *
g4_gguf_get(const g4_gguf *g, const char *key)
{
	size_t		i = lookup(g->kv_hash, g->kv_hash_cap, key, kv_name, g);

	return i ? &g->kv[i - 1] : NULL;
}

int64_t
g4_gguf_get_int(const g4_gguf *g, const char *key, int64_t dflt)
{
	const g4_gguf_kv *kv = g4_gguf_get(g, key);

	if (!kv)
		return dflt;
	switch (kv->type)
	{
		case G4_GGUF_U8:
		case G4_GGUF_U16:
		case G4_GGUF_U32:
		case G4_GGUF_U64:
		case G4_GGUF_BOOL:
			return kv->v.u <= (uint64_t) INT64_MAX ? (int64_t) kv->v.u : dflt;
		case G4_GGUF_I8:
		case G4_GGUF_I16:
		case G4_GGUF_I32:
		case G4_GGUF_I64:
			return kv->v.i;
		case G4_GGUF_F32:
		case G4_GGUF_F64:
			/* truncation toward zero, only where the value fits */
			if (isfinite(kv->v.f) && kv->v.f > -9.2e18 && kv->v.f < 9.2e18)
				return (int64_t) kv->v.f;
			return dflt;
	}
	return dflt;
}

double
g4_gguf_get_float(const g4_gguf *g, const char *key, double dflt)
{
	const g4_gguf_kv *kv = g4_gguf_get(g, key);

	if (!kv)
		return dflt;
	switch (kv->type)
	{
		case G4_GGUF_U8:
		case G4_GGUF_U16:
		case G4_GGUF_U32:
		case G4_GGUF_U64:
		case G4_GGUF_BOOL:
			return (double) kv->v.u;
		case G4_GGUF_I8:
		case G4_GGUF_I16:
		case G4_GGUF_I32:
		case G4_GGUF_I64:
			return (double) kv->v.i;
		case G4_GGUF_F32:
		case G4_GGUF_F64:
			return kv->v.f;
	}
	return dflt;
}

const char *
g4_gguf_get_str(const g4_gguf *g, const char *key)
{
	const g4_gguf_kv *kv = g4_gguf_get(g, key);

	return kv && kv->type == G4_GGUF_STRING ? kv->str : NULL;
}

size_t
g4_gguf_tensor_count(const g4_gguf *g)
{
	return g->n_tensors;
}

const g4_gguf_tensor *
g4_gguf_tensor_at(const g4_gguf *g, size_t i)
{
	return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const g4_gguf_tensor *
g4_gguf_find(const g4_gguf *g, const char *name)
{
	size_t		i = lookup(g->t_hash, g->t_hash_cap, name, tensor_name, g);

	return i ? &g->tensors[i - 1] : NULL;
}
