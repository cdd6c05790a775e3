"""`smolchat serve` attacked from this machine, on loopback only, in fixed counts and times.

flood: opens 5,000 connections that each send half a request head and stop, while /health
must answer within a second on a fresh connection every so often; then closes them all and
checks the server's memory is back within 10% of what it was before.

soak: 2,000 chat requests from 16 clients, streamed and not, a random fifth of them hung
up part-way; every response that was read to the end must be complete (a whole JSON reply,
or a stream that ends with [DONE]), and memory after must be within 10% of before.

Prints what it measured and exits non-zero on any failure.

    python .ci/server_attack.py target/debug/smolchat tests/fixtures/tiny-smollm [flood|soak]
"""

import json
import random
import socket
import subprocess
import sys
import threading
import time

BINARY, MODEL_DIR = sys.argv[1], sys.argv[2]
PHASES = sys.argv[3:] or ["flood", "soak"]
FLOOD_CONNECTIONS = 5000
SOAK_REQUESTS = 2000
SOAK_CLIENTS = 16
HEALTH_LIMIT_S = 1.0
MEMORY_TOLERANCE = 0.10


def start_server():
    process = subprocess.Popen(
        [BINARY, "serve", "--model", MODEL_DIR, "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()
    if "http://" not in line:
        process.kill()
        raise SystemExit(f"the server did not start: {line!r}")
    address = line.split("http://")[-1].strip().split("/")[0]
    host, port = address.rsplit(":", 1)
    if host not in ("127.0.0.1", "localhost"):
        process.kill()
        raise SystemExit(f"refusing to attack a server that is not on loopback: {line!r}")
    return process, ("127.0.0.1", int(port))


def resident_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise SystemExit("no VmRSS for the server")


def exchange(address, request, timeout=30.0):
    """Sends `request` on a fresh connection and reads until the server closes it."""
    with socket.create_connection(address, timeout=timeout) as connection:
        connection.sendall(request)
        chunks = []
        while True:
            chunk = connection.recv(65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def health(address):
    started = time.monotonic()
    answer = exchange(
        address, b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", 5.0
    )
    return answer.split(b" ", 2)[1] == b"200", time.monotonic() - started


def post(body):
    data = json.dumps(body).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\nConnection: close\r\n"
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )


def warm_up(address):
    """Brings the server to its working memory: a few replies of each kind."""
    for stream in (False, True) * 4:
        exchange(address, post(chat_body(stream, seed=1)))
    time.sleep(0.5)


def chat_body(stream, seed):
    return {
        "messages": [{"role": "user", "content": f"Tell me about number {seed}."}],
        "max_tokens": 2 + seed % 12,
        "temperature": 0.8,
        "seed": seed,
        "stream": stream,
    }


def check_memory(pid, before, label):
    # The allocator may hand memory back a moment after the last connection goes.
    for _ in range(20):
        after = resident_kib(pid)
        if after <= before * (1 + MEMORY_TOLERANCE):
            break
        time.sleep(0.25)
    ratio = after / before
    print(f"{label}: resident memory {before} KiB before, {after} KiB after ({ratio:.2f}x)")
    return ratio <= 1 + MEMORY_TOLERANCE


def flood(process, address):
    warm_up(address)
    before = resident_kib(process.pid)
    half_sent = b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Le"
    held, slowest, failures, peak = [], 0.0, 0, before
    started = time.monotonic()
    for n in range(FLOOD_CONNECTIONS):
        try:
            connection = socket.create_connection(address, timeout=5.0)
            connection.sendall(half_sent)
            held.append(connection)
        except OSError as err:
            print(f"connection {n}: {err}")
            failures += 1
        if n % 250 == 249:
            ok, seconds = health(address)
            slowest = max(slowest, seconds)
            peak = max(peak, resident_kib(process.pid))
            if not ok or seconds > HEALTH_LIMIT_S:
                print(f"after {n + 1} connections /health took {seconds:.3f} s (ok={ok})")
                failures += 1
    print(
        f"flood: {len(held)} half-sent connections in {time.monotonic() - started:.1f} s; "
        f"slowest /health meanwhile {slowest * 1000:.0f} ms; peak memory {peak} KiB"
    )
    for connection in held:
        connection.close()
    return failures + recovered(process, address, before, "flood")


def soak(process, address):
    # Warmed up the same way it is then measured: 16 at once.
    run_clients(address, 160)
    time.sleep(1.0)
    before = resident_kib(process.pid)
    started = time.monotonic()
    outcomes = run_clients(address, SOAK_REQUESTS)
    seconds = time.monotonic() - started
    print(f"soak: {SOAK_REQUESTS} requests from {SOAK_CLIENTS} clients in {seconds:.1f} s: {outcomes}")
    failures = outcomes["broken"] + (sum(outcomes.values()) != SOAK_REQUESTS)
    return failures + recovered(process, address, before, "soak")


def recovered(process, address, before, label):
    """Failures after an attack: /health must answer, and memory be back near `before`."""
    time.sleep(1.0)
    ok, _ = health(address)
    return (not ok) + (not check_memory(process.pid, before, label))


def run_clients(address, requests):
    """`requests` chat requests from SOAK_CLIENTS clients at once: how each ended."""
    outcomes = {"complete": 0, "hung_up": 0, "refused": 0, "broken": 0}
    lock = threading.Lock()
    counter = iter(range(requests))

    def client(seed):
        rng = random.Random(seed)
        while True:
            with lock:
                n = next(counter, None)
            if n is None:
                return
            stream = rng.random() < 0.5
            hang_up = rng.random() < 0.2
            outcome = one_request(address, chat_body(stream, n), stream, hang_up, rng)
            with lock:
                outcomes[outcome] += 1
                if outcome == "broken":
                    print(f"request {n} (stream={stream}) ended incomplete")

    clients = [threading.Thread(target=client, args=(seed,)) for seed in range(SOAK_CLIENTS)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    return outcomes


def one_request(address, body, stream, hang_up, rng):
    request = post(body)
    with socket.create_connection(address, timeout=60.0) as connection:
        if hang_up and rng.random() < 0.3:
            # Gone halfway through sending the request.
            connection.sendall(request[: rng.randrange(1, len(request))])
            return "hung_up"
        connection.sendall(request)
        if hang_up:
            connection.recv(rng.randrange(1, 400))
            return "hung_up"
        chunks = []
        while True:
            chunk = connection.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    answer = b"".join(chunks)
    head, _, payload = answer.partition(b"\r\n\r\n")
    status = head.split(b" ", 2)[1] if b" " in head else b""
    if status == b"503":
        return "refused"
    if status != b"200":
        return "broken"
    if stream:
        return "complete" if b"data: [DONE]\n\n" in payload else "broken"
    try:
        reply = json.loads(payload)
        return "complete" if reply["choices"][0]["finish_reason"] in ("stop", "length") else "broken"
    except (ValueError, KeyError, IndexError):
        return "broken"


def main():
    process, address = start_server()
    failures = 0
    try:
        for phase in PHASES:
            failures += {"flood": flood, "soak": soak}[phase](process, address)
    finally:
        process.terminate()
        process.wait(timeout=30)
    print("passed" if failures == 0 else f"{failures} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
