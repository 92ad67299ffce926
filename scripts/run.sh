#!/usr/bin/env bash
# The main job: `kvlayout explain llama-3-8b` (CPU, in-process). Extra arguments replace the
# default and go to the CLI: ./scripts/run.sh explain deepseek-v3
#                            ./scripts/run.sh view llama-3-8b --as flashinfer --field kv --json
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
if [ "$#" -eq 0 ]; then
    set -- explain llama-3-8b
fi
exec cargo run --release -p kvlayout-cli -- "$@"
