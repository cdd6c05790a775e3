"""Tiny random checkpoints of each model family, written by transformers, with their float32 logits.

For each family in FAMILIES this instantiates transformers' own model class from a small config
with seeded random weights (biases and norm weights drawn too, which transformers initialises to
zeros and ones and so would hide a missing bias or norm), saves it as a Hugging Face folder
(config.json, model.safetensors in float32) under tests/fixtures/families/<name>/, and writes
reference.json beside it: the input ids, the logits of every position of one forward pass, and
the greedy continuation decoded with transformers' own KV cache.

    python tests/reference/families_reference.py [--out tests/fixtures/families]

Environment: torch 2.15.0 and transformers 5.24.0 from PyPI, run on the CPU.
"""

import argparse
import json
import pathlib

import torch
import transformers

COMMON = dict(
    hidden_size=64,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    torch_dtype="float32",
)

FAMILIES = {
    # Biases on q, k and v; the head tied to the embedding.
    "qwen2": (
        transformers.Qwen2Config,
        transformers.Qwen2ForCausalLM,
        dict(num_hidden_layers=2, tie_word_embeddings=True, use_sliding_window=False, rope_theta=1e6),
    ),
    # Per-head q/k norms, and heads wider than hidden_size / heads; an untied head.
    "qwen3": (
        transformers.Qwen3Config,
        transformers.Qwen3ForCausalLM,
        dict(
            num_hidden_layers=2,
            head_dim=32,
            tie_word_embeddings=False,
            use_sliding_window=False,
            # Far from the default, so that a theta read from the wrong key shows.
            rope_theta=100.0,
        ),
    ),
    # Every fourth layer without RoPE (the default interval), from no_rope_layers.
    "smollm3": (
        transformers.SmolLM3Config,
        transformers.SmolLM3ForCausalLM,
        dict(
            num_hidden_layers=4,
            tie_word_embeddings=True,
            use_sliding_window=False,
            rope_theta=5e6,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        ),
    ),
    # Fused qkv_proj and gate_up_proj, and LongRoPE: the short factors and the attention
    # factor within the original context of 64 positions (12 input tokens stay inside it).
    "phi3": (
        transformers.Phi3Config,
        transformers.Phi3ForCausalLM,
        dict(
            num_hidden_layers=2,
            tie_word_embeddings=False,
            original_max_position_embeddings=64,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0, 1.1, 1.3, 1.7, 2.2, 3.0, 4.1, 5.5],
                "long_factor": [1.0, 1.5, 2.5, 4.0, 6.5, 9.0, 13.0, 19.0],
            },
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        ),
    ),
    # Four norms a layer, weights as offsets from one, GELU (tanh), embeddings scaled by
    # sqrt(hidden), q/k norms, and sliding layers with a window of 4 (the 12 input tokens
    # cross it) and their own RoPE base beside a global layer.
    "gemma3": (
        transformers.Gemma3TextConfig,
        transformers.Gemma3ForCausalLM,
        dict(
            num_hidden_layers=3,
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=4,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
            tie_word_embeddings=True,
            pad_token_id=0,
            bos_token_id=2,
            eos_token_id=1,
        ),
    ),
    # Phi-4-mini's shape of Phi-3: RoPE over part of each head (half of it here), with LongRoPE.
    "phi4": (
        transformers.Phi3Config,
        transformers.Phi3ForCausalLM,
        dict(
            num_hidden_layers=2,
            tie_word_embeddings=True,
            original_max_position_embeddings=64,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
                "short_factor": [1.0, 1.2, 1.9, 3.1],
                "long_factor": [1.0, 2.0, 5.0, 11.0],
            },
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        ),
    ),
    # Gemma 3's multimodal checkpoints (4B and up): the language model under `language_model.`,
    # beside a vision tower that a text chat does not read.
    "gemma3mm": (
        transformers.Gemma3Config,
        transformers.Gemma3ForConditionalGeneration,
        dict(
            text_config=dict(
                vocab_size=128,
                hidden_size=64,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=16,
                query_pre_attn_scalar=16,
                sliding_window=4,
                max_position_embeddings=256,
                rms_norm_eps=1e-6,
                pad_token_id=0,
                bos_token_id=2,
                eos_token_id=1,
            ),
            vision_config=dict(
                hidden_size=16,
                intermediate_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                image_size=28,
                patch_size=14,
            ),
            mm_tokens_per_image=4,
            image_token_index=127,
            boi_token_index=125,
            eoi_token_index=126,
        ),
    ),
}

INPUT_IDS = [1, 17, 42, 99, 3, 64, 127, 8, 55, 23, 90, 12]
GREEDY_STEPS = 8


def randomised(model: torch.nn.Module, seed: int) -> None:
    """Every parameter drawn at random, norms near one and the rest near zero."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.rand(param.shape, generator=generator) * 2 - 1
            if "norm" in name:
                param.copy_(1.0 + 0.1 * noise)
            else:
                param.copy_(0.08 * noise)


def main() -> None:
    parser = argparse.ArgumentParser()
    here = pathlib.Path(__file__).resolve().parent
    parser.add_argument("--out", type=pathlib.Path, default=here.parent / "fixtures" / "families")
    args = parser.parse_args()
    torch.manual_seed(0)
    for seed, (name, (config_class, model_class, extra)) in enumerate(FAMILIES.items()):
        config = config_class(**extra) if "text_config" in extra else config_class(**COMMON, **extra)
        model = model_class(config).eval()
        randomised(model, seed)
        folder = args.out / name
        model.save_pretrained(folder, safe_serialization=True)
        ids = torch.tensor([INPUT_IDS])
        with torch.no_grad():
            logits = model(ids).logits[0]
            greedy = model.generate(
                ids,
                max_new_tokens=GREEDY_STEPS,
                do_sample=False,
                pad_token_id=0,
                eos_token_id=None,
            )[0, len(INPUT_IDS):]
        reference = {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "input_ids": INPUT_IDS,
            "logits": [[round(float(v), 7) for v in row] for row in logits],
            "greedy_ids": greedy.tolist(),
        }
        (folder / "reference.json").write_text(json.dumps(reference) + "\n")
        (folder / "generation_config.json").unlink(missing_ok=True)
        print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters -> {folder}")


if __name__ == "__main__":
    main()
