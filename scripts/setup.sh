#!/usr/bin/env bash
# Idempotent set-up for a bare machine of this project's kind (Debian, root, Rust by rustup).
# Installs only what is missing; with everything present it makes no network call and takes
# well under a second. Run by scripts/run.sh and scripts/test.sh.
set -euo pipefail

NUMPY_VERSION=2.3.5

log() { printf 'setup: %s\n' "$*" >&2; }

apt_updated=0
apt_install() {
    if [ "$apt_updated" = 0 ]; then
        log "apt-get update"
        apt-get update -qq
        apt_updated=1
    fi
    log "apt-get install $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# --- Rust components used by the test command (cargo fmt, cargo clippy) ---------------------
cargo fmt --version >/dev/null 2>&1 || { log "rustup component add rustfmt"; rustup component add rustfmt; }
cargo clippy --version >/dev/null 2>&1 || { log "rustup component add clippy"; rustup component add clippy; }

# --- C and C++ compilers: the kernel-ABI probe (tests/build.rs, the `cc` crate) -------------
command -v cc >/dev/null 2>&1 || apt_install gcc libc6-dev
command -v c++ >/dev/null 2>&1 || apt_install g++

# --- numpy: the outside reference of the conformance suite (tests/python/) -------------------
# Only the tests need it; the main job runs without it, so a failure here is a warning and the
# test that needs numpy reports it (scripts/test.sh sets KVLAYOUT_REQUIRE_NUMPY=1).
if ! command -v python3 >/dev/null 2>&1; then
    apt_install python3 python3-numpy
fi
if ! python3 -c "import numpy" >/dev/null 2>&1; then
    if python3 -m pip --version >/dev/null 2>&1; then
        log "pip install numpy==${NUMPY_VERSION}"
        python3 -m pip install --quiet --disable-pip-version-check "numpy==${NUMPY_VERSION}" \
            || python3 -m pip install --quiet --disable-pip-version-check \
                --break-system-packages "numpy==${NUMPY_VERSION}" \
            || true
    else
        apt_install python3-numpy || true
    fi
    python3 -c "import numpy" >/dev/null 2>&1 \
        || log "warning: python3 cannot import numpy; the outside-reference test will fail"
fi

# --- clang-19 and lld-19: the GPU kernels to PTX (sm_80, sm_90) and AMDGPU code objects -----
# (gfx90a, gfx942, gfx1100) by scripts/kernels.sh, with no vendor toolkit.
command -v clang-19 >/dev/null 2>&1 || apt_install clang-19
command -v ld.lld-19 >/dev/null 2>&1 || apt_install lld-19
command -v llvm-readelf-19 >/dev/null 2>&1 || apt_install llvm-19
# clang-19's sanitizer runtimes (only recommended by it): the emulator's self-test links
# kernels with clang++-19 under AddressSanitizer and ThreadSanitizer.
[ -e /usr/lib/llvm-19/lib/clang/19/lib/linux/libclang_rt.asan-x86_64.a ] \
    || apt_install libclang-rt-19-dev

# --- ROCm's HIP runtime (Debian's libamdhip64-dev): the HIP backend links it (hip-sys) ------
# Headers under /usr/include/hip; .cargo/config.toml points HIP_PATH at /usr unless set.
[ -e /usr/include/hip/hip_runtime_api.h ] || apt_install libamdhip64-dev

# --- NVRTC (PyPI wheel nvidia-cuda-nvrtc-cu12): the CUDA backend's run-time compile of the ---
# kernel sources, tested here without a GPU. Unpacked into a cache outside the repository;
# scripts/nvrtc-path.sh prints its library folder (scripts/test.sh puts it on LD_LIBRARY_PATH).
# pip downloads the wheels (nothing is installed into Python).
python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip
NVRTC_VERSION=12.9.86
nvrtc_dir="$("$(dirname "$0")/nvrtc-path.sh")"
if [ ! -e "$nvrtc_dir/libnvrtc.so.12" ]; then
    if python3 -m pip --version >/dev/null 2>&1; then
        log "pip download nvidia-cuda-nvrtc-cu12==${NVRTC_VERSION}"
        tmp="$(mktemp -d)"
        if python3 -m pip download --quiet --disable-pip-version-check --no-deps -d "$tmp" \
            "nvidia-cuda-nvrtc-cu12==${NVRTC_VERSION}"; then
            python3 -m zipfile -e "$tmp"/nvidia_cuda_nvrtc_cu12-*.whl "$tmp/x"
            mkdir -p "$nvrtc_dir"
            cp "$tmp"/x/nvidia/cuda_nvrtc/lib/libnvrtc.so.12 \
                "$tmp"/x/nvidia/cuda_nvrtc/lib/libnvrtc-builtins.so.12.9 "$nvrtc_dir/"
        else
            log "warning: could not download NVRTC; the CUDA backend's NVRTC test will fail"
        fi
        rm -rf "$tmp"
    else
        log "warning: no pip to download NVRTC with; the CUDA backend's NVRTC test will fail"
    fi
fi

# --- NIXL (PyPI wheel nixl-cu12): the runtime of kvlayout-connector's NIXL engine ----------
# nixl-sys (feature stub-api) runs bindgen at build time, which needs libclang; its stubs load
# libnixl_capi.so at run time. The wheel's two library folders are unpacked side by side, names
# kept (the libraries' RPATHs name the sibling nixl_cu12.libs), into a cache outside the
# repository; scripts/nixl-path.sh prints both (scripts/test.sh puts them on LD_LIBRARY_PATH).
# The wheel loads without a GPU; its Python dependencies (torch, CUDA) are not needed, hence
# --no-deps. A failed download is a warning: the NIXL tests then fail under test.sh
# (KVLAYOUT_REQUIRE_NIXL=1) and skip visibly elsewhere.
compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null || apt_install libclang-dev
NIXL_VERSION=1.5.1
nixl_dir="${KVLAYOUT_CACHE:-${HOME}/.cache/kvlayout}/nixl-cu12-${NIXL_VERSION}"
if [ ! -e "$nixl_dir/.nixl_cu12.mesonpy.libs/libnixl_capi.so" ] \
    || [ ! -d "$nixl_dir/nixl_cu12.libs" ]; then
    if python3 -m pip --version >/dev/null 2>&1; then
        log "pip download nixl-cu12==${NIXL_VERSION}"
        tmp="$(mktemp -d)"
        rm -rf "$nixl_dir"
        if timeout 600 python3 -m pip download --quiet --disable-pip-version-check --no-deps \
            -d "$tmp" "nixl-cu12==${NIXL_VERSION}" \
            && python3 -m zipfile -e "$tmp"/nixl_cu12-*.whl "$tmp/x" \
            && mkdir -p "$nixl_dir" \
            && cp -a "$tmp/x/.nixl_cu12.mesonpy.libs" "$tmp/x/nixl_cu12.libs" "$nixl_dir/"; then
            :
        else
            rm -rf "$nixl_dir"
            log "warning: could not download or unpack nixl-cu12; the NIXL engine's tests will fail"
        fi
        rm -rf "$tmp"
    else
        log "warning: no pip to download nixl-cu12 with; the NIXL engine's tests will fail"
    fi
fi

# --- The project's Python environment (.venv): the Python package's build and tests -------
# maturin builds crates/kvlayout-py (`pip install ./crates/kvlayout-py`); numpy and ml_dtypes
# (bf16 and fp8 arrays) are what the package works on; pytest runs its tests; safetensors
# opens the CLI's cache dumps in the README's dump snippet (scripts/readme-dump-snippet.sh).
# Pinned; made and filled only when something is missing.
VENV_PYTHON_PACKAGES=(maturin==1.16.0 "numpy==${NUMPY_VERSION}" ml_dtypes==0.6.0 pytest==9.2.0
    safetensors==0.8.0)
venv="$(cd "$(dirname "$0")/.." && pwd)/.venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv" >/dev/null 2>&1 \
    || { apt_install python3-venv && python3 -m venv "$venv"; }
if ! "$venv/bin/python" -c "import numpy, ml_dtypes, pytest, maturin, safetensors" >/dev/null 2>&1 \
    || [ "$("$venv/bin/python" -c "import numpy; print(numpy.__version__)")" != "$NUMPY_VERSION" ]; then
    log "pip install ${VENV_PYTHON_PACKAGES[*]} into .venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${VENV_PYTHON_PACKAGES[@]}"
fi

# --- Later issues add here ------------------------------------------------------------------
