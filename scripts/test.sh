#!/usr/bin/env bash
# Run the whole test suite (sets everything up first). Extra arguments go to pytest.
# The SGLang adapter tests run in their own pytest process: they may put import stubs for
# triton/torchvision on sys.path (see tests/sglang/conftest.py), which must not leak elsewhere.
# Both suites always run; the exit status is the first failing one's (0 when both pass), and
# the last lines say how each ended.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/python -m pytest -p no:cacheprovider --ignore=tests/sglang "$@"
main=$?
.venv/bin/python -m pytest -p no:cacheprovider tests/sglang "$@"
sglang=$?
say() { [ "$2" = 0 ] && echo "passed" || echo "FAILED (pytest exit $2)"; }
echo "scripts/test.sh: main suite $(say main $main); SGLang adapter suite (tests/sglang) $(say sglang $sglang)"
[ "$main" != 0 ] && exit "$main"
exit "$sglang"
