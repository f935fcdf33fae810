"""One native export write with and without its zip CRC-32, the CRC taken inline or by a helper.

    python benchmarks/bench_crc_write.py [--sources 4] [--tokens 512] [--hidden 2048]
                                         [--reps 40] [--dir /dev/shm] [--json F]

What SpecForge's ``.ckpt`` costs beyond the bytes: ``hscapture._files.writev_rows_crc32`` writes
``--sources`` layer-major ``[tokens, hidden]`` bf16 buffers token-interleaved into a file and
returns the CRC-32 of what it wrote. Three ways, alternating in every repetition (raw, helper,
inline, in turn), each from a FRESH private map of a tmpfs/disk file (as the reader serves a
shard: its page faults are part of each write, as in an export):

- ``raw``: ``writev_rows``, no CRC (the export's lower bound for these bytes);
- ``helper``: ``writev_rows_crc32`` with ``crc_thread_min=0``: a helper thread takes the CRC
  while the calling thread writes (the default from ``_files.CRC_THREAD_MIN``, 2 MiB);
- ``inline``: ``crc_thread_min`` huge: each ~1 MiB batch checksummed just before its write
  (the only way before 2026-12-07).

Timed: the one native call. Outside: making and dropping the map, opening and closing the
file. Reports the median and the minimum per way in us, and helper / inline against raw.
"""

from __future__ import annotations

import argparse
import mmap
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _stats  # noqa: E402

NEVER = 1 << 62


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sources", type=int, default=4, help="layers interleaved per token row")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.reps < 5:
        ap.error(f"--reps must be >= 5, got {a.reps}")
    import numpy as np

    from hscapture import _files

    row = a.hidden * 2                      # bf16
    one = a.tokens * row
    d = tempfile.mkdtemp(dir=a.dir)
    src, dst = os.path.join(d, "src"), os.path.join(d, "dst")
    with open(src, "wb") as f:
        f.write(np.random.default_rng(0).integers(0, 256, a.sources * one, dtype=np.uint8))

    def once(way: str) -> float:
        fd = os.open(src, os.O_RDONLY)
        m = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        os.close(fd)
        mv = memoryview(m)
        bufs = [mv[i * one:(i + 1) * one] for i in range(a.sources)]
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        t = time.perf_counter()
        if way == "raw":
            _files.writev_rows(out, bufs, row, 0, a.tokens)
        else:
            _files.writev_rows_crc32(out, bufs, row, 0, a.tokens, 0,
                                     0 if way == "helper" else NEVER)
        took = time.perf_counter() - t
        os.close(out)
        for b in bufs:
            b.release()
        mv.release()
        m.close()
        return took * 1e6

    ways = ("raw", "helper", "inline")
    got: dict[str, list[float]] = {w: [] for w in ways}
    try:
        for _ in range(a.reps):
            for w in ways:
                got[w].append(once(w))
    finally:
        for p in (src, dst):
            if os.path.exists(p):
                os.unlink(p)
        os.rmdir(d)
    mib = a.sources * one / 2**20
    res = {w: {"median_us": _stats.median(v), "min_us": min(v)} for w, v in got.items()}
    for w in ways:
        r = res[w]
        print(f"{a.sources} x {a.tokens} x {a.hidden} ({mib:.0f} MiB), {w}: median "
              f"{r['median_us']:,.0f} us, min {r['min_us']:,.0f} us"
              + ("" if w == "raw" else
                 f", {r['median_us'] / res['raw']['median_us']:.3f} of raw's time"))
    if a.json:
        _stats.write_record(
            a.json, benchmark="bench_crc_write",
            config={"sources": a.sources, "tokens": a.tokens, "hidden": a.hidden,
                    "reps": a.reps, "crc32": _files.CRC32_IMPL,
                    "crc_thread_min_default": _files.CRC_THREAD_MIN,
                    "scratch": _stats.fs_info(a.dir or tempfile.gettempdir())},
            timed_regions={w: _stats.timed_region(
                ["the one native call (writev_rows or writev_rows_crc32), its page faults "
                 "on the fresh private map of the source file included"],
                ["making and dropping the map", "opening and closing the output file"],
                "time.perf_counter") for w in ways},
            results={w: dict(res[w], all_us=got[w]) for w in ways})
    return 0


if __name__ == "__main__":
    sys.exit(main())
