#!/usr/bin/env python3
"""Does a capture's device-to-host copy delay the engine's own result read-back?

    python benchmarks/bench_copy_contention.py [--mb 40,320] [--chunks 0,8,2,1] [--reps 30]
                                               [--out FILE]

Why: in the real server at the 1B shape (h200-2026-12-04d) the loop turn right after a
capture's copies were issued ran ~2 ms longer than its neighbours, outside the hook's own
time, while at the tiny shape (1/40 of the bytes) it did not. SGLang 0.5.23's overlap
scheduler reads each batch's results back with a small device-to-host copy on its own
``copy_stream`` (``Scheduler._copy_result_to_cpu``) and waits for it in the next turn; a
capture's copies are device-to-host too, on hscapture's side stream. If both go through
one copy engine in the order they were issued, the engine's few KB wait behind the
capture's tens of MB.

This reproduces that pattern with torch alone, on the GPU: a "forward" (matmuls, ~``--fwd-ms``)
on a forward stream, with a "hook point" event before its last part (the sampling, say);
the capture's copy of ``--mb`` MB from device memory into page-locked host memory on a side
stream that waits for the hook point; then the "result" copy (4 KB) on a copy stream that
waits for the whole forward. Measured per trial, by CUDA events on one GPU clock: from the
forward's end to the result copy's completion (``result_ms``), and the capture copy's own
time. Modes, alternating trial by trial (ABCD ABCD ...): ``none`` (no capture copy), and the
capture copy issued as one copy or as pieces of ``--chunks`` MB (0 = one copy). Reported:
median and min-max of ``result_ms`` per mode and size, and the capture copy's GB/s.

``--orders`` adds, per size, the capture copy (one copy) issued other ways (2026-12-05: the
hook defers its copies to the next scheduling step, after SGLang queued its read-back, yet
the 1B server still lost ~2-3 ms on the turns that flushed a drain's ~270 MB):

- ``before``: as above (issued inside the forward, gated on the hook point);
- ``after``: issued AFTER the read-back, gated on the forward's end, the read-back's own
  gate (both become ready at the same instant; which one the copy engine serves first is
  the question; in SGLang the deferred copies' gate is even earlier, before the sampling);
- ``after-done``: issued after the read-back and gated on the read-back's completion (an
  event recorded behind it on its stream: SGLang's ``copy_done``);
- ``sm``: issued as ``before`` but as a copy KERNEL writing into the page-locked memory
  through its device mapping (unified addressing), not through the copy engine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", default="40,320", help="capture copy sizes, MB")
    ap.add_argument("--chunks", default="0,8,2,1", help="piece sizes, MB (0: one copy)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--fwd-ms", type=float, default=6.0)
    ap.add_argument("--orders", default="", help="also: before,after,after-done,sm (one copy)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("bench_copy_contention: needs CUDA", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    fwd, side, copy = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    x = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    sizes = [int(float(s) * 1e6) for s in a.mb.split(",")]
    src = torch.empty(max(sizes), dtype=torch.uint8, device=dev).fill_(7)
    host = torch.empty(max(sizes), dtype=torch.uint8, pin_memory=True)
    res_dev = torch.arange(512, device=dev, dtype=torch.int64)
    res_host = torch.empty(512, dtype=torch.int64, pin_memory=True)

    # calibrate the forward: n matmuls of ~fwd_ms in all
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(20):
        x @ x
    e1.record()
    e1.synchronize()
    per = e0.elapsed_time(e1) / 20
    n_mm = max(2, round(a.fwd_ms / per))

    class _Mapped:   # the page-locked buffer as a CUDA array (unified addressing: same address)
        __cuda_array_interface__ = {"shape": (host.numel(),), "typestr": "|u1",
                                    "data": (host.data_ptr(), False), "version": 3}

    host_dev = None
    if "sm" in a.orders.split(","):
        try:   # int64 views: a kernel of 8-byte stores (a same-dtype copy_ would be a memcpy)
            host_dev = torch.as_tensor(_Mapped(), device=dev).view(torch.int64)
        except Exception as exc:
            print(f"no device mapping of the page-locked buffer ({exc}): 'sm' left out")
            a.orders = ",".join(o for o in a.orders.split(",") if o != "sm")

    def capture(size: int, ev: dict) -> None:
        with torch.cuda.stream(side):
            ev["cap0"].record(side)
            if host_dev is not None and order == "sm":
                torch.mul(src[:size].view(torch.int64), 1, out=host_dev[:size // 8])
            else:
                host[:size].copy_(src[:size], non_blocking=True)
            ev["cap1"].record(side)

    order = ""

    def trial(size: int, chunk: int | None) -> tuple[float, float]:
        ev = {k: torch.cuda.Event(enable_timing=True) for k in
              ("hook", "fwd_end", "cap0", "cap1", "res")}
        with torch.cuda.stream(fwd):
            for _ in range(n_mm - 1):
                x @ x
            ev["hook"].record(fwd)
            x @ x                          # the rest of the forward (logits, sampling)
            ev["fwd_end"].record(fwd)
        if order in ("before", "sm"):
            side.wait_event(ev["hook"])
            capture(size, ev)
            chunk = None
        if chunk is not None:
            side.wait_event(ev["hook"])
            with torch.cuda.stream(side):
                ev["cap0"].record(side)
                step = size if chunk == 0 else chunk
                for off in range(0, size, step):
                    end = min(size, off + step)
                    host[off:end].copy_(src[off:end], non_blocking=True)
                ev["cap1"].record(side)
        copy.wait_stream(fwd)
        with torch.cuda.stream(copy):
            res_host.copy_(res_dev, non_blocking=True)
            ev["res"].record(copy)
        if order in ("after", "after-done"):
            side.wait_event(ev["fwd_end"] if order == "after" else ev["res"])
            capture(size, ev)
        torch.cuda.synchronize()
        cap = ev["cap0"].elapsed_time(ev["cap1"]) if (chunk is not None or order) else 0.0
        return ev["fwd_end"].elapsed_time(ev["res"]), cap

    modes: list[tuple[str, int | None]] = [("none", None)]
    for c in a.chunks.split(","):
        c_mb = float(c)
        modes.append(("one copy" if c_mb == 0 else f"{c} MB pieces",
                      0 if c_mb == 0 else int(c_mb * 1e6)))
    out = {"fwd_ms_target": a.fwd_ms, "matmuls": n_mm, "matmul_ms": per, "reps": a.reps,
           "device": torch.cuda.get_device_name(), "sizes": {}}
    orders = [o for o in a.orders.split(",") if o]
    modes += [(f"order {o}", None) for o in orders]

    def run(name: str, chunk: int | None, size: int) -> tuple[float, float]:
        nonlocal order
        order = name[len("order "):] if name.startswith("order ") else ""
        return trial(size, chunk)

    for size in sizes:
        for name, chunk in modes:            # warm-up
            run(name, chunk, size)
        got: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in modes}
        for _ in range(a.reps):
            for name, chunk in modes:
                got[name].append(run(name, chunk, size))
        rec = {}
        for name, _ in modes:
            res = [r for r, _ in got[name]]
            cap = [c for _, c in got[name]]
            rec[name] = {"result_ms_median": statistics.median(res),
                         "result_ms_min_max": [min(res), max(res)],
                         "capture_ms_median": statistics.median(cap),
                         "capture_GBps": (size / statistics.median(cap) / 1e6
                                          if statistics.median(cap) else None)}
            print(f"{size / 1e6:6.0f} MB  {name:>12}: result copy done {rec[name]['result_ms_median']:.3f} ms "
                  f"after the forward [{min(res):.3f} .. {max(res):.3f}]; capture copy "
                  f"{rec[name]['capture_ms_median']:.3f} ms", flush=True)
        out["sizes"][str(size)] = rec
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
