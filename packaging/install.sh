#!/bin/sh
# Installs smolchat from this folder for the current user, without root: the binary in
# ~/.local/bin, and the desktop entry, icon and AppStream metadata under ~/.local/share, so
# that the app is in the desktop's menu. Chats, settings and models are never touched.
#
#   ./install.sh               install, or update an earlier install
#   ./install.sh --uninstall   remove what install.sh put there
#
# PREFIX (default ~/.local) moves both.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
prefix=${PREFIX:-${HOME:?HOME is not set; set PREFIX}/.local}
bin="$prefix/bin/smolchat"
share="$prefix/share"
installed="$share/applications/smolchat.desktop
$share/icons/hicolor/256x256/apps/smolchat.png
$share/metainfo/io.github.smolchat.smolchat.metainfo.xml"

refresh_menus() {
  command -v update-desktop-database >/dev/null 2>&1 &&
    update-desktop-database -q "$share/applications" 2>/dev/null || true
}

if [ "${1:-}" = "--uninstall" ]; then
  rm -f "$bin"
  echo "$installed" | while IFS= read -r file; do rm -f "$file"; done
  refresh_menus
  echo "smolchat removed from $prefix (chats and models are kept)"
  exit 0
fi
if [ $# -gt 0 ]; then
  echo "usage: $0 [--uninstall]" >&2
  exit 2
fi

# The libraries the binary links and the system must provide, by the package that has them.
missing=$(ldd "$here/smolchat" 2>/dev/null | sed -n 's/^[[:space:]]*\([^ ]*\) => not found.*/\1/p')
if [ -n "$missing" ]; then
  echo "smolchat needs these libraries, which this system lacks: $(echo $missing)" >&2
  echo "install them first, e.g. 'sudo apt install libopenblas0' (Debian, Ubuntu)," >&2
  echo "'sudo dnf install openblas' (Fedora) or 'sudo pacman -S openblas' (Arch)" >&2
  exit 1
fi

mkdir -p "$prefix/bin" "$share/metainfo"
# Copied beside, then renamed: a running smolchat keeps its old file.
cp "$here/smolchat" "$bin.new"
chmod 755 "$bin.new"
mv -f "$bin.new" "$bin"
cp "$here/io.github.smolchat.smolchat.metainfo.xml" "$share/metainfo/"
# The entry points at the binary by its full path, so the menu finds it whatever PATH says.
"$bin" install-desktop-entry --data-home "$share"
refresh_menus

echo "smolchat installed in $bin"
case ":$PATH:" in
  *":$prefix/bin:"*) ;;
  *) echo "note: $prefix/bin is not in PATH; start smolchat from the menu or by its full path" ;;
esac
