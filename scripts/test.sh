#!/usr/bin/env bash
# The test command: formatting, lints, docs, and every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
./scripts/setup.sh
# The outside reference (numpy) must run here, not be skipped.
export KVLAYOUT_REQUIRE_NUMPY=1

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
echo "== cargo test"
# Later: the NIXL binary runs separately with --test-threads=1.
cargo test --workspace
