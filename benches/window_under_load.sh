#!/usr/bin/env bash
# The window beside API clients, under Xvfb with the genuine SmolLM2 file: the window serves
# its engine on loopback, three clients stream long replies from it, and a message typed in
# the window meanwhile is answered while they still stream. Printed: the window's reply's
# time to its first token (from the saved conversation) and how far the clients had come.
# Then a conversation of about 4,000 tokens gets one more message, and screenshots show the
# bar that tells how far its reading has come.
# Usage: benches/window_under_load.sh SMOLCHAT_BINARY [OUTPUT_FOLDER]
set -euo pipefail
bin="$(realpath "$1")"
out="$(realpath -m "${2:-target/window-under-load}")"
cd "$(dirname "$0")/.."
model="$PWD/tests/models/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$model" ] || { echo "missing $model: run .ci/setup" >&2; exit 1; }
mkdir -p "$out"
port=18123
root="$(mktemp -d)"
trap 'kill "${clients_pid:-}" "${app_pid:-}" "${xvfb_pid:-}" 2>/dev/null || true; rm -rf "$root"' EXIT
export SMOLCHAT_DATA_DIR="$root/data" SMOLCHAT_CONFIG_DIR="$root/config"
mkdir -p "$SMOLCHAT_CONFIG_DIR" "$SMOLCHAT_DATA_DIR/conversations"
cat >"$SMOLCHAT_CONFIG_DIR/settings.json" <<JSON
{"model_folder": "$model", "max_new_tokens": 48, "theme": "dark",
 "server": {"enabled": true, "host": "127.0.0.1", "port": $port}}
JSON
source .ci/xvfb-window.sh
shot() { import -window root "$out/$1.png"; echo "saved $out/$1.png"; }

# The last saved conversation's last reply: its first token's time, once it has finished.
first_token_seconds() {
  python3 - "$SMOLCHAT_DATA_DIR/conversations" <<'PY'
import json, pathlib, sys
files = sorted(pathlib.Path(sys.argv[1]).glob("*.json"), key=lambda p: p.stat().st_mtime)
lines = files[-1].read_text().splitlines() if files else []
generation = (json.loads(lines[0])["messages"][-1].get("generation") or {}) if lines else {}
if len(lines) > 1 or not generation.get("finish_reason"):
    sys.exit(1)
print(f'{generation["stats"]["time_to_first_token_ms"] / 1000:.2f}')
PY
}

start_x 1280x800
start_app 1280 800
wait_loaded
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  sleep 0.2
done

# Three clients streaming 400 tokens each; each writes its token count to a file as it goes.
python3 - "$port" "$root" <<'PY' &
import sys, threading
import http.client, json
port, root = int(sys.argv[1]), sys.argv[2]
def client(i):
    body = json.dumps({"stream": True, "max_tokens": 400, "temperature": 0,
                       "messages": [{"role": "user", "content": f"Tell me a long story, number {i}."}]})
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    count = 0
    for line in response:
        if line.startswith(b"data: {"):
            count += 1
            with open(f"{root}/client-{i}", "w") as f:
                f.write(str(count))
threads = [threading.Thread(target=client, args=(i,)) for i in range(3)]
for t in threads: t.start()
for t in threads: t.join()
PY
clients_pid=$!
for _ in $(seq 100); do
  [ -s "$root/client-0" ] && [ -s "$root/client-1" ] && [ -s "$root/client-2" ] && break
  sleep 0.1
done
clients_at() { echo "$(cat "$root"/client-0) $(cat "$root"/client-1) $(cat "$root"/client-2)"; }
echo "API clients streaming, chunks so far: $(clients_at)"
key() { xdotool key --clearmodifiers "$@"; sleep 0.3; }
key ctrl+l
xdotool type --delay 10 "What is the capital of France?"
key Return
sleep 1
shot window-beside-three-clients
for _ in $(seq 120); do
  ttft="$(first_token_seconds)" && break
  sleep 0.5
done
echo "window reply finished, its first token after ${ttft:?no reply} s; API clients' chunks then: $(clients_at)"
kill "$clients_pid" 2>/dev/null || true
kill "$app_pid"
wait "$app_pid" 2>/dev/null || true

# A conversation of about 4,000 tokens (37 questions and answers), alone in its data folder,
# then one more message.
export SMOLCHAT_DATA_DIR="$root/long"
mkdir -p "$SMOLCHAT_DATA_DIR/conversations"
python3 - "$SMOLCHAT_DATA_DIR/conversations/0-long.json" <<'PY'
import json, sys
sentence = "The river carried the old boat past the mill, the bridge and the quiet town. "
messages = []
for turn in range(37):
    messages.append({"role": "user", "content": f"Tell me part {turn} of the river story."})
    messages.append({"role": "assistant", "content": sentence * 5})
with open(sys.argv[1], "w") as f:
    f.write(json.dumps({"format_version": 2, "id": "0-long", "title": "A long chat",
                        "created_unix_ms": 1, "messages": messages}) + "\n")
PY
start_app 1280 800
wait_loaded
key ctrl+l
xdotool type --delay 10 "And then?"
key Return
for step in 1 2 3; do
  sleep 0.7
  shot long-chat-reading-$step
done
