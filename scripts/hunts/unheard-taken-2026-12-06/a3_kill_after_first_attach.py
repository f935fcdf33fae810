"""Default producer settings (heartbeat 0.1 s): 5 captures before any subscriber, the first
subscriber attaches, the producer is SIGKILLed D seconds after wait_for_consumers(1) returns.
Expect each w* reported (dropped, 'committed before any subscriber attached') or lost."""
import sys, time
from common import *
import hscapture

def run(i, d):
    setup_env()
    ep = new_endpoint()
    P = Prod({"endpoint": ep, "hb": 0.1,
              "plan": [["cap", "w0", 8, 8], ["cap", "w1", 8, 8], ["cap", "w2", 8, 8], ["flush"],
                       ["emit", "w"], ["consumers", 1], ["sleep", d], ["kill"]]})
    P.wait_event("w")
    B = hscapture.Subscriber(ep, producer_timeout_s=1.0)
    got = {}
    t0 = time.monotonic()
    take(B, got, lambda: time.monotonic() - t0 > 3.5, "retire", timeout=20)
    st = B.stats()
    named = set(st["dropped"]) | set(st["incomplete"]) | set(st["rejected"])
    lost = [(x["first"], x["count"]) for x in st["lost"]]
    silent = [r for r in ("w0", "w1", "w2") if r not in got and r not in named and
              not any(f <= int(r[1]) < f + c for f, c in lost)]
    print(i, d, "named", sorted(named), "lost", lost, "silent", silent, flush=True)
    B.close(); cleanup_shm([P])
    return bool(silent)

n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
ds = [float(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "0,0.03,0.3").split(",")]
bad = tot = 0
for d in ds:
    for i in range(n):
        bad += run(i, d); tot += 1
print(f"RESULT {bad}/{tot} runs with problems")
