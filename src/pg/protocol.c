/*-------------------------------------------------------------------------
 *
 * protocol.c
 *	  Messages between the supervisor and the engine process, and the
 *	  payload items of a request.
 *
 * A frame is a G4FrameHeader (body length, type) followed by the body.
 * Both sides keep a G4Buf for each direction; the supervisor's socket is
 * non-blocking, the engine process waits with poll().
 *
 * A request's payload is a sequence of items (int32 tag, uint32 length,
 * bytes, NUL): chat messages, the prompt, stop strings or token ids.  The
 * trailing NUL lets the engine process use strings in place.
 *
 * The engine process runs this code after fork(), so everything here uses
 * libc only: no palloc, no ereport.  Failures are reported to the caller.
 *
 * IDENTIFICATION
 *	  src/pg/protocol.c
 *
 *-------------------------------------------------------------------------
 */
#include "gemma4.h"

#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Make room for n more bytes; false when out of memory. */
static bool
g4buf_reserve(G4Buf *b, size_t n)
{
	size_t		need;
	size_t		cap;
	char	   *p;

	/* slide unconsumed bytes to the front before growing */
	if (b->off > 0 && b->len + n > b->cap)
	{
		memmove(b->data, b->data + b->off, b->len - b->off);
		b->len -= b->off;
		b->off = 0;
	}
	need = b->len + n;
	if (need <= b->cap)
		return true;
	if (need < n)
		return false;			/* overflow */
	cap = b->cap ? b->cap : 4096;
	while (cap < need)
	{
		if (cap > SIZE_MAX / 2)
			return false;
		cap *= 2;
	}
	p = realloc(b->data, cap);
	if (p == NULL)
		return false;
	b->data = p;
	b->cap = cap;
	return true;
}

/* Append n bytes; false when out of memory. */
static bool
g4buf_append(G4Buf *b, const void *p, size_t n)
{
	if (!g4buf_reserve(b, n))
		return false;
	if (n > 0)
		memcpy(b->data + b->len, p, n);
	b->len += n;
	return true;
}

/* Drop n bytes from the front. */
void
g4buf_consume(G4Buf *b, size_t n)
{
	b->off += n;
	if (b->off >= b->len)
		b->off = b->len = 0;
}

void
g4buf_free(G4Buf *b)
{
	free(b->data);
	memset(b, 0, sizeof(*b));
}

/*
 * Give a large buffer's memory back once it holds nothing: one large
 * message must not keep the process big for the rest of its life.  Call it
 * only where no body pointer into the buffer is live.  glibc keeps freed
 * heap memory of up to its (adaptive) mmap threshold in the process, so the
 * heap is trimmed too.
 */
void
g4buf_shrink(G4Buf *b)
{
	if (g4buf_pending(b) != 0 || b->cap <= G4_BUF_KEEP)
		return;
	g4buf_free(b);
#ifdef __GLIBC__
	malloc_trim(0);
#endif
}

/*
 * Append one frame whose body is head followed by tail (either may be
 * empty).  False when out of memory or too large; nothing is appended then.
 */
bool
g4p_put_frame(G4Buf *out, uint32 type, const void *head, size_t head_len,
			  const void *tail, size_t tail_len)
{
	G4FrameHeader h;

	if (head_len > G4_MAX_FRAME || tail_len > G4_MAX_FRAME - head_len)
		return false;
	h.len = (uint32) (head_len + tail_len);
	h.type = type;
	if (!g4buf_reserve(out, sizeof(h) + h.len))
		return false;
	g4buf_append(out, &h, sizeof(h));
	g4buf_append(out, head, head_len);
	g4buf_append(out, tail, tail_len);
	return true;
}

/*
 * Take the next complete frame out of a buffer.  Returns 1 with the frame
 * (body valid until the buffer changes), 0 when more bytes are needed, -1
 * when the stream is corrupt.
 */
int
g4p_next_frame(G4Buf *in, uint32 *type, const char **body, size_t *len)
{
	G4FrameHeader h;
	size_t		avail = g4buf_pending(in);

	if (avail < sizeof(h))
		return 0;
	memcpy(&h, in->data + in->off, sizeof(h));
	if (h.len > G4_MAX_FRAME)
		return -1;
	if (avail - sizeof(h) < h.len)
		return 0;
	*type = h.type;
	*body = in->data + in->off + sizeof(h);
	*len = h.len;
	g4buf_consume(in, sizeof(h) + h.len);
	return 1;
}

/*
 * Read what the socket has (up to 1 MB at a time).  Returns the number of
 * bytes read, 0 at end of file, -1 with errno set on error (EAGAIN when
 * nothing is available on a non-blocking socket); ENOMEM when the buffer
 * cannot grow.
 *
 * Consumed frames stay in the buffer until the next read, which is what
 * keeps the body pointers of g4p_next_frame valid while they are handled.
 */
ssize_t
g4p_read(int fd, G4Buf *in)
{
	const size_t chunk = 1 << 20;
	ssize_t		n;

	/* the frames handled since the last read are done with */
	g4buf_shrink(in);
	if (!g4buf_reserve(in, chunk))
	{
		errno = ENOMEM;
		return -1;
	}
	do
		n = read(fd, in->data + in->len, chunk);
	while (n < 0 && errno == EINTR);
	if (n > 0)
		in->len += (size_t) n;
	return n;
}

/*
 * Write as much of the buffer as the socket takes.  Returns the number of
 * bytes written, or -1 with errno set (EAGAIN: try later).
 */
ssize_t
g4p_write(int fd, G4Buf *out)
{
	ssize_t		n;

	if (g4buf_pending(out) == 0)
		return 0;
	do
		n = send(fd, out->data + out->off, g4buf_pending(out), MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n > 0)
	{
		g4buf_consume(out, (size_t) n);
		g4buf_shrink(out);
	}
	return n;
}

/* Bytes one payload item of len bytes takes. */
size_t
g4p_item_size(size_t len)
{
	return sizeof(int32) + sizeof(uint32) + len + 1;
}

/* Write one item at dst (g4p_item_size(len) bytes); returns the next position. */
char *
g4p_item_put(char *dst, int32 tag, const void *data, uint32 len)
{
	memcpy(dst, &tag, sizeof(tag));
	dst += sizeof(tag);
	memcpy(dst, &len, sizeof(len));
	dst += sizeof(len);
	if (len > 0)
		memcpy(dst, data, len);
	dst += len;
	*dst++ = '\0';
	return dst;
}

/*
 * Read the item at *pos and advance.  False at the end or when the item
 * does not fit before end (a corrupt payload).
 */
bool
g4p_item_next(const char **pos, const char *end, int32 *tag, const char **data, uint32 *len)
{
	const char *p = *pos;

	if (end - p < (ptrdiff_t) (sizeof(int32) + sizeof(uint32)))
		return false;
	memcpy(tag, p, sizeof(int32));
	p += sizeof(int32);
	memcpy(len, p, sizeof(uint32));
	p += sizeof(uint32);
	if ((size_t) (end - p) < (size_t) *len + 1 || p[*len] != '\0')
		return false;
	*data = p;
	*pos = p + *len + 1;
	return true;
}
