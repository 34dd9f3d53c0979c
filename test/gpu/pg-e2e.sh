#!/usr/bin/env bash
# End to end in PostgreSQL on the GPU machine: a bundled PostgreSQL 15 server
# (../shared/device/pg-bundle.sh, carried as build/device/pg.tar.xz, with the
# extension's gemma4.so, control and SQL files beside it) with the engine
# built with CUDA ($G4_BIN, default build), serving a random model of the
# real 12B shape generated on the spot; pgbench drives gemma_complete with 1 and 64 clients
# and the generated tokens/s through SQL are printed.
#   usage (on the GPU machine, from the repository root):
#     test/gpu/pg-e2e.sh [OUT_DIR] [SECONDS]
set -euo pipefail
out=${1:-/tmp/pg-e2e}
secs=${2:-60}
mkdir -p "$out"
# the server (an unprivileged user) writes its log and reads the script here
work=/tmp/pg-e2e-work; rm -rf "$work"; mkdir -p "$work"; chmod 777 "$work"
repo=$PWD
bin=$repo/${G4_BIN:-build}
pgtar=$repo/build/device/pg.tar.xz
[ -f "$pgtar" ] || { echo "pg-e2e: $pgtar missing (make it with ../shared/device/pg-bundle.sh)" >&2; exit 1; }
rm -rf /tmp/pgb && mkdir -p /tmp/pgb && tar xJf "$pgtar" -C /tmp/pgb
# shellcheck disable=SC1091
source /tmp/pgb/env.sh
bindir=$(dirname "$(command -v postgres)")
pgroot=$(dirname "$bindir")
share=$(ls -d /tmp/pgb/root/usr/share/postgresql/* | head -n 1)
cp "$repo/build/device/gemma4.so" "$bin/libgemma4engine.so" "$pgroot/lib/"
cp "$repo/build/device/gemma4.control" "$repo/build/device/gemma4--0.1.sql" "$share/extension/"

model=${M12B:-/tmp/m12b}
[ -f "$model/config.json" ] || "$bin/gemma4-make-model" --preset 12b --out "$model"

# initdb refuses root: the server runs as nobody
data=/tmp/pgdata; rm -rf "$data"; mkdir -p "$data" /tmp/pgsock; chown nobody "$data" /tmp/pgsock
chmod -R a+rX /tmp/pgb "$model"
asuser() {
  if command -v runuser >/dev/null; then runuser -u nobody -- env PATH="$PATH" LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}" "$@"
  else su -s /bin/sh nobody -c "PATH='$PATH' LD_LIBRARY_PATH='${LD_LIBRARY_PATH:-}' $*"; fi
}
asuser initdb -D "$data" -A trust -U postgres >/dev/null
cat >> "$data/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '/tmp/pgsock'
max_connections = 200
shared_preload_libraries = 'gemma4'
gemma4.model_dir = '$model'
gemma4.backend = 'cuda'
gemma4.max_num_seqs = 64
gemma4.max_model_len = 32768
CONF
asuser pg_ctl -D "$data" -l "$work/server.log" -w -t 300 start >/dev/null || { tail -20 "$work/server.log"; exit 1; }
trap 'asuser pg_ctl -D "$data" stop -m fast >/dev/null 2>&1 || true; cp "$work"/*.log "$work"/*.txt "$out/" 2>/dev/null' EXIT
psqlc() { asuser psql -h /tmp/pgsock -U postgres -d postgres -X -At "$@"; }
psqlc -c "CREATE EXTENSION gemma4" >/dev/null
psqlc -c "SELECT gemma_wait_ready(900000)"
psqlc -c "SELECT backend, device, kv_cache_dtype, pg_size_pretty(weight_bytes), pg_size_pretty(kv_bytes) FROM gemma_stats"
cat > "$work/gen.sql" <<'SQL'
SELECT gemma_complete('The quick brown fox jumps over the lazy dog because', max_tokens => 128);
SQL
chmod a+r "$work/gen.sql"
for clients in 1 64; do
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
