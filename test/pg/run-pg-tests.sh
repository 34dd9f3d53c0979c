#!/usr/bin/env bash
# test/pg/run-pg-tests.sh — every PostgreSQL-side suite of gemma4, on
# throwaway instances in a temporary directory:
#
#   1. pg_regress: test/sql/*.sql against expected/*.out
#   2. the TAP suites, test/pg/t/*.pl in order: concurrency (001), faults
#      and the worker's lifecycle (002), table jobs (003), roles, limits
#      and encodings (004), speculative decoding (005), a model giving a
#      NaN (006), a step longer than the watchdog's timeout (007)
#
# Builds nothing: run `make install` first (as root if PostgreSQL's
# directories need it), then this script as an unprivileged user, e.g.
#   runuser -u postgres -- test/pg/run-pg-tests.sh
# or test a private copy of the server made by `make pg-private` (no root):
# G4_PG_DESTDIR names its root (default: build/pg when the system
# installation lacks the extension and build/pg has it).
# The model is the tiny fixture: $G4_MODEL_DIR, else build/models/tiny-gemma4,
# else generated into the temporary directory with build/gemma4-make-model.
# Set G4_KEEP_TMP=1 to keep the temporary directory (logs, diffs).
#
# Prints one line per test file or assertion group and ends with
# "N passed, M failed"; exits 0 only when nothing failed.
set -u

if [ "$(id -u)" = 0 ]; then
	echo "run-pg-tests.sh: refusing to run as root: initdb and pg_regress need an unprivileged user." >&2
	echo "run-pg-tests.sh: run it as another user, e.g.: runuser -u postgres -- $0" >&2
	exit 2
fi

REPO=$(cd "$(dirname "$0")/../.." && pwd)
PG_CONFIG=${PG_CONFIG:-pg_config}
if ! command -v "$PG_CONFIG" >/dev/null 2>&1; then
	echo "run-pg-tests.sh: pg_config not found (set PG_CONFIG)" >&2
	exit 2
fi
PKGLIBDIR=$("$PG_CONFIG" --pkglibdir)
SHAREDIR=$("$PG_CONFIG" --sharedir)
BINDIR=$("$PG_CONFIG" --bindir)
# Debian's pg_config lives in /usr/bin, the server binaries beside pkglibdir
[ -x "$BINDIR/postgres" ] || BINDIR=$(dirname "$PKGLIBDIR")/bin
PGXS_DIR=$(dirname "$("$PG_CONFIG" --pgxs)")/../..
PG_REGRESS=$PGXS_DIR/src/test/regress/pg_regress
PERL_LIB=$PGXS_DIR/src/test/perl

# a private copy of the server (same layout under a root directory)
if [ -z "${G4_PG_DESTDIR:-}" ] && [ ! -f "$PKGLIBDIR/gemma4.so" ] && [ -f "$REPO/build/pg$PKGLIBDIR/gemma4.so" ]; then
	G4_PG_DESTDIR=$REPO/build/pg
fi
if [ -n "${G4_PG_DESTDIR:-}" ]; then
	G4_PG_DESTDIR=$(cd "$G4_PG_DESTDIR" && pwd) || exit 2
	PKGLIBDIR=$G4_PG_DESTDIR$PKGLIBDIR
	SHAREDIR=$G4_PG_DESTDIR$SHAREDIR
	BINDIR=$G4_PG_DESTDIR$BINDIR
fi
export G4_SHAREDIR=$SHAREDIR

for f in "$BINDIR/postgres" "$PKGLIBDIR/gemma4.so" "$PKGLIBDIR/libgemma4engine.so" "$SHAREDIR/extension/gemma4.control"; do
	if [ ! -f "$f" ]; then
		echo "run-pg-tests.sh: $f is missing: run make install first" >&2
		exit 2
	fi
done
if [ ! -x "$PG_REGRESS" ] || [ ! -f "$PERL_LIB/PostgreSQL/Test/Cluster.pm" ]; then
	echo "run-pg-tests.sh: pg_regress or the PostgreSQL::Test perl modules are missing under $PGXS_DIR" >&2
	exit 2
fi
if ! perl -MIPC::Run -e 1 2>/dev/null; then
	echo "run-pg-tests.sh: the perl module IPC::Run is missing (Debian: libipc-run-perl)" >&2
	exit 2
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/gemma4-pgtest.XXXXXX") || exit 2
cleanup() {
	if [ "${G4_KEEP_TMP:-0}" = 1 ] || [ "$failed" -gt 0 ]; then
		echo "run-pg-tests.sh: logs kept in $TMP"
	else
		rm -rf "$TMP"
	fi
}
passed=0
failed=0
trap cleanup EXIT

# the fixture model
MODEL=${G4_MODEL_DIR:-$REPO/build/models/tiny-gemma4}
if [ ! -f "$MODEL/config.json" ]; then
	if [ ! -x "$REPO/build/gemma4-make-model" ]; then
		echo "run-pg-tests.sh: no fixture model at $MODEL and no build/gemma4-make-model to make one (make engine)" >&2
		exit 2
	fi
	MODEL=$TMP/model
	"$REPO/build/gemma4-make-model" --preset tiny --out "$MODEL" >/dev/null || exit 2
fi
export G4_MODEL_DIR=$MODEL
# its MTP assistant (t/005_speculative.pl)
DRAFT=$MODEL-assistant
if [ ! -f "$DRAFT/config.json" ] && [ -x "$REPO/build/gemma4-make-model" ]; then
	DRAFT=$TMP/model-assistant
	"$REPO/build/gemma4-make-model" --preset tiny --assistant --out "$DRAFT" >/dev/null || exit 2
fi
export G4_DRAFT_DIR=$DRAFT
# a model of many layers whose long prefill steps take seconds (t/007_long_step.pl)
if [ -x "$REPO/build/gemma4-make-model" ]; then
	"$REPO/build/gemma4-make-model" --preset deep --tokenizer "$REPO/test/fixtures/tokenizer" \
		--out "$TMP/model-deep" >/dev/null || exit 2
	export G4_DEEP_MODEL_DIR=$TMP/model-deep
fi
# the embedded default model, when it was fetched (make fetch-default-model)
if [ -f "$REPO/build/models/gemma-3-270m-q4_k_m.gguf" ]; then
	export G4_DEFAULT_GGUF=$REPO/build/models/gemma-3-270m-q4_k_m.gguf
fi

start=$(date +%s)

# ---- 1. pg_regress ---------------------------------------------------------
{
	cat "$REPO/test/pg/instance.conf"
	echo "gemma4.model_dir = '$MODEL'"
	echo "regress.media_dir = '$REPO/test/fixtures/media'"
	echo "max_connections = 40"
} >"$TMP/regress.conf"
# pg_regress wants sql/ and expected/ side by side
mkdir -p "$TMP/in"
ln -s "$REPO/test/sql" "$TMP/in/sql"
ln -s "$REPO/expected" "$TMP/in/expected"
tests="gemma4_setup"
for f in "$REPO"/test/sql/*.sql; do
	t=$(basename "$f" .sql)
	[ "$t" = gemma4_setup ] || tests="$tests $t"
done
echo "== pg_regress"
(cd "$TMP" && LC_ALL=C "$PG_REGRESS" --temp-instance="$TMP/regress-instance" \
	--temp-config="$TMP/regress.conf" --inputdir="$TMP/in" --outputdir="$TMP/regress-out" \
	--bindir="$BINDIR" --encoding=UTF8 --no-locale --dbname=contrib_regression $tests) \
	>"$TMP/regress.log" 2>&1
grep -E '^test |^ok |^not ok ' "$TMP/regress.log"
n_ok=$(grep -cE '^test .* \.\.\. ok' "$TMP/regress.log")
n_bad=$(grep -cE '^test .* \.\.\. FAILED' "$TMP/regress.log")
n_all=$(echo $tests | wc -w)
# a test that did not report at all (the run broke) is a failure too
missing=$((n_all - n_ok - n_bad))
[ "$missing" -lt 0 ] && missing=0
passed=$((passed + n_ok))
failed=$((failed + n_bad + missing))
if [ "$n_bad" -gt 0 ] || [ "$missing" -gt 0 ]; then
	[ -f "$TMP/regress-out/regression.diffs" ] && head -200 "$TMP/regress-out/regression.diffs"
	[ "$missing" -gt 0 ] && tail -20 "$TMP/regress.log"
fi

# ---- 2. TAP suites ------------------------------------------------------
for t in "$REPO"/test/pg/t/*.pl; do
	name=$(basename "$t" .pl)
	echo "== $name"
	mkdir -p "$TMP/$name"
	(cd "$TMP/$name" && PATH="$BINDIR:$PATH" PG_REGRESS="$PG_REGRESS" TESTDIR="$TMP/$name" \
		PERL5LIB="$PERL_LIB${PERL5LIB:+:$PERL5LIB}" perl "$t") >"$TMP/$name.log" 2>"$TMP/$name.err"
	rc=$?
	grep -E '^(not )?ok ' "$TMP/$name.log"
	n_ok=$(grep -cE '^ok ' "$TMP/$name.log")
	n_bad=$(grep -cE '^not ok ' "$TMP/$name.log")
	passed=$((passed + n_ok))
	failed=$((failed + n_bad))
	# a script that died, or ended without running its plan, fails once more
	if [ "$rc" -ne 0 ] && [ "$n_bad" -eq 0 ]; then
		echo "not ok - $name exited with status $rc"
		failed=$((failed + 1))
	fi
	if [ "$rc" -ne 0 ]; then
		grep -vE '^\s*#\s*(issuing|results|connect output)' "$TMP/$name.err" | tail -30
	fi
done

echo "PostgreSQL suites took $(( $(date +%s) - start )) s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
