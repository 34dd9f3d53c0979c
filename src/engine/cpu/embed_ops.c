/*
 * embed_ops.c — CPU reference of the media embedders' row operations
 * (cuda/embed_ops.cu): LayerNorm with weight and bias, bias add, and the
 * factorised 2-D position embedding of image patches.
 *
 * LayerNorm follows torch.nn.LayerNorm in float32: mean and biased variance
 * (accumulated in double here), y = (x - mean) * (var + eps)^-0.5 * w + b,
 * each operation rounded to float on its own.
 */
#include <math.h>

#include "cpu.h"
#include "util.h"

typedef struct
{
	const float *x;
	const float *w;
	const float *b;
	int			dim;
	float		eps;
	float	   *y;
} ln_ctx;

static void
ln_item(void *arg, int64_t r, int thread)
{
	ln_ctx	   *l = arg;
	const float *x = l->x + (size_t) r * l->dim;
	float	   *y = l->y + (size_t) r * l->dim;
	double		s = 0.0,
				ss = 0.0;
	float		mean,
				f;
	int			i;

	for (i = 0; i < l->dim; i++)
		s += x[i];
	mean = (float) (s / l->dim);
	for (i = 0; i < l->dim; i++)
	{
		double		d = (double) x[i] - (double) mean;

		ss += d * d;
	}
	f = powf((float) (ss / l->dim) + l->eps, -0.5f);
	for (i = 0; i < l->dim; i++)
	{
		float		v = (x[i] - mean) * f;

		y[i] = v * l->w[i] + l->b[i];
	}
}

int
g4_cpu_layernorm(g4_backend *be, const float *x, const float *w, const float *b, int rows, int dim, float eps,
				 float *y)
{
	ln_ctx		l = {x, w, b, dim, eps, y};

	g4_pool_run(g4_cpu_of(be)->pool, rows, ln_item, &l);
	return G4_OK;
}

int
g4_cpu_add_bias(g4_backend *be, float *x, const float *b, int rows, int dim)
{
	int			r,
				i;

	for (r = 0; r < rows; r++)
		for (i = 0; i < dim; i++)
			x[(size_t) r * dim + i] += b[i];
	return G4_OK;
}

int
g4_cpu_add_pos2d(g4_backend *be, float *x, const float *table, const int32_t *pos, int rows, int dim)
{
	int			r,
				i;

	for (r = 0; r < rows; r++)
	{
		int			px = pos[2 * r],
					py = pos[2 * r + 1];
		float	   *xr = x + (size_t) r * dim;

		for (i = 0; i < dim; i++)
		{
			float		tx = px >= 0 ? table[((size_t) px * 2) * dim + i] : 0.0f;
			float		ty = py >= 0 ? table[((size_t) py * 2 + 1) * dim + i] : 0.0f;

			xr[i] += tx + ty;
		}
	}
	return G4_OK;
}
