"""Export throughput vs a raw read+write of the same bytes.

For each format, alternating reps: (a) ``hscapture.export.export`` into an emptied directory;
(b) raw: for every sample, read the same source tensors with safe_open and write them as they
are (one writev, no reshaping, padded to the byte count the export wrote for that sample) to
one file per sample, with the same thread count and fsync setting — the floor any converter
pays. Reported: median and min-max seconds, GB/s of bytes written, and the
ratio raw/export (goal >= 0.8).

    python benchmarks/bench_export.py --samples 200 --tokens 512 --hidden 2048
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import torch


def build(d: str, n: int, T: int, H: int) -> None:
    from hscapture.sample import Sample, layer_name
    from hscapture.shards import ShardWriter

    g = torch.Generator().manual_seed(0)
    layers, kinds = [1, 3, 5, 7, 7], ["residual"] * 4 + ["final_norm"]
    with ShardWriter(d, fsync=False, max_shard_bytes=512 << 20) as w:
        for i in range(n):
            t = {layer_name(l, k): torch.randn(T, H, generator=g).bfloat16()
                 for l, k in zip(layers, kinds)}
            w.add(Sample(rid=f"r{i:06d}", producer_id="p", epoch=1, num_tokens=T,
                         token_ids=torch.arange(T, dtype=torch.int32), tensors=t,
                         layers=layers, layer_kinds=kinds, dtype="bfloat16", hidden=H,
                         fields={"loss_mask": torch.ones(T, dtype=torch.uint8)}))


def _clear(p: str) -> None:
    shutil.rmtree(p, ignore_errors=True)
    os.makedirs(p)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--formats", default="specforge,speculators")
    ap.add_argument("--fsync", action="store_true", help="fsync every file on both sides")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    from safetensors import safe_open

    from hscapture.export import export
    from hscapture.reader import open_shards

    root = tempfile.mkdtemp(dir=a.dir)
    results: dict = {"samples": a.samples, "tokens": a.tokens, "hidden": a.hidden,
                     "reps": a.reps, "fsync": a.fsync, "cpus": os.cpu_count()}
    try:
        src = os.path.join(root, "shards")
        build(src, a.samples, a.tokens, a.hidden)
        ss = open_shards(src)
        entries = [ss.entry(i) for i in range(len(ss))]
        for fmt in a.formats.split(","):
            names = (["layer_1", "layer_3", "layer_5", "final_norm"] if fmt == "specforge"
                     else ["layer_1", "layer_3", "layer_5", "layer_7"])
            out, raw_out = os.path.join(root, fmt), os.path.join(root, fmt + "-raw")
            _clear(out)
            r = export(src, out, fmt, progress=False, fsync=a.fsync, workers=a.workers)
            sizes = []  # bytes the export wrote per sample, for the raw side
            for i in range(len(ss)):
                rel = (f"rows_0-2000/data_{i}.ckpt" if fmt == "specforge"
                       else f"hidden_states/hs_{i}.safetensors")
                sizes.append(os.path.getsize(os.path.join(out, rel)))

            def run_export() -> tuple[float, int]:
                _clear(out)
                t0 = time.perf_counter()
                res = export(src, out, fmt, progress=False, fsync=a.fsync, workers=a.workers)
                return time.perf_counter() - t0, res.bytes_written

            def run_raw() -> tuple[float, int]:
                _clear(raw_out)
                t0 = time.perf_counter()
                handles: dict = {}
                for e in entries:       # open handles like the export does (lazily, once)
                    if e["shard"] not in handles:
                        handles[e["shard"]] = safe_open(os.path.join(src, e["shard"]), "pt")

                def one(i: int) -> int:
                    e = entries[i]
                    f = handles[e["shard"]]
                    ts = [f.get_tensor(f"{e['rid']}/{n}") for n in names]
                    ts.append(f.get_tensor(f"{e['rid']}/token_ids"))
                    views = [memoryview(t.reshape(-1).view(torch.uint8).numpy()) for t in ts]
                    pad = sizes[i] - sum(len(v) for v in views)
                    if pad > 0:
                        views.append(memoryview(bytes(pad)))
                    fd = os.open(os.path.join(raw_out, f"{i}.bin"),
                                 os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    try:
                        n = os.writev(fd, views)
                        if a.fsync:
                            os.fsync(fd)
                    finally:
                        os.close(fd)
                    return n

                with ThreadPoolExecutor(a.workers or min(4, os.cpu_count() or 1)) as pool:
                    total = sum(pool.map(one, range(len(entries))))
                return time.perf_counter() - t0, total

            ex, raw = [], []
            for _ in range(a.reps):
                ex.append(run_export())
                raw.append(run_raw())
            nb = ex[0][1]
            te, tr = [t for t, _ in ex], [t for t, _ in raw]
            results[fmt] = {
                "bytes_written": nb,
                "export": {"median_s": statistics.median(te), "min_s": min(te), "max_s": max(te),
                           "gb_per_s": nb / statistics.median(te) / 1e9},
                "raw": {"median_s": statistics.median(tr), "min_s": min(tr), "max_s": max(tr),
                        "gb_per_s": raw[0][1] / statistics.median(tr) / 1e9},
                "export_vs_raw": statistics.median(tr) / statistics.median(te),
                "ratio_min_max": [min(r_ / e_ for r_, e_ in zip(tr, te)),
                                  max(r_ / e_ for r_, e_ in zip(tr, te))],
            }
        print(json.dumps(results, indent=1))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(results, f, indent=1)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
