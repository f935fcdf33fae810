"""Long runs of the durable live stream's restarts: trainer processes of one durable name
SIGKILL themselves or close at random moments while a producer process keeps capturing
chunked, interleaved samples; every sample must be handed out exactly once or reported.

    .venv/bin/python scripts/stream_faults.py --requests 3000 --restarts 30 --seeds 3

Short versions: tests/test_stream_durable.py.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from fault_support import new_endpoint, requests  # noqa: E402
from test_stream_durable import durable_stream_restarts  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--restarts", type=int, default=30)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rate", type=float, default=150.0)
    a = ap.parse_args()
    failures = 0
    for seed in range(a.seeds):
        rng = random.Random(seed)
        reqs = requests(a.requests, seed=seed, tokens=(1, 6, 20, 48, 130), chunks=(4, 16, 64))
        per = max(1, a.requests // (a.restarts + 1))
        # each trainer stops after at most what is left for it (every later one gets at
        # least one sample): drawn unbounded, the stops of seed 0 at 4,000/40 added up past
        # the requests, and trainer 34, told to stop after 115 of the 63 left, idled out
        stops, left = [], a.requests
        for i in range(a.restarts):
            room = left - (a.restarts - i)
            n, how = rng.randint(1, 2 * per), rng.choice(("kill", "kill", "close"))
            if room < 1:
                break
            stops.append((min(n, room), how))
            left -= min(n, room)
        ep, d = new_endpoint()
        tmp = Path(tempfile.mkdtemp(prefix="hsc-stream-faults-"))
        try:
            got = durable_stream_restarts(ep, tmp, reqs, stops, rate=a.rate, seed=seed)
            print(json.dumps({"seed": seed, "ok": True, **got}), flush=True)
        except AssertionError as exc:
            failures += 1
            print(json.dumps({"seed": seed, "ok": False, "error": str(exc)[:2000]}), flush=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(d, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
