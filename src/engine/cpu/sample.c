/*
 * sample.c — CPU reference of the device-side choice of cuda/sample.cu that
 * the CPU backend offers: the largest element of each logit row (greedy),
 * G4_SAMPLE_NAN for a row holding a NaN.  Sampling itself runs in the
 * engine (sampler.c) on the CPU backend.
 */
#include "cpu.h"
#include "sampler.h"

int
g4_cpu_argmax(g4_backend *be, const float *logits, int n, int vocab, int32_t *ids)
{
	int			i;

	for (i = 0; i < n; i++)
		ids[i] = g4_argmax(logits + (size_t) i * (size_t) vocab, vocab);
	return G4_OK;
}
