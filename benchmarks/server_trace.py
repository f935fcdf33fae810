#!/usr/bin/env python3
"""Where a real SGLang server's forward steps spend their time, from its own torch profiler.

Reads the ``*.trace.json.gz`` files that ``bench_server.py --profile-dir DIR`` makes SGLang
write (``POST /start_profile``: CPU + GPU activities, one folder per mix and mode) and prints,
per trace:

- the GPU side: kernel time (the union of kernel intervals, so overlapping streams count
  once), the span from the first kernel to the last, and their ratio: the share of the time
  the GPU was busy. A ratio near 1 means the server was GPU-bound over those steps (host work
  on the scheduler thread is hidden behind the forward); well below 1 means the GPU waited
  for the scheduler thread, so every microsecond of host work on it costs throughput;
- device-to-host/device-to-device copies (count, total time);
- per scheduler annotation SGLang records (``scheduler.run_batch``, ``step[...]``,
  ``scheduler.get_next_batch_to_run``, ...) and the hook's own ``hscapture.hook`` range:
  count, total and mean milliseconds;
- device-to-host copies smaller than 1 MiB (SGLang's own results: next-token ids, logprobs)
  and how long each waited on the GPU once it could run (its stream's previous operation done
  and its launch call made): count, mean, p90 and max wait, and how many of them started
  right after (within 5 us of) the end of a copy of 1 MiB or more on another stream (the
  capture's): a copy engine serving one copy at a time shows as waits behind those;
- with ``--stack`` (a trace recorded with ``--profile-stack``): the Python functions that take
  the most EXCLUSIVE time inside ``hscapture.hook``, per hook call. The tracer's own cost per
  call lands in the caller's exclusive time, so these are proportions, not durations.

Usage: ``python3 benchmarks/server_trace.py DIR [--stack] [--json OUT]``: every trace under
DIR. Nothing here is timed; it reads what the server measured.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import gzip
import json
import os
import sys
from typing import Any, Iterable, Sequence

HOOK = "hscapture.hook"


def load(path: str) -> list[dict[str, Any]]:
    """The trace's complete events (``ph == 'X'``, with a duration)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]


def union_us(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length of the union of ``(start, end)`` intervals."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def summarize(events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """GPU busy share, copies, and per-annotation totals of one trace (see the module doc)."""
    kernels = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "kernel"]
    copies = [e for e in events if e.get("cat") == "gpu_memcpy"]
    out: dict[str, Any] = {"kernels": len(kernels)}
    if kernels:
        busy = union_us(kernels)
        span = max(e for _, e in kernels) - min(s for s, _ in kernels)
        out.update(kernel_busy_ms=busy / 1e3, kernel_span_ms=span / 1e3,
                   gpu_busy_share=busy / span if span > 0 else 1.0)
    by_kind: dict[str, list[float]] = collections.defaultdict(list)
    for e in copies:
        by_kind[e["name"]].append(e["dur"])
    out["copies"] = {k: {"n": len(v), "total_ms": sum(v) / 1e3} for k, v in sorted(by_kind.items())}
    out["small_dtoh_waits"] = dtoh_waits(events)
    ann: dict[str, list[float]] = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "user_annotation":
            name = e["name"]
            ann["step[...]" if name.startswith("step[") else name].append(e["dur"])
    out["annotations"] = {k: {"n": len(v), "total_ms": sum(v) / 1e3,
                              "mean_ms": sum(v) / len(v) / 1e3}
                          for k, v in sorted(ann.items(), key=lambda kv: -sum(kv[1]))}
    return out


#: device-to-host copies below this are SGLang's own (results); at or above, the capture's
SMALL_COPY_BYTES = 1 << 20
#: a small copy that starts within this of a large copy's end queued behind it
BEHIND_US = 5.0
_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _arg(e: dict[str, Any], key: str, default: Any = None) -> Any:
    return (e.get("args") or {}).get(key, default)


def dtoh_waits(events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """How long SGLang's small device-to-host copies waited once they could run, and how
    many started right behind a large one (see the module doc). A copy can run once the
    previous GPU operation of its stream ended and its launch call (the ``cuda_runtime`` or
    ``cuda_driver`` event of the same ``correlation``) began; its wait is its start minus
    that instant."""
    gpu = sorted((e for e in events if e.get("cat") in _GPU_CATS), key=lambda e: e["ts"])
    launch = {_arg(e, "correlation"): e["ts"] for e in events
              if e.get("cat") in ("cuda_runtime", "cuda_driver")
              and _arg(e, "correlation") is not None}
    dtoh = [e for e in gpu if e.get("cat") == "gpu_memcpy" and "DtoH" in e.get("name", "")]
    large_ends = sorted(e["ts"] + e["dur"] for e in dtoh
                        if _arg(e, "bytes", 0) >= SMALL_COPY_BYTES)
    small = {id(e) for e in dtoh if _arg(e, "bytes", 0) < SMALL_COPY_BYTES}
    last_end: dict[Any, float] = {}
    waits: list[float] = []
    behind: list[float] = []
    for e in gpu:
        stream = _arg(e, "stream", e.get("tid"))
        ready = last_end.get(stream, e["ts"])
        last_end[stream] = max(ready, e["ts"] + e["dur"])
        if id(e) not in small:
            continue
        runnable = max(ready, launch.get(_arg(e, "correlation"), ready))
        wait = max(0.0, e["ts"] - runnable)
        waits.append(wait)
        i = bisect.bisect_right(large_ends, e["ts"])
        if i and e["ts"] - large_ends[i - 1] <= BEHIND_US and large_ends[i - 1] > runnable:
            behind.append(wait)
    waits.sort()

    def stat(v: list[float]) -> dict[str, float]:
        return {"n": len(v), "mean_us": sum(v) / len(v) if v else 0.0,
                "max_us": max(v) if v else 0.0}

    return stat(waits) | {"p90_us": waits[int(0.9 * (len(waits) - 1))] if waits else 0.0,
                          "large_copies": len(large_ends), "behind_large": stat(behind)}


def hook_exclusive(events: Sequence[dict[str, Any]], top: int = 25) -> list[dict[str, Any]]:
    """Per hook call: the functions (Python, torch ops, CUDA calls) with the most exclusive
    time inside ``hscapture.hook`` ranges on the hook's thread."""
    hooks = [e for e in events if e.get("name") == HOOK and e.get("cat") == "user_annotation"]
    if not hooks:
        return []
    tid = hooks[0]["tid"]
    mine = sorted((e for e in events if e.get("tid") == tid and e.get("cat") in
                   ("python_function", "cpu_op", "cuda_runtime", "cuda_driver")),
                  key=lambda e: (e["ts"], -e["dur"]))
    excl: dict[str, float] = collections.defaultdict(float)
    incl: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()
    starts = [e["ts"] for e in mine]
    for h in hooks:
        a, b = h["ts"], h["ts"] + h["dur"]
        inside = mine[bisect.bisect_left(starts, a):bisect.bisect_right(starts, b)]
        stack: list[list[Any]] = []          # [event, exclusive so far]
        done: list[list[Any]] = []
        for e in inside:
            if e["ts"] + e["dur"] > b:
                continue
            while stack and stack[-1][0]["ts"] + stack[-1][0]["dur"] <= e["ts"]:
                done.append(stack.pop())
            if stack:
                stack[-1][1] -= e["dur"]
            stack.append([e, e["dur"]])
        done.extend(stack)
        for e, x in done:
            excl[e["name"]] += x
            incl[e["name"]] += e["dur"]
            calls[e["name"]] += 1
    n = len(hooks)
    rows = [{"name": k, "exclusive_us": excl[k] / n, "inclusive_us": incl[k] / n,
             "calls": calls[k] / n} for k in excl]
    return sorted(rows, key=lambda r: -r["exclusive_us"])[:top]


def traces_under(root: str) -> list[str]:
    found = []
    for folder, _, names in os.walk(root):
        found += [os.path.join(folder, n) for n in names if n.endswith((".trace.json.gz",
                                                                           ".trace.json"))]
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="a folder of traces (bench_server --profile-dir) or one trace")
    ap.add_argument("--stack", action="store_true",
                    help="also list exclusive time per function inside the hook")
    ap.add_argument("--json", default=None, help="write the summaries here")
    a = ap.parse_args(argv)
    paths = [a.root] if os.path.isfile(a.root) else traces_under(a.root)
    if not paths:
        print(f"no *.trace.json[.gz] under {a.root}", file=sys.stderr)
        return 1
    out = {}
    for path in paths:
        ev = load(path)
        s = summarize(ev)
        if a.stack:
            s["hook_exclusive"] = hook_exclusive(ev)
        out[os.path.relpath(path, a.root) if os.path.isdir(a.root) else path] = s
        print(f"== {path}")
        if "gpu_busy_share" in s:
            print(f"   GPU busy {s['kernel_busy_ms']:.1f} ms of {s['kernel_span_ms']:.1f} ms "
                  f"({s['gpu_busy_share']:.0%}), {s['kernels']} kernels")
        for k, c in s["copies"].items():
            print(f"   {k}: {c['n']} copies, {c['total_ms']:.2f} ms")
        w = s["small_dtoh_waits"]
        print(f"   small DtoH copies: {w['n']}, wait mean {w['mean_us']:.1f} us, p90 "
              f"{w['p90_us']:.1f}, max {w['max_us']:.1f}; right behind one of the "
              f"{w['large_copies']} large ones: {w['behind_large']['n']} (wait mean "
              f"{w['behind_large']['mean_us']:.1f} us)")
        for k, v in s["annotations"].items():
            print(f"   {k:40s} n={v['n']:4d} total {v['total_ms']:9.2f} ms  "
                  f"mean {v['mean_ms']:7.3f} ms")
        for r in s.get("hook_exclusive", []):
            print(f"   {r['exclusive_us']:8.1f} us excl {r['inclusive_us']:8.1f} incl "
                  f"x{r['calls']:5.1f}  {r['name'][:100]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
