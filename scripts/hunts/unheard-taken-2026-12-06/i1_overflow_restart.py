"""4100 whole samples before any subscriber (UNHEARD_ROWS = 4096: 4 overflow), then z's first
chunk (a 5th overflow row). The first subscriber attaches; z is restart-aborted and captured
again whole. Expect: z delivered, not reported; the overflow count 4 (z's discarded row is
not lost); 4096 rids named dropped."""
import sys, time
from common import *
import hscapture

def run(i):
    setup_env()
    ep = new_endpoint()
    plan = [["cap", f"w{k}", 1, 1] for k in range(4100)] + [["chunk", "z", 8, 0, 4], ["flush"], ["emit", "pre"],
            ["consumers", 1], ["sleep", 0.5], ["abort", "z", 1], ["cap", "z", 8, 8], ["flush"], ["sleep", 0.5]]
    P = Prod({"endpoint": ep, "capacity": 1 << 24, "plan": plan})
    P.wait_event("pre", timeout=60)
    A = hscapture.Subscriber(ep, producer_timeout_s=1.0)
    got = {}
    take(A, got, lambda: P.has("closed"), "close", timeout=60)
    t0 = time.monotonic()
    take(A, got, lambda: time.monotonic() - t0 > 2, "retire", timeout=20)
    st = A.stats()
    lost = [(x["first"], x["count"], x["reason"][:60]) for x in st["lost"]]
    print(i, "got", sorted(got), "dropped", len(st["dropped"]), "z reported:",
          [k for k in ("dropped", "incomplete", "rejected") if "z" in st[k]], "lost", lost, flush=True)
    A.close(); P.wait(10); cleanup_shm([P])
    return sum(c for f, c, _ in lost) != 4 or "z" not in got

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
bad = sum(run(i) for i in range(n))
print(f"RESULT {bad}/{n} runs with problems")
