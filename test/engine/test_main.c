/*
 * test_main.c — runs every registered engine test (optionally filtered by a
 * substring given on the command line) and prints "N passed, M failed".
 */
#include "test.h"

#include <stdarg.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct
{
	const char *name;
	g4_test_fn	fn;
} test_entry;

static test_entry tests[512];
static int	n_tests;
static int	cur_failed;
static int	cur_skipped;
static char cur_skip_reason[512];
static char srcdir[4096] = ".";
static char tmpdir[4096] = "/tmp";
static char shareddir[4200];

void
g4_test_register(const char *name, g4_test_fn fn)
{
	if (n_tests < (int) (sizeof(tests) / sizeof(tests[0])))
	{
		tests[n_tests].name = name;
		tests[n_tests].fn = fn;
		n_tests++;
	}
}

void
g4_test_fail(const char *file, int line, const char *fmt, ...)
{
	va_list		ap;

	cur_failed = 1;
	fprintf(stdout, "    %s:%d: ", file, line);
	va_start(ap, fmt);
	vfprintf(stdout, fmt, ap);
	va_end(ap);
	fputc('\n', stdout);
}

void
g4_test_skip(const char *reason)
{
	cur_skipped = 1;
	snprintf(cur_skip_reason, sizeof(cur_skip_reason), "%s", reason);
}

int
g4_test_failed(void)
{
	return cur_failed;
}

const char *
g4_test_srcdir(void)
{
	return srcdir;
}

const char *
g4_test_tmpdir(void)
{
	return tmpdir;
}

const char *
g4_test_shareddir(void)
{
	return shareddir[0] ? shareddir : NULL;
}

static int
cmp_tests(const void *a, const void *b)
{
	return strcmp(((const test_entry *) a)->name, ((const test_entry *) b)->name);
}

int
main(int argc, char **argv)
{
	int			passed = 0,
				failed = 0,
				skipped = 0;
	const char *filter = argc > 1 ? argv[1] : NULL;
	const char *env;
	struct stat st;
	int			i;

	if ((env = getenv("G4_TEST_SRCDIR")) != NULL)
		snprintf(srcdir, sizeof(srcdir), "%s", env);
	if ((env = getenv("G4_TEST_TMPDIR")) != NULL)
		snprintf(tmpdir, sizeof(tmpdir), "%s", env);
	mkdir(tmpdir, 0755);
	if ((env = getenv("G4_SHARED_DIR")) != NULL)
		snprintf(shareddir, sizeof(shareddir), "%s", env);
	else
		snprintf(shareddir, sizeof(shareddir), "%s/../shared", srcdir);
	if (stat(shareddir, &st) != 0 || !S_ISDIR(st.st_mode))
		shareddir[0] = '\0';

	qsort(tests, (size_t) n_tests, sizeof(tests[0]), cmp_tests);
	for (i = 0; i < n_tests; i++)
	{
		struct timespec t0,
					t1;
		double		secs;

		if (filter && !strstr(tests[i].name, filter))
			continue;
		cur_failed = 0;
		cur_skipped = 0;
		fflush(stdout);
		clock_gettime(CLOCK_MONOTONIC, &t0);
		tests[i].fn();
		clock_gettime(CLOCK_MONOTONIC, &t1);
		secs = (double) (t1.tv_sec - t0.tv_sec) + (double) (t1.tv_nsec - t0.tv_nsec) * 1e-9;
		if (cur_failed)
		{
			failed++;
			printf("FAIL %s (%.2fs)\n", tests[i].name, secs);
		}
		else if (cur_skipped)
		{
			skipped++;
			printf("skip %s: %s\n", tests[i].name, cur_skip_reason);
		}
		else
		{
			passed++;
			printf("ok   %s (%.2fs)\n", tests[i].name, secs);
		}
		fflush(stdout);
	}
	if (skipped)
		printf("%d skipped (reasons above)\n", skipped);
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
