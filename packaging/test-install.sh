#!/usr/bin/env bash
# Tries the packages packaging/build.sh made as a user would, on a clean Debian 12: installs
# the .deb into a fresh root with apt (which pulls in its dependencies), runs lintian, starts
# the app from its installed desktop entry under Xvfb and asks the genuine SmolLM2 file a
# question; then the tarball's install.sh in a fresh HOME, started from the entry it wrote.
# Screenshots go to target/packages/. Needs root (debootstrap, chroot) and Debian's mirror.
#
#   bash packaging/test-install.sh [DEBIAN_ROOT]   (default target/packages/debian12)
set -euo pipefail
cd "$(dirname "$0")/.."

out="$(pwd)/${CARGO_TARGET_DIR:-target}/packages"
deb="$(ls "$out"/smolchat_*_amd64.deb)"
tarball="$(ls "$out"/smolchat-*-x86_64-linux.tar.gz)"
model="$(pwd)/tests/models/SmolLM2-135M-Instruct.Q4_1.gguf"
debian="$(realpath -m "${1:-$out/debian12}")"
root="$(mktemp -d)"
mounts=()
# Unmounts before anything else can fail: a bind mount left in the Debian root would make
# deleting that root delete the host's /dev.
cleanup() {
  set +e
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[i]}"; done
  kill ${app_pid:-} ${xvfb_pid:-} 2>/dev/null || true
  rm -rf "$root"
}
trap cleanup EXIT

echo "== lintian"
lintian --fail-on error "$deb"

echo "== apt-get install ./$(basename "$deb") on a fresh Debian 12"
[ -e "$debian/etc/debian_version" ] ||
  debootstrap --variant=minbase bookworm "$debian" http://deb.debian.org/debian
mkdir -p /tmp/.X11-unix && chmod 1777 /tmp/.X11-unix
for dir in proc sys dev tmp/.X11-unix; do
  mkdir -p "$debian/$dir"
  mount --bind "/$dir" "$debian/$dir"
  mounts+=("$debian/$dir")
done
cp "$deb" "$debian/tmp/"
in_debian() { chroot "$debian" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }
in_debian apt-get update -qq
in_debian env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "/tmp/$(basename "$deb")" \
  libglib2.0-bin >/dev/null
in_debian dpkg -s smolchat | grep -E "^(Status|Installed-Size)"
mkdir -p "$debian/root/.local/share/smolchat/models"
cp "$model" "$debian/root/.local/share/smolchat/models/"

source .ci/xvfb-window.sh
shot() { sleep 1; import -window root "$out/$1.png"; echo "saved $out/$1.png"; }
# Started the way a desktop's menu starts it: `gio launch` reads the installed entry.
launch() {
  "$@" &
  app_pid=$!
  for _ in $(seq 150); do
    window="$(xdotool search --name '^smolchat$' 2>/dev/null | head -n1 || true)"
    [ -n "$window" ] && break
    sleep 0.2
  done
  if [ -z "$window" ]; then echo "the smolchat window did not appear" >&2; exit 1; fi
  xdotool windowmove "$window" 0 0 windowsize "$window" 800 600
  sleep 3
  xdotool windowactivate --sync "$window" 2>/dev/null || xdotool windowfocus "$window"
}
# The first-run screen lists the model in the models folder; its button opens it, then a
# question and its answer; Ctrl+Q closes the window.
first_chat() {
  shot "$1-first-run"
  xdotool mousemove 250 186 click 1
  sleep 8
  xdotool key ctrl+l
  xdotool type --delay 20 "What is the capital of France?"
  xdotool key Return
  sleep 15
  shot "$1-chat"
  xdotool key ctrl+q
  for _ in $(seq 50); do
    xdotool search --name '^smolchat$' >/dev/null 2>&1 || return 0
    sleep 0.2
  done
  echo "Ctrl+Q did not close the window" >&2
  exit 1
}

start_x 800x600
launch in_debian env DISPLAY="$DISPLAY" LIBGL_ALWAYS_SOFTWARE=1 \
  gio launch /usr/share/applications/smolchat.desktop
first_chat deb

echo "== the tarball's install.sh in a fresh HOME"
export HOME="$root/home"
mkdir -p "$HOME/.local/share/smolchat/models"
cp "$model" "$HOME/.local/share/smolchat/models/"
tar -C "$root" -xzf "$tarball"
"$root"/smolchat-*/install.sh
test -x "$HOME/.local/bin/smolchat"
entry="$HOME/.local/share/applications/smolchat.desktop"
desktop-file-validate "$entry"
launch gio launch "$entry"
first_chat tarball
"$root"/smolchat-*/install.sh --uninstall
test ! -e "$HOME/.local/bin/smolchat" && test ! -e "$entry"
echo "== both packages install and start"
