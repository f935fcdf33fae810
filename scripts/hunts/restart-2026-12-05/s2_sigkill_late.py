"""B (anonymous) reads incarnation 1 of producer id 'hr' (closed cleanly). Incarnation 2
starts; A (anonymous) attaches and reads it as it goes; inc 2 captures N whole samples and
one first chunk of 'x' (4 tokens, chunk 2), flush() returns, then the producer SIGKILLs itself.
B, busy meanwhile, polls only after inc 2 died and A retired it. Every committed sample of
inc 2 must reach B or be reported to it (by rid, or its numbers in a lost range), and 'x'
(started, never finished) must be reported incomplete."""
import sys, os
from common import *
setup_env()
from hscapture import Subscriber

def run(n=30, withA=True):
    ep = new_endpoint()
    prods = []
    ga, gb = {}, {}
    A, B = Subscriber(ep), Subscriber(ep)
    try:
        p1 = Prod(dict(endpoint=ep, plan=[["consumers", 2], ["cap", "i1-a", 3, 3], ["flush"], ["stdin"]]))
        prods.append(p1)
        take_many([(A, ga), (B, gb)], lambda: "i1-a" in gb and "i1-a" in ga, "inc1")
        p1.send(); p1.wait()
        take(B, gb, lambda: not B._sources and not B._sock.poll(0), "B retires inc1")
        take(A, ga, lambda: not A._sources, "A retires inc1")
        plan = [["emit", "started"], ["stdin"]] + [["cap", f"i2-{i}", 4, 4] for i in range(n)] + \
               [["chunk", "x", 4, 0, 2], ["flush"], ["kill"]]
        p2 = Prod(dict(endpoint=ep, plan=plan))
        prods.append(p2)
        p2.wait_event("started")
        if withA:
            take(A, ga, lambda: p2.epoch() in A._sources, "A attaches inc2")
        wait_until(lambda: B._sock.poll(0), 30, "B's socket to hear inc 2")
        p2.send()
        if withA:
            take(A, ga, lambda: p2.proc.poll() is not None and p2.epoch() not in A._sources, "A reads and retires inc2")
        else:
            p2.wait()
        seg = p2.wait_event("ready")["segment"]
        segment_gone = not os.path.exists("/dev/shm/" + seg)
        take(B, gb, lambda: p2.epoch() not in B._sources and B._registry.retired >= {p2.epoch()} , "B retires inc2", timeout=60)
        st = B.stats()
        pr, summ = verdict("B", prods, gb, st, quiet=True)
        if "x" not in set(st["incomplete"]) | set(st["dropped"]):
            pr["x_not_reported"] = True
        stA = A.stats()
        prA = verdict("A", prods, ga, stA, quiet=True)[0] if withA else "-"
        print(f"B: {summ} notices={st['notices']} segment_gone_before_B={segment_gone} PROBLEMS={pr}  A problems={prA}")
        if pr:
            print("  counts:", {k: v for k, v in st.items() if isinstance(v, int) and v})
            print("  last failures:", B.failures()[-3:])
            print("  errors:", list(st["errors"]))
        return pr
    finally:
        A.close(); B.close()
        for p in prods:
            p.kill(); p.wait()
        cleanup_shm(prods)

if __name__ == "__main__":
    k = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    withA = not (len(sys.argv) > 3 and sys.argv[3] == "noA")
    bad = sum(bool(run(n, withA)) for _ in range(k))
    print(f"RESULT {bad}/{k} runs with problems")
