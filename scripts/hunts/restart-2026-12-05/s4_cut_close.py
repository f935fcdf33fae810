"""A and B (anonymous) read incarnation 1. Incarnation 2: A attaches; the first chunk of 'x'
(4 tokens, 2 per chunk) is committed (flush returned); B, busy until then, attaches late (its
place after x's first chunk; it holds x's notice). Then both subscribers close while x is
unfinished. GUARANTEES 15b: an anonymous Subscriber closed with samples committed to it and not
handed out names each (undelivered or in_flight). A names x in in_flight; does B name x?"""
import sys, os
from common import *
setup_env()
from hscapture import Subscriber

def run():
    ep = new_endpoint()
    prods = []
    ga, gb = {}, {}
    A, B = Subscriber(ep), Subscriber(ep)
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
        p2.send()
        p2.wait_event("chunk1")
        take(A, ga, lambda: "x" in A.in_flight(), "A to read x's first chunk")
        take(B, gb, lambda: p2.epoch() in B._sources and B._sources[p2.epoch()].continuing
             and not B._sock.poll(0), "B to attach late and read its notices")
        cut = dict(B._sources[p2.epoch()].cut)
        A.close(); B.close()
        sa, sb = A.stats(), B.stats()
        named = lambda st: {k: sorted(st[k]) for k in ("in_flight", "undelivered", "dropped", "incomplete") if "x" in st[k]}
        print(f"B.start={B._sources and 0} cut={list(cut)}  A names x in {named(sa)}  B names x in {named(sb)}")
        return not named(sb)
    finally:
        A.close(); B.close()
        for p in prods:
            p.kill(); p.wait()
        cleanup_shm(prods)

if __name__ == "__main__":
    k = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    bad = sum(bool(run()) for _ in range(k))
    print(f"RESULT {bad}/{k} runs where B names x nowhere")
