#!/usr/bin/env bash
# The real-server GPU test (tests/server/test_real_server.py), in both server configurations,
# on the GPU host, from the project root, with the SGLang bundle in .sgl/
# (../shared/sglang-gpu/README.md builds it):
#
#   bash scripts/real_server_test.sh [OUT_DIR]
#
# Run 1: SGLang's defaults (CUDA graphs and the overlap scheduler on).
# Run 2: --disable-cuda-graph --disable-overlap-schedule.
# Run "retract" (only when CONFIGS names it): SGLang's defaults with SGLANG_TEST_RETRACT=1 in the
# server's (and client's) environment, SGLang's own test switch: it retracts a decoding request
# every third decode step, as KV pressure would (a real retraction, re-prefilled from prompt +
# output). CONFIGS="graphs-overlap eager-no-overlap" (the default) picks the runs, in order.
# Both: the tiny random Llama of .sgl/bin/make_tiny.py (MODEL=path for another), capture-only
# EAGLE-3 mode with aux layers 0 1 2, 256-token chunks, radix cache off. OUT_DIR (default
# /tmp/hsc-real-server) gets each run's pytest output and server log. Exit 1 if a run failed.
# WITH_TEST_GPU=1 also runs tests/test_gpu.py on run 1's server, before its real-server test
# (run 1's deadline grows by 150 s). Times on the H200: a server is up after 55-140 s, the
# real-server test takes ~80 s, test_gpu ~100 s: DEADLINE_S=215 WITH_TEST_GPU=1 fits one 590 s
# device call (365 + 215 s), with ~70 s to spare in each run when its server starts in 140 s.
# On the device machine, tar OUT_DIR into $OUT: at most 8 files come back from there.
set -u
OUT=${1:-/tmp/hsc-real-server}
mkdir -p "$OUT"
WITH_TEST_GPU=${WITH_TEST_GPU:-0}
LAYERS=${LAYERS:-0 1 2}
COMMON=(--enable-return-aux-hidden-states --speculative-algorithm EAGLE3
        --return-aux-hidden-state-layer-ids $LAYERS --chunked-prefill-size 256
        --disable-radix-cache --mem-fraction-static 0.3)
export HSCAPTURE_ENDPOINT='ipc:///tmp/hscap-test-{dp_rank}.sock'
export HSC_SRC=${HSC_SRC:-.}       # build hscapture from this checkout, not the bundle's copy
export DEADLINE_S=${DEADLINE_S:-280}
rc=0
run() {  # run NAME DEADLINE_S [extra SGLang flags...]
  local name=$1 deadline=$2; shift 2
  local client=(python3 -m pytest -p no:cacheprovider -q -rA -s tests/server)
  if [ "$WITH_TEST_GPU" = 1 ] && [ "$name" = graphs-overlap ]; then
    client=(bash -c 'python3 -m pytest -p no:cacheprovider -q -rf tests/test_gpu.py; a=$?;
            python3 -m pytest -p no:cacheprovider -q -rA -s tests/server; b=$?;
            [ $a = 0 ] && [ $b = 0 ]')
    deadline=$((deadline + 150))
  fi
  echo "=== real-server test: $name (deadline ${deadline}s)"
  DEADLINE_S=$deadline SERVE_LOG_DIR="$OUT/$name" bash .sgl/bin/serve.sh "${COMMON[@]}" "$@" \
    -- "${client[@]}" > "$OUT/$name.log" 2>&1
  local r=$?
  tail -25 "$OUT/$name.log"
  echo "--- $name: exit $r"
  [ "$r" = 0 ] || rc=1
}
for config in ${CONFIGS:-graphs-overlap eager-no-overlap}; do
  case $config in
    graphs-overlap) run graphs-overlap "$DEADLINE_S" ;;
    eager-no-overlap) run eager-no-overlap "$DEADLINE_S" --disable-cuda-graph --disable-overlap-schedule ;;
    retract) SGLANG_TEST_RETRACT=1 run retract "$DEADLINE_S" ;;
    *) echo "unknown config $config (graphs-overlap, eager-no-overlap, retract)" >&2; exit 90 ;;
  esac
done
exit $rc
