/*
 * quant.c — element encodings of the weight formats (enum g4_wfmt) on the
 * CPU: exact row dequantisation, row x activations dot products, and the
 * int4 group-32 quantiser.
 *
 * Layouts (little-endian; "d", "m", "dmin" are IEEE half floats):
 *   F32 / F16 / BF16   plain elements.
 *   I4G32              compressed-tensors pack-quantized: uint32 words, nibble
 *                      i of word j is column 8j+i, code = q + 8; one bf16
 *                      scale per 32 columns (separate array); w = (code-8)*s.
 *   Q8_0  (32, 34 B)   d, int8 q[32]                          w = q*d
 *   Q4_0  (32, 18 B)   d, qs[16]: byte j = elem j (low nibble), elem j+16
 *                      (high nibble)                          w = (q-8)*d
 *   Q4_1  (32, 20 B)   d, m, qs[16] as Q4_0                   w = q*d + m
 *   Q5_0  (32, 22 B)   d, qh (u32: bit j = 5th bit of elem j), qs[16]
 *                                                             w = (q-16)*d
 *   Q5_1  (32, 24 B)   d, m, qh, qs[16]                       w = q*d + m
 *   Q4_K (256, 144 B)  d, dmin, scales[12] (eight 6-bit scale/min pairs),
 *                      qs[128]: 32 bytes per pair of 32-element sub-blocks,
 *                      low nibbles the even sub-block, high the odd one
 *                                                 w = (d*sc)*q - (dmin*m)
 *   Q5_K (256, 176 B)  d, dmin, scales[12], qh[32] (bit i of qh[l] = 5th bit
 *                      of element l of sub-block i), qs[128] as Q4_K
 *   Q6_K (256, 210 B)  ql[128], qh[64], int8 scales[16] (one per 16 elems), d
 *                      two halves of 128: ql[l], ql[l+32] low/high nibbles
 *                      and 2-bit fields of qh[l] give elements l, l+32, l+64,
 *                      l+96                               w = (d*sc)*(q-32)
 *
 * Dequantisation evaluates exactly these expressions in float32 with one
 * rounding per operation (products and sums are not fused), so results are
 * bit-identical to ggml's dequantize_row_* and gguf-py's numpy dequantisers.
 * This needs floating-point contraction off: Clang is told so below; GCC
 * does not contract in ISO C mode (-std=c11), and the golden-value test
 * would catch a build that does.
 *
 * Dot products multiply the exact dequantised values with the activations
 * (fused multiply-add in the AVX2 path) and sum in float32 with eight or more
 * independent partial sums.  With one activation row the weights are decoded
 * in registers and multiplied at once; with several, each 256-element chunk
 * is decoded once into an L1-resident buffer and then multiplied with every
 * row.  The AVX2+FMA+F16C kernels are compiled with target attributes (no
 * -march flags needed) and chosen at run time; the portable scalar code is
 * the fallback.  g4_dequant_row_path / g4_dot_row_path select a path
 * explicitly so that tests and benchmarks cover both.
 */
#include "quant.h"

#include <math.h>
#include <string.h>

#include "backend.h"
#include "util.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define G4_HAVE_X86_SIMD 1
#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>
#else
#define G4_HAVE_X86_SIMD 0
#endif

/* Elements decoded per step of the dot-product drivers: a multiple of every
 * block size (32, 256) so chunks never split a block. */
#define CHUNK 256
/* Activation rows handled per pass over the weight row. */
#define TBLK 64

typedef struct
{
	const char *name;
	int			block;			/* elements per block */
	int			bytes;			/* bytes per block */
} fmt_info;

static const fmt_info formats[G4_W_FORMAT_COUNT] = {
	[G4_W_F32] = {"F32", 1, 4},
	[G4_W_F16] = {"F16", 1, 2},
	[G4_W_BF16] = {"BF16", 1, 2},
	[G4_W_I4G32] = {"I4G32", 32, 16},
	[G4_W_Q8_0] = {"Q8_0", 32, 34},
	[G4_W_Q4_0] = {"Q4_0", 32, 18},
	[G4_W_Q4_1] = {"Q4_1", 32, 20},
	[G4_W_Q5_0] = {"Q5_0", 32, 22},
	[G4_W_Q5_1] = {"Q5_1", 32, 24},
	[G4_W_Q4_K] = {"Q4_K", 256, 144},
	[G4_W_Q5_K] = {"Q5_K", 256, 176},
	[G4_W_Q6_K] = {"Q6_K", 256, 210},
};

const char *
g4_wfmt_name(int fmt)
{
	if (fmt < 0 || fmt >= G4_W_FORMAT_COUNT)
		return "unknown";
	return formats[fmt].name;
}

int
g4_wfmt_block(int fmt)
{
	if (fmt < 0 || fmt >= G4_W_FORMAT_COUNT)
		return 0;
	return formats[fmt].block;
}

/*
 * Bytes of one row.  I4G32 rows are ceil(in/8) words (a partial last word is
 * padded, as compressed-tensors does).  Block formats need in to be a
 * multiple of the block size; 0 is returned for an impossible row (and for
 * unknown formats or negative in), which callers treat as a shape error.
 */
size_t
g4_wfmt_row_bytes(int fmt, int64_t in)
{
	const fmt_info *f;

	if (fmt < 0 || fmt >= G4_W_FORMAT_COUNT || in < 0)
		return 0;
	f = &formats[fmt];
	if (fmt == G4_W_I4G32)
		return (size_t) ((in + 7) / 8) * 4;
	if (in % f->block != 0)
		return 0;
	return (size_t) (in / f->block) * (size_t) f->bytes;
}

/* ---- byte access (rows may sit at any alignment in a mapping) ---------- */

static inline uint16_t
rd16(const uint8_t *p)
{
	return (uint16_t) (p[0] | (p[1] << 8));
}

static inline uint32_t
rd32(const uint8_t *p)
{
	return (uint32_t) p[0] | ((uint32_t) p[1] << 8) | ((uint32_t) p[2] << 16) |
		((uint32_t) p[3] << 24);
}

/* IEEE half -> float, exact for every input (subnormals via an exact
 * integer-to-float conversion and scaling, NaN payloads kept); the branches
 * are predictable since weights are almost always normal numbers. */
static inline float
h2f(uint16_t h)
{
	uint32_t	em = h & 0x7FFFu;
	uint32_t	u;
	float		f;

	if (em >= 0x7C00u)
		u = 0x7F800000u | ((em & 0x3FFu) << 13);
	else if (em >= 0x0400u)
		u = (em << 13) + ((127u - 15u) << 23);
	else
	{
		f = (float) em * 0x1p-24f;
		memcpy(&u, &f, 4);
	}
	u |= (uint32_t) (h & 0x8000u) << 16;
	memcpy(&f, &u, 4);
	return f;
}

static inline float
half(const uint8_t *p)
{
	return h2f(rd16(p));
}

/* The j-th (0..7) 6-bit scale and min of a Q4_K/Q5_K block: entries 0-3 are
 * the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); entries 4-7 take their
 * low 4 bits from the nibbles of bytes 8-11 and their top 2 bits from the
 * spare top bits of bytes 0-7. */
static inline void
k_scale_min(const uint8_t *s, int j, int *sc, int *mn)
{
	if (j < 4)
	{
		*sc = s[j] & 63;
		*mn = s[j + 4] & 63;
	}
	else
	{
		*sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
		*mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
	}
}

/* ---- scalar block decoders ---------------------------------------------- */

static void
blk_q8_0(const uint8_t *b, float *y)
{
	float		d = half(b);
	int			i;

	for (i = 0; i < 32; i++)
		y[i] = (float) (int8_t) b[2 + i] * d;
}

static void
blk_q4_0(const uint8_t *b, float *y)
{
	float		d = half(b);
	const uint8_t *qs = b + 2;
	int			j;

	for (j = 0; j < 16; j++)
	{
		y[j] = (float) ((qs[j] & 0x0F) - 8) * d;
		y[j + 16] = (float) ((qs[j] >> 4) - 8) * d;
	}
}

static void
blk_q4_1(const uint8_t *b, float *y)
{
	float		d = half(b);
	float		m = half(b + 2);
	const uint8_t *qs = b + 4;
	int			j;

	for (j = 0; j < 16; j++)
	{
		y[j] = (float) (qs[j] & 0x0F) * d + m;
		y[j + 16] = (float) (qs[j] >> 4) * d + m;
	}
}

static void
blk_q5_0(const uint8_t *b, float *y)
{
	float		d = half(b);
	uint32_t	qh = rd32(b + 2);
	const uint8_t *qs = b + 6;
	int			j;

	for (j = 0; j < 16; j++)
	{
		int			lo = (qs[j] & 0x0F) | (int) (((qh >> j) & 1) << 4);
		int			hi = (qs[j] >> 4) | (int) (((qh >> (j + 16)) & 1) << 4);

		y[j] = (float) (lo - 16) * d;
		y[j + 16] = (float) (hi - 16) * d;
	}
}

static void
blk_q5_1(const uint8_t *b, float *y)
{
	float		d = half(b);
	float		m = half(b + 2);
	uint32_t	qh = rd32(b + 4);
	const uint8_t *qs = b + 8;
	int			j;

	for (j = 0; j < 16; j++)
	{
		int			lo = (qs[j] & 0x0F) | (int) (((qh >> j) & 1) << 4);
		int			hi = (qs[j] >> 4) | (int) (((qh >> (j + 16)) & 1) << 4);

		y[j] = (float) lo * d + m;
		y[j + 16] = (float) hi * d + m;
	}
}

static void
blk_q4_k(const uint8_t *b, float *y)
{
	float		d = half(b);
	float		dmin = half(b + 2);
	const uint8_t *sc = b + 4;
	const uint8_t *qs = b + 16;
	int			j,
				l;

	for (j = 0; j < 4; j++)
	{
		int			s0,
					m0,
					s1,
					m1;
		float		d0,
					n0,
					d1,
					n1;

		k_scale_min(sc, 2 * j, &s0, &m0);
		k_scale_min(sc, 2 * j + 1, &s1, &m1);
		d0 = d * (float) s0;
		n0 = dmin * (float) m0;
		d1 = d * (float) s1;
		n1 = dmin * (float) m1;
		for (l = 0; l < 32; l++)
		{
			y[64 * j + l] = d0 * (float) (qs[32 * j + l] & 0x0F) - n0;
			y[64 * j + 32 + l] = d1 * (float) (qs[32 * j + l] >> 4) - n1;
		}
	}
}

static void
blk_q5_k(const uint8_t *b, float *y)
{
	float		d = half(b);
	float		dmin = half(b + 2);
	const uint8_t *sc = b + 4;
	const uint8_t *qh = b + 16;
	const uint8_t *qs = b + 48;
	int			j,
				l;

	for (j = 0; j < 4; j++)
	{
		int			s0,
					m0,
					s1,
					m1;
		float		d0,
					n0,
					d1,
					n1;

		k_scale_min(sc, 2 * j, &s0, &m0);
		k_scale_min(sc, 2 * j + 1, &s1, &m1);
		d0 = d * (float) s0;
		n0 = dmin * (float) m0;
		d1 = d * (float) s1;
		n1 = dmin * (float) m1;
		for (l = 0; l < 32; l++)
		{
			int			lo = (qs[32 * j + l] & 0x0F) | (((qh[l] >> (2 * j)) & 1) << 4);
			int			hi = (qs[32 * j + l] >> 4) | (((qh[l] >> (2 * j + 1)) & 1) << 4);

			y[64 * j + l] = d0 * (float) lo - n0;
			y[64 * j + 32 + l] = d1 * (float) hi - n1;
		}
	}
}

static void
blk_q6_k(const uint8_t *b, float *y)
{
	float		d = half(b + 208);
	int			h,
				l;

	for (h = 0; h < 2; h++)
	{
		const uint8_t *ql = b + 64 * h;
		const uint8_t *qh = b + 128 + 32 * h;
		const int8_t *sc = (const int8_t *) (b + 192 + 8 * h);
		float	   *o = y + 128 * h;

		for (l = 0; l < 32; l++)
		{
			int			is = l / 16;
			int			q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
			int			q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
			int			q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
			int			q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;

			o[l] = d * (float) sc[is] * (float) q1;
			o[l + 32] = d * (float) sc[is + 2] * (float) q2;
			o[l + 64] = d * (float) sc[is + 4] * (float) q3;
			o[l + 96] = d * (float) sc[is + 6] * (float) q4;
		}
	}
}

typedef void (*blk_fn) (const uint8_t *b, float *y);

static blk_fn
scalar_block_fn(int fmt)
{
	switch (fmt)
	{
		case G4_W_Q8_0:
			return blk_q8_0;
		case G4_W_Q4_0:
			return blk_q4_0;
		case G4_W_Q4_1:
			return blk_q4_1;
		case G4_W_Q5_0:
			return blk_q5_0;
		case G4_W_Q5_1:
			return blk_q5_1;
		case G4_W_Q4_K:
			return blk_q4_k;
		case G4_W_Q5_K:
			return blk_q5_k;
		case G4_W_Q6_K:
			return blk_q6_k;
	}
	return NULL;
}

/*
 * Decode elements [k0, k0 + len) of a row into y.  k0 is a multiple of the
 * format's block size; len is too except at the end of an F32/F16/BF16 or
 * I4G32 row, whose last group may be partial.
 */
static void
decode_scalar(int fmt, const uint8_t *row, const uint16_t *scales,
			  int64_t k0, int64_t len, float *y)
{
	int64_t		i;

	switch (fmt)
	{
		case G4_W_F32:
			memcpy(y, row + 4 * k0, (size_t) len * 4);
			return;
		case G4_W_F16:
			for (i = 0; i < len; i++)
				y[i] = h2f(rd16(row + 2 * (k0 + i)));
			return;
		case G4_W_BF16:
			for (i = 0; i < len; i++)
				y[i] = g4_bf16_to_f32(rd16(row + 2 * (k0 + i)));
			return;
		case G4_W_I4G32:
			/* whole words, then the nibbles of a partial last word */
			for (i = 0; i + 8 <= len; i += 8)
			{
				int64_t		k = k0 + i;
				uint32_t	word = rd32(row + k / 2);
				float		s = g4_bf16_to_f32(scales[k / 32]);
				int			j;

				for (j = 0; j < 8; j++)
					y[i + j] = (float) ((int) ((word >> (4 * j)) & 0x0F) - 8) * s;
			}
			for (; i < len; i++)
			{
				int64_t		k = k0 + i;
				uint32_t	word = rd32(row + 4 * (k / 8));
				int			code = (int) ((word >> (4 * (k % 8))) & 0x0F);

				y[i] = (float) (code - 8) * g4_bf16_to_f32(scales[k / 32]);
			}
			return;
		default:
			{
				blk_fn		fn = scalar_block_fn(fmt);
				int			bs = formats[fmt].block;
				int			bb = formats[fmt].bytes;
				const uint8_t *b = row + (k0 / bs) * bb;

				for (i = 0; i + bs <= len; i += bs, b += bb)
					fn(b, y + i);
				return;
			}
	}
}

/* Sum of 8 partial sums: fixed pairwise order. */
static inline float
sum8(const float *s)
{
	return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

/* Number of elements a row of `in` really holds for this format: whole
 * blocks only (a partial block cannot be decoded). */
static inline int64_t
usable_len(int fmt, int64_t in)
{
	int			bs = formats[fmt].block;

	if (in <= 0)
		return 0;
	if (fmt == G4_W_I4G32 || bs == 1)
		return in;
	return in - in % bs;
}

static void
dequant_scalar(int fmt, const void *row, const uint16_t *scales, int64_t in,
			   float *out)
{
	int64_t		len = usable_len(fmt, in);

	if (len > 0)
		decode_scalar(fmt, (const uint8_t *) row, scales, 0, len, out);
}

/*
 * Portable dot: decode CHUNK elements once into a buffer, then for every
 * activation row accumulate into eight partial sums per row (so that the
 * longest chain of float additions is in/8 long, as in the AVX2 path).
 */
static void
dot_scalar(int fmt, const void *row, const uint16_t *scales, int64_t in,
		   const float *x, int64_t x_stride, int n, float *out, int64_t out_stride)
{
	float		buf[CHUNK];
	float		acc[TBLK][8];
	int64_t		len_all = usable_len(fmt, in);
	int			t0;

	for (t0 = 0; t0 < n; t0 += TBLK)
	{
		int			nt = G4_MIN(TBLK, n - t0);
		int64_t		k0;
		int			t;

		memset(acc, 0, sizeof(acc[0]) * (size_t) nt);
		for (k0 = 0; k0 < len_all; k0 += CHUNK)
		{
			int64_t		len = G4_MIN((int64_t) CHUNK, len_all - k0);

			decode_scalar(fmt, (const uint8_t *) row, scales, k0, len, buf);
			for (t = 0; t < nt; t++)
			{
				const float *xr = x + (int64_t) (t0 + t) * x_stride + k0;
				float		a0 = acc[t][0],
							a1 = acc[t][1],
							a2 = acc[t][2],
							a3 = acc[t][3],
							a4 = acc[t][4],
							a5 = acc[t][5],
							a6 = acc[t][6],
							a7 = acc[t][7];
				int64_t		i;

				/* separate locals: the sums stay in registers */
				for (i = 0; i + 8 <= len; i += 8)
				{
					a0 += buf[i] * xr[i];
					a1 += buf[i + 1] * xr[i + 1];
					a2 += buf[i + 2] * xr[i + 2];
					a3 += buf[i + 3] * xr[i + 3];
					a4 += buf[i + 4] * xr[i + 4];
					a5 += buf[i + 5] * xr[i + 5];
					a6 += buf[i + 6] * xr[i + 6];
					a7 += buf[i + 7] * xr[i + 7];
				}
				acc[t][0] = a0;
				acc[t][1] = a1;
				acc[t][2] = a2;
				acc[t][3] = a3;
				acc[t][4] = a4;
				acc[t][5] = a5;
				acc[t][6] = a6;
				acc[t][7] = a7;
				for (; i < len; i++)
					acc[t][i & 7] += buf[i] * xr[i];
			}
		}
		for (t = 0; t < nt; t++)
			out[(int64_t) (t0 + t) * out_stride] = sum8(acc[t]);
	}
}

/* ======================================================================== */
/* AVX2 + FMA + F16C kernels                                                 */
/* ======================================================================== */

#if G4_HAVE_X86_SIMD

#define AVX2_FN __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/*
 * Each format's block decoder is written once and instantiated twice by
 * constant-folding `mode`: EMIT_STORE writes the dequantised vectors to y
 * (dequantisation, and the buffer of the many-rows dot), EMIT_FMA multiplies
 * them straight into accumulators with one activation row (the n = 1 dot,
 * which then never stores the decoded weights).  Four accumulators take
 * turns so consecutive FMAs do not wait on each other.
 */
enum
{
	EMIT_STORE = 0,
	EMIT_FMA = 1
};

AVX2_INLINE void
emit8(int mode, __m256 v, float *y, const float *x, int off, __m256 *acc)
{
	if (mode == EMIT_STORE)
		_mm256_storeu_ps(y + off, v);
	else
		*acc = _mm256_fmadd_ps(v, _mm256_loadu_ps(x + off), *acc);
}

AVX2_INLINE float
hsum256(__m256 v)
{
	__m128		lo = _mm256_castps256_ps128(v);
	__m128		hi = _mm256_extractf128_ps(v, 1);

	lo = _mm_add_ps(lo, hi);
	lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
	lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
	return _mm_cvtss_f32(lo);
}

AVX2_INLINE float
half_avx(const uint8_t *p)
{
	return _cvtsh_ss(rd16(p));
}

/* Eight bytes -> eight int32 (zero- or sign-extended). */
AVX2_INLINE __m256i
u8x8(const uint8_t *p)
{
	return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *) p));
}

AVX2_INLINE __m256i
i8x8(const uint8_t *p)
{
	return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *) p));
}

/* -- plain formats: units of 32 elements (four vectors) -- */

AVX2_INLINE void
avx_f32(int mode, const uint8_t *b, float *y, const float *x, __m256 *acc)
{
	int			j;

#pragma GCC unroll 4
	for (j = 0; j < 4; j++)
		emit8(mode, _mm256_loadu_ps((const float *) (b + 32 * j)), y, x, 8 * j, &acc[j]);
}

AVX2_INLINE void
avx_f16(int mode, const uint8_t *b, float *y, const float *x, __m256 *acc)
{
	int			j;

#pragma GCC unroll 4
	for (j = 0; j < 4; j++)
		emit8(mode, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (b + 16 * j))),
			  y, x, 8 * j, &acc[j]);
}

AVX2_INLINE void
avx_bf16(int mode, const uint8_t *b, float *y, const float *x, __m256 *acc)
{
	int			j;

#pragma GCC unroll 4
	for (j = 0; j < 4; j++)
	{
		__m256i		h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *) (b + 16 * j)));

		emit8(mode, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)), y, x, 8 * j, &acc[j]);
	}
}

/* -- I4G32: one group of 32 columns = 4 words + 1 scale -- */

AVX2_INLINE void
avx_i4g32(int mode, const uint8_t *b, uint16_t scale, float *y, const float *x,
		  __m256 *acc)
{
	const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
	const __m256i mask = _mm256_set1_epi32(0x0F);
	const __m256i eight = _mm256_set1_epi32(8);
	__m256		s = _mm256_set1_ps(g4_bf16_to_f32(scale));
	int			j;

#pragma GCC unroll 4
	for (j = 0; j < 4; j++)
	{
		__m256i		w = _mm256_set1_epi32((int) rd32(b + 4 * j));
		__m256i		q = _mm256_sub_epi32(_mm256_and_si256(_mm256_srlv_epi32(w, shifts), mask), eight);

		emit8(mode, _mm256_mul_ps(_mm256_cvtepi32_ps(q), s), y, x, 8 * j, &acc[j]);
	}
}

/* -- legacy 32-element blocks -- */

AVX2_INLINE void
avx_q8_0(int mode, const uint8_t *b, float *y, const float *x, __m256 *acc)
{
	__m256		d = _mm256_set1_ps(half_avx(b));
	int			i;

#pragma GCC unroll 4
	for (i = 0; i < 4; i++)
	{
		__m256		q = _mm256_cvtepi32_ps(i8x8(b + 2 + 8 * i));

		emit8(mode, _mm256_mul_ps(q, d), y, x, 8 * i, &acc[i]);
	}
}

/*
 * Low and high nibbles of qs[8h .. 8h+7] are elements 8h.. and 16+8h.. of
 * the block.  For the 5-bit formats the fifth bit of element e is bit e of
 * qh: two broadcasts of qh, pre-shifted so that a per-lane right shift by
 * lane (+ 8) lands bit e at bit 4 (qh << 4 serves elements 0-15, qh >> 12
 * elements 16-31).  Q5_0 then subtracts 16 where the bit is clear, which is
 * (nibble | bit << 4) - 16 in one step.
 */
AVX2_INLINE void
avx_q4_legacy(int mode, int has_min, int has_qh, const uint8_t *b,
			  float *y, const float *x, __m256 *acc)
{
	const __m256i mask = _mm256_set1_epi32(0x0F);
	const __m256i bit4 = _mm256_set1_epi32(0x10);
	__m256		d = _mm256_set1_ps(half_avx(b));
	__m256		m = _mm256_setzero_ps();
	__m256i		qlo = _mm256_setzero_si256(),
				qhi = _mm256_setzero_si256();
	const uint8_t *qs;
	int			h;

	if (has_min)
		m = _mm256_set1_ps(half_avx(b + 2));
	if (has_qh)
	{
		uint32_t	qh = rd32(b + (has_min ? 4 : 2));

		qlo = _mm256_set1_epi32((int) (qh << 4));
		qhi = _mm256_set1_epi32((int) (qh >> 12));
	}
	qs = b + 2 + (has_min ? 2 : 0) + (has_qh ? 4 : 0);

#pragma GCC unroll 2
	for (h = 0; h < 2; h++)
	{
		const __m256i lane = _mm256_setr_epi32(8 * h, 8 * h + 1, 8 * h + 2, 8 * h + 3,
											   8 * h + 4, 8 * h + 5, 8 * h + 6, 8 * h + 7);
		__m256i		v = u8x8(qs + 8 * h);
		__m256i		lo = _mm256_and_si256(v, mask);
		__m256i		hi = _mm256_srli_epi32(v, 4);
		__m256		flo,
					fhi;

		if (has_qh && has_min)
		{
			lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_srlv_epi32(qlo, lane), bit4));
			hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_srlv_epi32(qhi, lane), bit4));
		}
		else if (has_qh)
		{
			lo = _mm256_sub_epi32(lo, _mm256_andnot_si256(_mm256_srlv_epi32(qlo, lane), bit4));
			hi = _mm256_sub_epi32(hi, _mm256_andnot_si256(_mm256_srlv_epi32(qhi, lane), bit4));
		}
		else if (!has_min)
		{
			lo = _mm256_sub_epi32(lo, _mm256_set1_epi32(8));
			hi = _mm256_sub_epi32(hi, _mm256_set1_epi32(8));
		}
		if (has_min)
		{
			flo = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(lo), d), m);
			fhi = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(hi), d), m);
		}
		else
		{
			flo = _mm256_mul_ps(_mm256_cvtepi32_ps(lo), d);
			fhi = _mm256_mul_ps(_mm256_cvtepi32_ps(hi), d);
		}
		emit8(mode, flo, y, x, 8 * h, &acc[h]);
		emit8(mode, fhi, y, x, 16 + 8 * h, &acc[2 + h]);
	}
}

/* -- K-quants: 256-element super-blocks -- */

/* Bit i (0..7) of each lane moved to bit 4 (i is a constant after
 * unrolling, so this is one immediate shift). */
AVX2_INLINE __m256i
bit_to_4(__m256i v, int i)
{
	if (i <= 4)
		return _mm256_slli_epi32(v, 4 - i);
	return _mm256_srli_epi32(v, i - 4);
}

/*
 * The eight 6-bit scales and mins of a Q4_K/Q5_K block, unpacked a 32-bit
 * word at a time (bytes 0-3 = a, 4-7 = b, 8-11 = c, see k_scale_min):
 * scales 0-3 = a & 63, mins 0-3 = b & 63, scales 4-7 = low nibbles of c with
 * the top two bits of a's bytes above them, mins 4-7 = high nibbles of c
 * with the top two bits of b's bytes.  Returns d*scale and dmin*min as
 * vectors (one lane per sub-block).
 */
AVX2_INLINE void
k_scales_avx(const uint8_t *s, float d, float dmin, __m256 *dsc, __m256 *dmn)
{
	uint32_t	a = rd32(s),
				b = rd32(s + 4),
				c = rd32(s + 8);
	uint64_t	sc = (uint64_t) (a & 0x3F3F3F3Fu) |
		(uint64_t) ((c & 0x0F0F0F0Fu) | ((a >> 2) & 0x30303030u)) << 32;
	uint64_t	mn = (uint64_t) (b & 0x3F3F3F3Fu) |
		(uint64_t) (((c >> 4) & 0x0F0F0F0Fu) | ((b >> 2) & 0x30303030u)) << 32;

	*dsc = _mm256_mul_ps(_mm256_set1_ps(d),
						 _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long) sc))));
	*dmn = _mm256_mul_ps(_mm256_set1_ps(dmin),
						 _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long) mn))));
}

AVX2_INLINE void
avx_q45_k(int mode, int five, const uint8_t *b, float *y, const float *x,
		  __m256 *acc)
{
	const __m256i mask = _mm256_set1_epi32(0x0F);
	const __m256i bit4 = _mm256_set1_epi32(0x10);
	const uint8_t *qh = b + 16;
	const uint8_t *qs = b + (five ? 48 : 16);
	float		dsc[8] __attribute__((aligned(32)));
	float		dmn[8] __attribute__((aligned(32)));
	__m256		vs,
				vm;
	int			j,
				h;

	/* per-sub-block factors, stored so each is one broadcast load below */
	k_scales_avx(b + 4, half_avx(b), half_avx(b + 2), &vs, &vm);
	_mm256_store_ps(dsc, vs);
	_mm256_store_ps(dmn, vm);

	/* j: pair of sub-blocks 2j (low nibbles) and 2j+1 (high nibbles) */
#pragma GCC unroll 4
	for (j = 0; j < 4; j++)
	{
		__m256		d0 = _mm256_broadcast_ss(&dsc[2 * j]);
		__m256		n0 = _mm256_broadcast_ss(&dmn[2 * j]);
		__m256		d1 = _mm256_broadcast_ss(&dsc[2 * j + 1]);
		__m256		n1 = _mm256_broadcast_ss(&dmn[2 * j + 1]);

#pragma GCC unroll 4
		for (h = 0; h < 4; h++)
		{
			__m256i		v = u8x8(qs + 32 * j + 8 * h);
			__m256i		lo = _mm256_and_si256(v, mask);
			__m256i		hi = _mm256_srli_epi32(v, 4);

			if (five)
			{
				__m256i		hb = u8x8(qh + 8 * h);

				lo = _mm256_or_si256(lo, _mm256_and_si256(bit_to_4(hb, 2 * j), bit4));
				hi = _mm256_or_si256(hi, _mm256_and_si256(bit_to_4(hb, 2 * j + 1), bit4));
			}
			emit8(mode, _mm256_sub_ps(_mm256_mul_ps(d0, _mm256_cvtepi32_ps(lo)), n0),
				  y, x, 64 * j + 8 * h, &acc[h & 1]);
			emit8(mode, _mm256_sub_ps(_mm256_mul_ps(d1, _mm256_cvtepi32_ps(hi)), n1),
				  y, x, 64 * j + 32 + 8 * h, &acc[2 + (h & 1)]);
		}
	}
}

AVX2_INLINE void
avx_q6_k(int mode, const uint8_t *b, float *y, const float *x, __m256 *acc)
{
	const __m256i mask = _mm256_set1_epi32(0x0F);
	const __m256i m30 = _mm256_set1_epi32(0x30);
	const __m256i b32 = _mm256_set1_epi32(32);
	__m256		d = _mm256_set1_ps(half_avx(b + 208));
	float		ds[16] __attribute__((aligned(32)));
	int			hf,
				h;

	/* d * scale for the 16 sub-blocks of 16, as the reference (d*sc)*q */
	_mm256_store_ps(ds, _mm256_mul_ps(d, _mm256_cvtepi32_ps(i8x8(b + 192))));
	_mm256_store_ps(ds + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(i8x8(b + 200))));

#pragma GCC unroll 2
	for (hf = 0; hf < 2; hf++)
	{
		const uint8_t *ql = b + 64 * hf;
		const uint8_t *qh = b + 128 + 32 * hf;
		const float *sc = ds + 8 * hf;
		int			o = 128 * hf;

#pragma GCC unroll 4
		for (h = 0; h < 4; h++)
		{
			int			is = h / 2;
			__m256i		a = u8x8(ql + 8 * h);
			__m256i		c = u8x8(ql + 32 + 8 * h);
			__m256i		e = u8x8(qh + 8 * h);
			__m256i		q1 = _mm256_or_si256(_mm256_and_si256(a, mask),
											 _mm256_and_si256(_mm256_slli_epi32(e, 4), m30));
			__m256i		q2 = _mm256_or_si256(_mm256_and_si256(c, mask),
											 _mm256_and_si256(_mm256_slli_epi32(e, 2), m30));
			__m256i		q3 = _mm256_or_si256(_mm256_srli_epi32(a, 4),
											 _mm256_and_si256(e, m30));
			__m256i		q4 = _mm256_or_si256(_mm256_srli_epi32(c, 4),
											 _mm256_and_si256(_mm256_srli_epi32(e, 2), m30));

			emit8(mode, _mm256_mul_ps(_mm256_broadcast_ss(&sc[is]),
									  _mm256_cvtepi32_ps(_mm256_sub_epi32(q1, b32))),
				  y, x, o + 8 * h, &acc[0]);
			emit8(mode, _mm256_mul_ps(_mm256_broadcast_ss(&sc[is + 2]),
									  _mm256_cvtepi32_ps(_mm256_sub_epi32(q2, b32))),
				  y, x, o + 32 + 8 * h, &acc[1]);
			emit8(mode, _mm256_mul_ps(_mm256_broadcast_ss(&sc[is + 4]),
									  _mm256_cvtepi32_ps(_mm256_sub_epi32(q3, b32))),
				  y, x, o + 64 + 8 * h, &acc[2]);
			emit8(mode, _mm256_mul_ps(_mm256_broadcast_ss(&sc[is + 6]),
									  _mm256_cvtepi32_ps(_mm256_sub_epi32(q4, b32))),
				  y, x, o + 96 + 8 * h, &acc[3]);
		}
	}
}

/*
 * One "unit" of a format at element offset k (a multiple of the unit):
 * 32 elements for plain formats, a 32-column group for I4G32, one block
 * otherwise.  Always inlined, so the switch on the constant fmt folds away
 * inside the per-format instantiations below.
 */
AVX2_INLINE void
avx_unit(int mode, int fmt, const uint8_t *row, const uint16_t *scales,
		 int64_t k, float *y, const float *x, __m256 *acc)
{
	switch (fmt)
	{
		case G4_W_F32:
			avx_f32(mode, row + 4 * k, y, x, acc);
			break;
		case G4_W_F16:
			avx_f16(mode, row + 2 * k, y, x, acc);
			break;
		case G4_W_BF16:
			avx_bf16(mode, row + 2 * k, y, x, acc);
			break;
		case G4_W_I4G32:
			avx_i4g32(mode, row + k / 2, scales[k / 32], y, x, acc);
			break;
		case G4_W_Q8_0:
			avx_q8_0(mode, row + (k / 32) * 34, y, x, acc);
			break;
		case G4_W_Q4_0:
			avx_q4_legacy(mode, 0, 0, row + (k / 32) * 18, y, x, acc);
			break;
		case G4_W_Q4_1:
			avx_q4_legacy(mode, 1, 0, row + (k / 32) * 20, y, x, acc);
			break;
		case G4_W_Q5_0:
			avx_q4_legacy(mode, 0, 1, row + (k / 32) * 22, y, x, acc);
			break;
		case G4_W_Q5_1:
			avx_q4_legacy(mode, 1, 1, row + (k / 32) * 24, y, x, acc);
			break;
		case G4_W_Q4_K:
			avx_q45_k(mode, 0, row + (k / 256) * 144, y, x, acc);
			break;
		case G4_W_Q5_K:
			avx_q45_k(mode, 1, row + (k / 256) * 176, y, x, acc);
			break;
		case G4_W_Q6_K:
			avx_q6_k(mode, row + (k / 256) * 210, y, x, acc);
			break;
	}
}

static inline int
avx_unit_len(int fmt)
{
	int			bs = formats[fmt].block;

	return bs == 1 ? 32 : bs;
}

/*
 * Decode [k0, k0+len) into y with whole units; returns how many elements
 * were decoded (the rest, < one unit, is left to the scalar decoder).
 */
AVX2_INLINE int64_t
avx_decode_units(int fmt, const uint8_t *row, const uint16_t *scales,
				 int64_t k0, int64_t len, float *y)
{
	int			u = avx_unit_len(fmt);
	__m256		unused[4];		/* accumulators are not touched when storing */
	int64_t		i;

	unused[0] = unused[1] = unused[2] = unused[3] = _mm256_setzero_ps();
	for (i = 0; i + u <= len; i += u)
		avx_unit(EMIT_STORE, fmt, row, scales, k0 + i, y + i, NULL, unused);
	return i;
}

/* n = 1: decode and multiply in one pass.  Returns the decoded length. */
AVX2_INLINE float
avx_dot1_units(int fmt, const uint8_t *row, const uint16_t *scales,
			   int64_t len, const float *x, int64_t *done)
{
	int			u = avx_unit_len(fmt);
	__m256		acc[4];
	int64_t		i;

	acc[0] = _mm256_setzero_ps();
	acc[1] = _mm256_setzero_ps();
	acc[2] = _mm256_setzero_ps();
	acc[3] = _mm256_setzero_ps();
	for (i = 0; i + u <= len; i += u)
		avx_unit(EMIT_FMA, fmt, row, scales, i, NULL, x + i, acc);
	*done = i;
	return hsum256(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]),
								 _mm256_add_ps(acc[2], acc[3])));
}

/* Per-format instantiations (fmt constant -> specialised code). */
#define AVX_INSTANCE(NAME, FMT) \
static AVX2_FN int64_t \
avx_dec_##NAME(const uint8_t *row, const uint16_t *scales, int64_t k0, \
			   int64_t len, float *y) \
{ \
	return avx_decode_units(FMT, row, scales, k0, len, y); \
} \
static AVX2_FN float \
avx_dot1_##NAME(const uint8_t *row, const uint16_t *scales, int64_t len, \
				const float *x, int64_t *done) \
{ \
	return avx_dot1_units(FMT, row, scales, len, x, done); \
}

AVX_INSTANCE(f32, G4_W_F32)
AVX_INSTANCE(f16, G4_W_F16)
AVX_INSTANCE(bf16, G4_W_BF16)
AVX_INSTANCE(i4g32, G4_W_I4G32)
AVX_INSTANCE(q8_0, G4_W_Q8_0)
AVX_INSTANCE(q4_0, G4_W_Q4_0)
AVX_INSTANCE(q4_1, G4_W_Q4_1)
AVX_INSTANCE(q5_0, G4_W_Q5_0)
AVX_INSTANCE(q5_1, G4_W_Q5_1)
AVX_INSTANCE(q4_k, G4_W_Q4_K)
AVX_INSTANCE(q5_k, G4_W_Q5_K)
AVX_INSTANCE(q6_k, G4_W_Q6_K)

typedef int64_t (*avx_dec_fn) (const uint8_t *, const uint16_t *, int64_t, int64_t, float *);
typedef float (*avx_dot1_fn) (const uint8_t *, const uint16_t *, int64_t, const float *, int64_t *);

static const avx_dec_fn avx_dec[G4_W_FORMAT_COUNT] = {
	avx_dec_f32, avx_dec_f16, avx_dec_bf16, avx_dec_i4g32, avx_dec_q8_0,
	avx_dec_q4_0, avx_dec_q4_1, avx_dec_q5_0, avx_dec_q5_1, avx_dec_q4_k,
	avx_dec_q5_k, avx_dec_q6_k
};

static const avx_dot1_fn avx_dot1[G4_W_FORMAT_COUNT] = {
	avx_dot1_f32, avx_dot1_f16, avx_dot1_bf16, avx_dot1_i4g32, avx_dot1_q8_0,
	avx_dot1_q4_0, avx_dot1_q4_1, avx_dot1_q5_0, avx_dot1_q5_1, avx_dot1_q4_k,
	avx_dot1_q5_k, avx_dot1_q6_k
};

static AVX2_FN void
dequant_avx2(int fmt, const void *row, const uint16_t *scales, int64_t in,
			 float *out)
{
	int64_t		len = usable_len(fmt, in);
	int64_t		done;

	if (len <= 0)
		return;
	done = avx_dec[fmt] ((const uint8_t *) row, scales, 0, len, out);
	if (done < len)
		decode_scalar(fmt, (const uint8_t *) row, scales, done, len - done, out + done);
}

/*
 * Batch invariance: a row's dot product must not depend on how many
 * activation rows it is multiplied with (the engine batches sequences, and
 * a sequence's output must not change with its company).  So the many-rows
 * path adds exactly what the one-row path adds, in the same order: each
 * format's fused decoder (EMIT_FMA above) sends the 8-element vector at
 * vector index v of the row to one of four accumulators, acc_slot(v) below,
 * in increasing v; the four are then summed as (a0 + a1) + (a2 + a3),
 * reduced across lanes, and the elements after the last whole unit are
 * added one by one.
 */
enum
{
	SLOTS_PLAIN = 0,			/* period 4 vectors: v % 4 */
	SLOTS_K45 = 1,				/* Q4_K/Q5_K, period 8: (v % 8 < 4 ? 0 : 2) + v % 2 */
	SLOTS_Q6K = 2				/* Q6_K, period 16: (v % 16) / 4 */
};

static inline int
slot_class(int fmt)
{
	if (fmt == G4_W_Q4_K || fmt == G4_W_Q5_K)
		return SLOTS_K45;
	if (fmt == G4_W_Q6_K)
		return SLOTS_Q6K;
	return SLOTS_PLAIN;
}

AVX2_INLINE int
acc_slot(int cls, int v)
{
	switch (cls)
	{
		case SLOTS_K45:
			return ((v & 7) < 4 ? 0 : 2) + (v & 1);
		case SLOTS_Q6K:
			return (v & 15) / 4;
	}
	return v & 3;
}

AVX2_INLINE int
slot_period(int cls)
{
	return cls == SLOTS_Q6K ? 16 : cls == SLOTS_K45 ? 8 : 4;
}

/*
 * Multiply-accumulate decoded weights w[0 .. nvec*8) (nvec a multiple of
 * the class period) into four accumulators per activation row, for two rows
 * (acc[0..3], acc[4..7]) or one.  The inner loop is unrolled over one
 * period, so every slot index is a constant.
 */
AVX2_INLINE void
mac2(int cls, const float *w, int64_t nvec, const float *x0, const float *x1, __m256 *acc)
{
	__m256		a[8];
	int			period = slot_period(cls);
	int64_t		v;
	int			u;

	for (u = 0; u < 8; u++)
		a[u] = acc[u];
	for (v = 0; v < nvec; v += period)
	{
#pragma GCC unroll 16
		for (u = 0; u < 16; u++)
		{
			if (u < period)
			{
				int			m = acc_slot(cls, u);
				__m256		wv = _mm256_load_ps(w + 8 * (v + u));

				a[m] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x0 + 8 * (v + u)), a[m]);
				a[4 + m] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x1 + 8 * (v + u)), a[4 + m]);
			}
		}
	}
	for (u = 0; u < 8; u++)
		acc[u] = a[u];
}

AVX2_INLINE void
mac1(int cls, const float *w, int64_t nvec, const float *x0, __m256 *acc)
{
	__m256		a[4];
	int			period = slot_period(cls);
	int64_t		v;
	int			u;

	for (u = 0; u < 4; u++)
		a[u] = acc[u];
	for (v = 0; v < nvec; v += period)
	{
#pragma GCC unroll 16
		for (u = 0; u < 16; u++)
		{
			if (u < period)
			{
				int			m = acc_slot(cls, u);

				a[m] = _mm256_fmadd_ps(_mm256_load_ps(w + 8 * (v + u)), _mm256_loadu_ps(x0 + 8 * (v + u)), a[m]);
			}
		}
	}
	for (u = 0; u < 4; u++)
		acc[u] = a[u];
}

/* Instantiated per slot class so that cls is a constant inside. */
#define MAC_INSTANCE(NAME, CLS) \
static AVX2_FN void \
mac2_##NAME(const float *w, int64_t nvec, const float *x0, const float *x1, __m256 *acc) \
{ \
	mac2(CLS, w, nvec, x0, x1, acc); \
} \
static AVX2_FN void \
mac1_##NAME(const float *w, int64_t nvec, const float *x0, __m256 *acc) \
{ \
	mac1(CLS, w, nvec, x0, acc); \
}

MAC_INSTANCE(plain, SLOTS_PLAIN)
MAC_INSTANCE(k45, SLOTS_K45)
MAC_INSTANCE(q6k, SLOTS_Q6K)

static AVX2_FN void
dot_avx2(int fmt, const void *row, const uint16_t *scales, int64_t in,
		 const float *x, int64_t x_stride, int n, float *out, int64_t out_stride)
{
	const uint8_t *r = (const uint8_t *) row;
	int64_t		len_all = usable_len(fmt, in);
	int64_t		unit = avx_unit_len(fmt);
	int64_t		whole = len_all - len_all % unit;	/* decoded by the vector kernels */
	int			cls = slot_class(fmt);
	float		buf[CHUNK] __attribute__((aligned(32)));
	float		tailw[32];
	__m256		acc[TBLK][4];
	int			t0;

	if (n == 1)
	{
		int64_t		done = 0;
		float		s = 0.0f;
		int64_t		i;

		if (len_all > 0)
			s = avx_dot1[fmt] (r, scales, len_all, x, &done);
		if (done < len_all)
		{
			/* fewer than one unit of trailing elements (plain formats) */
			decode_scalar(fmt, r, scales, done, len_all - done, buf);
			for (i = 0; i < len_all - done; i++)
				s += buf[i] * x[done + i];
		}
		out[0] = s;
		return;
	}

	if (whole < len_all)
		decode_scalar(fmt, r, scales, whole, len_all - whole, tailw);
	for (t0 = 0; t0 < n; t0 += TBLK)
	{
		int			nt = G4_MIN(TBLK, n - t0);
		const float *xt = x + (int64_t) t0 * x_stride;
		int64_t		k0;
		int			t;

		for (t = 0; t < nt; t++)
			acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = _mm256_setzero_ps();
		/* CHUNK is a multiple of every unit and period: slots line up */
		for (k0 = 0; k0 < whole; k0 += CHUNK)
		{
			int64_t		len = G4_MIN((int64_t) CHUNK, whole - k0);
			int64_t		nvec = len / 8;

			avx_dec[fmt] (r, scales, k0, len, buf);
			for (t = 0; t + 2 <= nt; t += 2)
			{
				const float *x0 = xt + t * x_stride + k0;
				__m256		a[8];
				int			u;

				for (u = 0; u < 4; u++)
				{
					a[u] = acc[t][u];
					a[4 + u] = acc[t + 1][u];
				}
				if (cls == SLOTS_K45)
					mac2_k45(buf, nvec, x0, x0 + x_stride, a);
				else if (cls == SLOTS_Q6K)
					mac2_q6k(buf, nvec, x0, x0 + x_stride, a);
				else
					mac2_plain(buf, nvec, x0, x0 + x_stride, a);
				for (u = 0; u < 4; u++)
				{
					acc[t][u] = a[u];
					acc[t + 1][u] = a[4 + u];
				}
			}
			for (; t < nt; t++)
			{
				if (cls == SLOTS_K45)
					mac1_k45(buf, nvec, xt + t * x_stride + k0, acc[t]);
				else if (cls == SLOTS_Q6K)
					mac1_q6k(buf, nvec, xt + t * x_stride + k0, acc[t]);
				else
					mac1_plain(buf, nvec, xt + t * x_stride + k0, acc[t]);
			}
		}
		for (t = 0; t < nt; t++)
		{
			float		s = hsum256(_mm256_add_ps(_mm256_add_ps(acc[t][0], acc[t][1]),
											  _mm256_add_ps(acc[t][2], acc[t][3])));
			int64_t		i;

			for (i = whole; i < len_all; i++)
				s += tailw[i - whole] * xt[t * x_stride + i];
			out[(int64_t) (t0 + t) * out_stride] = s;
		}
	}
}

#endif							/* G4_HAVE_X86_SIMD */

/* ======================================================================== */
/* dispatch                                                                  */
/* ======================================================================== */

/*
 * Whether the AVX2 kernels can run here: AVX2, FMA and F16C in CPUID and
 * the YMM state enabled by the OS (XCR0).  CPUID is read directly because
 * not every compiler's __builtin_cpu_supports knows "f16c", and only once,
 * since in a virtual machine CPUID traps to the hypervisor.  The cached
 * answer is the file's only mutable global; concurrent first calls compute
 * the same value, and the atomic makes that race well defined.
 */
int			g4_quant_simd_available(void);
void		g4_dequant_row_path(int path, int fmt, const void *row,
								const uint16_t *scales, int64_t in, float *out);
void		g4_dot_row_path(int path, int fmt, const void *row,
							const uint16_t *scales, int64_t in, const float *x,
							int64_t x_stride, int n, float *out, int64_t out_stride);

#if G4_HAVE_X86_SIMD
static int
detect_avx2(void)
{
	unsigned int a,
				b,
				c,
				d;
	unsigned int xlo,
				xhi;

	if (!__get_cpuid(1, &a, &b, &c, &d))
		return 0;
	/* FMA (bit 12), OSXSAVE (27), AVX (28), F16C (29) */
	if (((c >> 12) & 1) == 0 || ((c >> 27) & 1) == 0 ||
		((c >> 28) & 1) == 0 || ((c >> 29) & 1) == 0)
		return 0;
	__asm__ volatile ("xgetbv" : "=a" (xlo), "=d" (xhi) : "c" (0));
	if ((xlo & 6) != 6)			/* XMM and YMM state saved by the OS */
		return 0;
	if (__get_cpuid_max(0, NULL) < 7)
		return 0;
	__cpuid_count(7, 0, a, b, c, d);
	return (b >> 5) & 1;		/* AVX2 */
}

static _Atomic int simd_level = -1;
#endif

int
g4_quant_simd_available(void)
{
#if G4_HAVE_X86_SIMD
	int			v = atomic_load_explicit(&simd_level, memory_order_relaxed);

	if (v < 0)
	{
		v = detect_avx2();
		atomic_store_explicit(&simd_level, v, memory_order_relaxed);
	}
	return v;
#else
	return 0;
#endif
}

/*
 * Explicit kernel choice (path 0: portable scalar, 1: AVX2 when the CPU has
 * it, else scalar), used by the tests and the benchmark to cover both paths.
 */
void
g4_dequant_row_path(int path, int fmt, const void *row, const uint16_t *scales,
					int64_t in, float *out)
{
	if (fmt < 0 || fmt >= G4_W_FORMAT_COUNT)
		return;
#if G4_HAVE_X86_SIMD
	if (path == 1 && g4_quant_simd_available())
	{
		dequant_avx2(fmt, row, scales, in, out);
		return;
	}
#endif
	dequant_scalar(fmt, row, scales, in, out);
}

void
g4_dot_row_path(int path, int fmt, const void *row, const uint16_t *scales,
				int64_t in, const float *x, int64_t x_stride, int n,
				float *out, int64_t out_stride)
{
	if (fmt < 0 || fmt >= G4_W_FORMAT_COUNT || n <= 0)
		return;
#if G4_HAVE_X86_SIMD
	if (path == 1 && g4_quant_simd_available())
	{
		dot_avx2(fmt, row, scales, in, x, x_stride, n, out, out_stride);
		return;
	}
#endif
	dot_scalar(fmt, row, scales, in, x, x_stride, n, out, out_stride);
}

void
g4_dequant_row(int fmt, const void *row, const uint16_t *scales, int64_t in,
			   float *out)
{
	g4_dequant_row_path(1, fmt, row, scales, in, out);
}

void
g4_dot_row(int fmt, const void *row, const uint16_t *scales, int64_t in,
		   const float *x, int64_t x_stride, int n, float *out, int64_t out_stride)
{
	g4_dot_row_path(1, fmt, row, scales, in, x, x_stride, n, out, out_stride);
}

/*
 * Symmetric int4, group 32, as compressed-tensors writes it.  Choice: the
 * group scale is max|w| / 7.5 computed in float32 and then rounded to the
 * nearest-even bf16, and the codes are chosen by dividing by that stored
 * bf16 scale (not the unrounded one), so that (code - 8) * scale is the
 * nearest representable value for every weight the clamp lets through.
 * q = clamp(round-half-even(w / scale), -8, 7); an all-zero group gets scale
 * 0 and code 8.  A partial last group (in % 32 != 0) is quantised over its
 * own elements; unused nibbles of a partial last word hold code 8 (zero).
 */
void
g4_quant_row_i4g32(const float *w, int64_t in, uint32_t *packed, uint16_t *scales)
{
	int64_t		g0;
	int64_t		nwords = (in + 7) / 8;

	if (in <= 0)
		return;
	memset(packed, 0, (size_t) nwords * 4);
	for (g0 = 0; g0 < in; g0 += 32)
	{
		int64_t		glen = G4_MIN((int64_t) 32, in - g0);
		float		amax = 0.0f;
		float		s;
		uint16_t	sb;
		int64_t		i;

		for (i = 0; i < glen; i++)
		{
			float		a = fabsf(w[g0 + i]);

			if (a > amax)		/* NaN never compares greater */
				amax = a;
		}
		sb = g4_f32_to_bf16(amax / 7.5f);
		s = g4_bf16_to_f32(sb);
		scales[g0 / 32] = sb;
		for (i = 0; i < glen; i++)
		{
			int64_t		k = g0 + i;
			float		r = (s > 0.0f && isfinite(s)) ? nearbyintf(w[k] / s) : 0.0f;
			int			q;

			if (!(r == r))		/* NaN weight */
				q = 0;
			else if (r < -8.0f)
				q = -8;
			else if (r > 7.0f)
				q = 7;
			else
				q = (int) r;
			packed[k / 8] |= (uint32_t) (q + 8) << (4 * (k % 8));
		}
		/* pad the unused nibbles of a partial last word with code 8 */
		for (i = glen; i < 32 && (g0 + i) < nwords * 8; i++)
		{
			int64_t		k = g0 + i;

			packed[k / 8] |= 8u << (4 * (k % 8));
		}
	}
}
