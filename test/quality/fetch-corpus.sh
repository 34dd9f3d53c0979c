#!/usr/bin/env bash
# The quality corpus: the PostgreSQL 15 manual from Debian's postgresql-doc-15
# package, as plain text in book order (test/quality/html2text.py says how).
#
#   test/quality/fetch-corpus.sh [OUT.txt]     (default build/corpus/postgresql-15-manual.txt)
#
# Downloads the package with apt-get (nothing is installed), unpacks it in a
# scratch directory and converts its HTML; exits 1, saying why, when the
# package cannot be fetched.  Nothing of it is committed.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-build/corpus/postgresql-15-manual.txt}
[ -s "$out" ] && exit 0
mkdir -p "$(dirname "$out")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"   # apt downloads as _apt where it can
if ! (cd "$work" && apt-get download -qq postgresql-doc-15 >/dev/null 2>&1); then
  echo "fetch-corpus: cannot download postgresql-doc-15 (no apt source reachable?)" >&2
  exit 1
fi
dpkg-deb -x "$work"/postgresql-doc-15_*.deb "$work/x"
python3 test/quality/html2text.py "$work/x/usr/share/doc/postgresql-doc-15/html" "$out.tmp"
mv "$out.tmp" "$out"
echo "corpus: $(ls "$work"/postgresql-doc-15_*.deb | xargs -n1 basename) -> $out ($(wc -c <"$out") bytes)"
