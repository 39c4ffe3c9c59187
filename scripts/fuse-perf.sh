#!/usr/bin/env bash
# fio, dbench and PostMark on a bitmend mount, beside the same runs on tmpfs through two
# passthrough FUSE file systems, the floor any FUSE file system pays on this machine:
# libfuse's own example passthrough_ll (the anchor: built here from libfuse3-dev's examples,
# run with its defaults, multi-threaded, splicing its reads), and bitmend-passthrough (the
# same FUSE library, session and mount options as bitmend's, so it isolates file system
# work from plumbing). Not part of CI: a full run takes about 30 minutes.
#
#   ./scripts/fuse-perf.sh [--runs N] [--seconds S] [--only REGEX] [--no-tier-too] [--supervised-too] [--threads T] [--dir DIR]
#
# Medians of N runs (default 3), S s per fio job at most (each job is one pass over a 64 MiB
# file); --only runs the cases whose name matches REGEX (PostMark is "PostMark", dbench
# "dbench"); --no-tier-too adds bitmend without its NVRAM tier (--nvram none: every fsync
# writes to flash), to show what the tier buys; --supervised-too adds bitmend under its
# supervisor (mount --supervise: every request and reply relayed once more); --threads serves bitmend's and
# bitmend-passthrough's requests from T threads (default: their own default, 2;
# passthrough_ll starts threads as it needs them, up to 10); --dir puts the bitmend image and
# the passthroughs' directories in DIR instead of /dev/shm (a disk's file system: the fair
# floor for an image on that disk is the passthroughs over the same file system; the NVRAM
# tier stays in /dev/shm, as NVRAM would).
#
# By default all run on RAM: the bitmend image (a NAND image file) and the passthroughs'
# directories live in /dev/shm, so the figures compare file system work (signatures, parity,
# compression, the log), not disks. Output: one table row per case, median MB/s (fio, dbench) or
# transactions/s (PostMark) of each system, and bitmend's ratio to each passthrough (above 1:
# bitmend is faster). Needs fuse3, libfuse3-dev, a C compiler, fio, dbench and postmark (apt).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=3
seconds=10
only=.
systems=(bitmend passthrough_ll bitmend-passthrough)
threads=()
base=/dev/shm
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    --no-tier-too) systems=("${systems[@]:0:1}" no-tier "${systems[@]:1}"); shift ;;
    --supervised-too) systems=("${systems[@]:0:1}" supervised "${systems[@]:1}"); shift ;;
    --threads) threads=(--threads "$2"); shift 2 ;;
    --dir) base="$2"; shift 2 ;;
    *) sed -n '2,28p' "$0"; exit 2 ;;
  esac
done
for tool in fio postmark dbench fusermount3 cc pkg-config; do
  command -v $tool >/dev/null || { echo "fuse-perf: $tool not found (apt-get install fio postmark dbench fuse3 libfuse3-dev gcc pkg-config)"; exit 1; }
done
examples=/usr/share/doc/libfuse3-dev/examples
[ -f "$examples/passthrough_ll.c" ] || { echo "fuse-perf: $examples/passthrough_ll.c not found (apt-get install libfuse3-dev)"; exit 1; }
cargo build --quiet --release -p bitmend -p bitmend-bench
bin="$PWD/target/release/bitmend"
pass="$PWD/target/release/bitmend-passthrough"
[ -d "$base" ] || { echo "fuse-perf: --dir $base: no such directory"; exit 1; }
work=$(mktemp -d "$base/bitmend-perf.XXXXXX")
# libfuse's example, as its Makefile builds it (-O2), against the installed libfuse.
ll="$work/passthrough_ll"
cc -O2 -Wall -o "$ll" "$examples/passthrough_ll.c" $(pkg-config fuse3 --cflags --libs) \
  || { echo "fuse-perf: passthrough_ll did not build"; exit 1; }
results="$work/results.tsv"
cleanup() {
  for m in "$work"/mnt-*; do
    if mountpoint -q "$m" 2>/dev/null; then fusermount3 -u "$m" || true; fi
  done
  rm -rf "$work"
}
trap cleanup EXIT

# Mounts system $1 (bitmend | no-tier | supervised | passthrough_ll | bitmend-passthrough) at
# $work/mnt-$1, fresh.
mount_fresh() {
  local m="$work/mnt-$1"
  mkdir -p "$m"
  if [ "$1" = passthrough_ll ]; then
    rm -rf "$work/src" && mkdir "$work/src"
    "$ll" -f -o source="$work/src" "$m" 2> "$work/ll.log" &
    for _ in $(seq 50); do mountpoint -q "$m" && break; sleep 0.1; done
  elif [ "$1" != bitmend-passthrough ]; then
    rm -f "$work/fs.img"
    "$bin" mkfs "$work/fs.img" --size 256MiB --force > /dev/null
    local tier=()
    [ "$1" = no-tier ] && tier=(--nvram none)
    [ "$1" = supervised ] && tier=(--supervise)
    "$bin" mount "$work/fs.img" "$m" "${tier[@]}" "${threads[@]}" > /dev/null
  else
    rm -rf "$work/src" && mkdir "$work/src"
    "$pass" "${threads[@]}" "$work/src" "$m" 2> "$work/pass.log" &
    for _ in $(seq 50); do mountpoint -q "$m" && break; sleep 0.1; done
  fi
  mountpoint -q "$m" || { echo "fuse-perf: $1 did not mount"; exit 1; }
}

unmount() {
  fusermount3 -u "$work/mnt-$1"
  # bitmend's daemon writes everything out before it lets go of the image.
  if [ "$1" = bitmend ] || [ "$1" = no-tier ] || [ "$1" = supervised ]; then
    for _ in $(seq 100); do "$bin" stat "$work/fs.img" > /dev/null 2>&1 && break; sleep 0.2; done
  fi
}

# fio on system $1: name, rw, bs, then fio's own options (--fsync=N: after every N writes;
# --end_fsync=1: once at the end, timed). Prints MB/s.
fio_case() {
  local sys=$1 name=$2 rw=$3 bs=$4
  shift 4
  mount_fresh "$sys"
  local out="$work/fio.json"
  # Reads need a file laid out first; fio writes it before timing starts.
  fio --name="$name" --directory="$work/mnt-$sys" --size=64M --bs="$bs" --rw="$rw" \
    --ioengine=psync "$@" --runtime="$seconds" --time_based=0 \
    --randrepeat=1 --output-format=json > "$out" 2> "$work/fio.err" \
    || { cat "$work/fio.err"; exit 1; }
  unmount "$sys"
  python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
side = j["write"] if j["write"]["io_bytes"] > 0 else j["read"]
print("%.1f" % (side["bw_bytes"] / 1e6))' "$out"
}

# dbench on system $1: 2 clients for S s of its standard load. Prints MB/s.
dbench_case() {
  local sys=$1
  mount_fresh "$sys"
  local out
  out=$(dbench -D "$work/mnt-$sys" -t "$seconds" -c /usr/share/dbench/client.txt 2 2>&1)
  unmount "$sys"
  echo "$out" | sed -nE 's/^Throughput ([0-9.]+) MB\/sec.*/\1/p'
}

# PostMark on system $1: 3,000 files of 500 B to 10 KB, 20,000 transactions. Prints its
# transactions/s (whole seconds as it counts them) and the whole run's wall time in s.
postmark_case() {
  local sys=$1
  mount_fresh "$sys"
  local out t0 t1
  t0=$(date +%s.%N)
  out=$(printf 'set location %s\nset number 3000\nset transactions 20000\nset size 500 10000\nset seed 42\nrun\nquit\n' \
    "$work/mnt-$sys" | postmark)
  t1=$(date +%s.%N)
  unmount "$sys"
  echo "$(echo "$out" | sed -nE 's/.*seconds of transactions \(([0-9]+) per second\).*/\1/p') $(echo "$t1 - $t0" | bc -l)"
}

cases=(
  "seq write 1MiB, fsync at end|write|1m|--end_fsync=1"
  "seq write 1MiB, fsync each|write|1m|--fsync=1"
  "seq read 1MiB|read|1m|"
  "seq write 4KiB|write|4k|"
  "seq read 4KiB|read|4k|"
  "rand read 4KiB|randread|4k|"
  "rand write 4KiB|randwrite|4k|"
  "rand write 4KiB, fsync every 32|randwrite|4k|--fsync=32"
  "rand write 4KiB, fsync each|randwrite|4k|--fsync=1"
  "rand write 1MiB|randwrite|1m|"
  "rand read 1MiB|randread|1m|"
)
: > "$results"
for run in $(seq "$runs"); do
  for c in "${cases[@]}"; do
    IFS='|' read -r name rw bs extra <<< "$c"
    [[ "$name" =~ $only ]] || continue
    for sys in "${systems[@]}"; do
      label=${name//[ ,]/-}
      v=$(fio_case "$sys" "$label" "$rw" "$bs" $extra)
      printf '%s\t%s\t%s\tMB/s\n' "$name" "$sys" "$v" >> "$results"
      echo "run $run: $name, $sys: $v MB/s" >&2
    done
  done
  if [[ dbench =~ $only ]]; then
    for sys in "${systems[@]}"; do
      v=$(dbench_case "$sys")
      printf 'dbench, 2 clients\t%s\t%s\tMB/s\n' "$sys" "$v" >> "$results"
      echo "run $run: dbench, $sys: $v MB/s" >&2
    done
  fi
  [[ PostMark =~ $only ]] || continue
  for sys in "${systems[@]}"; do
    read -r tps wall <<< "$(postmark_case "$sys")"
    printf 'PostMark 3000 files 20000 txns\t%s\t%s\ttxn/s\n' "$sys" "$tps" >> "$results"
    printf 'PostMark whole run, wall time\t%s\t%s\ts\n' "$sys" "$wall" >> "$results"
    echo "run $run: PostMark, $sys: $tps txn/s, $wall s in all" >&2
  done
done

python3 - "$results" "$runs" "$(df --output=fstype "$work" | tail -1) at $base" "${systems[@]}" <<'PY'
import statistics, sys
systems = sys.argv[4:]
rows = {}
order = []
for line in open(sys.argv[1]):
    case, sys_, v, unit = line.rstrip("\n").split("\t")
    if case not in rows:
        order.append(case)
        rows[case] = {"unit": unit, **{s: [] for s in systems}}
    rows[case][sys_].append(float(v) if v else float("nan"))
where = sys.argv[3]
print(f"medians of {sys.argv[2]} runs, in {where}; passthrough_ll = {where} through libfuse's example (the anchor),"
      f" bitmend-passthrough = {where} through ours; ratios: above 1, bitmend is faster")
floors = ["passthrough_ll", "bitmend-passthrough"]
short = {"passthrough_ll": "ll", "bitmend-passthrough": "ours-pt"}
ours = [s for s in systems if s not in floors]
pairs = [(s, f) for s in ours for f in floors]
head = "".join(f"{s:>20}" for s in systems) + f" {'unit':>6}" + "".join(f"{s + '/' + short[f]:>22}" for s, f in pairs)
print(f"{'case':34}{head}")
for case in order:
    r = rows[case]
    m = {s: statistics.median(r[s]) for s in systems}
    ratio = lambda s, f: m[f] / m[s] if r["unit"] == "s" else m[s] / m[f]
    line = "".join(f"{m[s]:20.1f}" for s in systems) + f" {r['unit']:>6}" + "".join(f"{ratio(s, f):22.2f}" for s, f in pairs)
    print(f"{case:34}{line}")
PY
