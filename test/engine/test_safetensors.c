/*
 * test_safetensors.c — safetensors reader (safetensors.c).
 *
 * Files are written here into the test scratch folder: a single file (opened
 * by path and as a model directory), a sharded checkpoint with its index,
 * and one malformed file or index per documented error, checking the status
 * code and that the message names the file, tensor and numbers involved.
 * A corruption fuzz checks that damaged headers never crash the reader.
 */
#include "test.h"

#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "safetensors.h"
#include "util.h"

/* ---- writing files ------------------------------------------------------ */

static char *
tmp_path(const char *name)
{
	return g4_path_join(g4_test_tmpdir(), name);
}

/* A fresh empty directory in the scratch folder. */
static char *
tmp_dir(const char *name)
{
	char	   *d = tmp_path(name);
	char		cmd[8192];

	if (!d)
		return NULL;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d);
	if (system(cmd) != 0 || mkdir(d, 0755) != 0)
	{
		free(d);
		return NULL;
	}
	return d;
}

static int
write_raw(const char *path, const void *p, size_t n)
{
	FILE	   *f = fopen(path, "wb");
	int			ok;

	if (!f)
		return 0;
	ok = fwrite(p, 1, n, f) == n;
	return fclose(f) == 0 && ok;
}

/*
 * A safetensors file: 8-byte length, the header padded with spaces to a
 * multiple of 8 (as the reference writer does), then `data`.  A non-zero
 * fake_len overrides the length field; cut > 0 drops that many bytes from
 * the end.
 */
static int
write_st(const char *path, const char *header, const void *data, size_t data_len,
		 uint64_t fake_len, size_t cut)
{
	size_t		hl = strlen(header);
	size_t		padded = (hl + 7) / 8 * 8;
	size_t		total = 8 + padded + data_len;
	uint8_t    *buf = malloc(total);
	uint64_t	len = fake_len ? fake_len : padded;
	int			i,
				ok;

	if (!buf)
		return 0;
	for (i = 0; i < 8; i++)
		buf[i] = (uint8_t) (len >> (8 * i));
	memcpy(buf + 8, header, hl);
	memset(buf + 8 + hl, ' ', padded - hl);
	if (data_len)
		memcpy(buf + 8 + padded, data, data_len);
	ok = write_raw(path, buf, total - (cut < total ? cut : total));
	free(buf);
	return ok;
}

/* ---- the standard single file ------------------------------------------- */

static const char *std_header =
"{\"__metadata__\":{\"format\":\"pt\"},"
"\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
"\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
"\"c\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[32,40]},"
"\"d\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[40,40]},"
"\"e\":{\"dtype\":\"F16\",\"shape\":[2,2,2],\"data_offsets\":[40,56]},"
"\"f\":{\"dtype\":\"I32\",\"shape\":[1,2],\"data_offsets\":[56,64]}}";

static void
std_data(uint8_t *d)
{
	float		a[6] = {1, 2, 3, 4, 5, 6};
	int64_t		c = -42;
	int			i;

	memcpy(d, a, 24);
	for (i = 0; i < 4; i++)
	{
		uint16_t	h = g4_f32_to_bf16((float) (i + 1) * 0.5f);

		memcpy(d + 24 + 2 * i, &h, 2);
	}
	memcpy(d + 32, &c, 8);
	for (i = 0; i < 8; i++)
	{
		uint16_t	h = g4_f32_to_f16((float) i);

		memcpy(d + 40 + 2 * i, &h, 2);
	}
	for (i = 0; i < 8; i++)
		d[56 + i] = (uint8_t) (i + 1);
}

static void
check_std(const g4_safetensors *st, const char *file)
{
	const g4_st_tensor *t;
	float		a[6];
	int64_t		c;
	uint16_t	h;

	CHECK_INT(g4_st_count(st), 6);
	CHECK_INT(g4_st_data_bytes(st), 64);
	CHECK(g4_st_find(st, "__metadata__") == NULL);
	CHECK(g4_st_find(st, "zz") == NULL);
	CHECK(g4_st_at(st, 6) == NULL);

	CHECK((t = g4_st_find(st, "a")) != NULL);
	CHECK_STR(t->name, "a");
	CHECK_STR(t->file, file);
	CHECK(t->dtype == G4_DT_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3);
	CHECK(t->numel == 6 && t->nbytes == 24);
	memcpy(a, t->data, 24);
	CHECK(a[0] == 1 && a[5] == 6);
	CHECK((t = g4_st_find(st, "b")) && t->dtype == G4_DT_BF16 && t->numel == 4 && t->nbytes == 8);
	memcpy(&h, (const uint8_t *) t->data + 6, 2);
	CHECK(g4_bf16_to_f32(h) == 2.0f);
	CHECK((t = g4_st_find(st, "c")) && t->dtype == G4_DT_I64 && t->ndim == 0 && t->numel == 1);
	memcpy(&c, t->data, 8);
	CHECK_INT(c, -42);
	CHECK((t = g4_st_find(st, "d")) && t->dtype == G4_DT_U8 && t->ndim == 1 && t->numel == 0 &&
		  t->nbytes == 0);
	CHECK((t = g4_st_find(st, "e")) && t->dtype == G4_DT_F16 && t->ndim == 3 && t->numel == 8);
	memcpy(&h, (const uint8_t *) t->data + 14, 2);
	CHECK(g4_f16_to_f32(h) == 7.0f);
	CHECK((t = g4_st_find(st, "f")) && t->dtype == G4_DT_I32 && ((const uint8_t *) t->data)[7] == 8);
	/* g4_st_at enumerates every tensor once */
	{
		size_t		i,
					seen = 0;

		for (i = 0; i < g4_st_count(st); i++)
			seen |= (size_t) 1 << (g4_st_at(st, i)->name[0] - 'a');
		CHECK_INT(seen, 0x3F);
	}
}

G4_TEST(st_single_file)
{
	char	   *p = tmp_path("single.safetensors");
	uint8_t		data[64];
	g4_safetensors *st = NULL;
	g4_err		err = {0};

	std_data(data);
	CHECK(p && write_st(p, std_header, data, sizeof(data), 0, 0));
	CHECK_OK(g4_st_open(p, &st, &err), &err);
	check_std(st, p);
	g4_st_close(st);
	free(p);
}

G4_TEST(st_model_dir_single)
{
	char	   *d = tmp_dir("st_dir_single");
	char	   *p = d ? g4_path_join(d, "model.safetensors") : NULL;
	uint8_t		data[64];
	g4_safetensors *st = NULL;
	g4_err		err = {0};

	std_data(data);
	CHECK(p && write_st(p, std_header, data, sizeof(data), 0, 0));
	CHECK_OK(g4_st_open(d, &st, &err), &err);
	check_std(st, p);
	g4_st_close(st);
	free(p);
	free(d);
}

G4_TEST(st_dtype_table)
{
	static const struct
	{
		int			dt;
		const char *name;
		size_t		size;
	}			want[] = {
		{G4_DT_F64, "F64", 8}, {G4_DT_F32, "F32", 4}, {G4_DT_F16, "F16", 2},
		{G4_DT_BF16, "BF16", 2}, {G4_DT_I64, "I64", 8}, {G4_DT_I32, "I32", 4},
		{G4_DT_I16, "I16", 2}, {G4_DT_I8, "I8", 1}, {G4_DT_U8, "U8", 1},
		{G4_DT_BOOL, "BOOL", 1}, {G4_DT_F8_E4M3, "F8_E4M3", 1}, {G4_DT_F8_E5M2, "F8_E5M2", 1},
	};
	size_t		i;

	CHECK_INT(sizeof(want) / sizeof(want[0]), G4_DT_COUNT);
	for (i = 0; i < sizeof(want) / sizeof(want[0]); i++)
	{
		CHECK_STR(g4_dtype_name(want[i].dt), want[i].name);
		CHECK_INT(g4_dtype_size(want[i].dt), want[i].size);
	}
	CHECK_STR(g4_dtype_name(G4_DT_COUNT), "unknown");
	CHECK_INT(g4_dtype_size(-1), 0);
}

/* ---- sharded ------------------------------------------------------------ */

static const char *shard1_header =
"{\"model.embed.weight\":{\"dtype\":\"BF16\",\"shape\":[4,2],\"data_offsets\":[0,16]},"
"\"model.layers.0.w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}";
static const char *shard2_header =
"{\"__metadata__\":{},"
"\"model.layers.1.w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},"
"\"lm_head.weight_packed\":{\"dtype\":\"I32\",\"shape\":[2,1],\"data_offsets\":[12,20]}}";

#define SHARD1 "model-00001-of-00002.safetensors"
#define SHARD2 "model-00002-of-00002.safetensors"

static const char *good_index =
"{\"metadata\":{\"total_size\":44},\"weight_map\":{"
"\"model.embed.weight\":\"" SHARD1 "\","
"\"model.layers.0.w\":\"" SHARD1 "\","
"\"model.layers.1.w\":\"" SHARD2 "\","
"\"lm_head.weight_packed\":\"" SHARD2 "\"}}";

/* Writes the two shards and an index into a fresh directory. */
static char *
make_sharded(const char *name, const char *index)
{
	char	   *d = tmp_dir(name);
	char	   *p1,
			   *p2,
			   *pi;
	uint8_t		data[24];
	int			ok,
				i;

	if (!d)
		return NULL;
	for (i = 0; i < 24; i++)
		data[i] = (uint8_t) (100 + i);
	p1 = g4_path_join(d, SHARD1);
	p2 = g4_path_join(d, SHARD2);
	pi = g4_path_join(d, "model.safetensors.index.json");
	ok = p1 && p2 && pi &&
		write_st(p1, shard1_header, data, 24, 0, 0) &&
		write_st(p2, shard2_header, data, 20, 0, 0) &&
		write_raw(pi, index, strlen(index));
	free(p1);
	free(p2);
	free(pi);
	if (!ok)
	{
		free(d);
		return NULL;
	}
	return d;
}

G4_TEST(st_sharded_index)
{
	char	   *d = make_sharded("st_sharded", good_index);
	char	   *p1,
			   *p2;
	g4_safetensors *st = NULL;
	g4_err		err = {0};
	const g4_st_tensor *t;

	CHECK(d != NULL);
	p1 = g4_path_join(d, SHARD1);
	p2 = g4_path_join(d, SHARD2);
	CHECK_OK(g4_st_open(d, &st, &err), &err);
	CHECK_INT(g4_st_count(st), 4);
	CHECK_INT(g4_st_data_bytes(st), 44);
	CHECK((t = g4_st_find(st, "model.embed.weight")) && t->dtype == G4_DT_BF16 && t->numel == 8);
	CHECK_STR(t->file, p1);
	CHECK((t = g4_st_find(st, "model.layers.1.w")) && t->nbytes == 12);
	CHECK_STR(t->file, p2);
	CHECK(((const uint8_t *) t->data)[0] == 100);
	CHECK((t = g4_st_find(st, "lm_head.weight_packed")) && ((const uint8_t *) t->data)[0] == 112);
	g4_st_close(st);
	free(p1);
	free(p2);
	free(d);
}

/* ---- errors ------------------------------------------------------------- */

static int
open_fails(const char *path, int code, const char *s1, const char *s2)
{
	g4_safetensors *st = NULL;
	g4_err		err = {0};
	int			rc = g4_st_open(path, &st, &err);

	if (rc == G4_OK)
	{
		g4_st_close(st);
		g4_test_fail(__FILE__, __LINE__, "%s opened, expected error %d", path, code);
		return 0;
	}
	if (st != NULL)
	{
		g4_test_fail(__FILE__, __LINE__, "%s failed but returned a handle", path);
		return 0;
	}
	return h_failed_as(path, rc, &err, code, s1, s2);
}

/* Write a single file with this header and 64 data bytes, expect failure. */
static int
header_fails(const char *name, const char *header, int code, const char *s1, const char *s2)
{
	char	   *p = tmp_path(name);
	uint8_t		data[64] = {0};
	int			ok;

	if (!p || !write_st(p, header, data, sizeof(data), 0, 0))
	{
		free(p);
		g4_test_fail(__FILE__, __LINE__, "cannot write %s", name);
		return 0;
	}
	ok = open_fails(p, code, s1, s2);
	free(p);
	return ok;
}

G4_TEST(st_err_missing)
{
	char	   *p = tmp_path("no-such.safetensors");
	char	   *d = tmp_dir("st_empty_dir");

	CHECK(p && d);
	CHECK(open_fails(p, G4_ERR_IO, "not found", p));
	CHECK(open_fails(d, G4_ERR_IO, d, "neither model.safetensors nor model.safetensors.index.json"));
	free(p);
	free(d);
}

G4_TEST(st_err_truncated)
{
	char	   *p = tmp_path("trunc.safetensors");
	uint8_t		data[64];
	char		want[160];
	size_t		hl = (strlen(std_header) + 7) / 8 * 8;

	std_data(data);
	CHECK(p != NULL);
	/* the last tensor ('f', bytes 56..64) loses its last byte */
	CHECK(write_st(p, std_header, data, sizeof(data), 0, 1));
	snprintf(want, sizeof(want), "the file has %zu (63 of data)", 8 + hl + 63);
	CHECK(open_fails(p, G4_ERR_IO, "truncated: tensor 'f' needs 64 data bytes", want));
	/* everything after the header gone */
	CHECK(write_st(p, std_header, data, sizeof(data), 0, 64));
	CHECK(open_fails(p, G4_ERR_IO, "truncated: tensor '", "(0 of data)"));
	/* header length larger than the file */
	CHECK(write_st(p, std_header, data, sizeof(data), 100000, 0));
	CHECK(open_fails(p, G4_ERR_IO, "truncated: the header needs 100008 bytes", p));
	/* shorter than the length field */
	CHECK(write_raw(p, "\x10\0\0", 3));
	CHECK(open_fails(p, G4_ERR_IO, "needs 8 bytes, the file has 3", NULL));
	/* every prefix of the file fails cleanly */
	{
		size_t		n;
		size_t		total = 8 + hl + 64;
		uint8_t    *buf = malloc(total);
		FILE	   *f;

		CHECK(buf != NULL);
		CHECK(write_st(p, std_header, data, sizeof(data), 0, 0));
		f = fopen(p, "rb");
		CHECK(f && fread(buf, 1, total, f) == total);
		fclose(f);
		for (n = 1; n < total; n++)
		{
			g4_safetensors *st = NULL;
			g4_err		err = {0};

			CHECK(write_raw(p, buf, n));
			CHECK_MSG(g4_st_open(p, &st, &err) != G4_OK && st == NULL,
					  "a %zu-byte prefix opened", n);
			CHECK_MSG(err.msg[0] != '\0', "prefix %zu: no message", n);
		}
		free(buf);
	}
	free(p);
}

G4_TEST(st_err_header)
{
	char	   *p = tmp_path("big.safetensors");
	uint8_t		data[8] = {0};

	/* absurd header length: refused before reading, as a format error */
	CHECK(p && write_st(p, "{}", data, 8, 200000000ull, 0));
	CHECK(open_fails(p, G4_ERR_FORMAT, "header too large (200000000 bytes", NULL));
	free(p);

	CHECK(header_fails("json.safetensors", "{\"a\":{\"dtype\":\"F32\",", G4_ERR_FORMAT,
					   "bad header JSON", "line 1"));
	CHECK(header_fails("notobj.safetensors", "[1,2]", G4_ERR_FORMAT, "not a JSON object", NULL));
	CHECK(header_fails("entry.safetensors", "{\"a\":7}", G4_ERR_FORMAT, "entry 'a' is not an object", NULL));
	CHECK(header_fails("fields.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}",
					   G4_ERR_FORMAT, "tensor 'a' needs", "data_offsets"));
	CHECK(header_fails("dtype.safetensors",
					   "{\"w\":{\"dtype\":\"C64\",\"shape\":[1],\"data_offsets\":[0,8]}}",
					   G4_ERR_UNSUPPORTED, "tensor 'w' has unsupported dtype C64", NULL));
	CHECK(header_fails("negshape.safetensors",
					   "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}",
					   G4_ERR_FORMAT, "'w'", "non-negative integer"));
	CHECK(header_fails("fltshape.safetensors",
					   "{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}",
					   G4_ERR_FORMAT, "'w'", "non-negative integer"));
	CHECK(header_fails("hugeshape.safetensors",
					   "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}",
					   G4_ERR_FORMAT, "'w' has an impossible shape", NULL));
	CHECK(header_fails("dims.safetensors",
					   "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
					   G4_ERR_UNSUPPORTED, "'w' has 9 dimensions", NULL));
	CHECK(header_fails("size.safetensors",
					   "{\"w\":{\"dtype\":\"BF16\",\"shape\":[3,4],\"data_offsets\":[0,20]}}",
					   G4_ERR_FORMAT, "'w' (BF16 [3, 4]) needs 24 bytes", "[0, 20] give 20"));
	CHECK(header_fails("order.safetensors",
					   "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[9,8]}}",
					   G4_ERR_FORMAT, "'w' needs data_offsets", NULL));
	CHECK(header_fails("offs3.safetensors",
					   "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}",
					   G4_ERR_FORMAT, "'w' needs data_offsets", NULL));
	CHECK(header_fails("past.safetensors",
					   "{\"w\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[60,68]}}",
					   G4_ERR_IO, "truncated: tensor 'w' needs 68 data bytes", "(64 of data)"));
	/* offsets at the end of int64: no overflow in the bounds check */
	CHECK(header_fails("huge.safetensors",
					   "{\"w\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[9223372036854775799,9223372036854775807]}}",
					   G4_ERR_IO, "truncated: tensor 'w'", NULL));
	/* past it: not an offset at all */
	CHECK(header_fails("past64.safetensors",
					   "{\"w\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[9223372036854775800,9223372036854775808]}}",
					   G4_ERR_FORMAT, "'w' needs data_offsets", NULL));
	CHECK(header_fails("overlap.safetensors",
					   "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
					   "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
					   "\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
					   G4_ERR_FORMAT, "tensors 'x' (data bytes 0..16) and 'y' (data bytes 8..16) overlap", NULL));
	CHECK(header_fails("dup.safetensors",
					   "{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
					   "\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
					   G4_ERR_FORMAT, "tensor 'x' appears twice", NULL));
}

G4_TEST(st_err_index)
{
	char	   *d;
	char	   *pi;

	/* the index lists a shard that is not there */
	d = make_sharded("st_idx_noshard", "{\"weight_map\":{\"a.w\":\"model-00009-of-00009.safetensors\"}}");
	CHECK(d != NULL);
	CHECK(open_fails(d, G4_ERR_IO, "shard", "model-00009-of-00009.safetensors not found (the index"));
	CHECK(open_fails(d, G4_ERR_IO, "for tensor 'a.w'", NULL));
	free(d);

	/* the index lists a tensor its shard lacks */
	d = make_sharded("st_idx_missing",
					 "{\"weight_map\":{\"model.embed.weight\":\"" SHARD1 "\","
					 "\"model.layers.0.w\":\"" SHARD1 "\",\"model.layers.1.w\":\"" SHARD2 "\","
					 "\"lm_head.weight_packed\":\"" SHARD2 "\",\"lm_head.weight_scale\":\"" SHARD2 "\"}}");
	CHECK(d != NULL);
	CHECK(open_fails(d, G4_ERR_FORMAT, "tensor 'lm_head.weight_scale' is missing",
					 "says shard " SHARD2 " holds it"));
	free(d);

	/* the index names the wrong shard */
	d = make_sharded("st_idx_wrong",
					 "{\"weight_map\":{\"model.embed.weight\":\"" SHARD2 "\","
					 "\"model.layers.0.w\":\"" SHARD1 "\"}}");
	CHECK(d != NULL);
	CHECK(open_fails(d, G4_ERR_FORMAT, "'model.embed.weight': the index", "says shard " SHARD2));
	free(d);

	/* shard names may not leave the directory */
	d = make_sharded("st_idx_escape", "{\"weight_map\":{\"a\":\"../" SHARD1 "\"}}");
	CHECK(d != NULL);
	CHECK(open_fails(d, G4_ERR_FORMAT, "invalid shard name '../" SHARD1 "'", NULL));
	free(d);
	d = make_sharded("st_idx_abs", "{\"weight_map\":{\"a\":\"/etc/passwd\"}}");
	CHECK(d != NULL);
	CHECK(open_fails(d, G4_ERR_FORMAT, "invalid shard name", NULL));
	free(d);
	d = make_sharded("st_idx_num", "{\"weight_map\":{\"a\":5}}");
	CHECK(d != NULL);
	CHECK(open_fails(d, G4_ERR_FORMAT, "'a' maps to an invalid shard name '(not a string)'", NULL));
	free(d);

	/* malformed index files */
	d = make_sharded("st_idx_json", "{\"weight_map\":{");
	CHECK(d != NULL);
	pi = g4_path_join(d, "model.safetensors.index.json");
	CHECK(open_fails(d, G4_ERR_FORMAT, pi, "bad JSON"));
	free(pi);
	free(d);
	d = make_sharded("st_idx_nomap", "{\"metadata\":{}}");
	CHECK(d != NULL);
	CHECK(open_fails(d, G4_ERR_FORMAT, "no \"weight_map\" object", NULL));
	free(d);
	d = make_sharded("st_idx_empty", "{\"weight_map\":{}}");
	CHECK(d != NULL);
	CHECK(open_fails(d, G4_ERR_FORMAT, "weight map is empty", NULL));
	free(d);

	/* the same tensor in two shards */
	{
		char	   *p2;
		uint8_t		data[24] = {0};

		d = make_sharded("st_idx_dup", good_index);
		CHECK(d != NULL);
		p2 = g4_path_join(d, SHARD2);
		CHECK(p2 && write_st(p2, "{\"model.layers.0.w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
							 data, 8, 0, 0));
		CHECK(open_fails(d, G4_ERR_FORMAT, "tensor 'model.layers.0.w' appears in both", SHARD2));
		free(p2);
		free(d);
	}
	/* a shard that is itself broken: the error names the shard */
	{
		char	   *p2;
		uint8_t		data[4] = {0};

		d = make_sharded("st_idx_badshard", good_index);
		CHECK(d != NULL);
		p2 = g4_path_join(d, SHARD2);
		CHECK(p2 && write_st(p2, shard2_header, data, 4, 0, 0));
		CHECK(open_fails(d, G4_ERR_IO, p2, "truncated: tensor '"));
		free(p2);
		free(d);
	}
}

G4_TEST(st_expect)
{
	char	   *p = tmp_path("expect.safetensors");
	uint8_t		data[64];
	g4_safetensors *st = NULL;
	g4_err		err = {0};
	const g4_st_tensor *t = NULL;
	static const int64_t s23[] = {2, 3};
	static const int64_t s32[] = {3, 2};
	static const int64_t s4[] = {4};

	std_data(data);
	CHECK(p && write_st(p, std_header, data, sizeof(data), 0, 0));
	CHECK_OK(g4_st_open(p, &st, &err), &err);

	CHECK_OK(g4_st_expect(st, "a", G4_DT_F32, 2, s23, &t, &err), &err);
	CHECK(t == g4_st_find(st, "a"));
	CHECK_OK(g4_st_expect(st, "a", -1, 0, NULL, &t, &err), &err);	/* any dtype, any shape */
	CHECK_OK(g4_st_expect(st, "b", G4_DT_BF16, 1, s4, NULL, &err), &err);

	CHECK_INT(g4_st_expect(st, "model.norm.weight", G4_DT_F32, 0, NULL, &t, &err), G4_ERR_FORMAT);
	CHECK(t == NULL);
	CHECK_MSG(strstr(err.msg, "tensor 'model.norm.weight' not found in") && strstr(err.msg, p),
			  "%s", err.msg);
	CHECK_INT(g4_st_expect(st, "a", G4_DT_BF16, 2, s23, &t, &err), G4_ERR_UNSUPPORTED);
	CHECK_MSG(strstr(err.msg, "tensor 'a'") && strstr(err.msg, "has dtype F32, expected BF16"), "%s", err.msg);
	CHECK_INT(g4_st_expect(st, "a", G4_DT_F32, 2, s32, &t, &err), G4_ERR_FORMAT);
	CHECK_MSG(strstr(err.msg, "tensor 'a'") && strstr(err.msg, "has shape [2, 3], expected [3, 2]"), "%s", err.msg);
	CHECK_INT(g4_st_expect(st, "a", G4_DT_F32, 1, s4, &t, &err), G4_ERR_FORMAT);
	CHECK_MSG(strstr(err.msg, "has shape [2, 3], expected [4]"), "%s", err.msg);
	CHECK_INT(g4_st_expect(st, "c", G4_DT_I64, 1, s4, &t, &err), G4_ERR_FORMAT);
	CHECK_MSG(strstr(err.msg, "has shape [], expected [4]"), "%s", err.msg);
	g4_st_close(st);
	free(p);
}

/*
 * Damaged headers: random bytes of the length field and the JSON header
 * replaced.  Open must fail with a message or succeed with every tensor's
 * bytes readable; never crash (valgrind checks the reads).
 */
G4_TEST(st_fuzz_corruption)
{
	char	   *p = tmp_path("fuzz.safetensors");
	uint8_t		data[64];
	size_t		hl = (strlen(std_header) + 7) / 8 * 8;
	size_t		total = 8 + hl + 64;
	uint8_t    *good,
			   *copy;
	uint64_t	s = 777;
	int			iter;
	FILE	   *f;

	std_data(data);
	CHECK(p && write_st(p, std_header, data, sizeof(data), 0, 0));
	good = malloc(total);
	copy = malloc(total);
	CHECK(good && copy);
	f = fopen(p, "rb");
	CHECK(f && fread(good, 1, total, f) == total);
	fclose(f);
	for (iter = 0; iter < 500; iter++)
	{
		static const char alphabet[] = "{}[]\",:0123456789-.e \\ux";
		g4_safetensors *st = NULL;
		g4_err		err = {0};
		int			k;

		memcpy(copy, good, total);
		for (k = 0; k < 1 + iter % 3; k++)
		{
			size_t		pos;

			s = s * 6364136223846793005ull + 1442695040888963407ull;
			pos = (size_t) (s >> 33) % (8 + hl);
			/* mostly JSON punctuation and digits, sometimes any byte */
			copy[pos] = (s >> 61) ? (uint8_t) alphabet[(s >> 20) % (sizeof(alphabet) - 1)]
				: (uint8_t) (s >> 24);
		}
		CHECK(write_raw(p, copy, total));
		if (g4_st_open(p, &st, &err) == G4_OK)
		{
			size_t		i,
						sum = 0;

			for (i = 0; i < g4_st_count(st); i++)
			{
				const g4_st_tensor *t = g4_st_at(st, i);

				if (t->nbytes)
					sum += ((const uint8_t *) t->data)[t->nbytes - 1];
			}
			(void) sum;
			g4_st_close(st);
		}
		else
			CHECK_MSG(err.msg[0] != '\0', "iteration %d: error without a message", iter);
	}
	free(good);
	free(copy);
	free(p);
}
