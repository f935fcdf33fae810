"""As s4_cut_close.py, but neither subscriber closes: both use incomplete_timeout_s=1 and the
producer stays alive and never finishes 'x'. A reports x incomplete after ~1 s (its partial
timed out); does B (whose place began after x's first chunk: x is in its Source.cut) ever
report x while the incarnation lives? (Checked with a 10 s deadline after A's report.)"""
import sys, os, time
from common import *
setup_env()
from hscapture import Subscriber

def run():
    ep = new_endpoint()
    prods = []
    ga, gb = {}, {}
    A, B = Subscriber(ep, incomplete_timeout_s=1.0), Subscriber(ep, incomplete_timeout_s=1.0)
    try:
        p1 = Prod(dict(endpoint=ep, plan=[["consumers", 2], ["cap", "i1-a", 3, 3], ["flush"], ["stdin"]]))
        prods.append(p1)
        take_many([(A, ga), (B, gb)], lambda: "i1-a" in ga and "i1-a" in gb, "inc1")
        p1.send(); p1.wait()
        take_many([(A, ga), (B, gb)], lambda: not A._sources and not B._sources, "retire inc1")
        p2 = Prod(dict(endpoint=ep, plan=[["emit", "started"], ["stdin"], ["chunk", "x", 4, 0, 2], ["flush"],
                                           ["emit", "chunk1"], ["stdin"]]))
        prods.append(p2)
        p2.wait_event("started")
        take(A, ga, lambda: p2.epoch() in A._sources, "A attaches")
        wait_until(lambda: B._sock.poll(0), 30, "B's socket to hear inc 2")
        p2.send(); p2.wait_event("chunk1")
        take(A, ga, lambda: "x" in A.in_flight(), "A to read x's first chunk")
        take(B, gb, lambda: p2.epoch() in B._sources and not B._sock.poll(0), "B attaches late")
        take_many([(A, ga), (B, gb)], lambda: "x" in A.stats()["incomplete"], "A to report x (timeout)", timeout=30)
        try:
            take_many([(A, ga), (B, gb)], lambda: "x" in B.stats()["incomplete"], "B to report x", timeout=10)
            res = False
        except AssertionError:
            res = True
        print(f"A: x incomplete={A.stats()['incomplete'].get('x','')[:60]!r}; B reports x within 10 s after A: {not res}; "
              f"B in_flight={B.in_flight()} cut={list(B._sources[p2.epoch()].cut)}")
        return res
    finally:
        A.close(); B.close()
        for p in prods:
            p.kill(); p.wait()
        cleanup_shm(prods)

if __name__ == "__main__":
    k = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    bad = sum(bool(run()) for _ in range(k))
    print(f"RESULT {bad}/{k} runs where B does not report x while A did")
