/*
 * safetensors.h — read-only access to safetensors checkpoints.
 *
 * Opens either one file or a model directory holding model.safetensors or a
 * sharded set described by model.safetensors.index.json.  Files are mapped,
 * never read whole; tensors point into the mappings.  Every tensor's byte
 * range is validated against its shape and dtype and against the file size
 * (a truncated file is an error naming the tensor and the file).
 */
#ifndef G4_SAFETENSORS_H
#define G4_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"

typedef enum
{
	G4_DT_F64 = 0,
	G4_DT_F32,
	G4_DT_F16,
	G4_DT_BF16,
	G4_DT_I64,
	G4_DT_I32,
	G4_DT_I16,
	G4_DT_I8,
	G4_DT_U8,
	G4_DT_BOOL,
	G4_DT_F8_E4M3,
	G4_DT_F8_E5M2,
	G4_DT_COUNT
} g4_dtype;

const char *g4_dtype_name(int dtype);	/* safetensors spelling: "BF16" ... */
size_t		g4_dtype_size(int dtype);

#define G4_MAX_DIMS 8

typedef struct
{
	const char *name;
	int			dtype;			/* g4_dtype */
	int			ndim;
	int64_t		shape[G4_MAX_DIMS];
	int64_t		numel;
	const void *data;			/* inside a read-only mapping */
	size_t		nbytes;
	const char *file;			/* file it came from (for messages) */
} g4_st_tensor;

typedef struct g4_safetensors g4_safetensors;

/* path: a .safetensors file, or a directory with model.safetensors or
 * model.safetensors.index.json (+ shards). */
int			g4_st_open(const char *path, g4_safetensors **out, g4_err *err);
void		g4_st_close(g4_safetensors *st);

/* Lookup by exact name (hash table); NULL when absent. */
const g4_st_tensor *g4_st_find(const g4_safetensors *st, const char *name);
size_t		g4_st_count(const g4_safetensors *st);
const g4_st_tensor *g4_st_at(const g4_safetensors *st, size_t i);

/* Checked lookup: the tensor must exist, have this dtype (or any when
 * dtype < 0) and, when shape is non-NULL, exactly this shape.  Errors name
 * the tensor and give expected vs found. */
int			g4_st_expect(const g4_safetensors *st, const char *name, int dtype,
						 int ndim, const int64_t *shape, const g4_st_tensor **out,
						 g4_err *err);

/* Total bytes of tensor data (all files). */
size_t		g4_st_data_bytes(const g4_safetensors *st);

#endif
