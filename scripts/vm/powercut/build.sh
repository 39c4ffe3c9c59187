#!/usr/bin/env bash
# Builds mtd_powercut.ko for the kernel scripts/vm/build.sh boots, into target/vm/powercut/.
# Needs that kernel's headers package (linux-headers-<version>), which it installs with
# apt-get when missing; gcc and make come with it. Only scripts/vm/peers.sh's power-cut rows
# use the module, so CI never builds it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
vm="$here/../../../target/vm"
"$here/../build.sh"
version="$(basename "$(ls -d "$vm"/kernel-linux-image-*/lib/modules/* | head -1)")"
[ -n "$version" ] || { echo "powercut/build.sh: no kernel in target/vm (scripts/vm/build.sh)"; exit 1; }
if [ ! -d "/lib/modules/$version/build" ]; then
  echo "powercut/build.sh: installing linux-headers-$version"
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get install -y -q "linux-headers-$version" make gcc >/dev/null
fi
out="$vm/powercut"
mkdir -p "$out"
cp "$here/Kbuild" "$here/mtd_powercut.c" "$out/"
make -s -C "/lib/modules/$version/build" M="$(realpath "$out")" modules
echo "powercut/build.sh: $(realpath --relative-to="$here/../../.." "$out")/mtd_powercut.ko for $version"
