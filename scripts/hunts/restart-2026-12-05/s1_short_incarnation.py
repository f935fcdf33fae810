"""An anonymous subscriber B reads incarnation 1 of producer id 'hr'. Incarnation 2 starts,
captures 10 whole samples, flushes and closes at once (short-lived). Incarnation 3 then starts;
B attaches to it and reads it. Are inc 2's committed samples delivered to B or reported?"""
import sys, os
from common import *
setup_env()
from hscapture import Subscriber

def run(durable=False):
    ep = new_endpoint()
    prods = []
    got, dup = {}, []
    b = Subscriber(ep, name="dur-b" if durable else "")
    try:
        p1 = Prod(dict(endpoint=ep, plan=[["consumers", 1], ["cap", "i1-a", 3, 3], ["flush"], ["stdin"]]))
        prods.append(p1)
        take(b, got, lambda: "i1-a" in got, "inc1 sample")
        p1.send(); p1.wait()
        take(b, got, lambda: not b._sources, "B retires inc1")
        p2 = Prod(dict(endpoint=ep, plan=[["cap", f"i2-{i}", 4, 4] for i in range(10)] + [["flush"]]))
        prods.append(p2)
        p2.wait()
        p3 = Prod(dict(endpoint=ep, plan=[["consumers", 1], ["cap", "i3-a", 4, 2], ["flush"], ["stdin"]]))
        prods.append(p3)
        take(b, got, lambda: "i3-a" in got, "inc3 sample")
        p3.send(); p3.wait()
        take(b, got, lambda: not b._sources, "B retires inc3", timeout=30)
        st = b.stats()
        return verdict(("durable" if durable else "anon"), prods, got, st)
    finally:
        b.close()
        cleanup_shm(prods)

if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    durable = len(sys.argv) > 2 and sys.argv[2] == "durable"
    bad = 0
    for i in range(n):
        pr, _ = run(durable)
        bad += bool(pr)
    print(f"RESULT {bad}/{n} runs with problems")
