#!/usr/bin/env bash
# The main job: `kvlayout decode llama-3-8b`, one decode step on the CPU backend, in process
# (checked against the reference, timed against the read bandwidth). Extra arguments replace
# the default and go to the CLI: ./scripts/run.sh explain deepseek-v3
#                            ./scripts/run.sh view llama-3-8b --as flashinfer --field kv --json
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
if [ "$#" -eq 0 ]; then
    set -- decode llama-3-8b
fi
exec cargo run --release -p kvlayout-cli -- "$@"
