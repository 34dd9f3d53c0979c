/*
 * json.h — a small, fast JSON reader (RFC 8259) producing an immutable tree.
 *
 * Built for the files a model ships with: config.json, tokenizer.json (tens of
 * megabytes, hundreds of thousands of strings), safetensors headers.  All
 * nodes and decoded strings live in one arena freed with g4j_free().
 * Strings are decoded UTF-8 with an explicit length (they may contain NUL).
 */
#ifndef G4_JSON_H
#define G4_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"

typedef enum
{
	G4J_NULL = 0,
	G4J_BOOL,
	G4J_NUMBER,
	G4J_STRING,
	G4J_ARRAY,
	G4J_OBJECT
} g4j_type;

typedef struct g4j g4j;
typedef struct g4j_doc g4j_doc;

struct g4j
{
	uint8_t		type;			/* g4j_type */
	uint8_t		boolean;
	uint8_t		is_integer;		/* number written without fraction/exponent */
	uint32_t	n;				/* string length, array/object element count */
	union
	{
		double		number;
		const char *str;		/* G4J_STRING: NUL-terminated, n bytes */
		g4j		   *items;		/* G4J_ARRAY: n nodes; G4J_OBJECT: 2n nodes, key then value */
	}			u;
	int64_t		integer;		/* exact value when is_integer */
};

/* Parse text (need not be NUL-terminated).  On error returns NULL and
 * describes the problem with its line and column. */
g4j_doc    *g4j_parse(const char *text, size_t len, g4_err *err);
void		g4j_free(g4j_doc *doc);
const g4j  *g4j_root(const g4j_doc *doc);

/* Accessors; all accept NULL and wrong types, returning NULL / defaults. */
const g4j  *g4j_get(const g4j *obj, const char *key);	/* object member */
const g4j  *g4j_at(const g4j *arr, size_t i);	/* array element */
const g4j  *g4j_key_at(const g4j *obj, size_t i);	/* object key i (a string) */
const g4j  *g4j_value_at(const g4j *obj, size_t i);
size_t		g4j_len(const g4j *v);	/* elements of array/object, 0 otherwise */
const char *g4j_str(const g4j *v);	/* NULL unless string */
int			g4j_is(const g4j *v, int type);
double		g4j_num(const g4j *v, double dflt);
int64_t		g4j_int(const g4j *v, int64_t dflt);
int			g4j_bool(const g4j *v, int dflt);

/* Convenience: object member as string / number / int / bool. */
const char *g4j_get_str(const g4j *obj, const char *key);
double		g4j_get_num(const g4j *obj, const char *key, double dflt);
int64_t		g4j_get_int(const g4j *obj, const char *key, int64_t dflt);
int			g4j_get_bool(const g4j *obj, const char *key, int dflt);

#endif
