"""ShardWriter throughput vs a raw ``os.write`` + ``fdatasync`` of the same bytes.

    python benchmarks/bench_shards.py [--dir /dev/shm --dir /var/tmp] [--out bench-results/shards.json]

Both sides write the same tensors (a pool of distinct samples reused under new rids), sync every
``--flush-every`` samples (ShardWriter: ``flush()``; raw: ``fdatasync``) and sync at the end
(ShardWriter: ``close()``, which also writes headers, renames and appends the index). Runs
alternate raw / writer ``--repeat`` times; the median of each is reported, plus the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hscapture.sample import Sample  # noqa: E402
from hscapture.shards import ShardWriter  # noqa: E402


def make_pool(n: int, tokens: int, hidden: int, layers: int) -> list[Sample]:
    pool = []
    g = torch.Generator().manual_seed(0)
    ids = list(range(layers - 1)) + [-1]
    kinds = ["residual"] * (layers - 1) + ["final_norm"]
    for i in range(n):
        tensors = {(f"layer_{l}" if k == "residual" else "final_norm"):
                   torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
                   for l, k in zip(ids, kinds)}
        pool.append(Sample(rid=f"pool{i}", producer_id="bench", epoch=1, num_tokens=tokens,
                           token_ids=torch.arange(tokens, dtype=torch.int32), tensors=tensors,
                           layers=ids, layer_kinds=kinds, dtype="bfloat16", hidden=hidden))
    return pool


def bytes_of(s: Sample) -> list[memoryview]:
    out = [memoryview(t.reshape(-1).view(torch.uint8).numpy()) for t in s.tensors.values()]
    out.append(memoryview(s.token_ids.view(torch.uint8).numpy()))
    return out


def run_raw(d: str, pool: list[Sample], n: int, flush_every: int) -> tuple[float, int]:
    path = os.path.join(d, "raw.bin")
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    total = 0
    for i in range(n):
        views = bytes_of(pool[i % len(pool)])  # one writev per sample, as the writer does
        want = sum(len(v) for v in views)
        k = os.writev(fd, views)
        total += k
        if k != want:  # partial write: finish it
            rest = memoryview(b"".join(views))[k:]
            while len(rest):
                m = os.write(fd, rest)
                rest = rest[m:]
                total += m
        if (i + 1) % flush_every == 0:
            os.fdatasync(fd)
    os.fsync(fd)
    os.close(fd)
    dt = time.perf_counter() - t0
    os.unlink(path)
    return dt, total


def run_writer(d: str, pool: list[Sample], n: int, flush_every: int, max_shard: int,
               run: int) -> tuple[float, int]:
    out = os.path.join(d, f"shards-{run}")
    total = 0
    t0 = time.perf_counter()
    w = ShardWriter(out, max_shard_bytes=max_shard, fsync=True)
    released = 0
    for i in range(n):
        s = pool[i % len(pool)]
        s.rid = f"r{i}"
        w.add(s)
        total += s.nbytes + s.token_ids.numel() * s.token_ids.element_size()
        if (i + 1) % flush_every == 0:
            released += len(w.flush())
    released += len(w.close())
    dt = time.perf_counter() - t0
    assert released == n, (released, n)
    shutil.rmtree(out)
    return dt, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", action="append", help="target directory (repeatable); default "
                    "/dev/shm and a disk directory (/var/tmp)")
    ap.add_argument("--out", default="bench-results/bench_shards.json")
    ap.add_argument("--total-mib", type=int, default=1024, help="bytes per run (MiB)")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=4, help="tensors per sample (EAGLE-3: 4)")
    ap.add_argument("--flush-every", type=int, default=8)
    ap.add_argument("--max-shard-mib", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    dirs = a.dir or ["/dev/shm", "/var/tmp"]
    pool = make_pool(8, a.tokens, a.hidden, a.layers)
    per = sum(len(v) for v in bytes_of(pool[0]))
    n = max(1, (a.total_mib << 20) // per)
    results = {"tokens": a.tokens, "hidden": a.hidden, "layers": a.layers, "dtype": "bfloat16",
               "sample_bytes": per, "samples": n, "flush_every": a.flush_every,
               "max_shard_bytes": a.max_shard_mib << 20, "python": sys.version.split()[0],
               "torch": torch.__version__, "dirs": {}}
    for base in dirs:
        d = tempfile.mkdtemp(prefix="hsc-bench-", dir=base)
        try:
            raw, wr = [], []
            run_raw(d, pool, min(n, 16), a.flush_every)  # warm-up (page cache, allocator)
            run_writer(d, pool, min(n, 16), a.flush_every, a.max_shard_mib << 20, -1)
            for r in range(a.repeat):
                dt, b = run_raw(d, pool, n, a.flush_every)
                raw.append(b / dt)
                dt, b = run_writer(d, pool, n, a.flush_every, a.max_shard_mib << 20, r)
                wr.append(b / dt)
            res = {"raw_write_fsync_GBps": statistics.median(raw) / 1e9,
                   "shardwriter_GBps": statistics.median(wr) / 1e9,
                   "raw_runs_GBps": [x / 1e9 for x in raw], "shardwriter_runs_GBps": [x / 1e9 for x in wr]}
            res["ratio"] = res["shardwriter_GBps"] / res["raw_write_fsync_GBps"]
            results["dirs"][base] = res
            print(f"{base}: raw {res['raw_write_fsync_GBps']:.2f} GB/s, ShardWriter "
                  f"{res['shardwriter_GBps']:.2f} GB/s, ratio {res['ratio']:.2f}", flush=True)
        finally:
            shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
