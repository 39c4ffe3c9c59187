#!/usr/bin/env bash
# The whole test suite: formatting, lints, every test. The README's test command and CI's.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
BITMEND_REQUIRE_ANCHORS=1 BITMEND_REQUIRE_FUSE=1 cargo test --workspace --locked
# The mount under the POSIX suites, quick version (the full one: scripts/fuse-suites.sh).
./scripts/fuse-suites.sh --quick
