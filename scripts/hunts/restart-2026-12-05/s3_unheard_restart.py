"""B (anonymous) reads incarnation 1. Incarnation 2 captures the first chunk of 'x' (4 tokens)
right after it starts, before any subscriber attached (B's socket has not reconnected yet), then
waits for B to attach, restart-aborts 'x' (abort(restart=True): a retraction) and captures it
again whole (2 chunks). GUARANTEES 2d: 'a restart abort forgets it, and the sample captured
again arrives, unreported'. Expected: x delivered once, exact, and not reported."""
import sys, os
from common import *
setup_env()
from hscapture import Subscriber

def run(fresh=False):
    ep = new_endpoint()
    prods = []
    gb = {}
    B = Subscriber(ep)
    try:
        if not fresh:   # (fresh: B never read an earlier incarnation: GUARANTEES row 2 only)
            p1 = Prod(dict(endpoint=ep, plan=[["consumers", 1], ["cap", "i1-a", 3, 3], ["flush"], ["stdin"]]))
            prods.append(p1)
            take(B, gb, lambda: "i1-a" in gb, "B inc1")
            p1.send(); p1.wait()
            take(B, gb, lambda: not B._sources and not B._sock.poll(0), "B retires inc1")
        p2 = Prod(dict(endpoint=ep, plan=[["chunk", "x", 4, 0, 2], ["flush"], ["emit", "chunk1"],
                                           ["consumers", 1], ["abort", "x", True],
                                           ["cap", "x", 4, 2], ["cap", "last", 3, 3], ["flush"], ["emit", "done"], ["stdin"]]))
        prods.append(p2)
        take(B, gb, lambda: "last" in gb, "B to get 'last'")
        p2.send(); p2.wait()
        take(B, gb, lambda: not B._sources, "B retires inc2")
        st = B.stats()
        pr, summ = verdict("B", prods, gb, st, quiet=True)
        print(f"x delivered={'x' in gb} x_reports={[f[:3] for f in B.failures() if f[1]=='x']} "
              f"notices={st['notices']} PROBLEMS={pr}")
        return pr
    finally:
        B.close()
        for p in prods:
            p.kill(); p.wait()
        cleanup_shm(prods)

if __name__ == "__main__":
    k = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    fresh = len(sys.argv) > 2 and sys.argv[2] == "fresh"
    bad = sum(bool(run(fresh)) for _ in range(k))
    print(f"RESULT {bad}/{k} runs with problems")
