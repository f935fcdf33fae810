"""Gap 11(d): how short a producer incarnation an idle anonymous follower still hears of.

An anonymous subscriber reads incarnation 1 of producer id "sl" (one sample and its bye), then
makes no call (a trainer in a long step). Incarnation 2 of the same id captures 10 whole
samples at once, lives LIFE ms, and closes. Then the subscriber polls for 2 s. Each of the
10 samples is counted as delivered, reported by rid, or inside a `lost` range (by number);
the rest were named nowhere.

    .venv/bin/python scripts/hunts/reconnect-2026-12-08/short_life.py --lives 20,50,100,200 \
        --reps 5 --reconnect-ms 100
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from fault_support import LAYERS, source  # noqa: E402

import hscapture._wire as wire  # noqa: E402
from hscapture import Producer, Subscriber  # noqa: E402


def capture(p: Producer, rid: str) -> None:
    tensors, ids = source(rid, 4)
    assert p.capture(rid, tensors, layers=LAYERS, token_start=0, is_last_chunk=True,
                     token_ids=ids)


def one(ep: str, life_s: float, rep: int) -> dict:
    got: dict = {}
    b = Subscriber(ep)
    try:
        with Producer(ep, producer_id="sl", capacity=1 << 20, heartbeat_interval_s=0.05) as p:
            b.wait_ready(timeout=20)
            capture(p, "first")
            p.flush()
            t_end = time.monotonic() + 20
            while "first" not in got and time.monotonic() < t_end:
                s = b.poll(timeout=0.02)
                if s is not None:
                    got[s.rid] = s
        # read the bye, then idle
        t_end = time.monotonic() + 5
        while (b._sock.poll(0) or b._sources) and time.monotonic() < t_end:
            b.poll(timeout=0.02)
        rids = [f"r{rep}-{i}" for i in range(10)]
        with Producer(ep, producer_id="sl", capacity=1 << 20, heartbeat_interval_s=0.05) as p:
            for r in rids:
                capture(p, r)
            p.flush()
            time.sleep(life_s)        # the incarnation's lifetime: what is measured
        t_end = time.monotonic() + 2.0
        while time.monotonic() < t_end:
            s = b.poll(timeout=0.02)
            if s is not None:
                got[s.rid] = s
        st = b.stats()
        told = set(rids) & (set(st["dropped"]) | set(st["incomplete"]) | set(st["rejected"]))
        delivered = set(rids) & set(got)
        lost_n = sum(x["count"] for x in st["lost"] if x["count"] > 0)
        return {"delivered": len(delivered), "by_rid": len(told), "lost_numbers": lost_n,
                "silent": max(0, 10 - len(delivered) - len(told) - lost_n)}
    finally:
        b.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lives", default="20,50,100,200")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--reconnect-ms", type=int, default=wire.RECONNECT_MS)
    a = ap.parse_args()
    wire.RECONNECT_MS = a.reconnect_ms
    for life in [int(x) for x in a.lives.split(",")]:
        res = []
        for rep in range(a.reps):
            d = Path(tempfile.mkdtemp(prefix="hsc-sl-"))
            try:
                res.append(one(f"ipc://{d}/p.sock", life / 1e3, rep))
            finally:
                shutil.rmtree(d, ignore_errors=True)
        silent_runs = sum(r["silent"] > 0 for r in res)
        print(json.dumps({"reconnect_ms": a.reconnect_ms, "life_ms": life,
                          "runs_with_silent": f"{silent_runs}/{a.reps}",
                          "silent": [r["silent"] for r in res],
                          "lost_numbers": [r["lost_numbers"] for r in res],
                          "by_rid": [r["by_rid"] for r in res]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
