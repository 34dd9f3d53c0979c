/*
 * sample.c — CPU reference of the device-side choice of cuda/sample.cu that
 * the CPU backend offers: the largest element of each logit row (greedy).
 * Sampling itself runs in the engine (sampler.c) on the CPU backend.
 */
#include "cpu.h"

int
g4_cpu_argmax(g4_backend *be, const float *logits, int n, int vocab, int32_t *ids)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		const float *row = logits + (size_t) i * (size_t) vocab;
		int			j,
					best = 0;

		for (j = 1; j < vocab; j++)
			if (row[j] > row[best])
				best = j;
		ids[i] = best;
	}
	return G4_OK;
}
