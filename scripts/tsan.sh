#!/usr/bin/env bash
# ThreadSanitizer run of the C++ ring stress test (tests/cpp/ring_stress.cpp): a producer thread
# and two consumer threads (a durable subscription that detaches and resumes, an anonymous one
# that re-registers) on one real /dev/shm segment, random record sizes, checksummed payloads.
#
# Usage: scripts/tsan.sh [iterations=5] [records=200000]
#   runs ring_stress `iterations` times (seeds 1..iterations), `records` records each.
# Builds into ${HSCAPTURE_TSAN_BUILD_DIR:-build/tsan} (incremental). Exit status 0 = no data race
# reported and every record checked; TSan reports make the run fail (exit 66).
set -euo pipefail
cd "$(dirname "$0")/.."
ITERATIONS=${1:-5}
RECORDS=${2:-200000}
BUILD=${HSCAPTURE_TSAN_BUILD_DIR:-build/tsan}
cmake -S . -B "$BUILD" -DHSCAPTURE_BUILD_MODULE=OFF -DHSCAPTURE_BUILD_TESTS=ON \
  -DHSCAPTURE_TSAN_SHARED_MAPPINGS=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="-fsanitize=thread -g" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target ring_stress >/dev/null
export TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
for i in $(seq 1 "$ITERATIONS"); do
  "$BUILD/ring_stress" "$RECORDS" "$i"
done
echo "tsan.sh: $ITERATIONS run(s) of $RECORDS records: OK"
