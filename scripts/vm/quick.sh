#!/usr/bin/env bash
# Inside the VM (scripts/vm/run.sh scripts/vm/quick.sh [BITMEND]): bitmend on a real MTD chip
# (nandsim's /dev/mtd0), with the spare area raw and with the kernel's ECC. mkfs; mount; a
# tree of files (and a short fsx); unmount; fsck; bits flipped in the stored pages with
# mtd-utils' nandflipbits (the chip's own cells, not bitmend's injector); the files read back
# byte for byte after a remount; fsck clean. Then
# mount(8), busybox's mount and an fstab line through mount.bitmend (mount-helper.sh).
set -euo pipefail
bin="$(realpath "${1:-target/debug/bitmend}")"
dev=/dev/mtd0
work="$(mktemp -d)"
mnt="$work/mnt"
tree=/usr/share/doc/fio
mkdir -p "$mnt"
# The chip's rules, as the simulated chips keep them (crates/media/tests/nand_rules.rs), when
# that test is built.
rules="$(ls -t "$(dirname "$bin")"/deps/nand_rules-* 2>/dev/null | grep -v '\.d$' | head -1 || true)"
if [ -n "$rules" ]; then
  said="$(BITMEND_MTD="$dev" "$rules" --test-threads 1 -q 2>&1 | grep '^test result')" || {
    echo "quick: the NAND-rule tests failed on $dev:"
    BITMEND_MTD="$dev" "$rules" --test-threads 1 2>&1 | cut -c1-200 | tail -30
    exit 1
  }
  echo "quick: the NAND-rule tests on $dev: $said"
else
  echo "quick: the NAND-rule tests are not built (cargo test -p bitmend-media --no-run): skipped"
fi
# One round per way of using the spare area: raw (bitmend's alone) and ecc (the kernel's
# ECC first). fsx runs in the first.
round() {
  local oob=$1
  "$bin" mkfs "$dev" --force --oob "$oob" >/dev/null
  "$bin" mount "$dev" "$mnt" >/dev/null
  rm -rf "${mnt:?}"/*
  cp -r "$tree" "$mnt/tree"
  head -c 3000000 /dev/urandom > "$work/big"
  cp "$work/big" "$mnt/big"
  (cd "$mnt" && find tree big -type f -exec sha256sum {} + | sort -k2) > "$work/manifest"
  if [ "$oob" = raw ]; then
    if command -v fsx >/dev/null; then
      (cd "$mnt" && fsx -q -N 2000 -S 7 -P "$work" fsxfile)
      echo "quick: fsx, 2,000 operations: passed"
    else
      echo "quick: fsx not installed (cargo install fsx): skipped"
    fi
  fi
  "$bin" umount "$mnt"
  "$bin" fsck "$dev" >/dev/null
  echo "quick [$oob]: $(wc -l < "$work/manifest") files written, unmounted, fsck clean"
  flip_stored_bits
  "$bin" mount "$dev" "$mnt" >/dev/null
  (cd "$mnt" && sha256sum --quiet -c "$work/manifest")
  repaired="$("$bin" stat "$mnt" --json | python3 -c 'import json,sys; h=json.load(sys.stdin); print(h["lifetime_repaired_by_group"] + h["lifetime_repaired_by_segment"])')"
  echo "quick [$oob]: every file reads back byte for byte; the mount repaired $repaired flash pages on the way"
  # In ecc mode the kernel corrects one bit per 256 bytes before bitmend sees the page: the
  # flips below are several to a page so that some reach bitmend.
  [ "$repaired" -gt 0 ] || { echo "quick [$oob]: the flipped bits were never met: the test proves nothing"; exit 1; }
  "$bin" umount "$mnt"
  "$bin" fsck "$dev" | grep -q '^  clean' || { "$bin" fsck "$dev"; exit 1; }
  echo "quick [$oob]: fsck clean after the remount"
}
# Bits flipped in one programmed page of each of the first 32 erase blocks, each at a
# different page index (within what one group parity page and one parity block repair):
# eight bits of one byte of the page, more than the kernel's ECC corrects. Offsets where
# the chip holds data (nanddump, without the kernel's ECC and with bad blocks read as erased,
# shows which pages are not erased).
flip_stored_bits() {
  local g ppb flips=() b p at i
  g="$(mtdinfo "$dev" | sed -n 's/^Minimum input\/output unit size: *\([0-9]*\) bytes.*/\1/p')"
  ppb=$(( $(mtdinfo "$dev" | sed -n 's/^Eraseblock size: *\([0-9]*\) bytes.*/\1/p') / g ))
  for ((b = 0; b < 32; b++)); do
    p=$(( b * ppb + (b * 7 + 3) % ppb ))
    if nanddump -n -q --bb=padbad -s $((p * g)) -l "$g" "$dev" 2>/dev/null | tr -d '\377' | head -c 1 | grep -q .; then
      at=$(( p * g + (b * 97) % g ))
      for ((i = 0; i < 8; i++)); do flips+=("$i@$at"); done
    fi
  done
  [ ${#flips[@]} -gt 0 ] || { echo "quick: no programmed page found to flip"; exit 1; }
  nandflipbits "$dev" "${flips[@]}" >/dev/null
  echo "quick: ${#flips[@]} stored bits flipped, 8 in a programmed page of each of $(( ${#flips[@]} / 8 )) erase blocks"
}
round raw
round ecc
# mount(8) and fstab through the mount.bitmend helper.
bash "$(dirname "$0")/mount-helper.sh" "$bin"
