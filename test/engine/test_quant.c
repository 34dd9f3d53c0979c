/*
 * test_quant.c — weight-format kernels (quant.c).
 *
 *  - every format: random rows -> g4_dequant_row (AVX2 and scalar paths)
 *    compared bit for bit with a decoder written here, element by element,
 *    straight from the format definitions;
 *  - g4_dot_row (both paths, many n, strided x and out) against the exact
 *    dequantised values and a float64 dot, and exactly against one-hot
 *    activations;
 *  - the int4 group-32 quantiser (scale rounding, ties, clamping, padding);
 *  - golden rows and whole-tensor checksums of the real GGUF model from
 *    test/reference/golden_gguf.py (gguf-py's numpy dequantisers), when
 *    G4_GGUF_MODEL names that model.
 */
#include "test.h"

#include <stdint.h>
#include <unistd.h>

#include "backend.h"
#include "gguf.h"
#include "quant.h"
#include "util.h"


/* ---- helpers ------------------------------------------------------------ */

typedef struct
{
	uint64_t	s;
} rng_t;

static uint64_t
rng_next(rng_t *r)
{
	/* xorshift64* */
	r->s ^= r->s >> 12;
	r->s ^= r->s << 25;
	r->s ^= r->s >> 27;
	return r->s * 2685821657736338717ull;
}

static float
rng_unit(rng_t *r)				/* [-1, 1) */
{
	return (float) ((double) (rng_next(r) >> 11) / 4503599627370496.0 - 1.0);
}

static uint16_t
get16(const uint8_t *p)
{
	return (uint16_t) (p[0] | (p[1] << 8));
}

static uint32_t
get32(const uint8_t *p)
{
	return (uint32_t) p[0] | ((uint32_t) p[1] << 8) | ((uint32_t) p[2] << 16) |
		((uint32_t) p[3] << 24);
}

static void
put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t) v;
	p[1] = (uint8_t) (v >> 8);
}

/* IEEE half -> float from the definition (not util.c's converter). */
static float
ref_half(uint16_t h)
{
	int			sign = h >> 15;
	int			e = (h >> 10) & 31;
	int			m = h & 1023;
	double		v;

	if (e == 0)
		v = ldexp((double) m, -24);
	else if (e == 31)
		v = m ? NAN : INFINITY;
	else
		v = ldexp((double) (m + 1024), e - 25);
	return (float) (sign ? -v : v);
}

static float
ref_bf16(uint16_t h)
{
	uint32_t	u = (uint32_t) h << 16;
	float		f;

	memcpy(&f, &u, 4);
	return f;
}

/* Random finite half with exponent field in [0, 20]: zero, subnormals and
 * normals up to 64, both signs. */
static uint16_t
rand_half(rng_t *r)
{
	uint64_t	v = rng_next(r);
	int			e = (int) ((v >> 20) % 21);

	return (uint16_t) (((v >> 40) & 1) << 15 | (uint16_t) e << 10 | (v & 1023));
}

static int
same_bits(float a, float b)
{
	return memcmp(&a, &b, 4) == 0;
}

/* ---- the reference decoder: element k of a row -------------------------- */

/* j-th 6-bit scale (which = 0) or min (which = 1) of a Q4_K/Q5_K block,
 * from the bit-field description: bytes 0-3 hold scales 0-3 in bits 0-5 and
 * the top two bits of scales 4-7 in bits 6-7; bytes 4-7 the same for mins;
 * bytes 8-11 hold the low four bits of scale 4-7 (low nibble) and of min
 * 4-7 (high nibble). */
static int
ref_k_scale(const uint8_t *s, int j, int which)
{
	if (j < 4)
		return s[j + 4 * which] & 0x3F;
	{
		int			low4 = which ? (s[j + 4] >> 4) : (s[j + 4] & 0x0F);
		int			top2 = (s[(j - 4) + 4 * which] & 0xC0) >> 6;

		return low4 | (top2 << 4);
	}
}

static float
ref_elem(int fmt, const uint8_t *row, const uint16_t *scales, int64_t k)
{
	switch (fmt)
	{
		case G4_W_F32:
			{
				uint32_t	u = get32(row + 4 * k);
				float		f;

				memcpy(&f, &u, 4);
				return f;
			}
		case G4_W_F16:
			return ref_half(get16(row + 2 * k));
		case G4_W_BF16:
			return ref_bf16(get16(row + 2 * k));
		case G4_W_I4G32:
			{
				uint32_t	w = get32(row + 4 * (k / 8));
				int			code = (int) ((w >> (4 * (k % 8))) & 15);

				return (float) (code - 8) * ref_bf16(scales[k / 32]);
			}
		case G4_W_Q8_0:
			{
				const uint8_t *b = row + (k / 32) * 34;

				return (float) (int8_t) b[2 + k % 32] * ref_half(get16(b));
			}
		case G4_W_Q4_0:
		case G4_W_Q4_1:
		case G4_W_Q5_0:
		case G4_W_Q5_1:
			{
				int			has_m = fmt == G4_W_Q4_1 || fmt == G4_W_Q5_1;
				int			has_h = fmt == G4_W_Q5_0 || fmt == G4_W_Q5_1;
				int			bytes = 18 + 2 * has_m + 4 * has_h;
				const uint8_t *b = row + (k / 32) * bytes;
				int			e = (int) (k % 32);
				const uint8_t *qs = b + 2 + 2 * has_m + 4 * has_h;
				int			q = e < 16 ? (qs[e] & 15) : (qs[e - 16] >> 4);
				float		d = ref_half(get16(b));

				if (has_h)
					q |= (int) ((get32(b + 2 + 2 * has_m) >> e) & 1) << 4;
				if (has_m)
					return (float) q * d + ref_half(get16(b + 2));
				return (float) (q - (has_h ? 16 : 8)) * d;
			}
		case G4_W_Q4_K:
		case G4_W_Q5_K:
			{
				int			five = fmt == G4_W_Q5_K;
				const uint8_t *b = row + (k / 256) * (five ? 176 : 144);
				int			e = (int) (k % 256);
				int			sub = e / 32;
				int			l = e % 32;
				const uint8_t *qs = b + (five ? 48 : 16);
				int			byte = qs[(sub / 2) * 32 + l];
				int			q = (sub & 1) ? byte >> 4 : byte & 15;
				float		d1 = ref_half(get16(b)) * (float) ref_k_scale(b + 4, sub, 0);
				float		m1 = ref_half(get16(b + 2)) * (float) ref_k_scale(b + 4, sub, 1);

				if (five)
					q |= ((b[16 + l] >> sub) & 1) << 4;
				return d1 * (float) q - m1;
			}
		case G4_W_Q6_K:
			{
				const uint8_t *b = row + (k / 256) * 210;
				int			e = (int) (k % 256);
				int			h = e / 128;
				int			quarter = (e % 128) / 32;
				int			l = e % 32;
				const uint8_t *ql = b + 64 * h;
				int			qh = b[128 + 32 * h + l];
				int			lo = (quarter & 1) ? ql[l + 32] : ql[l];
				int			q;
				int			sc = (int8_t) b[192 + 8 * h + l / 16 + 2 * quarter];

				lo = (quarter & 2) ? lo >> 4 : lo & 15;
				q = (lo | (((qh >> (2 * quarter)) & 3) << 4)) - 32;
				return ref_half(get16(b + 208)) * (float) sc * (float) q;
			}
	}
	return NAN;
}

/* ---- random rows -------------------------------------------------------- */

typedef struct
{
	uint8_t    *data;
	uint16_t   *scales;			/* I4G32 only */
	int64_t		in;
} test_row;

/* Random bytes with every scale field set to a random finite half. */
static int
make_row(int fmt, int64_t in, rng_t *r, test_row *row)
{
	size_t		nbytes = g4_wfmt_row_bytes(fmt, in);
	int			bs = g4_wfmt_block(fmt);
	size_t		i;

	row->in = in;
	row->data = malloc(nbytes + 1);
	row->scales = NULL;
	if (!row->data)
		return 0;
	for (i = 0; i < nbytes; i++)
		row->data[i] = (uint8_t) rng_next(r);
	switch (fmt)
	{
		case G4_W_F32:
			for (i = 0; i < (size_t) in; i++)
			{
				float		f = 4.0f * rng_unit(r);

				memcpy(row->data + 4 * i, &f, 4);
			}
			break;
		case G4_W_F16:
			for (i = 0; i < (size_t) in; i++)
			{
				uint16_t	h = (uint16_t) (rng_next(r) & 0xFFFF);

				if (((h >> 10) & 31) == 31)
					h &= (uint16_t) ~(1u << 14);	/* no inf / NaN */
				put16(row->data + 2 * i, h);
			}
			break;
		case G4_W_BF16:
			for (i = 0; i < (size_t) in; i++)
			{
				uint64_t	v = rng_next(r);
				uint16_t	h = (uint16_t) (((v >> 30) & 1) << 15 | (100 + (v >> 8) % 40) << 7 | (v & 127));

				put16(row->data + 2 * i, h);
			}
			break;
		case G4_W_I4G32:
			row->scales = malloc(sizeof(uint16_t) * (size_t) ((in + 31) / 32));
			if (!row->scales)
				return 0;
			for (i = 0; i < (size_t) ((in + 31) / 32); i++)
			{
				uint64_t	v = rng_next(r);

				row->scales[i] = (uint16_t) (((v >> 30) & 1) << 15 | (110 + (v >> 8) % 20) << 7 | (v & 127));
			}
			break;
		default:
			{
				size_t		bb = nbytes / (size_t) (in / bs);

				for (i = 0; i < (size_t) (in / bs); i++)
				{
					uint8_t    *b = row->data + i * bb;

					switch (fmt)
					{
						case G4_W_Q4_1:
						case G4_W_Q5_1:
						case G4_W_Q4_K:
						case G4_W_Q5_K:
							put16(b, rand_half(r));
							put16(b + 2, rand_half(r));
							break;
						case G4_W_Q6_K:
							put16(b + 208, rand_half(r));
							break;
						default:
							put16(b, rand_half(r));
					}
				}
			}
	}
	return 1;
}

static void
free_row(test_row *row)
{
	free(row->data);
	free(row->scales);
}

/* Lengths worth testing per format: single block, several, not a multiple
 * of the kernels' 256-element chunk, and (plain, I4G32) ragged tails. */
static int
test_lengths(int fmt, int64_t *len)
{
	int			n = 0;

	switch (g4_wfmt_block(fmt))
	{
		case 1:
			len[n++] = 1;
			len[n++] = 7;
			len[n++] = 8;
			len[n++] = 31;
			len[n++] = 33;
			len[n++] = 256;
			len[n++] = 300;
			len[n++] = 1029;
			break;
		case 32:
			if (fmt == G4_W_I4G32)
			{
				len[n++] = 8;
				len[n++] = 36;
				len[n++] = 1000;
			}
			len[n++] = 32;
			len[n++] = 64;
			len[n++] = 288;
			len[n++] = 1280;
			break;
		default:
			len[n++] = 256;
			len[n++] = 512;
			len[n++] = 2304;
	}
	return n;
}

/* ---- format metadata ---------------------------------------------------- */

G4_TEST(quant_format_table)
{
	static const struct
	{
		int			fmt;
		const char *name;
		int			block;
		size_t		bytes_256;	/* row bytes for in = 256 */
	}			want[] = {
		{G4_W_F32, "F32", 1, 1024}, {G4_W_F16, "F16", 1, 512},
		{G4_W_BF16, "BF16", 1, 512}, {G4_W_I4G32, "I4G32", 32, 128},
		{G4_W_Q8_0, "Q8_0", 32, 8 * 34}, {G4_W_Q4_0, "Q4_0", 32, 8 * 18},
		{G4_W_Q4_1, "Q4_1", 32, 8 * 20}, {G4_W_Q5_0, "Q5_0", 32, 8 * 22},
		{G4_W_Q5_1, "Q5_1", 32, 8 * 24}, {G4_W_Q4_K, "Q4_K", 256, 144},
		{G4_W_Q5_K, "Q5_K", 256, 176}, {G4_W_Q6_K, "Q6_K", 256, 210},
	};
	size_t		i;

	CHECK_INT(sizeof(want) / sizeof(want[0]), G4_W_FORMAT_COUNT);
	for (i = 0; i < sizeof(want) / sizeof(want[0]); i++)
	{
		CHECK_STR(g4_wfmt_name(want[i].fmt), want[i].name);
		CHECK_INT(g4_wfmt_block(want[i].fmt), want[i].block);
		CHECK_INT(g4_wfmt_row_bytes(want[i].fmt, 256), want[i].bytes_256);
		CHECK_INT(g4_wfmt_row_bytes(want[i].fmt, 0), 0);
	}
	/* I4G32 rows round up to whole words; block formats need whole blocks */
	CHECK_INT(g4_wfmt_row_bytes(G4_W_I4G32, 36), 20);
	CHECK_INT(g4_wfmt_row_bytes(G4_W_Q4_K, 300), 0);
	CHECK_INT(g4_wfmt_row_bytes(G4_W_Q8_0, 33), 0);
	CHECK_INT(g4_wfmt_row_bytes(G4_W_F16, 3), 6);
	CHECK_INT(g4_wfmt_row_bytes(G4_W_FORMAT_COUNT, 256), 0);
	CHECK_STR(g4_wfmt_name(-1), "unknown");

	/* ggml type -> engine format */
	CHECK_INT(g4_gguf_wfmt(G4_GGML_F32), G4_W_F32);
	CHECK_INT(g4_gguf_wfmt(G4_GGML_F16), G4_W_F16);
	CHECK_INT(g4_gguf_wfmt(G4_GGML_BF16), G4_W_BF16);
	CHECK_INT(g4_gguf_wfmt(G4_GGML_Q8_0), G4_W_Q8_0);
	CHECK_INT(g4_gguf_wfmt(G4_GGML_Q4_0), G4_W_Q4_0);
	CHECK_INT(g4_gguf_wfmt(G4_GGML_Q4_1), G4_W_Q4_1);
	CHECK_INT(g4_gguf_wfmt(G4_GGML_Q5_0), G4_W_Q5_0);
	CHECK_INT(g4_gguf_wfmt(G4_GGML_Q5_1), G4_W_Q5_1);
	CHECK_INT(g4_gguf_wfmt(G4_GGML_Q4_K), G4_W_Q4_K);
	CHECK_INT(g4_gguf_wfmt(G4_GGML_Q5_K), G4_W_Q5_K);
	CHECK_INT(g4_gguf_wfmt(G4_GGML_Q6_K), G4_W_Q6_K);
	CHECK_INT(g4_gguf_wfmt(G4_GGML_Q2_K), -1);
	CHECK_INT(g4_gguf_wfmt(G4_GGML_Q8_1), -1);
	CHECK_INT(g4_gguf_wfmt(23), -1);
}

/* ---- dequantisation ----------------------------------------------------- */

static void
check_dequant_path(int path)
{
	rng_t		r = {0x9E3779B97F4A7C15ull + (uint64_t) path};
	int			fmt;

	for (fmt = 0; fmt < G4_W_FORMAT_COUNT; fmt++)
	{
		int64_t		lens[16];
		int			nl = test_lengths(fmt, lens);
		int			li,
					rep;

		for (li = 0; li < nl; li++)
		{
			for (rep = 0; rep < 3; rep++)
			{
				int64_t		in = lens[li];
				test_row	row;
				float	   *out = malloc(sizeof(float) * (size_t) (in + 1));
				int64_t		k;

				CHECK(out != NULL);
				CHECK(make_row(fmt, in, &r, &row));
				out[in] = 12345.0f;
				g4_dequant_row_path(path, fmt, row.data, row.scales, in, out);
				for (k = 0; k < in; k++)
				{
					float		want = ref_elem(fmt, row.data, row.scales, k);

					if (!same_bits(out[k], want))
					{
						g4_test_fail(__FILE__, __LINE__,
									 "%s path %d in %lld: element %lld is %.9g, expected %.9g",
									 g4_wfmt_name(fmt), path, (long long) in, (long long) k,
									 out[k], want);
						free(out);
						free_row(&row);
						return;
					}
				}
				CHECK_MSG(out[in] == 12345.0f, "%s: wrote past the row", g4_wfmt_name(fmt));
				free(out);
				free_row(&row);
			}
		}
	}
}

G4_TEST(quant_dequant_scalar)
{
	check_dequant_path(0);
}

G4_TEST(quant_dequant_avx2)
{
	if (!g4_quant_simd_available())
		G4_SKIP("this CPU lacks AVX2/FMA/F16C; only the scalar path runs here");
	check_dequant_path(1);
}

/* ---- dot products ------------------------------------------------------- */

/*
 * Tolerance.  Both kernels compute each product of an exact dequantised
 * weight and an activation with at most one rounding (FMA or multiply) and
 * add it into one of at least eight independent float32 partial sums; a
 * partial sum receives at most in/8 terms (plus, for ragged tails and the
 * final reduction, fewer than 40 more additions).  The classical bound for
 * recursive summation then gives
 *     |computed - exact| <= gamma_m * sum_k |w_k x_k|,   m = in/8 + 41,
 * gamma_m = m u / (1 - m u), u = 2^-24.  The reference is computed in
 * float64 from the independently decoded weights (its own error is far
 * below this).  For in = 2304 the bound is 1.9e-5 of sum|w x|, while a
 * single wrong element would typically be off by ~sum|w x| / in = 4e-4 of
 * it; the one-hot test below checks element placement exactly anyway.
 */
static double
dot_tol(int64_t in, double sum_abs)
{
	double		u = ldexp(1.0, -24);
	double		m = (double) (in / 8 + 41);

	return m * u / (1.0 - m * u) * sum_abs + 1e-30;
}

static void
check_dot_path(int path)
{
	static const int ns[] = {1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 33, 64, 65, 70};
	rng_t		r = {0xD1B54A32D192ED03ull + (uint64_t) path};
	int			fmt;

	for (fmt = 0; fmt < G4_W_FORMAT_COUNT; fmt++)
	{
		int64_t		lens[16];
		int			nl = test_lengths(fmt, lens);
		int			li;
		size_t		ni;

		for (li = 0; li < nl; li++)
		{
			int64_t		in = lens[li];
			int64_t		xs = in + (li & 1) * 5;	/* strided and packed rows */
			int64_t		os = 2;
			test_row	row;
			float	   *w = malloc(sizeof(float) * (size_t) in);
			float	   *x = malloc(sizeof(float) * (size_t) (xs * 70));
			float	   *out = malloc(sizeof(float) * (size_t) (os * 71));
			int64_t		k;

			CHECK(w && x && out);
			CHECK(make_row(fmt, in, &r, &row));
			for (k = 0; k < in; k++)
				w[k] = ref_elem(fmt, row.data, row.scales, k);
			for (k = 0; k < xs * 70; k++)
				x[k] = rng_unit(&r);

			for (ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++)
			{
				int			n = ns[ni];
				int			t;

				for (t = 0; t < os * 71; t++)
					out[t] = -777.0f;
				g4_dot_row_path(path, fmt, row.data, row.scales, in, x, xs, n, out, os);
				for (t = 0; t < n; t++)
				{
					double		ref = 0.0,
								sum_abs = 0.0;

					for (k = 0; k < in; k++)
					{
						ref += (double) w[k] * x[t * xs + k];
						sum_abs += fabs((double) w[k] * x[t * xs + k]);
					}
					if (!(fabs(out[t * os] - ref) <= dot_tol(in, sum_abs)))
					{
						g4_test_fail(__FILE__, __LINE__,
									 "%s path %d in %lld n %d: row %d gives %.9g, expected %.9g (tol %.3g)",
									 g4_wfmt_name(fmt), path, (long long) in, n, t,
									 out[t * os], ref, dot_tol(in, sum_abs));
						goto fail;
					}
					if (out[t * os + 1] != -777.0f)
					{
						g4_test_fail(__FILE__, __LINE__, "%s: wrote between output strides",
									 g4_wfmt_name(fmt));
						goto fail;
					}
				}
				if (out[n * os] != -777.0f)
				{
					g4_test_fail(__FILE__, __LINE__, "%s n %d: wrote past the last output",
								 g4_wfmt_name(fmt), n);
					goto fail;
				}
			}

			/* one-hot activations: each output must be exactly one weight */
			for (ni = 0; ni < 3; ni++)
			{
				int			n = ni == 0 ? 1 : (ni == 1 ? 5 : 9);
				int64_t		pick[9];
				int			t;

				memset(x, 0, sizeof(float) * (size_t) (xs * 70));
				for (t = 0; t < n; t++)
				{
					pick[t] = (int64_t) (rng_next(&r) % (uint64_t) in);
					if (t == 1)
						pick[t] = in - 1;	/* the ragged tail, if any */
					x[t * xs + pick[t]] = 1.0f;
				}
				g4_dot_row_path(path, fmt, row.data, row.scales, in, x, xs, n, out, 1);
				for (t = 0; t < n; t++)
				{
					if (out[t] != w[pick[t]])
					{
						g4_test_fail(__FILE__, __LINE__,
									 "%s path %d in %lld n %d: one-hot at %lld gives %.9g, weight is %.9g",
									 g4_wfmt_name(fmt), path, (long long) in, n,
									 (long long) pick[t], out[t], w[pick[t]]);
						goto fail;
					}
				}
			}
			free(w);
			free(x);
			free(out);
			free_row(&row);
			continue;
	fail:
			free(w);
			free(x);
			free(out);
			free_row(&row);
			return;
		}
	}
}

G4_TEST(quant_dot_scalar)
{
	check_dot_path(0);
}

G4_TEST(quant_dot_avx2)
{
	if (!g4_quant_simd_available())
		G4_SKIP("this CPU lacks AVX2/FMA/F16C; only the scalar path runs here");
	check_dot_path(1);
}

/* The public entry points pick a path and agree with the explicit ones. */
G4_TEST(quant_dispatch)
{
	rng_t		r = {42};
	test_row	row;
	float		a[512],
				b[512],
				x[512],
				da,
				db;
	int			i;

	CHECK(make_row(G4_W_Q4_K, 512, &r, &row));
	for (i = 0; i < 512; i++)
		x[i] = rng_unit(&r);
	g4_dequant_row(G4_W_Q4_K, row.data, NULL, 512, a);
	g4_dequant_row_path(g4_quant_simd_available(), G4_W_Q4_K, row.data, NULL, 512, b);
	CHECK(memcmp(a, b, sizeof(a)) == 0);
	g4_dot_row(G4_W_Q4_K, row.data, NULL, 512, x, 512, 1, &da, 1);
	g4_dot_row_path(g4_quant_simd_available(), G4_W_Q4_K, row.data, NULL, 512, x, 512, 1, &db, 1);
	free_row(&row);
	CHECK(same_bits(da, db));
}

/* ---- int4 group-32 quantiser -------------------------------------------- */

static int
code_at(const uint32_t *packed, int64_t k)
{
	return (int) ((packed[k / 8] >> (4 * (k % 8))) & 15);
}

G4_TEST(quant_i4g32_ties_and_clamp)
{
	/* max |w| = 7.5 makes the scale exactly 1.0: codes are round-half-even
	 * of the values themselves, clamped to [-8, 7] */
	static const float w[32] = {
		7.5f, 2.5f, 3.5f, -2.5f, -3.5f, 0.5f, 1.5f, -0.5f,
		-7.5f, 6.5f, -6.5f, 0.49f, -1.51f, 4.0f, -4.0f, 0.0f,
		1.0f, 2.0f, 3.0f, 5.0f, 6.0f, 7.0f, -1.0f, -2.0f,
		-3.0f, -5.0f, -6.0f, -7.0f, -8.0f / 2, 5.5f, -5.5f, 4.5f
	};
	static const int q[32] = {
		7, 2, 4, -2, -4, 0, 2, 0,
		-8, 6, -6, 0, -2, 4, -4, 0,
		1, 2, 3, 5, 6, 7, -1, -2,
		-3, -5, -6, -7, -4, 6, -6, 4
	};
	uint32_t	packed[4];
	uint16_t	scale;
	float		deq[32];
	int			k;

	g4_quant_row_i4g32(w, 32, packed, &scale);
	CHECK_INT(scale, 0x3F80);	/* bf16 1.0 */
	for (k = 0; k < 32; k++)
		CHECK_MSG(code_at(packed, k) == q[k] + 8, "w[%d] = %g: code %d, expected %d",
				  k, w[k], code_at(packed, k), q[k] + 8);
	g4_dequant_row(G4_W_I4G32, packed, &scale, 32, deq);
	for (k = 0; k < 32; k++)
		CHECK(deq[k] == (float) q[k]);
}

G4_TEST(quant_i4g32_random)
{
	rng_t		r = {7};
	enum
	{
		IN = 36 + 32 * 7
	};
	float		w[IN],
				deq[IN];
	uint32_t	packed[(IN + 7) / 8];
	uint16_t	scales[(IN + 31) / 32];
	int64_t		k,
				g;
	int			rep;

	for (rep = 0; rep < 50; rep++)
	{
		for (k = 0; k < IN; k++)
			w[k] = rng_unit(&r) * (float) (1 + rep);
		/* an all-zero group */
		if (rep == 3)
			for (k = 32; k < 64; k++)
				w[k] = 0.0f;
		g4_quant_row_i4g32(w, IN, packed, scales);
		for (g = 0; g < (IN + 31) / 32; g++)
		{
			float		amax = 0.0f;
			float		s;

			for (k = 32 * g; k < IN && k < 32 * g + 32; k++)
				amax = fmaxf(amax, fabsf(w[k]));
			/* the stated choice: f32 amax / 7.5, then nearest-even bf16 */
			CHECK_INT(scales[g], g4_f32_to_bf16(amax / 7.5f));
			s = ref_bf16(scales[g]);
			for (k = 32 * g; k < IN && k < 32 * g + 32; k++)
			{
				double		want = s > 0 ? nearbyint((double) (w[k] / s)) : 0.0;

				if (want < -8)
					want = -8;
				if (want > 7)
					want = 7;
				CHECK_MSG(code_at(packed, k) == (int) want + 8,
						  "rep %d k %lld: code %d expected %d", rep, (long long) k,
						  code_at(packed, k), (int) want + 8);
			}
		}
		/* padding nibbles of the last word (columns 260..263) are code 8 */
		for (k = IN; k < ((IN + 7) / 8) * 8; k++)
			CHECK_INT(code_at(packed, k), 8);
		g4_dequant_row(G4_W_I4G32, packed, scales, IN, deq);
		for (k = 0; k < IN; k++)
		{
			float		s = ref_bf16(scales[k / 32]);

			CHECK(same_bits(deq[k], (float) (code_at(packed, k) - 8) * s));
			/* within half a step, except where clamped at the range ends */
			if (fabsf(w[k]) <= 7.0f * s)
				CHECK(fabsf(deq[k] - w[k]) <= 0.5f * s * 1.0001f);
		}
	}
}

/* ---- golden values from the real model ---------------------------------- */

static const char *
model_path(void)
{
	const char *p = getenv("G4_GGUF_MODEL");

	return p && *p ? p : NULL;
}

/* Same exact checksum as golden_gguf.py. */
static uint64_t
checksum_add(uint64_t acc, const float *v, int64_t n, int64_t start)
{
	int64_t		i;

	for (i = 0; i < n; i++)
	{
		uint32_t	bits;

		memcpy(&bits, &v[i], 4);
		acc += (uint64_t) bits * (uint64_t) ((start + i) % 65521 + 1);
	}
	return acc;
}

static int
golden_check_row(const g4_gguf_tensor *t, int fmt, int64_t r, char *vals, char **save)
{
	int64_t		ne0 = t->ne[0];
	const uint8_t *row = (const uint8_t *) t->data + (size_t) r * g4_wfmt_row_bytes(fmt, ne0);
	float	   *got[2];
	int64_t		k;
	int			path,
				ok = 1;
	char	   *tok;

	got[0] = malloc(sizeof(float) * (size_t) ne0);
	got[1] = malloc(sizeof(float) * (size_t) ne0);
	if (!got[0] || !got[1])
	{
		free(got[0]);
		free(got[1]);
		g4_test_fail(__FILE__, __LINE__, "out of memory");
		return 0;
	}
	for (path = 0; path < 2; path++)
		g4_dequant_row_path(path, fmt, row, NULL, ne0, got[path]);
	for (k = 0, tok = strtok_r(vals, " \n", save); k < ne0 && ok;
		 k++, tok = strtok_r(NULL, " \n", save))
	{
		uint32_t	bits;
		float		want;

		if (!tok)
		{
			g4_test_fail(__FILE__, __LINE__, "golden row %s/%lld is short", t->name, (long long) r);
			ok = 0;
			break;
		}
		bits = (uint32_t) strtoul(tok, NULL, 16);
		memcpy(&want, &bits, 4);
		for (path = 0; path < 2 && ok; path++)
		{
			if (!same_bits(got[path][k], want))
			{
				g4_test_fail(__FILE__, __LINE__,
							 "%s row %lld element %lld (path %d): %.9g, gguf-py gives %.9g",
							 t->name, (long long) r, (long long) k, path, got[path][k], want);
				ok = 0;
			}
		}
	}
	free(got[0]);
	free(got[1]);
	return ok;
}

G4_TEST(quant_golden_gguf)
{
	const char *mp = model_path();
	char		gpath[4096];
	FILE	   *f;
	g4_gguf    *g = NULL;
	g4_err		err = {0};
	char	   *line = NULL;
	size_t		cap = 0;
	int			n_tensors = 0,
				n_rows = 0;

	if (!mp)
		G4_SKIP("G4_GGUF_MODEL is not set (point it at gemma-3-270m-q4_k_m.gguf)");
	if (access(mp, R_OK) != 0)
		G4_SKIP("G4_GGUF_MODEL names a file that does not exist");
	snprintf(gpath, sizeof(gpath), "%s/test/golden/gguf_gemma3_270m.txt", g4_test_srcdir());
	f = fopen(gpath, "r");
	CHECK_MSG(f != NULL, "cannot open %s", gpath);
	CHECK_OK(g4_gguf_open(mp, &g, &err), &err);

	while (getline(&line, &cap, f) > 0)
	{
		char	   *save = NULL;
		char	   *kind = strtok_r(line, " \n", &save);

		if (!kind || kind[0] == '#')
			continue;
		if (strcmp(kind, "model") == 0)
			continue;
		if (strcmp(kind, "tensor") == 0)
		{
			const char *name = strtok_r(NULL, " \n", &save);
			const char *type = strtok_r(NULL, " \n", &save);
			int64_t		ne0 = strtoll(strtok_r(NULL, " \n", &save), NULL, 10);
			int64_t		rows = strtoll(strtok_r(NULL, " \n", &save), NULL, 10);
			uint64_t	want_sum = strtoull(strtok_r(NULL, " \n", &save), NULL, 16);
			double		want_total = strtod(strtok_r(NULL, " \n", &save), NULL);
			const g4_gguf_tensor *t = g4_gguf_find(g, name);
			int			fmt;
			float	   *buf;
			uint64_t	sum = 0;
			double		total = 0.0,
						total_abs = 0.0;
			int64_t		r,
						k;

			if (!t || strcmp(g4_ggml_type_name(t->ggml_type), type) != 0 ||
				t->ne[0] != ne0 || t->ne[1] * t->ne[2] * t->ne[3] != rows)
			{
				g4_test_fail(__FILE__, __LINE__, "tensor %s (%s %lld x %lld) not in the model as recorded",
							 name, type, (long long) ne0, (long long) rows);
				break;
			}
			fmt = g4_gguf_wfmt(t->ggml_type);
			buf = malloc(sizeof(float) * (size_t) ne0);
			if (fmt < 0 || !buf)
			{
				free(buf);
				g4_test_fail(__FILE__, __LINE__, "tensor %s: no engine format / no memory", name);
				break;
			}
			for (r = 0; r < rows; r++)
			{
				g4_dequant_row(fmt, (const uint8_t *) t->data + (size_t) r * g4_wfmt_row_bytes(fmt, ne0),
							   NULL, ne0, buf);
				sum = checksum_add(sum, buf, ne0, r * ne0);
				for (k = 0; k < ne0; k++)
				{
					total += buf[k];
					total_abs += fabs(buf[k]);
				}
			}
			free(buf);
			if (sum != want_sum)
			{
				g4_test_fail(__FILE__, __LINE__, "tensor %s: checksum %016llx, gguf-py gives %016llx",
							 name, (unsigned long long) sum, (unsigned long long) want_sum);
				break;
			}
			/* the float64 sums differ only by summation order */
			if (!(fabs(total - want_total) <= 1e-12 * total_abs + 1e-12))
			{
				g4_test_fail(__FILE__, __LINE__, "tensor %s: sum %.17g, gguf-py gives %.17g",
							 name, total, want_total);
				break;
			}
			n_tensors++;
		}
		else if (strcmp(kind, "row") == 0)
		{
			const char *name = strtok_r(NULL, " \n", &save);
			int64_t		r = strtoll(strtok_r(NULL, " \n", &save), NULL, 10);
			const g4_gguf_tensor *t = g4_gguf_find(g, name);

			if (!t || g4_gguf_wfmt(t->ggml_type) < 0)
			{
				g4_test_fail(__FILE__, __LINE__, "golden row of unknown tensor %s", name);
				break;
			}
			if (!golden_check_row(t, g4_gguf_wfmt(t->ggml_type), r, save, &save))
				break;
			n_rows++;
		}
	}
	free(line);
	fclose(f);
	g4_gguf_close(g);
	if (g4_test_failed())
		return;
	/* one tensor per type present: F32, Q8_0 (the embedding table), Q5_0,
	 * Q4_K, Q6_K; three rows each (one for the single-row F32 norm) */
	CHECK_INT(n_tensors, 5);
	CHECK_INT(n_rows, 13);
}

/* Dot products on real rows of every type against their golden values. */
G4_TEST(quant_golden_gguf_dot)
{
	static const char *const names[] = {
		"blk.0.attn_v.weight", "blk.0.attn_k.weight", "blk.0.attn_output.weight",
		"blk.0.ffn_down.weight", "output_norm.weight", "token_embd.weight"
	};
	const char *mp = model_path();
	g4_gguf    *g = NULL;
	g4_err		err = {0};
	rng_t		r = {99};
	size_t		i;

	if (!mp)
		G4_SKIP("G4_GGUF_MODEL is not set (point it at gemma-3-270m-q4_k_m.gguf)");
	if (access(mp, R_OK) != 0)
		G4_SKIP("G4_GGUF_MODEL names a file that does not exist");
	CHECK_OK(g4_gguf_open(mp, &g, &err), &err);
	for (i = 0; i < sizeof(names) / sizeof(names[0]); i++)
	{
		const g4_gguf_tensor *t = g4_gguf_find(g, names[i]);
		int			fmt = t ? g4_gguf_wfmt(t->ggml_type) : -1;
		int64_t		ne0 = t ? t->ne[0] : 0;
		float	   *w,
				   *x;
		float		out[2][8];
		int			path,
					n;
		int64_t		k;

		if (fmt < 0)
		{
			g4_test_fail(__FILE__, __LINE__, "%s missing or of no engine format", names[i]);
			break;
		}
		w = malloc(sizeof(float) * (size_t) ne0);
		x = malloc(sizeof(float) * (size_t) ne0 * 8);
		if (!w || !x)
		{
			free(w);
			free(x);
			g4_test_fail(__FILE__, __LINE__, "out of memory");
			break;
		}
		for (k = 0; k < ne0 * 8; k++)
			x[k] = rng_unit(&r);
		g4_dequant_row_path(0, fmt, t->data, NULL, ne0, w);
		for (path = 0; path < 2; path++)
		{
			for (n = 1; n <= 8; n += 7)
			{
				int			tt;

				g4_dot_row_path(path, fmt, t->data, NULL, ne0, x, ne0, n, out[path], 1);
				for (tt = 0; tt < n; tt++)
				{
					double		ref = 0,
								sa = 0;

					for (k = 0; k < ne0; k++)
					{
						ref += (double) w[k] * x[tt * ne0 + k];
						sa += fabs((double) w[k] * x[tt * ne0 + k]);
					}
					if (!(fabs(out[path][tt] - ref) <= dot_tol(ne0, sa)))
						g4_test_fail(__FILE__, __LINE__, "%s path %d n %d: %.9g vs %.9g",
									 names[i], path, n, out[path][tt], ref);
				}
			}
		}
		free(w);
		free(x);
		if (g4_test_failed())
			break;
	}
	g4_gguf_close(g);
}
