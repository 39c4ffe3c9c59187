#!/usr/bin/env bash
# Where a fio job's time goes on a bitmend mount: both CPUs sampled (perf) while the job runs,
# each sample put in one part of the path by the function it was in (the signatures, the
# parity, CRC-32C, compression, the copies, allocation, the kernel's FUSE and scheduling work,
# the image's page faults), and by thread (the program, the request threads, the write-back
# thread, the image's write-ahead thread, idle). Not part of CI.
#
#   ./scripts/fuse-profile.sh [--engine NAME] [--job "RW BS [FIO OPTIONS]"] [--size SIZE] [--runs N] [--dir DIR] [--bin PATH]
#
# --engine runs the mount's Galois-field kernels as NAME (BITMEND_ENGINE: scalar, ssse3, avx2,
# avx512, gfni), so a machine with GFNI shows what an AVX2-only one pays for signatures and
# parity (CRC-32C and compression run as the CPU allows either way). --job is fio's rw, block
# size and options (default "write 1m --end_fsync=1"); each run makes a fresh 1 GiB image in
# /dev/shm, and samples the job from its start to its end over a SIZE file (default 512M;
# a read job's file is laid out first, unsampled); --dir puts the image in DIR (a disk's file
# system) instead, the NVRAM tier staying in /dev/shm as NVRAM would. Prints the job's MB/s
# and each part's share of both CPUs' time, medians of N runs (default 3; the machine is
# noisy and sampling perturbs it). Needs perf, fio and fuse3. Builds bitmend
# (release) unless --bin is given.
set -euo pipefail
cd "$(dirname "$0")/.."

engine=""
job="write 1m --end_fsync=1"
size=512M
runs=3
base=/dev/shm
bin=""
while [ $# -gt 0 ]; do
  case "$1" in
    --engine) engine="$2"; shift 2 ;;
    --job) job="$2"; shift 2 ;;
    --size) size="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --dir) base="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "fuse-profile: unknown argument $1 (see --help)"; exit 2 ;;
  esac
done
for tool in perf fio fusermount3 python3; do
  command -v $tool >/dev/null || { echo "fuse-profile: $tool not found (apt-get install linux-perf fio fuse3 python3)"; exit 1; }
done
if [ -z "$bin" ]; then
  cargo build --release --locked -q -p bitmend
  bin=target/release/bitmend
fi
if [ -n "$engine" ]; then
  # The mount falls back to the fastest engine when the named one cannot run: refuse instead.
  flag=$engine
  case "$engine" in scalar) flag="" ;; avx512) flag=avx512bw ;; esac
  if [ -n "$flag" ] && ! grep -qw "$flag" /proc/cpuinfo; then
    echo "fuse-profile: this CPU cannot run the $engine engine"; exit 2
  fi
  export BITMEND_ENGINE="$engine"
fi

[ -d "$base" ] || { echo "fuse-profile: --dir $base: no such directory"; exit 2; }
work=$(mktemp -d "$base/bitmend-profile.XXXXXX")
cleanup() { fusermount3 -u "$work/mnt" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
mkdir "$work/mnt"
read -r rw bs opts <<< "$job"

# One run: a fresh image and mount, the job sampled, its report and fio's figures in $work/$1.
profile_once() {
  local out="$work/$1"
  mkdir "$out"
  "$bin" mkfs "$work/fs.img" --size 1GiB --force > /dev/null
  "$bin" mount "$work/fs.img" "$work/mnt" > /dev/null
  # Reads need their file laid out before the samples start.
  if [[ "$rw" == *read* ]]; then
    fio --name=job --directory="$work/mnt" --size="$size" --bs=1m --rw=write --ioengine=psync \
      --output-format=terse > /dev/null
  fi
  # The samples cover the job from its start to its end (its fsync included), nothing else.
  # shellcheck disable=SC2086 # the job's options are words
  perf record -a -F 2000 -o "$out/perf.data" -- \
    fio --name=job --directory="$work/mnt" --size="$size" --bs="$bs" --rw="$rw" --ioengine=psync $opts \
    --randrepeat=1 --output-format=json --output="$out/fio.json" > /dev/null 2> "$out/perf.err" \
    || { cat "$out/perf.err"; exit 1; }
  perf report -i "$out/perf.data" --no-children --sort comm,dso,sym -g none --stdio --percent-limit 0 \
    2> /dev/null > "$out/report.txt"
  rm "$out/perf.data"
  fusermount3 -u "$work/mnt"
  # The daemon writes everything out before it lets go of the image.
  for _ in $(seq 100); do "$bin" stat "$work/fs.img" > /dev/null 2>&1 && break; sleep 0.2; done
  rm -f "$work/fs.img"
}
for run in $(seq "$runs"); do
  profile_once "run$run"
  echo "fuse-profile: run $run of $runs done" >&2
done

python3 - "$work" "$runs" "$job" "${engine:-the fastest}" <<'PY'
import json, re, statistics, sys
work, runs, job, engine = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
# Parts by the function a sample was in, first match wins.
parts = [
    ("signatures", r"horner|sig_fold|sig_sign|sig_update|signature"),
    ("parity", r"dot_cols|dot_prod|mul_acc|parity|gf::"),
    ("CRC-32C", r"crc"),
    ("compression", r"ZSTD|LZ4|HUF_|FSE_|zstd|lz4"),
    ("copies", r"memmove|memcpy|memset|write_streaming|write_at|Chip.*program|copy_|clear_page"),
    ("allocation", r"malloc|_int_free|cfree|realloc|unlink_chunk"),
]
def who_of(comm):
    if comm == "swapper":
        return "idle"
    if comm == "fio":
        return "the program (fio)"
    if comm.startswith("fuser"):
        return "request threads"
    if comm == "bitmend-ahead":
        return "image write-ahead"
    return "write-back and the rest of bitmend" if comm.startswith("bitmend") else "other"
def one(run):
    j = json.load(open(f"{work}/run{run}/fio.json"))["jobs"][0]
    side = j["write"] if j["write"]["io_bytes"] > 0 else j["read"]
    threads, shares, rest = {}, {}, {}
    for line in open(f"{work}/run{run}/report.txt"):
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+(\S+)\s+\[(.)\]\s+(.*)", line)
        if not m:
            continue
        pct, comm, kind, sym = float(m[1]), m[2], m[4], m[5]
        who = who_of(comm)
        threads[who] = threads.get(who, 0) + pct
        if who == "idle":
            part = "idle"
        elif who in ("the program (fio)", "other"):
            part = "the program and others"
        else:
            part = next((name for name, rx in parts if re.search(rx, sym)), None)
            if part is None:
                part = "kernel (FUSE, scheduling, page faults)" if kind == "k" else "bitmend, the rest"
            if part.endswith(", the rest") or part.startswith("kernel"):
                rest[(part[:6], sym)] = rest.get((part[:6], sym), 0) + pct
        shares[part] = shares.get(part, 0) + pct
    return side["bw_bytes"] / 1e6, threads, shares, rest
results = [one(r) for r in range(1, runs + 1)]
def medians(i):
    keys = {k for r in results for k in r[i]}
    return sorted(((k, statistics.median(r[i].get(k, 0.0) for r in results)) for k in keys), key=lambda kv: -kv[1])
rates = sorted(r[0] for r in results)
print(f"fio {job}: {statistics.median(rates):.1f} MB/s (runs: {', '.join(f'{x:.0f}' for x in rates)}); engine {engine}")
print("by thread, share of both CPUs' time (medians):")
for k, v in medians(1):
    print(f"  {k:40} {v:5.1f}%")
print("by part (bitmend's threads; the program's and idle time apart):")
for k, v in medians(2):
    print(f"  {k:40} {v:5.1f}%")
print("the largest functions of the last two parts (medians):")
for (part, sym), v in medians(3)[:12]:
    print(f"  {v:5.1f}%  {part:7} {sym[:100]}")
PY
