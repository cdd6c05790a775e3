"""transformers' Llama 3 RoPE frequencies for the parameters `src/model/rope.rs` tests with.

    python tests/reference/llama3_rope_reference.py

Prints the inverse frequencies transformers computes (`rope_type: llama3`) for head_dim 16,
rope_theta 10000, factor 8, low_freq_factor 1, high_freq_factor 4 and
original_max_position_embeddings 16, as the Rust test's literal.
"""

import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

config = LlamaConfig(
    hidden_size=64,
    num_attention_heads=4,
    head_dim=16,
    rope_theta=10000.0,
    max_position_embeddings=128,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
)
inv_freq, scale = ROPE_INIT_FUNCTIONS["llama3"](config, torch.device("cpu"))
assert scale == 1.0
print("[" + ", ".join(f"{v:.9e}" for v in inv_freq.tolist()) + "]")
