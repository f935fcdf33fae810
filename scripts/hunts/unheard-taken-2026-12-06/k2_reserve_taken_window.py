"""Deterministic form of k1's race: the producer's capturing thread is descheduled between
ring.reserve (the head moves past chunk y1) and Entries.next_seq's store_taken (injected
sleep in prod.py, op "slow"). A subscriber attaching in that window registers AFTER y1's position but
reads `taken` = y1's number. y1 is before its place (never read) yet >= its floor.
MODE=first: S is the only subscriber (unheard entry names y1 by rid as well).
MODE=late: A attached from the start; B is the late one.
Expect: y (chunk 1 before the place, chunk 2 after) named incomplete by rid, NO lost range
over y1's number."""
import sys, time, os
from common import *
import hscapture
MODE = os.environ.get("MODE", "first")

def run(i):
    setup_env()
    ep = new_endpoint()
    A = None
    if MODE == "late":
        A = hscapture.Subscriber(ep, producer_timeout_s=1.0)
    plan = ([["consumers", 1]] if MODE == "late" else []) + [
        ["cap", "w0", 8, 8], ["flush"], ["emit", "w"], ["stdin"],
        ["cap", "e0", 8, 8], ["slow", 1.5], ["chunk", "y", 8, 0, 4], ["chunk", "y", 8, 4, 8],
        ["flush"], ["sleep", 0.5]]
    P = Prod({"endpoint": ep, "hb": 5.0, "plan": plan,
              "kw": {"inline_publish": False}})
    gotA = {}
    if A is not None:
        take(A, gotA, lambda: P.has("w"), "w", timeout=20)
    else:
        P.wait_event("w")
    S = hscapture.Subscriber(ep, producer_timeout_s=1.0)
    time.sleep(0.5)
    P.send("go")
    got = {}
    pairs = [(S, got)] + ([(A, gotA)] if A else [])
    take_many(pairs, lambda: P.has("closed"), "close", timeout=30)
    t0 = time.monotonic()
    take_many(pairs, lambda: time.monotonic() - t0 > 2, "retire", timeout=20)
    st = S.stats()
    named = {k: sorted(st[k]) for k in ("dropped", "incomplete", "rejected") if st[k]}
    lost = [(x["first"], x["count"], x["reason"][:80]) for x in st["lost"]]
    ysq = [c["seq"] for c in P.caps() if c.get("rid") == "y"]
    print(i, MODE, "y seqs", ysq, "S got", sorted(got), "named", named, "lost", lost, flush=True)
    false = [l for l in st["lost"] if any(l["first"] <= q < l["first"] + l["count"] for q in ysq)
             and ("y" in got or any("y" in v for v in named.values()))]
    S.close(); A and A.close(); P.wait(10); cleanup_shm([P])
    return bool(false)

n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
bad = sum(run(i) for i in range(n))
print(f"RESULT {bad}/{n} runs with problems")
