"""Away durable 'dur' pins a small ring (64 KiB, drop). 300 captures before any live subscriber
fill it (rest dropped -> backlog), then a trickle of captures (one per 0.1 s, each dropped, so
the backlog and the leftover file change every 0.5 s). Anonymous A attaches (first live): the
unheard entry has no room and waits in the backlog. SIGKILL KILL_S after A's attach.
Expect: A names every rid committed before its attach (unheard entry via the leftover file)
or reports it in a lost range. Args: RUNS KILL_S"""
import sys, time, signal, os
from common import *
import hscapture

def run(i, kill_s):
    setup_env()
    ep = new_endpoint()
    hscapture.Subscriber(ep, name="dur").close()
    plan = [["cap", f"w{k}", 8, 8] for k in range(300)] + [["flush"], ["emit", "pre"]]
    for k in range(60):
        plan += [["cap", f"x{k}", 8, 8], ["flush"], ["sleep", 0.1]]
    P = Prod({"endpoint": ep, "capacity": 1 << 16, "policy": "drop", "hb": 0.1, "plan": plan})
    P.wait_event("pre")
    time.sleep(0.7)
    A = hscapture.Subscriber(ep, producer_timeout_s=1.0)
    got = {}
    take(A, got, lambda: bool(A._sources), "A attached", timeout=20)
    t0 = time.monotonic()
    take(A, got, lambda: time.monotonic() - t0 > kill_s, "pre-kill", timeout=20)
    seg = P.wait_event("ready")["segment"]
    P.kill(signal.SIGKILL); P.wait(10)
    from hscapture._leftover import read as read_left
    try:
        L = read_left(seg, epoch=P.epoch(), producer="hr")
        left = L and [e.kind for e in L.entries].count("unheard")
    except Exception as exc:
        left = f"unreadable {exc}"
    t0 = time.monotonic()
    take(A, got, lambda: time.monotonic() - t0 > 2.5, "retire", timeout=20)
    st = A.stats()
    pr, s = verdict(f"run{i} kill_s={kill_s} unheard-in-leftover={left}", [P], got, st)
    A.close()
    hscapture.Subscriber(ep, name="dur").unsubscribe()
    cleanup_shm([P])
    return bool(pr)

n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
kill_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.3
bad = sum(run(i, kill_s) for i in range(n))
print(f"RESULT {bad}/{n} runs with problems")
