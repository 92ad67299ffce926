#!/usr/bin/env bash
# Prints the LD_LIBRARY_PATH entries of NIXL's runtime libraries, which scripts/setup.sh
# unpacks from the PyPI wheel nixl-cu12 into a cache outside the repository (shared by every
# checkout of this user): the NIXL folder, then the folder of its bundled dependencies.
dir="${KVLAYOUT_CACHE:-${HOME}/.cache/kvlayout}/nixl-cu12-1.5.1"
echo "${dir}/.nixl_cu12.mesonpy.libs:${dir}/nixl_cu12.libs"
