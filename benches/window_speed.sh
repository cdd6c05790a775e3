#!/usr/bin/env bash
# The window's decode speed next to `smolchat generate` on the same prompt and settings, runs
# alternating so that a shared machine's drift hits both alike. The window runs under Xvfb
# (1400x900, software rendering), a message is typed with xdotool, and its reply's own figures
# are read from the saved conversation. The conversation already holds ten earlier turns
# (EARLIER_TURNS=0 for none); `generate` gets the same turns through the model's chat template,
# rendered here, as a raw prompt, so that both decode after the same context.
# Usage: benches/window_speed.sh SMOLCHAT_BINARY MODEL [RUNS]
set -euo pipefail
bin="$(realpath "$1")"
model="$(realpath "$2")"
runs="${3:-3}"
prompt="Write a long story about a dragon who learns to bake bread."
turns="${EARLIER_TURNS:-10}"
cd "$(dirname "$0")/.."
# The earlier turns, each a short question and answer: `python3 - earlier N` prints them as a
# stored conversation, `python3 - prompt N PROMPT` as SmolLM2's chat template renders them
# with PROMPT after them.
turns_py='
import json, sys
what, n = sys.argv[1], int(sys.argv[2])
topics = ["rivers", "volcanoes", "bees", "tides", "comets", "deserts", "coral", "glaciers",
          "owls", "lightning", "forests", "caves"]
messages = []
for topic in topics[:n]:
    messages.append({"role": "user", "content": f"Tell me one fact about {topic}."})
    messages.append({"role": "assistant",
                     "content": f"Here is one fact about {topic}: scientists still study them "
                                f"closely, because {topic} change the places around them."})
if what == "earlier":
    print(json.dumps({"format_version": 2, "id": "0-bench", "title": "Earlier turns",
                      "created_unix_ms": 1, "messages": messages}))
else:
    messages.append({"role": "user", "content": sys.argv[3]})
    text = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    for m in messages:
        text += "<|im_start|>" + m["role"] + "\n" + m["content"] + "<|im_end|>\n"
    print(text + "<|im_start|>assistant\n", end="")
'
source .ci/xvfb-window.sh

# The conversation's last reply's decode speed, once it has finished; fails otherwise.
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
  mkdir -p "$SMOLCHAT_CONFIG_DIR" "$SMOLCHAT_DATA_DIR/conversations"
  if [ "$turns" -gt 0 ]; then
    python3 -c "$turns_py" earlier "$turns" >"$SMOLCHAT_DATA_DIR/conversations/0-bench.json"
  fi
  cat >"$SMOLCHAT_CONFIG_DIR/settings.json" <<JSON
{"model_folder": "$model", "max_new_tokens": 512, "sampling": {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "seed": 1}}
JSON
  start_x 1400x900
  start_app 1400 900
  wait_loaded
  xdotool type --delay 5 "$prompt"
  xdotool key Return
  # grep, not Python, while the reply streams: a Python start every half second took 8% of
  # the machine's CPU from the window being measured.
  for _ in $(seq 600); do
    grep -qs '"finish_reason":"' "$SMOLCHAT_DATA_DIR"/conversations/*.json && break
    sleep 0.5
  done
  finished_decode_speed
  kill "$app_pid" "$xvfb_pid"
  wait "$app_pid" "$xvfb_pid" 2>/dev/null || true
  rm -rf "$root"
}

cli_once() {
  if [ "$turns" -gt 0 ]; then
    # The trailing "x" keeps the newline that ends the template, which `$(...)` would drop.
    raw="$(python3 -c "$turns_py" prompt "$turns" "$prompt"; echo x)"
    set -- --raw --prompt "${raw%x}"
  else
    set -- --prompt "$prompt"
  fi
  "$bin" generate --model "$model" "$@" --temperature 0 --max-tokens 512 --json |
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
