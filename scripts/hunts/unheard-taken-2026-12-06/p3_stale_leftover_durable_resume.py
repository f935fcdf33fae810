"""Away durable 'dur' pins a small ring; N captures before any live subscriber fill it (rest
dropped, backlog). Durable 'a' attaches (first live): the unheard entry waits in the backlog
(and reaches the leftover file). 'dur' returns and reads: the backlog (drops, then the unheard
entry) is flushed into the ring over several heartbeats; A reads and reports the unheard rows.
The producer is SIGKILLed KILL_S after A has named every rid (the leftover file, rewritten at
most every 0.5 s, may still hold the unheard entry). A closes (place kept); A2 resumes 'a'.
Expect: A2 reports none of the rids A already reported (nothing reported twice); no lost."""
import sys, time, signal
from common import *
import hscapture

def run(i, n_caps, kill_s):
    setup_env()
    ep = new_endpoint()
    hscapture.Subscriber(ep, name="dur").close()
    plan = [["cap", f"w{k}", 8, 8] for k in range(n_caps)] + [["flush"], ["emit", "pre"],
            ["consumers", 1], ["emit", "attached"], ["sleep", 60]]
    P = Prod({"endpoint": ep, "capacity": 1 << 16, "policy": "drop", "hb": 0.05, "plan": plan})
    P.wait_event("pre")
    A = hscapture.Subscriber(ep, name="a", producer_timeout_s=1.0)
    got = {}
    take(A, got, lambda: P.has("attached"), "A attach", timeout=20)
    t0 = time.monotonic()
    take(A, got, lambda: time.monotonic() - t0 > 1.0, "settle", timeout=20)
    D = hscapture.Subscriber(ep, name="dur")
    dgot = {}
    rids = {f"w{k}" for k in range(n_caps)}
    take_many([(A, got), (D, dgot)], lambda: rids <= set(A.dropped) | set(got), "A names all", timeout=30)
    A.acknowledge_failures(len(A.failures()))
    t0 = time.monotonic()
    take_many([(A, got), (D, dgot)], lambda: (A.acknowledge_failures(len(A.failures())), time.monotonic() - t0 > kill_s)[1], "pre-kill", timeout=20)
    seg = P.wait_event("ready")["segment"]
    P.kill(signal.SIGKILL); P.wait(10)
    import os
    left = os.path.exists(f"/dev/shm/hscapture.left-{seg}")
    from hscapture._leftover import read as read_left
    try:
        L = read_left(seg, epoch=P.epoch(), producer="hr")
        left = L and [(e.kind, e.seq, e.n, len(e.rows)) for e in L.entries][:6]
        left = (left, L and len(L.entries))
    except Exception as exc:
        left = f"unreadable {exc}"
    A.acknowledge_failures(len(A.failures()))
    st1 = A.stats(); A.close()
    D.close()
    A2 = hscapture.Subscriber(ep, name="a", producer_timeout_s=1.0)
    got2 = {}
    t0 = time.monotonic()
    take(A2, got2, lambda: time.monotonic() - t0 > 3.0, "A2", timeout=20)
    st2 = A2.stats()
    r1 = set(st1["dropped"]) | set(st1["incomplete"])
    r2 = set(st2["dropped"]) | set(st2["incomplete"])
    twice = sorted(r1 & r2)
    import collections
    print("  A2 reasons", collections.Counter((k, r[:45]) for k, rid, r, ev in A2.failures()))
    print(i, "kill_s", kill_s, "leftover file", left, "A got", len(got), "A named", len(r1 & rids),
          "A lost", [(x['first'], x['count']) for x in st1['lost']], "A2 got", len(got2), "A2 named", len(r2),
          "A2 lost", [(x['first'], x['count'], x['reason'][:50]) for x in st2['lost']],
          "named twice", len(twice), twice[:5], "A2 counts", {k: v for k, v in st2.get("counts", {}).items() if "leftover" in k}, flush=True)
    A2.unsubscribe() if hasattr(A2, "unsubscribe") else A2.close()
    hscapture.Subscriber(ep, name="dur").unsubscribe()
    cleanup_shm([P])
    return bool(twice or st2["lost"] or st1["lost"])

n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
caps = int(sys.argv[2]) if len(sys.argv) > 2 else 300
kill_s = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
bad = sum(run(i, caps, kill_s) for i in range(n))
print(f"RESULT {bad}/{n} runs with problems")
