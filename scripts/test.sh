#!/usr/bin/env bash
# Run the whole test suite (sets everything up first). Extra arguments go to pytest.
# The SGLang adapter tests run in their own pytest process: they may put import stubs for
# triton/torchvision on sys.path (see tests/sglang/conftest.py), which must not leak elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/python -m pytest -p no:cacheprovider --ignore=tests/sglang "$@"
.venv/bin/python -m pytest -p no:cacheprovider tests/sglang "$@"
