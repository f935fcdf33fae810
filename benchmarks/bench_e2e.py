"""End to end: producer process → ring → Subscriber → ShardWriter shards, vs raw writes and the
old per-request ``torch.save`` + folder polling, side by side in one run.

    python benchmarks/bench_e2e.py [--device cpu|cuda] [--gb 2] [--disk-dir DIR]
                                   [--out bench-results/bench_e2e.json] [--plot bench-results/bench_e2e.png]

Workload: EAGLE-3-like records (``--layers`` 4 tensors × T tokens × ``--hidden`` 4096, bf16; T
uniform in ``--min-tokens``..``--max-tokens``), one request per record, the same request list for
every method, about ``--gb`` GB of hidden states per run. Methods, each timed from the producer's
first capture to the last byte durable at the consumer:

* ``hscapture``: a real producer process (``Producer.capture`` of ``--device`` tensors, full
  policy ``wait`` so nothing is dropped and the producer runs at the consumer's pace) and, in this
  process, the real :func:`hscapture.drain.drain` (Subscriber → ShardWriter, fsync'd, ring space
  released after each durable flush). Written once into ``--shm-dir`` (tmpfs) and once into
  ``--disk-dir`` (whatever filesystem that is: reported in the JSON).
* ``raw``: this process writes the same bytes (one ``writev`` per request, ``fdatasync`` every
  ``--flush-mb`` like the drain, ``fsync`` at the end) into one file in the same directory: the
  ceiling for that storage.
* ``deliver``: the same producer, consumed live by a Subscriber in this process that copies
  every sample out of the ring and releases it (no storage): what a training job reading
  hidden states online gets.
* ``deliver_view``: the same, but the subscriber reads every byte in place (a checksum over
  the zero-copy ring views) instead of copying it out: what hscapture's zero-copy API gives.
* ``old``: the approach hscapture replaces: a producer process ``torch.save``s each request
  (tensors moved to CPU) into ``<shm-dir>/…/req_N/hidden.pt`` (tmp + rename); a reader process
  polls the folder, ``torch.load``s every file (all bytes are read) and deletes it.

Goals printed: hscapture ≥ 90% of raw write to the same directory; hscapture ≥ 20× the old way
(both into tmpfs). Results go to ``--out`` (JSON) and ``--plot`` (PNG, needs matplotlib).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GOAL_VS_RAW = 0.90
GOAL_VS_OLD = 20.0


# -- shared helpers (also used by bench_gpu.py) ---------------------------------------------

def fs_info(path: str | os.PathLike) -> dict:
    """Filesystem type, mount point and free space of ``path`` (from /proc/self/mountinfo)."""
    real = os.path.realpath(path)
    best = ("", "?", "?")
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                parts = line.split()
                sep = parts.index("-")
                mnt = parts[4].replace("\\040", " ")
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/") or mnt == "/") \
                        and len(mnt) >= len(best[0]):
                    best = (mnt, parts[sep + 1], parts[sep + 2])
    except (OSError, ValueError):
        pass
    st = os.statvfs(real)
    fstype = best[1]
    return {"path": real, "mount": best[0], "fstype": fstype, "source": best[2],
            "free_bytes": st.f_bavail * st.f_frsize, "size_bytes": st.f_blocks * st.f_frsize,
            "memory_backed": fstype in ("tmpfs", "ramfs", "hugetlbfs")}


def env_info() -> dict:
    info = {"python": sys.version.split()[0], "torch": torch.__version__,
            "cpus": os.cpu_count(), "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda_version"] = torch.version.cuda
    try:
        import hscapture
        info["hscapture"] = hscapture.__version__
    except Exception:  # pragma: no cover
        pass
    return info


def save_json(path: str, data: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=2, default=str)
    print(f"wrote {path}", flush=True)


def get_pyplot():
    """matplotlib.pyplot with a non-interactive backend, or None (with a message)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except Exception as exc:
        print(f"no plot: matplotlib is not importable ({type(exc).__name__}: {exc}); "
              f"pip install matplotlib, the JSON has every number", flush=True)
        return None


def read_event(proc: subprocess.Popen, want: str, timeout: float = 600.0) -> dict:
    """Read JSON lines from a child's stdout until the event ``want`` (others are skipped)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"child {proc.args[1] if len(proc.args) > 1 else proc.args} "
                               f"exited with {proc.wait()} before event {want!r}")
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            print(f"  [child] {line.rstrip()}", flush=True)
            continue
        if ev.get("event") == "error":
            raise RuntimeError(f"child failed: {ev.get('message')}")
        if ev.get("event") == want:
            return ev
    raise TimeoutError(f"no {want!r} event within {timeout:g}s")


def emit(**event) -> None:
    print(json.dumps(event), flush=True)


def stop_child(proc: subprocess.Popen, timeout: float = 30.0) -> int:
    try:
        if proc.stdin and not proc.stdin.closed:
            proc.stdin.close()          # children wait for EOF on stdin before exiting
    except OSError:
        pass
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


# -- the workload -----------------------------------------------------------------------------

def make_requests(gb: float, hidden: int, layers: int, lo: int, hi: int, seed: int) -> list[int]:
    """Token counts of the requests, about ``gb`` GB of hidden states in total."""
    rng = random.Random(seed)
    out, total = [], 0
    while total < gb * 1e9 or not out:
        t = rng.randint(lo, hi)
        out.append(t)
        total += t * hidden * 2 * layers
    return out


SLACK = 509     # requests start at varying (odd) row offsets into the pool


def make_pool(hidden: int, layers: int, max_tokens: int, seed: int, device: str):
    """Source tensors [max_tokens + SLACK, hidden] bf16 per layer and int32 token ids (CPU)."""
    g = torch.Generator().manual_seed(seed)
    pool = [torch.randn(max_tokens + SLACK, hidden, generator=g).to(torch.bfloat16).to(device)
            for _ in range(layers)]
    ids = torch.randint(0, 128_000, (max_tokens + SLACK,), generator=g, dtype=torch.int32)
    return pool, ids


def request_slice(i: int, tokens: int) -> slice:
    o = (i * 97) % SLACK
    return slice(o, o + tokens)


# -- child processes -----------------------------------------------------------------------

def child_produce(spec: dict) -> None:
    """hscapture producer: capture every request, as fast as the ring lets it."""
    from hscapture import Producer

    dev = spec["device"]
    if dev == "cuda":
        torch.cuda.init()
    pool, ids = make_pool(spec["hidden"], spec["layers"], spec["max_tokens"], spec["seed"], dev)
    layer_ids = list(range(spec["layers"] - 1)) + [spec["num_model_layers"] - 1]
    kinds = ["residual"] * (spec["layers"] - 1) + ["final_norm"]
    p = Producer(spec["endpoint"], producer_id=spec["producer_id"], capacity=spec["ring_bytes"],
                 full_policy="wait", wait_timeout_s=600.0, model="bench-e2e")
    emit(event="ready", pinned=p.stats()["pinned"], segment=p.segment)
    if not p.wait_for_consumers(1, timeout_s=60):
        emit(event="error", message="no consumer attached within 60 s")
        return
    if dev == "cuda":
        torch.cuda.synchronize()
    t0 = time.monotonic()
    emit(event="start", t=t0)
    drops = 0
    for i, tokens in enumerate(spec["requests"]):
        s = request_slice(i, tokens)
        ok = p.capture(f"req-{i:07d}", [t[s] for t in pool], layers=layer_ids, layer_kinds=kinds,
                       token_ids=ids[s])
        drops += not ok
    t_issued = time.monotonic()
    p.flush(timeout_s=600)
    emit(event="captured", t_issued=t_issued, t_flushed=time.monotonic(), drops=drops,
         stats={k: v for k, v in p.stats().items() if isinstance(v, (int, bool))})
    sys.stdin.read()        # stay alive (segment, notices) until the parent is done
    p.close()


def child_old_produce(spec: dict) -> None:
    """Old way, server side: per-request torch.save into <root>/req_N/hidden.pt."""
    dev = spec["device"]
    pool, ids = make_pool(spec["hidden"], spec["layers"], spec["max_tokens"], spec["seed"], dev)
    root = spec["root"]
    emit(event="ready")
    sys.stdin.readline()    # go signal (the reader is polling)
    if dev == "cuda":
        torch.cuda.synchronize()
    t0 = time.monotonic()
    emit(event="start", t=t0)
    for i, tokens in enumerate(spec["requests"]):
        s = request_slice(i, tokens)
        d = os.path.join(root, f"req_{i}")
        os.makedirs(d)
        obj = {f"layer_{k}": t[s].to("cpu", copy=True) for k, t in enumerate(pool)}
        obj["token_ids"] = ids[s].clone()
        torch.save(obj, os.path.join(d, "hidden.pt.tmp"))
        os.rename(os.path.join(d, "hidden.pt.tmp"), os.path.join(d, "hidden.pt"))
    emit(event="written", t=time.monotonic())
    sys.stdin.read()


def child_old_read(spec: dict) -> None:
    """Old way, client side: poll the folder, torch.load each request, delete it."""
    root, n = spec["root"], len(spec["requests"])
    emit(event="ready")
    got, nbytes, polls, checksum = 0, 0, 0, 0
    while got < n:
        polls += 1
        names = [x for x in os.listdir(root) if x.startswith("req_")]
        progressed = False
        for name in sorted(names, key=lambda x: int(x[4:])):
            f = os.path.join(root, name, "hidden.pt")
            if not os.path.exists(f):
                continue
            obj = torch.load(f)            # reads every byte of the file into memory
            for k, t in obj.items():
                if k != "token_ids":
                    nbytes += t.numel() * t.element_size()
            checksum ^= int(obj["token_ids"][0])
            shutil.rmtree(os.path.join(root, name))
            got += 1
            progressed = True
        if not progressed:
            time.sleep(0.001)
    emit(event="done", t=time.monotonic(), samples=got, bytes=nbytes, polls=polls,
         checksum=checksum)
    sys.stdin.read()


def spawn(role: str, spec: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), role, json.dumps(spec)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=str(ROOT))


# -- the three methods ------------------------------------------------------------------------

def run_hscapture(base: dict, target: str, run: int) -> dict:
    from hscapture.drain import drain
    from hscapture.endpoint import default_endpoint
    from hscapture.shards import load_sample, read_index

    producer_id = f"bench-e2e-{os.getpid()}-{run}"
    out_dir = tempfile.mkdtemp(prefix="hsc-e2e-shards-", dir=target)
    spec = dict(base, endpoint=default_endpoint(producer_id), producer_id=producer_id)
    proc = spawn("_produce", spec)
    try:
        ready = read_event(proc, "ready", timeout=300)
        res = drain(spec["endpoint"], out_dir, max_samples=len(base["requests"]),
                    idle_timeout_s=120, connect_timeout_s=120,
                    flush_bytes=base["flush_bytes"], progress=False,
                    metadata={"model": "bench-e2e"}, write_threads=base["write_threads"])
        t_end = time.monotonic()
        start = read_event(proc, "start")
        cap = read_event(proc, "captured")
        stop_child(proc)
        # correctness spot check (outside the timing): first and last request, bit for bit
        index = read_index(out_dir)
        pool, ids = make_pool(base["hidden"], base["layers"], base["max_tokens"], base["seed"],
                              "cpu")
        checked = []
        for i in sorted({0, len(base["requests"]) - 1}):
            got = load_sample(out_dir, f"req-{i:07d}")
            s = request_slice(i, base["requests"][i])
            names = [k for k in got if k != "token_ids"]
            exact = len(names) == base["layers"] and all(
                torch.equal(got[n].view(torch.int16), pool[k][s].view(torch.int16))
                for k, n in enumerate(sorted(names, key=_layer_order))) and \
                torch.equal(got["token_ids"].to(torch.int32), ids[s])
            checked.append({"rid": f"req-{i:07d}", "exact": bool(exact)})
        seconds = t_end - start["t"]
        out = {"method": "hscapture", "dir": out_dir, "seconds": seconds, "bytes": res.bytes,
               "samples": res.samples, "GBps": res.bytes / seconds / 1e9,
               "samples_per_s": res.samples / seconds, "drain_GBps": res.gbps,
               "producer_drops": cap["drops"], "producer_pinned": ready.get("pinned"),
               "producer_issue_seconds": cap["t_issued"] - start["t"],
               "dropped": len(res.dropped), "incomplete": len(res.incomplete),
               "rejected": len(res.rejected), "indexed": len(index),
               "shards": len({e["shard"] for e in index.values()}), "spot_check": checked}
        ok = (res.samples == len(base["requests"]) and not res.dropped and not res.incomplete
              and not res.rejected and all(c["exact"] for c in checked))
        out["ok"] = ok
        if not ok:
            print(f"  WARNING: hscapture run incomplete or inexact: {out}", flush=True)
        return out
    finally:
        if proc.poll() is None:
            stop_child(proc)
        shutil.rmtree(out_dir, ignore_errors=True)


def run_deliver(base: dict, run: int, zero_copy: bool = False) -> dict:
    """hscapture into a consuming process, no storage: a training script reading samples live.

    Every byte of every sample is read by the consumer, as ``torch.load`` reads every byte in
    the old way: copied out of the ring (``Sample.detach()``), or with ``zero_copy`` read in
    place (a checksum over the ring views) and never copied.
    """
    from hscapture import Subscriber
    from hscapture.endpoint import default_endpoint

    producer_id = f"bench-deliver-{os.getpid()}-{run}"
    spec = dict(base, endpoint=default_endpoint(producer_id), producer_id=producer_id)
    proc = spawn("_produce", spec)
    try:
        read_event(proc, "ready", timeout=300)
        n = nbytes = 0
        with Subscriber(spec["endpoint"]) as sub:
            sub.wait_ready(timeout=120)
            for sample in sub.samples(limit=len(base["requests"]), timeout=120):
                if zero_copy:
                    for t in sample.tensors.values():   # reads every byte, 8 at a time
                        flat = t.reshape(-1).view(torch.uint8)
                        (flat.view(torch.int64) if flat.numel() % 8 == 0 else flat).sum()
                else:
                    sample.detach()
                n += 1
                nbytes += sample.nbytes
            t_end = time.monotonic()
            bad = len(sub.dropped) + len(sub.incomplete) + len(sub.rejected)
        start = read_event(proc, "start")
        seconds = t_end - start["t"]
        return {"method": "deliver_view" if zero_copy else "deliver", "seconds": seconds, "bytes": nbytes, "samples": n,
                "GBps": nbytes / seconds / 1e9, "samples_per_s": n / seconds,
                "ok": n == len(base["requests"]) and not bad}
    finally:
        stop_child(proc)


def _layer_order(name: str) -> tuple:
    return (1, 0) if name == "final_norm" else (0, int(name.split("_")[-1]))


def run_raw(base: dict, target: str, pool, ids) -> dict:
    path = os.path.join(target, f"hsc-e2e-raw-{os.getpid()}.bin")
    flush = base["flush_bytes"]
    total = hidden_bytes = since = 0
    t0 = time.monotonic()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for i, tokens in enumerate(base["requests"]):
            s = request_slice(i, tokens)
            views = [memoryview(t[s].view(torch.uint8).numpy()).cast("B") for t in pool]
            views.append(memoryview(ids[s].numpy()).cast("B"))
            want = sum(len(v) for v in views)
            k = os.writev(fd, views)
            if k != want:
                rest = memoryview(b"".join(views))[k:]
                while len(rest):
                    rest = rest[os.write(fd, rest):]
            total += want
            since += want
            hidden_bytes += want - len(views[-1])
            if since >= flush:
                os.fdatasync(fd)
                since = 0
        os.fsync(fd)
    finally:
        os.close(fd)
    seconds = time.monotonic() - t0
    os.unlink(path)
    n = len(base["requests"])
    return {"method": "raw", "seconds": seconds, "bytes": hidden_bytes, "file_bytes": total,
            "samples": n, "GBps": hidden_bytes / seconds / 1e9, "samples_per_s": n / seconds,
            "ok": True}


def run_old(base: dict, target: str) -> dict:
    root = tempfile.mkdtemp(prefix="hsc-e2e-old-", dir=target)
    spec = dict(base, root=root)
    reader = spawn("_oldread", spec)
    writer = spawn("_oldproduce", spec)
    try:
        read_event(reader, "ready", timeout=120)
        read_event(writer, "ready", timeout=300)
        writer.stdin.write("go\n")
        writer.stdin.flush()
        start = read_event(writer, "start")
        done = read_event(reader, "done", timeout=3600)
        written = read_event(writer, "written")
        seconds = done["t"] - start["t"]
        n = len(base["requests"])
        return {"method": "old", "dir": root, "seconds": seconds, "bytes": done["bytes"],
                "samples": done["samples"], "GBps": done["bytes"] / seconds / 1e9,
                "samples_per_s": done["samples"] / seconds, "polls": done["polls"],
                "writer_seconds": written["t"] - start["t"], "ok": done["samples"] == n}
    finally:
        for p in (writer, reader):
            stop_child(p)
        shutil.rmtree(root, ignore_errors=True)


# -- report ---------------------------------------------------------------------------------

def plot(results: dict, path: str) -> None:
    plt = get_pyplot()
    if plt is None:
        return
    med = results["median_GBps"]
    labels = list(med)
    vals = [med[k] for k in labels]
    colors = ["tab:green" if k.startswith("hscapture") else "tab:gray" if k.startswith("raw")
              else "tab:red" for k in labels]
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(labels) + 1.8))
    bars = ax.barh(labels, vals, color=colors)
    for b, v in zip(bars, vals):
        ax.text(b.get_width(), b.get_y() + b.get_height() / 2, f" {v:.2f}", va="center")
    ax.invert_yaxis()
    ax.set_xlabel("GB/s of hidden states (higher is better)")
    r = results["ratios"]
    sub = "; ".join(f"{k} {v:.2f}" for k, v in r.items() if v is not None)
    c = results["config"]
    ax.set_title(f"end to end, {c['device']} sources, {c['gb']:g} GB, H={c['hidden']}, "
                 f"{c['layers']} layers, T {c['min_tokens']}..{c['max_tokens']}\n{sub}",
                 fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"wrote {path}", flush=True)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="where the producer's source tensors live")
    ap.add_argument("--gb", type=float, default=2.0, help="GB of hidden states per run")
    ap.add_argument("--old-gb", type=float, default=1.0,
                    help="GB for the (slow) old way; its rate does not depend on the total")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=4, help="tensors per record (EAGLE-3: 4)")
    ap.add_argument("--min-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--ring-mb", type=int, default=1024, help="producer ring capacity (MiB)")
    ap.add_argument("--flush-mb", type=int, default=256,
                    help="drain flush_bytes, and the raw writer's fdatasync interval (MiB)")
    ap.add_argument("--shm-dir", default="/dev/shm", help="tmpfs target")
    ap.add_argument("--disk-dir", default=str(ROOT / "build" / "bench-e2e"),
                    help="local-disk target (its filesystem type is reported)")
    ap.add_argument("--methods", default="raw,hscapture,deliver,deliver_view,old",
                    help="comma list of raw,hscapture,deliver,deliver_view,old")
    ap.add_argument("--write-threads", type=int, default=1,
                    help="ShardWriter threads for large samples in the hscapture drain")
    ap.add_argument("--targets", default="shm,disk", help="comma list of shm,disk")
    ap.add_argument("--repeat", type=int, default=1, help="interleaved repetitions (median)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench-results/bench_e2e.json")
    ap.add_argument("--plot", default="bench-results/bench_e2e.png")
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available here (use --device cpu)")
    methods = [m for m in a.methods.split(",") if m]
    targets = {"shm": a.shm_dir, "disk": a.disk_dir}
    targets = {k: targets[k] for k in a.targets.split(",") if k}
    for d in targets.values():
        os.makedirs(d, exist_ok=True)
    fs = {k: fs_info(d) for k, d in targets.items()}
    for k, info in fs.items():
        kind = "memory (tmpfs)" if info["memory_backed"] else "storage"
        print(f"{k}: {info['path']} is {info['fstype']} on {info['mount']} ({kind}), "
              f"{info['free_bytes'] / 1e9:.1f} GB free", flush=True)
        if k == "disk" and info["memory_backed"]:
            print(f"  WARNING: --disk-dir {info['path']} is memory-backed; pass a real disk dir",
                  flush=True)
    requests = make_requests(a.gb, a.hidden, a.layers, a.min_tokens, a.max_tokens, a.seed)
    per_tok = a.hidden * 2 * a.layers
    total = sum(requests) * per_tok
    old_requests = make_requests(min(a.old_gb, a.gb), a.hidden, a.layers, a.min_tokens,
                                 a.max_tokens, a.seed)
    base = {"device": a.device, "hidden": a.hidden, "layers": a.layers,
            "num_model_layers": 32, "max_tokens": a.max_tokens, "seed": a.seed,
            "requests": requests, "ring_bytes": a.ring_mb << 20, "flush_bytes": a.flush_mb << 20,
            "write_threads": a.write_threads}
    shm_need = (a.ring_mb << 20) + (total if "shm" in targets else 0) + (256 << 20)
    shm_free = fs_info(a.shm_dir)["free_bytes"] if os.path.isdir(a.shm_dir) else 0
    if shm_free < shm_need:
        print(f"WARNING: {a.shm_dir} has {shm_free / 1e9:.1f} GB free, this run needs about "
              f"{shm_need / 1e9:.1f} GB (ring + shards); lower --gb / --ring-mb", flush=True)
    print(f"workload: {len(requests)} requests, {total / 1e9:.2f} GB, {per_tok} bytes/token "
          f"(old way: {len(old_requests)} requests), producer sources on {a.device}", flush=True)
    pool, ids = make_pool(a.hidden, a.layers, a.max_tokens, a.seed, "cpu")
    runs: dict[str, list[dict]] = {}
    for r in range(a.repeat):
        for tname, tdir in targets.items():
            if "raw" in methods:
                res = run_raw(base, tdir, pool, ids)
                runs.setdefault(f"raw_{tname}", []).append(res)
                print(f"[{r}] raw write+fsync -> {tname}: {res['GBps']:.3f} GB/s "
                      f"({res['samples_per_s']:.1f} samples/s)", flush=True)
            if "hscapture" in methods:
                res = run_hscapture(base, tdir, r)
                runs.setdefault(f"hscapture_{tname}", []).append(res)
                print(f"[{r}] hscapture -> {tname}: {res['GBps']:.3f} GB/s "
                      f"({res['samples_per_s']:.1f} samples/s; drain-only {res['drain_GBps']:.3f}"
                      f" GB/s; drops {res['producer_drops']}; ok {res['ok']})", flush=True)
        if "deliver" in methods:
            res = run_deliver(base, r)
            runs.setdefault("deliver_mem", []).append(res)
            print(f"[{r}] hscapture -> subscriber process (no storage): {res['GBps']:.3f} GB/s "
                  f"({res['samples_per_s']:.1f} samples/s; ok {res['ok']})", flush=True)
        if "deliver_view" in methods:
            res = run_deliver(base, r, zero_copy=True)
            runs.setdefault("deliver_view_mem", []).append(res)
            print(f"[{r}] hscapture -> subscriber process, read in place (no copy, no storage): "
                  f"{res['GBps']:.3f} GB/s ({res['samples_per_s']:.1f} samples/s; ok "
                  f"{res['ok']})", flush=True)
        if "old" in methods:
            res = run_old(dict(base, requests=old_requests), a.shm_dir)
            runs.setdefault("old_shm", []).append(res)
            print(f"[{r}] old torch.save + polling -> shm: {res['GBps']:.3f} GB/s "
                  f"({res['samples_per_s']:.1f} samples/s)", flush=True)
    med = {k: statistics.median(x["GBps"] for x in v) for k, v in runs.items()}
    med_sps = {k: statistics.median(x["samples_per_s"] for x in v) for k, v in runs.items()}

    def ratio(a_: str, b_: str) -> float | None:
        return med[a_] / med[b_] if a_ in med and b_ in med and med[b_] > 0 else None

    ratios = {"hscapture/raw (shm)": ratio("hscapture_shm", "raw_shm"),
              "hscapture/raw (disk)": ratio("hscapture_disk", "raw_disk"),
              "hscapture/old (shm)": ratio("hscapture_shm", "old_shm"),
              "hscapture(disk)/old(shm)": ratio("hscapture_disk", "old_shm"),
              "deliver(mem)/old(shm)": ratio("deliver_mem", "old_shm"),
              "deliver_view(mem)/old(shm)": ratio("deliver_view_mem", "old_shm")}
    goals = {}
    for t in targets:
        v = ratios.get(f"hscapture/raw ({t})")
        if v is not None:
            goals[f"hscapture >= {GOAL_VS_RAW:.0%} of raw write ({t})"] = v >= GOAL_VS_RAW
    if ratios["hscapture/old (shm)"] is not None:
        goals[f"hscapture >= {GOAL_VS_OLD:g}x old way (shm)"] = \
            ratios["hscapture/old (shm)"] >= GOAL_VS_OLD
    results = {"benchmark": "e2e", "config": {k: v for k, v in vars(a).items()},
               "workload": {"requests": len(requests), "bytes": total, "bytes_per_token": per_tok,
                            "old_requests": len(old_requests),
                            "old_bytes": sum(old_requests) * per_tok},
               "filesystems": fs, "env": env_info(), "median_GBps": med,
               "median_samples_per_s": med_sps, "ratios": ratios, "goals": goals, "runs": runs,
               "ok": all(x.get("ok", True) for v in runs.values() for x in v)}
    print("summary (median GB/s): " + ", ".join(f"{k} {v:.3f}" for k, v in med.items()))
    for k, v in ratios.items():
        if v is not None:
            print(f"  {k}: {v:.2f}")
    for k, v in goals.items():
        print(f"  goal {k}: {'MET' if v else 'NOT MET'}")
    save_json(a.out, results)
    if a.plot:
        plot(results, a.plot)
    return results


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1].startswith("_"):
        role, spec_ = sys.argv[1], json.loads(sys.argv[2])
        try:
            {"_produce": child_produce, "_oldproduce": child_old_produce,
             "_oldread": child_old_read}[role](spec_)
        except Exception as exc:
            emit(event="error", message=f"{role}: {type(exc).__name__}: {exc}")
            raise
    else:
        main()
