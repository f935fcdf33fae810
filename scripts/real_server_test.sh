#!/usr/bin/env bash
# The real-server GPU test (tests/server/test_real_server.py), in both server configurations,
# on the GPU host, from the project root, with the SGLang bundle in .sgl/
# (../shared/sglang-gpu/README.md builds it):
#
#   bash scripts/real_server_test.sh [OUT_DIR]
#
# Run 1: SGLang's defaults (CUDA graphs and the overlap scheduler on).
# Run 2: --disable-cuda-graph --disable-overlap-schedule.
# Both: the tiny random Llama of .sgl/bin/make_tiny.py (MODEL=path for another), capture-only
# EAGLE-3 mode with aux layers 0 1 2, 256-token chunks, radix cache off. OUT_DIR (default
# /tmp/hsc-real-server) gets each run's pytest output and server log. Exit 1 if a run failed.
set -u
OUT=${1:-/tmp/hsc-real-server}
mkdir -p "$OUT"
LAYERS=${LAYERS:-0 1 2}
COMMON=(--enable-return-aux-hidden-states --speculative-algorithm EAGLE3
        --return-aux-hidden-state-layer-ids $LAYERS --chunked-prefill-size 256
        --disable-radix-cache --mem-fraction-static 0.3)
export HSCAPTURE_ENDPOINT='ipc:///tmp/hscap-test-{dp_rank}.sock'
export DEADLINE_S=${DEADLINE_S:-280}
rc=0
run() {  # run NAME [extra SGLang flags...]
  local name=$1; shift
  echo "=== real-server test: $name"
  SERVE_LOG_DIR="$OUT/$name" bash .sgl/bin/serve.sh "${COMMON[@]}" "$@" -- \
    python3 -m pytest -p no:cacheprovider -q -rA -s tests/server > "$OUT/$name.log" 2>&1
  local r=$?
  tail -25 "$OUT/$name.log"
  echo "--- $name: exit $r"
  [ "$r" = 0 ] || rc=1
}
run graphs-overlap
run eager-no-overlap --disable-cuda-graph --disable-overlap-schedule
exit $rc
