"""Long fault runs: the drain killed (SIGINT/SIGKILL alternately) at random moments under load,
many restarts, every sample exactly once in the shards or reported by rid.

    .venv/bin/python scripts/faults.py --requests 5000 --restarts 20 --seeds 3 \
        [--publish-interval-ms 20] [--abort-every 7] [--drop]

Short versions: tests/test_faults.py.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from fault_support import new_endpoint  # noqa: E402
from test_faults import restarts_under_load  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--restarts", type=int, default=20)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--publish-interval-ms", type=float, default=0.0,
                    help="the producer's publish_interval_s in ms (the SGLang hook: 20)")
    ap.add_argument("--abort-every", type=int, default=0,
                    help="abort every N-th multi-chunk request after its first chunk")
    ap.add_argument("--drop", action="store_true",
                    help="the producer drops (a 256 KiB ring) instead of waiting")
    a = ap.parse_args()
    failures = 0
    for seed in range(a.seeds):
        ep, d = new_endpoint()
        tmp = Path(tempfile.mkdtemp(prefix="hsc-faults-"))
        try:
            acct = restarts_under_load(ep, tmp, n_requests=a.requests, restarts=a.restarts,
                                       seed=seed, rate=a.rate,
                                       publish_interval_s=a.publish_interval_ms / 1e3,
                                       abort_every=a.abort_every,
                                       policy="drop" if a.drop else "wait",
                                       capacity=(256 << 10) if a.drop else (4 << 20))
            print(json.dumps({"seed": seed, "ok": True, **acct}), flush=True)
        except AssertionError as exc:
            failures += 1
            print(json.dumps({"seed": seed, "ok": False, "error": str(exc)[:500]}), flush=True)
        finally:
            shutil.rmtree(d, ignore_errors=True)
            shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
