"""Writes dequant_reference.json: random blocks of each type smolchat dequantizes, and what
gguf-py (llama.cpp's own Python package, an implementation independent of ours) decodes them to.
Also records gguf-py's block-size table. Run: pip install gguf==0.19.0 numpy; python3 this.py
"""
import json
import os

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf.quants import dequantize

rng = np.random.default_rng(20260124)
# Offsets of each block's f16 scale fields: random bytes there could be NaN or huge.
F16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
              "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}
cases = []
for name in ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]:
    qtype = T[name]
    block, size = GGML_QUANT_SIZES[qtype]
    n_blocks = 64 if block == 1 else (8 if block == 32 else 3)
    if name == "F32":
        raw = rng.normal(0, 1, n_blocks).astype("<f4").tobytes()
    elif name == "F16":
        raw = rng.normal(0, 1, n_blocks).astype("<f2").tobytes()
    elif name == "BF16":
        raw = (rng.normal(0, 1, n_blocks).astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()
    else:
        blocks = bytearray(rng.integers(0, 256, n_blocks * size, dtype=np.uint8).tobytes())
        for b in range(n_blocks):
            for off in F16_FIELDS[name]:
                scale = np.float16(rng.uniform(-0.05, 0.05)).tobytes()
                blocks[b * size + off: b * size + off + 2] = scale
        raw = bytes(blocks)
    values = dequantize(np.frombuffer(raw, dtype=np.uint8), qtype).astype("<f4").reshape(-1)
    cases.append({"type": name, "bytes": raw.hex(), "f32_bits": values.view("<u4").tolist()})

sizes = {t.name: list(GGML_QUANT_SIZES[t]) for t in T if t in GGML_QUANT_SIZES}
ids = {t.name: int(t) for t in T}
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "gguf", "dequant_reference.json")
with open(out, "w") as f:
    json.dump({"generator": "gguf-py 0.19.0", "cases": cases, "sizes": sizes, "ids": ids}, f)
print(f"wrote {out}: {len(cases)} types")
