#!/usr/bin/env bash
# Everything that needs the GPU machine, in one go: build, GPU tests, GPU + ring + e2e benchmarks.
# Usage: bash benchmarks/run_gpu_suite.sh OUT_DIR [1|2|all]  (results: OUT_DIR/results-PART.tgz)
# Part 1: build, GPU tests, ring benchmark, GPU copy + notices; part 2: capture overhead + e2e.
# Each step is bounded and independent: one failing step does not stop the others.
set -u
OUT=${1:?usage: run_gpu_suite.sh OUT_DIR [1|2|all]}
PART=${2:-all}
R=$(cd "$(dirname "$0")/.." && pwd)
RES=/tmp/hsc-gpu-results-$PART
rm -rf "$RES" && mkdir -p "$RES"
export PYTHONUNBUFFERED=1
cd "$R"
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$RES/build.log" 2>&1 \
  || { echo "BUILD FAILED"; tail -30 "$RES/build.log"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc; free -g;
  df -h /dev/shm /tmp "$R"; python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"; } \
  > "$RES/machine.txt" 2>&1
cat "$RES/machine.txt"
step() {  # step NAME TIMEOUT CMD...
  local name=$1 t=$2; shift 2
  echo "=== $name"
  (cd /tmp && timeout "$t" "$@") > "$RES/$name.log" 2>&1
  echo "--- $name exit $?"; tail -${TAIL:-25} "$RES/$name.log"
}
if [ "$PART" != 2 ]; then
  TAIL=15 step gpu-tests 150 python3 -m pytest -q -p no:cacheprovider -W ignore::UserWarning \
    "$R/tests/test_gpu.py" "$R/tests/test_capture.py" -k "gpu or exact or restart or drain"
  TAIL=12 step bench-ring 100 python3 "$R/benchmarks/bench_ring.py" --out "$RES/bench_ring.json"
  step bench-gpu-copy 90 python3 "$R/benchmarks/bench_gpu.py" copy --out-dir "$RES/gpu"
  step bench-gpu-notices 90 python3 "$R/benchmarks/bench_gpu.py" notices --out-dir "$RES/gpu"
fi
if [ "$PART" = 2 ]; then
  TAIL=12 step gpu-tests 90 python3 -m pytest -q -p no:cacheprovider -W ignore::UserWarning \
    "$R/tests/test_gpu.py"
  step bench-gpu-copy 90 python3 "$R/benchmarks/bench_gpu.py" copy --out-dir "$RES/gpu"
fi
if [ "$PART" = 3 ]; then   # after changes to the write path / adapter: re-measure those
  TAIL=12 step gpu-tests 90 python3 -m pytest -q -p no:cacheprovider -W ignore::UserWarning \
    "$R/tests/test_gpu.py"
  TAIL=12 step bench-shards 120 python3 "$R/benchmarks/bench_shards.py" --dir /dev/shm \
    --dir /tmp/hsc-shards-disk --out "$RES/bench_shards.json"
fi
if [ "$PART" != 1 ]; then
  step bench-gpu-overhead 180 python3 "$R/benchmarks/bench_gpu.py" overhead --out-dir "$RES/gpu"
  step bench-gpu-e2e 180 python3 "$R/benchmarks/bench_gpu.py" e2e --out-dir "$RES/gpu" \
    --disk-dir /tmp/hsc-e2e-disk
fi
tar czf "$OUT/results-$PART.tgz" -C "$RES" .
