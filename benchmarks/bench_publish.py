#!/usr/bin/env python3
"""What the inline commit + notice of an entry costs the capturing thread, caches warm and cold.

    python benchmarks/bench_publish.py [--reps 5] [--calls 300] [--sweep-mib 64]
                                       [--interval-ms MS] [--out FILE]

Why: in the real SGLang server this stage took 92-101 us of each capturing forward (H200,
benchmarks/results/h200-2026-12-02), second only to the copy submission. Unlike
``bench_capture_host.py``, whose subscriber is a thread of the benchmark's own process (it
takes the GIL while the notice's send has released it, so that stage reads high there), the
subscriber here is another process, as in a server.

What is timed: the producer's own stage counters (``Producer.timed``): ``time_publish_ns``
and its thread CPU ``time_publish_cpu_ns`` per ``capture_rows`` call, i.e. the capturing
thread committing and announcing what completed (on this CPU path: the entry it just wrote).
Outside the timed region: the capture itself (reported beside it as ``whole call``), the
cache sweep of ``cold`` (one byte per cache line of ``--sweep-mib`` before each call, an
engine's working set between forwards) and a 0.2 ms pause after each call (a forward's gap: a
ZeroMQ send into an idle pipe wakes the library's I/O thread, back to back it does not).
Each call captures one row of 16 tokens, [16, 256] bf16, host tensors. Modes alternate hot,
cold in every repetition; per repetition the median of ``--calls``; reported: median and
min-max over ``--reps``. ``--interval-ms`` adds a third mode, ``cold+interval``: cold calls
with the producer's ``publish_interval_s`` at MS (the SGLang hook coalesces its publishing
so), where most calls publish nothing and some publish several entries back to back: for it,
and beside the others, the MEAN per call is the figure (``*_mean`` keys).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE.parent))   # an installed hscapture wins over the uncompiled checkout

SUBSCRIBER = """
import sys, hscapture
with hscapture.Subscriber(sys.argv[1]) as s:
    s.wait_ready(timeout=30)
    print('ready', flush=True)
    while (x := s.poll(timeout=3.0)) is not None:
        x.release()
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--sweep-mib", type=int, default=64)
    ap.add_argument("--interval-ms", type=float, default=0.0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.reps < 5:
        ap.error(f"--reps must be >= 5, found {a.reps}")
    import numpy as np
    import torch

    from hscapture import Producer

    ep = f"ipc:///tmp/hsc-bench-publish-{uuid.uuid4().hex[:8]}.sock"
    p = Producer(ep, producer_id="bp" + uuid.uuid4().hex[:6], capacity=64 << 20)
    sub = subprocess.Popen([sys.executable, "-c", SUBSCRIBER, ep], stdout=subprocess.PIPE,
                           text=True)
    try:
        if sub.stdout.readline().strip() != "ready" or not p.wait_for_consumers(1, 30):
            print("the subscriber process did not attach", file=sys.stderr)
            return 1
        p.timed = True
        block = torch.randn(16, 256).to(torch.bfloat16)
        ids = torch.arange(16, dtype=torch.int32)
        sweep = np.zeros(a.sweep_mib << 20, dtype=np.uint8)
        keys = ("publish", "publish_cpu", "whole")
        modes = ("hot", "cold") + (("cold+interval",) if a.interval_ms > 0 else ())
        res = {m: {k: [] for k in keys + tuple(f"{k}_mean" for k in keys)} for m in modes}
        c = p._counters
        n = 0
        for _ in range(a.reps + 1):                      # the first repetition warms up
            for mode in modes:
                p.publish_interval_s = a.interval_ms / 1e3 if mode == "cold+interval" else 0.0
                p.flush(timeout_s=10)
                got = {k: [] for k in keys}
                for _ in range(a.calls):
                    n += 1
                    rows = [{"rid": f"r{n}", "token_start": 0, "token_count": 16, "last": True,
                             "cached_prefix": 0, "extra": {}, "fields": {}}]
                    if mode != "hot":
                        sweep[::64] += 1
                    pub, cpu = c["time_publish_ns"], c["time_publish_cpu_ns"]
                    t = time.perf_counter_ns()
                    p.capture_rows(rows, [0], [block], layers=[0], token_ids=ids)
                    got["whole"].append(time.perf_counter_ns() - t)
                    got["publish"].append(c["time_publish_ns"] - pub)
                    got["publish_cpu"].append(c["time_publish_cpu_ns"] - cpu)
                    time.sleep(0.0002)
                for k in keys:
                    res[mode][k].append(statistics.median(got[k]) / 1e3)
                    res[mode][f"{k}_mean"].append(statistics.fmean(got[k]) / 1e3)
        out = {"what": "inline commit + notice per capture_rows call (Producer.timed "
                       "counters), subscriber in another process", "reps": a.reps,
               "calls": a.calls, "sweep_mib": a.sweep_mib, "interval_ms": a.interval_ms,
               "results_us": {}}
        for mode in modes:
            out["results_us"][mode] = {}
            for k in res[mode]:
                v = res[mode][k][1:]
                out["results_us"][mode][k] = {"median": round(statistics.median(v), 2),
                                              "min": round(min(v), 2), "max": round(max(v), 2)}
                print(f"{mode:13s} {k:16s} median {statistics.median(v):7.1f} us  "
                      f"[{min(v):.1f} .. {max(v):.1f}]", flush=True)
        out["stats"] = {k: v for k, v in p.stats().items() if isinstance(v, int)}
        if a.out:
            Path(a.out).write_text(json.dumps(out, indent=1))
            print(f"wrote {a.out}")
        return 0
    finally:
        p.close()
        try:
            sub.wait(10)
        except subprocess.TimeoutExpired:
            sub.kill()


if __name__ == "__main__":
    sys.exit(main())
