/*
 * parity_run.c — the loop over the parity table: every row of a family,
 * every expansion of a row, one PARITY line per check, and the summary.
 *
 * G4_PARITY_LIST=1 lists the rows instead (no device needed): one line
 * "PARITY-ROW op | label | bound | why" per check a run would print.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parity.h"
#include "test.h"
#include "util.h"

static int	n_checks,
			n_failed,
			n_listed;

/* What the fixture in use and the expansion running made (parity.h). */
static parity_list fixture_made,
			expansion_made;

/* Where parity_abort and parity_skip return to: the loop, around one setup
 * or one expansion (NULL outside them), with why and whether skipped. */
static jmp_buf *escape;
static char escape_reason[512];
static int	escape_skips;

static void escape_now(int skip) __attribute__((noreturn));

static void
escape_now(int skip)
{
	escape_skips = skip;
	if (!escape)
	{
		fprintf(stderr, "parity: %s\n", escape_reason);
		exit(2);
	}
	longjmp(*escape, 1);
}

void
parity_abort(const char *fmt,...)
{
	va_list		ap;

	va_start(ap, fmt);
	vsnprintf(escape_reason, sizeof(escape_reason), fmt, ap);
	va_end(ap);
	escape_now(0);
}

void
parity_skip(const char *reason)
{
	snprintf(escape_reason, sizeof(escape_reason), "%s", reason);
	escape_now(1);
}

static void
report(const char *op, const char *label, double metric, double bound)
{
	int			ok = metric <= bound;	/* NaN fails */

	n_checks++;
	if (!ok)
		n_failed++;
	printf("PARITY %-18s | %-44s | %10.3e | %8.1e | %s\n", op, label, metric, bound, ok ? "ok" : "FAIL");
	if (!ok)
		g4_test_fail(__FILE__, __LINE__, "%s %s: %.3e exceeds %.1e", op, label, metric, bound);
}

static int
listing(void)
{
	return getenv("G4_PARITY_LIST") != NULL;
}

static int
n_expansions(const parity_row *r)
{
	return r->n_each > 0 ? r->n_each : 1;
}

/* The row's checks at expansion i, with their metrics (NULL: listed). */
static void
report_expansion(const parity_row *r, int i, const double *metric)
{
	char		label[128];
	int			k,
				n = r->kind->describe(r, i, label, sizeof(label));

	for (k = 0; k < n; k++)
	{
		const parity_check *c = &r->check[k];
		const char *l = c->label ? c->label : label;

		if (metric)
			report(c->op, l, metric[k], c->bound);
		else
		{
			n_listed++;
			printf("PARITY-ROW %-18s | %-44s | %8.1e | %s\n", c->op, l, c->bound, c->why);
		}
	}
}

/* Every check of the row failed (its setup did not finish) or skipped. */
static void
report_row_lost(const parity_row *r, int skipped)
{
	static const double nan2[2] = {NAN, NAN};
	int			i;

	if (skipped)
	{
		printf("    skip %s rows: %s\n", r->check[0].op, escape_reason);
		return;
	}
	printf("    %s rows: %s\n", r->check[0].op, escape_reason);
	for (i = 0; i < n_expansions(r); i++)
		report_expansion(r, i, nan2);
}

/* Expansion i of r on fixture fx; an abort reports its checks failed.
 * What it made is freed either way. */
static void
run_expansion(const parity_row *r, void *fx, int i)
{
	static const double nan2[2] = {NAN, NAN};
	jmp_buf		here;
	double		metric[2] = {NAN, NAN};

	escape = &here;
	parity_list_use(&expansion_made);
	if (setjmp(here) == 0)
	{
		r->kind->run(r, fx, i, metric);
		escape = NULL;
		report_expansion(r, i, metric);
	}
	else
	{
		escape = NULL;
		printf("    %s: %s\n", r->check[0].op, escape_reason);
		report_expansion(r, i, nan2);
	}
	parity_list_use(NULL);
	parity_list_free(&expansion_made);
}

/* The fixture of r: built by its setup, NULL where it has none; *lost: 1
 * when the setup aborted, 2 when it skipped the row (what it had made is
 * freed). */
static void *
setup_row(const parity_row *r, int *lost)
{
	jmp_buf		here;
	void	   *volatile fx = NULL;

	*lost = 0;
	if (!r->kind->setup)
		return NULL;
	escape = &here;
	parity_list_use(&fixture_made);
	if (setjmp(here) == 0)
		fx = r->kind->setup(r);
	else
		*lost = escape_skips ? 2 : 1;
	escape = NULL;
	parity_list_use(NULL);
	if (*lost)
		parity_list_free(&fixture_made);
	return fx;
}

/* The fixture fx of owner is done with: its teardown, then what it made. */
static void
drop_fixture(const parity_row *owner, void *fx)
{
	if (fx && owner->kind->teardown)
		owner->kind->teardown(fx);
	parity_list_free(&fixture_made);
}

void
parity_run_family(const char *family)
{
	int			list = listing();
	const parity_row *owner = NULL;		/* the row whose fixture fx is */
	void	   *fx = NULL;
	int			j;

	for (j = 0; j < parity_table_len; j++)
	{
		const parity_row *r = &parity_table[j];
		int			i,
					lost = 0;

		if (strcmp(r->kind->family, family) != 0)
			continue;
		if (list)
		{
			for (i = 0; i < n_expansions(r); i++)
				report_expansion(r, i, NULL);
			continue;
		}
		if (owner && !(r->share && owner->share == r->share && owner->kind == r->kind))
		{
			drop_fixture(owner, fx);
			fx = NULL;
			owner = NULL;
		}
		if (r->seed)
			reseed(r->seed);
		if (!owner)
		{
			fx = setup_row(r, &lost);
			owner = lost ? NULL : r;
		}
		if (lost)
		{
			report_row_lost(r, lost == 2);
			continue;
		}
		for (i = 0; i < n_expansions(r); i++)
			run_expansion(r, fx, i);
		fflush(stdout);
	}
	if (owner)
		drop_fixture(owner, fx);
}

void
parity_summary(void)
{
	if (listing())
		printf("PARITY-ROWS %d checks\n", n_listed);
	else
		printf("PARITY-SUMMARY %d checks, %d failed\n", n_checks, n_failed);
}

/* ---- the tests: a family each, then the summary ------------------------------------ */

#define PARITY_FAMILY_TEST(family) \
	G4_TEST(gpu_parity_##family) \
	{ \
		if (!listing() && !parity_backends()) \
			G4_SKIP("no CUDA device"); \
		parity_run_family(#family); \
	}

PARITY_FAMILY_TEST(attention_float32)
PARITY_FAMILY_TEST(attention_gemma4)
PARITY_FAMILY_TEST(attention_exact)
PARITY_FAMILY_TEST(attention_decode)
PARITY_FAMILY_TEST(kv_store)
PARITY_FAMILY_TEST(matmul_int4)
PARITY_FAMILY_TEST(matmul_bf16)
PARITY_FAMILY_TEST(matmul_float)
PARITY_FAMILY_TEST(media)
PARITY_FAMILY_TEST(rowwise)

G4_TEST(gpu_parity_sample)
{
	if (!listing())
	{
		if (!parity_backends())
			G4_SKIP("no CUDA device");
		if (!gpu_be->ops->sample)
			G4_SKIP("no device sampler");
	}
	parity_run_family("sample");
}

/* Last by name: after every family (and the model tests' own lines). */
G4_TEST(gpu_zz_parity_summary)
{
	parity_summary();
	parity_backends_destroy();
}
