"""A durable name 'dur' has a kept place (closed before the producer starts): the producer
reserves it at ring position 0. N captures before any live subscriber (ring NOT full).
Anonymous A attaches (first live subscriber). 'dur' returns within the same heartbeat
interval, before the producer's heartbeat handles A's attach.
Expect: every capture committed before A's attach delivered to A or named to it by rid
(the unheard entry) or in a lost range.  Args: RUNS N HB DELAY"""
import sys, time
from common import *
import hscapture

def run(i, n_caps, hb, delay):
    setup_env()
    ep = new_endpoint()
    hscapture.Subscriber(ep, name="dur").close()
    plan = [["cap", f"w{k}", 8, 8] for k in range(n_caps)] + [["flush"], ["emit", "pre"],
            ["consumers", 1], ["emit", "attached"], ["sleep", 1.0], ["cap", "after", 8, 8], ["flush"], ["sleep", 0.5]]
    P = Prod({"endpoint": ep, "capacity": 1 << 20, "policy": "drop", "hb": hb, "plan": plan})
    P.wait_event("pre")
    A = hscapture.Subscriber(ep, producer_timeout_s=1.0)
    got = {}
    take(A, got, lambda: bool(A._registry.sources) if hasattr(A, "_registry") else bool(A._sources), "A attached", timeout=20)
    time.sleep(delay)
    D = hscapture.Subscriber(ep, name="dur")
    dgot = {}
    take_many([(A, got), (D, dgot)], lambda: P.has("closed"), "close", timeout=30)
    t0 = time.monotonic()
    take_many([(A, got), (D, dgot)], lambda: time.monotonic() - t0 > 2.0, "retire", timeout=20)
    st = A.stats()
    pr, s = verdict(f"run{i}", [P], got, st)
    print("   D got", len(dgot), "A got", sorted(got)[:5], "A dropped", len(st["dropped"]), flush=True)
    A.close(); D.unsubscribe()
    P.wait(10)
    cleanup_shm([P])
    return bool(pr)

n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
caps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
hb = float(sys.argv[3]) if len(sys.argv) > 3 else 0.5
delay = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
bad = sum(run(i, caps, hb, delay) for i in range(n))
print(f"RESULT {bad}/{n} runs with problems")
