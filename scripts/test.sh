#!/usr/bin/env bash
# The test command (CI runs exactly this, through .ci/run): formatting, lints, docs, and every
# test of the workspace, doc tests included. Ends with cargo test's summary lines and their total.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
./scripts/setup.sh
# The outside reference (numpy) and the kernels' compile for GPU targets (clang-19) must run
# here, not be skipped.
export KVLAYOUT_REQUIRE_NUMPY=1
export KVLAYOUT_REQUIRE_CLANG=1
# NVRTC's libraries (setup.sh unpacks them): the CUDA backend's run-time compile is tested
# here, without a GPU. The CUDA and HIP backends themselves skip visibly without a device
# (scripts/gpu-check.sh runs them where there is one, with KVLAYOUT_REQUIRE_GPU).
export KVLAYOUT_REQUIRE_NVRTC=1
export LD_LIBRARY_PATH="$(./scripts/nvrtc-path.sh)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
# The CPU library as a user builds it: without the `bench` feature the benches turn on.
cargo clippy -p kvlayout-cpu --lib -- -D warnings
echo "== cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps
echo "== cargo test"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
# Every section below runs even when one before it failed (cargo test --no-fail-fast runs
# every test binary); the command fails at the end, after the total.
failed=0
# stderr too: the suites report what they skipped, and why, past the harness's capture.
# The NIXL engine's tests (tests/nixl.rs in kvlayout-connector, every one named nixl_*) are
# filtered out here (the binary's other test checks the refusal without the library) and run
# once, on their own, below.
cargo test --workspace --no-fail-fast -- --skip nixl_ 2>&1 | tee "$log" || failed=1
# Programs outside the workspace, as a user builds them: the CPU library with no C compiler,
# and the README's Rust programs (scripts/outside-build.sh).
./scripts/outside-build.sh 2>&1 | tee -a "$log" || failed=1
# The examples, each checking its own result (exit status 1 on a mismatch): a framework's
# caches described and its tensors checked; a decode on the CPU backend against the scalar
# reference; a TP 1 NHD to TP 2 HND pull, direct and staged.
cargo run -q -p kvlayout --example describe_cache 2>&1 | tee -a "$log" || failed=1
cargo run -q -p kvlayout-backends --example cpu_decode 2>&1 | tee -a "$log" || failed=1
cargo run -q -p kvlayout-connector --example pull_tp1_to_tp2 2>&1 | tee -a "$log" || failed=1
# The Python package: built and installed into the project's .venv as a user does (`pip
# install ./crates/kvlayout-py`), then its pytest suite and the README's Python example.
echo "== Python package (crates/kvlayout-py)"
./scripts/python-tests.sh 2>&1 | tee -a "$log" || failed=1
# The CPU backend's tests again under AddressSanitizer (its unsafe blocks: kernels, movers,
# writers), and the property tests, which also run the GPU kernels under the emulator (its
# build script instruments them with clang-19 there), where the image's nightly toolchain is
# present; a visible skip where it is not.
echo "== AddressSanitizer: the CPU backend's tests and the backend properties (cargo +nightly, -Zsanitizer=address)"
host="$(rustc -vV | sed -n 's/^host: //p')"
if [ "$host" = x86_64-unknown-linux-gnu ] && cargo +nightly --version >/dev/null 2>&1; then
    asan() {
        RUSTFLAGS="-Zsanitizer=address" CARGO_TARGET_DIR=target/asan \
            cargo +nightly test --no-fail-fast --target "$host" "$@" 2>&1 | tee -a "$log"
    }
    asan -p kvlayout-cpu --lib --tests || failed=1
    # Without use-after-return detection there: it maps a fake stack for every fiber (GPU
    # thread) the emulator starts, which takes minutes instead of seconds.
    ASAN_OPTIONS=detect_stack_use_after_return=0 \
        asan -p kvlayout-conformance --test backend_properties || failed=1
else
    echo "skipped: asan: no nightly toolchain for $host (rustup toolchain install nightly)" \
        | tee -a "$log"
fi
# The NIXL engine's tests, on their own: NIXL's runtime libraries (setup.sh unpacks them) go
# on LD_LIBRARY_PATH for this binary only, as the loader reads it when a process starts; UCX on
# loopback; a missing library fails instead of skipping. One test at a time
# (--test-threads=1): each test starts NIXL agents, whose progress threads keep a core busy
# each, and the two-process tests start a peer process; in parallel they would starve one
# another's bounded waits.
echo "== NIXL engine (kvlayout-connector tests/nixl.rs)"
LD_LIBRARY_PATH="$(./scripts/nixl-path.sh):${LD_LIBRARY_PATH}" UCX_NET_DEVICES=lo \
    KVLAYOUT_REQUIRE_NIXL=1 cargo test --workspace --no-fail-fast --test nixl -- nixl_ \
    --test-threads=1 2>&1 | tee -a "$log" || failed=1
# The CPU-dependent tests once more per host class this machine can imitate by hiding CPU
# features (AVX-512 without BF16, AVX2 only, no SIMD); each pass says what it hid.
./scripts/host-classes.sh 2>&1 | tee -a "$log" || failed=1

# cargo test's last summary is a crate with no doc tests ("0 passed"); close with the total of
# every summary above (cargo test's and pytest's), in the plain form CI reads. Skipped:
# ignored and skipped tests plus every `skipped: <what>: <why>` line (a backend, kernel build,
# host class or reference that could not run here).
awk '/^test result:/ { p += $4; f += $6; s += $8 }
     /^skipped: / { s += 1 }
     # pytest: "26 passed, 1 skipped in 0.47s" (its skip reasons are SKIPPED lines)
     /^=* *[0-9]+ (passed|failed|skipped|errors?)[ ,].* in [0-9.]+s/ {
         n = split($0, w, /[ ,=]+/)
         for (i = 1; i < n; i++) {
             if (w[i + 1] == "passed") p += w[i]
             if (w[i + 1] == "failed" || w[i + 1] ~ /^errors?$/) f += w[i]
             if (w[i + 1] == "skipped") s += w[i]
         }
     }
     END { printf "total: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"
exit "$failed"
