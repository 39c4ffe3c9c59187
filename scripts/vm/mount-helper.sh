#!/usr/bin/env bash
# Inside the VM (scripts/vm/run.sh scripts/vm/mount-helper.sh [BITMEND]; quick.sh runs it):
# what someone who puts bitmend on a board does. `mount -t bitmend /dev/mtd0 DIR -o OPTIONS`
# through mount.bitmend, with util-linux's mount and with busybox's, and an fstab line; each
# mount serves the chip, takes its options, and keeps what was written across an unmount.
set -euo pipefail
bin="$(realpath "${1:-target/debug/bitmend}")"
dev=/dev/mtd0
work="$(mktemp -d)"
mnt="$work/mnt"
mkdir -p "$mnt"
busybox=/run/vm-modules/busybox
# mount(8) runs helpers from /sbin only, and the host's tree is read-only in the VM: /sbin
# (/usr/sbin) gets a writable copy of itself, with the helper linked in as install.sh does.
mkdir -p "$work/sbin"
cp -a /usr/sbin/. "$work/sbin/"
mount --bind "$work/sbin" /usr/sbin
ln -sf "$bin" /usr/sbin/mount.bitmend
# Waits until the daemon has let the chip go (an unmount returns before it has written out).
wait_released() {
  local i
  for ((i = 0; i < 300; i++)); do
    pgrep -f "bitmend.*mount.*$dev" >/dev/null || return 0
    sleep 0.1
  done
  echo "mount-helper: the daemon still holds $dev 30 s after the unmount"; exit 1
}
check_mount() { # how it was mounted, the option it must have taken
  local how=$1
  mountpoint -q "$mnt" || { echo "mount-helper: $how did not mount $mnt"; exit 1; }
  grep -q "$mnt fuse" /proc/mounts || { echo "mount-helper: $how: $mnt is not a FUSE mount"; exit 1; }
  pgrep -af "bitmend.*mount.*$dev" | grep -q -- "--commit-interval 1s" \
    || { echo "mount-helper: $how: -o commit_interval=1s did not reach the daemon"; pgrep -af bitmend; exit 1; }
}
"$bin" mkfs "$dev" --force >/dev/null

mount -t bitmend -o commit_interval=1s,noatime "$dev" "$mnt"
check_mount "util-linux mount"
head -c 300000 /dev/urandom > "$work/a"
cp "$work/a" "$mnt/a"
umount "$mnt"; wait_released
echo "mount-helper: util-linux mount -t bitmend -o commit_interval=1s,noatime: mounted, written, unmounted"

"$busybox" mount -t bitmend -o commit_interval=1s "$dev" "$mnt"
check_mount "busybox mount"
cmp "$work/a" "$mnt/a"
cp "$work/a" "$mnt/b"
"$busybox" umount "$mnt"; wait_released
echo "mount-helper: busybox mount -t bitmend: the file written before read back, another written"

printf '%s %s bitmend commit_interval=1s,nofail,x-systemd.device-timeout=10s 0 0\n' "$dev" "$mnt" > "$work/fstab"
mount -T "$work/fstab" "$mnt"
check_mount "an fstab line"
cmp "$work/a" "$mnt/a"; cmp "$work/a" "$mnt/b"
umount "$mnt"; wait_released
"$bin" fsck "$dev" | grep -q '^  clean' || { "$bin" fsck "$dev"; exit 1; }
echo "mount-helper: an fstab line (mount -T FSTAB DIR): both files read back; fsck clean"
