"""Writes real_tensor_hashes.json: for a few tensors of the real SmolLM2 Q4_1 file, a hash of
the f32 bits gguf-py dequantizes them to, so tests/real_model.rs can require bit-identical
results on real data. The hash is sum(bits[i] * K^(i+1)) mod 2^64, cheap in numpy and in Rust.
Run: pip install gguf==0.19.0 numpy; python3 this.py tests/models/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import json
import os
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

K = np.uint64(0x9E3779B97F4A7C15)
NAMES = ["token_embd.weight", "blk.0.attn_q.weight", "blk.15.ffn_down.weight",
         "blk.29.attn_k.weight", "output_norm.weight"]

reader = GGUFReader(sys.argv[1])
tensors = {t.name: t for t in reader.tensors}
hashes = {}
with np.errstate(over="ignore"):
    for name in NAMES:
        t = tensors[name]
        values = dequantize(t.data, t.tensor_type).astype("<f4").reshape(-1)
        bits = values.view("<u4").astype(np.uint64)
        powers = np.cumprod(np.full(bits.size, K, dtype=np.uint64), dtype=np.uint64)
        hashes[name] = {"n": int(bits.size), "hash": int(np.sum(bits * powers, dtype=np.uint64))}
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "gguf", "real_tensor_hashes.json")
with open(out, "w") as f:
    json.dump({"generator": "gguf-py 0.19.0", "tensors": hashes}, f, indent=1)
print(hashes)
