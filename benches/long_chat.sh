#!/usr/bin/env bash
# The window's cost on a long chat: a 500-message conversation (Markdown replies with lists
# and code) opened in the real window under Xvfb (1400x900, software rendering), with the
# genuine model loaded. It measures the window thread's CPU time, from /proc, per mouse-wheel step
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

# CPU milliseconds so far (utime + stime, in clock ticks) of the window's own thread, its
# layout and drawing, and of the whole process: under Xvfb the software renderer's threads
# (llvmpipe) take most of it, whatever is drawn.
cpu_ms() {
  awk -v hz="$(getconf CLK_TCK)" '{printf "%s ", ($14 + $15) * 1000 / hz}' \
    "/proc/$app_pid/task/$app_pid/stat" "/proc/$app_pid/stat"
}

# CPU milliseconds (the thread's, the process's) the window takes while `$@` runs, less what
# it takes idle for as long.
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
  echo "$before $after $idle_before $idle_after" |
    awk '{print ($3 - $1) - ($7 - $5), ($4 - $2) - ($8 - $6)}'
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
  echo "$scroll_ms $type_ms" | awk -v n="$steps" -v k="${#typed}" '{
    printf "CPU ms per wheel step: %.1f (window thread), %.1f (process)\n", $1 / n, $2 / n
    printf "CPU ms per key typed: %.1f (window thread), %.1f (process)\n", $3 / k, $4 / k
  }'
  kill "$app_pid" "$xvfb_pid"
  wait "$app_pid" "$xvfb_pid" 2>/dev/null || true
  rm -rf "$root"
}

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for _ in $(seq "$runs"); do
  once
done
