/*
 * test_gguf.c — GGUF reader (gguf.c).
 *
 * Synthetic files are written here byte by byte: every metadata value type,
 * arrays (numeric, strings, empty, nested), custom and default alignment,
 * version 2 and 3, and one malformed file per error path (checking the
 * status code and that the message names the problem).  A corruption fuzz
 * checks that damaged files are rejected or accepted but never crash.
 * With G4_GGUF_MODEL set, the real Gemma 3 270M file is checked too.
 */
#include "test.h"

#include <stdint.h>
#include <unistd.h>

#include "backend.h"
#include "gguf.h"
#include "harness.h"
#include "util.h"

/* ---- a little GGUF writer ----------------------------------------------- */

typedef struct
{
	g4_buf		b;
	int			oom;
} wr;

static void
w_bytes(wr *w, const void *p, size_t n)
{
	if (g4_buf_append(&w->b, p, n) != G4_OK)
		w->oom = 1;
}

static void
w_u8(wr *w, uint8_t v)
{
	w_bytes(w, &v, 1);
}

static void
w_u16(wr *w, uint16_t v)
{
	uint8_t		b[2] = {(uint8_t) v, (uint8_t) (v >> 8)};

	w_bytes(w, b, 2);
}

static void
w_u32(wr *w, uint32_t v)
{
	uint8_t		b[4] = {(uint8_t) v, (uint8_t) (v >> 8), (uint8_t) (v >> 16), (uint8_t) (v >> 24)};

	w_bytes(w, b, 4);
}

static void
w_u64(wr *w, uint64_t v)
{
	w_u32(w, (uint32_t) v);
	w_u32(w, (uint32_t) (v >> 32));
}

static void
w_f32(wr *w, float f)
{
	uint32_t	u;

	memcpy(&u, &f, 4);
	w_u32(w, u);
}

static void
w_f64(wr *w, double f)
{
	uint64_t	u;

	memcpy(&u, &f, 8);
	w_u64(w, u);
}

static void
w_strn(wr *w, const char *s, size_t n)
{
	w_u64(w, n);
	w_bytes(w, s, n);
}

static void
w_str(wr *w, const char *s)
{
	w_strn(w, s, strlen(s));
}

static void
w_header(wr *w, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
	w_bytes(w, "GGUF", 4);
	w_u32(w, version);
	w_u64(w, n_tensors);
	w_u64(w, n_kv);
}

/* key + type tag */
static void
w_key(wr *w, const char *key, uint32_t type)
{
	w_str(w, key);
	w_u32(w, type);
}

static void
w_tensor(wr *w, const char *name, int ndim, const uint64_t *ne, uint32_t type, uint64_t off)
{
	int			i;

	w_str(w, name);
	w_u32(w, (uint32_t) ndim);
	for (i = 0; i < ndim; i++)
		w_u64(w, ne[i]);
	w_u32(w, type);
	w_u64(w, off);
}

static void
w_pad(wr *w, size_t align)
{
	while (w->b.len % align)
		w_u8(w, 0);
}

static char *
tmp_path(const char *name)
{
	return g4_path_join(g4_test_tmpdir(), name);
}

static int
write_file(const char *path, const void *p, size_t n)
{
	FILE	   *f = fopen(path, "wb");
	int			ok;

	if (!f)
		return 0;
	ok = fwrite(p, 1, n, f) == n;
	return fclose(f) == 0 && ok;
}

/* ---- the standard synthetic file ---------------------------------------- */

#define N_STD_KV 23
#define N_STD_T 4

/*
 * Writes the standard file: all value types, arrays, alignment `align`
 * (0: no general.alignment key, default 32), 4 tensors with data patterns.
 * Returns the byte offset where tensor data starts (for truncation tests).
 */
static size_t
build_std(wr *w, uint32_t version, uint32_t align)
{
	static const uint64_t ne_f32[] = {8, 2};
	static const uint64_t ne_q8[] = {64, 3};
	static const uint64_t ne_q4k[] = {256};
	static const uint64_t ne_f16[] = {4, 3, 2};
	size_t		a = align ? align : 32;
	size_t		sizes[N_STD_T] = {8 * 2 * 4, 2 * 34 * 3, 144, 4 * 3 * 2 * 2};
	uint64_t	off[N_STD_T];
	size_t		data_start,
				i,
				k;

	off[0] = 0;
	for (i = 1; i < N_STD_T; i++)
		off[i] = ((off[i - 1] + sizes[i - 1] + a - 1) / a) * a;

	w_header(w, version, N_STD_T, align ? N_STD_KV : N_STD_KV - 1);
	w_key(w, "general.architecture", G4_GGUF_STRING);
	w_str(w, "gemma3");
	if (align)
	{
		w_key(w, "general.alignment", G4_GGUF_U32);
		w_u32(w, align);
	}
	w_key(w, "t.u8", G4_GGUF_U8);
	w_u8(w, 200);
	w_key(w, "t.i8", G4_GGUF_I8);
	w_u8(w, (uint8_t) -5);
	w_key(w, "t.u16", G4_GGUF_U16);
	w_u16(w, 60000);
	w_key(w, "t.i16", G4_GGUF_I16);
	w_u16(w, (uint16_t) -30000);
	w_key(w, "t.u32", G4_GGUF_U32);
	w_u32(w, 4000000000u);
	w_key(w, "t.i32", G4_GGUF_I32);
	w_u32(w, (uint32_t) -2000000000);
	w_key(w, "t.f32", G4_GGUF_F32);
	w_f32(w, -1.5f);
	w_key(w, "t.bool", G4_GGUF_BOOL);
	w_u8(w, 1);
	w_key(w, "t.u64", G4_GGUF_U64);
	w_u64(w, (1ull << 63) + 5);
	w_key(w, "t.i64", G4_GGUF_I64);
	w_u64(w, (uint64_t) -(1ll << 40));
	w_key(w, "t.f64", G4_GGUF_F64);
	w_f64(w, 3.25);
	w_key(w, "t.str", G4_GGUF_STRING);
	w_strn(w, "a\0b", 3);		/* embedded NUL: length is authoritative */
	w_key(w, "t.arr_i32", G4_GGUF_ARRAY);
	w_u32(w, G4_GGUF_I32);
	w_u64(w, 3);
	w_u32(w, 1);
	w_u32(w, (uint32_t) -2);
	w_u32(w, 3);
	w_key(w, "t.arr_f32", G4_GGUF_ARRAY);
	w_u32(w, G4_GGUF_F32);
	w_u64(w, 2);
	w_f32(w, 0.5f);
	w_f32(w, 1.5f);
	w_key(w, "t.arr_str", G4_GGUF_ARRAY);
	w_u32(w, G4_GGUF_STRING);
	w_u64(w, 3);
	w_str(w, "a");
	w_str(w, "");
	w_str(w, "ccc");
	w_key(w, "t.arr_empty", G4_GGUF_ARRAY);
	w_u32(w, G4_GGUF_U8);
	w_u64(w, 0);
	w_key(w, "t.arr_nested", G4_GGUF_ARRAY);	/* [["x", "y"], ["z"]] */
	w_u32(w, G4_GGUF_ARRAY);
	w_u64(w, 2);
	w_u32(w, G4_GGUF_STRING);
	w_u64(w, 2);
	w_str(w, "x");
	w_str(w, "y");
	w_u32(w, G4_GGUF_STRING);
	w_u64(w, 1);
	w_str(w, "z");
	w_key(w, "t.arr_nested_i16", G4_GGUF_ARRAY);	/* [[7, -8], []] */
	w_u32(w, G4_GGUF_ARRAY);
	w_u64(w, 2);
	w_u32(w, G4_GGUF_I16);
	w_u64(w, 2);
	w_u16(w, 7);
	w_u16(w, (uint16_t) -8);
	w_u32(w, G4_GGUF_I16);
	w_u64(w, 0);
	w_key(w, "t.arr_bool", G4_GGUF_ARRAY);
	w_u32(w, G4_GGUF_BOOL);
	w_u64(w, 2);
	w_u8(w, 0);
	w_u8(w, 1);
	w_key(w, "t.arr_u64", G4_GGUF_ARRAY);
	w_u32(w, G4_GGUF_U64);
	w_u64(w, 1);
	w_u64(w, 0x0102030405060708ull);
	w_key(w, "t.f32_int", G4_GGUF_F32);
	w_f32(w, 7.9f);

	w_tensor(w, "w.f32", 2, ne_f32, G4_GGML_F32, off[0]);
	w_tensor(w, "w.q8", 2, ne_q8, G4_GGML_Q8_0, off[1]);
	w_tensor(w, "w.q4k", 1, ne_q4k, G4_GGML_Q4_K, off[2]);
	w_tensor(w, "w.3d", 3, ne_f16, G4_GGML_F16, off[3]);
	w_pad(w, a);
	data_start = w->b.len;
	for (i = 0; i < N_STD_T; i++)
	{
		while (w->b.len < data_start + off[i])
			w_u8(w, 0xEE);
		for (k = 0; k < sizes[i]; k++)
			w_u8(w, (uint8_t) (17 * i + k));
	}
	return data_start;
}

static int
msg_has(const g4_err *err, const char *s)
{
	return strstr(err->msg, s) != NULL;
}

/* Open a file expected to fail with `code` and a message containing each of
 * the NULL-terminated substrings. */
static int
expect_fail(const char *path, int code, const char *s1, const char *s2)
{
	g4_gguf    *g = NULL;
	g4_err		err = {0};
	int			rc = g4_gguf_open(path, &g, &err);

	if (rc == G4_OK)
	{
		g4_gguf_close(g);
		g4_test_fail(__FILE__, __LINE__, "%s opened, expected error %d", path, code);
		return 0;
	}
	if (g != NULL)
	{
		g4_test_fail(__FILE__, __LINE__, "%s failed but returned a handle", path);
		return 0;
	}
	return h_failed_as(path, rc, &err, code, s1, s2);
}

/* Write buf to a temp file and expect an error. */
static int
expect_fail_buf(const char *name, const wr *w, int code, const char *s1, const char *s2)
{
	char	   *p = tmp_path(name);
	int			ok;

	if (!p || !write_file(p, w->b.data, w->b.len))
	{
		free(p);
		g4_test_fail(__FILE__, __LINE__, "cannot write %s", name);
		return 0;
	}
	ok = expect_fail(p, code, s1, s2);
	free(p);
	return ok;
}

/* ---- tests -------------------------------------------------------------- */

static void
check_std(const char *path, uint32_t version, size_t align)
{
	g4_gguf    *g = NULL;
	g4_err		err = {0};
	const g4_gguf_kv *kv;
	const g4_gguf_tensor *t;
	int32_t		i32[3];
	float		f32[2];
	uint64_t	u64;
	size_t		i;

	CHECK_OK(g4_gguf_open(path, &g, &err), &err);
	CHECK_INT(g4_gguf_version(g), version);
	CHECK_INT(g4_gguf_kv_count(g), align == 32 ? N_STD_KV - 1 : N_STD_KV);
	CHECK_STR(g4_gguf_get_str(g, "general.architecture"), "gemma3");
	CHECK_STR(g4_gguf_kv_at(g, 0)->key, "general.architecture");
	CHECK(g4_gguf_kv_at(g, g4_gguf_kv_count(g)) == NULL);

	/* scalars of every type, raw and through the typed getters */
	CHECK((kv = g4_gguf_get(g, "t.u8")) && kv->type == G4_GGUF_U8 && kv->v.u == 200);
	CHECK((kv = g4_gguf_get(g, "t.i8")) && kv->type == G4_GGUF_I8 && kv->v.i == -5);
	CHECK((kv = g4_gguf_get(g, "t.u16")) && kv->type == G4_GGUF_U16 && kv->v.u == 60000);
	CHECK((kv = g4_gguf_get(g, "t.i16")) && kv->type == G4_GGUF_I16 && kv->v.i == -30000);
	CHECK((kv = g4_gguf_get(g, "t.u32")) && kv->type == G4_GGUF_U32 && kv->v.u == 4000000000u);
	CHECK((kv = g4_gguf_get(g, "t.i32")) && kv->type == G4_GGUF_I32 && kv->v.i == -2000000000);
	CHECK((kv = g4_gguf_get(g, "t.f32")) && kv->type == G4_GGUF_F32 && kv->v.f == -1.5);
	CHECK((kv = g4_gguf_get(g, "t.bool")) && kv->type == G4_GGUF_BOOL && kv->v.u == 1);
	CHECK((kv = g4_gguf_get(g, "t.u64")) && kv->type == G4_GGUF_U64 && kv->v.u == (1ull << 63) + 5);
	CHECK((kv = g4_gguf_get(g, "t.i64")) && kv->type == G4_GGUF_I64 && kv->v.i == -(1ll << 40));
	CHECK((kv = g4_gguf_get(g, "t.f64")) && kv->type == G4_GGUF_F64 && kv->v.f == 3.25);
	CHECK((kv = g4_gguf_get(g, "t.str")) && kv->type == G4_GGUF_STRING && kv->str_len == 3 &&
		  memcmp(kv->str, "a\0b", 4) == 0);

	CHECK_INT(g4_gguf_get_int(g, "t.u8", -1), 200);
	CHECK_INT(g4_gguf_get_int(g, "t.i16", -1), -30000);
	CHECK_INT(g4_gguf_get_int(g, "t.u32", -1), 4000000000ll);
	CHECK_INT(g4_gguf_get_int(g, "t.i64", -1), -(1ll << 40));
	CHECK_INT(g4_gguf_get_int(g, "t.bool", -1), 1);
	CHECK_INT(g4_gguf_get_int(g, "t.f32_int", -1), 7);	/* truncated toward zero */
	CHECK_INT(g4_gguf_get_int(g, "t.f32", -1), -1);
	CHECK_INT(g4_gguf_get_int(g, "t.u64", -9), -9);	/* does not fit int64 */
	CHECK_INT(g4_gguf_get_int(g, "t.str", -9), -9);
	CHECK_INT(g4_gguf_get_int(g, "no.such.key", 42), 42);
	CHECK_NEAR(g4_gguf_get_float(g, "t.f64", 0), 3.25, 0);
	CHECK_NEAR(g4_gguf_get_float(g, "t.i32", 0), -2e9, 0);
	CHECK_NEAR(g4_gguf_get_float(g, "t.u64", 0), 9223372036854775813.0, 1e4);
	CHECK_NEAR(g4_gguf_get_float(g, "t.arr_f32", -2), -2, 0);
	CHECK_NEAR(g4_gguf_get_float(g, "missing", 0.25), 0.25, 0);
	CHECK(g4_gguf_get_str(g, "t.u8") == NULL);
	CHECK(g4_gguf_get_str(g, "missing") == NULL);
	CHECK(g4_gguf_get(g, "t.u") == NULL);

	/* arrays */
	CHECK((kv = g4_gguf_get(g, "t.arr_i32")) && kv->type == G4_GGUF_ARRAY &&
		  kv->arr_type == G4_GGUF_I32 && kv->arr_len == 3 && kv->arr_data);
	memcpy(i32, kv->arr_data, sizeof(i32));
	CHECK(i32[0] == 1 && i32[1] == -2 && i32[2] == 3);
	CHECK((kv = g4_gguf_get(g, "t.arr_f32")) && kv->arr_type == G4_GGUF_F32 && kv->arr_len == 2);
	memcpy(f32, kv->arr_data, sizeof(f32));
	CHECK(f32[0] == 0.5f && f32[1] == 1.5f);
	CHECK((kv = g4_gguf_get(g, "t.arr_str")) && kv->arr_type == G4_GGUF_STRING && kv->arr_len == 3);
	CHECK_STR(kv->arr_strs[0], "a");
	CHECK_STR(kv->arr_strs[1], "");
	CHECK_STR(kv->arr_strs[2], "ccc");
	CHECK(kv->arr_str_lens[0] == 1 && kv->arr_str_lens[1] == 0 && kv->arr_str_lens[2] == 3);
	CHECK((kv = g4_gguf_get(g, "t.arr_empty")) && kv->arr_type == G4_GGUF_U8 && kv->arr_len == 0);
	CHECK((kv = g4_gguf_get(g, "t.arr_bool")) && kv->arr_type == G4_GGUF_BOOL && kv->arr_len == 2 &&
		  ((const uint8_t *) kv->arr_data)[1] == 1);
	CHECK((kv = g4_gguf_get(g, "t.arr_u64")) && kv->arr_len == 1);
	memcpy(&u64, kv->arr_data, 8);
	CHECK(u64 == 0x0102030405060708ull);

	/* nested arrays: arr_data holds one g4_gguf_kv per inner array */
	CHECK((kv = g4_gguf_get(g, "t.arr_nested")) && kv->arr_type == G4_GGUF_ARRAY && kv->arr_len == 2);
	{
		const g4_gguf_kv *in = (const g4_gguf_kv *) kv->arr_data;

		CHECK(in[0].key == NULL && in[0].type == G4_GGUF_ARRAY);
		CHECK(in[0].arr_type == G4_GGUF_STRING && in[0].arr_len == 2);
		CHECK_STR(in[0].arr_strs[0], "x");
		CHECK_STR(in[0].arr_strs[1], "y");
		CHECK(in[1].arr_type == G4_GGUF_STRING && in[1].arr_len == 1);
		CHECK_STR(in[1].arr_strs[0], "z");
	}
	CHECK((kv = g4_gguf_get(g, "t.arr_nested_i16")) && kv->arr_len == 2);
	{
		const g4_gguf_kv *in = (const g4_gguf_kv *) kv->arr_data;
		int16_t		v[2];

		CHECK(in[0].arr_type == G4_GGUF_I16 && in[0].arr_len == 2);
		memcpy(v, in[0].arr_data, 4);
		CHECK(v[0] == 7 && v[1] == -8);
		CHECK(in[1].arr_type == G4_GGUF_I16 && in[1].arr_len == 0);
	}

	/* tensors */
	CHECK_INT(g4_gguf_tensor_count(g), N_STD_T);
	CHECK(g4_gguf_tensor_at(g, N_STD_T) == NULL);
	CHECK(g4_gguf_find(g, "w.nope") == NULL);
	CHECK((t = g4_gguf_find(g, "w.f32")) && t->ggml_type == G4_GGML_F32 && t->ndim == 2);
	CHECK(t->ne[0] == 8 && t->ne[1] == 2 && t->ne[2] == 1 && t->ne[3] == 1 && t->nbytes == 64);
	CHECK((t = g4_gguf_find(g, "w.q8")) && t->ggml_type == G4_GGML_Q8_0 && t->nbytes == 204);
	CHECK((t = g4_gguf_find(g, "w.q4k")) && t->ggml_type == G4_GGML_Q4_K && t->ndim == 1 &&
		  t->ne[0] == 256 && t->nbytes == 144);
	CHECK((t = g4_gguf_find(g, "w.3d")) && t->ndim == 3 && t->ne[2] == 2 && t->nbytes == 48);
	CHECK(g4_gguf_tensor_at(g, 2) == g4_gguf_find(g, "w.q4k"));
	for (i = 0; i < N_STD_T; i++)
	{
		const uint8_t *d;
		size_t		k;

		t = g4_gguf_tensor_at(g, i);
		d = t->data;
		CHECK_MSG(((uintptr_t) d) % align == 0, "%s is not aligned to %zu", t->name, align);
		for (k = 0; k < t->nbytes; k++)
			CHECK_MSG(d[k] == (uint8_t) (17 * i + k), "%s byte %zu", t->name, k);
	}
	g4_gguf_close(g);
}

G4_TEST(gguf_synthetic_v3_align64)
{
	wr			w = {{0}, 0};
	char	   *p = tmp_path("std_v3.gguf");

	build_std(&w, 3, 64);
	CHECK(!w.oom && p && write_file(p, w.b.data, w.b.len));
	check_std(p, 3, 64);
	g4_buf_free(&w.b);
	free(p);
}

G4_TEST(gguf_synthetic_v2_default_align)
{
	wr			w = {{0}, 0};
	char	   *p = tmp_path("std_v2.gguf");

	build_std(&w, 2, 0);
	CHECK(!w.oom && p && write_file(p, w.b.data, w.b.len));
	check_std(p, 2, 32);
	g4_buf_free(&w.b);
	free(p);
}

G4_TEST(gguf_type_names)
{
	CHECK_STR(g4_ggml_type_name(G4_GGML_Q4_K), "Q4_K");
	CHECK_STR(g4_ggml_type_name(G4_GGML_BF16), "BF16");
	CHECK_STR(g4_ggml_type_name(G4_GGML_Q8_0), "Q8_0");
	CHECK_STR(g4_ggml_type_name(23), "IQ4_XS");
	CHECK_STR(g4_ggml_type_name(4), "type 4");
	CHECK_STR(g4_ggml_type_name(63), "type 63");
	CHECK_STR(g4_ggml_type_name(1000), "unknown type");
	CHECK_STR(g4_ggml_type_name(-1), "unknown type");
}

G4_TEST(gguf_err_missing_and_magic_version)
{
	char	   *p = tmp_path("does-not-exist.gguf");
	wr			w = {{0}, 0};

	CHECK(expect_fail(p, G4_ERR_IO, "not found", p));
	free(p);
	p = g4_path_join(g4_test_tmpdir(), "");
	CHECK(expect_fail(g4_test_tmpdir(), G4_ERR_IO, "directory", NULL));
	free(p);

	w_bytes(&w, "GGML", 4);
	w_u32(&w, 3);
	w_u64(&w, 0);
	w_u64(&w, 0);
	CHECK(expect_fail_buf("magic.gguf", &w, G4_ERR_FORMAT, "not a GGUF file", "47 47 4d 4c"));
	w.b.len = 0;
	w_header(&w, 1, 0, 0);
	CHECK(expect_fail_buf("v1.gguf", &w, G4_ERR_UNSUPPORTED, "version 1", NULL));
	w.b.len = 0;
	w_header(&w, 7, 0, 0);
	CHECK(expect_fail_buf("v7.gguf", &w, G4_ERR_FORMAT, "unknown GGUF version 7", NULL));
	w.b.len = 0;
	w_header(&w, 3u << 24, 0, 0);
	CHECK(expect_fail_buf("be.gguf", &w, G4_ERR_UNSUPPORTED, "big-endian", NULL));
	w.b.len = 0;
	w_bytes(&w, "GG", 2);
	CHECK(expect_fail_buf("tiny.gguf", &w, G4_ERR_FORMAT, "not a GGUF file", NULL));
	w.b.len = 0;
	w_bytes(&w, "GGUF\3\0", 6);
	CHECK(expect_fail_buf("short.gguf", &w, G4_ERR_IO, "truncated", NULL));
	g4_buf_free(&w.b);
}

/* Every prefix of a valid file must fail cleanly, naming truncation. */
G4_TEST(gguf_err_truncated_every_prefix)
{
	wr			w = {{0}, 0};
	char	   *p = tmp_path("prefix.gguf");
	size_t		data_start,
				n;

	data_start = build_std(&w, 3, 64);
	CHECK(!w.oom && p);
	for (n = 1; n < w.b.len; n++)
	{
		g4_gguf    *g = NULL;
		g4_err		err = {0};
		int			rc;

		CHECK(write_file(p, w.b.data, n));
		rc = g4_gguf_open(p, &g, &err);
		CHECK_MSG(rc != G4_OK && g == NULL, "a %zu-byte prefix of %zu opened", n, w.b.len);
		if (n >= 4)
			CHECK_MSG(rc == G4_ERR_IO && msg_has(&err, "truncated"),
					  "prefix %zu: %d %s", n, rc, err.msg);
		/* cut inside the data: the message names the tensor and the sizes */
		if (n > data_start)
			CHECK_MSG(msg_has(&err, "tensor '") && msg_has(&err, "the file has"),
					  "prefix %zu: %s", n, err.msg);
	}
	/* the last tensor cut by one byte: exact numbers */
	CHECK(write_file(p, w.b.data, w.b.len - 1));
	{
		char		want[128];

		snprintf(want, sizeof(want), "the file has %zu", w.b.len - 1);
		CHECK(expect_fail(p, G4_ERR_IO, "tensor 'w.3d' (F16, 48 bytes)", want));
	}
	g4_buf_free(&w.b);
	free(p);
}

G4_TEST(gguf_err_hostile_lengths)
{
	wr			w = {{0}, 0};

	/* a key claiming 2^62 bytes */
	w_header(&w, 3, 0, 1);
	w_u64(&w, 1ull << 62);
	w_bytes(&w, "abcdefghijklmnopqrstuvwxyz", 26);
	CHECK(expect_fail_buf("keylen.gguf", &w, G4_ERR_FORMAT, "key of", NULL));

	/* a string value longer than the file */
	w.b.len = 0;
	w_header(&w, 3, 0, 1);
	w_key(&w, "s", G4_GGUF_STRING);
	w_u64(&w, 1000);
	w_bytes(&w, "short", 5);
	CHECK(expect_fail_buf("strlen.gguf", &w, G4_ERR_IO, "metadata key 's'", "1000 bytes"));

	/* arrays with absurd counts: numeric, strings, arrays */
	w.b.len = 0;
	w_header(&w, 3, 0, 1);
	w_key(&w, "a", G4_GGUF_ARRAY);
	w_u32(&w, G4_GGUF_F32);
	w_u64(&w, 1ull << 61);
	CHECK(expect_fail_buf("arrlen.gguf", &w, G4_ERR_IO, "metadata key 'a'", "truncated"));
	w.b.len = 0;
	w_header(&w, 3, 0, 1);
	w_key(&w, "a", G4_GGUF_ARRAY);
	w_u32(&w, G4_GGUF_STRING);
	w_u64(&w, ~0ull);
	CHECK(expect_fail_buf("arrstr.gguf", &w, G4_ERR_IO, "strings cannot fit", NULL));
	w.b.len = 0;
	w_header(&w, 3, 0, 1);
	w_key(&w, "a", G4_GGUF_ARRAY);
	w_u32(&w, G4_GGUF_ARRAY);
	w_u64(&w, 1ull << 40);
	CHECK(expect_fail_buf("arrarr.gguf", &w, G4_ERR_IO, "arrays cannot fit", NULL));

	/* counts in the header far beyond the file */
	w.b.len = 0;
	w_header(&w, 3, 0, 1ull << 50);
	CHECK(expect_fail_buf("kvcount.gguf", &w, G4_ERR_IO, "1125899906842624 metadata entries", "impossible"));
	w.b.len = 0;
	w_header(&w, 3, ~0ull, 0);
	CHECK(expect_fail_buf("tcount.gguf", &w, G4_ERR_IO, "18446744073709551615 tensors", "impossible"));

	/* arrays nested beyond the limit */
	{
		int			d;

		w.b.len = 0;
		w_header(&w, 3, 0, 1);
		w_key(&w, "deep", G4_GGUF_ARRAY);
		for (d = 0; d < 40; d++)
		{
			w_u32(&w, G4_GGUF_ARRAY);
			w_u64(&w, 1);
		}
		w_u32(&w, G4_GGUF_U8);
		w_u64(&w, 0);
		CHECK(expect_fail_buf("deep.gguf", &w, G4_ERR_FORMAT, "nested deeper", NULL));
	}
	g4_buf_free(&w.b);
}

G4_TEST(gguf_err_bad_metadata)
{
	wr			w = {{0}, 0};

	/* unknown value type */
	w_header(&w, 3, 0, 1);
	w_key(&w, "weird", 13);
	w_u32(&w, 0);
	CHECK(expect_fail_buf("kvtype.gguf", &w, G4_ERR_FORMAT, "'weird'", "unknown value type 13"));
	/* unknown array element type */
	w.b.len = 0;
	w_header(&w, 3, 0, 1);
	w_key(&w, "weird", G4_GGUF_ARRAY);
	w_u32(&w, 77);
	w_u64(&w, 1);
	CHECK(expect_fail_buf("arrtype.gguf", &w, G4_ERR_FORMAT, "'weird'", "unknown type 77"));
	/* duplicate key */
	w.b.len = 0;
	w_header(&w, 3, 0, 2);
	w_key(&w, "k", G4_GGUF_U8);
	w_u8(&w, 1);
	w_key(&w, "k", G4_GGUF_U8);
	w_u8(&w, 2);
	CHECK(expect_fail_buf("dupkey.gguf", &w, G4_ERR_FORMAT, "duplicate metadata key 'k'", NULL));
	/* bad alignments */
	w.b.len = 0;
	w_header(&w, 3, 0, 1);
	w_key(&w, "general.alignment", G4_GGUF_U32);
	w_u32(&w, 48);
	CHECK(expect_fail_buf("align48.gguf", &w, G4_ERR_FORMAT, "general.alignment is 48", NULL));
	w.b.len = 0;
	w_header(&w, 3, 0, 1);
	w_key(&w, "general.alignment", G4_GGUF_U32);
	w_u32(&w, 0);
	CHECK(expect_fail_buf("align0.gguf", &w, G4_ERR_FORMAT, "general.alignment is 0", NULL));
	w.b.len = 0;
	w_header(&w, 3, 0, 1);
	w_key(&w, "general.alignment", G4_GGUF_STRING);
	w_str(&w, "32");
	CHECK(expect_fail_buf("alignstr.gguf", &w, G4_ERR_FORMAT, "general.alignment has type string", NULL));
	g4_buf_free(&w.b);
}

G4_TEST(gguf_err_bad_tensors)
{
	static const uint64_t ne256[] = {256, 2};
	static const uint64_t ne100[] = {100};
	static const uint64_t ne5[] = {32, 1, 1, 1, 1};
	static const uint64_t ne_huge[] = {1ull << 40, 1ull << 40};
	wr			w = {{0}, 0};
	size_t		k;

	/* unsupported / unknown ggml types */
	w_header(&w, 3, 1, 0);
	w_tensor(&w, "t.x", 1, ne256, 99, 0);
	w_pad(&w, 32);
	CHECK(expect_fail_buf("type99.gguf", &w, G4_ERR_UNSUPPORTED, "'t.x'", "ggml type 99"));
	w.b.len = 0;
	w_header(&w, 3, 1, 0);
	w_tensor(&w, "t.x", 1, ne256, 4, 0);
	w_pad(&w, 32);
	CHECK(expect_fail_buf("type4.gguf", &w, G4_ERR_UNSUPPORTED, "'t.x'", "type 4"));
	/* too many dimensions, ragged blocks, impossible sizes */
	w.b.len = 0;
	w_header(&w, 3, 1, 0);
	w_tensor(&w, "t.5d", 5, ne5, G4_GGML_F32, 0);
	CHECK(expect_fail_buf("dims.gguf", &w, G4_ERR_FORMAT, "'t.5d' has 5 dimensions", NULL));
	w.b.len = 0;
	w_header(&w, 3, 1, 0);
	w_tensor(&w, "t.rag", 1, ne100, G4_GGML_Q4_K, 0);
	CHECK(expect_fail_buf("ragged.gguf", &w, G4_ERR_FORMAT, "'t.rag' of type Q4_K has 100 columns", NULL));
	w.b.len = 0;
	w_header(&w, 3, 1, 0);
	w_tensor(&w, "t.huge", 2, ne_huge, G4_GGML_F32, 0);
	CHECK(expect_fail_buf("huge.gguf", &w, G4_ERR_FORMAT, "'t.huge'", "impossible size"));
	/* offset not aligned */
	w.b.len = 0;
	w_header(&w, 3, 1, 0);
	w_tensor(&w, "t.mis", 1, ne256, G4_GGML_F32, 16);
	CHECK(expect_fail_buf("misalign.gguf", &w, G4_ERR_FORMAT, "'t.mis' has offset 16", "alignment 32"));
	/* offset past the end */
	w.b.len = 0;
	w_header(&w, 3, 1, 0);
	w_tensor(&w, "t.far", 1, ne256, G4_GGML_F32, 1ull << 40);
	w_pad(&w, 32);
	CHECK(expect_fail_buf("far.gguf", &w, G4_ERR_IO, "truncated: tensor 't.far'", NULL));
	w.b.len = 0;
	w_header(&w, 3, 1, 0);
	w_tensor(&w, "t.wrap", 1, ne256, G4_GGML_F32, ~0ull - 31);
	w_pad(&w, 32);
	CHECK(expect_fail_buf("wrap.gguf", &w, G4_ERR_FORMAT, "'t.wrap' has offset", NULL));
	/* overlapping tensors (with an empty one in between) */
	w.b.len = 0;
	w_header(&w, 3, 3, 0);
	w_tensor(&w, "t.a", 2, ne256, G4_GGML_F32, 0);	/* bytes 0..2048 */
	{
		static const uint64_t ne0[] = {0};

		w_tensor(&w, "t.empty", 1, ne0, G4_GGML_F32, 512);
	}
	w_tensor(&w, "t.b", 1, ne256, G4_GGML_F32, 1024);
	w_pad(&w, 32);
	for (k = 0; k < 4096; k++)
		w_u8(&w, 0);
	CHECK(expect_fail_buf("overlap.gguf", &w, G4_ERR_FORMAT, "'t.a'", "'t.b' (data bytes 1024..2048) overlap"));
	/* duplicate tensor names */
	w.b.len = 0;
	w_header(&w, 3, 2, 0);
	w_tensor(&w, "t.d", 1, ne256, G4_GGML_F32, 0);
	w_tensor(&w, "t.d", 1, ne256, G4_GGML_F32, 1024);
	w_pad(&w, 32);
	for (k = 0; k < 2048; k++)
		w_u8(&w, 0);
	CHECK(expect_fail_buf("duptensor.gguf", &w, G4_ERR_FORMAT, "duplicate tensor name 't.d'", NULL));
	g4_buf_free(&w.b);
}

/*
 * Damaged files: random bytes of the standard file overwritten (often in
 * lengths, counts and types).  Each must either open and then be safely
 * readable, or fail with a message; never crash or read out of bounds
 * (run under valgrind to check the latter).
 */
G4_TEST(gguf_fuzz_corruption)
{
	wr			w = {{0}, 0};
	char	   *p = tmp_path("fuzz.gguf");
	uint8_t    *copy;
	uint64_t	s = 12345;
	size_t		data_start;
	int			iter,
				opened = 0;

	data_start = build_std(&w, 3, 64);
	CHECK(!w.oom && p);
	copy = malloc(w.b.len);
	CHECK(copy != NULL);
	for (iter = 0; iter < 600; iter++)
	{
		g4_gguf    *g = NULL;
		g4_err		err = {0};
		int			flips = 1 + iter % 4,
					f;

		memcpy(copy, w.b.data, w.b.len);
		for (f = 0; f < flips; f++)
		{
			size_t		pos;

			s = s * 6364136223846793005ull + 1442695040888963407ull;
			pos = (size_t) (s >> 33) % data_start;	/* damage the header */
			copy[pos] = (uint8_t) (s >> 17);
			if ((s >> 60) == 0)
				copy[pos] = 0xFF;
		}
		if (!write_file(p, copy, w.b.len))
			break;
		if (g4_gguf_open(p, &g, &err) == G4_OK)
		{
			size_t		i,
						sum = 0;

			/* everything it reports must be readable */
			for (i = 0; i < g4_gguf_kv_count(g); i++)
				sum += strlen(g4_gguf_kv_at(g, i)->key);
			for (i = 0; i < g4_gguf_tensor_count(g); i++)
			{
				const g4_gguf_tensor *t = g4_gguf_tensor_at(g, i);

				if (t->nbytes)
					sum += ((const uint8_t *) t->data)[t->nbytes - 1];
			}
			(void) sum;
			opened++;
			g4_gguf_close(g);
		}
		else
			CHECK_MSG(err.msg[0] != '\0' && err.code != 0, "iteration %d: error without message", iter);
	}
	free(copy);
	free(p);
	g4_buf_free(&w.b);
	/* most corruptions of a header this dense are detected */
	CHECK(opened < 600);
}

/* ---- the real model ----------------------------------------------------- */

G4_TEST(gguf_real_gemma3_270m)
{
	const char *mp = getenv("G4_GGUF_MODEL");
	g4_gguf    *g = NULL;
	g4_err		err = {0};
	const g4_gguf_kv *kv;
	const g4_gguf_tensor *t;
	int			counts[64] = {0};
	size_t		i,
				total = 0;
	float		score;
	int32_t		ttype;

	if (!mp || !*mp)
		G4_SKIP("G4_GGUF_MODEL is not set (point it at gemma-3-270m-q4_k_m.gguf)");
	if (access(mp, R_OK) != 0)
		G4_SKIP("G4_GGUF_MODEL names a file that does not exist");
	CHECK_OK(g4_gguf_open(mp, &g, &err), &err);

	CHECK_INT(g4_gguf_version(g), 3);
	CHECK_INT(g4_gguf_kv_count(g), 33);
	CHECK_INT(g4_gguf_tensor_count(g), 236);
	CHECK_STR(g4_gguf_get_str(g, "general.architecture"), "gemma3");
	CHECK_STR(g4_gguf_get_str(g, "general.name"), "Gemma 3 270m");
	CHECK_INT(g4_gguf_get_int(g, "gemma3.block_count", 0), 18);
	CHECK_INT(g4_gguf_get_int(g, "gemma3.embedding_length", 0), 640);
	CHECK_INT(g4_gguf_get_int(g, "gemma3.context_length", 0), 32768);
	CHECK_INT(g4_gguf_get_int(g, "gemma3.feed_forward_length", 0), 2048);
	CHECK_INT(g4_gguf_get_int(g, "gemma3.attention.head_count", 0), 4);
	CHECK_INT(g4_gguf_get_int(g, "gemma3.attention.head_count_kv", 0), 1);
	CHECK_INT(g4_gguf_get_int(g, "gemma3.attention.key_length", 0), 256);
	CHECK_INT(g4_gguf_get_int(g, "gemma3.attention.sliding_window", 0), 512);
	CHECK_INT(g4_gguf_get_int(g, "general.file_type", 0), 15);
	CHECK_NEAR(g4_gguf_get_float(g, "gemma3.attention.layer_norm_rms_epsilon", 0), 1e-6, 1e-12);
	CHECK_NEAR(g4_gguf_get_float(g, "gemma3.rope.freq_base", 0), 1e6, 0);
	CHECK_INT(g4_gguf_get_int(g, "tokenizer.ggml.bos_token_id", -1), 2);
	CHECK_INT(g4_gguf_get_int(g, "tokenizer.ggml.eos_token_id", -1), 1);
	CHECK((kv = g4_gguf_get(g, "tokenizer.ggml.add_bos_token")) && kv->type == G4_GGUF_BOOL && kv->v.u == 1);
	CHECK_INT(g4_gguf_get_int(g, "general.alignment", 32), 32);

	CHECK((kv = g4_gguf_get(g, "tokenizer.ggml.tokens")) && kv->type == G4_GGUF_ARRAY &&
		  kv->arr_type == G4_GGUF_STRING);
	CHECK_INT(kv->arr_len, 262144);
	CHECK_STR(kv->arr_strs[0], "<pad>");
	CHECK_STR(kv->arr_strs[1], "<eos>");
	CHECK_STR(kv->arr_strs[2], "<bos>");
	CHECK_INT(kv->arr_str_lens[0], 5);
	CHECK((kv = g4_gguf_get(g, "tokenizer.ggml.scores")) && kv->arr_type == G4_GGUF_F32 &&
		  kv->arr_len == 262144);
	memcpy(&score, kv->arr_data, 4);
	CHECK(score == -1000.0f);
	CHECK((kv = g4_gguf_get(g, "tokenizer.ggml.token_type")) && kv->arr_type == G4_GGUF_I32 &&
		  kv->arr_len == 262144);
	memcpy(&ttype, (const uint8_t *) kv->arr_data + 5 * 4, 4);
	CHECK_INT(ttype, 4);
	CHECK((kv = g4_gguf_get(g, "general.tags")) && kv->arr_len == 4);
	CHECK_STR(kv->arr_strs[3], "text-generation");

	CHECK((t = g4_gguf_find(g, "token_embd.weight")) && t->ggml_type == G4_GGML_Q8_0);
	CHECK(t->ndim == 2 && t->ne[0] == 640 && t->ne[1] == 262144);
	CHECK_INT(t->nbytes, (size_t) 262144 * 20 * 34);
	CHECK((t = g4_gguf_find(g, "blk.0.attn_output.weight")) && t->ggml_type == G4_GGML_Q4_K);
	CHECK(t->ne[0] == 1024 && t->ne[1] == 640 && t->nbytes == (size_t) 640 * 4 * 144);
	CHECK((t = g4_gguf_find(g, "blk.0.ffn_down.weight")) && t->ggml_type == G4_GGML_Q6_K);
	CHECK(t->ne[0] == 2048 && t->ne[1] == 640);
	CHECK((t = g4_gguf_find(g, "blk.0.attn_k.weight")) && t->ggml_type == G4_GGML_Q5_0);
	CHECK(t->ne[0] == 640 && t->ne[1] == 256);
	CHECK((t = g4_gguf_find(g, "blk.17.ffn_up.weight")) != NULL);
	CHECK((t = g4_gguf_find(g, "output_norm.weight")) && t->ggml_type == G4_GGML_F32 &&
		  t->ndim == 1 && t->ne[0] == 640);
	CHECK(g4_gguf_find(g, "blk.18.ffn_up.weight") == NULL);

	for (i = 0; i < g4_gguf_tensor_count(g); i++)
	{
		t = g4_gguf_tensor_at(g, i);
		CHECK_MSG(g4_gguf_wfmt(t->ggml_type) >= 0, "%s: type %s has no engine format",
				  t->name, g4_ggml_type_name(t->ggml_type));
		CHECK(((uintptr_t) t->data) % 32 == 0);
		if (t->ggml_type >= 0 && t->ggml_type < 64)
			counts[t->ggml_type]++;
		total += t->nbytes;
	}
	/* the types present, and nothing else */
	CHECK(counts[G4_GGML_F32] > 0 && counts[G4_GGML_Q5_0] > 0 && counts[G4_GGML_Q4_K] > 0 &&
		  counts[G4_GGML_Q8_0] > 0 && counts[G4_GGML_Q6_K] > 0);
	CHECK_INT(counts[G4_GGML_F32] + counts[G4_GGML_Q5_0] + counts[G4_GGML_Q4_K] +
			  counts[G4_GGML_Q8_0] + counts[G4_GGML_Q6_K], 236);
	CHECK(total < (size_t) 253113024);
	g4_gguf_close(g);
}
