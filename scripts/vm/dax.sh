#!/usr/bin/env bash
# Inside the VM (scripts/vm/run.sh --pmem 512 --nandsim none scripts/vm/dax.sh [BITMEND]): the
# persistent heap on a real DAX device. QEMU's emulated NVDIMM is made an fsdax namespace
# (ndctl), ext4 is mounted on it with -o dax, and there:
# - `bitmend kv` creates, loads, checks and scrubs a pool that heals, and `kv stat` says its
#   writers map it with MAP_SYNC and persist with cache-line write-backs (the DAX path);
# - PMDK's own btree example runs on the same device, and libpmem's pmem_is_pmem says true
#   without PMEM_IS_PMEM_FORCE.
set -euo pipefail
bin="$(realpath "${1:-target/debug/bitmend}")"
work="$(mktemp -d)"
ndctl disable-region region0 >/dev/null
ndctl init-labels -f nmem0 >/dev/null
ndctl enable-region region0 >/dev/null
ndctl create-namespace -r region0 -m fsdax -a 2M -s 496M >/dev/null
mkfs.ext4 -q -F -b 4096 /dev/pmem0
mkdir -p "$work/pmem"
mount -o dax /dev/pmem0 "$work/pmem"
grep -q "$work/pmem .*dax" /proc/mounts || { echo "dax: ext4 did not mount with dax"; exit 1; }
pool="$work/pmem/kv.pool"
"$bin" kv create "$pool" --size 64MiB --stripes 8+2 >/dev/null
for i in $(seq 1 2000); do printf 'key%05d\tvalue %d %s\n' "$i" "$i" "$(printf '%0100d' "$i")"; done > "$work/words.tsv"
"$bin" kv load "$pool" "$work/words.tsv" >/dev/null
[ "$("$bin" kv count "$pool")" = 2000 ] || { echo "dax: the store does not hold 2,000 keys"; exit 1; }
"$bin" kv check "$pool" >/dev/null
"$bin" inject "$pool" lose --pages 2 --seed 7 >/dev/null
"$bin" kv scrub "$pool" --full >/dev/null
"$bin" kv dump "$pool" | wc -l | grep -qx 2000
"$bin" kv check "$pool" >/dev/null
"$bin" kv stat "$pool" --json | grep -q '"dax": true' || { echo "dax: kv stat says the pool is not mapped directly"; exit 1; }
echo "dax: bitmend kv: 2,000 keys loaded, 2 pages lost and rebuilt by a scrub, check clean; writers map the pool with MAP_SYNC"
# PMDK on the same device.
examples=/usr/share/doc/libpmemobj-dev/examples
# The example's one helper from PMDK's source tree, which the package does not ship.
printf '#include <unistd.h>\nstatic inline int file_exists(const char *p) { return access(p, F_OK); }\n' > "$work/ex_common.h"
cc -O2 -I"$work" -o "$work/btree" "$examples/btree.c" -lpmemobj
cat > "$work/is_pmem.c" <<'C'
#include <libpmem.h>
#include <stdio.h>
int main(int argc, char **argv) {
    size_t len; int is_pmem;
    void *p = pmem_map_file(argv[1], 1 << 20, PMEM_FILE_CREATE, 0600, &len, &is_pmem);
    if (!p) { perror("pmem_map_file"); return 2; }
    printf("%d\n", pmem_is_pmem(p, len) && is_pmem);
    return 0;
}
C
cc -O2 -o "$work/is_pmem" "$work/is_pmem.c" -lpmem
unset PMEM_IS_PMEM_FORCE
[ "$("$work/is_pmem" "$work/pmem/probe")" = 1 ] || { echo "dax: libpmem does not take the device for pmem"; exit 1; }
for i in $(seq 1 200); do "$work/btree" "$work/pmem/btree.pool" i "$i" "v$i" >/dev/null; done
"$work/btree" "$work/pmem/btree.pool" f 150 | grep -q v150 || { echo "dax: PMDK's btree lost a key"; exit 1; }
echo "dax: PMDK: pmem_is_pmem is true without PMEM_IS_PMEM_FORCE; its btree example took 200 keys on the device"
umount "$work/pmem"
