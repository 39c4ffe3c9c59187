#!/usr/bin/env bash
# Runs a script inside a Linux VM that has a NAND chip: QEMU boots Debian's kernel with the
# kernel's NAND simulator (nandsim) loaded, the host's root shared read-only and this
# repository read-write at the same path, runs SCRIPT there (chrooted into the host's tree,
# so every tool the host has is there), and exits with its status.
#
#   scripts/vm/run.sh [--nandsim PARAMS] [--pmem MIB] [--mem MIB] [--cpus N] SCRIPT [ARGS...]
#
# SCRIPT is a path inside the repository. --nandsim: nandsim's module parameters, comma
# separated (default: 256 MiB of 2 KiB pages, 128 KiB blocks, 64 spare bytes:
# first_id_byte=0x20,second_id_byte=0xaa,third_id_byte=0x00,fourth_id_byte=0x15); "none"
# loads no chip. --pmem: an emulated NVDIMM of that size (the guest's /dev/pmem0, backed by a
# file in target/vm). The VM uses KVM when BITMEND_VM_ACCEL=kvm, else QEMU's emulation (TCG),
# which works everywhere and boots in about 5 s. Builds the kernel and initramfs first if
# they are missing (scripts/vm/build.sh).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
nandsim="first_id_byte=0x20,second_id_byte=0xaa,third_id_byte=0x00,fourth_id_byte=0x15"
mem=2048
cpus=2
pmem=0
while [ $# -gt 0 ]; do
  case "$1" in
    --nandsim) nandsim="$2"; shift 2 ;;
    --mem) mem="$2"; shift 2 ;;
    --pmem) pmem="$2"; shift 2 ;;
    --cpus) cpus="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    --*) echo "vm/run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || { sed -n '2,15p' "$0"; exit 2; }
script="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
shift
case "$script" in "$repo"/*) ;; *) echo "vm/run.sh: $script is not inside $repo" >&2; exit 2 ;; esac
for a in "$script" "$@"; do
  case "$a" in *[\ ,]*) echo "vm/run.sh: arguments may not hold spaces or commas: '$a'" >&2; exit 2 ;; esac
done
"$here/build.sh" >&2
vm="$repo/target/vm"
[ "$nandsim" = none ] && nandsim=""
args="$(IFS=,; echo "$script${*:+,$*}")"
accel=tcg
cpu=max
if [ "${BITMEND_VM_ACCEL:-}" = kvm ]; then accel=kvm; cpu=host; fi
out="$(mktemp)"
trap 'rm -f "$out" "$vm/pmem.img"' EXIT
machine=q35
memory="$mem"
nvdimm=()
if [ "$pmem" -gt 0 ]; then
  memory="$mem,slots=2,maxmem=$((mem + pmem + 1024))M"
  rm -f "$vm/pmem.img"
  truncate -s "${pmem}M" "$vm/pmem.img"
  machine=q35,nvdimm=on
  nvdimm=(-object "memory-backend-file,id=pmem0,share=on,mem-path=$vm/pmem.img,size=${pmem}M"
          -device nvdimm,id=nvdimm0,memdev=pmem0,label-size=128K)
fi
timeout "${BITMEND_VM_TIMEOUT:-3600}" qemu-system-x86_64 \
  -machine "$machine" -accel "$accel" -cpu "$cpu" -m "$memory" \
  -smp "$cpus" -nographic -no-reboot "${nvdimm[@]}" \
  -bios /usr/share/qemu/qboot.rom -kernel "$vm/vmlinux" -initrd "$vm/initrd.img" \
  -append "console=ttyS0 quiet panic=-1 vm.nandsim=$nandsim vm.workdir=$repo vm.script=$args" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
  -virtfs "local,path=$repo,mount_tag=work,security_model=none" 2>&1 | tee "$out" | grep --line-buffered -v '^VM-EXIT: '
status="$(sed -n 's/^VM-EXIT: \([0-9]*\).*/\1/p' "$out" | tail -1)"
if [ -z "$status" ]; then
  echo "vm/run.sh: the VM ended without the script's status (a panic, or the timeout)" >&2
  exit 124
fi
exit "$status"
