#!/usr/bin/env bash
# The real-server benchmark (benchmarks/bench_server.py) at both model shapes, one server each,
# back to back, on the GPU host, from the project root, with the SGLang bundle in .sgl/
# (../shared/sglang-gpu/README.md builds it); fits one 600 s device call (carry .sgl):
#
#   bash scripts/server_bench.sh OUT [EXPERIMENTS]
#
# 1B shape (make_llama.py --shape 1b: hidden 2048, 16 layers), aux layers 1 7 12, 2,048-token
# chunks, --mem-fraction-static 0.5; then the tiny Llama of .sgl/bin/make_tiny.py (hidden 512,
# 4 layers), aux layers 0 1 2, 256-token chunks. Both: capture-only EAGLE-3 mode, radix cache
# off, CUDA graphs and the overlap scheduler at SGLang's defaults, a 4 GiB ring (HSCAPTURE_RING_BYTES), the short and
# long mixes (8 prompts per HTTP request in the short one), capture on vs off plus the hook
# modes EXPERIMENTS (default noop: the plugin-absent proxy; also e.g. grace=0.05, a 50 ms
# commit grace, or nocapture: everything but Producer.capture) as candidates. Environment:
# PAIRS (8), ROUND_S (1.2), SHAPES (1b,tiny; 8b adds the 8B shape, after them), MIX (short,long), LOAD (rounds; steady: windows inside a
# continuous load, bench_server's SteadyLoad; a measurement then takes ~3 s plus ROUND_S),
# CONCURRENCY (HTTP requests in flight: 64, with LOAD=steady 16, which keeps 128 short
# prompts queued and lets a pause drain in well under a second), STEPS (gpu_round.sh steps run
# against each server: bench_server; e.g. bench_server,real_server adds tests/server on the
# same server, after the bench; STEPS_1B / STEPS_TINY for one shape alone), ALT (0; N: after
# the pairs of a steady load, ALT_S seconds (60) in the hook mode alt=N, capture on and off
# interleaved in blocks of N passes inside one window, bench_server --alt; ALT_LOG=0,50 and
# ALT_REPEAT=R: R rounds of one such window per pass log interval, bench_server --alt-log; ALT_STEP=0,48M: the same per budget of the deferred copies, --alt-step). With two candidates the tiny shape did not finish both mixes in
# its 270 s twice (one mix each time): SHAPES=tiny alone, or fewer PAIRS, for it.
# OUT/<shape>/ gets server.json, bench_server.log, serve.out, hook-final.json, forwards.bin.
# PACK=1: each shape's folder becomes OUT/<shape>.tar.xz once its run ends (forwards.bin
# compresses ~10x), and its bench_server.log is also kept beside it as OUT/<shape>.log: the
# device machine returns at most 8 files from OUT, and two shapes' folders hold 10 (2026-12-04c
# lost three of the tiny shape's that way).
# Exit 1 if a run failed (a goal missed is not a failure; a sample unaccounted for is).
set -u
OUT=${1:?usage: server_bench.sh OUT [EXPERIMENTS]}
EXPERIMENTS=${2:-noop}
SHAPES=${SHAPES:-1b,tiny}
# the ring: 4 GiB unless HSCAPTURE_RING_BYTES says otherwise (the pass log and the stage hold
# at most 1/16 of it each)
export HSC_SRC=. HSCAPTURE_RING_BYTES=${HSCAPTURE_RING_BYTES:-4G}
export HSCAPTURE_ENDPOINT='ipc:///tmp/hscap-{dp_rank}.sock'
export HSCAPTURE_STATS_FILE=/tmp/hsc-bench-hook.json HSCAPTURE_EXPERIMENT_FILE=/tmp/hsc-bench-mode
# every forward pass in every mode (hscapture.sglang.timing.ForwardLog): bench_server's
# scheduler-side throughput; copied to OUT/<shape>/forwards.bin (48 bytes a pass)
export HSCAPTURE_FORWARD_LOG=/tmp/hsc-bench-forwards.bin
export SERVER_LIMIT_S=${SERVER_LIMIT_S:-200}
LOAD=${LOAD:-rounds}
[ "$LOAD" = steady ] && CONCURRENCY=${CONCURRENCY:-16}
export BENCH_SERVER_ARGS="--pairs ${PAIRS:-8} --round-s ${ROUND_S:-1.2} --drain-s 30 --batch short=8,long=1 --mix ${MIX:-short,long} --experiments $EXPERIMENTS --load $LOAD --concurrency ${CONCURRENCY:-64} --alt ${ALT:-0} --alt-s ${ALT_S:-60} --alt-log=${ALT_LOG:-} --alt-step=${ALT_STEP:-} --alt-repeat ${ALT_REPEAT:-1}"
COMMON=(--enable-return-aux-hidden-states --speculative-algorithm EAGLE3 --disable-radix-cache)
mkdir -p "$OUT"
rc=0
run() {  # run SHAPE DEADLINE_S MODEL_PATH ("": the bundle's tiny Llama) [SGLang flags...]
  local shape=$1 deadline=$2 model=$3; shift 3
  [[ ",$SHAPES," == *",$shape,"* ]] || return 0
  local steps=${STEPS:-bench_server}
  [ "$shape" = 1b ] && steps=${STEPS_1B:-$steps}
  [ "$shape" = tiny ] && steps=${STEPS_TINY:-$steps}
  [ "$shape" = 8b ] && steps=${STEPS_8B:-$steps}
  mkdir -p "$OUT/$shape"
  rm -f "$HSCAPTURE_STATS_FILE" "$HSCAPTURE_EXPERIMENT_FILE" "$HSCAPTURE_FORWARD_LOG"
  echo "=== server bench: $shape"
  MODEL=$model DEADLINE_S=$deadline SERVE_LOG_DIR="/tmp/hsc-serve-$shape" bash .sgl/bin/serve.sh \
    "${COMMON[@]}" "$@" -- bash scripts/gpu_round.sh "$OUT/$shape" "$steps" \
    > "$OUT/$shape/serve.out" 2>&1
  local r=$?
  [ -f "$HSCAPTURE_FORWARD_LOG" ] && cp "$HSCAPTURE_FORWARD_LOG" "$OUT/$shape/forwards.bin"
  # alt=N windows: turn and hook time by position in the block (a cost landing on the turn
  # after a drain shows there, not in the block ratios: h200-2026-12-04d), into bench_server.log
  if [ "${ALT:-0}" != 0 ] && [ -f "$OUT/$shape/forwards.bin" ]; then
    { echo "--- alt_positions (the last window of the forward log)"
      python3 benchmarks/alt_positions.py "$OUT/$shape/forwards.bin"; } \
      >> "$OUT/$shape/bench_server.log" 2>&1
  fi
  grep -v " block " "$OUT/$shape/serve.out" | tail -24
  echo "--- $shape: exit $r"
  [ "$r" = 0 ] || rc=1
  if [ "${PACK:-0}" = 1 ]; then
    cp "$OUT/$shape/bench_server.log" "$OUT/$shape.log" 2>/dev/null
    tar cJf "$OUT/$shape.tar.xz" -C "$OUT" "$shape" && rm -rf "${OUT:?}/$shape"
  fi
}
if [[ ",$SHAPES," == *",1b,"* && ! -d /tmp/llama1b ]]; then
  python3 benchmarks/make_llama.py /tmp/llama1b --shape 1b > "$OUT/make_llama.log" 2>&1 || rc=1
fi
run 1b "${DEADLINE_1B:-300}" /tmp/llama1b --return-aux-hidden-state-layer-ids 1 7 12 \
  --chunked-prefill-size 2048 --mem-fraction-static 0.5
run tiny "${DEADLINE_TINY:-270}" "" --return-aux-hidden-state-layer-ids 0 1 2 \
  --chunked-prefill-size 256 --mem-fraction-static 0.3
# 8B shape (Llama-3.1-8B's: hidden 4096, 32 layers, GQA 32/8, 14,336 MLP), only when SHAPES names
# it: aux layers 1 15 28 (SpecForge's choice for 32 layers: 1, L/2 - 1, L - 4), 2,048-token chunks
# (a pass ~50-57 ms on an H100 at the steady load: 4-pass blocks, ALT=4, give ~130-150 pairs in
# two 30 s windows), 16 GB of bf16 weights written once to /tmp/llama8b (19 s there), 52-114 s to
# /health (h100-2026-12-07c)
if [[ ",$SHAPES," == *",8b,"* && ! -d /tmp/llama8b ]]; then
  python3 benchmarks/make_llama.py /tmp/llama8b --shape 8b > "$OUT/make_llama8b.log" 2>&1 || rc=1
fi
run 8b "${DEADLINE_8B:-420}" /tmp/llama8b --return-aux-hidden-state-layer-ids 1 15 28 \
  --chunked-prefill-size 2048 --mem-fraction-static 0.8
exit $rc
