/*
 * gguf.h — read-only access to GGUF (version 2 and 3) model files.
 *
 * The file is mapped; metadata values are decoded into a table, tensor data
 * points into the mapping (aligned to general.alignment, default 32).
 * Every tensor's byte range is checked against the file size.
 */
#ifndef G4_GGUF_H
#define G4_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"

/* Metadata value types, as numbered in the file format. */
typedef enum
{
	G4_GGUF_U8 = 0,
	G4_GGUF_I8 = 1,
	G4_GGUF_U16 = 2,
	G4_GGUF_I16 = 3,
	G4_GGUF_U32 = 4,
	G4_GGUF_I32 = 5,
	G4_GGUF_F32 = 6,
	G4_GGUF_BOOL = 7,
	G4_GGUF_STRING = 8,
	G4_GGUF_ARRAY = 9,
	G4_GGUF_U64 = 10,
	G4_GGUF_I64 = 11,
	G4_GGUF_F64 = 12
} g4_gguf_type;

typedef struct
{
	const char *key;
	int			type;			/* g4_gguf_type */
	/* scalars */
	union
	{
		uint64_t	u;			/* unsigned types and bool */
		int64_t		i;			/* signed types */
		double		f;			/* F32 / F64 */
	}			v;
	/* G4_GGUF_STRING */
	const char *str;			/* NUL-terminated copy */
	size_t		str_len;
	/* G4_GGUF_ARRAY */
	int			arr_type;		/* element type */
	uint64_t	arr_len;
	/* numeric arrays: packed little-endian elements in the mapping, possibly
	 * unaligned (read with memcpy); arrays of arrays: arr_len g4_gguf_kv
	 * entries with a NULL key; string arrays: NULL */
	const void *arr_data;
	const char **arr_strs;		/* string arrays: NUL-terminated copies */
	const size_t *arr_str_lens;
} g4_gguf_kv;

/* ggml tensor types, as numbered in the file format (only those we name). */
enum
{
	G4_GGML_F32 = 0,
	G4_GGML_F16 = 1,
	G4_GGML_Q4_0 = 2,
	G4_GGML_Q4_1 = 3,
	G4_GGML_Q5_0 = 6,
	G4_GGML_Q5_1 = 7,
	G4_GGML_Q8_0 = 8,
	G4_GGML_Q8_1 = 9,
	G4_GGML_Q2_K = 10,
	G4_GGML_Q3_K = 11,
	G4_GGML_Q4_K = 12,
	G4_GGML_Q5_K = 13,
	G4_GGML_Q6_K = 14,
	G4_GGML_Q8_K = 15,
	G4_GGML_BF16 = 30
};

/* Name of a ggml type ("Q4_K", "IQ4_XS"), "type N" for unnamed values below
 * 64, "unknown type" otherwise. */
const char *g4_ggml_type_name(int ggml_type);

typedef struct
{
	const char *name;
	int			ggml_type;
	int			ndim;
	int64_t		ne[4];			/* ggml order: ne[0] is the contiguous (input) dim */
	const void *data;
	size_t		nbytes;
} g4_gguf_tensor;

typedef struct g4_gguf g4_gguf;

int			g4_gguf_open(const char *path, g4_gguf **out, g4_err *err);
void		g4_gguf_close(g4_gguf *g);

uint32_t	g4_gguf_version(const g4_gguf *g);
size_t		g4_gguf_kv_count(const g4_gguf *g);
const g4_gguf_kv *g4_gguf_kv_at(const g4_gguf *g, size_t i);
const g4_gguf_kv *g4_gguf_get(const g4_gguf *g, const char *key);

/* Typed getters with defaults; numeric ones accept any integer/float type. */
int64_t		g4_gguf_get_int(const g4_gguf *g, const char *key, int64_t dflt);
double		g4_gguf_get_float(const g4_gguf *g, const char *key, double dflt);
const char *g4_gguf_get_str(const g4_gguf *g, const char *key);	/* NULL if absent */

size_t		g4_gguf_tensor_count(const g4_gguf *g);
const g4_gguf_tensor *g4_gguf_tensor_at(const g4_gguf *g, size_t i);
const g4_gguf_tensor *g4_gguf_find(const g4_gguf *g, const char *name);

/* The engine weight format (g4_wfmt) for a ggml type, or -1 when the engine
 * cannot use it. */
int			g4_gguf_wfmt(int ggml_type);

#endif
