#!/usr/bin/env bash
# Fetches llama.cpp's tokenizer test vocabularies (MIT): vocab-only GGUF files with inputs
# (`.inp`) and the token ids Hugging Face's tokenizer gives for them (`.out`). They let the GGUF
# tokenizer be checked for pre-tokenizers SmolLM2 does not use (Llama 3's "llama-bpe", "gpt2",
# Qwen2/2.5/3's "qwen2", "starcoder", which shares SmolLM2's regexes, and the SentencePiece
# vocabularies of Llama 2 and Phi-3). They ship in the llama-cpp-python sdist on
# PyPI, which pins the llama.cpp revision; only the files below are extracted.
#
# Usage: fetch-vocab-tests.sh DEST_DIR   (idempotent: present files with the right hash are kept)
set -euo pipefail

dest=${1:?usage: fetch-vocab-tests.sh DEST_DIR}
sdist_spec=llama-cpp-python==0.3.36
sdist_sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
prefix=llama_cpp_python-0.3.36/vendor/llama.cpp/models
files="
cedc56ca6e2e89f63e781696d1fd76b4b1d49e6720dee86463e915f6e90016ac ggml-vocab-gpt-2.gguf
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0 ggml-vocab-gpt-2.gguf.inp
48e8c4cb3ad5c37915b225f872222567c1c4dd4d66951aa53460c8d152ff6d60 ggml-vocab-gpt-2.gguf.out
97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e ggml-vocab-llama-bpe.gguf
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0 ggml-vocab-llama-bpe.gguf.inp
118abf2034a197fc5c9dec5204dfdeee7004c7c70952ae577f66b99e212fab9b ggml-vocab-llama-bpe.gguf.out
16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69 ggml-vocab-llama-spm.gguf
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0 ggml-vocab-llama-spm.gguf.inp
ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29 ggml-vocab-llama-spm.gguf.out
967d7190d11c4842eab697079d98d56c2116e10eb617be355a2733bfc132e326 ggml-vocab-phi-3.gguf
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0 ggml-vocab-phi-3.gguf.inp
ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29 ggml-vocab-phi-3.gguf.out
44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c ggml-vocab-qwen2.gguf
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0 ggml-vocab-qwen2.gguf.inp
de785bb305cc6fa9d43908ed5da337f853c0b79e971348fcfb9f0915a39c5363 ggml-vocab-qwen2.gguf.out
fedb892b4e1bd3c1f2fcdae356440b14fb458f4264d586e5c987ed93df4e174d ggml-vocab-starcoder.gguf
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0 ggml-vocab-starcoder.gguf.inp
3ef12183c57ad076f9defd8e5eb454f509f5f0865cad35646abb4c4b2d2c5764 ggml-vocab-starcoder.gguf.out
"

all_present() {
    echo "$files" | while read -r sum name; do
        [ -z "$name" ] && continue
        [ -f "$dest/$name" ] && echo "$sum  $dest/$name" | sha256sum --check --status || exit 1
    done
}
if all_present; then
    exit 0
fi

mkdir -p "$dest"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# `pip download` cannot fetch an sdist without building its metadata (which for this package
# means installing scikit-build-core), so the file is found through the index's simple API, the
# one pip itself reads, and checked against the pinned hash.
python3 - "$sdist_spec" "$tmp" <<'PY'
import json, os, shutil, sys, urllib.request
name, version = sys.argv[1].split("==")
filename = f"{name.replace('-', '_')}-{version}.tar.gz"
request = urllib.request.Request(
    f"https://pypi.org/simple/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
)
with urllib.request.urlopen(request, timeout=60) as r:
    url = next(f["url"] for f in json.load(r)["files"] if f["filename"] == filename)
with urllib.request.urlopen(url, timeout=600) as r, open(os.path.join(sys.argv[2], filename), "wb") as out:
    shutil.copyfileobj(r, out, 1 << 20)
PY
sdist=$(ls "$tmp"/*.tar.gz)
echo "$sdist_sha256  $sdist" | sha256sum --check --status ||
    { echo "fetch_vocab_tests: $sdist does not match sha256 $sdist_sha256" >&2; exit 1; }
members=$(echo "$files" | awk -v p="$prefix" 'NF { print p "/" $2 }')
# shellcheck disable=SC2086
tar -xzf "$sdist" -C "$tmp" $members
echo "$files" | while read -r sum name; do
    [ -z "$name" ] && continue
    echo "$sum  $tmp/$prefix/$name" | sha256sum --check --status ||
        { echo "fetch_vocab_tests: $name does not match sha256 $sum" >&2; exit 1; }
    mv "$tmp/$prefix/$name" "$dest/$name"
done
echo "fetch_vocab_tests: wrote $(echo "$files" | grep -c .) files to $dest"
