/*
 * halfconv.h — bit-exact bf16 and f16 conversions to and from f32, shared by
 * the CPU engine and the CUDA kernels so that both quantise and dequantise
 * identically (the KV pool's bytes must not depend on the backend that wrote
 * them).  Rounding is round-to-nearest-even; NaN stays NaN.  Plain C, also
 * compiled as CUDA C++: G4_HOSTDEV marks the functions for both sides.
 */
#ifndef G4_HALFCONV_H
#define G4_HALFCONV_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define G4_HOSTDEV __host__ __device__
#else
#define G4_HOSTDEV
#endif

/* bf16 <-> f32 */
static inline G4_HOSTDEV float
g4_bf16_to_f32(uint16_t h)
{
	uint32_t	u = (uint32_t) h << 16;
	float		f;

	memcpy(&f, &u, 4);
	return f;
}

static inline G4_HOSTDEV uint16_t
g4_f32_to_bf16(float f)
{
	uint32_t	u;

	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t) ((u >> 16) | 0x40);	/* quiet NaN */
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t) (u >> 16);
}

/* Round an f32 to the nearest bf16 value, returned as f32. */
static inline G4_HOSTDEV float
g4_round_bf16(float f)
{
	return g4_bf16_to_f32(g4_f32_to_bf16(f));
}

/* f16 <-> f32, subnormals included.  On the device, the conversion
 * instruction (exact for every f16, as is the bit manipulation below). */
static inline G4_HOSTDEV float
g4_f16_to_f32(uint16_t h)
{
#ifdef __CUDA_ARCH__
	float		f;

	asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
	return f;
#else
	uint32_t	sign = (uint32_t) (h & 0x8000) << 16;
	uint32_t	exp = (h >> 10) & 0x1f;
	uint32_t	man = h & 0x3ff;
	uint32_t	u;
	float		f;

	if (exp == 0)
	{
		if (man == 0)
			u = sign;
		else
		{
			/* subnormal: value = man * 2^-24 */
			f = (float) man * (1.0f / 16777216.0f);
			return sign ? -f : f;
		}
	}
	else if (exp == 31)
		u = sign | 0x7f800000u | (man << 13);
	else
		u = sign | ((exp + 112) << 23) | (man << 13);
	memcpy(&f, &u, 4);
	return f;
#endif
}

static inline G4_HOSTDEV uint16_t
g4_f32_to_f16(float f)
{
	uint32_t	u;
	uint32_t	sign;
	int32_t		exp;
	uint32_t	man;

	memcpy(&u, &f, 4);
	sign = (u >> 16) & 0x8000;
	exp = (int32_t) ((u >> 23) & 0xff);
	man = u & 0x7fffff;
	if (exp == 255)
		return (uint16_t) (sign | 0x7c00 | (man ? 0x200 : 0));
	exp = exp - 127 + 15;
	if (exp >= 31)
		return (uint16_t) (sign | 0x7c00);
	if (exp <= 0)
	{
		/* subnormal or zero, round to nearest even */
		uint32_t	shift;
		uint32_t	m;
		uint32_t	r;

		if (exp < -10)
			return (uint16_t) sign;
		m = man | 0x800000;
		shift = (uint32_t) (14 - exp);
		r = m >> shift;
		if ((m >> (shift - 1)) & 1)
		{
			if ((m & ((1u << (shift - 1)) - 1)) || (r & 1))
				r++;
		}
		return (uint16_t) (sign | r);
	}
	{
		uint32_t	r = ((uint32_t) exp << 10) | (man >> 13);
		uint32_t	rest = man & 0x1fff;

		if (rest > 0x1000 || (rest == 0x1000 && (r & 1)))
			r++;				/* may carry into the exponent: correct */
		return (uint16_t) (sign | r);
	}
}

#endif							/* G4_HALFCONV_H */
