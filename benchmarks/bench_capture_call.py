#!/usr/bin/env python3
"""CPU cost of one ``Producer.capture_rows`` call on the calling thread: native vs torch copy path.

    python benchmarks/bench_capture_call.py [--rows 1,8,64] [--tokens 256] [--hidden 2048]
                                            [--calls 200] [--reps 5] [--out FILE]
                                            [--host-ids] [--no-snapshot] [--profile FILE]

The engine adapter's hot path (hscapture/sglang/hook.py) makes one such call per forward pass,
on the scheduler's thread. Two producers on one GPU, one per copy path (the torch one made
with ``HSCAPTURE_COPY_PATH=torch``), each with its own subscriber process taking and releasing
every entry; per repetition each path runs ``--calls`` captures of the same batch (3 aux
layers packed ``[T, 3H]`` + final norm ``[T, H]``, bf16, ``--rows`` rows of ``--tokens`` tokens
in scattered spans: every other row of a batch twice as large (``--contiguous``: back to back,
as when every request of a forward is captured), CUDA int64 token ids,
``snapshot=True`` as with CUDA graphs), the two paths alternating (ABBA), after a warm-up.

Timed: wall and thread CPU time around each ``capture_rows`` call (``time.perf_counter_ns`` /
``time.thread_time_ns``), median per repetition, then median and spread over repetitions.
Inside: the previous entry's inline commit + notice (its copy completed: the GPU is
synchronized after every call), as in a busy server. Not timed: building the row maps (the
hook's part), the device work (the copies run behind), the synchronize and the subscriber's
releases between calls. ``--host-ids --no-snapshot`` is the SGLang hook's prefill path (ids
from each request's host array, no CUDA graph); ``--profile FILE`` appends the producer's stage
timers and a cProfile of the native path per row count.

``--defer MS`` is the hook's default path since 6fec9dd: ``capture_rows(defer=True)`` with a
stage interval of MS (the hook's ``HSCAPTURE_STAGE_INTERVAL_MS``, default 50), calls paced
``--step-ms`` apart (a ``time.sleep`` between calls, outside the clock: an engine's forward
step; the 1B server's was ~15 ms), so most calls only stage their rows and the call that
finds the stage due also writes it as one entry. Reported then beside the median (a staging
call): the MEAN per call (the amortized cost, writes and inline publishes included), and the
producer's ``stagings`` / ``stage_writes``. Only the native path stages: the torch path's
figures under ``--defer`` are captures at once (``EntryCopier.stage`` declines them), paced
the same way.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import os
import statistics
import sys
import time
import uuid
from array import array
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE.parent))   # an installed hscapture wins over the uncompiled checkout
sys.path.insert(0, str(HERE))

import _stats  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,8,64")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="bench-results/bench_capture_call.json")
    ap.add_argument("--host-ids", action="store_true",
                    help="token ids as HostRowIds from array('q') (the SGLang hook's default)")
    ap.add_argument("--no-snapshot", action="store_true",
                    help="snapshot=False (SGLang prefills without CUDA graphs)")
    ap.add_argument("--contiguous", action="store_true",
                    help="rows back to back (every request of the forward captured, as in "
                         "bench_server) instead of scattered spans")
    ap.add_argument("--capacity-mb", type=int, default=1024, help="ring MiB (bench_server: 4096)")
    ap.add_argument("--defer", type=float, default=0.0, metavar="MS",
                    help="deferred captures with this stage interval (ms); 0: one entry a call")
    ap.add_argument("--step-ms", type=float, default=15.0,
                    help="with --defer: time between calls (outside the clock)")
    ap.add_argument("--profile", default=None,
                    help="after the timed runs, FILE gets a cProfile of --calls native-path "
                         "calls (sorted by own time) and the producer's stage timers")
    args = ap.parse_args()

    import torch

    from hscapture import Producer, Subscriber

    if not torch.cuda.is_available():
        print("SKIP: needs a CUDA GPU")
        return 0
    h, k = args.hidden, 3
    producers, subs = {}, {}
    for path in ("native", "torch"):
        if path == "torch":
            os.environ["HSCAPTURE_COPY_PATH"] = "torch"
        else:
            os.environ.pop("HSCAPTURE_COPY_PATH", None)
        ep = f"ipc:///tmp/hsc-bcc-{path}-{uuid.uuid4().hex[:6]}.sock"
        producers[path] = Producer(ep, producer_id=f"bcc-{path}-{uuid.uuid4().hex[:6]}",
                                   capacity=args.capacity_mb << 20,
                                   stage_interval_s=args.defer / 1e3)
        subs[path] = Subscriber(ep)
        subs[path].wait_ready(timeout=20)
    os.environ.pop("HSCAPTURE_COPY_PATH", None)
    assert producers["native"]._copier.native is not None, "native copy path unavailable"
    results, goals = {}, []
    for nrows in [int(x) for x in args.rows.split(",")]:
        gap = 1 if args.contiguous else 2
        T = gap * nrows * args.tokens
        starts = [gap * i * args.tokens for i in range(nrows)]
        aux = torch.randn(T, k * h, device="cuda").to(torch.bfloat16)
        last = torch.randn(T, h, device="cuda").to(torch.bfloat16)
        ids = torch.randint(0, 32000, (T,), device="cuda")
        if args.host_ids:
            from hscapture._copies import HostRowIds

            host = array("q", ids.tolist())
            ids = HostRowIds([(host, s, args.tokens) for s in starts])
        n = [0]

        def one(path: str) -> tuple[float, float, float]:
            p = producers[path]
            wall, cpu = [], []
            for _ in range(args.calls):
                n[0] += 1
                maps = [{"rid": f"c{n[0]}-{i}", "token_start": 0, "token_count": args.tokens,
                         "last": True, "cached_prefix": 0, "extra": {"attempt": 0},
                         "fields": {}} for i in range(nrows)]
                t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
                ok = p.capture_rows(maps, starts, [aux, last], layers=[1, 2, 3, 15],
                                    layer_kinds=["residual"] * 3 + ["final_norm"],
                                    token_ids=ids, layer_map=[[0, 0], [0, h], [0, 2 * h], [1, 0]],
                                    hidden=h, snapshot=not args.no_snapshot,
                                    defer=args.defer > 0)
                wall.append((time.perf_counter_ns() - t0) / 1e3)
                cpu.append((time.thread_time_ns() - c0) / 1e3)
                assert ok, "dropped"
                torch.cuda.synchronize()     # complete: the next call publishes it inline
                drain(path)
                if args.defer > 0:
                    time.sleep(args.step_ms / 1e3)   # pacing: an engine's forward step
            p.flush()
            drain(path)
            return statistics.median(wall), statistics.median(cpu), statistics.fmean(wall)

        def drain(path: str) -> None:
            while True:
                s = subs[path].poll(timeout=0.0)
                if s is None:
                    return
                s.release()

        runs = {"native": [], "torch": []}
        for rep in range(-1, args.reps):
            for path in (("native", "torch") if rep % 2 == 0 else ("torch", "native")):
                r = one(path)
                if rep >= 0:
                    runs[path].append(r)
        res = {}
        for path, rs in runs.items():
            res[path] = {"wall_us": _stats.summarize([w for w, _, _ in rs]),
                         "cpu_us": _stats.summarize([c for _, c, _ in rs]),
                         "mean_wall_us": _stats.summarize([m for _, _, m in rs])}
        res["native_over_torch_wall"] = _stats.ratio_summary([w for w, _, _ in runs["native"]],
                                                             [w for w, _, _ in runs["torch"]])
        results[f"{nrows}x{args.tokens}"] = res
        def us(m: dict) -> str:
            return f"{m['median']:.0f} [{m['min']:.0f}..{m['max']:.0f}]"

        print(f"{nrows:3d} rows x {args.tokens} tok: native {us(res['native']['wall_us'])} us "
              f"wall ({us(res['native']['cpu_us'])} cpu); torch {us(res['torch']['wall_us'])} "
              f"us wall ({us(res['torch']['cpu_us'])} cpu); mean per call native "
              f"{us(res['native']['mean_wall_us'])}, torch {us(res['torch']['mean_wall_us'])}",
              flush=True)
        if args.profile:
            profile(args, producers["native"], one, nrows)
    stats = {path: {k2: v for k2, v in p.stats().items()
                    if k2.endswith("copies") or k2 in ("dropped", "stagings", "stage_writes",
                                                        "staged_rows", "captures")}
             for path, p in producers.items()}
    print(f"counters: {stats}", flush=True)
    for path in producers:
        subs[path].close()
        producers[path].close()
    _stats.write_record(
        args.out, benchmark="bench_capture_call",
        timed_regions={m: _stats.timed_region(
            ["one Producer.capture_rows call on the calling thread: checks, encode, reserve, "
             "copy issue, inline publish of the previous entry"],
            ["building the row maps", "the device copies themselves", "GPU synchronize + "
             "flush + subscriber release between calls"], "perf_counter_ns + thread_time_ns")
            for m in ("native", "torch")},
        results=results, config=vars(args) | {"copy_counters": stats}, goals=goals)
    return 0


def profile(args: argparse.Namespace, producer: object, one: object, nrows: int) -> None:
    """Append to ``args.profile``: the producer's stage timers (``timed``) over one run of
    ``--calls`` native-path calls, then a cProfile of another such run, by own time."""
    producer.timed = True
    before = dict(producer._counters)
    one("native")
    after = producer._counters
    n = args.calls
    writes = after["captures"] - before.get("captures", 0)
    lines = [f"== {nrows} rows x {args.tokens} tokens, host ids {args.host_ids}, "
             f"snapshot {not args.no_snapshot}, defer {args.defer} ms: stage means per call "
             f"over {n} calls ({writes} entries written) (us)"]
    for key in sorted(after):
        if key.startswith("time_"):
            lines.append(f"  {key:24s} {(after[key] - before.get(key, 0)) / n / 1e3:8.1f}")
    producer.timed = False
    prof = cProfile.Profile()
    prof.enable()
    one("native")
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(40)
    with open(args.profile, "a") as f:
        f.write("\n".join(lines) + "\n" + out.getvalue() + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
