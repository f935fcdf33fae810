"""The native ring between two processes vs the same two copies without the ring.

Per record size (default 4 KiB, 64 KiB, 1 MiB, 16 MiB), ``--reps`` repetitions after one
warm-up; every repetition runs each of four methods once, the order rotating by one per
repetition (A B C D, B C D A, ...), each run in fresh processes. Two pairs, each a candidate
and its like-for-like baseline (the same two processes, the same copies, the same Python
per record, without the ring's protocol):

- ``ring`` (candidate; the goal's): producer process ``Producer.put(src)`` (reserve + copy of
  a reused private source into the payload + commit, one native call); consumer process
  ``Consumer.take_into(dst)`` (poll + copy of the payload into one reused private destination
  + release, one native call). The ring is a shared-memory segment of ``capacity`` bytes;
  records advance through it and wrap.
- ``memcpy`` (its baseline): process A copies the same reused source into a MAP_SHARED
  ``/dev/shm`` mapping of the same capacity (fallocated and MAP_POPULATE'd, as the ring's),
  at positions advancing by the ring's record stride (payload + 64-byte header, 64-aligned)
  and wrapping, one memoryview slice assignment a record (``view[i][:] = src``, the slices
  made before the clock starts); process B, at the same time, copies from the same positions
  into one reused destination the same way (``dst[:] = view[i]``). No hand-off: B does not
  wait for A's data, so this is the ceiling of what the ring can do.
- ``ring_views`` / ``memcpy_numpy`` (the method until 2026-12-06, kept for continuity): the
  ring through Python views (``reserve`` + ``np.copyto`` into ``np.frombuffer(payload(pos))``
  + ``commit``; ``poll`` + ``np.copyto`` from ``np.frombuffer(rec.payload)`` + ``release``)
  against the same numpy copies into and out of a slice of the mapping. At 4 KiB the Python
  views (~1 µs a record a side) were most of the ring's cost: that is the binding's, not the
  ring's, and ``put`` / ``take_into`` are the ring's copy-in / copy-out calls.

Placement: every method's two processes run pinned to the same two CPUs on different
physical cores (the first two of the process's CPU set that are not SMT siblings;
``--no-pin`` leaves them to the scheduler), so no run differs from another by where its
spinning processes landed. The JSON's ``pinned_cpus`` says which.

Timed region (all): from the parent's ``go`` (both processes ready and waiting, mappings
created) to the last byte copied by the slower process (ring: the consumer's last release).
Process start, mapping creation, slice creation and the source fill are outside. GB/s counts
payload bytes once (each byte is copied twice, once per side, in parallel). ``ratio`` = ring /
memcpy and ``views_ratio`` = ring_views / memcpy_numpy, paired per repetition. Goal: ring >=
0.8 of memcpy at 4 KiB and 64 KiB, whole spread.

    python benchmarks/bench_ring.py --out bench-results/bench_ring.json [--gb 1] [--reps 5]
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing as mp
import os
import sys
import time
import uuid

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _stats  # noqa: E402

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20]
GOAL = 0.8
GOAL_SIZES = (4 << 10, 64 << 10)
CTX = mp.get_context("spawn")
HEADER = 64          # the ring's record header (csrc/hscapture/layout.h): records are 64-aligned
# The ring maps its segment MAP_SHARED | MAP_POPULATE after posix_fallocate (csrc/ring.cpp):
# the baseline's mapping is made the same way, so neither pays page faults in the timed region.
MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
# The ring's side wraps each payload memoryview in an array; ``dtype=np.uint8`` as a keyword
# costs numpy ~200 ns of argument parsing a call (half of np.frombuffer), which is glue, not
# ring: both sides pass ready-made dtype objects.
U8 = np.dtype(np.uint8)


def _two_cores() -> tuple[int, int] | None:
    """Two CPUs of this process's set on different physical cores (not SMT siblings), or
    None if it has no such pair. Every method's two processes run pinned to the same two:
    a spinning process the scheduler moves (or places beside its peer on one core) changes
    the hand-off cost from one run to the next, whichever method it is."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None

    def siblings(c: int) -> set[int]:
        path = f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list"
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            return {c}
        out: set[int] = set()
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
        return out

    first = cpus[0]
    for c in cpus[1:]:
        if c not in siblings(first):
            return first, c
    return None


def _pin(cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def _stride(size: int) -> int:
    return (size + HEADER + 63) // 64 * 64


def _capacity(size: int) -> int:
    return max(64 << 20, 4 * _stride(size)) // 4096 * 4096


# -- ring ---------------------------------------------------------------------------------------

def _ring_producer(name, capacity, size, count, views, cpu, ready, go, out):
    from hscapture import _ring

    _pin(cpu)
    p = _ring.Producer(name, capacity, 2)
    src = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
    ready.set()
    go.wait(120)
    if views:
        for _ in range(count):
            while (pos := p.reserve(size)) < 0:
                pass  # spin: the consumer frees space
            np.copyto(np.frombuffer(p.payload(pos), U8), src)
            p.commit(pos)
    else:
        put = p.put
        for _ in range(count):
            while put(src) < 0:
                pass  # spin: the consumer frees space
    out.put(("producer", time.monotonic_ns()))
    go.wait(120)  # stay alive (the segment) until the consumer is done
    p.close(True)


def _ring_consumer(name, size, count, views, cpu, ready, out):
    from hscapture import _ring

    _pin(cpu)
    c = _ring.Consumer(name)
    dst = np.empty(size, dtype=np.uint8)
    dst.fill(0)
    ready.set()
    got = 0
    if views:
        while got < count:
            rec = c.poll()
            if rec is None:
                continue
            np.copyto(dst, np.frombuffer(rec.payload, U8))
            c.release(rec.end)
            got += 1
    else:
        take = c.take_into
        while got < count:
            if take(dst) is not None:
                got += 1
    out.put(("consumer", time.monotonic_ns()))
    c.close()


def run_ring(size: int, count: int, views: bool = False, cpus=None) -> dict:
    cpus = cpus or (None, None)
    capacity = _capacity(size)
    name = f"hscapture-bench-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    ready_p, ready_c, go, out = CTX.Event(), CTX.Event(), CTX.Event(), CTX.Queue()
    prod = CTX.Process(target=_ring_producer,
                       args=(name, capacity, size, count, views, cpus[0], ready_p, go, out))
    prod.start()
    if not ready_p.wait(120):
        raise TimeoutError("ring producer not ready in 120 s")
    cons = CTX.Process(target=_ring_consumer, args=(name, size, count, views, cpus[1], ready_c, out))
    cons.start()
    if not ready_c.wait(120):
        raise TimeoutError("ring consumer not ready in 120 s")
    t0 = time.monotonic_ns()
    go.set()
    ends = dict(out.get(timeout=600) for _ in range(2))
    cons.join(60)
    prod.join(60)
    return _result(size, count, t0, max(ends.values()), capacity, ends)


# -- like-for-like memcpy ---------------------------------------------------------------------

def _slots(m, capacity: int, size: int) -> list:
    """The payload slices a record stream of ``size`` visits, in order: the ring's stride,
    wrapping where a record would straddle the end (as the ring does)."""
    mv, stride = memoryview(m), _stride(size)
    return [mv[pos + HEADER:pos + HEADER + size]
            for pos in range(0, capacity - stride + 1, stride)]


def _mem_writer(path, capacity, size, count, numpy_copy, cpu, ready, go, out):
    _pin(cpu)
    fd = os.open(path, os.O_RDWR)
    m = mmap.mmap(fd, capacity, MAP_FLAGS)
    buf = np.frombuffer(m, dtype=np.uint8)
    src = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
    stride, pos = _stride(size), 0
    slots = _slots(m, capacity, size)
    n = len(slots)
    ready.set()
    go.wait(120)
    if numpy_copy:
        for _ in range(count):
            if pos + stride > capacity:
                pos = 0   # the ring wraps the same way: a record never straddles the end
            np.copyto(buf[pos + HEADER:pos + HEADER + size], src)
            pos += stride
    else:
        for i in range(count):
            slots[i % n][:] = src
    out.put(("writer", time.monotonic_ns()))
    del buf, slots
    m.close()
    os.close(fd)


def _mem_reader(path, capacity, size, count, numpy_copy, cpu, ready, go, out):
    _pin(cpu)
    fd = os.open(path, os.O_RDWR)
    m = mmap.mmap(fd, capacity, MAP_FLAGS)
    buf = np.frombuffer(m, dtype=np.uint8)
    dst = np.empty(size, dtype=np.uint8)
    dst.fill(0)
    dview = memoryview(dst)
    stride, pos = _stride(size), 0
    slots = _slots(m, capacity, size)
    n = len(slots)
    ready.set()
    go.wait(120)
    if numpy_copy:
        for _ in range(count):
            if pos + stride > capacity:
                pos = 0
            np.copyto(dst, buf[pos + HEADER:pos + HEADER + size])
            pos += stride
    else:
        for i in range(count):
            dview[:] = slots[i % n]
    out.put(("reader", time.monotonic_ns()))
    del buf, slots, dview
    m.close()
    os.close(fd)


def run_memcpy(size: int, count: int, numpy_copy: bool = False, cpus=None) -> dict:
    cpus = cpus or (None, None)
    capacity = _capacity(size)
    path = f"/dev/shm/hscapture-bench-mem-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, capacity)   # as the ring's segment (csrc/ring.cpp)
        os.close(fd)
        rw, rr, go, out = CTX.Event(), CTX.Event(), CTX.Event(), CTX.Queue()
        procs = [CTX.Process(target=_mem_writer,
                             args=(path, capacity, size, count, numpy_copy, cpus[0], rw, go, out)),
                 CTX.Process(target=_mem_reader,
                             args=(path, capacity, size, count, numpy_copy, cpus[1], rr, go, out))]
        for p in procs:
            p.start()
        for ev in (rw, rr):
            if not ev.wait(120):
                raise TimeoutError("memcpy process not ready in 120 s")
        t0 = time.monotonic_ns()
        go.set()
        ends = dict(out.get(timeout=600) for _ in range(2))
        for p in procs:
            p.join(60)
    finally:
        os.unlink(path)
    return _result(size, count, t0, max(ends.values()), capacity, ends)


def _result(size: int, count: int, t0: int, t1: int, capacity: int, ends: dict) -> dict:
    s = (t1 - t0) / 1e9
    return {"records": count, "bytes": count * size, "seconds": s,
            "GBps": count * size / s / 1e9, "records_per_s": count / s, "capacity": capacity,
            "end_offsets_s": {k: (v - t0) / 1e9 for k, v in ends.items()}}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench-results/bench_ring.json", help="JSON result path")
    ap.add_argument("--plot", default=None, help="PNG path (default: --out with .png)")
    ap.add_argument("--gb", type=float, default=1.0, help="GB moved per run (default 1)")
    ap.add_argument("--sizes", default=",".join(str(s) for s in SIZES), help="record sizes, bytes")
    ap.add_argument("--reps", type=int, default=5, help="counted repetitions (after 1 warm-up)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--no-pin", action="store_true",
                    help="leave the two processes of each method unpinned")
    a = ap.parse_args(argv)
    cpus = None if a.no_pin else _two_cores()
    print(f"processes pinned to CPUs {cpus}" if cpus else "processes not pinned", flush=True)
    rows, goals = [], []
    for size in [int(s) for s in a.sizes.split(",")]:
        count = max(16, int(a.gb * 1e9) // size)
        runs, order = _stats.run_alternating(
            {"ring": lambda i: run_ring(size, count, cpus=cpus),
             "memcpy": lambda i: run_memcpy(size, count, cpus=cpus),
             "ring_views": lambda i: run_ring(size, count, views=True, cpus=cpus),
             "memcpy_numpy": lambda i: run_memcpy(size, count, numpy_copy=True, cpus=cpus)},
            reps=a.reps, warmup=a.warmup)
        gbps = {k: [r["GBps"] for r in v] for k, v in runs.items()}
        row = {"record_size": size, "records_per_run": count,
               "ring_GBps": _stats.summarize(gbps["ring"]),
               "memcpy_GBps": _stats.summarize(gbps["memcpy"]),
               "ratio": _stats.ratio_summary(gbps["ring"], gbps["memcpy"]),
               "ring_views_GBps": _stats.summarize(gbps["ring_views"]),
               "memcpy_numpy_GBps": _stats.summarize(gbps["memcpy_numpy"]),
               "views_ratio": _stats.ratio_summary(gbps["ring_views"], gbps["memcpy_numpy"]),
               "order": order,
               "ring_records_per_s": _stats.summarize([r["records_per_s"] for r in runs["ring"]]),
               "runs": runs}
        rows.append(row)
        line = (f"{size:>9} B  ring {_stats.fmt_spread(row['ring_GBps'])} GB/s "
                f"({row['ring_records_per_s']['median']:,.0f} rec/s)  memcpy(2 proc) "
                f"{_stats.fmt_spread(row['memcpy_GBps'])} GB/s  ratio "
                f"{_stats.fmt_spread(row['ratio'])}; through views "
                f"{_stats.fmt_spread(row['ring_views_GBps'])} vs numpy "
                f"{_stats.fmt_spread(row['memcpy_numpy_GBps'])}, ratio "
                f"{_stats.fmt_spread(row['views_ratio'])}")
        if size in GOAL_SIZES:
            g = _stats.goal_record(f"ring/memcpy at {size >> 10} KiB", row["ratio"]["values"],
                                   GOAL, ">=")
            goals.append(g)
            line += f"  -> {'MET' if g['met'] else 'MISSED'}"
        print(line, flush=True)
    for g in goals:
        print(_stats.format_goal(g), flush=True)
    region = ("from the parent's go (both processes started, mappings created, source filled) "
              "to the last byte copied by the slower of the two processes")
    outside = ["process start", "segment / mapping creation", "slice creation", "source fill",
               "process exit"]
    clock = "CLOCK_MONOTONIC (time.monotonic_ns, shared by processes)"
    tr = {"ring": _stats.timed_region(
              ["producer: Producer.put(reused source) = reserve + copy into the payload + "
               "commit, one native call a record", "consumer: Consumer.take_into(one reused "
               "destination) = poll + copy + release, one native call a record", region],
              outside, clock),
          "memcpy": _stats.timed_region(
              ["process A: one memoryview slice assignment a record (reused source -> MAP_SHARED "
               "/dev/shm mapping of the ring's capacity at the ring's record stride, wrapping)",
               "process B, concurrently: one memoryview slice assignment a record (same "
               "positions -> one reused destination)", region],
              outside + ["any hand-off (none)"], clock),
          "ring_views": _stats.timed_region(
              ["producer: reserve + np.copyto(reused source -> np.frombuffer(payload)) + "
               "commit, per record", "consumer: poll + np.copyto(np.frombuffer(rec.payload) "
               "-> one reused destination) + release", region], outside, clock),
          "memcpy_numpy": _stats.timed_region(
              ["process A: np.copyto(reused source -> a numpy slice of the mapping)",
               "process B, concurrently: np.copyto(a numpy slice -> one reused destination)",
               region], outside + ["any hand-off (none)"], clock)}
    rec = _stats.write_record(a.out, benchmark="bench_ring", timed_regions=tr,
                              results={"rows": rows, "pinned_cpus": list(cpus) if cpus else None},
                              config=vars(a), goals=goals)
    plot(rec, a.plot or os.path.splitext(a.out)[0] + ".png")
    return rec


def plot(rec: dict, path: str) -> None:
    plt = _stats.get_pyplot()
    if plt is None:
        return
    rows = rec["results"]["rows"]
    labels = [f"{r['record_size'] >> 10} KiB" for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    x = np.arange(len(rows))
    for k, (name, key) in enumerate((("ring", "ring_GBps"), ("memcpy (2 proc)", "memcpy_GBps"))):
        med, err = _stats.errorbar_args([r[key] for r in rows])
        ax.bar(x + (k - 0.5) * 0.38, med, 0.38, yerr=err, capsize=4, label=name)
    for i, r in enumerate(rows):
        ax.text(i, 0, f"{r['ratio']['median']:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, labels)
    ax.set_ylabel("GB/s (median, min..max)")
    ax.set_title("ring vs like-for-like memcpy (ratio at the foot of each pair)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
