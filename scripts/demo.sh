#!/usr/bin/env bash
# The main job on its embedded default: capture a small random-weight Llama on CPU through the
# real capture path (ring + ZeroMQ + drain in another process) and verify the shards bit-exact.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# --overwrite: a second run replaces the first run's demo-out (only the demo's own files)
exec .venv/bin/hscapture demo --overwrite "$@"
