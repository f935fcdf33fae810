#!/usr/bin/env bash
# Run the whole test suite (sets everything up first). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Test the installed package, not the source tree (the C++ extension lives only there).
exec .venv/bin/python -m pytest -p no:cacheprovider --import-mode=importlib "$@"
