/*
 * parity_table.c — the GPU parity table: each row an operation, the shapes
 * and dtypes it covers, the row counts or variants it expands to, and for
 * each check the bound and why.  Run by parity_run.c, a family (the kinds'
 * .family) per test; G4_PARITY_LIST=1 lists every check without a device.
 *
 * The classes of bounds:
 *  - exact: integer / copy / encode operations agree bit for bit (embedding
 *    rows, the draft model's input rows, logit-row gathering, the KV
 *    encodings, the sampler's and argmax's choice), and so does a matmul
 *    repeated on the same inputs;
 *  - float32-class: float32 arithmetic in another order (norms, RoPE with
 *    sincosf's 2-ulp error, float32 and split-bf16 matmuls): max |gpu - cpu|
 *    relative to the magnitude of the terms involved, 3e-5 at most;
 *  - bf16-class: the prefill / batched matmul rounds activations (and the
 *    int4 weights with their folded scale) to bf16, 2^-9 relative each, so
 *    |error| <= 2^-8 · Σ|w·x| (bound 8e-3 of that sum);
 *  - f16 attention: q, k, v and the probabilities rounded to f16 (2^-11
 *    relative); with f16-exact inputs only P's rounding remains (bound 2e-3
 *    of max|v|), on random Gemma-like inputs (scale 1, unit-RMS q and k) the
 *    score error is ~2^-11·sqrt(2·hd) standard deviations: bound 0.1 of
 *    max|v| (a figure; the exact-input rows check the logic).
 *
 * Rows with the same non-zero share, one after another, use one fixture
 * (one weight, one KV pool, ...): the weight is built once for the row
 * counts of both its bounds.
 */
#include "engine.h"
#include "media.h"
#include "parity.h"
#include "util.h"

/* ---- why each bound ------------------------------------------------------------------ */

#define WHY_GEMV "float32-class: the GEMV (int4: 1 to 8 rows on Hopper, 16 elsewhere; bf16: 1 to 8) takes activations as two bf16 (hi + lo), weights exact in bf16"
#define WHY_BF16 "bf16-class: activations (and int4 weights with their scale) rounded to bf16 (int4: wgmma from 9 rows, gemm and cuBLASLt from 17; bf16: gemm from 9)"
#define WHY_NARROW "float32-class: in <= 256, the device keeps the weight in float32 (backend_cuda.cu)"
#define WHY_FLOAT "float32-class: float32 products of the dequantised weights, in another order"
#define WHY_REPEAT "exact: outputs differing between two calls (deterministic reductions)"
#define WHY_PRODUCED "exact: outputs differing from the product of the producer's output converted"
#define WHY_GEGLU_FUSED "exact: outputs differing from matmul then geglu (each checked against the CPU above)"
#define WHY_GEGLU_BF16 "bf16-class: the product's bound (8e-3 of sum |w.x|, the product rounded to bf16 too) carried through gelu (|gelu'| <= 1.13) and up"
#define WHY_COPY "exact: elements differing (rows copied, dequantised and scaled alike)"
#define WHY_CONCAT "exact: elements differing (rows copied, dequantised and scaled alike; zeros for a G4_SAMPLE_NAN id)"
#define WHY_ARGMAX "exact: rows differing (ties to the first, a NaN anywhere: G4_SAMPLE_NAN, all -inf: 0)"
#define WHY_NORM "float32-class: float32 sums of squares in another order"
#define WHY_ROPE "float32-class: positions up to 262143, sincosf's 2 ulp on the angle's sine"
#define WHY_GELU "float32-class: tanh-approximated GELU times up, tanhf in float32"
#define WHY_LAYERNORM "float32-class: float32 mean and variance in another order"
/*
 * The device sampler: no id differs.  Both sides compute e with float32
 * sub, div and expf (CUDA's expf is within 2 ulp, the host's correctly
 * rounded in most cases) and sum the same integer weights, so an id can
 * differ only where a filter boundary or the draw falls within an ulp of an
 * e: ~1e-7 per check, not expected in a few hundred.
 */
#define WHY_SAMPLE "exact: ids differing; only a boundary within an ulp of an e could part them (~1e-7)"
#define WHY_KV_STORE "exact: bytes differing (the encodings are the same functions)"
#define WHY_HNR_STORE "exact: the one operation's rows and pool bytes against head_norm_rope then kv_store (each checked against the CPU)"
#define WHY_ATT_F32 "float32 kernel: float32 arithmetic in another order"
#define WHY_TC "tensor cores: f16 q, k, v, P; ~2^-11 sqrt(2 hd) sd of the scores on random inputs (a figure)"
#define WHY_TC_EXACT "tensor cores on f16-exact inputs: only P's rounding to f16 (2^-11) remains"
#define WHY_PREFILL "prefill kernel: the tensor cores' f16 inputs and float32 sums, their bound"
#define WHY_PREFILL_EXACT "prefill kernel on f16-exact inputs: only P's rounding to f16 remains"
#define WHY_GEMM "k_eq_v prefill on cuBLASLt: the tensor cores' f16 q, k, v and P, float32 scores and sums, their bound"
#define WHY_GEMM_EXACT "k_eq_v prefill on cuBLASLt on f16-exact inputs: only P's rounding to f16 remains"
#define WHY_DECODE "decode kernel: f16 queries, P and values, the tensor cores' bound on random inputs"

/* ---- shorthands ------------------------------------------------------------------------ */

/* MM(family, format, parts fused, {each part's rows}, in[, G4_MATMUL_I4]) */
#define MM(family, ...) .kind = &parity_matmul_##family, .a.mm = {__VA_ARGS__}
#define MATMUL(bound, why) .check = {{"matmul", NULL, bound, why}, {"matmul repeat", NULL, 0.0, WHY_REPEAT}}
/* row counts: the int4 GEMV's 1 to 16 (1, 2 or 4 n8 tiles, each partly and
 * wholly; forced: on Hopper it serves up to 8), then 9 to 16 (the GEMV, or
 * on Hopper the warpgroup-MMA kernel), the block sizes of the warpgroup-MMA
 * kernel (32, 64, 128, then tiles of 128 up to 512; the mma.sync gemm where
 * wgmma is absent) and beyond (from 160 without wgmma) the bf16
 * dequantisation + cuBLASLt (g4c_matmul_i4) */
#define GEMV_NS 1, 2, 3, 4, 5, 8, 11, 12, 16
#define GEMM_NS 12, 16, 17, 24, 40, 64, 100, 300
#define DECODE_NS 11, 16, 17, 32, 33, 64, 65, 128, 256, 512

#define CHECK1(op, bound, why) .check = {{op, NULL, bound, why}}
/* attention's own check, then the o projection's products from its bf16
 * copy and from its output converted (parity_attention.c) */
#define ATTN_CHECK(op, bound, why) .check = {{op, NULL, bound, why}, \
	{"matmul after attention", NULL, 0.0, WHY_PRODUCED}}
#define SAMPLE(...) .kind = &parity_sample, .a.sample = {__VA_ARGS__}
#define POOL(kind_, ...) .kind = &parity_attention_##kind_, .a.pool = {__VA_ARGS__}
/* the steps of attention over a pool */
#define ALL_STEPS ATT_DECODE_1, ATT_DECODE_4, ATT_VERIFY, ATT_PREFILL_DECODE, ATT_PREFILL_SHORT, ATT_PREFILL_LONG
/* the steps with a prefill run of 64 tokens or more: the full layers' on cuBLASLt */
#define RUN_STEPS ATT_PREFILL_DECODE, ATT_PREFILL_LONG
#define TC_STEPS ATT_DECODE_1, ATT_DECODE_4, ATT_VERIFY, ATT_PREFILL_SHORT
#define SMALL_STEPS ATT_DECODE_1, ATT_DECODE_4, ATT_VERIFY, ATT_PREFILL_DECODE, ATT_PREFILL_SHORT
/* KV(dtype, small pool): both layer groups */
#define KV(...) .kind = &parity_kv_store, .a.pool = {__VA_ARGS__}, EACH(0, 1)
/* the same for head_norm_rope given the layer */
#define HNR_STORE(...) .kind = &parity_head_norm_rope_store, .a.pool = {__VA_ARGS__}, EACH(0, 1), \
	CHECK1("head_norm_rope + store", 0, WHY_HNR_STORE)

const parity_row parity_table[] = {
	/* ---- matmul: int4 (seed 1) ---- */
	/* one weight, a fused one, odd rows, a half-padded last k-tile (in % 64 == 32) */
	{MM(int4, G4_W_I4G32, 1, {4096}, 3840, "gemv"), EACH(GEMV_NS), MATMUL(3e-5, WHY_GEMV), .seed = 1, .share = 1},
	{MM(int4, G4_W_I4G32, 1, {4096}, 3840), EACH(GEMM_NS), MATMUL(8e-3, WHY_BF16), .share = 1},
	{MM(int4, G4_W_I4G32, 3, {512, 256, 256}, 640, "gemv"), EACH(GEMV_NS), MATMUL(3e-5, WHY_GEMV), .share = 2},
	{MM(int4, G4_W_I4G32, 3, {512, 256, 256}, 640), EACH(GEMM_NS), MATMUL(8e-3, WHY_BF16), .share = 2},
	{MM(int4, G4_W_I4G32, 1, {1000}, 1024, "gemv"), EACH(GEMV_NS), MATMUL(3e-5, WHY_GEMV), .share = 3},
	{MM(int4, G4_W_I4G32, 1, {1000}, 1024), EACH(GEMM_NS), MATMUL(8e-3, WHY_BF16), .share = 3},
	{MM(int4, G4_W_I4G32, 2, {520, 250}, 672, "gemv"), EACH(GEMV_NS), MATMUL(3e-5, WHY_GEMV), .share = 4},
	{MM(int4, G4_W_I4G32, 2, {520, 250}, 672), EACH(GEMM_NS), MATMUL(8e-3, WHY_BF16), .share = 4},
	{MM(int4, G4_W_I4G32, 1, {3840}, 15360, "gemv"), EACH(1, 16), MATMUL(3e-5, WHY_GEMV), .share = 5},
	{MM(int4, G4_W_I4G32, 1, {3840}, 15360), EACH(200), MATMUL(8e-3, WHY_BF16), .share = 5},
	{MM(int4, G4_W_I4G32, 3, {64, 32, 32}, 64), EACH(7, 139), MATMUL(3e-5, WHY_NARROW)},

	/*
	 * The 12B decode shapes at 1 to 16 rows (the GEMV, K split over
	 * blocks) and 17 to 256 (each block size of the gemm, K split), and a
	 * wide one, its rows and columns both padded, whose K stays unsplit up
	 * to 8 rows (282 unit groups: two splits are more blocks than the H200
	 * holds at once) and for which no split is all resident at once at 9 to
	 * 16 rows (the GEMV's other split rule).  One weight for both bounds:
	 * gate_up's |W| copy (~470 MB) is built once.
	 */
	{MM(int4, G4_W_I4G32, 3, {4096, 1024, 1024}, 3840, "gemv"), EACH(GEMV_NS), MATMUL(3e-5, WHY_GEMV), .share = 6},
	{MM(int4, G4_W_I4G32, 3, {4096, 1024, 1024}, 3840), EACH(DECODE_NS), MATMUL(8e-3, WHY_BF16), .share = 6},
	{MM(int4, G4_W_I4G32, 2, {15360, 15360}, 3840, "gemv"), EACH(GEMV_NS), MATMUL(3e-5, WHY_GEMV), .share = 7},
	{MM(int4, G4_W_I4G32, 2, {15360, 15360}, 3840), EACH(64, 256), MATMUL(8e-3, WHY_BF16), .share = 7},
	{MM(int4, G4_W_I4G32, 1, {3840}, 15360, "gemv"), EACH(GEMV_NS), MATMUL(3e-5, WHY_GEMV), .share = 8},
	{MM(int4, G4_W_I4G32, 1, {3840}, 15360), EACH(DECODE_NS), MATMUL(8e-3, WHY_BF16), .share = 8},
	{MM(int4, G4_W_I4G32, 1, {3840}, 4096, "gemv"), EACH(GEMV_NS), MATMUL(3e-5, WHY_GEMV), .share = 9},
	{MM(int4, G4_W_I4G32, 1, {3840}, 4096), EACH(DECODE_NS), MATMUL(8e-3, WHY_BF16), .share = 9},
	{MM(int4, G4_W_I4G32, 1, {36008}, 672, "gemv"), EACH(GEMV_NS), MATMUL(3e-5, WHY_GEMV)},

	/* the cuBLASLt path: by row count (520), and forced (G4_MATMUL_I4=lt)
	 * at counts the gemm serves, incl. a half-padded last k-tile; a fresh
	 * weight each, so that each row count dequantises it (a weight called
	 * again reuses its dequantised copy: the next row) */
	{MM(int4, G4_W_I4G32, 1, {1000}, 1024), EACH(520), MATMUL(8e-3, WHY_BF16)},
	{MM(int4, G4_W_I4G32, 1, {4096}, 3840, "lt"), EACH(17), MATMUL(8e-3, WHY_BF16)},
	{MM(int4, G4_W_I4G32, 1, {4096}, 3840, "lt"), EACH(100), MATMUL(8e-3, WHY_BF16)},
	{MM(int4, G4_W_I4G32, 1, {4096}, 3840, "lt"), EACH(300), MATMUL(8e-3, WHY_BF16)},
	{MM(int4, G4_W_I4G32, 2, {520, 250}, 672, "lt"), EACH(17), MATMUL(8e-3, WHY_BF16)},
	{MM(int4, G4_W_I4G32, 2, {520, 250}, 672, "lt"), EACH(100), MATMUL(8e-3, WHY_BF16)},
	{MM(int4, G4_W_I4G32, 2, {520, 250}, 672, "lt"), EACH(300), MATMUL(8e-3, WHY_BF16)},
	{MM(int4, G4_W_I4G32, 1, {3840}, 15360, "lt"), EACH(200), MATMUL(8e-3, WHY_BF16)},
	/* the mma.sync gemm, which serves 17 to 128 rows where the warpgroup-MMA
	 * kernel is not built or not the device's, forced (G4_MATMUL_I4=gemm) */
	{MM(int4, G4_W_I4G32, 1, {4096}, 3840, "gemm"), EACH(17, 64, 100), MATMUL(8e-3, WHY_BF16)},
	{MM(int4, G4_W_I4G32, 2, {520, 250}, 672, "gemm"), EACH(17, 64, 100), MATMUL(8e-3, WHY_BF16)},

	/*
	 * The cuBLASLt path dequantises a weight once and keeps the last two in
	 * slots (matmul_lt.cu), as the MLP's row slices call gate_up and down
	 * in turn: three weights called A B A B C A B C (hits, then each slot
	 * refilled in turn), then after a step_begin (which empties the slots)
	 * C A, each call within the bf16 bound and bit for bit its weight's
	 * first product (seed 13).
	 */
	{.kind = &parity_matmul_reused,
	 .a.reuse = {.w = {{G4_W_I4G32, 1, {1000}, 1024}, {G4_W_I4G32, 2, {520, 250}, 672},
				   {G4_W_I4G32, 1, {4096}, 3840}}, .n = 200},
	 EACH(0, 1, 0, 1, 2, 0, 1, 2, STEP_BEGINS, 2, 0),
	 .check = {{"matmul reused", NULL, 8e-3, WHY_BF16},
			   {"matmul reused same", NULL, 0.0, "exact: outputs differing from the weight's first call"}},
	 .seed = 13},

	/*
	 * A matmul straight after the kernel that made its input takes that
	 * kernel's bf16 copy (matmul_input.cu): each producer, the add_rmsnorm
	 * of registers (in <= 4096) and of loops (5120), on the warpgroup-MMA
	 * kernel (16, 64 rows), cuBLASLt (520) and the mma.sync gemm (forced);
	 * within the bf16 bound and bit for bit the product of the converted
	 * output; and the output written again before the matmul (an upload, a
	 * kernel), which the copy then no longer stands for (seed 14).
	 */
	{.kind = &parity_matmul_produced, .a.mm = {G4_W_I4G32, 1, {512}, 3840},
	 EACH(PRODUCED(RMSNORM, 16), PRODUCED(RMSNORM, 520), PRODUCED(ADD_RMSNORM, 16), PRODUCED(ADD_RMSNORM, 64),
		  PRODUCED(GEGLU, 64), PRODUCED(GEGLU, 520), PRODUCED(THEN_UPLOAD, 16), PRODUCED(THEN_KERNEL, 64),
		  PRODUCED(MATMUL_GEGLU, 520)),
	 .check = {{"matmul produced", NULL, 8e-3, WHY_BF16}, {"matmul produced same", NULL, 0.0, WHY_PRODUCED}},
	 .seed = 14},
	{.kind = &parity_matmul_produced, .a.mm = {G4_W_I4G32, 1, {512}, 5120}, EACH(PRODUCED(ADD_RMSNORM, 40)),
	 .check = {{"matmul produced", NULL, 8e-3, WHY_BF16}, {"matmul produced same", NULL, 0.0, WHY_PRODUCED}}},
	{.kind = &parity_matmul_produced, .a.mm = {G4_W_I4G32, 1, {512}, 3840, "gemm"},
	 EACH(PRODUCED(RMSNORM, 40), PRODUCED(GEGLU, 40)),
	 .check = {{"matmul produced", NULL, 8e-3, WHY_BF16}, {"matmul produced same", NULL, 0.0, WHY_PRODUCED}}},

	/*
	 * The gate/up product and GEGLU as one operation (matmul_geglu): the
	 * 12B's shape at the GEMV's rows (4) and wgmma's with K split in two
	 * (16, 64); a narrow one whose K splits in many ranges (16 rows), and
	 * the mma.sync gemm forced; bit for bit matmul then geglu (seed 15).
	 * On cuBLASLt (prefill rows: 520, 1,100; and forced) the product is
	 * rounded to bf16 before GEGLU: against the CPU, the product's bound
	 * carried through GEGLU.
	 */
	{.kind = &parity_matmul_geglu, .a.mm = {G4_W_I4G32, 2, {15360, 15360}, 3840}, EACH(4, 16, 64),
	 CHECK1("matmul_geglu", 0.0, WHY_GEGLU_FUSED), .seed = 15},
	{.kind = &parity_matmul_geglu_bf16, .a.mm = {G4_W_I4G32, 2, {15360, 15360}, 3840}, EACH(520, 1100),
	 CHECK1("matmul_geglu bf16", 8e-3, WHY_GEGLU_BF16)},
	{.kind = &parity_matmul_geglu_bf16, .a.mm = {G4_W_I4G32, 2, {512, 512}, 3840, "lt"}, EACH(40),
	 CHECK1("matmul_geglu bf16", 8e-3, WHY_GEGLU_BF16)},
	{.kind = &parity_matmul_geglu, .a.mm = {G4_W_I4G32, 2, {512, 512}, 3840}, EACH(16, 100),
	 CHECK1("matmul_geglu", 0.0, WHY_GEGLU_FUSED)},
	{.kind = &parity_matmul_geglu, .a.mm = {G4_W_I4G32, 2, {512, 512}, 3840, "gemm"}, EACH(40),
	 CHECK1("matmul_geglu", 0.0, WHY_GEGLU_FUSED)},
	{.kind = &parity_matmul_geglu, .a.mm = {G4_W_BF16, 2, {700, 700}, 640}, EACH(5, 64),
	 CHECK1("matmul_geglu", 0.0, WHY_GEGLU_FUSED)},

	/* ---- matmul: bf16 (seed 2) ---- */
	{MM(bf16, G4_W_BF16, 1, {9000}, 3840), EACH(1, 5, 8), MATMUL(3e-5, WHY_GEMV), .seed = 2, .share = 10},
	{MM(bf16, G4_W_BF16, 1, {9000}, 3840), EACH(9, 16, 40, 64, 130), MATMUL(8e-3, WHY_BF16), .share = 10},
	{MM(bf16, G4_W_BF16, 2, {700, 300}, 640), EACH(1, 5, 8), MATMUL(3e-5, WHY_GEMV), .share = 11},
	{MM(bf16, G4_W_BF16, 2, {700, 300}, 640), EACH(9, 16, 40, 64, 130), MATMUL(8e-3, WHY_BF16), .share = 11},
	{MM(bf16, G4_W_BF16, 1, {16384}, 64), EACH(1, 9), MATMUL(3e-5, WHY_NARROW)},

	/* ---- matmul: float and GGUF formats (seed 3) ---- */
	{MM(float, G4_W_F32, 1, {300}, 512), EACH(1, 13, 70), MATMUL(3e-5, WHY_FLOAT), .seed = 3},
	{MM(float, G4_W_F16, 1, {300}, 512), EACH(1, 13, 70), MATMUL(3e-5, WHY_FLOAT)},
	{MM(float, G4_W_Q8_0, 1, {300}, 512), EACH(1, 13, 70), MATMUL(3e-5, WHY_FLOAT)},
	{MM(float, G4_W_Q4_0, 1, {300}, 512), EACH(1, 13, 70), MATMUL(3e-5, WHY_FLOAT)},
	{MM(float, G4_W_Q4_K, 1, {300}, 512), EACH(1, 13, 70), MATMUL(3e-5, WHY_FLOAT)},
	{MM(float, G4_W_Q5_K, 1, {300}, 512), EACH(1, 13, 70), MATMUL(3e-5, WHY_FLOAT)},
	{MM(float, G4_W_Q6_K, 1, {300}, 512), EACH(1, 13, 70), MATMUL(3e-5, WHY_FLOAT)},

	/* ---- embedding rows (seed 4) ---- */
	{.kind = &parity_embed, .a.embed = {.fmt = G4_W_BF16, .vocab = 5000, .dim = 3840, .n = 17},
	 CHECK1("embed", 0, WHY_COPY), .seed = 4},
	{.kind = &parity_embed, .a.embed = {.fmt = G4_W_BF16, .vocab = 16384, .dim = 64, .n = 9},
	 CHECK1("embed", 0, WHY_COPY)},
	{.kind = &parity_embed, .a.embed = {.fmt = G4_W_I4G32, .vocab = 1000, .dim = 640, .n = 6},
	 CHECK1("embed", 0, WHY_COPY)},
	{.kind = &parity_embed, .a.embed = {.fmt = G4_W_F32, .vocab = 300, .dim = 64, .n = 4},
	 CHECK1("embed", 0, WHY_COPY)},
	{.kind = &parity_embed, .a.embed = {.fmt = G4_W_Q8_0, .vocab = 1000, .dim = 640, .n = 5},
	 CHECK1("embed", 0, WHY_COPY)},
	{.kind = &parity_embed, .a.embed = {.fmt = G4_W_Q6_K, .vocab = 700, .dim = 512, .n = 3},
	 CHECK1("embed", 0, WHY_COPY)},

	/* ---- the draft model's input rows, argmax (seed 41) ---- */
	{.kind = &parity_embed_concat, .a.embed = {.fmt = G4_W_BF16, .vocab = 5000, .dim = 3840, .h_dim = 3840,
	 .n = 17}, CHECK1("embed_concat", 0, WHY_CONCAT), .seed = 41},
	{.kind = &parity_embed_concat, .a.embed = {.fmt = G4_W_I4G32, .vocab = 1000, .dim = 640, .h_dim = 640,
	 .n = 6}, CHECK1("embed_concat", 0, WHY_CONCAT)},
	{.kind = &parity_embed_concat, .a.embed = {.fmt = G4_W_F32, .vocab = 300, .dim = 64, .h_dim = 48,
	 .n = 4}, CHECK1("embed_concat", 0, WHY_CONCAT)},
	{.kind = &parity_embed_concat, .a.embed = {.fmt = G4_W_Q6_K, .vocab = 700, .dim = 512, .h_dim = 256,
	 .n = 3}, CHECK1("embed_concat", 0, WHY_CONCAT)},
	{.kind = &parity_argmax, .a.shape = {10, 262144}, CHECK1("argmax", 0, WHY_ARGMAX)},
	{.kind = &parity_argmax, .a.shape = {64, 1000}, CHECK1("argmax", 0, WHY_ARGMAX)},
	{.kind = &parity_argmax, .a.shape = {5, 7}, CHECK1("argmax", 0, WHY_ARGMAX)},

	/* ---- RMS norms (seed 5): rows of a multiple of 4 floats up to 4,096
	 * take the register kernel, 5,002 the loop ---- */
#define NORMS(rows, dim, seed_) \
	{.kind = &parity_rmsnorm, .a.shape = {rows, dim}, EACH(NORM_WEIGHTED, NORM_UNWEIGHTED, NORM_IN_PLACE), \
	 CHECK1("rmsnorm", 2e-6, WHY_NORM), .seed = seed_}, \
	{.kind = &parity_add_rmsnorm, .a.shape = {rows, dim}, EACH(ADD_RESIDUAL, ADD_SCALED, ADD_NEXT_NORM), \
	 .check = {{"add_rmsnorm", NULL, 2e-6, WHY_NORM}, \
			   {"add_rmsnorm", "  the next norm (over h)", 2e-6, WHY_NORM}}}
	NORMS(1, 3840, 5),
	NORMS(7, 640, 0),
	NORMS(64, 64, 0),
	NORMS(3, 2048, 0),
	NORMS(130, 3840, 0),
	NORMS(2, 5002, 0),

	/* ---- the heads' norm and RoPE (seed 6): q rows of 16 heads beside k
	 * and v (a stride past the heads), one head, no RoPE; a sliding layer's
	 * q, k and v runs in one call, and a full layer's q and raw k ---- */
	{.kind = &parity_head_norm_rope,
	 .a.hnr = {.n = 5, .heads = 16, .hd = 256, .stride = 16 * 256 + 2 * 8 * 256, .weighted = 1, .rope = 1},
	 CHECK1("head_norm_rope", 4e-6, WHY_ROPE), .seed = 6},
	{.kind = &parity_head_norm_rope,
	 .a.hnr = {.n = 7, .heads = 16, .hd = 256, .stride = 16 * 256 + 2 * 8 * 256, .weighted = 1, .rope = 1,
	 .kv_heads = 8, .v_run = 1}, CHECK1("head_norm_rope", 4e-6, WHY_ROPE)},
	{.kind = &parity_head_norm_rope,
	 .a.hnr = {.n = 6, .heads = 16, .hd = 512, .stride = 16 * 512 + 512, .weighted = 1, .rope = 1,
	 .proportional = 1, .kv_heads = 1, .k_eq_v = 1}, CHECK1("head_norm_rope", 4e-6, WHY_ROPE)},
	{.kind = &parity_head_norm_rope,
	 .a.hnr = {.n = 3, .heads = 1, .hd = 512, .stride = 16 * 512 + 512, .rope = 1, .proportional = 1},
	 CHECK1("head_norm_rope", 4e-6, WHY_ROPE)},
	{.kind = &parity_head_norm_rope,
	 .a.hnr = {.n = 9, .heads = 4, .hd = 16, .stride = 4 * 16 + 2 * 2 * 16, .weighted = 1, .rope = 1},
	 CHECK1("head_norm_rope", 4e-6, WHY_ROPE)},
	{.kind = &parity_head_norm_rope,
	 .a.hnr = {.n = 70, .heads = 8, .hd = 256, .stride = 8 * 256},
	 CHECK1("head_norm_rope", 4e-6, WHY_ROPE)},
	{.kind = &parity_head_norm_rope,
	 .a.hnr = {.n = 4, .heads = 16, .hd = 512, .stride = 16 * 512, .weighted = 1, .rope = 1, .proportional = 1},
	 CHECK1("head_norm_rope", 4e-6, WHY_ROPE)},

	/* ---- GeGLU, soft-capping, logit rows (seed 7) ---- */
	{.kind = &parity_geglu, .a.shape = {3, 15360}, CHECK1("geglu", 2e-6, WHY_GELU), .seed = 7},
	{.kind = &parity_geglu, .a.shape = {70, 128}, CHECK1("geglu", 2e-6, WHY_GELU)},
	{.kind = &parity_softcap, .a.shape = {3, 262144},
	 CHECK1("softcap", 2e-6, "float32-class: cap * tanhf(x / cap) in float32")},
	{.kind = &parity_gather, .a.shape = {40, 3840}, CHECK1("gather_logit_rows", 0, "exact: rows copied")},

	/* ---- the device sampler (seed 8): logits, vocabulary, settings,
	 * suppressed ids, rows of one call (and of a second), generators ---- */
	/* Gemma-like rows (the rules' rows among them), then fewer rows: each
	 * split over more blocks (26 at 10 rows on 132 SMs; 40 rows take 6) */
	{SAMPLE(.logits = LOGITS_GEMMA, .vocab = 262144, .setting = SAMPLE_ALL_SETTINGS, .n_suppress = 3,
	 .n = 40, .seed = 1000), CHECK1("sample", 0, WHY_SAMPLE), .seed = 8, .share = 1},
	{SAMPLE(.logits = LOGITS_GEMMA, .vocab = 262144, .setting = SAMPLE_ALL_SETTINGS, .n_suppress = 3,
	 .n = 10, .seed = 1500), CHECK1("sample", 0, WHY_SAMPLE), .share = 1},
	/* heavy ties: every filter cutting through them */
	{SAMPLE(.logits = LOGITS_TIED, .vocab = 262144, .setting = SAMPLE_ALL_SETTINGS, .n_suppress = 3,
	 .n = 40, .seed = 2000), CHECK1("sample", 0, WHY_SAMPLE)},
	/* a small vocabulary (fewer ids than threads) */
	{SAMPLE(.logits = LOGITS_SMALL_VOCAB, .vocab = 300, .setting = SAMPLE_ALL_SETTINGS, .n_suppress = 1,
	 .n = 40, .seed = 3000), CHECK1("sample", 0, WHY_SAMPLE), .seed = 9},
	{.kind = &parity_sample_twice, .a.sample = {.logits = LOGITS_SMALL_VOCAB, .vocab = 300,
	 .setting = SAMPLE_TOP_P_95, .n = 8}, CHECK1("sample", 0, "exact: the same call twice gives the same ids")},
	/* the serving shapes, timed: 1 row (the widest split, 64 blocks) and 64 */
	{SAMPLE(.logits = LOGITS_NORMAL, .vocab = 262144, .setting = SAMPLE_TOP_P_95, .n = 1, .n_b = 64,
	 .seed = 5000, .seed_b = 6000), CHECK1("sample", 0, WHY_SAMPLE), .seed = 10},
	{SAMPLE(.logits = LOGITS_NORMAL, .vocab = 262144, .setting = SAMPLE_PLAIN, .n = 1, .n_b = 64,
	 .seed = 5000, .seed_b = 6000), CHECK1("sample", 0, WHY_SAMPLE), .seed = 10},
	{SAMPLE(.logits = LOGITS_NORMAL, .vocab = 262144, .setting = SAMPLE_TOP_K_40, .n = 1, .n_b = 64,
	 .seed = 5000, .seed_b = 6000), CHECK1("sample", 0, WHY_SAMPLE), .seed = 10},
	/* rows holding a NaN (G4_SAMPLE_NAN at every setting) or one at a
	 * suppressed id (a row like another): 40 rows, 6 blocks each, every
	 * place with every setting; 4 rows, 64 blocks each */
	{SAMPLE(.logits = LOGITS_NAN, .vocab = 262144, .setting = SAMPLE_ALL_SETTINGS, .n_suppress = 1,
	 .n = 40, .seed = 7000), CHECK1("sample", 0, WHY_SAMPLE), .seed = 11},
	{SAMPLE(.logits = LOGITS_NAN, .vocab = 262144, .setting = SAMPLE_ALL_SETTINGS, .n_suppress = 1,
	 .n = 4, .seed = 7500), CHECK1("sample", 0, WHY_SAMPLE)},

	/* ---- the KV pool: the bytes kv_store writes, both layer groups
	 * (seed 9; pools: dtype, small) ---- */
	{KV(G4_KV_F32, 0), CHECK1("kv_store", 0, WHY_KV_STORE), .seed = 9},
	{KV(G4_KV_BF16, 0), CHECK1("kv_store", 0, WHY_KV_STORE)},
	{KV(G4_KV_TURBOQUANT_K8V4, 0), CHECK1("kv_store", 0, WHY_KV_STORE)},
	{KV(G4_KV_F32, 1), CHECK1("kv_store", 0, WHY_KV_STORE)},
	{KV(G4_KV_BF16, 1), CHECK1("kv_store", 0, WHY_KV_STORE)},
	{KV(G4_KV_TURBOQUANT_K8V4, 1), CHECK1("kv_store", 0, WHY_KV_STORE)},
	{KV(G4_KV_BF16, 0, .nans = 1), CHECK1("kv_store", 0, WHY_KV_STORE)},
	{KV(G4_KV_TURBOQUANT_K8V4, 0, .nans = 1), CHECK1("kv_store", 0, WHY_KV_STORE)},
	/* head_norm_rope given the layer: the store of its k and v runs */
	{HNR_STORE(G4_KV_F32, 0)},
	{HNR_STORE(G4_KV_BF16, 0)},
	{HNR_STORE(G4_KV_TURBOQUANT_K8V4, 0)},
	{HNR_STORE(G4_KV_BF16, 1)},
	{HNR_STORE(G4_KV_TURBOQUANT_K8V4, 1)},

	/*
	 * ---- attention ----
	 * Which kernel runs (choose_kernel, attention.cu): the decode kernels
	 * for turboquant head_dim 256 without k_eq_v and head_dim 512 with it
	 * when every sequence brings at most 8 tokens (decode and verify
	 * steps); the prefill kernel for head_dim 256 without k_eq_v on
	 * steps of 64 tokens or more in tiles a quarter full (on sm_90a its
	 * warpgroup-MMA form for turboquant pools; G4_ATTN=tc keeps the
	 * tensor-core kernel: the same bound); tensor cores for the 12B's
	 * head dims when there are 8 query heads per KV head or more (the full
	 * layers' 16) or the step has 2 tokens or more, except the full
	 * layers' prefill runs of 64 tokens or more, which go to cuBLASLt
	 * (attention_gemm.cu; the step's other tokens stay on the tc kernel);
	 * float32 otherwise, and for the small pools' head dims.
	 */
	/* the float32 kernel on small pools (seed 10) */
	{POOL(float32, .dtype = G4_KV_F32, .small = 1), EACH(SMALL_STEPS),
	 ATTN_CHECK("attention(f32)", 2e-5, WHY_ATT_F32), .seed = 10, .share = 1},
	{POOL(float32, .dtype = G4_KV_F32, .small = 1, .group = 1), EACH(SMALL_STEPS),
	 ATTN_CHECK("attention(f32)", 2e-5, WHY_ATT_F32), .share = 1},
	{POOL(float32, .dtype = G4_KV_BF16, .small = 1), EACH(SMALL_STEPS),
	 ATTN_CHECK("attention(f32)", 2e-5, WHY_ATT_F32), .share = 2},
	{POOL(float32, .dtype = G4_KV_BF16, .small = 1, .group = 1), EACH(SMALL_STEPS),
	 ATTN_CHECK("attention(f32)", 2e-5, WHY_ATT_F32), .share = 2},
	{POOL(float32, .dtype = G4_KV_TURBOQUANT_K8V4, .small = 1), EACH(SMALL_STEPS),
	 ATTN_CHECK("attention(f32)", 2e-5, WHY_ATT_F32), .share = 3},
	{POOL(float32, .dtype = G4_KV_TURBOQUANT_K8V4, .small = 1, .group = 1), EACH(SMALL_STEPS),
	 ATTN_CHECK("attention(f32)", 2e-5, WHY_ATT_F32), .share = 3},

	/* Gemma 4's layer groups, random Gemma-like inputs (seed 11) */
	{POOL(gemma4, .dtype = G4_KV_F32), EACH(ATT_DECODE_1), ATTN_CHECK("attention(f32)", 2e-5, WHY_ATT_F32),
	 .seed = 11, .share = 4},
	{POOL(gemma4, .dtype = G4_KV_F32), EACH(ATT_DECODE_4, ATT_VERIFY, ATT_PREFILL_SHORT),
	 ATTN_CHECK("attention(tc)", 0.1, WHY_TC), .share = 4},
	{POOL(gemma4, .dtype = G4_KV_F32), EACH(ATT_PREFILL_DECODE, ATT_PREFILL_LONG),
	 ATTN_CHECK("attention(prefill)", 0.1, WHY_PREFILL), .share = 4},
	{POOL(gemma4, .dtype = G4_KV_F32, .group = 1), EACH(TC_STEPS), ATTN_CHECK("attention(tc)", 0.1, WHY_TC),
	 .share = 4},
	{POOL(gemma4, .dtype = G4_KV_F32, .group = 1), EACH(RUN_STEPS), ATTN_CHECK("attention(gemm)", 0.1, WHY_GEMM),
	 .share = 4},
	{POOL(gemma4, .dtype = G4_KV_BF16), EACH(ATT_DECODE_1), ATTN_CHECK("attention(f32)", 2e-5, WHY_ATT_F32),
	 .share = 5},
	{POOL(gemma4, .dtype = G4_KV_BF16), EACH(ATT_DECODE_4, ATT_VERIFY, ATT_PREFILL_SHORT),
	 ATTN_CHECK("attention(tc)", 0.1, WHY_TC), .share = 5},
	{POOL(gemma4, .dtype = G4_KV_BF16), EACH(ATT_PREFILL_DECODE, ATT_PREFILL_LONG),
	 ATTN_CHECK("attention(prefill)", 0.1, WHY_PREFILL), .share = 5},
	{POOL(gemma4, .dtype = G4_KV_BF16, .group = 1), EACH(TC_STEPS), ATTN_CHECK("attention(tc)", 0.1, WHY_TC),
	 .share = 5},
	{POOL(gemma4, .dtype = G4_KV_BF16, .group = 1), EACH(RUN_STEPS), ATTN_CHECK("attention(gemm)", 0.1, WHY_GEMM),
	 .share = 5},
	{POOL(gemma4, .dtype = G4_KV_TURBOQUANT_K8V4), EACH(ATT_DECODE_1, ATT_DECODE_4, ATT_VERIFY),
	 ATTN_CHECK("attention(decode)", 0.1, WHY_DECODE), .share = 6},
	{POOL(gemma4, .dtype = G4_KV_TURBOQUANT_K8V4), EACH(ATT_PREFILL_SHORT),
	 ATTN_CHECK("attention(tc)", 0.1, WHY_TC), .share = 6},
	{POOL(gemma4, .dtype = G4_KV_TURBOQUANT_K8V4), EACH(ATT_PREFILL_DECODE, ATT_PREFILL_LONG),
	 ATTN_CHECK("attention(prefill)", 0.1, WHY_PREFILL), .share = 6},
	/* the mma.sync prefill kernel where the warpgroup-MMA one serves */
	{POOL(gemma4, .dtype = G4_KV_TURBOQUANT_K8V4, .mma_sync = 1), EACH(ATT_PREFILL_DECODE, ATT_PREFILL_LONG),
	 ATTN_CHECK("attention(prefill)", 0.1, WHY_PREFILL), .share = 6},
	{POOL(gemma4, .dtype = G4_KV_TURBOQUANT_K8V4, .group = 1), EACH(ATT_DECODE_1, ATT_DECODE_4, ATT_VERIFY),
	 ATTN_CHECK("attention(decode)", 0.1, WHY_DECODE), .share = 6},
	{POOL(gemma4, .dtype = G4_KV_TURBOQUANT_K8V4, .group = 1), EACH(ATT_PREFILL_SHORT),
	 ATTN_CHECK("attention(tc)", 0.1, WHY_TC), .share = 6},
	{POOL(gemma4, .dtype = G4_KV_TURBOQUANT_K8V4, .group = 1), EACH(RUN_STEPS),
	 ATTN_CHECK("attention(gemm)", 0.1, WHY_GEMM), .share = 6},
	/* a 4 MB scores budget: the long run in two slices of 300 tokens over
	 * blocks of 208 keys */
	{POOL(gemma4, .dtype = G4_KV_TURBOQUANT_K8V4, .group = 1, .gemm_scores = 4 << 20), EACH(RUN_STEPS),
	 ATTN_CHECK("attention(gemm)", 0.1, WHY_GEMM), .share = 6},
	/* keys in blocks of 128: rows' maxima raised and their outputs rescaled
	 * between blocks, as past 8,192 keys in a 16k chunk */
	{POOL(gemma4, .dtype = G4_KV_TURBOQUANT_K8V4, .group = 1, .gemm_keys = 128), EACH(RUN_STEPS),
	 ATTN_CHECK("attention(gemm)", 0.1, WHY_GEMM), .share = 6},

	/* f16-exact inputs (seed 12; decoded turboquant values are not) */
	{POOL(exact, .dtype = G4_KV_F32, .exact16 = 1), EACH(ATT_DECODE_1),
	 ATTN_CHECK("attention(f32)", 2e-5, WHY_ATT_F32), .seed = 12, .share = 7},
	{POOL(exact, .dtype = G4_KV_F32, .exact16 = 1), EACH(ATT_DECODE_4, ATT_VERIFY, ATT_PREFILL_SHORT),
	 ATTN_CHECK("attention(tc)", 2e-3, WHY_TC_EXACT), .share = 7},
	{POOL(exact, .dtype = G4_KV_F32, .exact16 = 1), EACH(ATT_PREFILL_DECODE, ATT_PREFILL_LONG),
	 ATTN_CHECK("attention(prefill)", 2e-3, WHY_PREFILL_EXACT), .share = 7},
	{POOL(exact, .dtype = G4_KV_F32, .exact16 = 1, .group = 1), EACH(TC_STEPS),
	 ATTN_CHECK("attention(tc)", 2e-3, WHY_TC_EXACT), .share = 7},
	{POOL(exact, .dtype = G4_KV_F32, .exact16 = 1, .group = 1), EACH(RUN_STEPS),
	 ATTN_CHECK("attention(gemm)", 2e-3, WHY_GEMM_EXACT), .share = 7},
	{POOL(exact, .dtype = G4_KV_F32, .exact16 = 1, .group = 1, .gemm_scores = 4 << 20), EACH(RUN_STEPS),
	 ATTN_CHECK("attention(gemm)", 2e-3, WHY_GEMM_EXACT), .share = 7},
	{POOL(exact, .dtype = G4_KV_F32, .exact16 = 1, .group = 1, .gemm_keys = 128), EACH(RUN_STEPS),
	 ATTN_CHECK("attention(gemm)", 2e-3, WHY_GEMM_EXACT), .share = 7},
	{POOL(exact, .dtype = G4_KV_BF16, .exact16 = 1), EACH(ATT_DECODE_1),
	 ATTN_CHECK("attention(f32)", 2e-5, WHY_ATT_F32), .share = 8},
	{POOL(exact, .dtype = G4_KV_BF16, .exact16 = 1), EACH(ATT_DECODE_4, ATT_VERIFY, ATT_PREFILL_SHORT),
	 ATTN_CHECK("attention(tc)", 2e-3, WHY_TC_EXACT), .share = 8},
	{POOL(exact, .dtype = G4_KV_BF16, .exact16 = 1), EACH(ATT_PREFILL_DECODE, ATT_PREFILL_LONG),
	 ATTN_CHECK("attention(prefill)", 2e-3, WHY_PREFILL_EXACT), .share = 8},
	{POOL(exact, .dtype = G4_KV_BF16, .exact16 = 1, .group = 1), EACH(TC_STEPS),
	 ATTN_CHECK("attention(tc)", 2e-3, WHY_TC_EXACT), .share = 8},
	{POOL(exact, .dtype = G4_KV_BF16, .exact16 = 1, .group = 1), EACH(RUN_STEPS),
	 ATTN_CHECK("attention(gemm)", 2e-3, WHY_GEMM_EXACT), .share = 8},

	/* the decode kernel at every query-heads-per-KV-head count it takes
	 * (1, 2, 4, 8: Gemma 4's sliding layers have 2, Gemma 3 270M's 4),
	 * the pool's 8 KV heads kept (seed 13) */
	{POOL(decode, .dtype = G4_KV_TURBOQUANT_K8V4, .heads = 8), EACH(ATT_DECODE_1, ATT_DECODE_4, ATT_VERIFY),
	 ATTN_CHECK("attention(decode)", 0.1, WHY_DECODE), .seed = 13},
	{POOL(decode, .dtype = G4_KV_TURBOQUANT_K8V4, .heads = 16), EACH(ATT_DECODE_1, ATT_DECODE_4, ATT_VERIFY),
	 ATTN_CHECK("attention(decode)", 0.1, WHY_DECODE)},
	{POOL(decode, .dtype = G4_KV_TURBOQUANT_K8V4, .heads = 32), EACH(ATT_DECODE_1, ATT_DECODE_4, ATT_VERIFY),
	 ATTN_CHECK("attention(decode)", 0.1, WHY_DECODE)},
	{POOL(decode, .dtype = G4_KV_TURBOQUANT_K8V4, .heads = 64), EACH(ATT_DECODE_1, ATT_DECODE_4, ATT_VERIFY),
	 ATTN_CHECK("attention(decode)", 0.1, WHY_DECODE)},
	/* the k_eq_v decode kernels (full layers: one KV head) with fewer query
	 * heads than their 16 rows, at 16 (on sm_90a the warpgroup-MMA one;
	 * then the mma.sync one there too), and with every pair rotated (the
	 * mma.sync one, rebuilding every piece group) */
	{POOL(decode, .dtype = G4_KV_TURBOQUANT_K8V4, .heads = 4, .group = 1), EACH(ATT_DECODE_1, ATT_DECODE_4, ATT_VERIFY),
	 ATTN_CHECK("attention(decode)", 0.1, WHY_DECODE)},
	{POOL(decode, .dtype = G4_KV_TURBOQUANT_K8V4, .heads = 16, .group = 1), EACH(ATT_DECODE_1, ATT_DECODE_4, ATT_VERIFY),
	 ATTN_CHECK("attention(decode)", 0.1, WHY_DECODE)},
	{POOL(decode, .dtype = G4_KV_TURBOQUANT_K8V4, .heads = 16, .group = 1, .mma_sync = 1),
	 EACH(ATT_DECODE_1, ATT_DECODE_4, ATT_VERIFY), ATTN_CHECK("attention(decode)", 0.1, WHY_DECODE)},
	{POOL(decode, .dtype = G4_KV_TURBOQUANT_K8V4, .heads = 16, .group = 1, .full_rope = 1),
	 EACH(ATT_DECODE_1, ATT_DECODE_4), ATTN_CHECK("attention(decode)", 0.1, WHY_DECODE)},

	/* ---- the media embedders' operations (seed 41): a layer norm (out of
	 * place and in place), then bias and 2-D positions ---- */
#define EMBED_OPS(rows, dim, seed_) \
	{.kind = &parity_layernorm, .a.shape = {rows, dim}, EACH(LAYERNORM_OUT, LAYERNORM_IN_PLACE), \
	 CHECK1("layernorm", 2e-6, WHY_LAYERNORM), .seed = seed_}, \
	{.kind = &parity_add_bias_pos2d, .a.shape = {rows, dim}, \
	 CHECK1("add_bias_pos2d", 0.0, "exact: elementwise, identical roundings")}
	EMBED_OPS(1, 6912, 41),
	EMBED_OPS(280, 6912, 0),
	EMBED_OPS(64, 3840, 0),
	EMBED_OPS(5, 32, 0),
	EMBED_OPS(3, 5002, 0),

	/*
	 * The whole embedders of the fixture model on a real image and audio
	 * clip: an image's rows (280 here) go through the matmuls of more than
	 * 16 rows, whose activations are rounded to bf16 (2^-9 each): the bound
	 * of that class, as for the matmuls themselves; the layer norms keep
	 * relative errors relative.
	 */
	{.kind = &parity_media_embed, .a.media = {"photo_640x480.jpg", G4_MEDIA_IMAGE},
	 CHECK1("media_embed", 8e-3, WHY_BF16), .share = 1},
	{.kind = &parity_media_embed, .a.media = {"pcm16_16k_mono.wav", G4_MEDIA_AUDIO},
	 CHECK1("media_embed", 8e-3, WHY_BF16), .share = 1},
};

const int	parity_table_len = (int) G4_ARRAY_LEN(parity_table);
