#!/usr/bin/env bash
# The CPU-dependent tests once more per host class this machine can imitate, by hiding CPU
# features from the backend (KVLAYOUT_CPU_HIDE, which only hides: a class above this CPU's is
# reported skipped). Run by scripts/test.sh after the main pass, which covers this CPU's own
# class. Each pass runs, with the features hidden:
#   - every crate's unit tests and the CPU crate's integration tests (kernel builds, the choice
#     `auto` makes, the decode, movers and writers on the build picked, no allocation per step);
#   - the CLI's tests of what depends on the CPU (the decode report, builds refused for what is
#     missing or hidden, bench, check, demo);
#   - the conformance suite on the CPU backend (its build picked, each other build it runs and
#     the other prefetch arrangement) and the reference (KVLAYOUT_SUITE_BACKENDS=cpu,reference).
# The classes: AVX-512 without BF16 (Intel Xeon, BF16 hidden by its hypervisor), AVX2 only
# (AMD Zen 3), no SIMD (the scalar build, as a host other than x86_64 runs it; the SSE2
# shuffles that x86_64 always has still run).
# Usage: scripts/host-classes.sh  (from scripts/test.sh, after the workspace's tests built).
# Exit status: 1 if a pass failed, after every pass ran.
set -uo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
unset KVLAYOUT_KERNELS # each pass runs the build its class would pick

# The `kvlayout` binary the CLI's tests run (built by the main pass; nothing is rebuilt).
kvl="$(cargo test --workspace --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if (m.get("reason") == "compiler-artifact" and m["target"]["name"] == "kvlayout"
            and m["target"]["kind"] == ["bin"] and not m["profile"]["test"]):
        print(m["executable"])
')"
[ -x "$kvl" ] || { echo "host-classes: the kvlayout binary was not built"; exit 1; }

# `kvlayout cpu --json` under KVLAYOUT_CPU_HIDE=$1 (unset when empty), one field of it:
# builds (sorted), hidden, or why the class's first build ($3) does not run.
cpu_field() {
    local json
    if [ -n "$1" ]; then
        json="$(KVLAYOUT_CPU_HIDE="$1" "$kvl" cpu --json)" || return 1
    else
        json="$(env -u KVLAYOUT_CPU_HIDE "$kvl" cpu --json)" || return 1
    fi
    python3 -c '
import json, sys
v, field, build = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
if field == "builds":
    print(" ".join(sorted(v["builds"])))
elif field == "hidden":
    print(" ".join(v["hidden"]) or "nothing")
else:
    why = [n["build"] + ": " + n["why"] for n in v["builds_not_run"] if n["build"] == build]
    print("; ".join(why) or build + ": not a build of this target")
' "$json" "$2" "${3:-}"
}

echo "== host classes: this CPU"
env -u KVLAYOUT_CPU_HIDE "$kvl" cpu || exit 1
native="$(cpu_field "" builds)" || exit 1

# The CPU crate's integration tests, by name.
cpu_tests=()
for t in crates/kvlayout-cpu/tests/*.rs; do
    cpu_tests+=(--test "$(basename "$t" .rs)")
done

status=0
# name | what it is | features hidden | the builds that class runs (sorted)
for class in \
    "avx512|AVX-512 without BF16, as on Intel's Xeon|avx512bf16|avx2 avx512 scalar" \
    "avx2|AVX2 only, as on AMD's Zen 3|avx512f|avx2 scalar" \
    "scalar|no SIMD, the scalar build|avx2|scalar"; do
    IFS='|' read -r name what hide want <<<"$class"
    got="$(cpu_field "$hide" builds)" || exit 1
    if [ "$got" != "$want" ]; then
        echo "skipped: host class $name, $what: this CPU cannot imitate it ($(cpu_field "$hide" why "$name"))"
        continue
    fi
    if [ "$got" = "$native" ]; then
        echo "host class $name, $what: this CPU's own class, run by the main pass"
        continue
    fi
    echo "== host class $name, $what: KVLAYOUT_CPU_HIDE=$hide hides $(cpu_field "$hide" hidden); builds run: $got"
    export KVLAYOUT_CPU_HIDE="$hide"
    # --workspace, as the main pass builds them: the same test binaries, nothing rebuilt.
    cargo test --workspace --no-fail-fast --lib --bins "${cpu_tests[@]}" 2>&1 || status=1
    # The CLI's tests of what depends on the CPU: backends by name, bench, check, cpu, decode
    # and demo (the layout questions, dumps, plans and pictures do not).
    cargo test --workspace --no-fail-fast --test cli -- backend:: bench:: check:: cpu:: \
        decode:: demo 2>&1 || status=1
    KVLAYOUT_SUITE_BACKENDS=cpu,reference cargo test --workspace --no-fail-fast \
        --test conformance -- every_case_on_every_backend refusals_on_every_backend 2>&1 \
        || status=1
    unset KVLAYOUT_CPU_HIDE
done
exit "$status"
