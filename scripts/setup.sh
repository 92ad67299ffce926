#!/usr/bin/env bash
# Idempotent set-up for a fresh machine of this project's kind (Debian, root, Rust by rustup).
# Quick and silent when everything is already there; installs only what is missing.
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
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# Rust components used by the test command.
for component in rustfmt clippy; do
    if ! rustup component list --installed 2>/dev/null | grep -q "^${component}"; then
        log "rustup component add ${component}"
        rustup component add "${component}"
    fi
done

# A C compiler for the kernel-ABI probe (the `cc` crate) and a C++ one for its C++ probe.
command -v cc >/dev/null 2>&1 || apt_install gcc
command -v c++ >/dev/null 2>&1 || apt_install g++

# numpy: the outside reference of the conformance suite (tests/python/).
if ! command -v python3 >/dev/null 2>&1; then
    apt_install python3 python3-pip
fi
if ! python3 -c "import numpy" >/dev/null 2>&1; then
    log "pip install numpy==${NUMPY_VERSION}"
    python3 -m pip install --quiet --disable-pip-version-check "numpy==${NUMPY_VERSION}" \
        || python3 -m pip install --quiet --break-system-packages "numpy==${NUMPY_VERSION}"
fi

# Later issues add here: clang-19 and lld-19 (kernels to PTX and AMDGPU), libamdhip64-dev,
# libclang-dev (bindgen), and the NIXL wheel's libraries.
