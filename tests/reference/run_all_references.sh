#!/usr/bin/env bash
# transformers (f32, dequantized) reference JSON for every GGUF type.
# The GGUF-tokenizer cross-check runs on Q4_1 only: all derived files carry
# byte-identical tokenizer.* metadata (llama-quantize copies it).
set -euo pipefail
VENV=${VENV:-/work/pyref}
MODELS=${MODELS:-/work/models}
HERE=$(cd "$(dirname "$0")" && pwd)
FIX=${FIX:-$HERE/../fixtures/gguf-reference}
TYPES=${TYPES:-"Q4_1 F32 Q8_0 F16 BF16 Q4_0 Q5_0 Q5_1 Q4_K_M Q5_K_M Q6_K"}
for T in $TYPES; do
  if [ -f "$FIX/$T.json" ] && [ -z "${FORCE:-}" ]; then echo "skip $T (exists)"; continue; fi
  EXTRA=""; [ "$T" != "Q4_1" ] && EXTRA="--skip-gguf-tokenizer-check"
  nice -n 19 "$VENV/bin/python" "$HERE/gguf_reference.py" \
      --gguf "$MODELS/SmolLM2-135M-Instruct.$T.gguf" --out "$FIX/$T.json" $EXTRA
done
