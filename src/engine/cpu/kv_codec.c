/*
 * kv_codec.c — encoding and decoding of one (token, head) slot of the KV
 * pool in each dtype, exactly as laid out in kvformat.h.
 *
 * Rounding rules (the CUDA backend uses the same, from kvformat.h):
 *  - bf16: round to nearest even;
 *  - turboquant_k8v4: scale = max|x| / levels rounded to f16 first, then the
 *    codes of g4_kv_k8_code / g4_kv_v4_code.
 */
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "util.h"

void
g4_hadamard(float *x, int n)
{
	int			len;
	int			q;
	float		norm = g4_hadamard_norm(n);

	for (len = 1; len < n; len <<= 1)
		for (q = 0; q < n / 2; q++)
			g4_hadamard_butterfly(x, len, q);
	for (q = 0; q < n; q++)
		x[q] *= norm;
}

static float
amax(const float *x, int n)
{
	float		m = 0.0f;
	int			i;

	for (i = 0; i < n; i++)
		m = g4_kv_amax_step(m, x[i]);
	return m;
}

void
g4_kv_encode_head(int dtype, int k_eq_v, int hd, uint8_t *blk, int off, const float *k, const float *v)
{
	const int	T = G4_KV_BLOCK_TOKENS;
	int			i;

	if (dtype == G4_KV_F32)
	{
		float	   *kp = (float *) blk;

		if (k_eq_v)
			memcpy(kp + (size_t) off * hd, v, (size_t) hd * sizeof(float));
		else
		{
			memcpy(kp + (size_t) off * hd, k, (size_t) hd * sizeof(float));
			memcpy(kp + (size_t) (T + off) * hd, v, (size_t) hd * sizeof(float));
		}
		return;
	}
	if (dtype == G4_KV_BF16)
	{
		uint16_t   *kp = (uint16_t *) blk;

		for (i = 0; i < hd; i++)
		{
			if (k_eq_v)
				kp[(size_t) off * hd + i] = g4_f32_to_bf16(v[i]);
			else
			{
				kp[(size_t) off * hd + i] = g4_f32_to_bf16(k[i]);
				kp[(size_t) (T + off) * hd + i] = g4_f32_to_bf16(v[i]);
			}
		}
		return;
	}
	/* turboquant_k8v4: the key (or, for k_eq_v layers, the plain value) as
	 * int8 with one scale, the rotated value as 4-bit codes */
	{
		float		rot[G4_CPU_MAX_HD];
		int8_t	   *kq = (int8_t *) blk + (size_t) off * hd;
		float		inv;
		uint16_t	s;

		memcpy(rot, k_eq_v ? v : k, (size_t) hd * sizeof(float));
		if (!k_eq_v)
			g4_hadamard(rot, hd);
		s = g4_kv_scale(amax(rot, hd), G4_KV_K8_LEVELS, &inv);
		for (i = 0; i < hd; i++)
			kq[i] = (int8_t) g4_kv_k8_code(rot[i], inv);
		memcpy(blk + g4_kv_tq_kscale_off(hd) + 2 * (size_t) off, &s, 2);
		if (k_eq_v)
			return;

		memcpy(rot, v, (size_t) hd * sizeof(float));
		g4_hadamard(rot, hd);
		{
			uint8_t    *vq = blk + g4_kv_tq_v_off(hd) + (size_t) off * (size_t) (hd / 2);
			int			G = g4_kv_v4_group(hd);
			uint8_t    *vs = blk + g4_kv_tq_vscale_off(hd) + (size_t) off * (size_t) (hd / G) * 2;
			int			g;

			for (g = 0; g < hd / G; g++)
			{
				s = g4_kv_scale(amax(rot + g * G, G), G4_KV_V4_STEPS, &inv);
				memcpy(vs + 2 * g, &s, 2);
				for (i = g * G; i < (g + 1) * G; i += 2)
					vq[i / 2] = (uint8_t) (g4_kv_v4_code(rot[i], inv) | (g4_kv_v4_code(rot[i + 1], inv) << 4));
			}
		}
	}
}

void
g4_kv_decode_k(int dtype, int k_eq_v, int hd, const uint8_t *blk, int off, float *k)
{
	int			i;

	if (dtype == G4_KV_F32)
	{
		memcpy(k, (const float *) blk + (size_t) off * hd, (size_t) hd * sizeof(float));
		return;
	}
	if (dtype == G4_KV_BF16)
	{
		const uint16_t *kp = (const uint16_t *) blk + (size_t) off * hd;

		for (i = 0; i < hd; i++)
			k[i] = g4_bf16_to_f32(kp[i]);
		return;
	}
	{
		const int8_t *q = (const int8_t *) blk + (size_t) off * hd;
		uint16_t	s16;
		float		s;

		memcpy(&s16, blk + g4_kv_tq_kscale_off(hd) + 2 * (size_t) off, 2);
		s = g4_f16_to_f32(s16);
		for (i = 0; i < hd; i++)
			k[i] = g4_kv_k8_value(q[i], s);
	}
	(void) k_eq_v;
}

void
g4_kv_decode_v(int dtype, int k_eq_v, int hd, const uint8_t *blk, int off, float *v)
{
	const int	T = G4_KV_BLOCK_TOKENS;
	int			i;

	if (k_eq_v)
	{
		/* the stored vector is V itself, laid out like a key */
		g4_kv_decode_k(dtype, k_eq_v, hd, blk, off, v);
		return;
	}
	if (dtype == G4_KV_F32)
	{
		memcpy(v, (const float *) blk + (size_t) (T + off) * hd, (size_t) hd * sizeof(float));
		return;
	}
	if (dtype == G4_KV_BF16)
	{
		const uint16_t *vp = (const uint16_t *) blk + (size_t) (T + off) * hd;

		for (i = 0; i < hd; i++)
			v[i] = g4_bf16_to_f32(vp[i]);
		return;
	}
	{
		const uint8_t *vq = blk + g4_kv_tq_v_off(hd) + (size_t) off * (size_t) (hd / 2);
		int			G = g4_kv_v4_group(hd);
		const uint8_t *vs = blk + g4_kv_tq_vscale_off(hd) + (size_t) off * (size_t) (hd / G) * 2;

		for (i = 0; i < hd / 2; i++)
		{
			uint16_t	s16;
			float		s;

			memcpy(&s16, vs + 2 * ((2 * i) / G), 2);
			s = g4_f16_to_f32(s16);
			v[2 * i] = g4_kv_v4_value(vq[i] & 15, s);
			v[2 * i + 1] = g4_kv_v4_value(vq[i] >> 4, s);
		}
	}
}
