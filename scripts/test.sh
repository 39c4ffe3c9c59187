#!/usr/bin/env bash
# The whole test suite: formatting, lints, every test. The README's test command and CI's.
set -euo pipefail
cd "$(dirname "$0")/.."
# A from-scratch build gains nothing from incremental caches, which double the target dir.
export CARGO_INCREMENTAL=0
./scripts/setup.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings
cargo clippy -p bitmend --all-targets --locked -- -D warnings
# What a user installs (`cargo install --path crates/cli`) needs no anchor: none of the C
# libraries the benchmarks measure against, nor libclang to bind them.
if cargo tree -p bitmend -e normal,build --locked --prefix none | grep -E '^(bitmend-anchors|bitmend-bench|bindgen|isal-sys) '; then
  echo "test.sh: the default bitmend build depends on an anchor (above)" >&2
  exit 1
fi
# ...and built so, it links none of them; nor does a lower layer import a higher one.
cargo build -p bitmend --locked
./scripts/layers.sh
./scripts/parts.sh
BITMEND_REQUIRE_ANCHORS=1 BITMEND_REQUIRE_FUSE=1 cargo test --workspace --all-features --locked
# The mount under the POSIX suites, quick version (the full one: scripts/fuse-suites.sh).
./scripts/fuse-suites.sh --quick
# A real MTD chip: the kernel's nandsim in a VM (mkfs, files, fsx, stored bit flips, fsck,
# mount(8) and fstab through mount.bitmend).
./scripts/vm/run.sh scripts/vm/quick.sh target/debug/bitmend
