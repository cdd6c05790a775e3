#!/usr/bin/env bash
# Whether the window gives back a long chat's memory once the user leaves it: the real window
# under Xvfb with the genuine model, a chat of about 4,000 tokens answered once (its keys and
# values fill the KV cache), then a new chat answered. It prints the process's resident size
# after loading, after the long chat's reply and after the new chat's.
# Usage: benches/closed_chat_memory.sh SMOLCHAT_BINARY MODEL
set -euo pipefail
bin="$(realpath "$1")"
model="$(realpath "$2")"
cd "$(dirname "$0")/.."
source .ci/xvfb-window.sh
root="$(mktemp -d)"
trap 'kill "${app_pid:-}" "${xvfb_pid:-}" 2>/dev/null || true; rm -rf "$root"' EXIT
export SMOLCHAT_DATA_DIR="$root/data" SMOLCHAT_CONFIG_DIR="$root/config"
mkdir -p "$SMOLCHAT_CONFIG_DIR" "$SMOLCHAT_DATA_DIR/conversations"
conversations="$SMOLCHAT_DATA_DIR/conversations"

python3 - "$conversations/0-long.json" <<'PY'
import json, sys
messages = []
for i in range(60):
    messages.append({"role": "user", "content": f"Tell me fact number {i} about the sea."})
    messages.append({"role": "assistant", "content":
        f"Fact {i}: the sea covers about seventy percent of the planet, holds most of its water "
        "and most of its life, and its currents carry heat from the equator towards the poles."})
print(json.dumps({"format_version": 3, "id": "0-long", "title": "A long chat",
                  "created_unix_ms": 1, "messages": messages}), file=open(sys.argv[1], "w"))
PY
printf '{"model_folder": "%s", "max_new_tokens": 16}\n' "$model" >"$SMOLCHAT_CONFIG_DIR/settings.json"

rss_mib() { awk '/^VmRSS/ {printf "%.0f", $2 / 1024}' "/proc/$app_pid/status"; }

key() { xdotool key --clearmodifiers "$@"; sleep 0.5; }
send() { key ctrl+l; xdotool type --delay 20 "$1"; key Return; sleep 2; wait_reply; sleep 2; }

start_x 1000x700
start_app 1000 700
wait_loaded
loaded="$(rss_mib)"
key ctrl+1
send "Which fact was the first?"
long="$(rss_mib)"
key ctrl+n
send "Hello."
after="$(rss_mib)"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "resident MiB: $loaded loaded, $long after the long chat's reply, $after after a new chat's reply"
