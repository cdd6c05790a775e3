#!/usr/bin/env bash
# Runs the real smolchat window under Xvfb with the tiny test model, sends a message the way a
# user would (xdotool), and saves what the screen shows to target/screenshot.png.
# Usage: .ci/screenshot.sh [path/to/smolchat] [out.png]
set -euo pipefail
cd "$(dirname "$0")/.."

bin="${1:-target/debug/smolchat}"
out="${2:-target/screenshot.png}"
[ -x "$bin" ] || cargo build --locked --bin smolchat
root="$(mktemp -d)"
trap 'kill "${app_pid:-}" "${xvfb_pid:-}" 2>/dev/null || true; rm -rf "$root"' EXIT

# Settings pointing at the tiny checkpoint; data and config kept out of the real home.
export SMOLCHAT_DATA_DIR="$root/data" SMOLCHAT_CONFIG_DIR="$root/config"
mkdir -p "$SMOLCHAT_CONFIG_DIR"
cat >"$SMOLCHAT_CONFIG_DIR/settings.json" <<JSON
{"model_folder": "$PWD/tests/fixtures/tiny-smollm", "max_new_tokens": 60, "show_token_probabilities": false}
JSON

display=":${SCREENSHOT_DISPLAY:-77}"
Xvfb "$display" -screen 0 1280x800x24 -nolisten tcp &
xvfb_pid=$!
export DISPLAY="$display" LIBGL_ALWAYS_SOFTWARE=1 WINIT_UNIX_BACKEND=x11
unset WAYLAND_DISPLAY
for _ in $(seq 50); do xdpyinfo >/dev/null 2>&1 && break; sleep 0.1; done

"$bin" &
app_pid=$!
window=""
for _ in $(seq 100); do
  window="$(xdotool search --name '^smolchat$' 2>/dev/null | head -n1 || true)"
  [ -n "$window" ] && break
  sleep 0.2
done
[ -n "$window" ] || { echo "the smolchat window did not appear" >&2; exit 1; }
sleep 2
xdotool windowactivate --sync "$window" 2>/dev/null || xdotool windowfocus "$window"
xdotool type --delay 30 "Hello! Please write a **short** poem."
xdotool key Return
sleep 5
kill -0 "$app_pid" || { echo "smolchat exited" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
import -window root "$out"
echo "saved $out"
