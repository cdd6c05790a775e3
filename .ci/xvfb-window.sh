# Sourced by .ci/walkthrough.sh and the window's benches: the smolchat window on a virtual
# X display. The caller sets `root` (a scratch folder) and `bin` (the smolchat binary).

# Starts Xvfb at WIDTHxHEIGHT (stopping the one before) and points DISPLAY at it.
# -displayfd: Xvfb picks a free display and writes its number only once it accepts clients,
# so there is no race with a slow start and no clash with a display already in use.
start_x() {
  # Waited for, so that the old server has let go of its display before the next starts.
  if [ -n "${xvfb_pid:-}" ]; then
    kill "$xvfb_pid" 2>/dev/null || true
    wait "$xvfb_pid" 2>/dev/null || true
  fi
  rm -f "$root/display"
  Xvfb -displayfd 3 -screen 0 "$1x24" -nolisten tcp 3>"$root/display" 2>"$root/xvfb.log" &
  xvfb_pid=$!
  for _ in $(seq 600); do
    [ -s "$root/display" ] && break
    kill -0 "$xvfb_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ ! -s "$root/display" ]; then
    echo "Xvfb did not start:" >&2
    cat "$root/xvfb.log" >&2
    exit 1
  fi
  export DISPLAY=":$(head -n1 "$root/display")" LIBGL_ALWAYS_SOFTWARE=1 WINIT_UNIX_BACKEND=x11
  unset WAYLAND_DISPLAY
}

# Starts the window, sizes it to WIDTH HEIGHT at the top left and gives it the keyboard;
# sets app_pid and window.
# Once in a few dozen starts under Xvfb, the app could not connect right after a new X
# server came up ("Failed to open connection to X server"), a cause not reproduced in 56
# tries by hand. An app that exits that way gets one new X server and one more try; any
# other exit, or a second, fails.
start_app() {
  for attempt in 1 2; do
    "$bin" 2> >(tee "$root/app.err" >&2) &
    app_pid=$!
    window=""
    for _ in $(seq 150); do
      window="$(xdotool search --name '^smolchat$' 2>/dev/null | head -n1 || true)"
      [ -n "$window" ] && break
      kill -0 "$app_pid" 2>/dev/null || break
      sleep 0.2
    done
    [ -n "$window" ] && break
    if [ "$attempt" = 1 ] && ! kill -0 "$app_pid" 2>/dev/null &&
      grep -q "connection to X server" "$root/app.err"; then
      echo "start_app: trying again on a new X server" >&2
      start_x "$1x$2"
      continue
    fi
    echo "the smolchat window did not appear" >&2
    exit 1
  done
  xdotool windowmove "$window" 0 0
  xdotool windowsize "$window" "$1" "$2"
  sleep 2
  xdotool windowactivate --sync "$window" 2>/dev/null || xdotool windowfocus "$window"
}

# Returns once the process holds the genuine model's weights (over 120 MB: the Q4_1 file's
# integers are 110 MB) and its memory has held still for two seconds: loading is done.
wait_loaded() {
  still=0
  previous=0
  for _ in $(seq 300); do
    rss_kb="$(awk '/^VmRSS/ {print $2}' "/proc/$app_pid/status")"
    if [ "$rss_kb" -gt 120000 ] && [ $((rss_kb - previous)) -lt 1024 ] && [ $((previous - rss_kb)) -lt 1024 ]; then
      still=$((still + 1))
      [ "$still" -ge 4 ] && return
    else
      still=0
    fi
    previous="$rss_kb"
    sleep 0.5
  done
  echo "the model did not load in 150 s" >&2
  exit 1
}

# Waits until the newest conversation's last reply has finished (or, with "stopped", until
# it has text to stop), read from the files in $SMOLCHAT_DATA_DIR. Where the caller sets `out`
# (a folder), a reply that never comes leaves a screenshot there.
wait_reply() {
  for _ in $(seq 600); do
    if python3 - "$SMOLCHAT_DATA_DIR/conversations" "${1:-finished}" <<'PY'
import json, pathlib, sys
files = sorted(pathlib.Path(sys.argv[1]).glob("*.json"), key=lambda p: p.stat().st_mtime)
if not files:
    sys.exit(1)
# A snapshot line, then a line for each second of a reply streaming.
lines = files[-1].read_text().splitlines()
last = json.loads(lines[0])["messages"][-1]
generation = last.get("generation") or {}
if sys.argv[2] == "stopped":
    sys.exit(0 if len(lines) > 1 or (last["role"] == "assistant" and last["content"]) else 1)
if len(lines) > 1:
    sys.exit(1)
sys.exit(0 if generation.get("finish_reason") else 1)
PY
    then return; fi
    sleep 0.5
  done
  if [ -n "${out:-}" ]; then
    import -window root "$out/no-reply.png"
    echo "no reply within 5 minutes; the window then: $out/no-reply.png" >&2
  else
    echo "no reply within 5 minutes" >&2
  fi
  exit 1
}
