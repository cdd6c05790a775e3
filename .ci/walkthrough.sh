#!/usr/bin/env bash
# A new user's first minutes with the real window, scripted: Xvfb, xdotool and the genuine
# SmolLM2-135M-Instruct GGUF file (fetched by .ci/setup). It starts with no settings (the
# first-run screen), types a path that does not exist, loads the model by its path, has three
# chats (one message with Shift+Enter, one reply stopped then continued, one regenerated and
# switched back to its first reply), finds a chat by a word with Ctrl+K, forks the third
# chat, deletes the second (to the trash), files the first in a folder named from its menu
# and drags the fork into it, saves a system prompt as a preset and picks it in a new chat,
# holds one chat from the keyboard alone (send, Up to edit, Ctrl+Enter, F2, F1), searches
# the hub (a stand-in on loopback) from the model library and starts a download from it,
# opens a model in LM Studio's folder from it with the keyboard, quits with Ctrl+Q, and
# checks the saved conversations, the presets, the trash and the unfinished download.
# It then reopens the window at 800x600 and 1920x1080, dark and light, each time to take
# screenshots of a chat, of a stored reply with code and a Thinking section (folded, then
# opened), of a search and of the trash;
# the last time it restores the deleted chat, and checks that it is back.
# Usage: .ci/walkthrough.sh [path/to/smolchat] [output folder]
set -euo pipefail
cd "$(dirname "$0")/.."

bin="${1:-target/debug/smolchat}"
out="${2:-target/walkthrough}"
model="$PWD/tests/models/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -x "$bin" ] || cargo build --locked --bin smolchat
[ -f "$model" ] || { echo "missing $model: run .ci/setup" >&2; exit 1; }
root="$(mktemp -d)"
trap 'kill "${app_pid:-}" "${xvfb_pid:-}" "${hub_pid:-}" 2>/dev/null || true; rm -rf "$root"' EXIT
mkdir -p "$out"
# An empty Hugging Face cache and home folder too: the first-run screen lists the models it
# finds on this machine (other apps' stores included), which would move the fields clicked
# below.
export SMOLCHAT_DATA_DIR="$root/data" SMOLCHAT_CONFIG_DIR="$root/config" HF_HUB_CACHE="$root/hub"
export HOME="$root/home" OLLAMA_MODELS="$root/home/ollama"
# The hub's model listing, stood in for on loopback for the library's search box.
python3 .ci/fake_hub_listing.py "$root/hub-port" &
hub_pid=$!
for _ in $(seq 50); do [ -s "$root/hub-port" ] && break; sleep 0.1; done
export HF_ENDPOINT="http://127.0.0.1:$(cat "$root/hub-port")"
unset LLAMA_CACHE XDG_DATA_HOME XDG_CACHE_HOME
mkdir -p "$SMOLCHAT_CONFIG_DIR" "$HOME"
settings="$SMOLCHAT_CONFIG_DIR/settings.json"

source .ci/xvfb-window.sh

key() { xdotool key --clearmodifiers "$@"; sleep 0.5; }
# A key that starts a reply: the conversation file shows it within a second or two.
start() { key "$@"; sleep 2; }
say() { xdotool type --delay 20 "$1"; sleep 0.3; }
shot() { sleep 1; import -window root "$out/$1.png"; echo "saved $out/$1.png"; }

# First run, 800x600, dark; short replies so that the debug build keeps up.
printf '{"theme": "dark", "max_new_tokens": 24}\n' >"$settings"
start_x 800x600
start_app 800 600
shot first-run-800x600-dark
# The model path field of the first-run screen (see the screenshot above).
xdotool mousemove 495 328 click 1
say "/no/such/model.gguf"
key Return
shot bad-path-800x600-dark
# The same field, moved down by the error above it.
xdotool mousemove 495 376 click 1
key ctrl+a
say "$model"
key Return
wait_loaded

# Chat 1: a question, then a message of two lines.
key ctrl+l
say "What is the capital of France?"
start Return
wait_reply
key ctrl+l
say "Say two words."
key shift+Return
say "Then stop."
start Return
wait_reply
# Chat 2: a long story, stopped, then continued.
key ctrl+n
say "Tell me a long story about a dragon."
start Return
wait_reply stopped
key Escape
wait_reply
start ctrl+e
wait_reply
# Chat 3: regenerated, then back to the first reply.
key ctrl+n
say "Name a fruit."
start Return
wait_reply
start ctrl+r
wait_reply
key alt+Left
shot walkthrough-800x600-dark
# Ctrl+K: the chats that hold a word, with the words around it; Esc ends the search.
key ctrl+k
say "capital"
sleep 1
shot search-800x600-dark
key Escape
# Fork the third chat at its question (the reply's length varies, moving its buttons): a new
# chat with the conversation up to there, on top of the list.
xdotool mousemove 780 117 click 1
sleep 1
# The second chat, now third in the list, goes to the trash by its x button.
xdotool mousemove 247 179 click 1
sleep 1
# The first chat, moved down by "Undo delete" and "Trash (1)", into a folder named from its
# menu: right-click, Move to folder, the field, a name, Enter.
xdotool mousemove 93 239 click 3
sleep 1
xdotool mousemove 150 290
sleep 1
for x in 180 210 240 270 300 316; do xdotool mousemove "$x" 295; sleep 0.1; done
xdotool click 1
say "Geography"
key Return
# The folder is on top now, its chat under it; the fork, below, is dragged onto it.
# Slowly: egui takes the widget a press lands on from where the pointer is at the end of the
# frame that reads the press, so on a loaded machine a frame that read the press and the first
# steps together picked the row above, and a release read with the last steps ended no drag.
sleep 1
xdotool mousemove 80 239
sleep 0.5
xdotool mousedown 1
sleep 1
for y in 235 225 215 205 195 185 180; do xdotool mousemove 80 "$y"; sleep 0.3; done
sleep 1
xdotool mouseup 1
xdotool mousemove 600 400
shot folders-800x600-dark
# A system-prompt preset: the fork's system prompt (the folded line at the top of the chat),
# written and saved under a name; then a new chat picks it from the Presets list (its prompt
# section stays open) and is answered under it.
xdotool mousemove 350 48 click 1
sleep 1
xdotool mousemove 500 110 click 1
say "Answer in one short sentence."
xdotool mousemove 345 148 click 1
say "Brief"
key Return
key ctrl+n
xdotool mousemove 390 148 click 1
sleep 1
xdotool mousemove 375 181 click 1
sleep 1
shot presets-800x600-dark
key ctrl+l
say "Name a planet."
start Return
wait_reply
# A chat held from the keyboard alone, no mouse event from here to the library: a message,
# Up to edit it, Ctrl+Enter to resend, F2 to rename the chat, F1 for the shortcuts sheet.
key ctrl+n
say "Name a colour."
start Return
wait_reply
key Up
key ctrl+a
say "Name a bird."
start ctrl+Return
wait_reply
key F2
key ctrl+a
say "Birds"
key Return
key F1
shot shortcuts-800x600-dark
key Escape
# The model library from the keyboard: a model put in LM Studio's folder now shows when the
# library opens (it looks again), its Open button has the keyboard, and Enter opens it.
lm_studio="$HOME/.lmstudio/models/HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
mkdir -p "$lm_studio"
ln -s "$model" "$lm_studio/smollm2-135m-instruct-q4_1.gguf"
key ctrl+m
sleep 2
shot library-800x600-dark
# The search box (before the Search button, before the first Open), then a repository's files.
key shift+Tab
key shift+Tab
say "qwen3 1.7b"
key Return
sleep 2
xdotool mousemove 664 199 click 1
sleep 2
shot hub-search-800x600-dark
# Its Q4_K_M file goes to the downloads (the stand-in sends 1 MB/s), with speed and time left.
xdotool mousemove 444 229 click 1
sleep 3
shot downloads-800x600-dark
# Closed and opened again, the library gives its first model the keyboard; Enter opens it.
key ctrl+m
key ctrl+m
sleep 1
key Return
sleep 3
key ctrl+q
for _ in $(seq 50); do kill -0 "$app_pid" 2>/dev/null || break; sleep 0.2; done
if kill -0 "$app_pid" 2>/dev/null; then echo "Ctrl+Q did not close the window" >&2; exit 1; fi

python3 - "$SMOLCHAT_DATA_DIR/conversations" "$settings" "$SMOLCHAT_DATA_DIR/downloads.json" <<'PY'
import json, pathlib, sys
folder = pathlib.Path(sys.argv[1])
def chats(where):
    found = {}
    for path in where.glob("*.json"):
        chat = json.loads(path.read_text().splitlines()[0])
        found[chat["title"]] = chat
    return found
kept, trash = chats(folder), chats(folder / "trash")
assert sorted(kept) == ["Birds", "Name a fruit.", "Name a fruit. (fork)", "Name a planet.", "What is the capital of France?"], sorted(kept)
assert list(trash) == ["Tell me a long story about a dragon."], list(trash)
first = kept["What is the capital of France?"]["messages"]
story = trash["Tell me a long story about a dragon."]["messages"]
fruit = kept["Name a fruit."]["messages"]
fork = kept["Name a fruit. (fork)"]
assert [m["role"] for m in first] == ["user", "assistant"] * 2, first
assert first[2]["content"] == "Say two words.\nThen stop.", first[2]["content"]
assert len(story) == 2 and story[1]["generation"]["finish_reason"] != "stopped", story[1]
assert len(story[1]["content"]) > 24, "the continued reply"
# The token view is off: no reply keeps its tokens' alternatives.
everything = list(kept.values()) + list(trash.values())
assert not any(m.get("generation", {}).get("tokens") for c in everything for m in c["messages"]), "tokens kept"
reply = fruit[1]
assert len(reply.get("other_variants", [])) == 1 and reply["variant"] == 0, reply
assert fork["messages"] == fruit[:1], "the fork holds the conversation up to the question"
folders = {title: chat.get("folder") for title, chat in kept.items()}
assert folders == {"What is the capital of France?": "Geography", "Name a fruit. (fork)": "Geography", "Name a fruit.": None, "Name a planet.": None, "Birds": None}, folders
settings = json.loads(pathlib.Path(sys.argv[2]).read_text())
brief = "Answer in one short sentence."
assert settings["prompt_presets"] == [{"name": "Brief", "text": brief}], settings["prompt_presets"]
planet = kept["Name a planet."]
assert fork["system_prompt"] == brief and planet["system_prompt"] == brief, (fork.get("system_prompt"), planet.get("system_prompt"))
assert [m["role"] for m in planet["messages"]] == ["user", "assistant"] and planet["messages"][1]["content"], planet["messages"]
birds = kept["Birds"]["messages"]
assert [m["role"] for m in birds] == ["user", "assistant"] and birds[1]["content"], birds
asked = birds[0]
assert asked["content"] == "Name a bird." and asked["variant"] == 1, asked
earlier = asked["other_variants"]
assert [v["content"] for v in earlier] == ["Name a colour."] and earlier[0]["following"][0]["role"] == "assistant", earlier
assert settings["window_size"] == [800.0, 600.0], settings.get("window_size")
opened = settings["model_folder"]
assert opened.endswith("/.lmstudio/models/HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/smollm2-135m-instruct-q4_1.gguf"), opened
downloads = json.loads(pathlib.Path(sys.argv[3]).read_text())["downloads"]
assert downloads == [{"spec": "Qwen/Qwen3-1.7B-GGUF:Q4_K_M", "paused": False}], downloads
print("walkthrough: 5 chats saved as expected, one in the trash, two in a folder, two under a preset, one edited and renamed from the keyboard; the library opened LM Studio's copy; Ctrl+Q kept the window size and the unfinished download")
PY

# A reply as a reasoning model writes one, with code, stored beside the chats (SmolLM2 does not
# think): the oldest chat, so the last in the list.
python3 - "$SMOLCHAT_DATA_DIR/conversations" <<'PY'
import json, pathlib, sys
folder = pathlib.Path(sys.argv[1])
fruit = next(c for c in (json.loads(p.read_text().splitlines()[0]) for p in folder.glob("*.json")) if c["title"] == "Name a fruit.")
generation = dict(fruit["messages"][1]["generation"], finish_reason="stop_token", thinking_tokens=38)
reply = {"role": "assistant", "generation": generation, "content": (
    "<think>\nThe user wants a function that reverses a string. In Python, slicing with a step "
    "of -1 walks a sequence backwards, so text[::-1] is the shortest way.\n</think>\n\n"
    "Slicing does it in one step:\n\n```python\ndef reverse(text: str) -> str:\n"
    "    return text[::-1]\n\nprint(reverse(\"smolchat\"))  # tahclloms\n```\n\n"
    "A step of `-1` walks the string from its end to its start.")}
chat = {"format_version": fruit["format_version"], "id": "walkthrough-code", "title": "Reverse a string",
        "created_unix_ms": 1_700_000_000_000,
        "messages": [{"role": "user", "content": "Write a Python function that reverses a string."}, reply]}
(folder / "walkthrough-code.json").write_text(json.dumps(chat) + "\n")
PY

# The same chats reopened, in each theme and size; the trash's Restore button at 1920x1080.
restore="1297 129"
for theme in light dark; do
  for size in 800x600 1920x1080; do
    python3 - "$settings" "$theme" "$size" <<'PY'
import json, sys
path, theme, size = sys.argv[1:]
settings = json.load(open(path))
settings["theme"] = theme
settings["window_size"] = [float(v) for v in size.split("x")]
json.dump(settings, open(path, "w"))
PY
    start_x "$size"
    start_app "${size%x*}" "${size#*x}"
    wait_loaded
    shot "chat-$size-$theme"
    # The stored reply, last in the list, its Thinking section folded.
    key ctrl+6
    shot "code-$size-$theme"
    # Its Thinking section opened (the header is centred with the column).
    case "$size" in 800x600) thinking_x=360 ;; *) thinking_x=818 ;; esac
    xdotool mousemove "$thinking_x" 161 click 1
    shot "thinking-$size-$theme"
    # A search across the chats, ended by Esc.
    key ctrl+k
    say "capital"
    shot "search-$size-$theme"
    key Escape
    # The trash, from the list.
    xdotool mousemove 45 108 click 1
    shot "trash-$size-$theme"
    if [ "$theme-$size" = dark-1920x1080 ]; then
      xdotool mousemove $restore click 1
      sleep 1
    fi
    kill "$app_pid"
    wait "$app_pid" 2>/dev/null || true
  done
done
python3 - "$SMOLCHAT_DATA_DIR/conversations" <<'PY'
import json, pathlib, sys
folder = pathlib.Path(sys.argv[1])
titles = sorted(json.loads(p.read_text().splitlines()[0])["title"] for p in folder.glob("*.json"))
assert "Tell me a long story about a dragon." in titles, titles
assert not list((folder / "trash").glob("*.json")), "the trash is empty"
print("walkthrough: the deleted chat came back from the trash after three restarts")
PY
