"""ShardWriter throughput vs a raw ``os.write`` + ``fdatasync`` of the same bytes.

    python benchmarks/bench_shards.py [--dir /dev/shm --dir /var/tmp] [--out bench-results/shards.json]

Both sides write the same tensors (a pool of distinct samples reused under new rids, in this
process's memory), sync every ``--flush-every`` samples (ShardWriter: ``flush()``; raw:
``fdatasync``) and sync at the end (ShardWriter: ``close()``, which also writes headers, renames
and appends the index). Writer and raw alternate (A B A B ...) for ``--reps`` repetitions after
one warm-up; reported: median and min..max of each and of the paired ratio writer/raw. Goal:
ratio >= 0.9 over the whole spread.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _stats  # noqa: E402

from hscapture.sample import Sample  # noqa: E402
from hscapture.shards import ShardWriter  # noqa: E402

GOAL = 0.9


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


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", action="append", help="target directory (repeatable); default "
                    "/dev/shm and a disk directory (/var/tmp)")
    ap.add_argument("--out", default="bench-results/bench_shards.json")
    ap.add_argument("--plot", default=None, help="PNG path (default: --out with .png)")
    ap.add_argument("--total-mib", type=int, default=1024, help="bytes per run (MiB)")
    ap.add_argument("--tokens", type=int, default=550, help="tokens per sample (EAGLE-3 prompts ~550)")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=4, help="tensors per sample (EAGLE-3: 4)")
    ap.add_argument("--flush-every", type=int, default=8)
    ap.add_argument("--max-shard-mib", type=int, default=2048)
    ap.add_argument("--reps", "--repeat", dest="reps", type=int, default=5,
                    help="counted repetitions after one warm-up")
    a = ap.parse_args(argv)
    dirs = a.dir or ["/dev/shm", "/var/tmp"]
    pool = make_pool(8, a.tokens, a.hidden, a.layers)
    per = sum(len(v) for v in bytes_of(pool[0]))
    n = max(1, (a.total_mib << 20) // per)
    results = {"sample_bytes": per, "samples": n, "dirs": {}}
    goals = []
    for base in dirs:
        d = tempfile.mkdtemp(prefix="hsc-bench-", dir=base)
        try:
            def writer(r: int) -> dict:
                dt, b = run_writer(d, pool, n, a.flush_every, a.max_shard_mib << 20, r)
                return {"seconds": dt, "bytes": b, "GBps": b / dt / 1e9, "samples_per_s": n / dt}

            def raw(r: int) -> dict:
                dt, b = run_raw(d, pool, n, a.flush_every)
                return {"seconds": dt, "bytes": b, "GBps": b / dt / 1e9, "samples_per_s": n / dt}
            p = _stats.run_paired(writer, raw, reps=a.reps, warmup=1, key="GBps")
            summ = p.summary()
            res = {"fs": _stats.fs_info(base), "shardwriter_GBps": summ["candidate"],
                   "raw_write_fsync_GBps": summ["baseline"], "ratio": summ["ratio"],
                   "shardwriter_samples_per_s": _stats.summarize(
                       [x["samples_per_s"] for x in p.candidate_runs]),
                   "order": summ["order"]}
            results["dirs"][base] = res
            g = _stats.goal_record(f"ShardWriter/raw into {base}", summ["ratio"]["values"],
                                   GOAL, ">=")
            goals.append(g)
            print(f"{base} ({res['fs']['fstype']}): raw {_stats.fmt_spread(summ['baseline'])} GB/s, "
                  f"ShardWriter {_stats.fmt_spread(summ['candidate'])} GB/s "
                  f"({res['shardwriter_samples_per_s']['median']:,.1f} samples/s), ratio "
                  f"{_stats.fmt_spread(summ['ratio'])}", flush=True)
        finally:
            shutil.rmtree(d, ignore_errors=True)
    for g in goals:
        print(_stats.format_goal(g), flush=True)
    common_out = ["building the sample pool", "removing the files after the run"]
    tr = {"shardwriter": _stats.timed_region(
              ["ShardWriter(fsync=True) creation", "add() of every sample (one writev each)",
               "flush() every --flush-every samples (fdatasync)",
               "close(): headers, renames, index append, fsync"], common_out,
              "time.perf_counter"),
          "raw": _stats.timed_region(
              ["open", "one writev per sample of the same tensors + token ids",
               "fdatasync every --flush-every samples", "fsync + close"], common_out,
              "time.perf_counter")}
    rec = _stats.write_record(a.out, benchmark="bench_shards", timed_regions=tr,
                              results=results, config=vars(a), goals=goals,
                              notes=["both write from the same in-process CPU tensors (same "
                                     "memory kind); ratio paired per repetition"])
    plot(rec, a.plot or os.path.splitext(a.out)[0] + ".png")
    return rec


def plot(rec: dict, path: str) -> None:
    plt = _stats.get_pyplot()
    if plt is None:
        return
    dirs = rec["results"]["dirs"]
    fig, ax = plt.subplots(figsize=(6, 4))
    names = list(dirs)
    for k, key in enumerate(("raw_write_fsync_GBps", "shardwriter_GBps")):
        med, err = _stats.errorbar_args([dirs[d][key] for d in names])
        ax.bar([i + (k - 0.5) * 0.38 for i in range(len(names))], med, 0.38, yerr=err,
               capsize=4, label=key.split("_")[0])
    ax.set_xticks(range(len(names)), [f"{d} ({dirs[d]['fs']['fstype']})" for d in names])
    ax.set_ylabel("GB/s (median, min..max)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
