"""Throughput of the shared-memory ring between two processes vs a plain memcpy.

What is measured, per record size (4 KiB, 64 KiB, 1 MiB, 16 MiB):

- ``ring``: a producer process reserves a record, fills the payload with ``np.copyto`` from a
  source buffer, commits; a consumer process polls, copies the payload out with ``np.copyto``
  into its own buffer, releases. Time = from the consumer's first record to its last; bytes =
  payload bytes moved end to end (each byte is copied twice, once per side, in parallel).
- ``ring-touch``: the same, but the consumer only reads one byte per 4 KiB page of the payload
  (what a consumer that hands the zero-copy view to someone else costs) instead of copying it.
- ``memcpy``: one process ``np.copyto`` of the same number of bytes, same record size, from a
  source buffer to a destination buffer (the speed one copy of the data can go).

``ratio`` = ring GB/s / memcpy GB/s. Run: ``python benchmarks/bench_ring.py --out result.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import time
import uuid

import numpy as np

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20]
CTX = mp.get_context("spawn")


def _producer(name, capacity, size, count, ready, go):
    from hscapture import _ring

    p = _ring.Producer(name, capacity, 2)
    src = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
    ready.set()
    go.wait(60)
    for _ in range(count):
        while (pos := p.reserve(size)) < 0:
            pass  # spin: the consumer frees space
        np.copyto(np.frombuffer(p.payload(pos), dtype=np.uint8), src)
        p.commit(pos)
    go.wait(60)
    p.close()


def _consumer(name, size, count, ready, out, mode):
    from hscapture import _ring

    c = _ring.Consumer(name)
    dst = np.empty(size, dtype=np.uint8)
    ready.set()
    got = 0
    t0 = None
    while got < count:
        rec = c.poll()
        if rec is None:
            continue
        if t0 is None:
            t0 = time.perf_counter()
        view = np.frombuffer(rec.payload, dtype=np.uint8)
        if mode == "copy":
            np.copyto(dst, view)
        else:
            int(view[::4096].sum())
        c.release(rec.end)
        got += 1
    elapsed = time.perf_counter() - t0
    # the first record's copy is not timed: count it out
    out.put((count - 1, elapsed))
    c.close()


def bench_ring(size: int, total_bytes: int, mode: str) -> dict:
    count = max(16, total_bytes // size)
    capacity = max(64 << 20, 4 * (size + 4096)) // 4096 * 4096
    name = f"hscapture-bench-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    ready_p, ready_c, go, out = CTX.Event(), CTX.Event(), CTX.Event(), CTX.Queue()
    prod = CTX.Process(target=_producer, args=(name, capacity, size, count, ready_p, go))
    prod.start()
    ready_p.wait(60)
    cons = CTX.Process(target=_consumer, args=(name, size, count, ready_c, out, mode))
    cons.start()
    ready_c.wait(60)
    go.set()
    n, elapsed = out.get(timeout=300)
    cons.join(60)
    prod.join(60)
    nbytes = n * size
    return {"records": n, "bytes": nbytes, "seconds": elapsed,
            "gb_s": nbytes / elapsed / 1e9, "records_s": n / elapsed, "capacity": capacity}


def bench_memcpy(size: int, total_bytes: int) -> dict:
    count = max(16, total_bytes // size)
    src = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
    # rotate through a destination as large as the ring, so caches help memcpy no more than the ring
    slots = max(1, (64 << 20) // size)
    dst = np.empty((slots, size), dtype=np.uint8)
    dst.fill(0)
    np.copyto(dst[0], src)
    t0 = time.perf_counter()
    for i in range(count):
        np.copyto(dst[i % slots], src)
    elapsed = time.perf_counter() - t0
    nbytes = count * size
    return {"records": count, "bytes": nbytes, "seconds": elapsed,
            "gb_s": nbytes / elapsed / 1e9, "records_s": count / elapsed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="path of the JSON result")
    ap.add_argument("--bytes", type=float, default=2.0, help="GB moved per record size and mode (default 2)")
    ap.add_argument("--sizes", default=",".join(str(s) for s in SIZES), help="record sizes in bytes")
    args = ap.parse_args()
    total = int(args.bytes * 1e9)
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        ring = bench_ring(size, total, "copy")
        touch = bench_ring(size, total, "touch")
        mem = bench_memcpy(size, total)
        rows.append({"record_size": size, "ring_copy": ring, "ring_touch": touch, "memcpy": mem,
                     "ratio_copy": ring["gb_s"] / mem["gb_s"], "ratio_touch": touch["gb_s"] / mem["gb_s"]})
        print(f"{size:>10} B  ring(copy out) {ring['gb_s']:6.2f} GB/s {ring['records_s']:>10,.0f} rec/s  "
              f"ring(touch) {touch['gb_s']:6.2f} GB/s {touch['records_s']:>10,.0f} rec/s  "
              f"memcpy {mem['gb_s']:6.2f} GB/s  ratio {rows[-1]['ratio_copy']:.2f} / "
              f"{rows[-1]['ratio_touch']:.2f}", flush=True)
    result = {"benchmark": "bench_ring", "host": platform.node(), "cpus": os.cpu_count(),
              "python": platform.python_version(), "gb_per_size": args.bytes, "rows": rows,
              "measured": ("ring_copy: producer np.copyto into payload + commit, consumer poll + np.copyto "
                           "out + release, two processes; ring_touch: consumer reads 1 byte per 4 KiB "
                           "instead of copying; memcpy: one process, np.copyto of the same bytes")}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
