#!/usr/bin/env bash
# The main job on the embedded default (CPU, in-process): `kvlayout explain` on a preset.
# Extra arguments are passed to the CLI: ./scripts/run.sh view llama-3-8b --as flashinfer --field kv --json
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
if [ "$#" -eq 0 ]; then
    set -- explain llama-3-8b
fi
exec cargo run --quiet --release -p kvlayout-cli -- "$@"
