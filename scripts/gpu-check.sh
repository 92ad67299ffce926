#!/usr/bin/env bash
# The checks that need a GPU, on a machine with one (NVIDIA with a CUDA driver, or AMD with
# ROCm): builds, runs the conformance suite with the device backends required, the device
# crates' tests, the NIXL engine's tests with a CUDA cache's device memory (CUDA only),
# compute-sanitizer's memcheck where it is installed, and the benchmark
# (paged_decode beside a device-to-device copy, swap_blocks beside one pinned copy).
# Usage: scripts/gpu-check.sh [cuda|hip]   (default: cuda if nvidia-smi runs, else hip)
# Results to record go in design/gpu-backends.md, with the device and this command.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export CARGO_TERM_COLOR=never
export LD_LIBRARY_PATH="$(./scripts/nvrtc-path.sh)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
gpu="${1:-}"
if [ -z "$gpu" ]; then
    if nvidia-smi -L >/dev/null 2>&1; then gpu=cuda; else gpu=hip; fi
fi
case "$gpu" in cuda | hip) ;; *) echo "gpu-check: cuda or hip, not $gpu" >&2; exit 2 ;; esac
export KVLAYOUT_REQUIRE_GPU="$gpu" # the crate tests and the suite fail without that device

echo "== device"
if [ "$gpu" = cuda ]; then nvidia-smi -L || true; else rocminfo 2>/dev/null | grep -m2 -i "gfx" || true; fi
lscpu | sed -n 's/^Model name: *//p'

echo "== the device crate's tests ($gpu)"
cargo test --release -p "kvlayout-$gpu" 2>&1 | tee /tmp/kvlayout-gpu-check-crate.log
if [ "$gpu" = cuda ]; then
    echo "== NIXL: a CUDA cache's device memory registered and pulled (one test at a time)"
    LD_LIBRARY_PATH="$(./scripts/nixl-path.sh):${LD_LIBRARY_PATH}" UCX_NET_DEVICES=lo \
        KVLAYOUT_REQUIRE_NIXL=1 cargo test --release -p kvlayout-connector --test nixl -- \
        nixl_ --test-threads=1 2>&1 | tee /tmp/kvlayout-gpu-check-nixl.log
fi
echo "== the conformance suite, $gpu required"
cargo test --release -p kvlayout-conformance --test conformance 2>&1 \
    | tee /tmp/kvlayout-gpu-check-conformance.log

if [ "$gpu" = cuda ] && command -v compute-sanitizer >/dev/null 2>&1; then
    echo "== compute-sanitizer memcheck: the conformance suite"
    bin="$(cargo test --release -p kvlayout-conformance --test conformance --no-run \
        --message-format=json 2>/dev/null \
        | sed -n 's/.*"executable":"\([^"]*conformance-[^"]*\)".*/\1/p' | tail -1)"
    compute-sanitizer --tool memcheck --error-exitcode 1 --print-limit 20 "$bin"
else
    echo "skipped: compute-sanitizer: not installed here (or not a CUDA machine)"
fi

echo "== benchmark ($gpu)"
cargo run --release -q -p kvlayout-conformance --bin gpu_bench -- "$gpu"
