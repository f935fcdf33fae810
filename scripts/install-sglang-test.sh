#!/usr/bin/env bash
# SGLang's real classes for tests/sglang on a CPU machine: sglang 0.5.23 and the light
# pure-Python packages its imports need, all with --no-deps (sglang pins a CUDA torch 2.14.1 and
# CUDA kernel wheels that must not come in). triton and torchvision are not installed: see
# tests/sglang/conftest.py.
set -euo pipefail
VPY=${1:-python3}
cd "$(dirname "$0")/.."
$VPY -m pip install -q --no-deps -r requirements-sglang-test.txt
