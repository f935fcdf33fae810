#!/usr/bin/env bash
# One round of GPU checks, as the client of .sgl/bin/serve.sh (a real SGLang server with the
# plugin is up, tiny model, capture-only EAGLE-3 mode), from the project root:
#
#   HSC_SRC=. HSCAPTURE_ENDPOINT='ipc:///tmp/hscap-{dp_rank}.sock' \
#   HSCAPTURE_STATS_FILE=/tmp/hook.json HSCAPTURE_EXPERIMENT_FILE=/tmp/hook-mode \
#   bash .sgl/bin/serve.sh --enable-return-aux-hidden-states --speculative-algorithm EAGLE3 \
#       --return-aux-hidden-state-layer-ids 0 1 2 --chunked-prefill-size 256 \
#       --disable-radix-cache --mem-fraction-static 0.3 -- bash scripts/gpu_round.sh OUT [STEPS]
#
# STEPS (default all, comma-separated): test_gpu, capture_call, bench_hook, bench_stream,
# bench_server, real_server. Each step has its own time limit and log OUT/<step>.log; a failing step does not
# stop the others; the exit status is 1 when any failed. Rough times on the H200: server start
# 60-120 s, test_gpu ~100 s, capture_call ~2 min, bench_hook (1b) ~105 s, bench_stream --reps 3
# ~130 s, bench_server (two mixes, on/off/noop, --pairs 8 --round-s 1) ~5 min, real_server
# ~80 s: one 600 s device call holds the server start and two or three steps, not all.
set -u
OUT=${1:?usage: gpu_round.sh OUT [STEPS]}
STEPS=${2:-test_gpu,capture_call,bench_hook,bench_stream,bench_server,real_server}
mkdir -p "$OUT"
FAILED=()
step() {  # step NAME LIMIT_S CMD...
  local name=$1 t=$2; shift 2
  [[ ",$STEPS," == *",$name,"* ]] || return 0
  local t0=$SECONDS
  echo "=== $name (limit ${t}s)"
  timeout -k 5 "$t" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "--- $name exit $rc after $((SECONDS - t0))s"
  tail -n "${TAIL:-12}" "$OUT/$name.log"
  [ "$rc" = 0 ] || FAILED+=("$name")
}
PY=${PY:-python3}
step test_gpu 150 $PY -m pytest -q -p no:cacheprovider -rf tests/test_gpu.py
step capture_call 90 $PY benchmarks/bench_capture_call.py --out "$OUT/capture_call.json"
step bench_hook "${HOOK_LIMIT_S:-110}" $PY benchmarks/bench_hook.py --device cuda --shapes "${HOOK_SHAPES:-1b}" \
  --out "$OUT/bench_hook.json"
step bench_stream 100 $PY benchmarks/bench_stream.py --device cuda --reps 3 \
  --out "$OUT/bench_stream.json"
step bench_server "${SERVER_LIMIT_S:-360}" $PY benchmarks/bench_server.py --out "$OUT/server.json" \
  ${BENCH_SERVER_ARGS:---pairs 8 --round-s 1}
# production mode for the test whatever a step before left in the mode file (a bench_server
# killed inside an alt=N window leaves the hook skipping every other block)
[ -n "${HSCAPTURE_EXPERIMENT_FILE:-}" ] && [ -f "$HSCAPTURE_EXPERIMENT_FILE" ] && : > "$HSCAPTURE_EXPERIMENT_FILE"
step real_server 150 $PY -m pytest -p no:cacheprovider -q -rA -s tests/server
[ -f "${HSCAPTURE_STATS_FILE:-/nonexistent}" ] && cp "$HSCAPTURE_STATS_FILE" "$OUT/hook-final.json"
if [ ${#FAILED[@]} -gt 0 ]; then echo "FAILED: ${FAILED[*]}"; exit 1; fi
