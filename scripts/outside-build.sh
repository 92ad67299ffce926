#!/usr/bin/env bash
# Builds and runs a program outside the workspace that depends on kvlayout and kvlayout-cpu by
# path, as a user's does (scripts/outside/main.rs), with no C compiler (CC, CXX: /bin/false):
# the CPU library without its `bench` feature compiles no C. It shares the workspace's target
# directory and lock file, so the dependencies already built are reused; offline.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
mkdir "$dir/src"
cp "$root/scripts/outside/main.rs" "$dir/src/main.rs"
cp "$root/Cargo.lock" "$dir/Cargo.lock"
cat >"$dir/Cargo.toml" <<TOML
[package]
name = "kvlayout-outside"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
kvlayout = { path = "$root/crates/kvlayout" }
kvlayout-cpu = { path = "$root/crates/kvlayout-cpu" }

# A workspace of its own.
[workspace]
TOML
CC=/bin/false CXX=/bin/false CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}" \
    cargo run -q --offline --manifest-path "$dir/Cargo.toml"
