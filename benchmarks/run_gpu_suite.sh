#!/usr/bin/env bash
# Every benchmark on the GPU machine, one command, about 8 minutes in all.
# Usage: bash benchmarks/run_gpu_suite.sh OUT_DIR
#   env WHEELS=DIR   install pyzmq (and anything else needed) from DIR first, offline
#   env DISK_DIR=DIR local-disk target for bench_e2e / bench_shards (default /var/tmp/hsc-bench)
# Writes OUT_DIR/<bench>.json (+ .png when matplotlib imports), OUT_DIR/<bench>.log, and
# OUT_DIR/machine.txt. Each step has its own time limit; one failing step does not stop the rest;
# the exit status is 1 when any step failed. bench_hook skips itself when sglang does not import.
#   env STEPS=a,b   run only these steps (names as below; default all of them)
#   env NO_BUILD=1  use the hscapture already importable (e.g. built into a PYTHONPATH folder)
set -u
OUT=${1:?usage: run_gpu_suite.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
R=$(cd "$(dirname "$0")/.." && pwd)
DISK=${DISK_DIR:-/var/tmp/hsc-bench}
PY=${PYTHON:-python3}
mkdir -p "$DISK"
export PYTHONUNBUFFERED=1
cd "$R"
if [ -n "${WHEELS:-}" ]; then
  $PY -m pip install -q --no-index --find-links "$WHEELS" pyzmq > "$OUT/wheels.log" 2>&1 \
    || { echo "WHEELS install failed"; tail -5 "$OUT/wheels.log"; }
fi
if [ -z "${NO_BUILD:-}" ]; then
  $PY -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 \
    || { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; }
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc; free -g;
  df -h /dev/shm "$DISK"; git -C "$R" rev-parse HEAD;
  $PY -c "import torch; print('torch', torch.__version__, torch.version.cuda)"; } \
  > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
FAILED=()
step() {  # step NAME TIMEOUT_S CMD...
  local name=$1 t=$2; shift 2
  [ -z "${STEPS:-}" ] || [[ ",$STEPS," == *",$name,"* ]] || return 0
  local t0=$SECONDS
  echo "=== $name (limit ${t}s)"
  timeout "$t" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "--- $name exit $rc after $((SECONDS - t0))s"
  grep -E "goal|SKIP|MET|MISSED|Error|error" "$OUT/$name.log" | grep -v "^ *warnings" | tail -20
  [ "$rc" = 0 ] || FAILED+=("$name")
}
B=benchmarks
step bench_ring     75 $PY $B/bench_ring.py --gb 0.5 --out "$OUT/bench_ring.json"
step bench_shards   60 $PY $B/bench_shards.py --dir /dev/shm --dir "$DISK" --total-mib 512 \
  --out "$OUT/bench_shards.json"
step gpu_copy       60 $PY $B/bench_gpu.py copy --copy-gb 0.5 --out-dir "$OUT"
step gpu_notices    60 $PY $B/bench_gpu.py notices --notices 30000 --paced-seconds 0.5 --out-dir "$OUT"
step bench_stream  240 $PY $B/bench_stream.py --device cuda --out "$OUT/bench_stream.json"
step bench_hook    200 $PY $B/bench_hook.py --device cuda --out "$OUT/bench_hook.json"
step gpu_overhead  180 $PY $B/bench_gpu.py overhead --iters "${OVERHEAD_ITERS:-6}" --out-dir "$OUT"
step bench_e2e     120 $PY $B/bench_e2e.py --device cuda --gb 1 --old-gb 0.25 --ring-mb 1024 \
  --disk-dir "$DISK" --out "$OUT/bench_e2e.json"
step bench_compact  150 $PY $B/bench_compact.py --samples 32 --tokens 1024 --hidden 2048 --layers 16 \
  --dir /dev/shm --out "$OUT/bench_compact.json"
echo "suite done in ${SECONDS}s; results in $OUT"
if [ ${#FAILED[@]} -gt 0 ]; then echo "FAILED: ${FAILED[*]}"; exit 1; fi
