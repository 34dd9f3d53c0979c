/*
 * quant.h — the weight formats' element encodings on the CPU: dequantising
 * rows and multiplying them with float activations.
 *
 * These are the inner loops of the CPU backend's matmul.  Results equal
 * "dequantise to float32, then multiply-accumulate in float32" up to the
 * order of the additions.
 */
#ifndef G4_QUANT_H
#define G4_QUANT_H

#include <stddef.h>
#include <stdint.h>

/* Dequantise one row of `in` elements of format fmt (g4_wfmt) to float.
 * scales: the row's bf16 group scales (G4_W_I4G32 only, else NULL). */
void		g4_dequant_row(int fmt, const void *row, const uint16_t *scales,
						   int64_t in, float *out);

/* out[t * out_stride] = dot(row, x[t * x_stride ...]) for t in [0, n):
 * one weight row against n activation rows, decoding the row once. */
void		g4_dot_row(int fmt, const void *row, const uint16_t *scales, int64_t in,
					   const float *x, int64_t x_stride, int n,
					   float *out, int64_t out_stride);

/* The same kernels with an explicit code path (0: portable scalar, 1: AVX2 +
 * FMA), for tests and benchmarks; the plain entry points pick the best path
 * the CPU supports. */
int			g4_quant_simd_available(void);
void		g4_dequant_row_path(int path, int fmt, const void *row, const uint16_t *scales,
								int64_t in, float *out);
void		g4_dot_row_path(int path, int fmt, const void *row, const uint16_t *scales, int64_t in,
							const float *x, int64_t x_stride, int n, float *out, int64_t out_stride);

/* Quantise float rows into a block format (tests, fixture generation). */
void		g4_quant_row_i4g32(const float *w, int64_t in, uint32_t *packed,
							   uint16_t *scales);

#endif
