"""Streaming into a training process: GB/s of committed sample bytes delivered, vs raw copies.

Issue 9's goal: ``hscapture.stream`` delivers >= 10 GB/s into a training process on the GPU
machine. Per repetition (``--reps``, default 5, after one warm-up), in freshly spawned
processes, the methods alternating (the order rotating by one each repetition):

- ``stream`` (candidate): a producer process captures ``--samples`` samples of ``--tokens``
  tokens x ``--layers`` layers x ``--hidden`` bf16 (from CUDA when available) through
  ``_harness.capture_forward`` (one forward pass per sample, ``full_policy=wait``); a consumer
  process iterates ``hscapture.stream(endpoint, max_samples=..., device="cuda")``: every
  sample arrives on the GPU, copied straight from the consumer's registered ring mapping
  (CPU: ``device="cpu"``, owned host copies). The run records whether the ring was
  registered (``staged``: samples that went through pinned staging instead).
- ``h2d`` (baseline on CUDA, the link's ceiling): one process, no producer, no hscapture: a
  MAP_SHARED ``/dev/shm`` mapping of the ring's size, MAP_POPULATE'd and registered with
  CUDA exactly as the stream registers its ring (``hscapture.stream.register_ring``), holds
  the same samples; every sample's layers and token ids are copied into fresh device tensors
  with ``non_blocking`` copies on a copy stream, one event per sample, at most ``--prefetch``
  samples in flight, the current stream waiting on each event: the stream's copy pattern
  without anything else.
- ``stream_host`` (only with ``--methods``): the way before ``device=``: ``stream()`` on the
  host, then ``.to("cuda", non_blocking=True)`` of every delivered tensor.
- ``raw`` (baseline, like for like): the same two processes and the same bytes without
  hscapture: the producer copies each sample's tensors (device -> host on CUDA) into a slot
  of a MAP_SHARED ``/dev/shm`` mapping of the ring's capacity (fallocated, MAP_POPULATE'd and
  registered with CUDA as the ring is), then publishes the slot with a counter; the consumer
  spins on the counter and copies the slot to the GPU (pinned, ``non_blocking``; CPU: into a
  fresh tensor, as ``detach`` does), then frees the slot. No validation, no notices, no
  samples: the ceiling of the hand-off.

Timed region (stream, stream_host, raw): from the producer's first capture (wall clock
``time.time_ns``, shared by the processes) to the consumer's last sample on the device
(``torch.cuda.synchronize`` on CUDA); h2d: from its first copy to its synchronize. Outside:
process start, torch/CUDA init, ring / mapping creation and registration, subscriber attach,
source fill. Bytes: committed hidden-state bytes of the samples the consumer received (token
ids excluded, though copied); drops are printed beside. Goal: stream >= 10 GB/s on CUDA,
whole spread, with no drop and every sample delivered.

    python benchmarks/bench_stream.py --out bench-results/bench_stream.json [--device cuda]
"""

from __future__ import annotations

import argparse
import mmap
import os
import sys
import time
import uuid

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _stats  # noqa: E402
from _harness import (Row, capture_forward, child_main, committed_rows, emit,  # noqa: E402
                      read_event, spawn, stop_child, unique_producer)

GOAL_GBPS = 10.0
MB = 1 << 20
MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
HDR = 128      # two counters on their own cache lines: written (producer), read (consumer)


def _pool(spec: dict) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Per layer a [tokens, hidden] bf16 source (on the device), and the token ids."""
    g = torch.Generator().manual_seed(spec["seed"])
    pool = [torch.randn(spec["tokens"], spec["hidden"], generator=g).to(torch.bfloat16)
            .to(spec["device"]) for _ in range(spec["layers"])]
    ids = torch.randint(0, 128_000, (spec["tokens"],), generator=g, dtype=torch.int32)
    return pool, ids


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _wait_go() -> bool:
    line = sys.stdin.readline()
    return line.strip() == "go"


# -- stream (candidate) -------------------------------------------------------------------------

def child_stream_produce(spec: dict) -> None:
    from hscapture import Producer

    pool, ids = _pool(spec)
    layers = list(range(spec["layers"]))
    p = Producer(spec["endpoint"], producer_id=spec["producer_id"], capacity=spec["ring_bytes"],
                 full_policy="wait", wait_timeout_s=60.0)
    emit(event="ready")
    if not p.wait_for_consumers(1, timeout_s=120):
        emit(event="error", message="no consumer attached within 120 s")
        return
    _sync(spec["device"])
    emit(event="attached")
    if not _wait_go():
        return
    before = p.stats()
    t0 = time.time_ns()
    ok: list[bool] = []
    for i in range(spec["samples"]):
        ok += capture_forward(p, [Row(f"s{i}", pool, ids)], layers=layers)
    p.flush(timeout_s=600)
    emit(event="captured", t0=t0, committed=committed_rows(ok, before, p.stats()),
         dropped=len(ok) - sum(ok))
    sys.stdin.read()
    p.close()


def child_stream_consume(spec: dict) -> None:
    import hscapture

    dev = spec["device"]
    on_device = spec["method"] == "stream"            # stream_host: .to() after the fact
    if dev == "cuda":
        torch.cuda.init()
    feed = hscapture.stream(spec["endpoint"], max_samples=spec["samples"], idle_timeout_s=60,
                            prefetch=spec["prefetch"], device=dev if on_device else None)
    feed.subscriber.wait_ready(timeout=120)
    emit(event="ready")
    n = nbytes = 0
    keep: object = None
    for sample in feed:
        if dev == "cuda" and not on_device:
            out = [t.to("cuda", non_blocking=True) for t in sample.tensors.values()]
            out.append(sample.token_ids.to("cuda", non_blocking=True))
            keep = out          # what a training step would hold; the previous one is freed
        else:
            keep = sample       # already on the device (cuda) / the consumer's own (cpu)
        n += 1
        nbytes += sample.nbytes
    _sync(dev)
    t1 = time.time_ns()
    del keep
    rep = feed.report()
    copier = feed._copier
    emit(event="done", t1=t1, samples=n, bytes=nbytes,
         staged=None if copier is None else copier.staged_samples,
         **{k: len(rep[k]) for k in ("dropped", "incomplete", "rejected", "lost", "unresolved")})


# -- h2d (baseline on CUDA: the copy pattern alone) --------------------------------------------

def _h2d_copies(spec: dict, data: torch.Tensor) -> tuple[int, int, int, int]:
    """The timed loop of :func:`child_h2d` (its own frame: no view of the mapping outlives
    it, so the mapping can be closed)."""
    slot, slots = spec["slot_bytes"], spec["slots"]
    tokens, hidden, layers = spec["tokens"], spec["hidden"], spec["layers"]
    layer_bytes = tokens * hidden * 2
    copy_stream = torch.cuda.Stream()
    current = torch.cuda.current_stream()
    views = [[data[k * slot + j * layer_bytes: k * slot + (j + 1) * layer_bytes]
              .view(torch.bfloat16).view(tokens, hidden) for j in range(layers)] +
             [data[k * slot + layers * layer_bytes: k * slot + layers * layer_bytes + tokens * 4]
              .view(torch.int32)] for k in range(slots)]
    torch.cuda.synchronize()
    in_flight: list[torch.cuda.Event] = []
    keep: list[torch.Tensor] = []
    n = nbytes = 0
    t0 = time.time_ns()
    for i in range(spec["samples"]):
        while len(in_flight) >= spec["prefetch"]:
            in_flight.pop(0).synchronize()
        with torch.cuda.stream(copy_stream):
            out = [torch.empty(v.shape, dtype=v.dtype, device="cuda") for v in views[i % slots]]
            for d, v in zip(out, views[i % slots]):
                d.copy_(v, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(copy_stream)
        current.wait_event(ev)
        for d in out:
            d.record_stream(current)
        in_flight.append(ev)
        keep = out                  # what a training step would hold; the previous is freed
        n += 1
        nbytes += layers * layer_bytes
    torch.cuda.synchronize()
    t1 = time.time_ns()
    del keep
    return t0, t1, n, nbytes


def child_h2d(spec: dict) -> None:
    """Raw H2D copies of the same samples from an equally registered shared mapping."""
    from hscapture.stream import register_ring

    torch.cuda.init()
    pool, ids = _pool({**spec, "device": "cpu"})
    slot, slots = spec["slot_bytes"], spec["slots"]
    size = slot * slots
    m, fd = _shm(spec["shm"], size, create=True)
    os.unlink(f"/dev/shm/{spec['shm']}")              # the mapping stays; nothing to clean
    data = torch.frombuffer(m, dtype=torch.uint8)
    tokens, hidden, layers = spec["tokens"], spec["hidden"], spec["layers"]
    layer_bytes = tokens * hidden * 2
    for k in range(slots):                            # every slot holds a sample
        base = k * slot
        for j, t in enumerate(pool):
            data[base + j * layer_bytes: base + (j + 1) * layer_bytes].view(torch.bfloat16) \
                .view(tokens, hidden).copy_(t)
        at = base + layers * layer_bytes
        data[at: at + tokens * 4].view(torch.int32).copy_(ids)
    reg = register_ring(data.data_ptr(), size)
    emit(event="ready")
    t0, t1, n, nbytes = _h2d_copies(spec, data)
    del data
    emit(event="done", t0=t0, t1=t1, samples=n, bytes=nbytes, registered=reg is not None,
         dropped=0, incomplete=0, rejected=0, lost=0, unresolved=0)
    if reg is not None:
        reg.close()
    m.close()
    os.close(fd)


# -- raw (baseline) ---------------------------------------------------------------------------

def _shm(name: str, size: int, create: bool) -> tuple[mmap.mmap, int]:
    path = f"/dev/shm/{name}"
    fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
    if create:
        os.posix_fallocate(fd, 0, size)
    return mmap.mmap(fd, size, flags=MAP_FLAGS), fd


def _register(m: mmap.mmap, size: int, device: str) -> object:
    if device != "cuda":
        return None
    from hscapture.pinning import register_host_memory

    arr = np.frombuffer(m, dtype=np.uint8)
    return register_host_memory(arr.ctypes.data, size)


def child_raw_produce(spec: dict) -> None:
    pool, ids = _pool(spec)
    dev = spec["device"]
    slot, slots = spec["slot_bytes"], spec["slots"]
    m, fd = _shm(spec["shm"], HDR + slot * slots, create=True)
    reg = _register(m, HDR + slot * slots, dev)
    ctr = np.frombuffer(m, dtype=np.uint64, count=HDR // 8)
    data = torch.frombuffer(m, dtype=torch.uint8, offset=HDR)
    layer_bytes = spec["tokens"] * spec["hidden"] * 2
    emit(event="ready")
    emit(event="attached")
    if not _wait_go():
        return
    t0 = time.time_ns()
    for i in range(spec["samples"]):
        while int(ctr[0]) - int(ctr[8]) >= slots:     # every slot still unread: wait
            time.sleep(0)
        base = (i % slots) * slot
        for j, t in enumerate(pool):
            dst = data[base + j * layer_bytes: base + (j + 1) * layer_bytes]
            dst.view(torch.bfloat16).view(spec["tokens"], spec["hidden"]).copy_(
                t, non_blocking=True)
        at = base + len(pool) * layer_bytes
        data[at: at + ids.numel() * 4].view(torch.int32).copy_(ids)
        _sync(dev)                                    # the bytes are in the slot
        ctr[0] = i + 1                                # publish (x86: stores stay in order)
    emit(event="captured", t0=t0, committed=spec["samples"], dropped=0)
    sys.stdin.read()
    del data, ctr
    if reg is not None:
        reg.close()
    m.close()
    os.close(fd)
    os.unlink(f"/dev/shm/{spec['shm']}")


def child_raw_consume(spec: dict) -> None:
    dev = spec["device"]
    if dev == "cuda":
        torch.cuda.init()
    slot, slots = spec["slot_bytes"], spec["slots"]
    deadline = time.monotonic() + 120
    while not os.path.exists(f"/dev/shm/{spec['shm']}"):
        if time.monotonic() > deadline:
            emit(event="error", message="no shared-memory segment within 120 s")
            return
        time.sleep(0.01)
    m, fd = _shm(spec["shm"], HDR + slot * slots, create=False)
    reg = _register(m, HDR + slot * slots, dev)
    ctr = np.frombuffer(m, dtype=np.uint64, count=HDR // 8)
    data = torch.frombuffer(m, dtype=torch.uint8, offset=HDR)
    layer_bytes = spec["tokens"] * spec["hidden"] * 2
    emit(event="ready")
    n = nbytes = 0
    keep: list[torch.Tensor] = []
    src: list[torch.Tensor] = []
    stream = torch.cuda.current_stream() if dev == "cuda" else None
    for i in range(spec["samples"]):
        while int(ctr[0]) <= i:                       # spin until the slot is published
            pass
        base = (i % slots) * slot
        src = [data[base + j * layer_bytes: base + (j + 1) * layer_bytes]
               .view(torch.bfloat16).view(spec["tokens"], spec["hidden"])
               for j in range(spec["layers"])]
        at = base + spec["layers"] * layer_bytes
        src.append(data[at: at + spec["tokens"] * 4].view(torch.int32))
        if dev == "cuda":
            keep = [t.to("cuda", non_blocking=True) for t in src]
            stream.synchronize()                      # the slot may be reused after this
        else:
            keep = [t.clone() for t in src]
        ctr[8] = i + 1                                # free the slot
        n += 1
        nbytes += spec["layers"] * layer_bytes
    _sync(dev)
    t1 = time.time_ns()
    del keep, src, data, ctr
    if reg is not None:
        reg.close()
    emit(event="done", t1=t1, samples=n, bytes=nbytes, dropped=0, incomplete=0, rejected=0,
         lost=0, unresolved=0)
    m.close()
    os.close(fd)


# -- parent -------------------------------------------------------------------------------------

def _result(done: dict, t0: int, committed: int, dropped: int) -> dict:
    secs = (done["t1"] - t0) / 1e9
    return {"GBps": done["bytes"] / secs / 1e9, "seconds": secs, "samples": done["samples"],
            "bytes": done["bytes"], "committed": committed,
            "dropped": dropped + done["dropped"], "staged": done.get("staged"),
            "registered": done.get("registered"),
            "not_delivered": {k: done[k] for k in ("incomplete", "rejected", "lost",
                                                   "unresolved")}}


def run_once(method: str, a: argparse.Namespace) -> dict:
    ep, pid = unique_producer("stream")
    sample_bytes = a.tokens * a.layers * a.hidden * 2
    slot = (sample_bytes + a.tokens * 4 + 4095) // 4096 * 4096
    spec = {"endpoint": ep, "producer_id": pid, "device": a.device, "samples": a.samples,
            "tokens": a.tokens, "layers": a.layers, "hidden": a.hidden, "seed": 1,
            "ring_bytes": a.ring_mb * MB, "prefetch": a.prefetch, "method": method,
            "shm": f"hsc-bench-stream-{uuid.uuid4().hex[:12]}", "slot_bytes": slot,
            "slots": max(2, a.ring_mb * MB // slot)}
    if method == "h2d":
        child = spawn(__file__, "_h2d", spec)
        try:
            read_event(child, "ready", timeout=300)
            done = read_event(child, "done", timeout=600)
        finally:
            stop_child(child)
            if os.path.exists(f"/dev/shm/{spec['shm']}"):
                os.unlink(f"/dev/shm/{spec['shm']}")
        return _result(done, done["t0"], done["samples"], 0)
    roles = {"stream": ("_stream_produce", "_stream_consume"),
             "stream_host": ("_stream_produce", "_stream_consume"),
             "raw": ("_raw_produce", "_raw_consume")}[method]
    prod = spawn(__file__, roles[0], spec)
    cons = None
    try:
        read_event(prod, "ready", timeout=300)
        cons = spawn(__file__, roles[1], spec)
        read_event(cons, "ready", timeout=300)
        read_event(prod, "attached", timeout=300)
        prod.stdin.write("go\n")
        prod.stdin.flush()
        cap = read_event(prod, "captured", timeout=600)
        done = read_event(cons, "done", timeout=600)
    finally:
        if cons is not None:
            stop_child(cons)
        stop_child(prod)
        if os.path.exists(f"/dev/shm/{spec['shm']}"):    # a raw producer that was killed
            os.unlink(f"/dev/shm/{spec['shm']}")
    return _result(done, cap["t0"], cap["committed"], cap["dropped"])


METHODS = ("stream", "h2d", "raw", "stream_host")


def _clean(r: dict, samples: int) -> bool:
    return r["dropped"] == 0 and r["samples"] == samples and not any(r["not_delivered"].values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None)
    ap.add_argument("--methods", default=None,
                    help=f"comma-separated, 'stream' first, of {','.join(METHODS)} "
                         f"(cuda: stream,h2d,raw; cpu: stream,raw)")
    ap.add_argument("--samples", type=int, default=None, help="per repetition (cuda 64, cpu 32)")
    ap.add_argument("--tokens", type=int, default=None, help="per sample (cuda 2048, cpu 256)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=None, help="cuda 4096, cpu 1024")
    ap.add_argument("--ring-mb", type=int, default=None, help="ring MiB (cuda 1024, cpu 64)")
    ap.add_argument("--prefetch", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="bench-results/bench_stream.json")
    a = ap.parse_args(argv)
    if a.device is None:
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available here")
    big = a.device == "cuda"
    for k, v in dict(samples=64 if big else 32, tokens=2048 if big else 256,
                     hidden=4096 if big else 1024, ring_mb=1024 if big else 64).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    methods = (a.methods or ("stream,h2d,raw" if big else "stream,raw")).split(",")
    if methods[0] != "stream" or len(methods) < 2 or len(set(methods)) != len(methods) or \
            not set(methods) <= set(METHODS):
        ap.error(f"--methods: expected 'stream' first, then one or more of {METHODS[1:]}, "
                 f"found {a.methods!r}")
    if not big and ({"h2d", "stream_host"} & set(methods)):
        ap.error("--methods: h2d and stream_host need --device cuda")
    a.methods = ",".join(methods)
    mib = a.tokens * a.layers * a.hidden * 2 / MB
    print(f"[stream] {a.samples} samples of {a.tokens} tokens x {a.layers} layers x {a.hidden} "
          f"bf16 ({mib:.1f} MiB) per repetition, {a.reps} reps + 1 warm-up, methods "
          f"{', '.join(methods)} alternating, device {a.device}", flush=True)

    def one(method: str, i: int) -> dict:
        r = run_once(method, a)
        extra = ""
        if r.get("staged") is not None:
            extra = f", staged {r['staged']}"
        if r.get("registered") is not None:
            extra = f", registered {r['registered']}"
        print(f"[stream] rep {i} {method}: {r['GBps']:.2f} GB/s ({r['samples']} samples, "
              f"drops {r['dropped']}, not delivered {r['not_delivered']}{extra})", flush=True)
        return r

    runs, order = _stats.run_alternating(
        {m: (lambda i, m=m: one(m, i)) for m in methods}, reps=a.reps)
    gbps = {m: [r["GBps"] for r in runs[m]] for m in methods}
    clean = all(_clean(r, a.samples) for r in runs["stream"])
    summ = {"methods": {m: _stats.summarize(v) for m, v in gbps.items()},
            "ratios": {f"stream/{m}": _stats.ratio_summary(gbps["stream"], gbps[m])
                       for m in methods[1:]},
            "order": order}
    goals = []
    if big:
        g = _stats.goal_record("stream GB/s into the training process (CUDA, device=)",
                               gbps["stream"], GOAL_GBPS, ">=", " GB/s")
        if not clean:
            g["met"], g["why_not"] = False, "drops or samples not delivered"
        goals.append(g)
    for m in methods:
        drops = sum(r["dropped"] for r in runs[m])
        line = f"[stream] {m}: {_stats.fmt_spread(summ['methods'][m])} GB/s, drops {drops}"
        if m != "stream":
            line += f"; stream/{m} {_stats.fmt_spread(summ['ratios'][f'stream/{m}'])}"
        print(line, flush=True)
    if not clean:
        print("[stream] stream: DROPS or samples not delivered", flush=True)
    staged = [r["staged"] for r in runs["stream"] if r.get("staged")]
    if staged:
        print(f"[stream] stream: {sum(staged)} samples went through pinned staging (the ring "
              f"was not registered with CUDA: see the consumer's warning)", flush=True)
    for g in goals:
        print("[stream] " + _stats.format_goal(g), flush=True)
    consume = ("hscapture.stream(..., device='cuda') iteration (subscriber checks, H2D copies "
               "from the registered ring on a copy stream, events)" if big else
               "hscapture.stream(..., device='cpu') iteration (subscriber checks, copy out of "
               "the ring)")
    producer = ("producer process: capture_forward of every sample (one forward pass each, "
                "full_policy=wait), from its first capture")
    wall = "time.time_ns (wall clock, shared by processes)"
    tr = {"stream": _stats.timed_region(
              [producer, f"consumer process: {consume}, until the last sample is on the "
                         f"device (cuda: synchronize)"],
              ["process start", "torch/CUDA init", "ring creation", "subscriber attach",
               "source fill", "the report"], wall),
          "stream_host": _stats.timed_region(
              [producer, "consumer process: hscapture.stream(...) on the host + "
                         ".to('cuda', non_blocking=True) of every delivered tensor, until the "
                         "last sample is on the device (synchronize)"],
              ["process start", "torch/CUDA init", "ring creation", "subscriber attach",
               "source fill", "the report"], wall),
          "h2d": _stats.timed_region(
              ["one process: per sample, fresh device tensors + non_blocking H2D copies of "
               "its layers and token ids from a registered MAP_SHARED /dev/shm mapping on a "
               "copy stream, one event, the current stream waiting on it, <= prefetch in "
               "flight; then synchronize"],
              ["process start", "torch/CUDA init", "mapping creation, fill and "
               "registration"], wall),
          "raw": _stats.timed_region(
              ["producer process: copy of every sample into a slot of a registered MAP_SHARED "
               "/dev/shm mapping (device -> host on cuda) + synchronize + publish counter",
               "consumer process: spin on the counter, copy the slot to the device (cuda: "
               "pinned, non_blocking, then synchronize before freeing the slot; cpu: clone), "
               "free the slot, until the last sample is on the device"],
              ["process start", "torch/CUDA init", "mapping creation and registration",
               "source fill"], wall)}
    _stats.write_record(a.out, benchmark="bench_stream",
                        timed_regions={m: tr[m] for m in methods},
                        results={"summary": summ, "runs": runs, "clean": clean,
                                 "sample_mib": mib},
                        config=vars(a), goals=goals,
                        notes=[] if big else ["CPU dry run: the numbers only check the path"])
    return 0


if __name__ == "__main__":
    if not child_main({"_stream_produce": child_stream_produce,
                       "_stream_consume": child_stream_consume,
                       "_raw_produce": child_raw_produce, "_raw_consume": child_raw_consume,
                       "_h2d": child_h2d}):
        sys.exit(main())
