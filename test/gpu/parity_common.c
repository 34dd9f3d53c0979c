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

/* ---- allocations and device buffers ------------------------------------------------ */

void *
p_malloc(size_t bytes)
{
	void	   *p = malloc(bytes);

	if (!p)
		parity_abort("host allocation of %zu bytes failed", bytes);
	return p;
}

void *
p_calloc(size_t n, size_t size)
{
	void	   *p = calloc(n, size);

	if (!p)
		parity_abort("host allocation of %zu x %zu bytes failed", n, size);
	return p;
}

void *
gpu_alloc(size_t bytes)
{
	void	   *p = gpu_be->ops->alloc(gpu_be, bytes);

	if (!p)
		parity_abort("GPU allocation of %zu bytes failed", bytes);
	return p;
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

void
gpu_free(void *d)
{
	gpu_be->ops->free(gpu_be, d);
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

void
meta_free(meta_buf *b)
{
	int			g;

	free(b->token);
	free(b->pos);
	free(b->slot);
	free(b->logit_rows);
	for (g = 0; g < 2; g++)
	{
		free(b->lo[g]);
		free(b->hi[g]);
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
host_w_make(host_w *w, int fmt, int64_t out, int64_t in)
{
	size_t		row = g4_wfmt_row_bytes(fmt, in);
	size_t		bytes = row * (size_t) out;
	uint8_t    *d = p_malloc(bytes);
	int64_t		r,
				i;
	float		std = 1.0f / sqrtf((float) in);

	memset(w, 0, sizeof(*w));
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
			w->scales = p_malloc((size_t) out * (size_t) (in / 32) * 2);
			for (i = 0; i < out * (in / 32); i++)
				w->scales[i] = g4_f32_to_bf16(std / 4.6f * (float) (0.5 + unif()));
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
	w->data = d;
	w->hw.fmt = fmt;
	w->hw.out = out;
	w->hw.in = in;
	w->hw.data = d;
	w->hw.scales = w->scales;
}

void
host_w_free(host_w *w)
{
	free(w->data);
	free(w->scales);
}

/* ---- measures ---------------------------------------------------------------------- */

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

void
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
}
