"""For each GGUF type: the largest |logprob difference| between smolchat and transformers over the
first reply token's top five, on the single-turn prompts of tests/fixtures/gguf-reference/<TYPE>.json.
Run from the repo root: python3 tests/reference/compare_top5.py target/release/smolchat DIR_OF_GGUF_FILES
[TYPE ...] [-- GENERATE_ARGS ...] (the files are made by make_gguf_types.sh); e.g. `BF16 -- --precision bf16`."""
import json, subprocess, sys
types = ["F32","F16","BF16","Q8_0","Q4_0","Q4_1","Q5_0","Q5_1","Q4_K_M","Q5_K_M","Q6_K"]
rest = sys.argv[3:]
extra = rest[rest.index("--") + 1:] if "--" in rest else []
chosen = rest[:rest.index("--")] if "--" in rest else rest
types = chosen or types
root = "tests/fixtures/gguf-reference"
for t in types:
    ref = json.load(open(f"{root}/{t}.json"))
    worst = 0.0; n = 0; top1 = 0
    for p in ref["prompts"]:
        msgs = p["messages"]
        if len(msgs) > 2 or msgs[-1]["role"] != "user":
            continue
        args = [sys.argv[1], "generate", "--model", f"{sys.argv[2]}/SmolLM2-135M-Instruct.{t}.gguf",
                "--prompt", msgs[-1]["content"], "--temperature", "0", "--max-tokens", "1", "--json", "--logprobs", "5"] + extra
        if len(msgs) == 2:
            args += ["--system", msgs[0]["content"]]
        out = subprocess.run(args, capture_output=True, text=True)
        if out.returncode != 0:
            print(t, out.stderr[-300:]); break
        d = json.loads(out.stdout.strip().splitlines()[-1])
        ours = {a["id"]: a["logprob"] for a in d["tokens"][0]["top_logprobs"]}
        refd = {e["id"]: e["logprob"] for e in p["first_token_top5"]}
        common = set(ours) & set(refd)
        worst = max([worst] + [abs(ours[i] - refd[i]) for i in common])
        top1 += int(max(ours, key=ours.get) == p["first_token_top5"][0]["id"])
        n += 1
    print(t, f"{worst:.2e}", f"{top1}/{n}", flush=True)
