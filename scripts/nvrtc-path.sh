#!/usr/bin/env bash
# Prints the folder scripts/setup.sh unpacks NVRTC's libraries into (outside the repository,
# shared by every checkout of this user).
echo "${KVLAYOUT_CACHE:-${HOME}/.cache/kvlayout}/nvrtc-12.9.86/lib"
