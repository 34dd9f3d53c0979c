#!/usr/bin/env bash
# Runs every suite and prints one summary line "N passed, M failed":
#   1. engine tests (make check-engine: no PostgreSQL, no GPU)
#   2. PostgreSQL suites (regression, concurrency, faults) against a private
#      installation of the extension in build/pg-install, when PostgreSQL's
#      server and development files are present
set -uo pipefail
cd "$(dirname "$0")/.."
passed=0; failed=0
tally() {  # read "N passed, M failed" from a log
  local line; line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$1" | tail -n 1)
  if [ -z "$line" ]; then echo "suite $2 produced no summary: counted as failed"; failed=$((failed + 1)); return; fi
  passed=$((passed + $(echo "$line" | cut -d' ' -f1)))
  failed=$((failed + $(echo "$line" | cut -d' ' -f3)))
}
mkdir -p build
log=build/engine-tests.log
make --no-print-directory check-engine 2>&1 | tee "$log"
tally "$log" engine

if [ -x test/pg/run-pg-tests.sh ]; then
  log=build/pg-tests.log
  test/pg/run-pg-tests.sh 2>&1 | tee "$log"
  tally "$log" postgresql
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
