#!/usr/bin/env bash
# Builds smolchat's packages into target/packages/: the Debian package, made by cargo-deb from
# Cargo.toml's [package.metadata.deb], and a portable tarball whose install.sh puts the app in
# ~/.local. Prints each package's size and the build's time.
set -euo pipefail
cd "$(dirname "$0")/.."

target="${CARGO_TARGET_DIR:-target}"
out="$target/packages"
version="$(cargo pkgid | sed 's/.*[#@]//')"
command -v cargo-deb >/dev/null || cargo install cargo-deb --locked --version 3.8.0

SECONDS=0
cargo build --release --locked --bin smolchat
built=$SECONDS
mkdir -p "$out"
cargo deb --locked --no-build --output "$out/smolchat_${version}-1_amd64.deb"

name="smolchat-$version-x86_64-linux"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir "$stage/$name"
strip -o "$stage/$name/smolchat" "$target/release/smolchat"
cp packaging/install.sh packaging/io.github.smolchat.smolchat.metainfo.xml README.md \
  "$stage/$name/"
tar -C "$stage" --owner=0 --group=0 -czf "$out/$name.tar.gz" "$name"

echo "build ${built} s, packages $((SECONDS - built)) s"
for package in "$out/smolchat_${version}-1_amd64.deb" "$out/$name.tar.gz"; do
  echo "$(du -h "$package" | cut -f1)	$package"
done
echo "installed: $(du -sh "$stage/$name/smolchat" | cut -f1) (the binary)"
