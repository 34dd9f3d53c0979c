/*
 * util.h — small helpers shared by the whole engine: error reporting,
 * checked allocation, monotonic time (bf16/f16 conversions: halfconv.h).
 */
#ifndef G4_UTIL_H
#define G4_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "halfconv.h"
#include "engine.h"

/* Set err (if non-NULL) and return code.  Always returns code so callers can
 * write `return g4_fail(err, G4_ERR_IO, "...", ...)`. */
int g4_fail(g4_err *err, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Prefix an existing error message with context ("loading X: <old msg>"). */
int g4_fail_ctx(g4_err *err, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Checked allocation: NULL only when the system is out of memory; callers
 * must still test the result and report G4_ERR_NOMEM. */
void *g4_malloc(size_t n);
void *g4_calloc(size_t n, size_t size);
void *g4_realloc(void *p, size_t n);
char *g4_strdup(const char *s);
char *g4_strndup(const char *s, size_t n);

/* Growable byte buffer (used for text building). */
typedef struct {
	char	   *data;
	size_t		len;
	size_t		cap;
} g4_buf;

int			g4_buf_reserve(g4_buf *b, size_t extra);
int			g4_buf_append(g4_buf *b, const void *p, size_t n);
int			g4_buf_puts(g4_buf *b, const char *s);
void		g4_buf_free(g4_buf *b);


/* The unsigned little-endian integer of n <= 8 bytes at b (any alignment). */
uint64_t	g4_load_le(const uint8_t *b, size_t n);

/* Monotonic clock in seconds. */
double		g4_now(void);

/* Progress reports of a long call (g4_options.progress): g4_progress_start
 * when the call begins, g4_progress_tick between its units of work, both on
 * the calling thread.  A tick reads the clock once and calls fn when
 * G4_PROGRESS_INTERVAL has passed since the start or the last report. */
typedef struct g4_progress
{
	g4_progress_fn fn;			/* NULL: nobody listens */
	void	   *ctx;
	double		last;			/* the call's start or the last report */
} g4_progress;

void		g4_progress_start(g4_progress *p);
/* p may be NULL (a model whose passes nobody waits on) */
void		g4_progress_tick(g4_progress *p);

/* Read a whole file into a NUL-terminated malloc'd buffer. */
int			g4_read_file(const char *path, char **out, size_t *len, g4_err *err);

/* Join a directory and a file name into a malloc'd path. */
char	   *g4_path_join(const char *dir, const char *name);

/* True if path exists and is a directory / a regular file. */
int			g4_is_dir(const char *path);
int			g4_is_file(const char *path);

/* Read-only memory map of a whole file. */
typedef struct {
	void	   *data;
	size_t		size;
} g4_mmap;

int			g4_mmap_open(const char *path, g4_mmap *m, g4_err *err);
void		g4_mmap_close(g4_mmap *m);

#define G4_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define G4_MIN(a, b) ((a) < (b) ? (a) : (b))
#define G4_MAX(a, b) ((a) > (b) ? (a) : (b))
#define G4_DIV_UP(a, b) (((a) + (b) - 1) / (b))

#endif
