#!/usr/bin/env bash
# Installs the system packages bitmend's tests and anchors need. Idempotent: run it again
# any time. Needs root (or sudo) for apt-get; skips what is already installed.
set -euo pipefail

packages=(
  pkg-config          # finds the libraries below
  libisal-dev         # ISA-L 2.30: an anchor and cross-check for the erasure code and CRC-32C
  nasm autoconf automake libtool  # to build ISA-L 2.31 from source (the isal-sys crate), the other
  libpmemobj-dev      # PMDK: the anchor for the persistent-memory log and heap
  fuse3 libfuse3-dev  # the FUSE mount
  libclang-dev        # bindgen, for littlefs (the littlefs2 crate): the flash file system anchor
  fio stress-ng rsync # tools with their own verification, run on the mount by fuse-suites.sh
  dbench postmark     # scripts/fuse-perf.sh
  mtd-utils           # mkfs.ubifs: the anchor of `bitmend bench corpus`; nandflipbits in the VM
  qemu-system-x86     # scripts/vm/: a Linux VM with the kernel's NAND simulator (/dev/mtd0)
  ndctl               # scripts/vm/dax.sh: an fsdax namespace on the VM's emulated NVDIMM
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
else
  echo "setup: system packages present"
fi

if ! command -v cargo >/dev/null; then
  echo "setup: cargo not found; install Rust (rustup) first" >&2
  exit 1
fi
