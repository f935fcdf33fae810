"""End to end: producer process -> ring -> drain process -> shards, vs a raw write of the same
byte counts from the same kind of memory in the same kind of process; plus live delivery and
the old per-request ``torch.save`` way.

    python benchmarks/bench_e2e.py [--device cpu|cuda] [--gb 2] [--disk-dir DIR] [--reps 5]
                                   [--out bench-results/bench_e2e.json]

Workload (EAGLE-3 shape, e.g. Qwen3-8B-like): per request ``--layers`` 4 tensors (3 aux layers +
final norm) x T tokens x ``--hidden`` 4096, bf16 (32 KiB per token), T uniform in
``--min-tokens``..``--max-tokens`` (default 350..750: prompts ~550 tokens), about ``--gb`` GB per
run, ``--rows-per-forward`` requests captured per forward pass through the one capture entry
point (``_harness.capture_forward``). Every method is a set of freshly spawned child processes;
every repetition runs each method once, the order rotating by one per repetition, after one
discarded warm-up repetition (``_stats.run_alternating``); ratios are paired per repetition.

Methods (what each clock covers is also in the JSON's ``timed_region``):

* ``hscapture_<target>``: a producer process (``Producer`` with ``full_policy="wait"``:
  nothing is dropped, the producer runs at the storage's pace) captures every request from
  ``--device`` tensors; a drain process runs :func:`hscapture.drain.drain` (Subscriber ->
  ShardWriter, fsync'd, ring space released after each durable flush). Clock: producer's
  first capture -> ``drain()`` returned (every byte durable, shards closed). Bytes: hidden-state
  bytes of samples the drain wrote (committed and durable only); producer drops printed beside.
  First and last request are then read back from the shards and compared bit for bit.
  Where the clock went, from the drain's own timestamps (``phases`` in the JSON, printed per
  run and as medians): ``head`` (first capture -> the first sample written), ``body`` (first
  -> last sample written), ``tail`` (last sample written -> ``drain()`` returned: the last
  fsync, the shard's close, the subscriber's close), and ``ends``, the fixed part a run pays
  once (the head beyond one sample's mean time, plus the tail): a short run's ratio to raw
  is lowered by it, a continuous drain's is not.
* ``raw_<target>``: one writer process writes the same per-request byte counts (hidden states +
  token ids, one ``writev`` per request, ``fdatasync`` every ``--flush-mb``, ``fsync`` at the
  end) from a MAP_SHARED ``/dev/shm`` mapping of the ring's capacity (fallocated and
  MAP_POPULATE'd like the ring segment the drain writes from), walking it at the ring's record
  positions and wrapping. The mapping holds random bytes (contents do not change write speed).
  Clock: first ``open`` -> last ``fsync``. The ceiling for that storage from ring-like memory;
  it does not include the device->host copy the hscapture producer also does.
* ``deliver``: the same producer, consumed live by a subscriber process that copies every
  sample out of the ring (``Sample.detach()``) and releases it, no storage. Clock: first capture
  -> last sample copied out.
* ``old``: what hscapture replaces: a producer process ``torch.save``s each request (tensors
  moved to CPU) into ``<shm>/…/req_N/hidden.pt`` (tmp + rename); a reader process polls the
  folder (1 ms sleep when idle), ``torch.load``s each file and deletes it. Clock: first save ->
  last file loaded. Runs ``--old-gb``. Like-for-like pairs: ``hscapture_shm / old`` (files vs
  files, both into tmpfs) and ``deliver / old`` (live, bytes copied out, vs the old way's files).

Goals: hscapture >= 0.9 of raw write into each target over the whole spread.
"""

from __future__ import annotations

import argparse
import mmap
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.append(str(ROOT))   # an installed hscapture wins over the uncompiled checkout
sys.path.insert(0, str(HERE))

import _stats  # noqa: E402
from _harness import (Row, capture_forward, child_main, emit, read_event, spawn,  # noqa: E402
                      stop_child, unique_producer)

GOAL_VS_RAW = 0.90
SLACK = 509     # requests start at varying (odd) row offsets into the pool
MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
RECORD_HEADER = 64


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


def make_pool(hidden: int, layers: int, max_tokens: int, seed: int, device: str):
    """Source tensors [max_tokens + SLACK, hidden] bf16 per layer, and int32 token ids (CPU)."""
    g = torch.Generator().manual_seed(seed)
    pool = [torch.randn(max_tokens + SLACK, hidden, generator=g).to(torch.bfloat16).to(device)
            for _ in range(layers)]
    ids = torch.randint(0, 128_000, (max_tokens + SLACK,), generator=g, dtype=torch.int32)
    return pool, ids


def request_slice(i: int, tokens: int) -> slice:
    o = (i * 97) % SLACK
    return slice(o, o + tokens)


def rid_of(i: int) -> str:
    return f"req-{i:07d}"


def _layer_ids(spec: dict) -> tuple[list[int], list[str]]:
    return (list(range(spec["layers"] - 1)) + [spec["num_model_layers"] - 1],
            ["residual"] * (spec["layers"] - 1) + ["final_norm"])


# -- child processes ----------------------------------------------------------------------------

def child_produce(spec: dict) -> None:
    """hscapture producer: capture every request, ``rows_per_forward`` per forward pass."""
    from hscapture import Producer

    dev = spec["device"]
    if dev == "cuda":
        torch.cuda.init()
    pool, ids = make_pool(spec["hidden"], spec["layers"], spec["max_tokens"], spec["seed"], dev)
    layer_ids, kinds = _layer_ids(spec)
    p = Producer(spec["endpoint"], producer_id=spec["producer_id"], capacity=spec["ring_bytes"],
                 full_policy="wait", wait_timeout_s=60.0, model="bench-e2e")
    emit(event="ready", pinned=p.stats().get("pinned"), segment=p.segment)
    if not p.wait_for_consumers(1, timeout_s=120):
        emit(event="error", message="no consumer attached within 120 s")
        return
    if dev == "cuda":
        torch.cuda.synchronize()
    before = p.stats()
    reqs = spec["requests"]
    k = spec["rows_per_forward"]
    ok: list[bool] = []
    t0 = time.monotonic()
    emit(event="start", t=t0)
    for f in range(0, len(reqs), k):
        rows = []
        for i in range(f, min(f + k, len(reqs))):
            s = request_slice(i, reqs[i])
            rows.append(Row(rid_of(i), [t[s] for t in pool], ids[s]))
        ok += capture_forward(p, rows, layers=layer_ids, layer_kinds=kinds)
    t_issued = time.monotonic()
    p.flush(timeout_s=600)
    after = p.stats()
    emit(event="captured", t_issued=t_issued, t_flushed=time.monotonic(),
         refused=len(ok) - sum(ok),
         dropped=int(after.get("dropped", 0)) - int(before.get("dropped", 0)),
         stats={k_: v for k_, v in after.items() if isinstance(v, (int, bool))})
    sys.stdin.read()        # stay alive (segment, notices) until the parent is done
    p.close()


def child_drain(spec: dict) -> None:
    """The real drain (Subscriber -> ShardWriter), in its own process."""
    from hscapture.drain import drain

    emit(event="ready")
    added: list[float] = []   # when the writer had taken each sample (written, not yet fsync'd)

    def on_sample(_sample) -> None:
        added.append(time.monotonic())

    res = drain(spec["endpoint"], spec["out_dir"], max_samples=len(spec["requests"]),
                idle_timeout_s=120, connect_timeout_s=120, flush_bytes=spec["flush_bytes"],
                progress=False, metadata={"model": "bench-e2e"},
                write_threads=spec["write_threads"], on_sample=on_sample)
    t_end = time.monotonic()
    emit(event="done", t=t_end, samples=res.samples, bytes=res.bytes, drain_seconds=res.seconds,
         dropped=len(res.dropped), incomplete=len(res.incomplete), rejected=len(res.rejected),
         t_first_added=added[0] if added else None, t_last_added=added[-1] if added else None)
    sys.stdin.read()


def child_deliver(spec: dict) -> None:
    """A live subscriber: copy every sample out of the ring, release it; no storage."""
    from hscapture import Subscriber

    n = nbytes = 0
    with Subscriber(spec["endpoint"]) as sub:
        emit(event="ready")
        sub.wait_ready(timeout=120)
        for sample in sub.samples(limit=len(spec["requests"]), timeout=120):
            sample.detach()
            n += 1
            nbytes += sample.nbytes
        t_end = time.monotonic()
        bad = {k: len(getattr(sub, k)) for k in ("dropped", "incomplete", "rejected")}
    emit(event="done", t=t_end, samples=n, bytes=nbytes, **bad)
    sys.stdin.read()


def child_raw(spec: dict) -> None:
    """Raw write of the requests' byte counts from a ring-like shared-memory mapping."""
    cap = spec["ring_bytes"]
    shm = f"/dev/shm/hsc-e2e-raw-src-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    fd = os.open(shm, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.posix_fallocate(fd, 0, cap)
    m = mmap.mmap(fd, cap, MAP_FLAGS)
    os.close(fd)
    os.unlink(shm)
    block = os.urandom(1 << 20)
    for o in range(0, cap, len(block)):      # fill (and touch) every page, outside the clock
        m[o:o + len(block)] = block[:cap - o]
    view = memoryview(m)
    per_tok = spec["hidden"] * 2
    L = spec["layers"]
    path = os.path.join(spec["target"], f"hsc-e2e-raw-{os.getpid()}.bin")
    flush = spec["flush_bytes"]
    emit(event="ready")
    sys.stdin.readline()                  # go
    hidden_bytes = total = since = pos = 0
    t0 = time.monotonic()
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for tokens in spec["requests"]:
        lengths = [tokens * per_tok] * L + [tokens * 4]
        rec = RECORD_HEADER + sum((x + 63) // 64 * 64 for x in lengths) + 4096  # + meta
        rec = (rec + 63) // 64 * 64
        if pos + rec > cap:
            pos = 0                        # the ring wraps the same way
        views, o = [], pos + RECORD_HEADER + 4096
        for x in lengths:
            views.append(view[o:o + x])
            o += (x + 63) // 64 * 64
        want = sum(lengths)
        k = os.writev(out, views)
        while k < want:                    # partial write: finish it
            rest = b"".join(bytes(v) for v in views)[k:]
            k += os.write(out, rest)
        pos += rec
        total += want
        since += want
        hidden_bytes += want - tokens * 4
        if since >= flush:
            os.fdatasync(out)
            since = 0
    os.fsync(out)
    os.close(out)
    t1 = time.monotonic()
    os.unlink(path)
    emit(event="done", t0=t0, t=t1, bytes=hidden_bytes, file_bytes=total,
         samples=len(spec["requests"]))
    sys.stdin.read()       # the mapping goes with the process


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
    got, nbytes, polls = 0, 0, 0
    while got < n:
        polls += 1
        progressed = False
        names = [x for x in os.listdir(root) if x.startswith("req_")]
        for name in sorted(names, key=lambda x: int(x[4:])):
            f = os.path.join(root, name, "hidden.pt")
            if not os.path.exists(f):
                continue
            obj = torch.load(f)            # reads every byte of the file into memory
            nbytes += sum(t.numel() * t.element_size() for k, t in obj.items()
                          if k != "token_ids")
            shutil.rmtree(os.path.join(root, name))
            got += 1
            progressed = True
        if not progressed:
            time.sleep(0.001)  # the old way's poll interval (part of what is measured)
    emit(event="done", t=time.monotonic(), samples=got, bytes=nbytes, polls=polls)
    sys.stdin.read()


ROLES = {"_produce": child_produce, "_drain": child_drain, "_deliver": child_deliver,
         "_raw": child_raw, "_oldproduce": child_old_produce, "_oldread": child_old_read}


# -- the methods (parent side) --------------------------------------------------------------------

def _spawn(role: str, spec: dict):
    return spawn(__file__, role, spec)


def _layer_order(name: str) -> tuple:
    return (1, 0) if name == "final_norm" else (0, int(name.split("_")[-1]))


def spot_check(out_dir: str, base: dict, pool, ids) -> list[dict]:
    """First and last request read back from the shards, bit for bit (outside any clock)."""
    from hscapture.shards import load_sample

    checked = []
    for i in sorted({0, len(base["requests"]) - 1}):
        got = load_sample(out_dir, rid_of(i))
        s = request_slice(i, base["requests"][i])
        names = sorted((k for k in got if k != "token_ids"), key=_layer_order)
        exact = len(names) == base["layers"] and all(
            torch.equal(got[n].view(torch.int16), pool[k][s].view(torch.int16))
            for k, n in enumerate(names)) and \
            torch.equal(got["token_ids"].to(torch.int32), ids[s])
        checked.append({"rid": rid_of(i), "exact": bool(exact)})
    return checked


def _phases(t_start: float, done: dict) -> dict | None:
    """Where an hscapture run's clock went, from the drain's own timestamps (CLOCK_MONOTONIC,
    shared by the processes): ``head`` = the producer's first capture -> the drain's writer has
    the first sample; ``body`` = first -> last sample written (not yet fsync'd); ``tail`` =
    last sample written -> ``drain()`` returned (the last flush's fsync and release, the shard
    closed and its header written, the subscriber closed and its ring unmapped); ``ends`` =
    the head less one body sample's mean time, plus the tail: the run's fixed cost, paid once
    per drain, not per sample. Seconds."""
    first, last = done.get("t_first_added"), done.get("t_last_added")
    if first is None or last is None:
        return None
    out = {"head": first - t_start, "body": last - first, "tail": done["t"] - last}
    n = done.get("samples", 0)
    # the head holds one sample's capture and write too: beyond a body sample's mean time
    # it is the pipeline's start (notice, first poll, the first shard's open)
    out["ends"] = out["head"] - (out["body"] / (n - 1) if n > 1 else 0.0) + out["tail"]
    return out


def _phase_summary(runs: dict, targets: list[str]) -> dict:
    """Per target, the medians of the hscapture runs' phases (:func:`_phases`) beside the
    median of the raw runs' whole time, in ms: how much of the gap to raw is the pipeline's
    ends (head, tail) and how much its steady part (body)."""
    import statistics

    out = {}
    for t in targets:
        hs = [r for r in runs.get(f"hscapture_{t}", []) if r.get("phases")]
        if not hs:
            continue
        med = {k: statistics.median(r["phases"][k] for r in hs) * 1e3
               for k in ("head", "body", "tail", "ends")}
        raw = [r["seconds"] for r in runs.get(f"raw_{t}", [])]
        out[t] = {f"{k}_ms": v for k, v in med.items()}
        out[t]["total_ms"] = statistics.median(r["seconds"] for r in hs) * 1e3
        out[t]["raw_ms"] = statistics.median(raw) * 1e3 if raw else None
    return out


def run_hscapture(base: dict, target: str, pool, ids) -> dict:
    endpoint, producer_id = unique_producer("e2e")
    out_dir = tempfile.mkdtemp(prefix="hsc-e2e-shards-", dir=target)
    spec = dict(base, endpoint=endpoint, producer_id=producer_id, out_dir=out_dir)
    prod = _spawn("_produce", spec)
    drn = None
    try:
        ready = read_event(prod, "ready", timeout=300)
        drn = _spawn("_drain", spec)
        read_event(drn, "ready", timeout=300)
        start = read_event(prod, "start", timeout=300)
        done = read_event(drn, "done", timeout=3600)
        cap = read_event(prod, "captured", timeout=600)
        stop_child(drn)
        stop_child(prod)
        checked = spot_check(out_dir, base, pool, ids)
        seconds = done["t"] - start["t"]
        n = len(base["requests"])
        out = {"seconds": seconds, "bytes": done["bytes"], "samples": done["samples"],
               "GBps": done["bytes"] / seconds / 1e9, "samples_per_s": done["samples"] / seconds,
               "producer_refused": cap["refused"], "producer_dropped": cap["dropped"],
               "producer_pinned": ready.get("pinned"),
               "producer_issue_seconds": cap["t_issued"] - start["t"],
               "drain_dropped": done["dropped"], "incomplete": done["incomplete"],
               "rejected": done["rejected"], "spot_check": checked,
               "phases": _phases(start["t"], done)}
        out["ok"] = (done["samples"] == n and not done["dropped"] and not done["incomplete"]
                     and not done["rejected"] and all(c["exact"] for c in checked))
        return out
    finally:
        for p in (drn, prod):
            if p is not None and p.poll() is None:
                stop_child(p)
        shutil.rmtree(out_dir, ignore_errors=True)


def run_deliver(base: dict) -> dict:
    endpoint, producer_id = unique_producer("deliver")
    spec = dict(base, endpoint=endpoint, producer_id=producer_id)
    prod = _spawn("_produce", spec)
    sub = None
    try:
        read_event(prod, "ready", timeout=300)
        sub = _spawn("_deliver", spec)
        read_event(sub, "ready", timeout=300)
        start = read_event(prod, "start", timeout=300)
        done = read_event(sub, "done", timeout=3600)
        cap = read_event(prod, "captured", timeout=600)
        seconds = done["t"] - start["t"]
        bad = done["dropped"] + done["incomplete"] + done["rejected"]
        return {"seconds": seconds, "bytes": done["bytes"], "samples": done["samples"],
                "GBps": done["bytes"] / seconds / 1e9, "samples_per_s": done["samples"] / seconds,
                "producer_refused": cap["refused"], "producer_dropped": cap["dropped"],
                "subscriber_lost": bad, "ok": done["samples"] == len(base["requests"]) and not bad}
    finally:
        for p in (sub, prod):
            if p is not None:
                stop_child(p)


def run_raw(base: dict, target: str) -> dict:
    proc = _spawn("_raw", dict(base, target=target))
    try:
        read_event(proc, "ready", timeout=300)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        done = read_event(proc, "done", timeout=3600)
        seconds = done["t"] - done["t0"]
        return {"seconds": seconds, "bytes": done["bytes"], "file_bytes": done["file_bytes"],
                "samples": done["samples"], "GBps": done["bytes"] / seconds / 1e9,
                "samples_per_s": done["samples"] / seconds, "producer_dropped": 0, "ok": True}
    finally:
        stop_child(proc)


def run_old(base: dict, target: str) -> dict:
    root = tempfile.mkdtemp(prefix="hsc-e2e-old-", dir=target)
    spec = dict(base, root=root)
    reader = _spawn("_oldread", spec)
    writer = _spawn("_oldproduce", spec)
    try:
        read_event(reader, "ready", timeout=120)
        read_event(writer, "ready", timeout=300)
        writer.stdin.write("go\n")
        writer.stdin.flush()
        start = read_event(writer, "start")
        done = read_event(reader, "done", timeout=3600)
        written = read_event(writer, "written")
        seconds = done["t"] - start["t"]
        return {"seconds": seconds, "bytes": done["bytes"], "samples": done["samples"],
                "GBps": done["bytes"] / seconds / 1e9, "samples_per_s": done["samples"] / seconds,
                "polls": done["polls"], "writer_seconds": written["t"] - start["t"],
                "producer_dropped": 0, "ok": done["samples"] == len(base["requests"])}
    finally:
        for p in (writer, reader):
            stop_child(p)
        shutil.rmtree(root, ignore_errors=True)


TIMED = {
    "hscapture": _stats.timed_region(
        ["producer: capture_forward of every request (reserve, meta, copy into the ring, "
         "commit, notice), waiting for ring space (full_policy=wait)",
         "drain process: Subscriber -> ShardWriter, fdatasync every --flush-mb, close() "
         "(headers, renames, index, fsync)",
         "clock: producer's first capture -> drain() returned in the drain process"],
        ["process start, torch import, CUDA init, pool creation", "ring creation",
         "subscriber connect/attach (the producer waits for it before its clock starts)",
         "read-back bit-for-bit check of the first and last request", "process exit"],
        "CLOCK_MONOTONIC (time.monotonic, shared by processes)"),
    "raw": _stats.timed_region(
        ["writer process: open, one writev per request from a MAP_SHARED /dev/shm mapping of "
         "the ring's capacity at the ring's record positions, fdatasync every --flush-mb, "
         "fsync + close"],
        ["process start", "mapping creation (fallocate + MAP_POPULATE) and random fill",
         "the device->host copy (the hscapture producer does it inside its clock)",
         "unlink of the file"],
        "CLOCK_MONOTONIC (time.monotonic)"),
    "deliver": _stats.timed_region(
        ["producer as for hscapture", "subscriber process: Sample.detach() of every sample "
         "(copies every byte out of the ring) + release",
         "clock: producer's first capture -> last sample copied out"],
        ["process start, pool creation, ring creation, subscriber attach", "process exit"],
        "CLOCK_MONOTONIC (time.monotonic, shared by processes)"),
    "old": _stats.timed_region(
        ["writer process: per request .to('cpu'), torch.save to req_N/hidden.pt.tmp, rename",
         "reader process: poll the folder (1 ms sleep when idle), torch.load, rmtree",
         "clock: writer's first save -> reader's last file loaded"],
        ["process start, pool creation"], "CLOCK_MONOTONIC (time.monotonic, shared by processes)"),
}


# -- report ---------------------------------------------------------------------------------------

def plot(rec: dict, path: str) -> None:
    plt = _stats.get_pyplot()
    if plt is None:
        return
    res = rec["results"]
    names = list(res["GBps"])
    med, err = _stats.errorbar_args([res["GBps"][n] for n in names])
    fig, ax = plt.subplots(figsize=(8, 0.55 * len(names) + 2))
    colors = ["tab:green" if n.startswith(("hscapture", "deliver")) else "tab:gray"
              if n.startswith("raw") else "tab:red" for n in names]
    ax.barh(names, med, xerr=err, color=colors, capsize=4)
    for i, n in enumerate(names):
        sps = res["samples_per_s"][n]["median"]
        ax.text(med[i], i, f" {med[i]:.2f} GB/s, {sps:,.0f} samples/s", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("GB/s of hidden states (median, min..max)")
    ax.set_title("; ".join(f"{k} {v['median']:.2f}" for k, v in res["ratios"].items()),
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}", flush=True)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="where the producer's source tensors live")
    ap.add_argument("--gb", type=float, default=2.0, help="GB of hidden states per run")
    ap.add_argument("--old-gb", type=float, default=0.5,
                    help="GB for the (slow) old way; its rate does not depend on the total")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=4, help="tensors per request (EAGLE-3: 4)")
    ap.add_argument("--min-tokens", type=int, default=350)
    ap.add_argument("--max-tokens", type=int, default=750)
    ap.add_argument("--rows-per-forward", type=int, default=1,
                    help="requests captured per forward pass (one capture_forward call)")
    ap.add_argument("--ring-mb", type=int, default=1024, help="producer ring capacity (MiB)")
    ap.add_argument("--flush-mb", type=int, default=256,
                    help="drain flush_bytes, and the raw writer's fdatasync interval (MiB)")
    ap.add_argument("--write-threads", type=int, default=1, help="ShardWriter threads")
    ap.add_argument("--shm-dir", default="/dev/shm", help="tmpfs target")
    ap.add_argument("--disk-dir", default=str(ROOT / "build" / "bench-e2e"),
                    help="local-disk target (its filesystem type is reported)")
    ap.add_argument("--targets", default="shm,disk", help="comma list of shm,disk")
    ap.add_argument("--methods", default="hscapture,raw,deliver,old",
                    help="comma list of hscapture,raw,deliver,old")
    ap.add_argument("--reps", "--repeat", dest="reps", type=int, default=5,
                    help="counted repetitions (after one warm-up)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench-results/bench_e2e.json")
    ap.add_argument("--plot", default=None, help="PNG path (default: --out with .png)")
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available here (use --device cpu)")
    methods = [m for m in a.methods.split(",") if m]
    targets = {"shm": a.shm_dir, "disk": a.disk_dir}
    targets = {k: targets[k] for k in a.targets.split(",") if k}
    for d in targets.values():
        os.makedirs(d, exist_ok=True)
    fs = {k: _stats.fs_info(d) for k, d in targets.items()}
    notes = []
    for k, info in fs.items():
        print(f"{k}: {info['path']} is {info['fstype']} on {info['mount']}, "
              f"{info['free_bytes'] / 1e9:.1f} GB free", flush=True)
        if k == "disk" and info["memory_backed"]:
            notes.append(f"--disk-dir {info['path']} is memory-backed ({info['fstype']})")
            print(f"  WARNING: {notes[-1]}; pass a real disk dir", flush=True)
    requests = make_requests(a.gb, a.hidden, a.layers, a.min_tokens, a.max_tokens, a.seed)
    per_tok = a.hidden * 2 * a.layers
    total = sum(requests) * per_tok
    old_requests = make_requests(min(a.old_gb, a.gb), a.hidden, a.layers, a.min_tokens,
                                 a.max_tokens, a.seed)
    base = {"device": a.device, "hidden": a.hidden, "layers": a.layers,
            "num_model_layers": 32, "max_tokens": a.max_tokens, "seed": a.seed,
            "requests": requests, "ring_bytes": a.ring_mb << 20, "flush_bytes": a.flush_mb << 20,
            "write_threads": a.write_threads, "rows_per_forward": a.rows_per_forward}
    print(f"workload: {len(requests)} requests (mean {total / len(requests) / per_tok:.0f} "
          f"tokens), {total / 1e9:.2f} GB, {per_tok} bytes/token; old way {len(old_requests)} "
          f"requests; sources on {a.device}; {a.reps} reps + {a.warmup} warm-up", flush=True)
    pool, ids = make_pool(a.hidden, a.layers, a.max_tokens, a.seed, "cpu")

    fns = {}
    for t, d in targets.items():
        if "hscapture" in methods:
            fns[f"hscapture_{t}"] = (lambda d: lambda i: run_hscapture(base, d, pool, ids))(d)
        if "raw" in methods:
            fns[f"raw_{t}"] = (lambda d: lambda i: run_raw(base, d))(d)
    if "deliver" in methods:
        fns["deliver"] = lambda i: run_deliver(base)
    if "old" in methods:
        fns["old"] = lambda i: run_old(dict(base, requests=old_requests), a.shm_dir)

    def logged(name, fn):
        def run(i):
            r = fn(i)
            tag = "warm-up" if i < 0 else f"rep {i}"
            ph = r.get("phases")
            where = (f"  head {ph['head'] * 1e3:.0f} / body {ph['body'] * 1e3:.0f} / tail "
                     f"{ph['tail'] * 1e3:.0f} ms" if ph else "")
            print(f"[{tag}] {name:<15} {r['GBps']:7.3f} GB/s {r['samples_per_s']:9.1f} samples/s"
                  f"  drops {r.get('producer_dropped', 0) + r.get('producer_refused', 0)}"
                  f"  ok {r['ok']}{where}", flush=True)
            return r
        return run
    runs, order = _stats.run_alternating({n: logged(n, f) for n, f in fns.items()},
                                         reps=a.reps, warmup=a.warmup)
    gbps = {n: _stats.summarize([r["GBps"] for r in v]) for n, v in runs.items()}
    sps = {n: _stats.summarize([r["samples_per_s"] for r in v]) for n, v in runs.items()}
    drops = {n: sum(r.get("producer_dropped", 0) + r.get("producer_refused", 0) for r in v)
             for n, v in runs.items()}
    pairs = {f"hscapture/raw ({t})": (f"hscapture_{t}", f"raw_{t}") for t in targets}
    pairs["hscapture(shm)/old, files vs files"] = ("hscapture_shm", "old")
    pairs["deliver/old, live copy-out vs old files"] = ("deliver", "old")
    ratios = {k: _stats.ratio_summary([r["GBps"] for r in runs[c]], [r["GBps"] for r in runs[b]])
              for k, (c, b) in pairs.items() if c in runs and b in runs}
    goals = [_stats.goal_record(f"hscapture/raw write ({t})", ratios[f"hscapture/raw ({t})"]
                                ["values"], GOAL_VS_RAW, ">=")
             for t in targets if f"hscapture/raw ({t})" in ratios]
    print("summary (median [min .. max] over reps):", flush=True)
    for n in gbps:
        print(f"  {n:<15} {_stats.fmt_spread(gbps[n])} GB/s, {_stats.fmt_spread(sps[n])} "
              f"samples/s, drops {drops[n]}", flush=True)
    for k, v in ratios.items():
        print(f"  {k}: {_stats.fmt_spread(v)}", flush=True)
    for g in goals:
        print(_stats.format_goal(g), flush=True)
    phases = _phase_summary(runs, targets)
    for t, v in phases.items():
        raw = f"{v['raw_ms']:.0f} ms" if v["raw_ms"] is not None else "not run"
        print(f"  where hscapture_{t}'s clock went (medians): head {v['head_ms']:.0f} ms, body "
              f"{v['body_ms']:.0f} ms, tail {v['tail_ms']:.0f} ms of {v['total_ms']:.0f} ms "
              f"(fixed ends {v['ends_ms']:.0f} ms); raw_{t}: {raw}", flush=True)
    ok = all(r.get("ok", True) for v in runs.values() for r in v)
    if not ok:
        print("WARNING: a run was incomplete or inexact (see runs[*].ok)", flush=True)
    tr = {n: TIMED[n.split("_")[0]] for n in runs}
    rec = _stats.write_record(
        a.out, benchmark="bench_e2e", timed_regions=tr, config=vars(a), goals=goals,
        notes=notes + ["GB/s counts hidden-state bytes of samples the consumer completed "
                       "(committed and, for hscapture_*, durable); drops are the producer's"],
        results={"workload": {"requests": len(requests), "bytes": total,
                              "bytes_per_token": per_tok,
                              "mean_tokens": total / len(requests) / per_tok,
                              "old_requests": len(old_requests)},
                 "filesystems": fs, "GBps": gbps, "samples_per_s": sps, "drops": drops,
                 "ratios": ratios, "phases": phases, "order": order, "ok": ok,
                 "runs": runs})
    plot(rec, a.plot or os.path.splitext(a.out)[0] + ".png")
    return rec


if __name__ == "__main__":
    if not child_main(ROLES):
        main()
