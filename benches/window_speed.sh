#!/usr/bin/env bash
# The window's decode speed next to `smolchat generate` on the same prompt and settings, runs
# alternating so that a shared machine's drift hits both alike. The window runs under Xvfb
# (1400x900, software rendering), a message is typed with xdotool, and its reply's own figures
# are read from the saved conversation.
# Usage: benches/window_speed.sh SMOLCHAT_BINARY MODEL [RUNS]
set -euo pipefail
bin="$(realpath "$1")"
model="$(realpath "$2")"
runs="${3:-3}"
prompt="Write a long story about a dragon who learns to bake bread."
cd "$(dirname "$0")/.."
source .ci/xvfb-window.sh

# The newest conversation's last reply's decode speed once it has finished; fails otherwise.
finished_decode_speed() {
  python3 - "$SMOLCHAT_DATA_DIR/conversations" <<'PY'
import json, pathlib, sys
files = list(pathlib.Path(sys.argv[1]).glob("*.json"))
if not files:
    sys.exit(1)
snapshot = json.loads(files[0].read_text().splitlines()[0])
generation = snapshot["messages"][-1].get("generation") or {}
if not generation.get("finish_reason"):
    sys.exit(1)
print(generation["stats"]["decode_tokens_per_second"])
PY
}

window_once() {
  root="$(mktemp -d)"
  export SMOLCHAT_DATA_DIR="$root/data" SMOLCHAT_CONFIG_DIR="$root/config"
  mkdir -p "$SMOLCHAT_CONFIG_DIR"
  cat >"$SMOLCHAT_CONFIG_DIR/settings.json" <<JSON
{"model_folder": "$model", "max_new_tokens": 512, "sampling": {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "seed": 1}}
JSON
  start_x 1400x900
  start_app 1400 900
  wait_loaded
  xdotool type --delay 5 "$prompt"
  xdotool key Return
  for _ in $(seq 600); do
    finished_decode_speed 2>/dev/null && break
    sleep 0.5
  done
  kill "$app_pid" "$xvfb_pid"
  wait "$app_pid" "$xvfb_pid" 2>/dev/null || true
  rm -rf "$root"
}

cli_once() {
  "$bin" generate --model "$model" --prompt "$prompt" --temperature 0 --max-tokens 512 --json |
    python3 -c "import json, sys; print(json.load(sys.stdin)['decode_tok_s'])"
}

window=() cli=()
for _ in $(seq "$runs"); do
  window+=("$(window_once)")
  cli+=("$(cli_once)")
done
python3 - "${window[*]}" "${cli[*]}" <<'PY'
import statistics, sys
window = [float(x) for x in sys.argv[1].split()]
cli = [float(x) for x in sys.argv[2].split()]
print("window decode tok/s:  ", ", ".join(f"{x:.1f}" for x in window), f" median {statistics.median(window):.1f}")
print("generate decode tok/s:", ", ".join(f"{x:.1f}" for x in cli), f" median {statistics.median(cli):.1f}")
print(f"window / generate: {statistics.median(window) / statistics.median(cli):.2f}")
PY
