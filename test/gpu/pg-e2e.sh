#!/usr/bin/env bash
# End to end in PostgreSQL on the GPU machine: a bundled PostgreSQL 15 server
# (../shared/device/pg-bundle.sh, carried as build/device/pg.tar.xz, with the
# extension's gemma4.so, control and SQL files beside it) with the engine
# built with CUDA ($G4_BIN, default build), serving a random model of the
# real 12B shape generated on the spot; pgbench drives gemma_complete with
# 16, 64 and 256 clients ($CLIENTS) and the generated tokens/s through SQL
# are printed.  The server takes 256 sequences and 512 requests at once
# (with the defaults, 64 requests: 256 clients would overflow the queue);
# $PG_EXTRA_CONF replaces those settings.
#   usage (on the GPU machine, from the repository root):
#     test/gpu/pg-e2e.sh [OUT_DIR] [SECONDS]
set -euo pipefail
out=${1:-/tmp/pg-e2e}
secs=${2:-60}
mkdir -p "$out"
PG_EXTRA_CONF=${PG_EXTRA_CONF:-"gemma4.max_num_seqs = 256
gemma4.max_requests = 512
gemma4.max_requests_per_role = 512"}
# shellcheck source=test/gpu/pg-server.sh
source "$(dirname "$0")/pg-server.sh"
psqlc -c "SELECT backend, device, kv_cache_dtype, pg_size_pretty(weight_bytes), pg_size_pretty(kv_bytes) FROM gemma_stats"
# where the memory went, before the load and after it (nothing should grow)
memory() { psqlc -c "SELECT string_agg(use || ' ' || bytes, '; ') FROM gemma_memory"; }
echo "memory at start: $(memory)"
cat > "$work/gen.sql" <<'SQL'
SELECT gemma_complete('The quick brown fox jumps over the lazy dog because', max_tokens => 128);
SQL
chmod a+r "$work/gen.sql"
for clients in ${CLIENTS:-16 64 256}; do
  before=$(psqlc -c "SELECT tokens_out FROM gemma_stats")
  t0=$(date +%s.%N)
  asuser pgbench -h /tmp/pgsock -U postgres -n -c "$clients" -j "$(( clients < 16 ? clients : 16 ))" \
    -T "$secs" -f "$work/gen.sql" postgres > "$work/pgbench-$clients.txt" 2>&1
  t1=$(date +%s.%N)
  after=$(psqlc -c "SELECT tokens_out FROM gemma_stats")
  tps=$(grep -E '^tps' "$work/pgbench-$clients.txt" | head -n 1)
  awk -v c="$clients" -v n="$(( after - before ))" -v a="$t0" -v b="$t1" -v tps="$tps" \
    'BEGIN { printf "clients %d: %d tokens in %.1f s = %.0f tokens/s through SQL; %s\n", c, n, b - a, n / (b - a), tps }'

done
psqlc -c "SELECT requests, errors, tokens_out, steps, round(mean_batch_size::numeric,1), max_batch_size FROM gemma_stats"
echo "memory at end: $(memory)"
