#!/usr/bin/env bash
# On the GPU host, from the project root, with the SGLang bundle's wheels and trimmed archives
# carried (.sgl/whl, .sgl/sglang-trim.tar.xz, .sgl/sgl_kernel-trim.tar.xz): install them and
# hscapture (built from this checkout) into /tmp/site WITHOUT starting a server (.sgl/bin/serve.sh
# does the same before it starts one, ~60-125 s more), then run the command with that site first
# on PYTHONPATH. For benchmarks that import SGLang's classes but need no server:
#
#   bash scripts/gpu_site.sh python3 benchmarks/bench_hook.py --device cuda --graph --steady
#
# Exit 91 when the install fails (its log: /tmp/sl/install.log); else the command's status.
set -u
SITE=/tmp/site
B=.sgl
mkdir -p "$SITE" /tmp/sl
if [ ! -f "$SITE/.done" ]; then
  python3 -m pip install --no-index --no-deps --no-compile --disable-pip-version-check \
    --target "$SITE" "$B"/whl/*.whl > /tmp/sl/install.log 2>&1 || { tail /tmp/sl/install.log; exit 91; }
  tar -xJf "$B/sglang-trim.tar.xz" -C "$SITE" & tar -xJf "$B/sgl_kernel-trim.tar.xz" -C "$SITE" &
  wait
  touch "$SITE/.done"
fi
python3 -m pip install --no-index --no-build-isolation --no-deps --upgrade \
  --disable-pip-version-check --target "$SITE" . >> /tmp/sl/install.log 2>&1 \
  || { tail -30 /tmp/sl/install.log; exit 91; }
export PYTHONPATH=$SITE PYTHONSAFEPATH=1 SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1
"$@"
