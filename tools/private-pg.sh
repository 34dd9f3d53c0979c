#!/usr/bin/env bash
# Makes a private copy of this machine's PostgreSQL server under DEST, with the
# same absolute layout, so the extension can be installed into it
# (make install DESTDIR=DEST) and tested or demonstrated without root and
# without touching the system installation.  PostgreSQL finds its share and
# library folders relative to its binaries, so DEST/<bindir>/postgres uses
# DEST's copies.
#   usage: tools/private-pg.sh DEST
set -euo pipefail
dest=${1:?usage: tools/private-pg.sh DEST}
pg_config=${PG_CONFIG:-pg_config}
bindir=$($pg_config --bindir)
pkglibdir=$($pg_config --pkglibdir)
sharedir=$($pg_config --sharedir)
# Debian's pg_config lives in /usr/bin; the server binaries in the versioned bindir
[ -x "$bindir/postgres" ] || bindir=$(dirname "$pkglibdir")/bin
[ -x "$bindir/postgres" ] || { echo "private-pg: no PostgreSQL server found (install postgresql-15)" >&2; exit 1; }
mkdir -p "$dest"
for d in "$bindir" "$pkglibdir" "$sharedir"; do
  mkdir -p "$dest$(dirname "$d")"
  rm -rf "${dest:?}$d"
  cp -a "$d" "$dest$d"
done
echo "$dest$bindir"
