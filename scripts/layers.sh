#!/usr/bin/env bash
# The layers, checked: a lower layer never names a higher one (docs/DESIGN.md, "Two layers in
# the flash crate"). Crates: code < media < nvlog < heap, and media < flashfs; the NVRAM
# tier joins heap and flashfs; all below the cli; the benchmarks and their anchors sit beside the cli, behind its `bench` feature.
# Inside flashfs: store < fs.
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0

# Within flashfs: nothing in store/ may reach into fs/.
if grep -rnE 'crate::fs\b|crate::(Fs|FsOptions|Inode|Attr|FileType)\b|super::super' crates/flashfs/src/store/; then
  echo "layers: crates/flashfs/src/store/ imports the file system (above)" >&2
  fail=1
fi

# Between crates: each crate's bitmend dependencies must be below it.
allowed() {
  case "$1" in
    code) echo "" ;;
    media) echo "code" ;;
    nvlog | flashfs) echo "code media" ;;
    heap) echo "code media nvlog" ;;
    tier) echo "code media nvlog heap flashfs" ;;
    anchors) echo "code media" ;;
    bench) echo "code media nvlog heap flashfs tier anchors" ;;
    cli) echo "code media nvlog heap flashfs tier anchors bench" ;;
  esac
}
for crate in code media nvlog heap tier flashfs anchors bench cli; do
  deps=$(sed -n '/^\[dependencies\]/,/^\[/p' "crates/$crate/Cargo.toml" | grep -oE '^bitmend-[a-z]+' | sed 's/bitmend-//' || true)
  for d in $deps; do
    if ! grep -qw "$d" <<<"$(allowed "$crate")"; then
      echo "layers: crates/$crate depends on bitmend-$d, a layer above or beside it" >&2
      fail=1
    fi
  done
done

# The user's binary links none of the anchors' C libraries.
if [ -x target/debug/bitmend ] && ldd target/debug/bitmend | grep -E 'libisal|libpmem|libclang'; then
  echo "layers: the default bitmend binary links an anchor library (above)" >&2
  fail=1
fi
exit $fail
