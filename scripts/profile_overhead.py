#!/usr/bin/env python3
"""Where capture's prefill slowdown goes on the GPU (a diagnosis, not a benchmark).

    python3 scripts/profile_overhead.py OUT_DIR [--shape 1b] [--batch 1] [--seq 4096]

Builds the random-weight Llama of ``bench_gpu.py overhead``, captures 3 aux layers + final
norm with ``HiddenStateCapture`` into a Producer (no subscriber: the ring is sized for the
forwards run here), and records ``torch.profiler`` CUDA activity over N forwards with capture
off, then N with it on. Prints, per mode: GPU time of kernels (sum), of device-to-host copies,
the wall span per forward, the idle gaps between kernels on the compute stream, and how much
of the copies' time overlaps kernels; writes both traces (chrome JSON, gzipped) to OUT_DIR.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import torch  # noqa: E402

from _harness import MODEL_SHAPES, aux_layers  # noqa: E402
from bench_gpu import build_llama  # noqa: E402


def summarize(events: list[dict], n: int) -> dict:
    kern = sorted((e["ts"], e["ts"] + e["dur"], e.get("args", {}).get("stream"))
                  for e in events if e.get("cat") == "kernel")
    copies = [(e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
              if e.get("cat") in ("gpu_memcpy", "gpu_memset")]
    d2h = [(a, b) for a, b, name in copies if "DtoH" in name]
    busy = 0.0
    merged: list[list[float]] = []
    for a, b, _ in kern:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    busy = sum(b - a for a, b in merged)
    span = (merged[-1][1] - merged[0][0]) if merged else 0.0
    over = 0.0
    for a, b in d2h:
        for ka, kb in merged:
            lo, hi = max(a, ka), min(b, kb)
            if hi > lo:
                over += hi - lo
    streams = sorted({s for _, _, s in kern if s is not None})
    return {"forwards": n, "kernels": len(kern), "kernel_streams": streams,
            "kernel_busy_ms_per_fwd": busy / 1e3 / n, "span_ms_per_fwd": span / 1e3 / n,
            "idle_ms_per_fwd": (span - busy) / 1e3 / n,
            "d2h_copies": len(d2h), "d2h_ms_per_fwd": sum(b - a for a, b in d2h) / 1e3 / n,
            "d2h_overlapping_kernels_ms_per_fwd": over / 1e3 / n,
            "other_copies": sorted({name for _, _, name in copies if "DtoH" not in name})}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shape", default="1b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--forwards", type=int, default=6)
    a = ap.parse_args()
    from hscapture import Producer
    from hscapture.adapters.transformers import CONVENTION, HiddenStateCapture

    os.makedirs(a.out, exist_ok=True)
    shape = MODEL_SHAPES[a.shape]
    model = build_llama(shape, "cuda", a.seq)
    aux = aux_layers(shape["num_layers"])
    per_fwd = a.batch * a.seq * shape["hidden"] * 2 * (len(aux) + 1)
    prod = Producer(f"ipc:///tmp/hsc-prof-{uuid.uuid4().hex[:6]}.sock",
                    producer_id=f"prof-{uuid.uuid4().hex[:6]}",
                    capacity=per_fwd * (2 * a.forwards + 8) + (64 << 20),
                    full_policy="drop", convention=CONVENTION, model="random-llama")
    cap = HiddenStateCapture(model, prod, aux)
    ids_cpu = torch.randint(0, shape["vocab"], (a.batch, a.seq))
    ids = ids_cpu.to("cuda")
    kw = {"use_cache": False, "logits_to_keep": 1}
    count = [0]

    def fwd(on: bool) -> None:
        if not on:
            model(input_ids=ids, **kw)
            return
        count[0] += 1
        with cap.request([f"p{count[0]}-{k}" for k in range(a.batch)], ids_cpu):
            model(input_ids=ids, **kw)

    out = {"shape": a.shape, "batch": a.batch, "seq": a.seq, "captured_bytes_per_fwd": per_fwd,
           "copy_path": prod.stats().get("pinned")}
    with torch.inference_mode():
        for _ in range(3):
            fwd(False)
            fwd(True)
        prod.flush(timeout_s=60)
        torch.cuda.synchronize()
        for mode in ("off", "on"):
            acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=acts) as prof:
                t0 = time.perf_counter()
                for _ in range(a.forwards):
                    fwd(mode == "on")
                torch.cuda.synchronize()
                wall = time.perf_counter() - t0
            path = os.path.join(a.out, f"trace-{mode}.json")
            prof.export_chrome_trace(path)
            with open(path) as f:
                events = json.load(f)["traceEvents"]
            with open(path, "rb") as f, gzip.open(path + ".gz", "wb") as g:
                shutil.copyfileobj(f, g)
            os.unlink(path)
            s = summarize(events, a.forwards)
            s["wall_ms_per_fwd"] = 1e3 * wall / a.forwards
            out[mode] = s
            print(mode, json.dumps(s), flush=True)
            prod.flush(timeout_s=60)
    out["stats"] = {k: v for k, v in prod.stats().items() if isinstance(v, (int, float, str))}
    cap.close()
    prod.close()
    with open(os.path.join(a.out, "profile.json"), "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
