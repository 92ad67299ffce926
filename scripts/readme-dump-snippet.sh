#!/usr/bin/env bash
# The README's dump snippet: writes a `kvlayout fill --pattern coords` dump with the CLI, then
# runs the Python block right after the `<!-- kvlayout-dump-snippet -->` marker of the README
# on it (the project's .venv: numpy and safetensors). Fails loudly when the marker or its block
# is missing. KVLAYOUT_DUMP_README names the file to read (default below).
set -euo pipefail
cd "$(dirname "$0")/.."
readme="${KVLAYOUT_DUMP_README:-README.md}"
marker='<!-- kvlayout-dump-snippet -->'
export PATH="$PWD/.venv/bin:$PATH"
[ -f "$readme" ] || { echo "readme-dump-snippet: $readme does not exist" >&2; exit 1; }
grep -qxF "$marker" "$readme" \
    || { echo "readme-dump-snippet: $readme has no line '$marker'" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
awk -v marker="$marker" '$0 == marker { on = 1; next }
     on && /^```python/ { code = 1; next } code && /^```/ { exit } code { print }
     on && !code && NF { exit }' "$readme" > "$work/snippet.py"
[ -s "$work/snippet.py" ] || {
    echo "readme-dump-snippet: no \`\`\`python block right after '$marker' in $readme" >&2
    exit 1
}
cargo run --quiet -p kvlayout-cli --bin kvlayout -- fill \
    "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=HND" --pattern coords \
    --out "$work/cache.safetensors" >/dev/null
echo "== $readme: the dump snippet"
python "$work/snippet.py" "$work/cache.safetensors"
