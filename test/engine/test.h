/*
 * test.h — a minimal test harness for the engine tests.
 *
 * Tests register themselves with G4_TEST(name) { ... } and are run by
 * test_main.c, which prints one line per test and a final summary line
 * "N passed, M failed".  A test may skip itself with G4_SKIP("reason"),
 * which is reported visibly and counted separately.
 */
#ifndef G4_TEST_H
#define G4_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*g4_test_fn) (void);

void		g4_test_register(const char *name, g4_test_fn fn);
void		g4_test_fail(const char *file, int line, const char *fmt, ...)
			__attribute__((format(printf, 3, 4)));
void		g4_test_skip(const char *reason);
int			g4_test_failed(void);

/* Root of the source tree (for fixtures and goldens) and a scratch folder
 * for generated files; both set by the runner. */
const char *g4_test_srcdir(void);
const char *g4_test_tmpdir(void);
/* Path of ../shared beside the checkout, or NULL when absent. */
const char *g4_test_shareddir(void);

#define G4_TEST(name) \
	static void test_##name(void); \
	__attribute__((constructor)) static void register_##name(void) \
	{ g4_test_register(#name, test_##name); } \
	static void test_##name(void)

#define G4_SKIP(reason) do { g4_test_skip(reason); return; } while (0)

#define CHECK(cond) do { if (!(cond)) { \
	g4_test_fail(__FILE__, __LINE__, "check failed: %s", #cond); return; } } while (0)

#define CHECK_MSG(cond, ...) do { if (!(cond)) { \
	g4_test_fail(__FILE__, __LINE__, __VA_ARGS__); return; } } while (0)

#define CHECK_INT(a, b) do { long long _a = (long long) (a), _b = (long long) (b); \
	if (_a != _b) { g4_test_fail(__FILE__, __LINE__, "%s == %lld, expected %s == %lld", \
								 #a, _a, #b, _b); return; } } while (0)

#define CHECK_STR(a, b) do { const char *_a = (a), *_b = (b); \
	if (!_a || !_b || strcmp(_a, _b) != 0) { g4_test_fail(__FILE__, __LINE__, \
		"%s == \"%s\", expected \"%s\"", #a, _a ? _a : "(null)", _b ? _b : "(null)"); return; } } while (0)

#define CHECK_NEAR(a, b, tol) do { double _a = (a), _b = (b); \
	if (!(fabs(_a - _b) <= (tol))) { g4_test_fail(__FILE__, __LINE__, \
		"%s == %.9g, expected %.9g within %.3g", #a, _a, _b, (double) (tol)); return; } } while (0)

/* Check a g4_status-returning call; print the engine's message on failure. */
#define CHECK_OK(call, errp) do { int _rc = (call); if (_rc != 0) { \
	g4_test_fail(__FILE__, __LINE__, "%s failed (%d): %s", #call, _rc, (errp)->msg); return; } } while (0)

#endif
