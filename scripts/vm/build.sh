#!/usr/bin/env bash
# Builds what scripts/vm/run.sh boots, into target/vm/: Debian's kernel (the linux-image
# package of this machine's release, its vmlinux unpacked so QEMU boots it directly through
# its PVH entry) and an initramfs holding busybox (busybox-static), the modules the tests
# need (nandsim and the NAND core, UBI, UBIFS, JFFS2, FUSE, 9p over virtio, the NVDIMM and
# DAX drivers, ext4) and init.sh. Does nothing when both are there and newer than
# init.sh and initrd.py. Needs apt-get (to download the two packages), python3, qemu.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
vm="$here/../../target/vm"
mkdir -p "$vm"
if [ -f "$vm/vmlinux" ] && [ -f "$vm/initrd.img" ] && [ "$vm/initrd.img" -nt "$here/init.sh" ] \
   && [ "$vm/initrd.img" -nt "$here/initrd.py" ]; then
  exit 0
fi
for tool in qemu-system-x86_64 python3 apt-get dpkg-deb; do
  command -v $tool >/dev/null || { echo "vm/build.sh: $tool not found (scripts/setup.sh installs it)"; exit 1; }
done
[ -f /usr/share/qemu/qboot.rom ] || { echo "vm/build.sh: /usr/share/qemu/qboot.rom not found (apt-get install qemu-system-x86)"; exit 1; }
cd "$vm"
kernel="$(apt-cache depends linux-image-amd64 | sed -n 's/.*Depends: \(linux-image-[0-9].*\)/\1/p' | head -1)"
[ -n "$kernel" ] || { echo "vm/build.sh: no linux-image package found (apt-get update?)"; exit 1; }
if [ ! -d "kernel-$kernel" ]; then
  echo "vm/build.sh: fetching $kernel and busybox-static"
  rm -f ./*.deb
  apt-get download "$kernel" busybox-static >/dev/null 2>&1 || apt-get download "$kernel" busybox-static
  mkdir -p "kernel-$kernel.tmp" busybox
  dpkg-deb -x "$kernel"_*.deb "kernel-$kernel.tmp"
  dpkg-deb -x busybox-static_*.deb busybox
  rm -f ./*.deb
  mv "kernel-$kernel.tmp" "kernel-$kernel"
fi
# vmlinuz is a boot stub around an xz-compressed vmlinux: unpack it for QEMU's PVH entry.
python3 - "kernel-$kernel"/boot/vmlinuz-* vmlinux <<'PY'
import lzma, sys
data = open(sys.argv[1], "rb").read()
at = data.find(b"\xfd7zXZ\x00")
if at < 0:
    sys.exit("vm/build.sh: no xz stream in " + sys.argv[1])
open(sys.argv[2], "wb").write(lzma.LZMADecompressor().decompress(data[at:]))
PY
python3 "$here/initrd.py" "kernel-$kernel" busybox/bin/busybox initrd.img \
  zstd crc32c_generic crc32c_intel nandsim ubifs jffs2 fuse 9p 9pnet_virtio virtio_pci \
  nd_pmem nfit dax_pmem ext4
echo "vm/build.sh: target/vm/vmlinux and initrd.img ($kernel)"
