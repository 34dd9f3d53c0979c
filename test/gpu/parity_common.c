/*
 * parity_common.c — what the parity cases share: both backends, the inputs'
 * random numbers, device buffers, step metadata, random weights in every
 * format and the error measures.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "parity.h"
#include "xorshift.h"

/* ---- backends ---------------------------------------------------------------------- */

g4_backend *cpu_be;
g4_backend *gpu_be;

int
parity_backends(void)
{
	g4_err		err;

	if (!g4_backend_cuda_available())
		return 0;
	if (!cpu_be && g4_backend_cpu_create(0, &cpu_be, &err) != G4_OK)
		return 0;
	if (!gpu_be && g4_backend_cuda_create(0, &gpu_be, &err) != G4_OK)
	{
		printf("    cuda backend: %s\n", err.msg);
		return 0;
	}
	return 1;
}

void
parity_backends_destroy(void)
{
	if (gpu_be)
		gpu_be->ops->destroy(gpu_be);
	if (cpu_be)
		cpu_be->ops->destroy(cpu_be);
	gpu_be = cpu_be = NULL;
}

/* ---- random numbers ------------------------------------------------------------------ */

static uint64_t rs = 0x9e3779b97f4a7c15ull;

void
reseed(uint64_t s)
{
	rs = s * 0x2545f4914f6cdd1dull + 1;
}

uint64_t
rnd(void)
{
	return h_xorshift64(&rs);
}

double
unif(void)
{
	return (double) (rnd() >> 11) * (1.0 / 9007199254740992.0);
}

float
nrm(void)
{
	double		u1 = unif() + 1e-12,
				u2 = unif();

	return (float) (sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void
fill_normal(float *x, size_t n, float std)
{
	size_t		i;

	for (i = 0; i < n; i++)
		x[i] = nrm() * std;
}

/* The backend's error (a device's is collected by sync). */
void
parity_op_failed(g4_backend *be, const char *op)
{
	g4_err		err;

	memset(&err, 0, sizeof(err));
	be->ops->sync(be, &err);
	parity_abort("%s failed: %s", op, err.msg[0] ? err.msg : "(no message)");
}

/* ---- what the cases make, on the list in use --------------------------------------- */

/* One thing made: a host buffer (be NULL), a buffer or a weight of be. */
struct parity_made
{
	void	   *p;
	g4_backend *be;
	int			weight;
};

static parity_list *in_use;

void
parity_list_use(parity_list *l)
{
	in_use = l;
}

static void
unmake(const parity_made *m)
{
	if (!m->be)
		free(m->p);
	else if (m->weight)
		m->be->ops->weight_destroy(m->be, m->p);
	else
		m->be->ops->free(m->be, m->p);
}

void
parity_list_free(parity_list *l)
{
	while (l->n > 0)
		unmake(&l->made[--l->n]);
	free(l->made);
	l->made = NULL;
	l->cap = 0;
}

/* Room for one more on the list in use, before the thing is made: once
 * made, recording it cannot fail. */
static void
reserve(void)
{
	parity_made *grown;
	int			cap;

	if (!in_use)
		parity_abort("a case's buffer made outside a setup or an expansion");
	if (in_use->n < in_use->cap)
		return;
	cap = in_use->cap ? 2 * in_use->cap : 32;
	grown = realloc(in_use->made, (size_t) cap * sizeof(*grown));
	if (!grown)
		parity_abort("host allocation of a list of %d buffers failed", cap);
	in_use->made = grown;
	in_use->cap = cap;
}

static void *
record(void *p, g4_backend *be, int weight)
{
	parity_made *m = &in_use->made[in_use->n++];

	m->p = p;
	m->be = be;
	m->weight = weight;
	return p;
}

void
p_free(void *p)
{
	int			i;

	if (!p)
		return;
	for (i = in_use ? in_use->n - 1 : -1; i >= 0 && in_use->made[i].p != p; i--)
		;
	if (i < 0)
		parity_abort("p_free of %p, not made on the list in use", p);
	unmake(&in_use->made[i]);
	memmove(&in_use->made[i], &in_use->made[i + 1], (size_t) (in_use->n - i - 1) * sizeof(parity_made));
	in_use->n--;
}

void *
p_malloc(size_t bytes)
{
	void	   *p;

	reserve();
	if (!(p = malloc(bytes)))
		parity_abort("host allocation of %zu bytes failed", bytes);
	return record(p, NULL, 0);
}

void *
p_calloc(size_t n, size_t size)
{
	void	   *p;

	reserve();
	if (!(p = calloc(n, size)))
		parity_abort("host allocation of %zu x %zu bytes failed", n, size);
	return record(p, NULL, 0);
}

g4_weight *
p_weight(g4_backend *be, const g4_host_weight *parts, int n_parts)
{
	g4_weight  *w;
	g4_err		err;

	reserve();
	if (be->ops->weight_create(be, parts, n_parts, &w, &err) != G4_OK)
		parity_abort("weight_create failed on the %s backend: %s", be->ops->name, err.msg);
	return record(w, be, 1);
}

/* ---- device buffers ------------------------------------------------------------------ */

void *
gpu_alloc(size_t bytes)
{
	void	   *p;

	reserve();
	if (!(p = gpu_be->ops->alloc(gpu_be, bytes)))
		parity_abort("GPU allocation of %zu bytes failed", bytes);
	return record(p, gpu_be, 0);
}

void
gpu_put(void *d, const void *h, size_t bytes)
{
	g4_err		err;

	if (gpu_be->ops->upload(gpu_be, d, h, bytes) != G4_OK)
	{
		gpu_be->ops->sync(gpu_be, &err);
		parity_abort("GPU upload failed: %s", err.msg);
	}
}

void *
gpu_copy(const void *h, size_t bytes)
{
	void	   *p = gpu_alloc(bytes);

	gpu_put(p, h, bytes);
	return p;
}

void
gpu_get(void *h, const void *d, size_t bytes)
{
	g4_err		err;

	if (gpu_be->ops->download(gpu_be, h, d, bytes) != G4_OK || gpu_be->ops->sync(gpu_be, &err) != G4_OK)
	{
		gpu_be->ops->sync(gpu_be, &err);
		parity_abort("GPU failure: %s", err.msg);
	}
}

/* ---- step metadata ------------------------------------------------------------------- */

void
both_step(const g4_step_meta *m)
{
	if (cpu_be->ops->step_begin(cpu_be, m) != G4_OK || gpu_be->ops->step_begin(gpu_be, m) != G4_OK)
		parity_abort("step_begin failed");
}

void
meta_init(meta_buf *b, int n)
{
	int			g;

	memset(b, 0, sizeof(*b));
	b->n = n;
	b->token = p_calloc((size_t) n, 4);
	b->pos = p_calloc((size_t) n, 4);
	b->slot = p_calloc((size_t) n, 4);
	b->logit_rows = p_calloc((size_t) n, 4);
	for (g = 0; g < 2; g++)
	{
		b->lo[g] = p_calloc((size_t) n, 4);
		b->hi[g] = p_calloc((size_t) n, 4);
	}
}

g4_step_meta
meta_of(const meta_buf *b)
{
	g4_step_meta m;
	int			g;

	memset(&m, 0, sizeof(m));
	m.n_tokens = b->n;
	m.token = b->token;
	m.pos = b->pos;
	m.slot = b->slot;
	for (g = 0; g < 2; g++)
	{
		m.lo[g] = b->lo[g];
		m.hi[g] = b->hi[g];
	}
	m.n_logits = b->n_logits;
	m.logit_rows = b->logit_rows;
	return m;
}

/* ---- random weights in every format ------------------------------------------------ */

static void
put_f16(uint8_t *p, float v)
{
	uint16_t	h = g4_f32_to_f16(v);

	memcpy(p, &h, 2);
}

void
host_weight_make(g4_host_weight *w, int fmt, int64_t out, int64_t in)
{
	size_t		row = g4_wfmt_row_bytes(fmt, in);
	size_t		bytes = row * (size_t) out;
	uint8_t    *d = p_malloc(bytes);
	uint16_t   *scales = NULL;
	int64_t		r,
				i;
	float		std = 1.0f / sqrtf((float) in);

	for (i = 0; i < (int64_t) bytes; i++)
		d[i] = (uint8_t) rnd();
	switch (fmt)
	{
		case G4_W_F32:
			for (i = 0; i < out * in; i++)
				((float *) d)[i] = nrm() * std;
			break;
		case G4_W_F16:
			for (i = 0; i < out * in; i++)
				put_f16(d + 2 * i, nrm() * std);
			break;
		case G4_W_BF16:
			for (i = 0; i < out * in; i++)
				((uint16_t *) d)[i] = g4_f32_to_bf16(nrm() * std);
			break;
		case G4_W_I4G32:
			scales = p_malloc((size_t) out * (size_t) (in / 32) * 2);
			for (i = 0; i < out * (in / 32); i++)
				scales[i] = g4_f32_to_bf16(std / 4.6f * (float) (0.5 + unif()));
			break;
		default:
			{
				int			bs = g4_wfmt_block(fmt);
				size_t		bb = row / (size_t) (in / bs);

				for (r = 0; r < out; r++)
					for (i = 0; i < in / bs; i++)
					{
						uint8_t    *b = d + (size_t) r * row + (size_t) i * bb;

						/* sane scales: the other bytes stay random */
						if (fmt == G4_W_Q6_K)
							put_f16(b + 208, std / 32.0f * (float) (0.5 + unif()));
						else if (fmt == G4_W_Q4_K || fmt == G4_W_Q5_K)
						{
							put_f16(b, std / 64.0f * (float) (0.5 + unif()));
							put_f16(b + 2, std / 64.0f * (float) (0.5 + unif()));
						}
						else
						{
							put_f16(b, std / 8.0f * (float) (0.5 + unif()));
							if (fmt == G4_W_Q4_1 || fmt == G4_W_Q5_1)
								put_f16(b + 2, -std * (float) unif());
						}
					}
			}
	}
	w->fmt = fmt;
	w->out = out;
	w->in = in;
	w->data = d;
	w->scales = scales;
}

/* ---- the int4 matmul's path ------------------------------------------------------ */

const char *
matmul_initial_force(void)
{
	static int	read;
	static char v[16];			/* the path names are shorter */

	if (!read)
	{
		const char *e = getenv("G4_MATMUL_I4");

		if (e)
			snprintf(v, sizeof(v), "%s", e);
		read = 1;
	}
	return v[0] ? v : NULL;
}

void
matmul_force(const char *path)
{
	if (path)
		setenv("G4_MATMUL_I4", path, 1);
	else
		unsetenv("G4_MATMUL_I4");
}

/* ---- measures ---------------------------------------------------------------------- */

double
count_differing_words(const void *a, const void *b, size_t n)
{
	size_t		i,
				diff = 0;

	for (i = 0; i < n; i++)
		diff += memcmp((const char *) a + 4 * i, (const char *) b + 4 * i, 4) != 0;
	return (double) diff;
}

double
max_rel(const float *a, const float *ref, size_t n)
{
	double		m = 0.0,
				r = 0.0;
	size_t		i;

	for (i = 0; i < n; i++)
	{
		double		d = fabs((double) a[i] - (double) ref[i]);

		if (d > m || d != d)
			m = d;
		if (fabs((double) ref[i]) > r)
			r = fabs((double) ref[i]);
	}
	return m / (r > 0 ? r : 1.0);
}

int
inv_freq_for(int hd, int proportional, double theta, float *out)
{
	g4_attn_type a;

	memset(&a, 0, sizeof(a));
	a.head_dim = hd;
	a.rope_kind = proportional ? G4_ROPE_PROPORTIONAL : G4_ROPE_DEFAULT;
	a.rope_theta = theta;
	a.partial_rotary_factor = proportional ? 0.25 : 1.0;
	a.rope_factor = 1.0;
	g4_config_inv_freq(&a, out);
	return g4_config_rope_pairs(&a);
}
