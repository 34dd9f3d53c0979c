#!/usr/bin/env bash
# Runs every suite and prints one summary line "N passed, M failed":
#   1. engine tests (make check-engine: no PostgreSQL, no GPU), then the same
#      built with AddressSanitizer and UndefinedBehaviorSanitizer
#      (make check-engine-sanitized)
#   2. PostgreSQL suites (regression, concurrency, faults) against a private
#      copy of the server with the extension installed (make pg-private:
#      build/pg), when PostgreSQL's server and development files are present
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
log=build/engine-tests-sanitized.log
make --no-print-directory check-engine-sanitized 2>&1 | tee "$log"
tally "$log" engine-sanitized

if [ -x test/pg/run-pg-tests.sh ]; then
  log=build/pg-tests.log
  if make --no-print-directory -s pg-private >"$log" 2>&1; then
    test/pg/run-pg-tests.sh 2>&1 | tee -a "$log"
    tally "$log" postgresql
  else
    cat "$log"
    echo "the PostgreSQL suites need PostgreSQL 15's server and development files (see README)"
    failed=$((failed + 1))
  fi
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
