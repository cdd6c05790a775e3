#!/usr/bin/env python3
"""Reference logits / greedy continuations for a SmolLM2-135M-Instruct GGUF file.

The GGUF is loaded by Hugging Face transformers, which dequantizes every tensor
exactly (to float32 here) and undoes llama.cpp's Q/K row permutation, so the
numbers below are "the math of the file" computed in f32 PyTorch -- independent
of llama.cpp's kernels (which use quantized dot products with q8 activations).

For each of a fixed list of chat prompts this writes:
  * messages, prompt_ids (genuine tokenizer + its chat template,
    add_generation_prompt=True; checked equal to the GGUF-derived tokenizer's),
  * the first N greedy ids (argmax, no EOS stop; `eos_at` = index of the first
    EOS in that list or null), decoded text (full, and the answer up to EOS),
  * top-5 (id, token, logprob, logit) at the FIRST reply position, logprob from
    log_softmax over the full f32 distribution (49152 entries),
  * per greedy step, the chosen id's logprob and the margin to the runner-up
    (so consumers can tell near-ties where f32 noise may flip the argmax).

Usage:
  python gguf_reference.py --gguf /work/models/SmolLM2-135M-Instruct.Q4_1.gguf \
      --tokenizer-dir /work/shared/models/smollm2-135m-instruct \
      --out tests/fixtures/gguf-reference/Q4_1.json
"""
import argparse
import collections
import hashlib
import json
import os
import platform
import sys
import time

import torch

# Fixed prompt set. Index 0 must stay the plain France question (no system prompt).
PROMPTS = [
    {"name": "france",
     "messages": [{"role": "user", "content": "What is the capital of France?"}]},
    {"name": "howto_egg_system",
     "messages": [{"role": "system", "content": "You are a concise assistant."},
                  {"role": "user", "content": "How do I boil an egg?"}]},
    {"name": "math_train",
     "messages": [{"role": "user", "content":
                   "If a train travels at 60 miles per hour for 2.5 hours, how far does it go?"}]},
    {"name": "haiku_ocean",
     "messages": [{"role": "user", "content": "Write a haiku about the ocean."}]},
    {"name": "code_reverse",
     "messages": [{"role": "user", "content": "Write a Python function that reverses a string."}]},
    {"name": "french_question",
     "messages": [{"role": "user", "content": "Quelle est la capitale de l'Allemagne ?"}]},
    {"name": "multi_turn_book",
     "messages": [{"role": "user", "content": "Hi! What's your name?"},
                  {"role": "assistant", "content":
                   "I'm SmolLM, a helpful AI assistant. How can I help you today?"},
                  {"role": "user", "content": "Can you recommend a good book to read?"}]},
    {"name": "pirate_system",
     "messages": [{"role": "system", "content": "You are a pirate."},
                  {"role": "user", "content": "Tell me about the weather today."}]},
]


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tensor_type_counts(path):
    try:
        from gguf import GGUFReader
    except ImportError:
        return None
    r = GGUFReader(path)
    counts = collections.Counter(t.tensor_type.name for t in r.tensors)
    ft = r.fields.get("general.file_type")
    return {"counts": dict(sorted(counts.items())),
            "general.file_type": int(ft.contents()) if ft is not None else None}


def _dist_version(name):
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return None


def as_ids(x):
    # apply_chat_template may return a list, a BatchEncoding or a tensor depending on version
    if hasattr(x, "keys") and "input_ids" in x:
        x = x["input_ids"]
    if hasattr(x, "tolist"):
        x = x.tolist()
    if x and isinstance(x[0], list):
        x = x[0]
    return [int(i) for i in x]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--tokenizer-dir", default="/work/shared/models/smollm2-135m-instruct")
    ap.add_argument("--out", required=True)
    ap.add_argument("--n-greedy", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-gguf-tokenizer-check", action="store_true")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = os.path.abspath(args.gguf)
    gdir, gname = os.path.dirname(gguf_path), os.path.basename(gguf_path)
    t0 = time.time()

    genuine_tok = AutoTokenizer.from_pretrained(args.tokenizer_dir)
    eos_id = genuine_tok.convert_tokens_to_ids("<|im_end|>")

    prompt_ids = [as_ids(genuine_tok.apply_chat_template(p["messages"], add_generation_prompt=True,
                                                         tokenize=True))
                  for p in PROMPTS]

    tok_check = None
    if not args.skip_gguf_tokenizer_check:
        gguf_tok = AutoTokenizer.from_pretrained(gdir, gguf_file=gname)
        mismatches = []
        for i, p in enumerate(PROMPTS):
            # (a) GGUF tokenizer + GGUF chat template
            g = as_ids(gguf_tok.apply_chat_template(p["messages"], add_generation_prompt=True,
                                                    tokenize=True))
            # (b) GGUF tokenizer on the genuine template's rendered text
            text = genuine_tok.apply_chat_template(p["messages"], add_generation_prompt=True,
                                                   tokenize=False)
            g2 = gguf_tok(text, add_special_tokens=False)["input_ids"]
            if g != prompt_ids[i] or list(g2) != prompt_ids[i]:
                mismatches.append({"prompt": i, "genuine": prompt_ids[i], "gguf_template": g,
                                   "gguf_tok_genuine_text": list(g2)})
        tok_check = {"gguf_tokenizer_matches_genuine": not mismatches,
                     "gguf_chat_template_equal": gguf_tok.chat_template == genuine_tok.chat_template,
                     "mismatches": mismatches}
        if mismatches:
            print("WARNING: GGUF tokenizer/template prompt ids differ from genuine", file=sys.stderr)
            for m in mismatches:
                print(json.dumps(m), file=sys.stderr)

    try:
        model = AutoModelForCausalLM.from_pretrained(gdir, gguf_file=gname, dtype=torch.float32)
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(gdir, gguf_file=gname, torch_dtype=torch.float32)
    model.eval()
    assert next(model.parameters()).dtype == torch.float32
    load_s = time.time() - t0

    results = []
    with torch.inference_mode():
        for i, p in enumerate(PROMPTS):
            ids = prompt_ids[i]
            inp = torch.tensor([ids], dtype=torch.long)
            out = model(input_ids=inp, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1].float()
            lp = torch.log_softmax(logits, dim=-1)
            top = torch.topk(lp, args.top_k)
            top5 = [{"id": int(t), "token": genuine_tok.convert_ids_to_tokens(int(t)),
                     "logprob": float(v), "logit": float(logits[int(t)])}
                    for v, t in zip(top.values, top.indices)]
            greedy, step_lp, step_margin = [], [], []
            for step in range(args.n_greedy):
                lp = torch.log_softmax(logits, dim=-1)
                t2 = torch.topk(lp, 2)
                nxt = int(t2.indices[0])
                greedy.append(nxt)
                step_lp.append(round(float(t2.values[0]), 6))
                step_margin.append(round(float(t2.values[0] - t2.values[1]), 6))
                if step + 1 == args.n_greedy:
                    break
                out = model(input_ids=torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits = out.logits[0, -1].float()
            eos_at = greedy.index(eos_id) if eos_id in greedy else None
            answer_ids = greedy[:eos_at] if eos_at is not None else greedy
            results.append({
                "name": p["name"],
                "messages": p["messages"],
                "prompt_ids": ids,
                "greedy_ids": greedy,
                "eos_at": eos_at,
                "greedy_text": genuine_tok.decode(greedy, skip_special_tokens=False),
                "answer_text": genuine_tok.decode(answer_ids, skip_special_tokens=True),
                "greedy_logprobs": step_lp,
                "greedy_margin_to_2nd": step_margin,
                "first_token_top5": top5,
            })
            print(f"[{i}] {p['name']}: {results[-1]['answer_text']!r}", flush=True)

    doc = {
        "description": "transformers (GGUF dequantized to f32) reference for smolchat; "
                       "prompt ids from the genuine tokenizer + chat template with "
                       "add_generation_prompt=True; greedy = argmax without EOS stop; "
                       "first_token_top5 = top-5 of log_softmax(f32 logits) at the first reply position.",
        "gguf_file": gname,
        "gguf_sha256": sha256_file(gguf_path),
        "gguf_size": os.path.getsize(gguf_path),
        "gguf_tensor_types": tensor_type_counts(gguf_path),
        "eos_id": eos_id,
        "n_greedy": args.n_greedy,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__,
                     "gguf": _dist_version("gguf"), "accelerate": _dist_version("accelerate"),
                     "numpy": __import__("numpy").__version__},
        "dtype": "float32",
        "device": "cpu",
        "tokenizer_check": tok_check,
        "load_seconds": round(load_s, 1),
        "prompts": results,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    os.replace(tmp, args.out)
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes) in {time.time() - t0:.1f}s")
    print("PROMPT0_ANSWER:", results[0]["answer_text"])


if __name__ == "__main__":
    main()
