"""Does the export lose its multi-worker speed to its process (the GIL, one address space) or
to the machine? A diagnostic for issue 9, not a benchmark of a goal.

    python scripts/export_scaling.py --dir /var/tmp/xs [--samples 300] [--workers 4] [--reps 3]

Builds one shard directory of ``--samples`` samples and ``--workers`` directories of
``samples / workers`` each (bench_export's samples: 512 tokens, hidden 2048, 4 aux layers +
final, bf16). Then, alternating for ``--reps`` repetitions:

- ``threads``: one process runs ``export(all, workers=W)`` (the export as shipped);
- ``processes``: W processes each run ``export(its part, workers=1)`` at once.

Each child process imports and opens everything first, says ready, and starts on the
parent's ``go`` line (its stdin); it reports its export's start and end (CLOCK_MONOTONIC,
shared by the processes). Figure: bytes written / (last end - first start). If processes
beat threads by far, the export's workers lose to what they share in one process.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))

CHILD = r"""
import json, sys, time
from hscapture.export import export
src, out, fmt, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
print("ready", flush=True)
sys.stdin.readline()
t0 = time.monotonic()
r = export(src, out, fmt, workers=workers, progress=False, fsync=False, overwrite=True)
t1 = time.monotonic()
print(json.dumps({"t0": t0, "t1": t1, "bytes": r.bytes_written}), flush=True)
"""


def run(jobs: list[tuple[str, str, int]], fmt: str) -> dict:
    procs = []
    for src, out, w in jobs:
        shutil.rmtree(out, ignore_errors=True)
        procs.append(subprocess.Popen([sys.executable, "-c", CHILD, src, out, fmt, str(w)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    for p in procs:
        line = p.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"child not ready: {line!r}")
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    res = [json.loads(p.stdout.readline()) for p in procs]
    for p in procs:
        if p.wait(120) != 0:
            raise RuntimeError("child failed")
    span = max(r["t1"] for r in res) - min(r["t0"] for r in res)
    total = sum(r["bytes"] for r in res)
    return {"GBps": total / span / 1e9, "seconds": span, "bytes": total}


def main() -> int:
    import bench_export

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--formats", default="speculators,specforge")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    W = a.workers
    os.makedirs(a.dir, exist_ok=True)
    whole = os.path.join(a.dir, "src-all")
    parts = [os.path.join(a.dir, f"src-{k}") for k in range(W)]
    for d, n in [(whole, a.samples)] + [(p, a.samples // W) for p in parts]:
        shutil.rmtree(d, ignore_errors=True)
        bench_export.build(d, n, 512, 2048)
    out: dict = {}
    for fmt in a.formats.split(","):
        figs: dict[str, list[float]] = {"threads": [], "processes": []}
        for rep in range(a.reps + 1):   # the first is a warm-up
            order = ("threads", "processes") if rep % 2 == 0 else ("processes", "threads")
            for m in order:
                if m == "threads":
                    r = run([(whole, os.path.join(a.dir, "out-all"), W)], fmt)
                else:
                    r = run([(p, os.path.join(a.dir, f"out-{k}"), 1)
                             for k, p in enumerate(parts)], fmt)
                if rep:
                    figs[m].append(r["GBps"])
                print(f"{fmt} rep {rep - 1} {m}: {r['GBps']:.2f} GB/s ({r['seconds']:.2f} s)",
                      flush=True)
        out[fmt] = {m: {"median": statistics.median(v), "min": min(v), "max": max(v),
                        "values": v} for m, v in figs.items()}
        print(f"{fmt}: threads {out[fmt]['threads']['median']:.2f} GB/s, processes "
              f"{out[fmt]['processes']['median']:.2f} GB/s", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": vars(a), "results": out}, f, indent=1)
    for d in [whole, *parts]:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
