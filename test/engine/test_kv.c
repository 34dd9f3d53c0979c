/*
 * test_kv.c — the KV pool's formats and attention over them (CPU backend):
 * encode/decode error bounds per dtype, head_norm_rope's store against
 * kv_store, attention against a float64 reference for every mask shape, and
 * compressed dtypes against the exact pool as figures.
 */
#include <math.h>

#include "cpu/cpu.h"
#include "harness.h"
#include "test.h"
#include "xorshift.h"

static uint64_t rng_state = 88172645463325252ull;

G4_TEST(kv_hadamard_is_orthonormal_involution)
{
	float		x[512],
				y[512];
	int			n,
				i;

	for (n = 16; n <= 512; n *= 2)
	{
		double		nx = 0,
					ny = 0;

		for (i = 0; i < n; i++)
			x[i] = y[i] = h_normal(&rng_state);
		g4_hadamard(y, n);
		for (i = 0; i < n; i++)
		{
			nx += (double) x[i] * x[i];
			ny += (double) y[i] * y[i];
		}
		CHECK_NEAR(ny / nx, 1.0, 1e-5);
		g4_hadamard(y, n);
		for (i = 0; i < n; i++)
			CHECK_NEAR(y[i], x[i], 1e-5 * (1 + fabs(x[i])));
	}
}

/* Decode(encode(x)) stays within the format's rounding step. */
G4_TEST(kv_codec_error_bounds)
{
	static const int dims[] = {16, 64, 256, 512};
	size_t		di;

	for (di = 0; di < G4_ARRAY_LEN(dims); di++)
	{
		int			hd = dims[di];
		int			k_eq_v;

		for (k_eq_v = 0; k_eq_v <= 1; k_eq_v++)
		{
			int			dtype;

			for (dtype = G4_KV_F32; dtype <= G4_KV_TURBOQUANT_K8V4; dtype++)
			{
				size_t		hb = g4_kv_head_block_bytes(dtype, hd, k_eq_v);
				uint8_t    *blk = calloc(1, hb);
				float		k[512],
							v[512],
							dk[512],
							dv[512],
							rk[512],
							rv[512];
				int			off,
							i;

				CHECK(blk);
				for (off = 0; off < G4_KV_BLOCK_TOKENS; off++)
				{
					for (i = 0; i < hd; i++)
					{
						k[i] = h_normal(&rng_state) * 2.0f;
						v[i] = h_normal(&rng_state);
					}
					k[off % hd] = 9.0f;		/* an outlier channel */
					g4_kv_encode_head(dtype, k_eq_v, hd, blk, off, k_eq_v ? NULL : k, v);
					g4_kv_decode_k(dtype, k_eq_v, hd, blk, off, dk);
					g4_kv_decode_v(dtype, k_eq_v, hd, blk, off, dv);
					memcpy(rk, k_eq_v ? v : k, sizeof(float) * (size_t) hd);
					memcpy(rv, v, sizeof(float) * (size_t) hd);
					if (dtype == G4_KV_TURBOQUANT_K8V4 && !k_eq_v)
					{
						/* stored rotated: compare in the rotated domain */
						g4_hadamard(rk, hd);
						g4_hadamard(rv, hd);
					}
					for (i = 0; i < hd; i++)
					{
						double		ek = fabs(dk[i] - rk[i]);
						double		ev = fabs(dv[i] - rv[i]);
						double		bk,
									bv;

						if (dtype == G4_KV_F32)
							bk = bv = 0.0;
						else if (dtype == G4_KV_BF16)
						{
							bk = fabs(rk[i]) * (1.0 / 256.0);
							bv = fabs(rv[i]) * (1.0 / 256.0);
						}
						else
						{
							double		amk = 0,
										amv = 0;
							int			j,
										G = k_eq_v ? hd : g4_kv_v4_group(hd);
							int			g0 = (i / G) * G;

							for (j = 0; j < hd; j++)
								amk = fmax(amk, fabs(rk[j]));
							for (j = g0; j < g0 + G; j++)
								amv = fmax(amv, fabs(rv[j]));
							/* keys: half a step, plus the f16 rounding of the
							 * scale (2^-11 relative) over the largest code;
							 * values sit at odd multiples of their scale, so
							 * within one scale (2^-11 more for its rounding) */
							bk = amk / 127.0 * (0.5 + 127.0 / 2048.0);
							bv = k_eq_v ? bk : amv / 15.0 * (1.0 + 1.0 / 2048.0);
						}
						CHECK_MSG(ek <= bk * 1.0001 + 1e-7 && ev <= bv * 1.0001 + 1e-7,
								  "dtype %d hd %d k_eq_v %d element %d: errors %.3g / %.3g exceed %.3g / %.3g",
								  dtype, hd, k_eq_v, i, ek, ev, bk, bv);
					}
				}
				free(blk);
			}
		}
	}
}

/* A NaN in a key or value reaches its slot's decode as NaN in every dtype
 * (the quantised ones store a NaN scale: fmaxf would have dropped it and
 * left finite codes), and only that slot: the slot beside it decodes as it
 * was stored. */
G4_TEST(kv_nan_is_kept_by_every_dtype)
{
	static const int dtypes[] = {G4_KV_F32, G4_KV_BF16, G4_KV_TURBOQUANT_K8V4};
	size_t		d;
	int			k_eq_v,
				in_key,
				i;

	for (d = 0; d < G4_ARRAY_LEN(dtypes); d++)
		for (k_eq_v = 0; k_eq_v < 2; k_eq_v++)
			for (in_key = 0; in_key < 2 - k_eq_v; in_key++)
			{
				const int	hd = 256;
				size_t		hb = g4_kv_head_block_bytes(dtypes[d], hd, k_eq_v);
				uint8_t    *blk = calloc(1, hb);
				float		k[256],
							v[256],
							dk[256],
							dv[256],
							before_k[256],
							before_v[256];
				int			nan_k = 0,
							nan_v = 0;

				CHECK(blk);
				for (i = 0; i < hd; i++)
				{
					k[i] = h_normal(&rng_state);
					v[i] = h_normal(&rng_state);
				}
				g4_kv_encode_head(dtypes[d], k_eq_v, hd, blk, 1, k_eq_v ? NULL : k, v);
				g4_kv_decode_k(dtypes[d], k_eq_v, hd, blk, 1, before_k);
				g4_kv_decode_v(dtypes[d], k_eq_v, hd, blk, 1, before_v);
				(in_key ? k : v)[37] = NAN;
				g4_kv_encode_head(dtypes[d], k_eq_v, hd, blk, 0, k_eq_v ? NULL : k, v);
				g4_kv_decode_k(dtypes[d], k_eq_v, hd, blk, 0, dk);
				g4_kv_decode_v(dtypes[d], k_eq_v, hd, blk, 0, dv);
				for (i = 0; i < hd; i++)
				{
					nan_k += isnan(dk[i]);
					nan_v += isnan(dv[i]);
				}
				/* the key of a k_eq_v layer is its value */
				CHECK_MSG(in_key || k_eq_v ? nan_k > 0 : nan_k == 0, "dtype %d k_eq_v %d NaN in the %s: %d NaN keys",
						  dtypes[d], k_eq_v, in_key ? "key" : "value", nan_k);
				CHECK_MSG(in_key ? nan_v == 0 : nan_v > 0, "dtype %d k_eq_v %d NaN in the %s: %d NaN values",
						  dtypes[d], k_eq_v, in_key ? "key" : "value", nan_v);
				g4_kv_decode_k(dtypes[d], k_eq_v, hd, blk, 1, dk);
				g4_kv_decode_v(dtypes[d], k_eq_v, hd, blk, 1, dv);
				CHECK(memcmp(dk, before_k, sizeof(dk)) == 0 && memcmp(dv, before_v, sizeof(dv)) == 0);
				free(blk);
			}
}

/* The value codes: every level decodes to an odd multiple of the scale,
 * each level encodes back to its own code, the extremes are exact and an
 * all-zero group decodes to zeros. */
G4_TEST(kv_v4_levels)
{
	float		inv;
	uint16_t	s16 = g4_kv_scale(3.0f, G4_KV_V4_STEPS, &inv);
	float		s = g4_f16_to_f32(s16);
	int			c;

	for (c = 0; c < 16; c++)
	{
		float		x = g4_kv_v4_value(c, s);

		CHECK_NEAR(x, (2 * c - 15) * s, 0);
		CHECK_INT(g4_kv_v4_code(x, inv), c);
		/* nearer to this level than to either neighbour */
		CHECK_INT(g4_kv_v4_code(x + 0.9f * s, inv), c);
		CHECK_INT(g4_kv_v4_code(x - 0.9f * s, inv), c);
	}
	CHECK_INT(g4_kv_v4_code(3.0f, inv), 15);
	CHECK_INT(g4_kv_v4_code(-3.0f, inv), 0);
	CHECK_INT(g4_kv_v4_code(100.0f, inv), 15);	/* clamped */
	s16 = g4_kv_scale(0.0f, G4_KV_V4_STEPS, &inv);
	CHECK_INT(s16, 0);
	CHECK_NEAR(g4_kv_v4_value(g4_kv_v4_code(0.0f, inv), g4_f16_to_f32(s16)), 0.0, 0);
}

/* One layer's pool on the CPU backend with given shape. */
typedef struct
{
	g4_backend *be;
	g4_kv_pool_desc desc;
	g4_kv_layer L;
	float	   *knorm;
	float	   *inv;
} mini_pool;

static int
mini_pool_init(mini_pool *mp, int dtype, int hd, int heads, int kv_heads, int k_eq_v, int max_tokens)
{
	g4_err		err;
	int			nb = G4_DIV_UP(max_tokens, G4_KV_BLOCK_TOKENS);
	int			b;
	int			i;

	memset(mp, 0, sizeof(*mp));
	if (g4_backend_cpu_create(2, &mp->be, &err) != G4_OK)
		return -1;
	mp->desc.dtype = dtype;
	mp->desc.n_layers[G4_KVG_FULL] = 1;
	mp->desc.n_blocks[G4_KVG_FULL] = nb;
	mp->desc.layer_block_bytes[G4_KVG_FULL] = (size_t) kv_heads * g4_kv_head_block_bytes(dtype, hd, k_eq_v);
	mp->desc.layer_stride[G4_KVG_FULL] = (size_t) nb * mp->desc.layer_block_bytes[G4_KVG_FULL];
	mp->desc.base[G4_KVG_FULL] = calloc(1, mp->desc.layer_stride[G4_KVG_FULL]);
	mp->desc.block_tables[G4_KVG_FULL] = malloc((size_t) nb * sizeof(int32_t));
	mp->desc.max_seqs = 1;
	mp->desc.max_blocks_per_seq = nb;
	if (!mp->desc.base[G4_KVG_FULL] || !mp->desc.block_tables[G4_KVG_FULL])
		return -1;
	/* blocks in reverse order: the table, not adjacency, must be followed */
	for (b = 0; b < nb; b++)
		mp->desc.block_tables[G4_KVG_FULL][b] = nb - 1 - b;
	mp->be->ops->kv_configure(mp->be, &mp->desc);
	mp->knorm = malloc(sizeof(float) * (size_t) hd);
	mp->inv = malloc(sizeof(float) * (size_t) hd / 2);
	/* deterministic, so pools of different dtypes compute the same keys */
	for (i = 0; i < hd; i++)
		mp->knorm[i] = 0.5f + (float) ((i * 37) % 101) / 101.0f;
	for (i = 0; i < hd / 2; i++)
		mp->inv[i] = i < hd / 8 ? powf(10000.0f, -2.0f * (float) i / (float) hd) : 0.0f;
	mp->L.group = G4_KVG_FULL;
	mp->L.index = 0;
	mp->L.n_heads = heads;
	mp->L.n_kv_heads = kv_heads;
	mp->L.head_dim = hd;
	mp->L.k_eq_v = k_eq_v;
	mp->L.scale = 1.0f / sqrtf((float) hd);
	mp->L.k_norm_w = mp->knorm;
	mp->L.inv_freq = mp->inv;
	return 0;
}

static void
mini_pool_free(mini_pool *mp)
{
	free(mp->desc.base[G4_KVG_FULL]);
	free(mp->desc.block_tables[G4_KVG_FULL]);
	free(mp->knorm);
	free(mp->inv);
	if (mp->be)
		mp->be->ops->destroy(mp->be);
}

/* A step of n tokens that only stores: empty visible ranges. */
static g4_step_meta
store_step(int n, const int32_t *tok, const int32_t *pos, const int32_t *slot)
{
	g4_step_meta m;

	memset(&m, 0, sizeof(m));
	m.n_tokens = n;
	m.token = tok;
	m.pos = pos;
	m.slot = slot;
	m.lo[0] = m.lo[1] = pos;
	m.hi[0] = m.hi[1] = pos;
	return m;
}

/*
 * head_norm_rope given the layer writes the pool as head_norm_rope then
 * kv_store do, in every dtype, with and without k_eq_v; it refuses a layer
 * whose stored rows are not all runs.  (The CUDA backend's one launch is
 * held to the same composition by the GPU parity rows.)
 */
G4_TEST(kv_head_norm_rope_stores_as_kv_store)
{
	static const int dtypes[] = {G4_KV_F32, G4_KV_BF16, G4_KV_TURBOQUANT_K8V4};
	const int	hd = 64,
				heads = 4,
				kvh = 2,
				n = 21;

	for (size_t d = 0; d < G4_ARRAY_LEN(dtypes); d++)
		for (int keqv = 0; keqv <= 1; keqv++)
		{
			mini_pool	pair,
						one;
			int			stride = (heads + (keqv ? 1 : 2) * kvh) * hd;
			size_t		len = (size_t) n * (size_t) stride;
			float	   *x = malloc(len * sizeof(float)),
					   *y = malloc(len * sizeof(float)),
					   *qw = malloc((size_t) hd * sizeof(float));
			int32_t		tok[21] = {0},
						pos[21],
						slot[21] = {0};
			g4_step_meta m;
			g4_head_run runs[G4_HEAD_RUNS_MAX];
			int			nr = 0;

			CHECK(x && y && qw);
			CHECK(mini_pool_init(&pair, dtypes[d], hd, heads, kvh, keqv, 64) == 0);
			CHECK(mini_pool_init(&one, dtypes[d], hd, heads, kvh, keqv, 64) == 0);
			for (size_t i = 0; i < len; i++)
				x[i] = y[i] = h_normal(&rng_state) * 2.0f;
			for (int i = 0; i < hd; i++)
				qw[i] = 1.0f + 0.2f * h_normal(&rng_state);
			for (int i = 0; i < n; i++)
				pos[i] = 3 + 2 * i;
			runs[nr++] = (g4_head_run) {0, heads, qw, pair.inv, 0};
			if (keqv)
				runs[nr++] = (g4_head_run) {heads * hd, kvh, NULL, NULL, G4_STORE_V};
			else
			{
				runs[nr++] = (g4_head_run) {heads * hd, kvh, pair.knorm, pair.inv, G4_STORE_K};
				runs[nr++] = (g4_head_run) {(heads + kvh) * hd, kvh, NULL, NULL, G4_STORE_V};
			}
			m = store_step(n, tok, pos, slot);
			CHECK_INT(pair.be->ops->step_begin(pair.be, &m), G4_OK);
			CHECK_INT(pair.be->ops->head_norm_rope(pair.be, x, n, stride, hd, runs, nr, 1e-6f, NULL), G4_OK);
			CHECK_INT(pair.be->ops->kv_store(pair.be, &pair.L, keqv ? NULL : x + heads * hd, stride,
											 x + (heads + (keqv ? 0 : kvh)) * hd, stride, n), G4_OK);
			CHECK_INT(one.be->ops->step_begin(one.be, &m), G4_OK);
			CHECK_INT(one.be->ops->head_norm_rope(one.be, y, n, stride, hd, runs, nr, 1e-6f, &one.L), G4_OK);
			CHECK_MSG(memcmp(x, y, len * sizeof(float)) == 0, "dtype %d k_eq_v %d: rows differ", dtypes[d], keqv);
			CHECK_MSG(memcmp(pair.desc.base[G4_KVG_FULL], one.desc.base[G4_KVG_FULL],
							 pair.desc.layer_stride[G4_KVG_FULL]) == 0, "dtype %d k_eq_v %d: pools differ", dtypes[d],
					  keqv);
			/* the value's run unmarked: not every stored row is a run */
			runs[nr - 1].store = 0;
			CHECK_INT(one.be->ops->head_norm_rope(one.be, y, n, stride, hd, runs, nr, 1e-6f, &one.L),
					  G4_ERR_INTERNAL);
			mini_pool_free(&pair);
			mini_pool_free(&one);
			free(x);
			free(y);
			free(qw);
		}
}

/* Store n random tokens, then attend with nq queries at the given positions
 * and ranges; out [nq][heads*hd]. */
static int
run_attention(mini_pool *mp, const float *k, const float *v, int n, const float *q, int nq, const int32_t *qpos,
			  const int32_t *lo, const int32_t *hi, float *out)
{
	g4_backend *be = mp->be;
	int			kvw = mp->L.n_kv_heads * mp->L.head_dim;
	int32_t    *tok = calloc((size_t) n, sizeof(int32_t));
	int32_t    *pos = malloc(sizeof(int32_t) * (size_t) n);
	int32_t    *slot = calloc((size_t) n, sizeof(int32_t));
	g4_step_meta m;
	int			i;
	int			rc;

	for (i = 0; i < n; i++)
		pos[i] = i;
	m = store_step(n, tok, pos, slot);
	rc = be->ops->step_begin(be, &m);
	if (rc == G4_OK)
		rc = be->ops->kv_store(be, &mp->L, mp->L.k_eq_v ? NULL : k, kvw, v, kvw, n);
	m.n_tokens = nq;
	m.pos = qpos;
	m.lo[G4_KVG_FULL] = lo;
	m.hi[G4_KVG_FULL] = hi;
	if (rc == G4_OK)
		rc = be->ops->step_begin(be, &m);
	if (rc == G4_OK)
		rc = be->ops->attention(be, &mp->L, q, mp->L.n_heads * mp->L.head_dim, nq, out);
	free(tok);
	free(pos);
	free(slot);
	return rc;
}

/* float64 reference of the same attention */
static void
ref_attention(const mini_pool *mp, const float *k, const float *v, const float *q, int nq, const int32_t *qpos,
			  const int32_t *lo, const int32_t *hi, double *out)
{
	int			hd = mp->L.head_dim,
				H = mp->L.n_heads,
				KV = mp->L.n_kv_heads;
	int			t,
				h,
				j,
				d;

	(void) qpos;
	for (t = 0; t < nq; t++)
		for (h = 0; h < H; h++)
		{
			int			g = h / (H / KV);
			const float *qh = q + (size_t) t * H * hd + (size_t) h * hd;
			double		m = -INFINITY,
						sum = 0;
			double	   *o = out + (size_t) t * H * hd + (size_t) h * hd;
			double	   *sc = malloc(sizeof(double) * (size_t) (hi[t] - lo[t]));

			for (j = lo[t]; j < hi[t]; j++)
			{
				double		kk[512];
				double		s = 0;

				for (d = 0; d < hd; d++)
				{
					const float *src = mp->L.k_eq_v ? v : k;

					kk[d] = src[(size_t) j * KV * hd + (size_t) g * hd + d];
					if (mp->L.k_eq_v)
						kk[d] *= mp->L.k_norm_w[d];
				}
				if (mp->L.k_eq_v)
					for (d = 0; d < hd / 2; d++)
					{
						double		ang = (double) (float) ((float) j * mp->L.inv_freq[d]);
						double		a = kk[d],
									b = kk[d + hd / 2];

						if (mp->L.inv_freq[d] == 0.0f)
							continue;
						kk[d] = a * cos(ang) - b * sin(ang);
						kk[d + hd / 2] = b * cos(ang) + a * sin(ang);
					}
				for (d = 0; d < hd; d++)
					s += qh[d] * kk[d];
				s *= mp->L.scale;
				sc[j - lo[t]] = s;
				m = fmax(m, s);
			}
			for (d = 0; d < hd; d++)
				o[d] = 0;
			for (j = lo[t]; j < hi[t]; j++)
			{
				double		p = exp(sc[j - lo[t]] - m);

				sum += p;
				for (d = 0; d < hd; d++)
					o[d] += p * v[(size_t) j * KV * hd + (size_t) g * hd + d];
			}
			for (d = 0; d < hd; d++)
				o[d] /= sum;
			free(sc);
		}
}

typedef struct
{
	int			hd,
				heads,
				kv_heads,
				k_eq_v,
				n;
} attn_shape;

static const attn_shape shapes[] = {
	{256, 16, 8, 0, 1500},		/* Gemma 4 sliding layer */
	{512, 16, 1, 1, 3000},		/* Gemma 4 full layer, K derived from V */
	{16, 4, 2, 0, 300},			/* the fixture's sliding layer */
	{32, 4, 1, 1, 300},
};

/* q sized so scores have a spread like a trained model's (a few units) */
static void
fill_inputs(const attn_shape *s, float *k, float *v, float *q, int nq)
{
	size_t		i;

	for (i = 0; i < (size_t) s->n * s->kv_heads * s->hd; i++)
	{
		k[i] = h_normal(&rng_state);
		v[i] = h_normal(&rng_state);
	}
	for (i = 0; i < (size_t) nq * s->heads * s->hd; i++)
		q[i] = h_normal(&rng_state) * 2.0f;
}

/* queries: decode at the end, a causal row mid-way, a sliding window, a
 * split-KV sized range and a bidirectional block reaching past the query */
static int
make_queries(int n, int32_t *qpos, int32_t *lo, int32_t *hi)
{
	qpos[0] = n - 1, lo[0] = 0, hi[0] = n;
	qpos[1] = n / 2, lo[1] = 0, hi[1] = n / 2 + 1;
	qpos[2] = n - 7, lo[2] = n - 7 - 100, hi[2] = n - 6;
	qpos[3] = 5, lo[3] = 0, hi[3] = 6;
	qpos[4] = n / 3, lo[4] = n / 3 - 20, hi[4] = n / 3 + 12;
	return 5;
}

G4_TEST(kv_attention_exact_pool_matches_float64)
{
	size_t		si;

	for (si = 0; si < G4_ARRAY_LEN(shapes); si++)
	{
		const attn_shape *s = &shapes[si];
		mini_pool	mp;
		float	   *k = malloc(sizeof(float) * (size_t) s->n * s->kv_heads * s->hd);
		float	   *v = malloc(sizeof(float) * (size_t) s->n * s->kv_heads * s->hd);
		float	   *q = malloc(sizeof(float) * 5 * s->heads * s->hd);
		float	   *out = malloc(sizeof(float) * 5 * s->heads * s->hd);
		double	   *ref = malloc(sizeof(double) * 5 * s->heads * s->hd);
		int32_t		qpos[5],
					lo[5],
					hi[5];
		int			nq = make_queries(s->n, qpos, lo, hi);
		double		num = 0,
					den = 0;
		size_t		i;

		CHECK(k && v && q && out && ref);
		CHECK(mini_pool_init(&mp, G4_KV_F32, s->hd, s->heads, s->kv_heads, s->k_eq_v, s->n) == 0);
		fill_inputs(s, k, v, q, nq);
		CHECK_INT(run_attention(&mp, k, v, s->n, q, nq, qpos, lo, hi, out), G4_OK);
		ref_attention(&mp, k, v, q, nq, qpos, lo, hi, ref);
		for (i = 0; i < (size_t) nq * s->heads * s->hd; i++)
		{
			num += (out[i] - ref[i]) * (out[i] - ref[i]);
			den += ref[i] * ref[i];
		}
		/* float32 arithmetic throughout: a few ulps of relative error */
		CHECK_MSG(sqrt(num / den) < 1e-5, "hd %d: relative error %.3g against float64", s->hd, sqrt(num / den));
		mini_pool_free(&mp);
		free(k);
		free(v);
		free(q);
		free(out);
		free(ref);
	}
}

G4_TEST(kv_attention_compressed_dtypes_figures)
{
	size_t		si;

	for (si = 0; si < 2; si++)
	{
		const attn_shape *s = &shapes[si];
		float	   *k = malloc(sizeof(float) * (size_t) s->n * s->kv_heads * s->hd);
		float	   *v = malloc(sizeof(float) * (size_t) s->n * s->kv_heads * s->hd);
		float	   *q = malloc(sizeof(float) * 5 * s->heads * s->hd);
		float	   *out[3];
		int32_t		qpos[5],
					lo[5],
					hi[5];
		int			nq = make_queries(s->n, qpos, lo, hi);
		int			dtype;
		size_t		width = (size_t) nq * s->heads * s->hd;

		CHECK(k && v && q);
		fill_inputs(s, k, v, q, nq);
		for (dtype = G4_KV_F32; dtype <= G4_KV_TURBOQUANT_K8V4; dtype++)
		{
			mini_pool	mp;

			out[dtype] = malloc(sizeof(float) * width);
			CHECK(out[dtype]);
			CHECK(mini_pool_init(&mp, dtype, s->hd, s->heads, s->kv_heads, s->k_eq_v, s->n) == 0);
			CHECK_INT(run_attention(&mp, k, v, s->n, q, nq, qpos, lo, hi, out[dtype]), G4_OK);
			mini_pool_free(&mp);
		}
		for (dtype = G4_KV_BF16; dtype <= G4_KV_TURBOQUANT_K8V4; dtype++)
		{
			double		num = 0,
						den = 0;
			size_t		i;
			double		rel;

			for (i = 0; i < width; i++)
			{
				num += ((double) out[dtype][i] - out[0][i]) * ((double) out[dtype][i] - out[0][i]);
				den += (double) out[0][i] * out[0][i];
			}
			rel = sqrt(num / den);
			printf("    figure: attention output relative error, %s KV, head_dim %d%s, %d keys: %.4f\n",
				   dtype == G4_KV_BF16 ? "bf16" : "turboquant_k8v4", s->hd, s->k_eq_v ? " (K from V)" : "",
				   s->n, rel);
			/*
			 * Bounds from the formats, for Gaussian values: bf16 rounds to
			 * 2^-9 relative.  4-bit values with one scale per 32 have a
			 * step of 2 max|v|/15 ~ 2 * 2.4 sigma/15 = 0.32 sigma, so a
			 * uniform rounding error of 0.32/sqrt(12) ~ 9.2% of sigma per
			 * element; a softmax mixture of independent rows keeps that
			 * ratio.  With K derived from an 8-bit V (one scale per 512)
			 * the step is ~3.2 sigma/127, an error under 1%.
			 */
			CHECK_MSG(rel < (dtype == G4_KV_BF16 ? 0.01 : s->k_eq_v ? 0.02 : 0.12), "relative error %.3g", rel);
		}
		for (dtype = 0; dtype < 3; dtype++)
			free(out[dtype]);
		free(k);
		free(v);
		free(q);
	}
}
