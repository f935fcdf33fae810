"""Soak: N samples with random chunking and interleaving from several producer processes,
every sample checked bit for bit against its source (tensors a pure function of the rid).

    .venv/bin/python scripts/soak.py --samples 100000 --producers 3

Each producer process (tests/fault_support.py) interleaves ``--interleave`` requests at once,
their chunks captured in random order, under the ``wait`` policy (so nothing need be dropped).
``--publish-intervals-ms`` gives the producers their ``publish_interval_s`` round robin
(default 0 and 20 ms: publishing after every capture, and coalesced as the SGLang hook does).
One Subscriber in this process receives them. Exit 0 only when every sample arrived exactly
once and exact, or was reported by rid (dropped/incomplete); prints one JSON summary line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from fault_support import ProducerProc, check_exact, new_endpoint, requests  # noqa: E402


def soak(samples: int, producers: int, interleave: int, capacity: int, seed: int,
         timeout_s: float, zero_copy: bool, intervals: tuple[float, ...] = (0.0,)) -> dict:
    from hscapture import Subscriber

    per = -(-samples // producers)
    eps, dirs, procs, sizes = [], [], [], {}
    for i in range(producers):
        ep, d = new_endpoint(f"soak{i}")
        eps.append(ep)
        dirs.append(d)
        reqs = requests(per, prefix=f"p{i}", seed=seed + i, tokens=(1, 2, 5, 17, 64),
                        chunks=(1, 3, 8, 64))
        sizes.update({r: t for r, t, _ in reqs})
        procs.append(ProducerProc({"endpoint": ep, "producer_id": f"soak{i}", "requests": reqs,
                                   "consumers": 1, "interleave": interleave, "seed": seed + i,
                                   "capacity": capacity, "policy": "wait",
                                   "wait_timeout_s": 30.0, "close_on_stdin": True,
                                   "publish_interval_s": intervals[i % len(intervals)]},
                                  "/tmp"))
    got: set[str] = set()
    duplicates = chunks = 0
    start = time.monotonic()
    try:
        with Subscriber(eps, zero_copy=zero_copy) as sub:
            sub.wait_ready(timeout=60, producers=producers)
            deadline = time.monotonic() + timeout_s
            while len(got) + len(sub.dropped) + len(sub.incomplete) < len(sizes):
                if time.monotonic() > deadline:
                    break
                s = sub.poll(timeout=0.2)
                if s is None:
                    continue
                if s.rid in got:
                    duplicates += 1
                check_exact(s.tensors, s.token_ids, s.rid, sizes[s.rid])
                chunks += s.meta.get("chunks", 1)
                got.add(s.rid)
                s.release()
            seconds = time.monotonic() - start
            st = sub.stats()
    finally:
        for p in procs:
            p.send()
        for p in procs:
            try:
                p.wait_event("done", timeout=60)
            finally:
                p.stop()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    missing = set(sizes) - got - set(st["dropped"]) - set(st["incomplete"])
    return {"samples": len(sizes), "delivered_exact": len(got), "chunks": chunks,
            "duplicates": duplicates, "dropped": len(st["dropped"]),
            "incomplete": len(st["incomplete"]), "rejected": len(st["rejected"]),
            "lost_ranges": len(st["lost"]), "lost": st["lost"][:5], "silently_missing": len(missing),
            "producers": producers, "seconds": round(seconds, 1),
            "samples_per_s": round(len(got) / seconds, 1) if seconds else 0.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--producers", type=int, default=3)
    ap.add_argument("--interleave", type=int, default=8)
    ap.add_argument("--capacity", type=int, default=8 << 20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--zero-copy", action="store_true")
    ap.add_argument("--publish-intervals-ms", default="0,20",
                    help="the producers' publish_interval_s, in ms, assigned round robin")
    a = ap.parse_args()
    intervals = tuple(float(x) / 1e3 for x in a.publish_intervals_ms.split(","))
    res = soak(a.samples, a.producers, a.interleave, a.capacity, a.seed, a.timeout, a.zero_copy,
               intervals)
    print(json.dumps(res))
    ok = res["duplicates"] == 0 and res["silently_missing"] == 0 and res["rejected"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
