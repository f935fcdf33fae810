#!/usr/bin/env bash
# Set up everything hscapture needs on a fresh machine: a virtual environment in .venv with the
# pinned dependencies, the package itself (building the C++ ring once), and the SGLang test
# dependencies. Idempotent: a second run only reinstalls hscapture if its sources changed.
# Says what it does, one line per step (a fresh machine takes a few minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
step() { echo "setup: $*" >&2; }
if [ ! -x .venv/bin/python ]; then
  step "creating the virtual environment .venv ($("$PY" --version 2>&1))"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
stamp=.venv/.hscapture-deps
deps_hash=$({ cat requirements-ci.txt scripts/setup.sh; cat requirements-sglang-test.txt requirements-trainers-test.txt 2>/dev/null || true; } | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$deps_hash" ]; then
  step "upgrading pip"
  $VPY -m pip install -q --upgrade pip
  step "installing the pinned dependencies of requirements-ci.txt (torch CPU, transformers, ...; the longest step)"
  $VPY -m pip install -q -r requirements-ci.txt
  if [ -f scripts/install-sglang-test.sh ]; then
    step "installing SGLang and its light dependencies for tests/sglang (no GPU packages)"
    bash scripts/install-sglang-test.sh "$VPY"
  fi
  if [ -f requirements-trainers-test.txt ]; then
    step "installing the trainers (specforge, speculators) for the export tests, --no-deps"
    $VPY -m pip install -q --no-deps -r requirements-trainers-test.txt
  fi
  echo "$deps_hash" > "$stamp"
else
  step "dependencies are up to date"
fi
src_hash=$(cat pyproject.toml CMakeLists.txt $(git ls-files -co --exclude-standard csrc bindings | sort) | sha256sum | cut -c1-16)
if [ "$(cat .venv/.hscapture-src 2>/dev/null)" != "$src_hash" ]; then
  step "building the C++ ring and installing hscapture into .venv (pip install -e .)"
  $VPY -m pip install -q --no-deps -e .
  echo "$src_hash" > .venv/.hscapture-src
else
  step "hscapture is built and up to date"
fi
step "ready: .venv/bin/hscapture, .venv/bin/python"
