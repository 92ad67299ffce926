#!/usr/bin/env bash
# The Python package's tests: builds crates/kvlayout-py with maturin and installs it into the
# project's virtual environment (.venv, made by scripts/setup.sh) exactly as a user does
# (`pip install ./crates/kvlayout-py`), then runs its pytest suite and the README's Python
# example and its dump snippet (scripts/readme-dump-snippet.sh). Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
echo "== pip install ./crates/kvlayout-py (maturin, release)"
python -m pip install --quiet --disable-pip-version-check --no-build-isolation ./crates/kvlayout-py
echo "== pytest crates/kvlayout-py/tests"
python -m pytest crates/kvlayout-py/tests -q -rs -p no:cacheprovider "$@"
echo "== README.md: the Python example"
example="$(mktemp --suffix=.py)"
trap 'rm -f "$example"' EXIT
awk '/^## In Python/ { on = 1; next } /^## / { on = 0 }
     on && /^```python/ { code = 1; next } code && /^```/ { exit } code { print }' README.md \
    > "$example"
[ -s "$example" ] || { echo "README.md has no Python example under '## In Python'"; exit 1; }
python "$example"
# The README's dump snippet (a `kvlayout fill` dump opened with safetensors and numpy).
./scripts/readme-dump-snippet.sh
