# test/gpu/pg-server.sh — sourced by the PostgreSQL scripts of the GPU
# machine (pg-e2e.sh, pg-jobs.sh): unpacks the bundled PostgreSQL 15 server
# (../shared/device/pg-bundle.sh, carried as build/device/pg.tar.xz, with the
# extension's gemma4.so, control and SQL files beside it), installs the
# extension with the engine built with CUDA ($G4_BIN, default build), starts
# a server serving a random model of the real 12B shape ($M12B, generated on
# the spot when missing) with $PG_EXTRA_CONF appended to postgresql.conf, and
# waits for the model.  Defines psqlc (psql as the server's user) and asuser;
# the server stops, and its logs are copied to $out, on exit.
#   needs: out (an existing directory)
# the server (an unprivileged user) writes its log and reads the script here
work=/tmp/pg-e2e-work; rm -rf "$work"; mkdir -p "$work"; chmod 777 "$work"
repo=$PWD
bin=$repo/${G4_BIN:-build}
pgtar=$repo/build/device/pg.tar.xz
[ -f "$pgtar" ] || { echo "${0##*/}: $pgtar missing (make it with ../shared/device/pg-bundle.sh)" >&2; exit 1; }
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
max_connections = 300
shared_preload_libraries = 'gemma4'
gemma4.model_dir = '$model'
gemma4.backend = 'cuda'
gemma4.max_num_seqs = 64
gemma4.max_model_len = 32768
${PG_EXTRA_CONF:-}
CONF
asuser pg_ctl -D "$data" -l "$work/server.log" -w -t 300 start >/dev/null || { tail -20 "$work/server.log"; exit 1; }
trap 'asuser pg_ctl -D "$data" stop -m fast >/dev/null 2>&1 || true; cp "$work"/*.log "$work"/*.txt "$out/" 2>/dev/null' EXIT
psqlc() { asuser psql -h /tmp/pgsock -U postgres -d postgres -X -At "$@"; }
psqlc -c "CREATE EXTENSION gemma4" >/dev/null
psqlc -c "SELECT gemma_wait_ready(900000)"
