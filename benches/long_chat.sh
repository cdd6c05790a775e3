#!/usr/bin/env bash
# The window's cost on a long chat: a 500-message conversation (Markdown replies with lists
# and code) opened in the real window under Xvfb (1400x900, software rendering), with the
# genuine model loaded. It measures the window's CPU time, from /proc, per mouse-wheel step
# while scrolling through the chat and per key while typing into the message box, less what
# the idle window takes in the same time.
# Usage: benches/long_chat.sh SMOLCHAT_BINARY MODEL [RUNS]
set -euo pipefail
bin="$(realpath "$1")"
model="$(realpath "$2")"
runs="${3:-3}"
messages=500
steps=60
typed="the quick brown fox jumps over the lazy dog and keeps on running far away"
cd "$(dirname "$0")/.."
source .ci/xvfb-window.sh

chat_py='
import json, sys
n = int(sys.argv[1])
code = "```python\ndef fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n```"
messages = []
for i in range(n // 2):
    messages.append({"role": "user", "content": f"Question {i}: how do I compute Fibonacci number {i} quickly?"})
    messages.append({"role": "assistant", "content":
        f"Here is one way, for **{i}**:\n\n1. Start from 0 and 1.\n2. Add the last two numbers, "
        f"{i} times.\n\n{code}\n\nIt runs in linear time and constant memory; for very large "
        "numbers, the fast-doubling method takes logarithmic time instead."})
print(json.dumps({"format_version": 3, "id": "0-long", "title": "A long chat",
                  "created_unix_ms": 1, "messages": messages}))
'

# CPU time of the window so far, in milliseconds (utime + stime, in clock ticks).
cpu_ms() {
  awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) * 1000 / hz}' "/proc/$app_pid/stat"
}

# CPU milliseconds the window takes while `$@` runs, less what it took idle for as long.
cost_of() {
  local before after start elapsed idle_before idle_after
  before="$(cpu_ms)"
  start="$(date +%s.%N)"
  "$@"
  after="$(cpu_ms)"
  elapsed="$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {print b - a}')"
  sleep 1
  idle_before="$(cpu_ms)"
  sleep "$elapsed"
  idle_after="$(cpu_ms)"
  awk "BEGIN {print ($after - $before) - ($idle_after - $idle_before)}"
}

scroll() {
  xdotool mousemove 700 450
  for _ in $(seq "$steps"); do
    xdotool click 4
    sleep 0.1
  done
}

type_text() {
  xdotool type --delay 100 "$typed"
}

once() {
  root="$(mktemp -d)"
  export SMOLCHAT_DATA_DIR="$root/data" SMOLCHAT_CONFIG_DIR="$root/config"
  mkdir -p "$SMOLCHAT_CONFIG_DIR" "$SMOLCHAT_DATA_DIR/conversations"
  python3 -c "$chat_py" "$messages" >"$SMOLCHAT_DATA_DIR/conversations/0-long.json"
  cat >"$SMOLCHAT_CONFIG_DIR/settings.json" <<JSON
{"model_folder": "$model"}
JSON
  start_x 1400x900
  start_app 1400 900
  wait_loaded
  sleep 2
  scroll_ms="$(cost_of scroll)"
  type_ms="$(cost_of type_text)"
  awk -v s="$scroll_ms" -v n="$steps" -v t="$type_ms" -v k="${#typed}" \
    'BEGIN {printf "scroll: %.1f CPU ms per wheel step; typing: %.1f CPU ms per key\n", s / n, t / k}'
  kill "$app_pid" "$xvfb_pid"
  wait "$app_pid" "$xvfb_pid" 2>/dev/null || true
  rm -rf "$root"
}

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for _ in $(seq "$runs"); do
  once
done
