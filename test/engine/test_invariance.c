/*
 * test_invariance.c — a sequence's output does not depend on its company:
 * the CPU kernels give bitwise-identical results whatever the batch (the
 * weight-format dot products for one or many activation rows, attention
 * with its key range on one thread or split over all), so a request served
 * among fifteen others answers exactly as it does alone.
 */
#include "harness.h"
#include "quant.h"
#include "test.h"
#include "xorshift.h"

static uint64_t seed = 0x243f6a8885a308d3ull;

static uint32_t
rnd(void)
{
	return (uint32_t) (h_xorshift64(&seed) >> 32);
}

static float
frnd(void)
{
	return (float) ((double) rnd() / 4294967296.0 * 2.0 - 1.0);
}

/* A random row of a format whose float fields (f32, f16/bf16 values, the
 * blocks' f16 scales) all hold finite values. */
static void
fill_row(int fmt, uint8_t *row, int64_t in)
{
	size_t		rb = g4_wfmt_row_bytes(fmt, in);
	size_t		i;
	size_t		bsz = 0;
	static const struct
	{
		int			fmt;
		size_t		bytes;
		int			f16_at[2];	/* offsets of f16 fields in a block, -1 if none */
	}			blocks[] = {
		{G4_W_Q8_0, 34, {0, -1}}, {G4_W_Q4_0, 18, {0, -1}}, {G4_W_Q4_1, 20, {0, 2}},
		{G4_W_Q5_0, 22, {0, -1}}, {G4_W_Q5_1, 24, {0, 2}}, {G4_W_Q4_K, 144, {0, 2}},
		{G4_W_Q5_K, 176, {0, 2}}, {G4_W_Q6_K, 210, {208, -1}},
	};

	for (i = 0; i < rb; i++)
		row[i] = (uint8_t) rnd();
	if (fmt == G4_W_F32)
		for (i = 0; i < (size_t) in; i++)
		{
			float		v = frnd();

			memcpy(row + 4 * i, &v, 4);
		}
	else if (fmt == G4_W_F16 || fmt == G4_W_BF16)
		for (i = 0; i < (size_t) in; i++)
		{
			uint16_t	h = fmt == G4_W_F16 ? g4_f32_to_f16(frnd()) : g4_f32_to_bf16(frnd());

			memcpy(row + 2 * i, &h, 2);
		}
	for (i = 0; i < G4_ARRAY_LEN(blocks); i++)
		if (blocks[i].fmt == fmt)
		{
			size_t		b;
			int			k;

			bsz = blocks[i].bytes;
			for (b = 0; b + bsz <= rb; b += bsz)
				for (k = 0; k < 2; k++)
					if (blocks[i].f16_at[k] >= 0)
					{
						uint16_t	h = g4_f32_to_f16(0.01f + 0.01f * (frnd() + 1.0f));

						memcpy(row + b + blocks[i].f16_at[k], &h, 2);
					}
		}
}

G4_TEST(invariance_dot_row_same_for_any_batch)
{
	static const int fmts[] = {G4_W_F32, G4_W_F16, G4_W_BF16, G4_W_I4G32, G4_W_Q8_0, G4_W_Q4_0, G4_W_Q4_1,
	G4_W_Q5_0, G4_W_Q5_1, G4_W_Q4_K, G4_W_Q5_K, G4_W_Q6_K};
	static const int widths[] = {512, 1024, 1536};
	size_t		f,
				wi;

	for (f = 0; f < G4_ARRAY_LEN(fmts); f++)
		for (wi = 0; wi < G4_ARRAY_LEN(widths); wi++)
		{
			int			fmt = fmts[f];
			int64_t		in = widths[wi];
			size_t		rb = g4_wfmt_row_bytes(fmt, in);
			uint8_t    *row = malloc(rb);
			uint16_t	scales[64];
			float	   *x = malloc(sizeof(float) * (size_t) in * 9);
			float		one[9],
						many[9];
			size_t		i;
			int			t,
						path;

			CHECK(row && x);
			fill_row(fmt, row, in);
			for (i = 0; i < 64; i++)
				scales[i] = g4_f32_to_bf16(0.01f + 0.001f * (float) i);
			for (i = 0; i < (size_t) in * 9; i++)
				x[i] = frnd();
			for (path = 0; path <= g4_quant_simd_available(); path++)
			{
				for (t = 0; t < 9; t++)
					g4_dot_row_path(path, fmt, row, fmt == G4_W_I4G32 ? scales : NULL, in, x + (size_t) t * in, in,
									1, &one[t], 1);
				g4_dot_row_path(path, fmt, row, fmt == G4_W_I4G32 ? scales : NULL, in, x, in, 9, many, 1);
				for (t = 0; t < 9; t++)
					CHECK_MSG(memcmp(&one[t], &many[t], sizeof(float)) == 0,
							  "%s, %lld columns, path %d: row %d gives %.9g alone and %.9g in a batch of 9",
							  g4_wfmt_name(fmt), (long long) in, path, t, (double) one[t], (double) many[t]);
			}
			free(row);
			free(x);
		}
}

/* The same request alone and in the middle of a batch: bitwise-identical
 * logits at every sampled position, so identical tokens.  The long prompt
 * crosses several attention splits (512 keys each). */
G4_TEST(invariance_request_alone_or_batched)
{
	const char *model = h_fixture_model();
	g4_options	o;
	g4_engine  *e;
	g4_err		err;
	int32_t    *ids;
	int			n = 1400;
	h_result	alone,
				batch[5];
	int			i;

	if (!model)
		G4_SKIP("G4_FIXTURE_MODEL not set (run through make check-engine)");
	ids = malloc(sizeof(int32_t) * (size_t) n);
	CHECK(ids);
	for (i = 0; i < n; i++)
		ids[i] = i == 0 ? 2 : 300 + (i * 7919) % 9000;
	h_options(&o, model);
	o.kv_pool_bytes = (size_t) 128 << 20;
	o.max_num_batched_tokens = 2048;
	CHECK_OK(g4_open(&o, &e, &err), &err);
	{
		g4_request	req;

		h_token_request(&req, ids, n, 16);
		CHECK_OK(h_run_one(e, &req, 1000, &alone, &err), &err);
	}
	{
		h_run		run = {batch, 5};
		g4_request	req;

		memset(batch, 0, sizeof(batch));
		h_attach(e, &run);
		for (i = 0; i < 5; i++)
		{
			/* the request of interest is the third; the others differ */
			h_token_request(&req, i == 2 ? ids : ids + 10 * i, i == 2 ? n : n - 10 * i, 16);
			CHECK_OK(g4_submit(e, &req, &batch[i].id, &err), &err);
		}
		CHECK_OK(h_drain(e, &run, 1000, &err), &err);
	}
	CHECK(alone.first_logits && batch[2].first_logits);
	CHECK_MSG(memcmp(alone.first_logits, batch[2].first_logits, sizeof(float) * (size_t) alone.vocab) == 0,
			  "logits differ between the request alone and batched");
	CHECK_INT(batch[2].n_tokens, alone.n_tokens);
	for (i = 0; i < alone.n_tokens; i++)
		CHECK_INT(batch[2].tokens[i], alone.tokens[i]);
	h_result_free(&alone);
	for (i = 0; i < 5; i++)
		h_result_free(&batch[i]);
	free(ids);
	g4_close(e);
}
