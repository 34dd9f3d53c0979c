/*
 * test_json.c — numbers in the JSON reader (json.c): integers exact within
 * int64, and values past it read as saturated numbers, never wrapped.
 */
#include <stdint.h>

#include "json.h"
#include "test.h"

G4_TEST(json_integers_past_int64_saturate)
{
	static const char text[] =
		"[9223372036854775807, -9223372036854775808, 99999999999999999999, -99999999999999999999,"
		" 1e400, -1e400, 1.75, -1.75, 4294967297]";
	g4_err		err;
	g4j_doc    *doc = g4j_parse(text, sizeof(text) - 1, &err);
	const g4j  *a;

	CHECK_MSG(doc != NULL, "%s", err.msg);
	a = g4j_root(doc);
	CHECK_INT(g4j_len(a), 9);
	CHECK(g4j_int(g4j_at(a, 0), 0) == INT64_MAX && g4j_at(a, 0)->is_integer);
	CHECK(g4j_int(g4j_at(a, 1), 0) == INT64_MIN && g4j_at(a, 1)->is_integer);
	/* past int64: numbers, saturated */
	CHECK(g4j_int(g4j_at(a, 2), 0) == INT64_MAX && !g4j_at(a, 2)->is_integer);
	CHECK(g4j_int(g4j_at(a, 3), 0) == INT64_MIN && !g4j_at(a, 3)->is_integer);
	CHECK(g4j_int(g4j_at(a, 4), 0) == INT64_MAX);
	CHECK(g4j_int(g4j_at(a, 5), 0) == INT64_MIN);
	/* fractions truncate toward zero */
	CHECK_INT(g4j_int(g4j_at(a, 6), 0), 1);
	CHECK_INT(g4j_int(g4j_at(a, 7), 0), -1);
	CHECK(g4j_int(g4j_at(a, 8), 0) == 4294967297LL);
	g4j_free(doc);
}
