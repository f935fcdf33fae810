"""(g1 + a whole sample b before the attach: is b named by rid or only as a lost number?) A subscriber S read incarnation 1 (closed). Incarnation 2, at once: a's first chunk,
a restart abort of a, (ABORT2=1: b whole then a plain abort of c's first chunk), before S's
socket hears it; S attaches (first subscriber: the unheard entry), then a is captured again
whole. Expect: a delivered once, nothing reported lost (the abort numbers lost nothing)."""
import sys, time, os
from common import *
import hscapture

def run(i):
    setup_env()
    ep = new_endpoint()
    S = hscapture.Subscriber(ep, producer_timeout_s=1.0)
    P1 = Prod({"endpoint": ep, "plan": [["consumers", 1], ["cap", "p1", 8, 8], ["flush"], ["sleep", 0.3]]})
    got = {}
    take(S, got, lambda: P1.has("closed"), "P1 close", timeout=20)
    P1.wait(10)
    t0 = time.monotonic()
    take(S, got, lambda: time.monotonic() - t0 > 1.6, "retire P1", timeout=20)
    plan = [["cap", "b", 8, 8], ["chunk", "a", 8, 0, 4], ["abort", "a", 1], ["flush"], ["emit", "pre"],
            ["consumers", 1], ["sleep", 0.3], ["cap", "a", 8, 8], ["flush"], ["sleep", 0.5]]
    P2 = Prod({"endpoint": ep, "plan": plan})
    take(S, got, lambda: P2.has("closed"), "P2 close", timeout=20)
    t0 = time.monotonic()
    take(S, got, lambda: time.monotonic() - t0 > 2, "retire P2", timeout=20)
    st = S.stats()
    rep = {k: sorted(st[k]) for k in ("dropped", "incomplete", "rejected") if st[k]}
    lost = [(x["epoch"] & 0xffff, x["first"], x["count"], x["reason"][:90]) for x in st["lost"]]
    print(i, "got", {r: len(v) for r, v in got.items()}, "reported", rep, "lost", lost, flush=True)
    S.close(); P2.wait(10); cleanup_shm([P1, P2])
    return bool(lost or rep or len(got.get("a", [])) != 1)

n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
bad = sum(run(i) for i in range(n))
print(f"RESULT {bad}/{n} runs with problems")
