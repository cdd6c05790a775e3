#!/usr/bin/env python3
"""Many streaming clients at once: `smolchat serve --parallel N` against `llama-server
--parallel N` on the same model file, alternating in the same minutes. Standard library only.

    python3 benches/parallel_clients.py SMOLCHAT_BINARY MODEL.gguf \
        [--llama-server PATH] [--parallel 8] [--clients 1,2,4,8] [--rounds 3] [--tokens 128]

Each round runs every client count against each server in turn; a client streams a greedy
chat reply of `--tokens` tokens to a prompt of its own. Reported per server and client
count: the aggregate decode speed (every client's completion tokens over the wall time from
the first request to the last token), and the time to first token, median and largest over
the clients of all rounds. Before the rounds each server reads every prompt once, so every
round finds its prompts cached, as a chat's history is. One JSON line at the end holds every
figure.
"""

import argparse
import http.client
import json
import os
import statistics
import subprocess
import threading
import time

from server_speed import stream

PROMPTS = [
    "Write a long story about a dragon who learns to bake bread.",
    "Explain how a steam engine works, in detail.",
    "Describe a walk through a busy market in Marrakesh.",
    "Tell me the history of the bicycle.",
    "Write a letter from a lighthouse keeper to her sister.",
    "Explain why the sky is blue and sunsets are red.",
    "Describe how bees make honey, step by step.",
    "Write a story about a robot who wants to be a gardener.",
]


def round_of(port, clients, tokens):
    """(aggregate tok/s, each client's time to first token)."""
    results = [None] * clients

    def client(index):
        asked, stamps, completion, ended = stream(
            "127.0.0.1", port, PROMPTS[index % len(PROMPTS)], tokens)
        results[index] = (stamps[0] - asked, completion, ended)

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    last = max(ended for _, _, ended in results)
    total = sum(completion for _, completion, _ in results)
    return total / (last - started), [first for first, _, _ in results]


def wait_ready(port, process, what):
    deadline = time.time() + 600
    while time.time() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{what} exited with {process.returncode}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{what} did not start")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("model")
    parser.add_argument("--llama-server")
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--clients", default="1,2,4,8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    counts = [int(c) for c in args.clients.split(",")]

    servers = {"smolchat": (18081, [args.binary, "serve", "--model", args.model,
                                    "--port", "18081", "--parallel", str(args.parallel)])}
    if args.llama_server:
        # Each slot gets a context of 1,024 tokens, as llama-server divides `-c` among them.
        servers["llama-server"] = (18082, [
            args.llama_server, "-m", args.model, "--port", "18082", "-t", str(args.threads),
            "--parallel", str(args.parallel), "-c", str(1024 * args.parallel),
            "--log-disable"])
    processes = {}
    try:
        for name, (port, command) in servers.items():
            processes[name] = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL)
            wait_ready(port, processes[name], name)
            # Every prompt the rounds send, read once: both servers keep a finished
            # request's cache, so otherwise the first round at a new count would also read
            # the prompts no earlier count sent, and only there (one client's is always
            # cached), which measured prompt reading instead of decoding side by side.
            round_of(port, max(counts), 8)
        speed = {name: {c: [] for c in counts} for name in servers}
        ttft = {name: {c: [] for c in counts} for name in servers}
        for _ in range(args.rounds):
            for clients in counts:
                for name, (port, _) in servers.items():
                    aggregate, firsts = round_of(port, clients, args.tokens)
                    speed[name][clients].append(aggregate)
                    ttft[name][clients].extend(firsts)
    finally:
        for process in processes.values():
            process.terminate()
            process.wait()

    print(f"{'server':<14}{'clients':>8}{'tok/s (median)':>16}{'TTFT median':>13}{'TTFT max':>10}")
    for name in servers:
        for clients in counts:
            print(f"{name:<14}{clients:>8}{statistics.median(speed[name][clients]):>16.1f}"
                  f"{statistics.median(ttft[name][clients]):>13.2f}"
                  f"{max(ttft[name][clients]):>10.2f}")
    if "llama-server" in servers:
        for clients in counts:
            ratios = [ours / theirs for ours, theirs in
                      zip(speed["smolchat"][clients], speed["llama-server"][clients])]
            print(f"smolchat / llama-server, {clients} clients: "
                  f"{', '.join(f'{r:.2f}' for r in ratios)} (median {statistics.median(ratios):.2f})")
    print(json.dumps({"speed": speed, "ttft": ttft, "parallel": args.parallel,
                      "tokens": args.tokens}))


if __name__ == "__main__":
    main()
