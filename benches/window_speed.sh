#!/usr/bin/env bash
# The window's decode speed next to `smolchat generate` on the same prompt and settings, runs
# alternating so that a shared machine's drift hits both alike. The window runs under Xvfb
# (1400x900, software rendering), a message is typed with xdotool, and its reply's own figures
# are read from the saved conversation.
# Usage: benches/window_speed.sh SMOLCHAT_BINARY MODEL [RUNS]
set -euo pipefail
bin="$1"
model="$(realpath "$2")"
runs="${3:-3}"
prompt="Write a long story about a dragon who learns to bake bread."

window_once() {
  local root display xvfb app window file
  root="$(mktemp -d)"
  export SMOLCHAT_DATA_DIR="$root/data" SMOLCHAT_CONFIG_DIR="$root/config"
  mkdir -p "$SMOLCHAT_CONFIG_DIR"
  cat >"$SMOLCHAT_CONFIG_DIR/settings.json" <<JSON
{"model_folder": "$model", "max_new_tokens": 512, "sampling": {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "seed": 1}}
JSON
  Xvfb -displayfd 3 -screen 0 1400x900x24 -nolisten tcp 3>"$root/display" 2>/dev/null &
  xvfb=$!
  for _ in $(seq 100); do [ -s "$root/display" ] && break; sleep 0.1; done
  display=":$(head -n1 "$root/display")"
  DISPLAY="$display" LIBGL_ALWAYS_SOFTWARE=1 WINIT_UNIX_BACKEND=x11 "$bin" &
  app=$!
  for _ in $(seq 100); do
    window="$(DISPLAY="$display" xdotool search --name '^smolchat$' 2>/dev/null | head -n1 || true)"
    [ -n "$window" ] && break
    sleep 0.2
  done
  DISPLAY="$display" xdotool windowsize "$window" 1400 900
  sleep 4
  DISPLAY="$display" xdotool windowactivate --sync "$window" 2>/dev/null || DISPLAY="$display" xdotool windowfocus "$window"
  DISPLAY="$display" xdotool type --delay 5 "$prompt"
  DISPLAY="$display" xdotool key Return
  for _ in $(seq 600); do
    file="$(ls "$root"/data/conversations/*.json 2>/dev/null | head -n1 || true)"
    if [ -n "$file" ] && python3 -c "
import json, sys
from pathlib import Path
lines = Path('$file').read_text().splitlines()
sys.exit(0 if json.loads(lines[0])['messages'][-1].get('generation', {}).get('finish_reason') else 1)" 2>/dev/null
    then break; fi
    sleep 0.5
  done
  python3 -c "
import json
from pathlib import Path
print(json.loads(Path('$file').read_text().splitlines()[0])['messages'][-1]['generation']['stats']['decode_tokens_per_second'])"
  kill "$app" "$xvfb"
  wait "$app" "$xvfb" 2>/dev/null || true
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
