#!/usr/bin/env python3
"""The local server's decode speed next to `smolchat generate` on the same prompt, and its
aggregate speed with several clients at once. Standard library only.

    python3 benches/server_speed.py SMOLCHAT_BINARY MODEL [--runs 5] [--clients 4]

Runs alternate (generate, then one server request) so that drift of a shared machine hits
both alike; prints the medians and their ratio, and one JSON line for the record. Decode speed
on the server side is measured as a client sees it: streamed tokens after the first, over the
time from the first to the last.
"""

import argparse
import http.client
import json
import statistics
import subprocess
import threading
import time

PROMPT = "Write a long story about a dragon who learns to bake bread."
MAX_TOKENS = 128


def generate(binary, model):
    out = subprocess.run(
        [binary, "generate", "--model", model, "--prompt", PROMPT, "--temperature", "0",
         "--max-tokens", str(MAX_TOKENS), "--json"],
        check=True, capture_output=True, text=True,
    ).stdout
    report = json.loads(out)
    return report["decode_tok_s"], len(report["token_ids"])


def stream(host, port, prompt, max_tokens):
    """Streams one greedy chat reply: (when it was asked, when each chunk with text came,
    completion tokens, when the stream ended), in `time.perf_counter()` seconds."""
    body = json.dumps({
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0, "max_tokens": max_tokens, "stream": True,
        "stream_options": {"include_usage": True},
    })
    connection = http.client.HTTPConnection(host, port, timeout=900)
    started = time.perf_counter()
    connection.request("POST", "/v1/chat/completions", body,
                       {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200, response.read()
    stamps, usage = [], None
    for line in response:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[len("data: "):])
        if chunk.get("usage"):
            usage = chunk["usage"]
        if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
            stamps.append(time.perf_counter())
    ended = time.perf_counter()
    connection.close()
    return started, stamps, usage["completion_tokens"], ended


def stream_chat(host, port):
    """(decode tok/s seen by the client, completion tokens, seconds from request to end)."""
    started, stamps, tokens, ended = stream(host, port, PROMPT, MAX_TOKENS)
    # Chunks carry one token each, except text the detokenizer holds back: count tokens,
    # time from the first chunk.
    decode = (tokens - 1) / (stamps[-1] - stamps[0])
    return decode, tokens, ended - started


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("model")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()

    server = subprocess.Popen(
        [args.binary, "serve", "--model", args.model, "--port", "0"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        line = server.stdout.readline()
        address = line.rsplit("http://", 1)[1].split("/v1")[0]
        host, port = address.rsplit(":", 1)
        port = int(port)
        stream_chat(host, port)  # warm-up

        cli, api = [], []
        for _ in range(args.runs):
            speed, cli_tokens = generate(args.binary, args.model)
            cli.append(speed)
            speed, api_tokens, _ = stream_chat(host, port)
            api.append(speed)
            assert cli_tokens == api_tokens, (cli_tokens, api_tokens)

        aggregate = []
        for _ in range(max(1, args.runs // 2)):
            results = [None] * args.clients

            def client(index):
                results[index] = stream_chat(host, port)

            started = time.perf_counter()
            threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            wall = time.perf_counter() - started
            aggregate.append(sum(tokens for _, tokens, _ in results) / wall)
    finally:
        server.terminate()
        server.wait()

    cli_median, api_median = statistics.median(cli), statistics.median(api)
    print(f"generate decode  tok/s: {', '.join(f'{x:.1f}' for x in cli)}  median {cli_median:.1f}")
    print(f"server decode    tok/s: {', '.join(f'{x:.1f}' for x in api)}  median {api_median:.1f}")
    print(f"server / generate: {api_median / cli_median:.3f}")
    print(f"{args.clients} clients aggregate tok/s (request to last token): "
          f"{', '.join(f'{x:.1f}' for x in aggregate)}  median {statistics.median(aggregate):.1f}")
    print(json.dumps({
        "generate_decode_tok_s": cli, "server_decode_tok_s": api,
        "ratio": api_median / cli_median, "clients": args.clients,
        "aggregate_tok_s": aggregate,
    }))


if __name__ == "__main__":
    main()
