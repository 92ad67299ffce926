#!/usr/bin/env bash
# The main job: `kvlayout demo`, a prompt's KV cache from a prefill instance (llama-3-8b
# shrunk to 2 layers, NHD, blocks of 16, TP 1) to a decode instance (HND, padded pages,
# blocks of 32, TP 2) over the in-process memcpy engine on the CPU backend: write_kv,
# handshake, compatibility check, plan, transfer, scatter_blocks, paged_decode on both decode
# ranks, each step one line timed against memcpy, then verified bit for bit (exit 1 if not).
# Extra arguments replace the default and go to the CLI: ./scripts/run.sh demo --tp 4 --json
#                            ./scripts/run.sh decode llama-3-8b
#                            ./scripts/run.sh explain deepseek-v3
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
if [ "$#" -eq 0 ]; then
    set -- demo
fi
exec cargo run --release -p kvlayout-cli -- "$@"
