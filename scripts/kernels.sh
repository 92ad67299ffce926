#!/usr/bin/env bash
# Compiles the GPU kernels with Debian's clang-19, no vendor toolkit, warnings as errors:
#   kernels-cuda/src/kvlayout.cu   -> <out>/kvlayout.sm_80.ptx, kvlayout.sm_90.ptx
#   kernels-hip/src/kvlayout.hip   -> <out>/kvlayout.gfx90a.co, .gfx942.co (wave64),
#                                     kvlayout.gfx1100.co (wave32)
# and checks each artifact's target (PTX `.target`, the code object's wavefront size) and
# that every kernel entry point is in it. <out> defaults to target/kernels; a second argument
# `cuda` or `hip` builds only those artifacts. The device crates' build scripts run it and
# embed what it wrote; the emulator compiles the same sources for the host. The output is
# deterministic (the HIP compilation-unit id is fixed, not derived from paths), so a build
# anywhere can be compared with CI's by hash.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/kernels}"
which="${2:-all}"
case "$which" in all | cuda | hip) ;; *) echo "kernels: build cuda, hip or all, not $which" >&2; exit 2 ;; esac
mkdir -p "$out"
clang="${KVLAYOUT_CLANG:-clang-19}"
readelf="${KVLAYOUT_READELF:-llvm-readelf-19}"
kernels=(kvl_write_kv kvl_paged_decode kvl_paged_decode_reduce kvl_move_blocks)
includes=(-I kernels-cuda/include -I kernels-cuda/src)
warnings=(-Wall -Wextra -Werror)

fail() { echo "kernels: $*" >&2; exit 1; }

for arch in sm_80 sm_90; do
    [ "$which" = hip ] && break
    ptx="$out/kvlayout.$arch.ptx"
    # PTX 7.8 (CUDA 11.8, the oldest with sm_90): the *_sync warp intrinsics need PTX >= 6.0.
    "$clang" -x cuda --cuda-device-only -nocudainc -nocudalib --cuda-gpu-arch="$arch" \
        -Xclang -target-feature -Xclang +ptx78 -O3 -S "${warnings[@]}" "${includes[@]}" \
        kernels-cuda/src/kvlayout.cu -o "$ptx"
    grep -q "^\.target $arch\$" "$ptx" || fail "$ptx: no .target $arch"
    for k in "${kernels[@]}"; do
        grep -q "\.entry $k(" "$ptx" || fail "$ptx: no entry $k"
    done
    echo "kernels: $ptx ($(grep -c '^\.visible \.entry' "$ptx") entries, $arch)"
done

for arch in gfx90a:64 gfx942:64 gfx1100:32; do
    [ "$which" = cuda ] && break
    gfx="${arch%%:*}" wave="${arch##*:}"
    co="$out/kvlayout.$gfx.co"
    "$clang" -x hip --offload-arch="$gfx" -nogpulib -nogpuinc --cuda-device-only \
        --no-gpu-bundle-output -cuid=kvlayout -O3 "${warnings[@]}" "${includes[@]}" \
        kernels-hip/src/kvlayout.hip -o "$co"
    notes="$("$readelf" --notes "$co")"
    grep -q "amdhsa.target: *amdgcn-amd-amdhsa--$gfx" <<<"$notes" || fail "$co: not $gfx"
    grep -q "\.wavefront_size: *$wave\$" <<<"$notes" || fail "$co: wavefront size not $wave"
    syms="$("$readelf" --syms "$co")"
    for k in "${kernels[@]}"; do
        grep -q " $k\$" <<<"$syms" || fail "$co: no symbol $k"
    done
    echo "kernels: $co ($gfx, wave$wave)"
done
