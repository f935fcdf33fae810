#!/usr/bin/env python3
"""How fast a Subscriber turns ring entries into samples, the producer out of the way.

    python benchmarks/bench_delivery.py [--entries 1500] [--rows 64] [--reps 5] [--zero-copy]
                                        [--out FILE]

Why: end to end (``bench_gpu.py notices``) the producer and the subscriber share the machine,
and on the 2-core CPU machine the producer's own issuing takes half of it. Here a producer
in this process first writes ``--entries`` entries of ``--rows`` one-token samples each
(64 x bf16, an ``extra`` map of two keys as the notices benchmark and every SGLang sample
carry) into a ring large enough for all of them. Then the clock runs while the subscriber
takes every sample out (``poll`` + ``release``, reading ``meta["extra"]``). Timed: that drain
only, per repetition with a fresh producer and subscriber. Reported: samples/s and us per
sample, median and min-max of ``--reps``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE.parent))   # an installed hscapture wins over the uncompiled checkout


def one(entries: int, rows: int, zero_copy: bool) -> tuple[int, float]:
    """(samples received, seconds) of one drain."""
    import torch

    from hscapture import Producer, Subscriber

    ep = f"ipc:///tmp/hsc-bench-delivery-{uuid.uuid4().hex[:8]}.sock"
    per_entry = rows * (64 * 2 + 4 + 96) + 4096
    p = Producer(ep, producer_id="bd" + uuid.uuid4().hex[:6],
                 capacity=max(64 << 20, 2 * entries * per_entry), full_policy="wait",
                 wait_timeout_s=30)
    sub = Subscriber(ep, zero_copy=zero_copy)
    try:
        sub.wait_ready(10)
        block = torch.randn(rows, 64).to(torch.bfloat16)
        ids = torch.full((rows,), 7, dtype=torch.int32)
        n = 0
        for _ in range(entries):
            maps = []
            for _ in range(rows):
                n += 1
                maps.append({"rid": f"n{n}", "token_start": 0, "token_count": 1, "last": True,
                             "cached_prefix": 0, "extra": {"t": n, "ph": "x"}, "fields": {}})
            if not p.capture_rows(maps, list(range(rows)), [block], layers=[0], token_ids=ids):
                raise RuntimeError("a capture was dropped: the ring is too small")
        p.flush()
        got = 0
        t0 = time.perf_counter()
        while got < n:
            s = sub.poll(timeout=5)
            if s is None:
                break
            _ = s.meta["extra"]
            s.release()
            got += 1
        return got, time.perf_counter() - t0
    finally:
        sub.close()
        p.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entries", type=int, default=1500)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--zero-copy", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.reps < 5:
        ap.error(f"--reps must be >= 5, found {a.reps}")
    rates = []
    for _ in range(a.reps):
        got, secs = one(a.entries, a.rows, a.zero_copy)
        if got != a.entries * a.rows:
            print(f"received {got} of {a.entries * a.rows} samples", file=sys.stderr)
            return 1
        rates.append(got / secs)
    med = statistics.median(rates)
    print(f"delivery: {med:,.0f} samples/s [{min(rates):,.0f} .. {max(rates):,.0f}], "
          f"{1e6 / med:.1f} us per sample ({a.entries} entries x {a.rows} rows, zero_copy="
          f"{a.zero_copy}, {a.reps} reps)")
    if a.out:
        Path(a.out).write_text(json.dumps({
            "what": "Subscriber drain of pre-written entries: poll + release per sample",
            "entries": a.entries, "rows": a.rows, "zero_copy": a.zero_copy,
            "samples_per_s": {"median": med, "min": min(rates), "max": max(rates),
                              "all": rates}}, indent=1))
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
