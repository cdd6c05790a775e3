"""smolchat next to llama.cpp at the sizes people run, in the same minutes.

Writes a random checkpoint of a real model's shape (benches/shapes/NAME/config.json:
smollm2-1.7b, qwen3-1.7b, gemma3-1b, and smollm2-135m, the size this app began with; with
SmolLM2's tokenizer, which the converter pads to a larger vocabulary), converts it with llama.cpp's own tools to GGUF types (BF16 first, the
others quantized from it), measures the machine's memory read bandwidth, then alternates
`smolchat bench` and `llama-bench` (its defaults: weights repacked; the decode with the
prompt in its cache, as ours) on each file, round after round, and prints the medians of
the rounds and their ratios, smolchat over llama.cpp.

    python benches/at_size.py --smolchat target/release/smolchat \\
        --llama-cpp /path/to/llama.cpp --work /tmp/at-size [--types Q4_K_M Q8_0] \\
        [--shape smollm2-1.7b] [--rounds 3] [--runs 3] [--max-cpu avx2] [--baseline OLD]

Needs a Python with torch, safetensors, numpy and sentencepiece for llama.cpp's converter
(tests/reference/ sets one up), and llama.cpp built with llama-quantize and llama-bench
(tests/reference/build_llama_cpp.sh; on a VM whose CPU reports AMX but faults on it, its
native build stops with "Illegal instruction": build llama-bench again with
`-mno-amx-tile -mno-amx-int8 -mno-amx-bf16` and pass it as `--llama-bench`). `--max-cpu avx2` runs smolchat as on a CPU without
AVX-512 (SMOLCHAT_MAX_CPU; `avxvnni`: with AVX-VNNI); `--baseline OLD` alternates another smolchat binary too (an
older build) and adds its ratio. Results also go to WORK/results-<shape>.json.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json"]
THREADS = 2


def run(command, env=None):
    """Runs a command, returning stdout and the peak resident set size in MiB."""
    timed = ["/usr/bin/time", "-v", *map(str, command)]
    done = subprocess.run(timed, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"{' '.join(map(str, command))} failed:\n{done.stdout}\n{done.stderr}")
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    return done.stdout, int(peak.group(1)) / 1024 if peak else float("nan")


def checkpoint(args, work):
    folder = work / args.shape
    if not (folder / "model.safetensors").exists() and not list(folder.glob("*.safetensors")):
        config = REPO / "benches" / "shapes" / args.shape / "config.json"
        run([args.smolchat, "dev", "random-checkpoint", "--config", config, "--out", folder])
        for name in TOKENIZER_FILES:
            shutil.copy(REPO / "tests" / "fixtures" / "smollm2-135m-instruct" / name, folder)
        fill_vocabulary(folder, json.loads(config.read_text())["vocab_size"])
    return folder


def fill_vocabulary(folder, size):
    """Gives SmolLM2's tokenizer the shape's vocabulary size with tokens no text spells:
    Gemma's converter cuts the embedding to the tokenizer's vocabulary, which would leave a
    file neither program opens (its head would still be 262,144 rows)."""
    path = folder / "tokenizer.json"
    tokenizer = json.loads(path.read_text())
    vocab = tokenizer["model"]["vocab"]
    missing = size - len(vocab) - len(tokenizer["added_tokens"])
    vocab.update({f"<unused{i}>": len(vocab) + i for i in range(max(missing, 0))})
    path.write_text(json.dumps(tokenizer))


def gguf_files(args, work, folder):
    llama = Path(args.llama_cpp)
    bf16 = work / f"{args.shape}-BF16.gguf"
    if not bf16.exists():
        run([sys.executable, llama / "convert_hf_to_gguf.py", folder, "--outtype", "bf16",
             "--outfile", bf16])
    files = {}
    for kind in args.types:
        path = work / f"{args.shape}-{kind}.gguf"
        if kind != "BF16" and not path.exists():
            run([llama / "build" / "bin" / "llama-quantize", bf16, path, kind, THREADS])
        files[kind] = path
    return files


def memory_bandwidth(work):
    probe = work / "memory_read"
    if not probe.exists():
        run(["cc", "-O3", "-march=native", "-pthread", REPO / "benches" / "memory_read.c",
             "-o", probe])
    out, _ = run([probe, THREADS])
    return float(out.strip())


def smolchat(args, path, binary=None):
    env = dict(os.environ)
    if args.max_cpu:
        env["SMOLCHAT_MAX_CPU"] = args.max_cpu
    out, peak = run([binary or args.smolchat, "bench", "--model", path, "--runs", args.runs, "--json"], env)
    report = json.loads(out.strip().splitlines()[-1])
    return {"prefill": report["prefill_tok_s"]["median"],
            "decode": report["decode_tok_s"]["median"],
            "load_s": report["load_s"], "rss_mib": peak}


def llama_cpp(args, path):
    """A 128-token prompt, then 128 tokens decoded with the prompt in the cache (`-d 128`), as
    `smolchat bench` decodes them: llama-bench's plain `-n` decodes from an empty cache, which
    on the 1.7B Q4_K_M file ran 1.12 times as fast (22.8 against 20.4 tok/s)."""
    bench = args.llama_bench or Path(args.llama_cpp) / "build" / "bin" / "llama-bench"
    speed, peak = {}, 0
    tests = [("prefill", ["-p", 128, "-n", 0]), ("decode", ["-p", 0, "-n", 128, "-d", 128])]
    for test, tokens in tests:
        out, test_peak = run([bench, "-m", path, *tokens, "-t", THREADS, "-r", args.runs,
                              "-o", "json"])
        speed[test] = json.loads(out)[0]["avg_ts"]
        peak = max(peak, test_peak)
    return {**speed, "rss_mib": peak}


def baseline_cell(ours, old, median):
    prefill, decode = median(old, "prefill"), median(old, "decode")
    return (f" {prefill:.1f} / {decode:.1f} ({median(ours, 'prefill') / prefill:.2f}×, "
            f"{median(ours, 'decode') / decode:.2f}×) |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smolchat", required=True)
    parser.add_argument("--llama-cpp", required=True, help="llama.cpp's source folder, built")
    parser.add_argument("--work", required=True, type=Path)
    parser.add_argument("--shape", default="smollm2-1.7b")
    parser.add_argument("--types", nargs="+", default=["Q4_K_M", "Q4_0", "Q6_K", "Q8_0", "BF16"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-cpu", choices=["avxvnni", "avx2", "portable"])
    parser.add_argument("--llama-bench", help="a llama-bench other than llama.cpp's build/bin")
    parser.add_argument("--baseline", help="another smolchat binary to alternate with")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    files = gguf_files(args, args.work, checkpoint(args, args.work))
    bandwidth = memory_bandwidth(args.work)
    print(f"memory read on {THREADS} threads: {bandwidth:.1f} GB/s", flush=True)

    programs = [("smolchat", smolchat), ("llama.cpp", llama_cpp)]
    if args.baseline:
        programs.append(("baseline", lambda args, path: smolchat(args, path, args.baseline)))
    rounds = {kind: {name: [] for name, _ in programs} for kind in files}
    for number in range(args.rounds):
        for kind, path in files.items():
            for name, measure in programs:
                result = measure(args, path)
                rounds[kind][name].append(result)
                print(f"round {number + 1} {kind} {name}: {json.dumps(result)}", flush=True)
    bandwidth_after = memory_bandwidth(args.work)
    print(f"memory read after: {bandwidth_after:.1f} GB/s")

    median = lambda runs, key: statistics.median(r[key] for r in runs)  # noqa: E731
    baseline = " baseline: prefill / decode (ours over it) |" if args.baseline else ""
    print("\n| file | prefill tok/s ours / llama.cpp (ratio) | decode tok/s ours / llama.cpp "
          "(ratio) | decode GB/s (share of bandwidth) | load s | peak RSS MiB ours / llama.cpp "
          f"|{baseline}")
    print("|---|---|---|---|---|---|" + ("---|" if args.baseline else ""))
    summary = {"shape": args.shape, "bandwidth_gb_s": [bandwidth, bandwidth_after],
               "max_cpu": args.max_cpu, "types": {}}
    for kind, path in files.items():
        ours, theirs = rounds[kind]["smolchat"], rounds[kind]["llama.cpp"]
        row = {key: (median(ours, key), median(theirs, key)) for key in
               ["prefill", "decode", "rss_mib"]}
        read = path.stat().st_size / 1e9 * row["decode"][0]
        summary["types"][kind] = {**row, "load_s": median(ours, "load_s"), "rounds": rounds[kind]}
        print(f"| {kind} | {row['prefill'][0]:.1f} / {row['prefill'][1]:.1f} "
              f"({row['prefill'][0] / row['prefill'][1]:.2f}×) | {row['decode'][0]:.1f} / "
              f"{row['decode'][1]:.1f} ({row['decode'][0] / row['decode'][1]:.2f}×) | "
              f"{read:.1f} ({read / max(bandwidth, bandwidth_after):.0%}) | "
              f"{median(ours, 'load_s'):.2f} | {row['rss_mib'][0]:.0f} / {row['rss_mib'][1]:.0f} |"
              + (baseline_cell(ours, rounds[kind]["baseline"], median) if args.baseline else ""))
    (args.work / f"results-{args.shape}.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
