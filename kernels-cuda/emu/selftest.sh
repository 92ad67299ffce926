#!/usr/bin/env bash
# selftest.sh - builds and runs the host emulator's self-test (selftest.cpp) for warps of 32
# and 64: g++ (and clang++-19 when present) at -O1 with -Wall -Wextra -Werror, the two widths
# linked into one program, the ucontext fallback, AddressSanitizer, and a planted heap
# overflow that ASan must report. Prints PASS/FAIL per step; exits non-zero on any failure.
set -u
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
base=(-std=c++20 -Wall -Wextra -Werror -pthread -I"$here" -I"$here/../include")
asan=(-fsanitize=address -fno-omit-frame-pointer -g)
fails=0
# ASan builds also run with fake stacks, which the fiber switch annotations must handle.
export ASAN_OPTIONS=detect_stack_use_after_return=1

compilers=(g++)
command -v clang++-19 >/dev/null && compilers+=(clang++-19)

# step NAME COMMAND...: runs COMMAND, shows its summary lines, or everything on failure.
step() {
    local name=$1
    shift
    if "$@" >"$tmp/log" 2>&1; then
        echo "PASS $name"
        grep -E '^(PASS .*speed|ALL PASS)' "$tmp/log" | sed 's/^/    /'
    else
        echo "FAIL $name"
        sed 's/^/    /' "$tmp/log"
        fails=$((fails + 1))
    fi
}

# build_run OUT COMPILER FLAGS...: compiles selftest.cpp and runs it.
build_run() {
    local out=$tmp/$1 cxx=$2
    shift 2
    "$cxx" "${base[@]}" "$@" "$here/selftest.cpp" -o "$out" && "$out"
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
            "$tmp/w64.o" -o "$tmp/mixed" && "$tmp/mixed"
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
    "$tmp/oob" >"$tmp/oob.log" 2>&1
    local rc=$?
    head -n 12 "$tmp/oob.log"
    [ $rc -ne 0 ] && grep -q 'heap-buffer-overflow' "$tmp/oob.log" && grep -Eq ' in (kern::)?fill.*selftest.cpp' "$tmp/oob.log"
}
for cxx in "${compilers[@]}"; do
    step "$cxx ASan reports a kernel's heap-buffer-overflow" planted "$cxx"
done

if [ $fails -ne 0 ]; then
    echo "selftest.sh: $fails step(s) failed"
    exit 1
fi
echo "selftest.sh: all steps passed"
