/*
 * util.c — error reporting, checked allocation, conversions, files.
 */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

const char *
g4_status_name(int code)
{
	switch (code)
	{
		case G4_OK:
			return "ok";
		case G4_ERR_INVALID:
			return "invalid input";
		case G4_ERR_TOO_LONG:
			return "too long";
		case G4_ERR_NOMEM:
			return "out of memory";
		case G4_ERR_IO:
			return "i/o error";
		case G4_ERR_FORMAT:
			return "bad format";
		case G4_ERR_UNSUPPORTED:
			return "not supported";
		case G4_ERR_BACKEND:
			return "device error";
		case G4_ERR_CANCELLED:
			return "cancelled";
		case G4_ERR_INTERNAL:
			return "internal error";
		case G4_ERR_BUSY:
			return "busy";
		case G4_ERR_NUMERIC:
			return "non-finite value";
	}
	return "unknown error";
}

int
g4_fail(g4_err *err, int code, const char *fmt, ...)
{
	if (err)
	{
		va_list		ap;

		err->code = code;
		va_start(ap, fmt);
		vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
		va_end(ap);
	}
	return code;
}

int
g4_fail_ctx(g4_err *err, const char *fmt, ...)
{
	char		prefix[512];
	char		old[sizeof(err->msg)];
	va_list		ap;

	if (!err)
		return G4_ERR_INTERNAL;
	va_start(ap, fmt);
	vsnprintf(prefix, sizeof(prefix), fmt, ap);
	va_end(ap);
	memcpy(old, err->msg, sizeof(old));
	{
		/* compose "prefix: old", truncating the old message if needed */
		size_t		pl = strlen(prefix);
		size_t		cap = sizeof(err->msg) - 1;
		size_t		n = 0;

		if (pl > cap)
			pl = cap;
		memcpy(err->msg, prefix, pl);
		n = pl;
		if (n + 2 <= cap)
		{
			memcpy(err->msg + n, ": ", 2);
			n += 2;
		}
		{
			size_t		ol = strnlen(old, sizeof(old) - 1);

			if (ol > cap - n)
				ol = cap - n;
			memcpy(err->msg + n, old, ol);
			n += ol;
		}
		err->msg[n] = '\0';
	}
	return err->code;
}

void *
g4_malloc(size_t n)
{
	return malloc(n ? n : 1);
}

void *
g4_calloc(size_t n, size_t size)
{
	return calloc(n ? n : 1, size ? size : 1);
}

void *
g4_realloc(void *p, size_t n)
{
	return realloc(p, n ? n : 1);
}

char *
g4_strdup(const char *s)
{
	return s ? strdup(s) : NULL;
}

char *
g4_strndup(const char *s, size_t n)
{
	char	   *r = malloc(n + 1);

	if (r)
	{
		memcpy(r, s, n);
		r[n] = '\0';
	}
	return r;
}

int
g4_buf_reserve(g4_buf *b, size_t extra)
{
	size_t		need = b->len + extra + 1;

	if (need > b->cap)
	{
		size_t		cap = b->cap ? b->cap : 64;
		char	   *p;

		while (cap < need)
			cap *= 2;
		p = realloc(b->data, cap);
		if (!p)
			return G4_ERR_NOMEM;
		b->data = p;
		b->cap = cap;
	}
	return G4_OK;
}

int
g4_buf_append(g4_buf *b, const void *p, size_t n)
{
	if (g4_buf_reserve(b, n) != G4_OK)
		return G4_ERR_NOMEM;
	if (n)
		memcpy(b->data + b->len, p, n);
	b->len += n;
	b->data[b->len] = '\0';
	return G4_OK;
}

int
g4_buf_puts(g4_buf *b, const char *s)
{
	return g4_buf_append(b, s, strlen(s));
}

void
g4_buf_free(g4_buf *b)
{
	free(b->data);
	b->data = NULL;
	b->len = b->cap = 0;
}

double
g4_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

void
g4_progress_start(g4_progress *p)
{
	if (p->fn)
		p->last = g4_now();
}

void
g4_progress_tick(g4_progress *p)
{
	double		now;

	if (!p || !p->fn)
		return;
	now = g4_now();
	if (now - p->last < G4_PROGRESS_INTERVAL)
		return;
	p->last = now;
	p->fn(p->ctx);
}

int
g4_read_file(const char *path, char **out, size_t *len, g4_err *err)
{
	FILE	   *f = fopen(path, "rb");
	long		sz;
	char	   *buf;

	if (!f)
		return g4_fail(err, G4_ERR_IO, "cannot open %s: %s", path, strerror(errno));
	if (fseek(f, 0, SEEK_END) != 0 || (sz = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0)
	{
		fclose(f);
		return g4_fail(err, G4_ERR_IO, "cannot read %s: %s", path, strerror(errno));
	}
	buf = malloc((size_t) sz + 1);
	if (!buf)
	{
		fclose(f);
		return g4_fail(err, G4_ERR_NOMEM, "out of memory reading %s (%ld bytes)", path, sz);
	}
	if (sz > 0 && fread(buf, 1, (size_t) sz, f) != (size_t) sz)
	{
		free(buf);
		fclose(f);
		return g4_fail(err, G4_ERR_IO, "short read on %s", path);
	}
	fclose(f);
	buf[sz] = '\0';
	*out = buf;
	if (len)
		*len = (size_t) sz;
	return G4_OK;
}

char *
g4_path_join(const char *dir, const char *name)
{
	size_t		a = strlen(dir);
	size_t		b = strlen(name);
	char	   *p = malloc(a + b + 2);

	if (!p)
		return NULL;
	memcpy(p, dir, a);
	if (a > 0 && dir[a - 1] != '/')
		p[a++] = '/';
	memcpy(p + a, name, b + 1);
	return p;
}

uint64_t
g4_load_le(const uint8_t *b, size_t n)
{
	uint64_t	v = 0;
	size_t		i;

	for (i = 0; i < n; i++)
		v |= (uint64_t) b[i] << (8 * i);
	return v;
}

int
g4_is_dir(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int
g4_is_file(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int
g4_mmap_open(const char *path, g4_mmap *m, g4_err *err)
{
	int			fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	void	   *p;

	m->data = NULL;
	m->size = 0;
	if (fd < 0)
		return g4_fail(err, G4_ERR_IO, "cannot open %s: %s", path, strerror(errno));
	if (fstat(fd, &st) != 0)
	{
		close(fd);
		return g4_fail(err, G4_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
	}
	if (st.st_size == 0)
	{
		close(fd);
		return g4_fail(err, G4_ERR_FORMAT, "%s is empty", path);
	}
	p = mmap(NULL, (size_t) st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return g4_fail(err, G4_ERR_IO, "cannot map %s: %s", path, strerror(errno));
	m->data = p;
	m->size = (size_t) st.st_size;
	return G4_OK;
}

void
g4_mmap_close(g4_mmap *m)
{
	if (m->data)
		munmap(m->data, m->size);
	m->data = NULL;
	m->size = 0;
}
