"""Random-sample reads: hscapture.reader vs safetensors' safe_open used directly.

Both sides read the index once outside the timer and open shard handles inside it; both
read the same samples (every layer + token ids) in the same random order from the
same shard files, page cache warm; the safe_open side keeps one handle per shard open and knows
each sample's tensor names in advance (the best a hand-written reader can do). Also times the
old load_sample (index reread + name scan per call) on a subset. Reps run in pairs whose
order alternates (ABBA); median and min-max of the paired ratios are reported.

    python benchmarks/bench_reader.py --samples 600 --tokens 256 --hidden 1024 --layers 4
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def build(d: str, n: int, T: int, H: int, K: int) -> None:
    from hscapture.sample import Sample
    from hscapture.shards import ShardWriter

    g = torch.Generator().manual_seed(0)
    with ShardWriter(d, fsync=False, max_shard_bytes=256 << 20) as w:
        for i in range(n):
            t = {f"layer_{l}": torch.randn(T, H, generator=g).bfloat16() for l in range(K)}
            w.add(Sample(rid=f"r{i:06d}", producer_id="p", epoch=1, num_tokens=T,
                         token_ids=torch.arange(T, dtype=torch.int32), tensors=t,
                         layers=list(range(K)), layer_kinds=["residual"] * K,
                         dtype="bfloat16", hidden=H,
                         fields={"loss_mask": torch.ones(T, dtype=torch.uint8)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=600)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--legacy-samples", type=int, default=100)
    ap.add_argument("--no-touch", action="store_true",
                    help="do not touch every page of each tensor (then only mapping is timed)")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--json", default=None, help="write results here")
    a = ap.parse_args()

    from safetensors import safe_open

    from hscapture.reader import open_shards
    from hscapture.shards import read_index

    root = tempfile.mkdtemp(dir=a.dir)
    try:
        d = os.path.join(root, "shards")
        build(d, a.samples, a.tokens, a.hidden, a.layers)
        idx = read_index(d)
        rids = list(idx)
        order = rids[:]
        random.Random(1).shuffle(order)
        names = [f"layer_{l}" for l in range(a.layers)] + ["token_ids", "field.loss_mask"]
        touch = not a.no_touch

        def use(ts) -> None:  # one element per 4 KiB page: forces the bytes in, little compute
            if touch:
                for t in ts:
                    t.reshape(-1).view(torch.uint8)[::4096].sum()

        nbytes = a.samples * (a.tokens * a.hidden * a.layers * 2 + a.tokens * 5)

        def ours() -> float:
            ss = open_shards(d)   # the index is read once, outside, as idx is for safe_open
            t0 = time.perf_counter()          # shard handles are opened inside, on both sides
            for rid in order:
                s = ss.get(rid)
                use(s.tensors.values())
                use((s.token_ids, *s.fields.values()))
            return time.perf_counter() - t0

        def direct() -> float:
            t0 = time.perf_counter()
            handles: dict = {}
            for rid in order:
                sh = idx[rid]["shard"]
                f = handles.get(sh)
                if f is None:
                    f = handles[sh] = safe_open(os.path.join(d, sh), "pt")
                use([f.get_tensor(f"{rid}/{n}") for n in names])
            return time.perf_counter() - t0

        def legacy() -> float:  # what load_sample did before: reread index, scan every name
            t0 = time.perf_counter()
            for rid in order[:a.legacy_samples]:
                e = read_index(d)[rid]
                with safe_open(os.path.join(d, e["shard"]), "pt") as f:
                    use([f.get_tensor(k) for k in f.keys() if k.startswith(rid + "/")])
            return (time.perf_counter() - t0) * len(order) / a.legacy_samples

        ours(), direct()  # warm the page cache
        res: dict[str, list[float]] = {"reader": [], "safe_open": [], "legacy_load_sample": []}
        for i in range(a.reps):    # ABBA: which side goes first alternates
            if i % 2 == 0:
                res["reader"].append(ours())
                res["safe_open"].append(direct())
            else:
                res["safe_open"].append(direct())
                res["reader"].append(ours())
        res["legacy_load_sample"].append(legacy())
        out = {"samples": a.samples, "tokens": a.tokens, "hidden": a.hidden, "layers": a.layers,
               "bytes": nbytes, "reps": a.reps, "touch": touch}
        for k, v in res.items():
            out[k] = {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v),
                      "samples_per_s": a.samples / statistics.median(v),
                      "gb_per_s": nbytes / statistics.median(v) / 1e9}
        out["reader_vs_safe_open"] = out["safe_open"]["median_s"] / out["reader"]["median_s"]
        ratios = [s / r for r, s in zip(res["reader"], res["safe_open"])]
        out["ratio_min_max"] = [min(ratios), max(ratios)]
        print(json.dumps(out, indent=1))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
