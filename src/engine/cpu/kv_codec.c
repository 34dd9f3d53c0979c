/*
 * kv_codec.c — encoding and decoding of one (token, head) slot of the KV
 * pool in each dtype, exactly as laid out in kvformat.h.
 *
 * Rounding rules (the CUDA backend reproduces them bit for bit):
 *  - bf16: round to nearest even;
 *  - turboquant_k8v4: scale = max|x| / levels rounded to f16 first, then
 *    q = rint(x * (1 / scale)) (round half to even), clamped to the levels.
 */
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "util.h"

void
g4_hadamard(float *x, int n)
{
	int			len;
	int			i;
	float		norm = 1.0f / sqrtf((float) n);

	/* Sylvester order: butterflies of growing span */
	for (len = 1; len < n; len <<= 1)
		for (i = 0; i < n; i += len << 1)
		{
			int			j;

			for (j = i; j < i + len; j++)
			{
				float		a = x[j];
				float		b = x[j + len];

				x[j] = a + b;
				x[j + len] = a - b;
			}
		}
	for (i = 0; i < n; i++)
		x[i] *= norm;
}

static float
amax(const float *x, int n)
{
	float		m = 0.0f;
	int			i;

	for (i = 0; i < n; i++)
		m = fmaxf(m, fabsf(x[i]));
	return m;
}

/* Quantise n values to signed integers in [-levels, levels]; returns the
 * f16 scale. */
static uint16_t
quantize(const float *x, int n, int levels, int8_t *q)
{
	uint16_t	s16 = g4_f32_to_f16(amax(x, n) / (float) levels);
	float		s = g4_f16_to_f32(s16);
	float		inv = s > 0.0f ? 1.0f / s : 0.0f;
	int			i;

	for (i = 0; i < n; i++)
	{
		float		r = rintf(x[i] * inv);

		if (isnan(r))
			r = 0.0f;			/* a NaN has no integer: store zero */
		if (r > (float) levels)
			r = (float) levels;
		if (r < (float) -levels)
			r = (float) -levels;
		q[i] = (int8_t) r;
	}
	return s16;
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
	/* turboquant_k8v4 */
	{
		int8_t		q[512];
		float		rot[512];
		uint16_t	s;

		if (k_eq_v)
		{
			s = quantize(v, hd, 127, q);
			memcpy(blk + (size_t) off * hd, q, (size_t) hd);
			memcpy(blk + g4_kv_tq_kscale_off(hd) + 2 * (size_t) off, &s, 2);
			return;
		}
		memcpy(rot, k, (size_t) hd * sizeof(float));
		g4_hadamard(rot, hd);
		s = quantize(rot, hd, 127, q);
		memcpy(blk + (size_t) off * hd, q, (size_t) hd);
		memcpy(blk + g4_kv_tq_kscale_off(hd) + 2 * (size_t) off, &s, 2);

		memcpy(rot, v, (size_t) hd * sizeof(float));
		g4_hadamard(rot, hd);
		{
			uint8_t    *vq = blk + g4_kv_tq_v_off(hd) + (size_t) off * (size_t) (hd / 2);
			int			G = g4_kv_v4_group(hd);
			uint8_t    *vs = blk + g4_kv_tq_vscale_off(hd) + (size_t) off * (size_t) (hd / G) * 2;
			int			g;

			for (g = 0; g < hd / G; g++)
			{
				s = quantize(rot + g * G, G, 7, q + g * G);
				memcpy(vs + 2 * g, &s, 2);
			}
			for (i = 0; i < hd / 2; i++)
				vq[i] = (uint8_t) ((q[2 * i] + 8) | ((q[2 * i + 1] + 8) << 4));
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
			k[i] = (float) q[i] * s;
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
			v[2 * i] = (float) ((int) (vq[i] & 15) - 8) * s;
			v[2 * i + 1] = (float) ((int) (vq[i] >> 4) - 8) * s;
		}
	}
}

void
g4_rope_apply(float *x, int hd, int pos, const float *inv_freq)
{
	int			half = hd / 2;
	int			j;

	for (j = 0; j < half; j++)
	{
		float		angle;
		float		c,
					s;
		float		a,
					b;

		if (inv_freq[j] == 0.0f)
			continue;			/* cos 0 = 1, sin 0 = 0: the pair passes through */
		angle = (float) pos * inv_freq[j];
		c = cosf(angle);
		s = sinf(angle);
		a = x[j];
		b = x[j + half];
		x[j] = a * c - b * s;
		x[j + half] = b * c + a * s;
	}
}
