#!/usr/bin/env bash
# selftest.sh - builds and runs the host emulator's self-test (selftest.cpp) for warps of 32
# and 64: g++ (and clang++-19 when present) at -O1 with -Wall -Wextra -Werror, the two widths
# linked into one program, the ucontext fallback, AddressSanitizer, and a planted heap
# overflow that ASan must report. Then the threads mode (-DKVL_EMU_THREADS: OS threads instead
# of fibers) with each compiler and width, under ThreadSanitizer, which must find no race in
# the self-test's kernels, and a planted race (a barrier removed) that TSan must report.
# Prints PASS/FAIL per step; exits non-zero on any failure.
set -u
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
base=(-std=c++20 -Wall -Wextra -Werror -pthread -I"$here" -I"$here/../include")
asan=(-fsanitize=address -fno-omit-frame-pointer -g)
tsan=(-fsanitize=thread -fno-omit-frame-pointer -g)
fails=0
# ASan builds also run with fake stacks, which the fiber switch annotations must handle.
export ASAN_OPTIONS=detect_stack_use_after_return=1

compilers=(g++)
if command -v clang++-19 >/dev/null; then
    compilers+=(clang++-19)
else
    echo "skipped: emulator self-test with clang++-19: not found (apt-get install clang-19)"
fi

# step NAME COMMAND...: runs COMMAND, shows its summary lines, or everything on failure.
step() {
    local name=$1
    shift
    if "$@" >"$tmp/log" 2>&1; then
        echo "PASS $name"
        grep -E '^(PASS .*speed|ALL PASS|SUMMARY: ThreadSanitizer)' "$tmp/log" | sed 's/^/    /'
    else
        echo "FAIL $name"
        sed 's/^/    /' "$tmp/log"
        fails=$((fails + 1))
    fi
}

# run_bin PROGRAM: runs it; a hang fails its step after 300 s instead of stalling the script.
run_bin() {
    if command -v timeout >/dev/null; then timeout 300 "$@"; else "$@"; fi
}

# build_run OUT COMPILER FLAGS...: compiles selftest.cpp and runs it.
build_run() {
    local out=$tmp/$1 cxx=$2
    shift 2
    "$cxx" "${base[@]}" "$@" "$here/selftest.cpp" -o "$out" && run_bin "$out"
}

for cxx in "${compilers[@]}"; do
    for w in 32 64; do
        step "$cxx -O1 warp $w" build_run "st_${cxx}_$w" "$cxx" -O1 -DKVL_WARP=$w
    done
done

step "g++ -O2 -ffp-contract=off warp 32" build_run st_o2 g++ -O2 -ffp-contract=off -DKVL_WARP=32

mixed() {
    g++ "${base[@]}" -O1 -DKVL_WARP=64 -DKVL_SELFTEST_NO_MAIN -c "$here/selftest.cpp" -o "$tmp/w64.o" &&
        g++ "${base[@]}" -O1 -DKVL_WARP=32 -DKVL_SELFTEST_WITH_OTHER "$here/selftest.cpp" \
            "$tmp/w64.o" -o "$tmp/mixed" && run_bin "$tmp/mixed"
}
step "g++ warps 32 and 64 linked into one program" mixed

step "g++ ucontext fallback warp 32" build_run st_uc g++ -O1 -DKVL_WARP=32 -DKVL_EMU_UCONTEXT \
    -DKVL_SELFTEST_SPEED_LIMIT_MS=20000

for cxx in "${compilers[@]}"; do
    for w in 32 64; do
        step "$cxx -fsanitize=address warp $w" build_run "st_asan_${cxx}_$w" "$cxx" -O1 "${asan[@]}" -DKVL_WARP=$w \
            -DKVL_SELFTEST_SPEED_LIMIT_MS=20000
    done
done

# The planted overflow must end the program with an ASan heap-buffer-overflow report.
planted() {
    "$1" "${base[@]}" -O1 "${asan[@]}" -DKVL_WARP=32 -DKVL_SELFTEST_PLANT_OOB \
        "$here/selftest.cpp" -o "$tmp/oob" || return 1
    run_bin "$tmp/oob" >"$tmp/oob.log" 2>&1
    local rc=$?
    head -n 12 "$tmp/oob.log"
    [ $rc -ne 0 ] && grep -q 'heap-buffer-overflow' "$tmp/oob.log" && grep -Eq ' in (kern::)?fill.*selftest.cpp' "$tmp/oob.log"
}
for cxx in "${compilers[@]}"; do
    step "$cxx ASan reports a kernel's heap-buffer-overflow" planted "$cxx"
done

# Threads mode: each thread of a block an OS thread, for ThreadSanitizer.
for cxx in "${compilers[@]}"; do
    for w in 32 64; do
        step "$cxx threads mode warp $w" build_run "st_thr_${cxx}_$w" "$cxx" -O1 -DKVL_WARP=$w \
            -DKVL_EMU_THREADS
    done
done

# tsan_clean OUT COMPILER FLAGS...: build_run, and TSan reports nothing (no race, no leaked
# thread: any report also makes the exit status 66).
tsan_clean() {
    build_run "$@" >"$tmp/tsan.log" 2>&1
    local rc=$?
    cat "$tmp/tsan.log"
    [ $rc -eq 0 ] && ! grep -q 'ThreadSanitizer' "$tmp/tsan.log"
}
# g++-12's TSan starts threads about 3x slower than clang-19's: one width each.
tsan_runs=("g++ 32")
[ ${#compilers[@]} -gt 1 ] && tsan_runs+=("clang++-19 64")
for run in "${tsan_runs[@]}"; do
    set -- $run
    step "$1 -fsanitize=thread threads mode warp $2" tsan_clean "st_tsan_$1_$2" "$1" -O1 "${tsan[@]}" \
        -DKVL_WARP=$2 -DKVL_EMU_THREADS
done

# The planted race (kern::neighbour without its kvl_sync) must make TSan report a data race
# between the kernel's write and read.
planted_race() {
    "$1" "${base[@]}" -O1 "${tsan[@]}" -DKVL_WARP=32 -DKVL_EMU_THREADS -DKVL_SELFTEST_PLANT_RACE \
        "$here/selftest.cpp" -o "$tmp/race" || return 1
    run_bin "$tmp/race" >"$tmp/race.log" 2>&1
    local rc=$?
    head -n 12 "$tmp/race.log"
    grep '^SUMMARY' "$tmp/race.log"
    [ $rc -ne 0 ] && grep -q 'WARNING: ThreadSanitizer: data race' "$tmp/race.log" &&
        grep -Eq '#0 (kern::)?neighbour.*selftest\.cpp' "$tmp/race.log"
}
for cxx in "${compilers[@]}"; do
    step "$cxx TSan reports a kernel's data race (threads mode)" planted_race "$cxx"
done

if [ $fails -ne 0 ]; then
    echo "selftest.sh: $fails step(s) failed"
    exit 1
fi
echo "selftest.sh: all steps passed"
