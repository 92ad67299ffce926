#!/usr/bin/env bash
# Mutation testing with cargo-mutants: plant one small bug at a time in the code the suite must
# guard most, run the tests that guard it, and list the bugs nothing caught. Not in CI (every
# mutant is a rebuild and a test run: hours for all of them); a session runs it with a budget
# and records the result in design/testing.md.
#
#   ./scripts/mutants.sh                 # every phase, MUTANTS_BUDGET_S seconds each (1800)
#   MUTANTS_BUDGET_S=600 ./scripts/mutants.sh descriptor
#   ./scripts/mutants.sh cpu-checks crates/kvlayout-cpu/src/cache.rs   # one phase, chosen files
#
# Phases:
#   descriptor  address maps, kernel arguments, validation, op checks and move plans of
#               `kvlayout`, tested by the conformance crate's properties, anchors, ABI, fuzz
#               and conformance tests;
#   cpu-checks  the CPU backend's argument checks, caches and tolerances, tested by the
#               conformance crate's conformance (its refusals) and CPU property tests;
#   cpu-rows    the CPU decode's row addressing, tested by the CPU backend's unit and
#               integration tests.
# (cargo-mutants applies named test targets to every package it tests, so one per phase.)
# Results: target/mutants/<phase>/mutants.out/{caught,missed,timeout,unviable}.txt and a
# summary line per phase. A phase that runs out of budget stops and summarizes what it ran.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=27.1.0
if ! cargo mutants --version 2>/dev/null | grep -q "$VERSION"; then
    echo "mutants: cargo install cargo-mutants@$VERSION" >&2
    cargo install --locked "cargo-mutants@$VERSION"
fi

budget="${MUTANTS_BUDGET_S:-1800}"
# The fuzz test's own budget, per mutant.
export KVLAYOUT_FUZZ_SECONDS=2

descriptor_files=(
    crates/kvlayout/src/abi.rs
    crates/kvlayout/src/field_map.rs
    crates/kvlayout/src/ops/check.rs
    crates/kvlayout/src/ops/moves.rs
    crates/kvlayout/src/ops/dynamic/mod.rs
    crates/kvlayout/src/layout.rs
    crates/kvlayout/src/view.rs
    crates/kvlayout/src/regions.rs
)
cpu_check_files=(
    crates/kvlayout-cpu/src/tensor.rs
    crates/kvlayout-cpu/src/cache.rs
    crates/kvlayout-cpu/src/tolerance.rs
)
cpu_row_files=(
    crates/kvlayout-cpu/src/decode/src.rs
)

run_phase() {
    local phase="$1"
    shift
    local files=("$@") test_args=()
    case "$phase" in
        descriptor)
            test_args=(--test-package kvlayout-conformance
                --cargo-test-arg=--test=properties --cargo-test-arg=--test=anchors
                --cargo-test-arg=--test=abi --cargo-test-arg=--test=fuzz
                --cargo-test-arg=--test=conformance) ;;
        cpu-checks)
            test_args=(--test-package kvlayout-conformance
                --cargo-test-arg=--test=conformance --cargo-test-arg=--test=backend_properties) ;;
        cpu-rows)
            test_args=(--test-package kvlayout-cpu
                --cargo-test-arg=--lib --cargo-test-arg=--test=hostile
                --cargo-test-arg=--test=movers --cargo-test-arg=--test=write) ;;
        *) echo "mutants: unknown phase $phase (descriptor, cpu-checks, cpu-rows)" >&2; exit 2 ;;
    esac
    local out="target/mutants/$phase" file_args=()
    for f in "${files[@]}"; do file_args+=(--file "$f"); done
    mkdir -p "$out"
    echo "== mutants: $phase (${files[*]}), budget ${budget} s"
    # No baseline run: cargo-mutants would test it in the mutated package, not the one named
    # (the test command checks the unmutated tree).
    timeout "$budget" cargo mutants --no-shuffle -j 1 --baseline skip --timeout 300 \
        --build-timeout 600 --output "$out" "${file_args[@]}" "${test_args[@]}" || true
    local dir="$out/mutants.out"
    count() { [ -f "$dir/$1.txt" ] && wc -l < "$dir/$1.txt" || echo 0; }
    echo "mutants: $phase: caught $(count caught), missed $(count missed)," \
        "timeout $(count timeout), unviable $(count unviable)"
    if [ -s "$dir/missed.txt" ]; then
        echo "missed:"
        sed 's/^/  /' "$dir/missed.txt"
    fi
}

files_of() {
    case "$1" in
        descriptor) echo "${descriptor_files[@]}" ;;
        cpu-checks) echo "${cpu_check_files[@]}" ;;
        *) echo "${cpu_row_files[@]}" ;;
    esac
}
if [ "$#" -gt 0 ]; then
    phase="$1"
    shift
    if [ "$#" -gt 0 ]; then
        run_phase "$phase" "$@"
    else
        # shellcheck disable=SC2046 # file paths without spaces
        run_phase "$phase" $(files_of "$phase")
    fi
else
    for phase in descriptor cpu-checks cpu-rows; do
        # shellcheck disable=SC2046
        run_phase "$phase" $(files_of "$phase")
    done
fi
