#!/usr/bin/env bash
# A/B a change to hscapture's Python modules on one machine, candidate and baseline alternating.
# Usage: bash benchmarks/ab_python.sh REV PAIRS OUT_DIR -- CMD [ARGS...]
#   Builds the working tree once into OUT_DIR/B (the candidate: native core + every module),
#   copies it to OUT_DIR/A and puts back hscapture/*.py as they are at git REV there (the
#   baseline). Refuses when the native core differs between REV and the working tree (the two
#   trees share one build). Then runs CMD PAIRS times with PYTHONPATH=A and with PYTHONPATH=B,
#   alternating (A B, B A, A B, ...: neither side always goes first), each run's output in
#   OUT_DIR/{A,B}-{i}.log. Compare the runs' figures yourself (medians and spreads per side).
#   env WHEELS=DIR installs pyzmq from DIR first, offline (the GPU machine: WHEELS=.sgl/whl).
#   env BUILD_ARGS=... replaces pip's --no-build-isolation (BUILD_ARGS= where the build
#   backend is not installed in the interpreter, as in scripts/setup.sh's .venv).
set -eu
REV=${1:?usage: ab_python.sh REV PAIRS OUT_DIR -- CMD...}; PAIRS=${2:?}; OUT=${3:?}
shift 3; [ "${1:-}" = "--" ] && shift
[ $# -gt 0 ] || { echo "no command" >&2; exit 2; }
PY=${PYTHON:-python3}
if ! git diff --quiet "$REV" -- csrc bindings CMakeLists.txt pyproject.toml 2>/dev/null; then
  echo "the native core or build differs from $REV: one build cannot serve both sides" >&2
  exit 2
fi
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
if [ -n "${WHEELS:-}" ]; then
  $PY -m pip install -q --no-index --find-links "$WHEELS" pyzmq > "$OUT/wheels.log" 2>&1 || true
fi
rm -rf "$OUT/A" "$OUT/B"
$PY -m pip install -q ${BUILD_ARGS---no-build-isolation} --no-deps --target "$OUT/B" . > "$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log"; exit 1; }
cp -r "$OUT/B" "$OUT/A"
changed=$(git diff --name-only "$REV" -- 'hscapture/*.py' 'hscapture/**/*.py')
for f in $changed; do
  if git cat-file -e "$REV:$f" 2>/dev/null; then git show "$REV:$f" > "$OUT/A/$f"
  else rm -f "$OUT/A/$f"; fi
done
echo "baseline $REV, candidate: working tree; modules that differ: ${changed:-none}"
# PYTHONPATH must win: an editable install (scripts/setup.sh's .venv) puts a finder before
# sys.path that would give both sides the checkout's modules (2026-12-07: an A/B on the CPU
# machine compared the working tree with itself). Run it with a Python that has hscapture
# installed normally, or not at all.
case "$PY" in /*|"") ;; */*) PY="$(pwd)/$PY" ;; esac   # (checked from / below)
for side in A B; do
  got=$(cd / && PYTHONPATH="$OUT/$side" $PY -c 'import hscapture; print(hscapture.__file__)' \
        2>&1 | tail -1) || true
  case "$got" in
    "$OUT/$side/"*) ;;
    *) echo "side $side imports hscapture from ${got:-nowhere}, not $OUT/$side: an editable" \
            "install wins over PYTHONPATH; use a Python without it" >&2; exit 2 ;;
  esac
done
for i in $(seq 1 "$PAIRS"); do
  if [ $((i % 2)) = 1 ]; then order="A B"; else order="B A"; fi
  for side in $order; do
    PYTHONPATH="$OUT/$side" "$@" > "$OUT/$side-$i.log" 2>&1 || echo "$side-$i exit $?"
    echo "$side-$i: $(tail -1 "$OUT/$side-$i.log")"
  done
done
