/*
 * matmul.c — CPU reference of y = x · Wᵀ for every weight format.
 *
 * Work items are (block of output rows) × (tile of token rows).  Each weight
 * row is decoded once per token tile by g4_dot_row (quant.c) and multiplied
 * with every activation row of the tile, so quantised weights are used as
 * stored, never dequantised as a whole.  Token tiles keep the activations of
 * a tile in cache while the weights stream.
 */
#include "cpu.h"
#include "quant.h"
#include "util.h"

#define ROW_BLOCK 16
#define TOKEN_TILE 64

typedef struct
{
	const g4_weight *w;
	const float *x;
	int			n;
	float	   *y;
	int64_t		row_blocks;
} mm_ctx;

static void
mm_item(void *arg, int64_t item, int thread)
{
	mm_ctx	   *m = arg;
	const g4_weight *w = m->w;
	int64_t		rb = item % m->row_blocks;
	int			tile = (int) (item / m->row_blocks);
	int			t0 = tile * TOKEN_TILE;
	int			nt = G4_MIN(TOKEN_TILE, m->n - t0);
	int64_t		r0 = rb * ROW_BLOCK;
	int64_t		r1 = G4_MIN(w->out, r0 + ROW_BLOCK);
	int64_t		r;
	int			part = 0;
	int64_t		part_start = 0;

	for (r = r0; r < r1; r++)
	{
		const g4_host_weight *p;
		int64_t		pr;

		while (r >= part_start + w->parts[part].out)
		{
			part_start += w->parts[part].out;
			part++;
		}
		p = &w->parts[part];
		pr = r - part_start;
		g4_dot_row(p->fmt, (const uint8_t *) p->data + (size_t) pr * g4_wfmt_row_bytes(p->fmt, p->in),
				   p->scales ? p->scales + (size_t) pr * (size_t) (p->in / 32) : NULL, p->in,
				   m->x + (size_t) t0 * (size_t) w->in, w->in, nt,
				   m->y + (size_t) t0 * (size_t) w->out + (size_t) r, w->out);
	}
}

int
g4_cpu_matmul(g4_backend *be, const g4_weight *w, const float *x, int n, float *y)
{
	mm_ctx		m;

	m.w = w;
	m.x = x;
	m.n = n;
	m.y = y;
	m.row_blocks = G4_DIV_UP(w->out, ROW_BLOCK);
	g4_pool_run(g4_cpu_of(be)->pool, m.row_blocks * G4_DIV_UP(n, TOKEN_TILE), mm_item, &m);
	return G4_OK;
}
