#!/usr/bin/env bash
# Runs the real smolchat window under Xvfb with the genuine SmolLM2-135M-Instruct GGUF file
# (fetched by .ci/setup), asks it a question the way a user would (xdotool), and saves what the
# screen shows, a real answer, to target/screenshot.png.
# Usage: .ci/screenshot.sh [path/to/smolchat] [out.png]
set -euo pipefail
cd "$(dirname "$0")/.."

bin="${1:-target/debug/smolchat}"
out="${2:-target/screenshot.png}"
[ -x "$bin" ] || cargo build --locked --bin smolchat
root="$(mktemp -d)"
trap 'kill "${app_pid:-}" "${xvfb_pid:-}" 2>/dev/null || true; rm -rf "$root"' EXIT

# Settings pointing at the genuine model; data and config kept out of the real home.
export SMOLCHAT_DATA_DIR="$root/data" SMOLCHAT_CONFIG_DIR="$root/config"
mkdir -p "$SMOLCHAT_CONFIG_DIR"
cat >"$SMOLCHAT_CONFIG_DIR/settings.json" <<JSON
{"model_folder": "$PWD/tests/models/SmolLM2-135M-Instruct.Q4_1.gguf", "max_new_tokens": 60, "show_token_probabilities": false}
JSON

# -displayfd: Xvfb picks a free display and writes its number only once it accepts clients, so
# there is no race with a slow start and no clash with a display already in use.
Xvfb -displayfd 3 -screen 0 1280x800x24 -nolisten tcp 3>"$root/display" 2>"$root/xvfb.log" &
xvfb_pid=$!
# A cold machine can be slow to start it, so wait up to a minute. Where no X server can run at
# all there is nothing to screenshot: say so with Xvfb's own words, and leave the verdict to the
# tests (the GUI tests drive the same app headless).
for _ in $(seq 600); do
  [ -s "$root/display" ] && break
  kill -0 "$xvfb_pid" 2>/dev/null || break
  sleep 0.1
done
if [ ! -s "$root/display" ]; then
  echo "warning: Xvfb did not start, so no screenshot was taken. Its log:" >&2
  cat "$root/xvfb.log" >&2
  exit 0
fi
export DISPLAY=":$(head -n1 "$root/display")" LIBGL_ALWAYS_SOFTWARE=1 WINIT_UNIX_BACKEND=x11
unset WAYLAND_DISPLAY
xdpyinfo >/dev/null || { echo "Xvfb on $DISPLAY does not answer:" >&2; cat "$root/xvfb.log" >&2; exit 1; }

"$bin" &
app_pid=$!
window=""
for _ in $(seq 100); do
  window="$(xdotool search --name '^smolchat$' 2>/dev/null | head -n1 || true)"
  [ -n "$window" ] && break
  sleep 0.2
done
[ -n "$window" ] || { echo "the smolchat window did not appear on $DISPLAY" >&2; exit 1; }
# Loading dequantizes the file, which an unoptimised debug build takes its time over.
sleep 15
xdotool windowactivate --sync "$window" 2>/dev/null || xdotool windowfocus "$window"
xdotool type --delay 30 "What is the capital of France?"
xdotool key Return
# The debug build decodes this model at a few tokens a second.
sleep 30
kill -0 "$app_pid" || { echo "smolchat exited" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
import -window root "$out"
echo "saved $out"
