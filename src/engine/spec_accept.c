/*
 * spec_accept.c — see spec_accept.h.
 */
#include "spec_accept.h"

static double
q_at(const double *q, int32_t d, int i)
{
	return q ? q[i] : (i == d ? 1.0 : 0.0);
}

int32_t
g4_spec_accept(const double *p, const double *q, int vocab, int32_t d, g4_rng *rng, int *accepted)
{
	double		qd = q_at(q, d, d);
	double		u = g4_rng_uniform(rng);
	double		total = 0.0,
				target,
				cum = 0.0;
	int32_t		last = -1;
	int			i;

	/* u < p/q accepts with probability min(1, p/q) */
	*accepted = qd > 0.0 && u * qd < p[d];
	if (*accepted)
		return d;
	for (i = 0; i < vocab; i++)
	{
		double		r = p[i] - q_at(q, d, i);

		if (r > 0.0)
			total += r;
	}
	u = g4_rng_uniform(rng);
	if (!(total > 0.0))
		return d;				/* p == q: rejection has probability 0 */
	target = u * total;
	for (i = 0; i < vocab; i++)
	{
		double		r = p[i] - q_at(q, d, i);

		if (r <= 0.0)
			continue;
		last = i;
		cum += r;
		if (cum > target)
			return i;
	}
	return last;				/* rounding left the target unreached */
}
