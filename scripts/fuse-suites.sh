#!/usr/bin/env bash
# The suites against a bitmend FUSE mount: fsx (the file system exerciser) and pjdfstest
# (POSIX conformance), both installed from crates.io when run, never copied here; rsync, fio
# with verify=crc32c and stress-ng with --verify (Debian packages, from scripts/setup.sh).
#
#   ./scripts/fuse-suites.sh --quick   # CI: 5,000 fsx operations, short tool runs, all of pjdfstest
#   ./scripts/fuse-suites.sh           # 100,000 fsx operations x 3 seeds, longer tool runs, pjdfstest
#
# Needs root (pjdfstest switches users; the mount uses allow_other) and fuse3. Every image is
# checked with `bitmend fsck` after unmount. Exits non-zero on any failure.
#
#   BITMEND_BIN=/tmp/bitmend ./scripts/fuse-suites.sh   # a given binary, no build
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = "--quick" ] && quick=1
export PATH="$HOME/.cargo/bin:$PATH"
command -v fsx >/dev/null || cargo install --quiet --locked fsx --version 0.3.2
command -v pjdfstest >/dev/null || cargo install --quiet --locked pjdfstest --version 0.2.2
# BITMEND_BIN runs a binary built before (a copy, so that builds can go on meanwhile).
if [ -n "${BITMEND_BIN:-}" ]; then
  bin="$BITMEND_BIN"
else
  cargo build --quiet --release -p bitmend
  bin="$PWD/target/release/bitmend"
fi
work=$(mktemp -d)
chmod 755 "$work"  # pjdfstest runs as other users, who must reach the mount
cleanup() {
  for m in "$work"/mnt*; do
    if mountpoint -q "$m" 2>/dev/null; then fusermount3 -u "$m" || true; fi
  done
  rm -rf "$work"
}
trap cleanup EXIT

# Unmounts, waits for the daemon to write everything out and let go, checks the image.
finish() {
  fusermount3 -u "$work/$2"
  for _ in $(seq 50); do "$bin" fsck "$work/$1" --json > "$work/fsck.json" 2>/dev/null && break; sleep 0.2; done
  grep -q '"clean": true' "$work/fsck.json" || { cat "$work/fsck.json"; echo "fsck: $1 not clean"; exit 1; }
  echo "fsck $1: clean"
}

# The on-line check (PRIMS's: the namespace in memory against flash) runs flat out on the
# mounts below, and must never find a difference the suites did not inject.
check=(--state-check-rate 100000)
state_clean() {
  local status; status=$(cat "$work/$1/.bitmend-scrub")
  echo "$status" | grep -q '"state_mismatches": 0' || { echo "$status"; echo "on-line check: a mismatch on $1"; exit 1; }
  echo "on-line check on $1: $(echo "$status" | grep -o '"state_groups_compared": [0-9]*' | grep -o '[0-9]*$') groups compared with flash, no mismatch"
}

if [ $quick = 1 ]; then seeds="1"; ops=5000; else seeds="1 2 3"; ops=100000; fi
for seed in $seeds; do
  "$bin" mkfs "$work/fsx$seed.img" --size 64MiB > /dev/null
  "$bin" mount "$work/fsx$seed.img" "$work/mnt$seed" "${check[@]}" > /dev/null
  (cd "$work/mnt$seed" && fsx -q -N $ops -S $seed -P "$work" testfile)
  echo "fsx seed $seed: $ops operations passed"
  state_clean "mnt$seed"
  finish "fsx$seed.img" "mnt$seed"
done

# fsx on a supervised mount whose worker is killed with SIGKILL at random moments: fsx checks
# every byte it reads against its own model, and must see no error (Loris's transparent
# recovery; docs/DESIGN.md, "The supervisor").
# With the tier in shared memory fsx runs about 3,000 operations a second: enough of them
# that the killer (every 0.2 to 0.7 s) strikes a few dozen times even in the quick run.
if [ $quick = 1 ]; then kill_ops=40000; else kill_ops=200000; fi
# The tier in shared memory, where an NVRAM tier lives (a tier in a disk file persists with
# msync, and a disk busy with other work then slows every start past the killer's interval,
# until the supervisor stops the mount: 50 workers in a row killed before they served).
tier="$work/kills.nvram"
if [ -d /dev/shm ]; then tier="/dev/shm/bitmend-kills-$$.nvram"; trap 'rm -f "$tier"; cleanup' EXIT; fi
"$bin" mkfs "$work/kills.img" --size 64MiB > /dev/null
said=$("$bin" mount "$work/kills.img" "$work/mntk" --supervise --nvram "$tier")
supervisor=$(sed -n 's/.*(pid \([0-9]*\),.*/\1/p' <<<"$said")
(cd "$work/mntk" && fsx -q -N $kill_ops -S 7 -P "$work" testfile) &
fsx_pid=$!
kills=0
while kill -0 $fsx_pid 2>/dev/null; do
  sleep "0.$(( RANDOM % 6 + 2 ))"
  worker=$(pgrep -P "$supervisor" | head -1 || true)
  if [ -n "$worker" ] && kill -0 $fsx_pid 2>/dev/null; then kill -9 "$worker" 2>/dev/null && kills=$((kills + 1)); fi
done
wait $fsx_pid || { tail -20 "$work"/testfile.fsxlog 2>/dev/null; echo "fsx under kills: failed after $kills kills"; exit 1; }
echo "fsx under kills: $kill_ops operations passed, the worker killed $kills times"
[ "$kills" -ge 5 ] || { echo "fsx under kills: only $kills kills, too few to show anything"; exit 1; }
finish kills.img mntk

# Ordinary tools with their own verification: rsync (then diff), fio with verify=crc32c,
# stress-ng's file-system stressors with --verify.
if [ $quick = 1 ]; then fio_size=16M; stress_s=5; else fio_size=96M; stress_s=60; fi
"$bin" mkfs "$work/tools.img" --size 256MiB > /dev/null
# A namespace cache of 64 inodes: the groups of the namespace go and come back between
# requests all through the tools' runs (and pjdfstest's below).
small_cache=(--namespace-cache 64)
"$bin" mount "$work/tools.img" "$work/mntt" "${check[@]}" "${small_cache[@]}" > /dev/null
src=/usr/share/doc  # 124 MB in 5,000 files (most of them compressed already)
[ $quick = 1 ] && src=/usr/share/doc/fio
rsync -a "$src/" "$work/mntt/copy/"
diff -r --no-dereference "$src" "$work/mntt/copy"
[ -z "$(rsync -ai "$src/" "$work/mntt/copy/")" ] || { echo "rsync: a second run found differences"; exit 1; }
echo "rsync: $(find "$src" | wc -l) entries copied, diff -r identical, a second rsync has nothing to do"
for rw in randwrite write; do
  fio --name="verify-$rw" --directory="$work/mntt" --size=$fio_size --bs=4k --rw=$rw --ioengine=psync \
    --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 --output="$work/fio.log" > /dev/null \
    || { cat "$work/fio.log"; echo "fio $rw: verification failed"; exit 1; }
  echo "fio $rw 4 KiB, $fio_size, verify=crc32c: no verification error"
  rm -f "$work/mntt/verify-$rw".*
done
mkdir -p "$work/mntt/stress"
if ! stress-ng --temp-path "$work/mntt/stress" --hdd 2 --hdd-bytes 8M --dir 1 --rename 1 --dentry 1 \
    --fstat 1 --verify --timeout ${stress_s}s --metrics-brief > "$work/stress.log" 2>&1; then
  cat "$work/stress.log"; echo "stress-ng: failures above"; exit 1
fi
echo "stress-ng hdd, dir, rename, dentry, fstat with --verify for ${stress_s} s: passed"
state_clean mntt
finish tools.img mntt

if [ "$(id -u)" != 0 ]; then
  echo "pjdfstest switches users and needs root: skipped"
  exit 0
fi
cat > "$work/pjdfstest.toml" <<'TOML'
[features]

[dummy_auth]
entries = [["nobody", "nogroup"], ["daemon", "daemon"]]
TOML
"$bin" mkfs "$work/pjd.img" --size 64MiB > /dev/null
"$bin" mount "$work/pjd.img" "$work/mntp" --allow-other "${check[@]}" "${small_cache[@]}" > /dev/null
chmod 777 "$work/mntp"
if ! pjdfstest -c "$work/pjdfstest.toml" -p "$work/mntp" > "$work/pjdfstest.log" 2>&1; then
  grep -E 'FAILED' "$work/pjdfstest.log" || tail -20 "$work/pjdfstest.log"
  echo "pjdfstest: failures above"
  exit 1
fi
echo "pjdfstest: $(grep -cE '^\S+\s+ok$' "$work/pjdfstest.log") passed, 0 failed"
shed=$(grep -o '"namespace_groups_shed": [0-9]*' "$work/mntp/.bitmend-scrub" | grep -o '[0-9]*$')
[ "${shed:-0}" -gt 0 ] || { echo "pjdfstest: the namespace cache of 64 inodes let no group go"; exit 1; }
echo "pjdfstest: $shed namespace groups let go and read again"
state_clean mntp
finish pjd.img mntp
