#!/usr/bin/env bash
# How long a request waits behind background work on a bitmend mount: a 4 KiB random reader of
# one file beside a 1 MiB writer of another (fio, psync, --direct-io mount), then the write-back
# thread's lock holds as the mount's control file reports them.
#
#   ./scripts/lock-holds.sh [--cleaning] [--runs N] [--bin PATH]
#
# Default: a 512 MiB image, a 64 MiB file read while another is written sequentially for 4 s
# (write-back and checkpoints, little cleaning). --cleaning: a 128 MiB image, an 80 MiB file
# overwritten at random for 6 s while an 8 MiB file is read (the cleaner at work). Each run
# prints the reader's rate and latency percentiles, the writer's rate, and the p50 / p99 / max
# of the write-back and cleaning steps' holds with the segments cleaned (in steps, and by the
# cleaner proper). Needs fio and fuse3. Builds bitmend (release) unless --bin is given.
set -euo pipefail
cd "$(dirname "$0")/.."

cleaning=0
runs=3
bin=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cleaning) cleaning=1; shift ;;
    --runs) runs="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "lock-holds: unknown argument $1 (see --help)"; exit 2 ;;
  esac
done
for tool in fio fusermount3 python3; do
  command -v $tool >/dev/null || { echo "lock-holds: $tool not found (apt-get install fio fuse3 python3)"; exit 1; }
done
if [ -z "$bin" ]; then
  cargo build --release --locked -q -p bitmend
  bin=target/release/bitmend
fi

work=$(mktemp -d /dev/shm/bitmend-lock-holds.XXXXXX)
cleanup() { fusermount3 -u "$work/mnt" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

if [ $cleaning = 1 ]; then
  size=128MiB; seconds=6; written=80M; read=8M; pattern=randwrite
else
  size=512MiB; seconds=4; written=128M; read=64M; pattern=write
fi

for run in $(seq "$runs"); do
  mkdir -p "$work/mnt"
  "$bin" mkfs "$work/fs.img" --size "$size" --force > /dev/null
  "$bin" mount "$work/fs.img" "$work/mnt" --direct-io > /dev/null
  if [ $cleaning = 1 ]; then
    dd if=/dev/urandom of="$work/mnt/a" bs=1M count=80 status=none
  fi
  dd if=/dev/urandom of="$work/mnt/b" bs=1M count="${read%M}" status=none
  sync
  cat > "$work/job.fio" <<JOB
[global]
ioengine=psync
time_based=1
runtime=$seconds
directory=$work/mnt
[writer]
filename=a
size=$written
bs=1m
rw=$pattern
[reader]
filename=b
size=$read
bs=4k
rw=randread
JOB
  fio "$work/job.fio" --output-format=json > "$work/out.json" 2>/dev/null
  cat "$work/mnt/.bitmend-scrub" > "$work/status.json"
  python3 - "$work/out.json" "$work/status.json" "$run" <<'PY'
import json, sys
fio = json.load(open(sys.argv[1]))
st = json.load(open(sys.argv[2]))
out = [f"run {sys.argv[3]}:"]
for job in fio["jobs"]:
    if job["jobname"] == "reader":
        r = job["read"]; p = r["clat_ns"]["percentile"]
        out.append("reader %.0f reads/s, p50 %.0f us, p99 %.2f ms, p99.9 %.2f ms, max %.1f ms;" % (
            r["iops"], p["50.000000"] / 1e3, p["99.000000"] / 1e6, p["99.900000"] / 1e6, r["clat_ns"]["max"] / 1e6))
    else:
        out.append("writer %.0f MB/s;" % (job["write"]["bw_bytes"] / 1e6))
hold = lambda k: "%s steps, hold p50 %.2f ms, p99 %.2f ms, max %.2f ms" % (
    st[k + "_steps"], st[k + "_hold_p50_us"] / 1e3, st[k + "_hold_p99_us"] / 1e3, st[k + "_hold_max_us"] / 1e3)
out.append("write-back: " + hold("write_back") + ";")
out.append("cleaning: " + hold("clean") + ";")
out.append("segments cleaned %s (%s in steps, the cleaner proper ran %s times)" % (
    st["segments_cleaned"], st["segments_cleaned_in_steps"], st["cleaner_runs"]))
print(" ".join(out))
PY
  "$bin" umount "$work/mnt" > /dev/null
done
