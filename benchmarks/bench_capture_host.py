#!/usr/bin/env python3
"""Host time of one ``Producer.capture_rows`` call, with the calling thread's caches warm and cold.

    python benchmarks/bench_capture_host.py [--calls 300] [--reps 5] [--sweep-mib 64]
                                            [--rows 1] [--breakdown] [--meta-ab] [--torch-costs]
                                            [--out FILE]

Why: the H200 runs (benchmarks/results/h200-2026-12-01d/) found that what capture costs an
engine is host time on the thread that runs the forward: a transformers prefill loop
synchronizes once per forward and SGLang's scheduler is one batch ahead at most, so the
capture's Python lands on the critical path; and it costs ~4x more there (~0.4 ms) than in a
tight loop (~0.1 ms), because an engine's own work between two forwards evicts the capture
path from the caches. This benchmark reproduces both conditions on any machine, no GPU
needed, so that a change to the hot path can be measured where it is made:

- ``hot``: calls back to back;
- ``cold``: before each call, one byte of every cache line of a ``--sweep-mib`` buffer is
  written (an engine's working set between forwards), outside the timed region.

Each call captures one row of 16 tokens (3 aux layers packed ``[T, 3H]`` + final norm, H=64,
bf16, host tensors: the copies are a few KiB, so the time is the bookkeeping: checks, entry
meta, reservation, header, the copies, the inline commit and notice of the previous entry).
A subscriber (another thread's poll in this process, after every call, untimed) releases every
entry. Modes alternate within each repetition (ABBA), ``--reps`` counted after a warm-up; per
repetition the median of ``--calls`` calls; reported: median of those and min-max.
``--breakdown`` adds, per mode, the median time of each producer stage (wrapped timers, which
add ~0.3 us per stage; the totals of that pass are not the figures). ``--meta-ab`` adds cold
calls with the entry meta planned natively (``hscapture._meta``, the default) vs by
record.py's Python reference, alternating in this one process (ABBA), as a paired ratio.
``--rows`` rows per call (16 tokens each; an SGLang forward of the 1B short mix has ~4-8).
``--torch-costs`` adds what the capture path's torch calls cost hot and cold, by themselves:
25 tensor attribute reads (the facts of two blocks and the token ids, as the checks and the
copy submission read them) and one small op (a slice and an int32 copy of 2,048 ids, as
``take_ids`` does); on a GPU host the op would be a CUDA dispatch, here a CPU one.

On a GPU host the CUDA copy paths differ (``bench_capture_call.py`` measures those); the
rest of the path is this one.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE.parent))   # an installed hscapture wins over the uncompiled checkout
sys.path.insert(0, str(HERE))

import _stats  # noqa: E402

STAGES = (("producer", "_check_blocks", "checks"), ("rec", "plan_batch", "entry meta"),
          ("self", "_reserve", "reserve"), ("rec", "write_header", "header"),
          ("copier", "copy_into", "copies"), ("self", "_enqueue", "enqueue"),
          ("self", "_publish_inline", "inline publish"), ("nt", "entry_frame", "notice encode"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sweep-mib", type=int, default=64)
    ap.add_argument("--breakdown", action="store_true")
    ap.add_argument("--meta-ab", action="store_true")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--torch-costs", action="store_true")
    ap.add_argument("--out", default="bench-results/bench_capture_host.json")
    a = ap.parse_args()
    if a.reps < 5:
        ap.error(f"--reps must be >= 5, found {a.reps}")

    import numpy as np
    import torch

    import hscapture.producer as P
    from hscapture import Producer, Subscriber

    h, T = 64, 16
    ep = f"ipc:///tmp/hsc-bch-{uuid.uuid4().hex[:8]}.sock"
    prod = Producer(ep, producer_id=f"bch-{uuid.uuid4().hex[:8]}", capacity=1 << 28)
    sub = Subscriber(ep)
    sub.wait_ready(timeout=30)
    g = torch.Generator().manual_seed(0)
    R = a.rows
    aux = torch.randn(2 * T * R, 3 * h, generator=g).to(torch.bfloat16)
    last = torch.randn(2 * T * R, h, generator=g).to(torch.bfloat16)
    ids = torch.randint(0, 32000, (2 * T * R,), generator=g)
    starts = [2 * T * r for r in range(R)]
    layers, kinds = [1, 2, 3, 15], ["residual"] * 3 + ["final_norm"]
    lmap = [[0, 0], [0, h], [0, 2 * h], [1, 0]]
    sweep = np.ones(a.sweep_mib << 20, dtype=np.uint8)
    count = [0]

    def drain() -> None:
        while (s := sub.poll(timeout=0.0)) is not None:
            s.release()

    def run(mode: str) -> float:
        ws = []
        for _ in range(a.calls):
            if mode == "cold":
                sweep[::64] += 1            # every cache line of the sweep buffer
            count[0] += 1
            maps = [{"rid": f"c{count[0]}-{r}", "token_start": 0, "token_count": T,
                     "last": True, "cached_prefix": 0, "extra": {"attempt": 0}, "fields": {}}
                    for r in range(R)]
            t0 = time.perf_counter_ns()
            ok = prod.capture_rows(maps, starts, [aux, last], layers=layers, layer_kinds=kinds,
                                   token_ids=ids, layer_map=lmap, hidden=h)
            ws.append((time.perf_counter_ns() - t0) / 1e3)
            if not ok:
                raise SystemExit("a capture was dropped: the ring is too small for this run")
            drain()
        return statistics.median(ws)

    runs, order = _stats.run_alternating({"hot": lambda i: run("hot"),
                                          "cold": lambda i: run("cold")}, reps=a.reps)
    results = {m: _stats.summarize(v) for m, v in runs.items()}
    results["cold_over_hot"] = _stats.ratio_summary(runs["cold"], runs["hot"])
    results["order"] = order
    for m in ("hot", "cold"):
        print(f"{m:4s}: capture_rows {_stats.fmt_spread(results[m], 3)} us per call", flush=True)
    print(f"cold / hot: {_stats.fmt_spread(results['cold_over_hot'], 3)}", flush=True)

    if a.meta_ab:
        import hscapture.record as rec

        native = rec._native
        if native is None:
            raise SystemExit("--meta-ab: hscapture._meta is not built")

        def with_meta(which: object) -> float:
            rec._native = which
            try:
                return run("cold")
            finally:
                rec._native = native
        ab, ab_order = _stats.run_alternating({"cold native meta": lambda i: with_meta(native),
                                               "cold python meta": lambda i: with_meta(None)},
                                              reps=a.reps)
        results["meta_ab"] = {m: _stats.summarize(v) for m, v in ab.items()}
        results["meta_ab"]["native_over_python"] = _stats.ratio_summary(
            ab["cold native meta"], ab["cold python meta"])
        results["meta_ab"]["order"] = ab_order
        for m in ("cold native meta", "cold python meta"):
            print(f"{m}: capture_rows {_stats.fmt_spread(results['meta_ab'][m], 3)} us per call",
                  flush=True)
        print(f"native / python meta (cold): "
              f"{_stats.fmt_spread(results['meta_ab']['native_over_python'], 3)}", flush=True)

    if a.torch_costs:
        big = torch.randn(2048, 3 * h).to(torch.bfloat16)
        small = torch.randn(2048, h).to(torch.bfloat16)
        many = torch.arange(2048)

        def attributes() -> None:
            for t in (big, small):
                t.dim(), t.shape[0], t.shape[1], t.dtype, t.device
                t.is_cuda, t.stride(0), t.stride(1), t.element_size(), t.data_ptr()
            many.dim(), many.numel(), many.dtype, many.device, many.is_cuda

        def one_op() -> None:
            many[0:2048].to(torch.int32, copy=True)

        def timed_calls(fn: object, cold: bool) -> float:
            ws = []
            for _ in range(a.calls):
                if cold:
                    sweep[::64] += 1
                t0 = time.perf_counter_ns()
                fn()
                ws.append((time.perf_counter_ns() - t0) / 1e3)
            return statistics.median(ws)
        tc, tc_order = _stats.run_alternating(
            {f"{what} {temp}": (lambda i, f=fn, c=temp == "cold": timed_calls(f, c))
             for what, fn in (("25 attribute reads", attributes), ("slice + int32 copy", one_op))
             for temp in ("hot", "cold")}, reps=a.reps)
        results["torch_costs"] = {m: _stats.summarize(v) for m, v in tc.items()}
        results["torch_costs"]["order"] = tc_order
        for m in tc:
            print(f"{m}: {_stats.fmt_spread(results['torch_costs'][m], 3)} us", flush=True)

    if a.breakdown:
        acc: dict[str, list[int]] = collections.defaultdict(list)
        owners = {"self": prod, "producer": P, "rec": P.rec, "nt": P.nt, "copier": prod._copier}
        saved = []
        for owner, name, label in STAGES:
            obj = owners[owner]
            f = getattr(obj, name)
            saved.append((obj, name, f))

            def timed(*args, _f=f, _label=label, **kw):
                t0 = time.perf_counter_ns()
                try:
                    return _f(*args, **kw)
                finally:
                    acc[_label].append(time.perf_counter_ns() - t0)
            setattr(obj, name, timed)
        try:
            results["breakdown_us"] = {}
            for m in ("hot", "cold"):
                acc.clear()
                run(m)
                results["breakdown_us"][m] = {k: round(statistics.median(v) / 1e3, 2)
                                              for k, v in acc.items()}
                print(f"{m:4s} stages (median us): {results['breakdown_us'][m]}", flush=True)
        finally:
            for obj, name, f in saved:
                if obj is prod or obj is prod._copier:
                    delattr(obj, name)          # back to the class's method
                else:
                    setattr(obj, name, f)
    sub.close()
    prod.close()
    _stats.write_record(
        a.out, benchmark="bench_capture_host",
        timed_regions={m: _stats.timed_region(
            ["one Producer.capture_rows call: checks, entry meta, reserve, header, the host "
             "copies of 16 tokens, enqueue, the inline commit + notice of the previous entry"],
            ["building the row map", "the subscriber's poll/release after each call",
             "the cache sweep before each call (cold)"], "time.perf_counter_ns")
            for m in ("hot", "cold")},
        results=results, config=vars(a) | {"tokens": T, "hidden": h, "pid": os.getpid()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
