#!/usr/bin/env bash
# Inside the VM: RCFFS's experiment (section 5 of the seed) with its real peers. bitmend (its
# spare area raw, the kernel's ECC off, and with the kernel's ECC), JFFS2 and UBIFS, each on
# the same nandsim chip, erased before each, with compression on for all (bitmend lz4, JFFS2
# zlib and rtime, UBIFS lzo: their defaults). YAFFS2, RCFFS's other peer, is not in the kernel.
#
#   scripts/vm/run.sh --nandsim first_id_byte=0x20,second_id_byte=0xf1,third_id_byte=0x00,fourth_id_byte=0x15 \
#       scripts/vm/peers.sh target/release/bitmend [perf|faults|mounts|cuts|all] [quick|full] [FS:FS...]
#
# (128 MiB, 2 KiB pages, 128 KiB blocks, 64 spare bytes.) `perf` prints the performance rows,
# each file system's figure and bitmend's ratio to each peer (above 1: bitmend is better);
# `faults` prints, for each fault, the files each file system gives back intact, refuses
# with an error, or gives back wrong; `mounts` the median of five mounts of a chip 30% full;
# `cuts` the median of three mounts after a power cut mid-write, the chip 30% full.
# The faults come from nandsim's own knobs and from
# mtd-utils' nandflipbits, never from bitmend's injectors. Under QEMU's emulation the figures
# are CPU-bound: the ratios within one run are what mean something. `quick` runs every row
# smaller, to try the script.
set -euo pipefail
bin="$(realpath "${1:-target/release/bitmend}")"
what="${2:-all}"
quick="${3:-}"
[ "$quick" = full ] && quick=""
here="$(cd "$(dirname "$0")" && pwd)"
dev=/dev/mtd0
work="$(mktemp -d)"
mnt="$work/mnt"
mkdir -p "$mnt"
start=$(date +%s)
say() { echo "peers [$(( $(date +%s) - start ))s] $*" >&2; }
now() { date +%s.%N; }
# a / b, and the figures of a row, with awk (one python start costs seconds under emulation).
calc() { awk "BEGIN { printf \"%.${2:-2}f\", $1 }"; }
modules=/run/vm-modules
nandsim_params="$(tr '\0' ' ' < /proc/cmdline | sed -n 's/.*vm\.nandsim=\([^ ]*\).*/\1/p' | tr ',' ' ')"
chip_kib=$(( $(cat /sys/class/mtd/mtd0/size) / 1024 ))

# --- the file systems ------------------------------------------------------------------
# bitmend-raw and bitmend-ecc are one file system with its spare area used two ways.
fs_list="bitmend-raw bitmend-ecc jffs2 ubifs"
fault_fs_list="$fs_list ubifs-crc"
# A fourth argument, colon-separated, runs only those (bitmend-raw:ubifs).
if [ -n "${4:-}" ]; then fs_list="${4//:/ }"; fault_fs_list="$fs_list"; fi
make_fs() {
  flash_erase -q "$dev" 0 0 2>/dev/null || true
  case "$1" in
    bitmend-raw) "$bin" mkfs "$dev" --force --oob raw >/dev/null ;;
    bitmend-ecc) "$bin" mkfs "$dev" --force --oob ecc >/dev/null ;;
    jffs2) ;;
    ubifs*) ubiformat -q -y "$dev" >/dev/null 2>&1
           ubiattach -m 0 >/dev/null
           ubimkvol /dev/ubi0 -N data -m >/dev/null
           ubidetach -m 0 >/dev/null ;;
  esac
}
# Everything a boot does before the files are there: for UBIFS, UBI's attach too.
mount_fs() {
  case "$1" in
    bitmend-*) "$bin" mount "$dev" "$mnt" --nvram none --scrub-every 0 >/dev/null ;;
    jffs2) mount -t jffs2 mtd0 "$mnt" ;;
    ubifs) ubiattach -m 0 >/dev/null && mount -t ubifs ubi0:data "$mnt" ;;
    # UBIFS checks data nodes' CRCs on read only when asked (its default trusts the ECC).
    ubifs-crc) ubiattach -m 0 >/dev/null && mount -t ubifs -o chk_data_crc ubi0:data "$mnt" ;;
  esac
}
umount_fs() {
  case "$1" in
    bitmend-*) "$bin" umount "$mnt" ;;
    jffs2) umount "$mnt" ;;
    ubifs*) umount "$mnt"; ubidetach -m 0 >/dev/null ;;
  esac
}
# Everything durable: sync(2) does not reach a FUSE daemon.
sync_fs() { case "$1" in bitmend-*) "$bin" sync "$mnt" ;; *) sync ;; esac; }
used_kib() { df -k "$mnt" | awk 'NR == 2 { print $3 }'; }
timed_mount_ms() { local t0; t0=$(now); mount_fs "$1"; calc "($(now) - $t0) * 1000" 0; }

# Writes COUNT files of SIZE random bytes under DIR (1,000 to a folder) from number FIRST;
# stops at the first error (ENOSPC), or once the file STOP (if given) exists, and prints how
# many it wrote.
write_files() {
  python3 - "$@" <<'PY'
import os, sys
root, count, size, first = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
stop = sys.argv[5] if len(sys.argv) > 5 else None
done = 0
try:
    for i in range(first, first + count):
        if stop and os.path.exists(stop):
            break
        d = os.path.join(root, f"d{i // 1000}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i}"), "wb") as f:
            f.write(os.urandom(size))
        done += 1
except OSError:
    pass
print(done)
PY
}

# --- performance ------------------------------------------------------------------------
declare -A fig
rows=()
record() { # row, file system, figure
  [[ " ${rows[*]} " == *" $1 "* ]] || rows+=("$1")
  fig["$1|$2"]="$3"
}
files=1000; txns=15000; copies=1000; big=32; fills="10 30 50"
tree=/usr/lib/python3.11
if [ -n "$quick" ]; then files=100; txns=300; copies=50; big=2; fills="2 4"; tree=/usr/share/doc/fio; fi

perf_one() {
  local fs=$1 t0 t1 n=0 pct want got
  make_fs "$fs"
  mount_fs "$fs"
  say "$fs: a tree ($tree)"
  t0=$(now)
  tar -C "$(dirname "$tree")" --exclude=__pycache__ --exclude=site-packages --exclude=dist-packages \
    -cf - "$(basename "$tree")" | tar -C "$mnt" -xf -
  sync_fs "$fs"; t1=$(now)
  record "tree written + sync, s" "$fs" "$(calc "$t1 - $t0")"
  record "space the tree takes, KiB" "$fs" "$(used_kib)"
  rm -rf "${mnt:?}/$(basename "$tree")"; sync_fs "$fs"
  say "$fs: $copies copies of a 5 KB file"
  head -c 5000 /dev/urandom > "$work/five"
  mkdir "$mnt/copies"
  t0=$(now); for ((i = 0; i < copies; i++)); do cp "$work/five" "$mnt/copies/c$i"; done; sync_fs "$fs"; t1=$(now)
  record "$copies copies of a 5 KB file + sync, s" "$fs" "$(calc "$t1 - $t0")"
  rm -rf "$mnt/copies"; sync_fs "$fs"
  say "$fs: a $big MiB file"
  head -c $((big << 20)) /dev/urandom > "$work/big"
  t0=$(now); cp "$work/big" "$mnt/big"; sync_fs "$fs"; t1=$(now)
  record "$big MiB file written + sync, MB/s" "$fs" "$(calc "$big * 1.048576 / ($t1 - $t0)")"
  umount_fs "$fs"; mount_fs "$fs"
  t0=$(now); cmp "$work/big" "$mnt/big"; t1=$(now)
  record "$big MiB file read after a remount, MB/s" "$fs" "$(calc "$big * 1.048576 / ($t1 - $t0)")"
  rm -f "$mnt/big"; sync_fs "$fs"
  say "$fs: PostMark, $files files, $txns transactions"
  mkdir "$mnt/pm"
  printf 'set location %s\nset number %s\nset transactions %s\nset size 500 10000\nset read 4096\nset write 4096\nrun\nquit\n' \
    "$mnt/pm" "$files" "$txns" > "$work/pm"
  t0=$(now); (cd "$work" && postmark "$work/pm" >/dev/null); sync_fs "$fs"; t1=$(now)
  record "PostMark $files files $txns transactions + sync, s" "$fs" "$(calc "$t1 - $t0")"
  rm -rf "$mnt/pm"; sync_fs "$fs"
  for pct in $fills; do
    want=$(( chip_kib * pct / 100 / 2 - n ))
    say "$fs: filling to $pct% of the chip with 2 KB files ($want more)"
    got=$(write_files "$mnt/small" "$want" 2048 "$n")
    n=$((n + got))
    sync_fs "$fs"
    umount_fs "$fs"
    if [ "$got" -lt "$want" ]; then
      record "mount after a clean unmount, chip $pct% 2 KB files, ms" "$fs" "full"
      mount_fs "$fs"
      break
    fi
    record "mount after a clean unmount, chip $pct% 2 KB files, ms" "$fs" "$(timed_mount_ms "$fs")"
  done
  cut_and_mount "$fs"
  umount_fs "$fs"
}

# The power cut, the same for all three. nandsim's cells live in the VM's RAM and die with it,
# so the cut is scripts/vm/powercut's module (built by its build.sh): loaded mid-write, it makes
# the chip drop every later program and erase while reporting success, so the chip keeps what
# the moment of the cut left and the file system goes on unaware, as it would for the instant
# the power takes to fail. Then the file system is let go without a write reaching the chip
# (bitmend's daemon killed, its memory lost as in a power cut; the kernel's unmounted), the
# module unloaded, and the next mount timed. The files synced before the cut are checked.
powercut_ko="$here/../../target/vm/powercut/mtd_powercut.ko"
cut_row="mount after a power cut mid-write, ms"
cut_and_mount() {
  local fs=$1 writer synced=200 failed
  [ -f "$powercut_ko" ] || { record "$cut_row" "$fs" "no module"; return; }
  say "$fs: a power cut mid-write"
  write_files "$mnt/synced" "$synced" 2048 0 >/dev/null
  sync_fs "$fs"
  (cd "$mnt/synced" && find . -type f -exec sha256sum {} +) > "$work/synced.sums"
  rm -f "$work/stop"
  write_files "$mnt/cut" 100000 2048 0 "$work/stop" >/dev/null &
  writer=$!
  sleep 5
  "$modules/busybox" insmod "$powercut_ko"
  sleep 1
  case "$fs" in bitmend-*) pkill -9 -f "bitmend mount $dev" || true ;; esac
  touch "$work/stop"; wait "$writer" || true
  case "$fs" in
    bitmend-*) fusermount3 -u -z "$mnt" 2>/dev/null || true ;;
    *) umount_fs "$fs" ;;
  esac
  "$modules/busybox" rmmod mtd_powercut
  record "$cut_row" "$fs" "$(timed_mount_ms "$fs")"
  # sha256sum -c --quiet prints a line for each file missing, unreadable or wrong.
  failed=$( (cd "$mnt/synced" && sha256sum -c --quiet "$work/synced.sums") 2>/dev/null | grep -c . || true)
  [ -d "$mnt/synced" ] || failed=$synced
  record "files synced before the cut, intact after it" "$fs" "$((synced - failed))/$synced"
}

perf_table() {
  local r b j u rj ru
  printf '%-56s %11s %11s %9s %9s %9s %9s\n' "row" bitmend-raw bitmend-ecc jffs2 ubifs "raw/jffs2" "raw/ubifs"
  for r in "${rows[@]}"; do
    b=${fig["$r|bitmend-raw"]}; j=${fig["$r|jffs2"]}; u=${fig["$r|ubifs"]}
    ratio() { # better-is-higher ratio of bitmend-raw to a peer
      [[ "$1" =~ ^[0-9.]+$ && "$b" =~ ^[0-9.]+$ ]] && [ "$(calc "$1 * $b" 6)" != "0.000000" ] || { echo "-"; return; }
      if [[ "$r" == *"MB/s" ]]; then calc "$b / $1"; else calc "$1 / $b"; fi
    }
    rj=$(ratio "$j"); ru=$(ratio "$u")
    printf '%-56s %11s %11s %9s %9s %9s %9s\n' "$r" "$b" "${fig["$r|bitmend-ecc"]}" "$j" "$u" "$rj" "$ru"
  done
}

# --- faults ------------------------------------------------------------------------------
declare -A outcome met
fault_rows=()
# The same files on every file system: a real tree and some random ones, with their sums.
fault_files() {
  mkdir -p "$work/files"
  if [ ! -f "$work/manifest" ]; then
    tar -C /usr/share/doc -cf - fio python3.11 bash 2>/dev/null | tar -C "$work/files" -xf - || true
    (cd "$work/files" && for ((i = 0; i < 40; i++)); do head -c $(( (i * 7919) % 300000 + 1 )) /dev/urandom > "r$i"; done)
    (cd "$work/files" && find . -type f -exec sha256sum {} + | sort -k2) > "$work/manifest"
  fi
}
# Reads every file back: intact (its sum), refused (an error), wrong (no error, other bytes).
check_files() {
  local fs=$1 row=$2 intact=0 refused=0 wrong=0 sum name
  while read -r sum name; do
    if got=$(sha256sum 2>/dev/null < "$mnt/files/$name"); then
      if [ "${got%% *}" = "$sum" ]; then intact=$((intact + 1)); else wrong=$((wrong + 1)); fi
    else
      refused=$((refused + 1))
    fi
  done < "$work/manifest"
  [[ " ${fault_rows[*]} " == *" $row "* ]] || fault_rows+=("$row")
  outcome["$row|$fs"]="$intact/$refused/$wrong"
  say "$fs, $row: intact $intact, refused $refused, wrong $wrong"
}
# The chip loaded again with nandsim's fault knobs (empty: none).
reload_nandsim() {
  local i
  # A file system a fault turned read-only may still hold the chip: let it go first.
  for ((i = 0; i < 10; i++)); do
    "$modules/busybox" rmmod nandsim 2>/dev/null && break
    umount -l "$mnt" 2>/dev/null; ubidetach -m 0 >/dev/null 2>&1; sleep 1
  done
  # shellcheck disable=SC2086
  "$modules/busybox" insmod "$modules/nandsim.ko" $nandsim_params "$@"
}
put_files() { mkdir -p "$mnt/files"; cp -r "$work/files/." "$mnt/files/"; sync_fs "$1"; }
mount_or_record() { # fs row: mounts, or records every file refused if the mount fails
  if ! mount_fs "$1" 2>"$work/mount-err"; then
    say "$1, $2: the mount failed: $(head -c 300 "$work/mount-err")"
    [[ " ${fault_rows[*]} " == *" $2 "* ]] || fault_rows+=("$2")
    outcome["$2|$1"]="mount failed"
    if [[ "$1" == ubifs* ]]; then ubidetach -m 0 >/dev/null 2>&1 || true; fi
    return 1
  fi
}

# Stored bit flips: K bits, at random, in one programmed page of every erase block that holds data (the
# chip dumped without the kernel's ECC, bad blocks read as erased, shows which hold data).
# Prints how many pages got them.
flips_row() {
  local k=$1
  nanddump -n -q --bb=padbad -f "$work/chip" "$dev" 2>/dev/null
  python3 - "$work/chip" "$k" "$(cat /sys/class/mtd/mtd0/writesize)" \
      "$(cat /sys/class/mtd/mtd0/erasesize)" > "$work/flips" <<'PY'
import random, sys
chip, k, page, block = open(sys.argv[1], "rb").read(), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ppb = block // page
for b in range(len(chip) // block):
    p = b * ppb + (b * 7 + 3) % ppb
    if chip[p * page:(p + 1) * page].count(0xFF) == page:
        continue
    for bit in random.Random(b * 10007 + k).sample(range(page * 8), k):
        print(f"{bit % 8}@{p * page + bit // 8}")
PY
  [ -s "$work/flips" ] && xargs -n 1000 nandflipbits -q "$dev" < "$work/flips"
  echo $(( $(wc -l < "$work/flips") / k ))
}

# Makes the file system, writes the files REWRITES times over (a rewrite makes the cleaner
# erase), unmounts; false if any of it fails.
setup_files() {
  local fs=$1 rewrites=$2 n
  make_fs "$fs" || return 1
  mount_fs "$fs" || return 1
  for ((n = 0; n < rewrites; n++)); do
    rm -rf "$mnt/files" && put_files "$fs" || { umount_fs "$fs"; return 1; }
  done
  umount_fs "$fs"
}
# One row of nandsim's knobs: the chip loaded with PARAMS before the file system is made
# (nandsim's cells live in the module: a reload is an empty chip), then the files checked
# after a remount. The faults met are nandsim's own count of what it simulated, from the
# kernel's log (a lower bound when the log wraps).
knob_row() {
  local fs=$1 row=$2 params=$3 rewrites=$4
  reload_nandsim $params
  dmesg -C
  if ! setup_files "$fs" "$rewrites"; then
    say "$fs, $row: the file system could not be made and filled"
    [[ " ${fault_rows[*]} " == *" $row "* ]] || fault_rows+=("$row")
    outcome["$row|$fs"]="setup failed"
    if [[ "$fs" == ubifs* ]]; then umount "$mnt" 2>/dev/null; ubidetach -m 0 >/dev/null 2>&1 || true; fi
  elif mount_or_record "$fs" "$row"; then
    check_files "$fs" "$row"; umount_fs "$fs"
  fi
  met["$row|$fs"]=$(dmesg | grep -c 'simulating\|flipping bit' || true)
  say "$fs, $row: nandsim met ${met["$row|$fs"]} faults"
  reload_nandsim
}

faults_one() {
  local fs=$1 k n row
  for k in 1 8 64 1000; do
    row="$k bits flipped in one page of each block"
    setup_files "$fs" 1
    n=$(flips_row "$k")
    met["$row|$fs"]=$((n * k))
    mount_or_record "$fs" "$row" || continue
    check_files "$fs" "$row"; umount_fs "$fs"
  done
  knob_row "$fs" "1-4 random flips in 1 of 1,000 page reads" "bitflips=4" 1
  knob_row "$fs" "grave pages (1 in 8 blocks, noise after 2 reads)" "gravepages=$(grave_list)" 1
  knob_row "$fs" "weak pages (1 in 8 blocks, every program fails)" "weakpages=$(grave_list 0)" 1
  knob_row "$fs" "bad blocks (1 in 20, marked at load)" "badblocks=$(bad_list)" 1
  # Last: after it UBIFS (read-only) has been seen to keep the chip, which ends the run.
  knob_row "$fs" "weak blocks (1 in 16 fails its 3rd erase), files rewritten 16x" "weakblocks=$(weak_list)" 16
}
blocks_of_chip() { echo $(( $(cat /sys/class/mtd/mtd0/size) / $(cat /sys/class/mtd/mtd0/erasesize) )); }
ppb_of_chip() { echo $(( $(cat /sys/class/mtd/mtd0/erasesize) / $(cat /sys/class/mtd/mtd0/writesize) )); }
grave_list() { # one page in every 8th block, each with a count (default 2)
  local b l="" ppb; ppb=$(ppb_of_chip)
  for ((b = 3; b < $(blocks_of_chip); b += 8)); do l+="${l:+,}$(( b * ppb + (b * 5) % ppb )):${1:-2}"; done
  echo "$l"
}
weak_list() { local b l=""; for ((b = 5; b < $(blocks_of_chip); b += 16)); do l+="${l:+,}$b:2"; done; echo "$l"; }
bad_list() { local b l=""; for ((b = 7; b < $(blocks_of_chip); b += 20)); do l+="${l:+,}$b"; done; echo "$l"; }

faults_table() {
  local r fs cells
  echo "files intact/refused/wrong of $(wc -l < "$work/manifest") (refused: an error or missing; wrong: no error, other bytes), (faults met)"
  printf '%-62s' "fault"; printf ' %16s' bitmend-raw bitmend-ecc jffs2 ubifs ubifs-crc; echo
  for r in "${fault_rows[@]}"; do
    printf '%-62s' "$r"
    for fs in bitmend-raw bitmend-ecc jffs2 ubifs ubifs-crc; do
      cells="${outcome["$r|$fs"]:-}"
      [ -n "${met["$r|$fs"]:-}" ] && cells+=" (${met["$r|$fs"]})"
      printf ' %16s' "$cells"
    done
    echo
  done
}

dmesg -n 1 2>/dev/null || true # the ECC's complaints, one per page, would drown the output
# Mount time, the median of five, after a clean unmount with 30% of the chip in 2 KB files.
mounts_one() {
  local fs=$1 i t=()
  make_fs "$fs"; mount_fs "$fs"
  say "$fs: filling 30% of the chip with 2 KB files, then five mounts"
  write_files "$mnt/small" $(( chip_kib * 30 / 100 / 2 )) 2048 0 >/dev/null
  sync_fs "$fs"
  for ((i = 0; i < 5; i++)); do umount_fs "$fs"; t+=("$(timed_mount_ms "$fs")"); done
  umount_fs "$fs"
  record "mount after a clean unmount, chip 30% 2 KB files, median of 5, ms" "$fs" \
    "$(printf '%s\n' "${t[@]}" | sort -n | sed -n 3p)"
  say "$fs: mounts ${t[*]} ms"
}

# Mount time after a power cut, the median of three cuts, the chip 30% full.
cuts_one() {
  local fs=$1 i t=() kept=()
  make_fs "$fs"; mount_fs "$fs"
  say "$fs: filling 30% of the chip with 2 KB files, then three power cuts"
  write_files "$mnt/small" $(( chip_kib * 30 / 100 / 2 )) 2048 0 >/dev/null
  sync_fs "$fs"
  for ((i = 0; i < 3; i++)); do
    rm -rf "$mnt/synced" "$mnt/cut"; sync_fs "$fs"
    cut_and_mount "$fs"
    t+=("${fig["$cut_row|$fs"]}"); kept+=("${fig["files synced before the cut, intact after it|$fs"]}")
  done
  umount_fs "$fs"
  record "mount after a power cut mid-write, chip 30% 2 KB files, median of 3, ms" "$fs" \
    "$(printf '%s\n' "${t[@]}" | sort -n | sed -n 2p)"
  say "$fs: mounts after the cuts ${t[*]} ms; synced files intact ${kept[*]}"
}

say "chip: $(mtdinfo "$dev" | sed -n 's/^Amount of eraseblocks: *//p') ($chip_kib KiB), nandsim $nandsim_params"
if [ "$what" = perf ] || [ "$what" = all ]; then
  for fs in $fs_list; do perf_one "$fs"; done
  perf_table
fi
if [ "$what" = mounts ]; then
  for fs in $fs_list; do mounts_one "$fs"; done
  perf_table
fi
if [ "$what" = cuts ]; then
  for fs in $fs_list; do cuts_one "$fs"; done
  perf_table
fi
if [ "$what" = faults ] || [ "$what" = all ]; then
  fault_files
  # The table of what was measured, however the run ends.
  trap faults_table EXIT
  for fs in $fault_fs_list; do faults_one "$fs"; done
fi
