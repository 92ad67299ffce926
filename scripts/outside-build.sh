#!/usr/bin/env bash
# Programs outside the workspace, as a user writes them, each in a crate of its own that
# depends on the workspace's crates by path, built and run:
#   1. scripts/outside/main.rs on kvlayout and kvlayout-cpu, with no C compiler for the build
#      scripts (CC, CXX: /bin/false, which cc-rs would call): the CPU library without its
#      `bench` feature compiles no C. (rustc still links through the system's linker.)
#   2. The README's Rust programs: each ```rust block after a `<!-- kvlayout-rust-program:
#      NAME -->` line becomes binary NAME of a crate on kvlayout, kvlayout-cpu,
#      kvlayout-backends and kvlayout-connector (these build C and C++: the GPU emulator, the
#      NIXL stubs).
# Both share the workspace's target directory and lock file, so the dependencies already
# built are reused; offline. Exit status: the first failure's.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"

# A crate at $dir/$1 depending on the crates $2.. by path.
new_crate() {
    local at="$dir/$1"
    shift
    mkdir -p "$at/src/bin"
    cp "$root/Cargo.lock" "$at/Cargo.lock"
    {
        printf '[package]\nname = "kvlayout-outside"\nversion = "0.0.0"\nedition = "2021"\n'
        printf 'publish = false\n\n[dependencies]\n'
        for c in "$@"; do printf '%s = { path = "%s/crates/%s" }\n' "$c" "$root" "$c"; done
        printf '\n# A workspace of its own.\n[workspace]\n'
    } >"$at/Cargo.toml"
}

new_crate cpu kvlayout kvlayout-cpu
cp "$root/scripts/outside/main.rs" "$dir/cpu/src/main.rs"
CC=/bin/false CXX=/bin/false cargo run -q --offline --manifest-path "$dir/cpu/Cargo.toml"

new_crate readme kvlayout kvlayout-cpu kvlayout-backends kvlayout-connector
echo 'fn main() {}' >"$dir/readme/src/main.rs"
names="$(python3 - "$root/README.md" "$dir/readme/src/bin" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
found = re.findall(r"<!-- kvlayout-rust-program: ([a-z0-9_-]+) -->\n```rust\n(.*?)```", text, re.S)
if not found:
    sys.exit("README.md: no <!-- kvlayout-rust-program: NAME --> rust blocks")
for name, body in found:
    open(f"{sys.argv[2]}/{name}.rs", "w").write(body)
    print(name)
PY
)"
cargo build -q --offline --manifest-path "$dir/readme/Cargo.toml" --bins
for name in $names; do
    echo "== README.md's Rust program '$name', outside the workspace"
    cargo run -q --offline --manifest-path "$dir/readme/Cargo.toml" --bin "$name"
done
