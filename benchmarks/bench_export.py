"""Export throughput vs a raw read+write of the same bytes (issue #9 goal: export >= 0.8x raw).

For each format, paired repetitions in ABBA order after one discarded warm-up pair:

(A) export: ``hscapture.export.export`` into an emptied directory (planning, manifest, every
    sample file, and for speculators the Arrow dataset + token_freq.pt: all inside the clock);
(B) raw: the floor any converter pays for the same bytes: for every sample, read the same
    source tensors through the same memory-mapped ``safe_open`` handles the reader uses and
    write them as they are (one ``os.writev`` of the tensors, no reshaping, zero-padded to the
    byte count the export wrote for that sample) to one file per sample, plus one file as large
    as the export's other files (manifest, dataset), with the same thread count and the same
    fsync setting. It writes no temporary name and renames nothing (the export does both: its
    cost is the export's). ``--raw-renamed`` (a diagnostic, not the goal's baseline) makes it
    write each file under a temporary name and rename it into place too, so that a run with and
    one without it say what the renames cost at the given worker count (several writers
    creating and renaming files in one directory contend for it; one writer does not).

Both sides clear their output directory outside the clock. Reported per format: seconds and
GB/s of each side (median, min-max) and the paired ratio export speed / raw speed
(= raw seconds / export seconds of the same pair): median, min-max, the distribution-free 95 %
interval of the median, and whether the whole spread clears 0.8.

``--breakdown`` adds, for SpecForge, what each part of one sample's write costs on its own (one
thread, best over the samples): the raw side's writev into a new file; the aux rows by the native
writer with their CRC; the final layer's CRC and its write; both layers' native writes into one
new file, and the same under a temporary name renamed into place; torch's pickling and the zip
records with the tensor bytes left out; and the whole file. Where the export's time goes on a
given host, measured rather than inferred from the totals.

``--profile`` adds a per-sample stage profile (one thread, in process, page cache warm): for
each format, milliseconds per sample to load (reader), build (assemble what is written) and
write (serialize + write the file), next to the raw side's load and writev.

    python benchmarks/bench_export.py --samples 100 --tokens 512 --hidden 2048 --reps 7 \\
        --dir /dev/shm --profile --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _stats  # noqa: E402

GOAL = 0.8


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


def _names(fmt: str) -> list[str]:
    return (["layer_1", "layer_3", "layer_5", "final_norm"] if fmt == "specforge"
            else ["layer_1", "layer_3", "layer_5", "layer_7"])


def _rel(fmt: str, i: int) -> str:
    return (f"rows_0-2000/data_{i}.ckpt" if fmt == "specforge"
            else f"hidden_states/hs_{i}.safetensors")


def _du(d: str) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)


def profile_stages(src: str, out: str, fmt: str, reps: int = 3) -> dict:
    """Milliseconds per sample of each stage, one thread (best of ``reps`` passes)."""
    from hscapture import _tensor_files as T
    from hscapture import export as E
    from hscapture.reader import open_shards

    ss = open_shards(src)
    plan = E._make_plan(ss, fmt, None, "require", None)
    names = plan.names()
    n = len(ss)
    best: dict[str, float] = {}
    for _ in range(reps):
        _clear(out)
        acc = dict.fromkeys(["export.load", "export.build", "export.write",
                             "raw.load", "raw.writev"], 0.0)
        for i in range(n):
            t0 = time.perf_counter()
            s = ss.load(i, names=names)
            t1 = time.perf_counter()
            if fmt == "specforge":
                d = E._build_specforge(s, plan)
                t2 = time.perf_counter()
                E._write_atomic(os.path.join(out, f"{i}.ckpt"),
                                lambda f: E._save_specforge(d, f, False), False)
            else:
                items = E._build_speculators(s, plan)
                t2 = time.perf_counter()
                E._write_atomic(os.path.join(out, f"{i}.safetensors"),
                                lambda f: E._write_safetensors(f, items), False)
            t3 = time.perf_counter()
            r = ss.load(i, names=names)
            t4 = time.perf_counter()
            views = [T._bytes_of(r.tensors[k]) for k in names] + [T._bytes_of(r.token_ids)]
            fd = os.open(os.path.join(out, f"{i}.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                         0o644)
            try:
                os.writev(fd, views)
            finally:
                os.close(fd)
            t5 = time.perf_counter()
            for k, v in (("export.load", t1 - t0), ("export.build", t2 - t1),
                         ("export.write", t3 - t2), ("raw.load", t4 - t3),
                         ("raw.writev", t5 - t4)):
                acc[k] += v
        for k, v in acc.items():
            best[k] = min(best.get(k, float("inf")), v / n * 1e3)
    best["export.total"] = best["export.load"] + best["export.build"] + best["export.write"]
    best["raw.total"] = best["raw.load"] + best["raw.writev"]
    best["raw/export"] = best["raw.total"] / best["export.total"]
    return best


def breakdown_specforge(src: str, out: str, reps: int = 5) -> dict:
    """Microseconds per sample of each part of a SpecForge file's write (see the module
    docstring), one thread, best of ``reps`` passes over the samples, each part into new
    files (as the export writes them)."""
    from hscapture import _files
    from hscapture import _tensor_files as T
    from hscapture import export as E
    from hscapture.reader import open_shards

    ss = open_shards(src)
    plan = E._make_plan(ss, "specforge", None, "require", None)
    names = plan.names()
    samples = [ss.load(i, names=names) for i in range(len(ss))]
    built = [E._build_specforge(s, plan) for s in samples]

    class _Null:        # a file object that keeps nothing (no fileno: the sink writes to it)
        def write(self, b: object) -> int:
            return len(b)   # type: ignore[arg-type]

    def new_fd(name: str) -> int:
        path = os.path.join(out, name)
        if os.path.exists(path):
            os.unlink(path)
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def raw(i: int) -> None:
        fd = new_fd(f"raw{i}")
        try:
            os.writev(fd, [T._bytes_of(samples[i].tensors[k]) for k in names])
        finally:
            os.close(fd)

    def aux(i: int, into: int | None = None) -> None:
        j = built[i]["aux_hidden_state"]
        fd = new_fd(f"aux{i}") if into is None else into
        try:
            first = j.sources[0]
            _files.writev_rows_crc32(fd, [T._bytes_of(x) for x in j.sources],
                                     int(first.shape[1]) * first.element_size(), 0,
                                     int(first.shape[0]))
        finally:
            if into is None:
                os.close(fd)

    def final_crc(i: int) -> None:
        T._crc32(T._bytes_of(built[i]["hidden_state"]))

    def final_write(i: int) -> None:
        fd = new_fd(f"final{i}")
        try:
            os.writev(fd, [T._bytes_of(built[i]["hidden_state"])])
        finally:
            os.close(fd)

    def container(i: int) -> None:
        T._torch_save(built[i], _Null())

    def both(fd: int, i: int) -> None:      # the final layer, then the aux rows: one file
        fin = built[i]["hidden_state"]
        _files.writev_rows_crc32(fd, [T._bytes_of(fin)], int(fin.shape[-1]) * fin.element_size(),
                                 0, int(fin.numel() // fin.shape[-1]))
        aux(i, fd)

    def one_file(i: int) -> None:
        fd = new_fd(f"one{i}")
        try:
            both(fd, i)
        finally:
            os.close(fd)

    def one_file_renamed(i: int) -> None:   # the same under a temporary name, then renamed
        path = os.path.join(out, f"ren{i}")
        with open(path + ".tmp", "wb") as f:
            both(f.fileno(), i)
        os.replace(path + ".tmp", path)

    def whole(i: int) -> None:
        E._write_atomic(os.path.join(out, f"{i}.ckpt"),
                        lambda f: E._save_specforge(built[i], f, False), False)

    def load(i: int) -> None:
        ss.load(i, names=names)

    parts = {"raw.writev": raw, "aux.native_writev_crc32": aux, "final.crc32": final_crc,
             "final.writev": final_write, "load": load,
             "one_file.native": one_file, "one_file.native_renamed": one_file_renamed,
             "whole_file": whole}
    best: dict[str, float] = {}
    real = T._write_tensor
    for _ in range(reps):
        _clear(out)
        for name, f in parts.items():
            t0 = time.perf_counter()
            for i in range(len(samples)):
                f(i)
            best[name] = min(best.get(name, float("inf")),
                             (time.perf_counter() - t0) / len(samples) * 1e6)
        T._write_tensor = lambda sink, t, crc32=True: 0     # the container without tensor bytes
        try:
            t0 = time.perf_counter()
            for i in range(len(samples)):
                container(i)
            best["container_python"] = min(best.get("container_python", float("inf")),
                                           (time.perf_counter() - t0) / len(samples) * 1e6)
        finally:
            T._write_tensor = real
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=7, help="counted pairs (>= 5), after 1 warm-up")
    ap.add_argument("--formats", default="specforge,speculators",
                    help="comma-separated; 'specforge:nocrc' = SpecForge with crc32=False "
                         "(hscapture export --no-crc: zip records' CRC-32 written as 0)")
    ap.add_argument("--fsync", action="store_true", help="fsync every file on both sides")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--crc", choices=["default", "isal", "zlib"], default="default",
                    help="isal / zlib: force that CRC-32 in the export's zip writer (what it "
                         "uses without the native module's PCLMUL CRC; the joined tensors then "
                         "go by the bounce path, as they did before writev_rows_crc32)")
    ap.add_argument("--crc-thread-min", type=int, default=None,
                    help="bytes from which the native CRC goes to a helper thread beside the "
                         "write (hscapture._tensor_files.CRC_THREAD_MIN; default: the module's; "
                         "a huge value: always inline, as before the helper)")
    ap.add_argument("--profile", action="store_true", help="add the per-sample stage profile")
    ap.add_argument("--breakdown", action="store_true",
                    help="add SpecForge's per-part write costs (one thread)")
    ap.add_argument("--raw-renamed", action="store_true",
                    help="diagnostic: the raw side writes each file under a temporary name and "
                         "renames it into place, as the export does (its cost then cancels out)")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.reps < 5:
        ap.error(f"--reps must be >= 5, got {a.reps}")

    from safetensors import safe_open

    import hscapture._tensor_files as T
    from hscapture.export import export
    from hscapture.reader import open_shards

    if a.crc == "zlib":
        import zlib

        T._crc32, T.CRC32_IMPL = zlib.crc32, "zlib"
    elif a.crc == "isal":
        from isal.isal_zlib import crc32

        T._crc32, T.CRC32_IMPL = crc32, "isal"
    if a.crc_thread_min is not None:
        T.CRC_THREAD_MIN = a.crc_thread_min
    nw = a.workers or min(4, os.cpu_count() or 1)
    root = tempfile.mkdtemp(dir=a.dir)
    config = {"samples": a.samples, "tokens": a.tokens, "hidden": a.hidden, "reps": a.reps,
              "warmup": 1, "order": "ABBA", "fsync": a.fsync, "workers": nw,
              "raw_renamed": a.raw_renamed,
              "crc32": T.CRC32_IMPL, "crc_thread_min": T.CRC_THREAD_MIN,
              "bounce_bytes": getattr(T, "BOUNCE_BYTES", None),
              "torch": torch.__version__, "scratch": _stats.fs_info(root)}
    results: dict = {}
    goals = []
    try:
        src = os.path.join(root, "shards")
        build(src, a.samples, a.tokens, a.hidden)
        ss = open_shards(src)
        entries = [ss.entry(i) for i in range(len(ss))]
        for label in a.formats.split(","):
            fmt, _, mode = label.partition(":")
            if mode not in ("", "nocrc") or (mode and fmt != "specforge"):
                raise SystemExit(f"--formats: unknown {label!r} (specforge[:nocrc], speculators)")
            crc = mode != "nocrc"
            opts = {} if crc else {"crc32": False}   # (older code, an A/B's baseline: no such option)
            names = _names(fmt)
            out, raw_out = os.path.join(root, fmt), os.path.join(root, fmt + "-raw")
            _clear(out)
            export(src, out, fmt, progress=False, fsync=a.fsync, workers=a.workers, **opts)
            sizes = [os.path.getsize(os.path.join(out, _rel(fmt, i))) for i in range(len(ss))]
            other = _du(out) - sum(sizes)   # manifest, dataset, token_freq.pt

            def run_export(_rep: int) -> dict:
                _clear(out)
                t0 = time.perf_counter()
                res = export(src, out, fmt, progress=False, fsync=a.fsync, workers=a.workers,
                             **opts)
                dt = time.perf_counter() - t0
                return {"s": dt, "bytes": _du(out), "bytes_reported": res.bytes_written}

            def run_raw(_rep: int) -> dict:
                _clear(raw_out)
                t0 = time.perf_counter()
                handles: dict = {}
                for e in entries:       # open handles like the reader does (once per shard)
                    if e["shard"] not in handles:
                        handles[e["shard"]] = safe_open(os.path.join(src, e["shard"]), "pt")

                def write(path: str, views: list) -> int:
                    at = path + ".tmp" if a.raw_renamed else path
                    fd = os.open(at, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    try:
                        n = os.writev(fd, views)
                        if a.fsync:
                            os.fsync(fd)
                    finally:
                        os.close(fd)
                    if a.raw_renamed:
                        os.replace(at, path)
                    return n

                def one(i: int) -> int:
                    e = entries[i]
                    f = handles[e["shard"]]
                    ts = [f.get_tensor(f"{e['rid']}/{n}") for n in names]
                    ts.append(f.get_tensor(f"{e['rid']}/token_ids"))
                    views = [memoryview(t.reshape(-1).view(torch.uint8).numpy()) for t in ts]
                    pad = sizes[i] - sum(len(v) for v in views)
                    if pad > 0:
                        views.append(memoryview(bytes(pad)))
                    return write(os.path.join(raw_out, f"{i}.bin"), views)

                with ThreadPoolExecutor(nw) as pool:
                    total = sum(pool.map(one, range(len(entries))))
                total += write(os.path.join(raw_out, "other.bin"), [memoryview(bytes(other))])
                # the shards' maps closed on the clock, as the export closes its reads' (until
                # 2026-12-06 they were unmapped after it: ~0.5 ms a 10 MB sample on the 2-core
                # CPU machine, ~12 % of a sample's raw time, charged to the export alone)
                handles.clear()
                dt = time.perf_counter() - t0
                left = [n for n in os.listdir(raw_out) if n.endswith(".tmp")]
                if left or len(os.listdir(raw_out)) != len(entries) + 1:
                    raise SystemExit(f"raw side: {len(os.listdir(raw_out))} files, expected "
                                     f"{len(entries) + 1}; temporary names left: {left[:3]}")
                return {"s": dt, "bytes": total}

            def on_rep(i: int, ex: dict, raw: dict) -> None:
                print(f"{label} pair {i}: export {ex['s']:.3f} s, raw {raw['s']:.3f} s, "
                      f"ratio {raw['s'] / ex['s']:.3f}", flush=True)

            p = _stats.run_paired(run_export, run_raw, reps=a.reps, warmup=1, order="ABBA",
                                  key="s", on_rep=on_rep)
            nb = p.candidate_runs[0]["bytes"]
            if p.baseline_runs[0]["bytes"] != nb:
                raise SystemExit(f"{fmt}: raw wrote {p.baseline_runs[0]['bytes']} bytes, the "
                                 f"export {nb}: not the same bytes")
            ratios = [b / c for c, b in zip(p.candidate, p.baseline)]   # speed ratio
            summ = _stats.pair_summary(ratios, GOAL, ">=")
            results[label] = {
                "bytes_written": nb,
                "export_s": _stats.summarize(p.candidate),
                "raw_s": _stats.summarize(p.baseline),
                "export_gb_per_s": nb / _stats.median(p.candidate) / 1e9,
                "raw_gb_per_s": nb / _stats.median(p.baseline) / 1e9,
                "export_vs_raw": summ,
                "order": p.order,
            }
            goals.append(_stats.goal_record(f"{label} export/raw speed", ratios, GOAL, ">="))
            print(_stats.format_goal(goals[-1]), flush=True)
            if a.profile and crc:
                results[label]["profile_ms_per_sample"] = prof = profile_stages(
                    src, os.path.join(root, fmt + "-prof"), fmt)
                print(f"{fmt} profile (ms/sample, 1 thread): " +
                      ", ".join(f"{k} {v:.3f}" for k, v in prof.items()), flush=True)
            if a.breakdown and fmt == "specforge" and crc:
                results[label]["breakdown_us_per_sample"] = bd = breakdown_specforge(
                    src, os.path.join(root, fmt + "-parts"))
                print(f"{fmt} breakdown (us/sample, 1 thread): " +
                      ", ".join(f"{k} {v:.0f}" for k, v in bd.items()), flush=True)
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(raw_out, ignore_errors=True)
        print(json.dumps({k: {"export_vs_raw_median": v["export_vs_raw"]["median"],
                              "min": v["export_vs_raw"]["min"], "max": v["export_vs_raw"]["max"],
                              "export_gb_per_s": v["export_gb_per_s"],
                              "raw_gb_per_s": v["raw_gb_per_s"]} for k, v in results.items()},
                         indent=1))
        if a.json:
            inside = ["export(): plan, manifest, every sample file (tmp + rename, fsync if set), "
                      "speculators' Arrow dataset + token_freq.pt"]
            _stats.write_record(
                a.json, benchmark="bench_export",
                timed_regions={
                    "export": _stats.timed_region(inside, ["emptying the output directory"],
                                                  "time.perf_counter"),
                    "raw": _stats.timed_region(
                        ["safe_open of each shard, get_tensor of the same tensors, one writev "
                         "per sample file padded to the export's size (with --raw-renamed "
                         "under a temporary name, then renamed), one file of the "
                         "export's other bytes, fsync if set, the shards closed (their maps "
                         "unmapped; since 2026-12-06)"],
                        ["emptying the output directory"], "time.perf_counter")},
                results=results, config=config, goals=goals,
                notes=["ratio = export speed / raw speed of the same pair (raw s / export s)"])
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
