"""The `unheard` entry's notice carries seq = the producer's next number N (n=0). Source.pump
never pops a notice for an unheard entry, so that notice stays in Source.notices[N]. The next
batch entry (seq N) read from the ring before ITS own notice arrives is cross-checked against
the unheard notice -> "notice and ring entry disagree" -> an intact sample REJECTED.
Plan: w0 before any subscriber; A attaches (first subscriber: unheard entry); then x0..x39.
Expect: x0..x39 all delivered to A, none rejected."""
import sys, time, os, json
from common import *
import hscapture
KW = json.loads(os.environ.get("KW", "{}"))
def run(i):
    setup_env()
    ep = new_endpoint()
    plan = [["cap", "w0", 8, 8], ["flush"], ["emit", "w"], ["consumers", 1], ["sleep", 0.3]]
    if os.environ.get("SLOWC"):
        plan += [["slowcommit", float(os.environ["SLOWC"])]]
    for k in range(40):
        plan += [["cap", f"x{k}", 8, 8], ["sleep", 0.002]]
    plan += [["flush"], ["sleep", 0.3]]
    P = Prod({"endpoint": ep, "hb": float(os.environ.get("HB", "0.05")), "plan": plan, "kw": KW})
    P.wait_event("w")
    A = hscapture.Subscriber(ep, producer_timeout_s=1.0)
    got = {}
    take(A, got, lambda: P.has("closed"), "close", timeout=30)
    t0 = time.monotonic()
    take(A, got, lambda: time.monotonic() - t0 > 1.5, "retire", timeout=20)
    st = A.stats()
    rej = {r: w[:110] for r, w in st["rejected"].items()} if isinstance(st["rejected"], dict) else st["rejected"]
    xs = [f"x{k}" for k in range(40)]
    print(i, "delivered x", sum(x in got for x in xs), "rejected", rej, "lost", st["lost"], flush=True)
    A.close(); P.wait(10); cleanup_shm([P])
    return bool(st["rejected"]) or any(x not in got for x in xs)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
bad = sum(run(i) for i in range(n))
print(f"RESULT {bad}/{n} runs with problems")
