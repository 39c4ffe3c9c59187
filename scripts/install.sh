#!/usr/bin/env bash
# Installs bitmend for use on a machine: the binary, mount(8)'s helper beside it (so that
# `mount -t bitmend /dev/mtdN DIR` and an /etc/fstab line of type bitmend work), the man
# pages and the bash completion, all made from this checkout.
#
#   sudo ./scripts/install.sh [--prefix DIR]     # default /usr/local
#
# mount(8) looks for its helpers in /sbin only, so mount.bitmend is a link there whatever the
# prefix. Needs Rust (cargo) and fuse3; the benchmarks are not built (`--features bench`).
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=/usr/local
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="$2"; shift 2 ;;
    *) sed -n '2,9p' "$0"; exit 2 ;;
  esac
done
cargo build --release --locked -p bitmend
install -D -m 755 target/release/bitmend "$prefix/bin/bitmend"
ln -sf "$prefix/bin/bitmend" /sbin/mount.bitmend
"$prefix/bin/bitmend" generate man "$prefix/share/man/man1" >/dev/null
mkdir -p "$prefix/share/bash-completion/completions"
"$prefix/bin/bitmend" generate completions bash > "$prefix/share/bash-completion/completions/bitmend"
echo "install: $prefix/bin/bitmend, /sbin/mount.bitmend, man pages in $prefix/share/man/man1, bash completion"
