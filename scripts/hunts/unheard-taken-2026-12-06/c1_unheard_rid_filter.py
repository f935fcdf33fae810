"""A first subscriber with rid_filter (only rids starting with 'k'): captures before it
attached, of rids it wants (k*) and rids it turns away (z*), whole and chunked.
Expect: only k* reported (GUARANTEES 2d / 15b: never a rid rid_filter turns away)."""
import sys, time
from common import *
import hscapture

def run(i):
    setup_env()
    ep = new_endpoint()
    plan = [["cap", "k1", 8, 8], ["cap", "z1", 8, 8], ["chunk", "z2", 8, 0, 4], ["chunk", "k2", 8, 0, 4],
            ["flush"], ["emit", "w"], ["consumers", 1], ["sleep", 0.5],
            ["chunk", "z2", 8, 4, 8], ["chunk", "k2", 8, 4, 8], ["flush"], ["sleep", 0.3]]
    P = Prod({"endpoint": ep, "hb": 0.1, "plan": plan})
    P.wait_event("w")
    A = hscapture.Subscriber(ep, producer_timeout_s=1.0, rid_filter=lambda r: r.startswith("k"))
    got = {}
    take(A, got, lambda: P.has("closed"), "close", timeout=30)
    t0 = time.monotonic()
    take(A, got, lambda: time.monotonic() - t0 > 2, "retire", timeout=20)
    st = A.stats()
    rep = {k: sorted(st[k]) for k in ("dropped", "incomplete", "rejected", "undelivered", "in_flight") if st[k]}
    print(i, "got", sorted(got), "reported", rep, "lost", st["lost"], flush=True)
    A.close(); P.wait(10); cleanup_shm([P])
    bad = {r for v in rep.values() for r in v if not r.startswith("k")}
    return bool(bad)

n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
bad = sum(run(i) for i in range(n))
print(f"RESULT {bad}/{n} runs with problems")
