/*
 * json.c — recursive-descent JSON reader into an arena-allocated tree.
 *
 * Arrays and objects are parsed into a temporary stack of nodes and copied
 * into the arena once their size is known, so every container's children are
 * contiguous (O(1) indexing) and there is no per-node malloc.
 */
#include "json.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define ARENA_CHUNK (1u << 20)
#define MAX_DEPTH 512

typedef struct arena_block
{
	struct arena_block *next;
	size_t		used;
	size_t		size;
	/* data follows, aligned */
	max_align_t data[];
} arena_block;

struct g4j_doc
{
	arena_block *blocks;
	g4j			root;
};

typedef struct
{
	const char *p;
	const char *end;
	const char *start;
	g4j_doc    *doc;
	g4_err	   *err;
	/* node stack for containers under construction */
	g4j		   *stack;
	size_t		stack_len;
	size_t		stack_cap;
	int			depth;
	int			failed;
} parser;

static void *
arena_alloc(g4j_doc *doc, size_t n)
{
	arena_block *b = doc->blocks;

	n = (n + 15) & ~(size_t) 15;
	if (!b || b->used + n > b->size)
	{
		size_t		size = n > ARENA_CHUNK ? n : ARENA_CHUNK;

		b = malloc(sizeof(arena_block) + size);
		if (!b)
			return NULL;
		b->size = size;
		b->used = 0;
		b->next = doc->blocks;
		doc->blocks = b;
	}
	{
		void	   *r = (char *) b->data + b->used;

		b->used += n;
		return r;
	}
}

static void
position(const parser *ps, int *line, int *col)
{
	const char *q;

	*line = 1;
	*col = 1;
	for (q = ps->start; q < ps->p; q++)
	{
		if (*q == '\n')
		{
			(*line)++;
			*col = 1;
		}
		else
			(*col)++;
	}
}

static int
fail(parser *ps, const char *what)
{
	if (!ps->failed)
	{
		int			line,
					col;

		position(ps, &line, &col);
		g4_fail(ps->err, G4_ERR_FORMAT, "invalid JSON at line %d column %d: %s", line, col, what);
		ps->failed = 1;
	}
	return -1;
}

static int
nomem(parser *ps)
{
	if (!ps->failed)
	{
		g4_fail(ps->err, G4_ERR_NOMEM, "out of memory parsing JSON");
		ps->failed = 1;
	}
	return -1;
}

static void
skip_ws(parser *ps)
{
	while (ps->p < ps->end)
	{
		char		c = *ps->p;

		if (c == ' ' || c == '\n' || c == '\r' || c == '\t')
			ps->p++;
		else
			break;
	}
}

static int
push(parser *ps, const g4j *v)
{
	if (ps->stack_len == ps->stack_cap)
	{
		size_t		cap = ps->stack_cap ? ps->stack_cap * 2 : 1024;
		g4j		   *s = realloc(ps->stack, cap * sizeof(g4j));

		if (!s)
			return nomem(ps);
		ps->stack = s;
		ps->stack_cap = cap;
	}
	ps->stack[ps->stack_len++] = *v;
	return 0;
}

static int
hex4(const char *p, unsigned *out)
{
	unsigned	v = 0;
	int			i;

	for (i = 0; i < 4; i++)
	{
		char		c = p[i];

		v <<= 4;
		if (c >= '0' && c <= '9')
			v |= (unsigned) (c - '0');
		else if (c >= 'a' && c <= 'f')
			v |= (unsigned) (c - 'a' + 10);
		else if (c >= 'A' && c <= 'F')
			v |= (unsigned) (c - 'A' + 10);
		else
			return -1;
	}
	*out = v;
	return 0;
}

static size_t
put_utf8(char *o, unsigned cp)
{
	if (cp < 0x80)
	{
		o[0] = (char) cp;
		return 1;
	}
	if (cp < 0x800)
	{
		o[0] = (char) (0xc0 | (cp >> 6));
		o[1] = (char) (0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000)
	{
		o[0] = (char) (0xe0 | (cp >> 12));
		o[1] = (char) (0x80 | ((cp >> 6) & 0x3f));
		o[2] = (char) (0x80 | (cp & 0x3f));
		return 3;
	}
	o[0] = (char) (0xf0 | (cp >> 18));
	o[1] = (char) (0x80 | ((cp >> 12) & 0x3f));
	o[2] = (char) (0x80 | ((cp >> 6) & 0x3f));
	o[3] = (char) (0x80 | (cp & 0x3f));
	return 4;
}

/* Parse a string starting at the opening quote. */
static int
parse_string(parser *ps, g4j *out)
{
	const char *s = ++ps->p;
	const char *q = s;
	int			has_escape = 0;
	char	   *buf;
	size_t		n = 0;

	/* find the closing quote, noting escapes */
	while (q < ps->end && *q != '"')
	{
		if ((unsigned char) *q < 0x20)
		{
			ps->p = q;
			return fail(ps, "control character in string");
		}
		if (*q == '\\')
		{
			has_escape = 1;
			q++;
		}
		q++;
	}
	if (q >= ps->end)
	{
		ps->p = q;
		return fail(ps, "unterminated string");
	}
	buf = arena_alloc(ps->doc, (size_t) (q - s) + 1);
	if (!buf)
		return nomem(ps);
	if (!has_escape)
	{
		memcpy(buf, s, (size_t) (q - s));
		n = (size_t) (q - s);
	}
	else
	{
		const char *r = s;

		while (r < q)
		{
			if (*r != '\\')
			{
				buf[n++] = *r++;
				continue;
			}
			r++;
			switch (*r)
			{
				case '"':
					buf[n++] = '"';
					break;
				case '\\':
					buf[n++] = '\\';
					break;
				case '/':
					buf[n++] = '/';
					break;
				case 'b':
					buf[n++] = '\b';
					break;
				case 'f':
					buf[n++] = '\f';
					break;
				case 'n':
					buf[n++] = '\n';
					break;
				case 'r':
					buf[n++] = '\r';
					break;
				case 't':
					buf[n++] = '\t';
					break;
				case 'u':
					{
						unsigned	cp;

						if (q - r < 5 || hex4(r + 1, &cp) != 0)
						{
							ps->p = r;
							return fail(ps, "bad \\u escape");
						}
						r += 4;
						if (cp >= 0xd800 && cp <= 0xdbff && q - r >= 7 && r[1] == '\\' && r[2] == 'u')
						{
							unsigned	lo;

							if (hex4(r + 3, &lo) == 0 && lo >= 0xdc00 && lo <= 0xdfff)
							{
								cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
								r += 6;
							}
						}
						/* a lone surrogate becomes U+FFFD, as most decoders do */
						if (cp >= 0xd800 && cp <= 0xdfff)
							cp = 0xfffd;
						n += put_utf8(buf + n, cp);
						break;
					}
				default:
					ps->p = r;
					return fail(ps, "bad escape");
			}
			r++;
		}
	}
	buf[n] = '\0';
	out->type = G4J_STRING;
	out->u.str = buf;
	out->n = (uint32_t) n;
	ps->p = q + 1;
	return 0;
}

/* A number as int64, truncated toward zero and saturated at the type's
 * ends (NaN: 0); a plain cast is undefined past them. */
static int64_t
json_to_int64(double x)
{
	if (x != x)
		return 0;
	if (x >= 9223372036854775807.0)
		return INT64_MAX;
	if (x <= -9223372036854775808.0)
		return INT64_MIN;
	return (int64_t) x;
}

static int
parse_number(parser *ps, g4j *out)
{
	const char *s = ps->p;
	const char *q = s;
	int			integer = 1;
	char		tmp[64];
	size_t		len;

	if (q < ps->end && *q == '-')
		q++;
	if (q >= ps->end || !(*q >= '0' && *q <= '9'))
		return fail(ps, "bad number");
	while (q < ps->end && *q >= '0' && *q <= '9')
		q++;
	if (q < ps->end && *q == '.')
	{
		integer = 0;
		q++;
		if (q >= ps->end || !(*q >= '0' && *q <= '9'))
			return fail(ps, "bad number");
		while (q < ps->end && *q >= '0' && *q <= '9')
			q++;
	}
	if (q < ps->end && (*q == 'e' || *q == 'E'))
	{
		integer = 0;
		q++;
		if (q < ps->end && (*q == '+' || *q == '-'))
			q++;
		if (q >= ps->end || !(*q >= '0' && *q <= '9'))
			return fail(ps, "bad number");
		while (q < ps->end && *q >= '0' && *q <= '9')
			q++;
	}
	len = (size_t) (q - s);
	if (len >= sizeof(tmp))
		return fail(ps, "number too long");
	memcpy(tmp, s, len);
	tmp[len] = '\0';
	out->type = G4J_NUMBER;
	out->u.number = strtod(tmp, NULL);
	if (integer)
	{
		/* an integer past int64 is a number like one with a fraction */
		errno = 0;
		out->integer = strtoll(tmp, NULL, 10);
		integer = errno != ERANGE;
	}
	out->is_integer = (uint8_t) integer;
	if (!integer)
		out->integer = json_to_int64(out->u.number);
	ps->p = q;
	return 0;
}

static int	parse_value(parser *ps, g4j *out);

static int
finish_container(parser *ps, size_t base, g4j *out, int type)
{
	size_t		count = ps->stack_len - base;
	g4j		   *items = NULL;

	if (count)
	{
		items = arena_alloc(ps->doc, count * sizeof(g4j));
		if (!items)
			return nomem(ps);
		memcpy(items, ps->stack + base, count * sizeof(g4j));
	}
	ps->stack_len = base;
	out->type = (uint8_t) type;
	out->u.items = items;
	out->n = (uint32_t) (type == G4J_OBJECT ? count / 2 : count);
	return 0;
}

static int
parse_array(parser *ps, g4j *out)
{
	size_t		base = ps->stack_len;

	ps->p++;
	skip_ws(ps);
	if (ps->p < ps->end && *ps->p == ']')
	{
		ps->p++;
		return finish_container(ps, base, out, G4J_ARRAY);
	}
	for (;;)
	{
		g4j			v;

		memset(&v, 0, sizeof(v));
		if (parse_value(ps, &v) != 0 || push(ps, &v) != 0)
			return -1;
		skip_ws(ps);
		if (ps->p >= ps->end)
			return fail(ps, "unterminated array");
		if (*ps->p == ',')
		{
			ps->p++;
			continue;
		}
		if (*ps->p == ']')
		{
			ps->p++;
			return finish_container(ps, base, out, G4J_ARRAY);
		}
		return fail(ps, "expected ',' or ']'");
	}
}

static int
parse_object(parser *ps, g4j *out)
{
	size_t		base = ps->stack_len;

	ps->p++;
	skip_ws(ps);
	if (ps->p < ps->end && *ps->p == '}')
	{
		ps->p++;
		return finish_container(ps, base, out, G4J_OBJECT);
	}
	for (;;)
	{
		g4j			k,
					v;

		memset(&k, 0, sizeof(k));
		memset(&v, 0, sizeof(v));
		skip_ws(ps);
		if (ps->p >= ps->end || *ps->p != '"')
			return fail(ps, "expected a string key");
		if (parse_string(ps, &k) != 0)
			return -1;
		skip_ws(ps);
		if (ps->p >= ps->end || *ps->p != ':')
			return fail(ps, "expected ':'");
		ps->p++;
		if (parse_value(ps, &v) != 0 || push(ps, &k) != 0 || push(ps, &v) != 0)
			return -1;
		skip_ws(ps);
		if (ps->p >= ps->end)
			return fail(ps, "unterminated object");
		if (*ps->p == ',')
		{
			ps->p++;
			continue;
		}
		if (*ps->p == '}')
		{
			ps->p++;
			return finish_container(ps, base, out, G4J_OBJECT);
		}
		return fail(ps, "expected ',' or '}'");
	}
}

static int
match_word(parser *ps, const char *w)
{
	size_t		n = strlen(w);

	if ((size_t) (ps->end - ps->p) < n || memcmp(ps->p, w, n) != 0)
		return fail(ps, "unexpected token");
	ps->p += n;
	return 0;
}

static int
parse_value(parser *ps, g4j *out)
{
	int			rc;

	skip_ws(ps);
	if (ps->p >= ps->end)
		return fail(ps, "unexpected end of input");
	if (++ps->depth > MAX_DEPTH)
		return fail(ps, "nesting too deep");
	switch (*ps->p)
	{
		case '{':
			rc = parse_object(ps, out);
			break;
		case '[':
			rc = parse_array(ps, out);
			break;
		case '"':
			rc = parse_string(ps, out);
			break;
		case 't':
			out->type = G4J_BOOL;
			out->boolean = 1;
			rc = match_word(ps, "true");
			break;
		case 'f':
			out->type = G4J_BOOL;
			out->boolean = 0;
			rc = match_word(ps, "false");
			break;
		case 'n':
			out->type = G4J_NULL;
			rc = match_word(ps, "null");
			break;
		default:
			rc = parse_number(ps, out);
			break;
	}
	ps->depth--;
	return rc;
}

g4j_doc *
g4j_parse(const char *text, size_t len, g4_err *err)
{
	parser		ps;
	g4j_doc    *doc = calloc(1, sizeof(g4j_doc));

	if (!doc)
	{
		g4_fail(err, G4_ERR_NOMEM, "out of memory parsing JSON");
		return NULL;
	}
	memset(&ps, 0, sizeof(ps));
	ps.p = ps.start = text;
	ps.end = text + len;
	ps.doc = doc;
	ps.err = err;
	/* skip a UTF-8 byte order mark */
	if (len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0)
		ps.p += 3;
	if (parse_value(&ps, &doc->root) == 0)
	{
		skip_ws(&ps);
		if (ps.p != ps.end)
			fail(&ps, "trailing characters after the value");
	}
	free(ps.stack);
	if (ps.failed)
	{
		g4j_free(doc);
		return NULL;
	}
	return doc;
}

void
g4j_free(g4j_doc *doc)
{
	arena_block *b;

	if (!doc)
		return;
	b = doc->blocks;
	while (b)
	{
		arena_block *n = b->next;

		free(b);
		b = n;
	}
	free(doc);
}

const g4j *
g4j_root(const g4j_doc *doc)
{
	return doc ? &doc->root : NULL;
}

const g4j *
g4j_get(const g4j *obj, const char *key)
{
	size_t		i;
	size_t		klen;

	if (!obj || obj->type != G4J_OBJECT)
		return NULL;
	klen = strlen(key);
	/* last duplicate wins, as in most readers */
	for (i = obj->n; i-- > 0;)
	{
		const g4j  *k = &obj->u.items[2 * i];

		if (k->n == klen && memcmp(k->u.str, key, klen) == 0)
			return &obj->u.items[2 * i + 1];
	}
	return NULL;
}

const g4j *
g4j_at(const g4j *arr, size_t i)
{
	if (!arr || arr->type != G4J_ARRAY || i >= arr->n)
		return NULL;
	return &arr->u.items[i];
}

const g4j *
g4j_key_at(const g4j *obj, size_t i)
{
	if (!obj || obj->type != G4J_OBJECT || i >= obj->n)
		return NULL;
	return &obj->u.items[2 * i];
}

const g4j *
g4j_value_at(const g4j *obj, size_t i)
{
	if (!obj || obj->type != G4J_OBJECT || i >= obj->n)
		return NULL;
	return &obj->u.items[2 * i + 1];
}

size_t
g4j_len(const g4j *v)
{
	if (!v || (v->type != G4J_ARRAY && v->type != G4J_OBJECT))
		return 0;
	return v->n;
}

const char *
g4j_str(const g4j *v)
{
	return v && v->type == G4J_STRING ? v->u.str : NULL;
}

int
g4j_is(const g4j *v, int type)
{
	return v && v->type == type;
}

double
g4j_num(const g4j *v, double dflt)
{
	return v && v->type == G4J_NUMBER ? v->u.number : dflt;
}

int64_t
g4j_int(const g4j *v, int64_t dflt)
{
	if (!v || v->type != G4J_NUMBER)
		return dflt;
	return v->is_integer ? v->integer : json_to_int64(v->u.number);
}

int
g4j_bool(const g4j *v, int dflt)
{
	return v && v->type == G4J_BOOL ? v->boolean : dflt;
}

const char *
g4j_get_str(const g4j *obj, const char *key)
{
	return g4j_str(g4j_get(obj, key));
}

double
g4j_get_num(const g4j *obj, const char *key, double dflt)
{
	return g4j_num(g4j_get(obj, key), dflt);
}

int64_t
g4j_get_int(const g4j *obj, const char *key, int64_t dflt)
{
	return g4j_int(g4j_get(obj, key), dflt);
}

int
g4j_get_bool(const g4j *obj, const char *key, int dflt)
{
	return g4j_bool(g4j_get(obj, key), dflt);
}
