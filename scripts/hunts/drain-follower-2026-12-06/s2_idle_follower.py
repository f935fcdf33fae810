"""Area 2: a follower B that read incarnation 1 goes idle (no poll) for IDLE seconds (longer
than producer_timeout_s=10 by default) while inc 1 captures more and closes, and inc 2 (same
producer id, same endpoint) starts, captures N chunked samples and then END (close | live |
kill). B then resumes polling. Every committed rid must be delivered once or named.

usage: python s2_idle_follower.py RUNS [IDLE_S] [END] [durable] [N]
"""
import sys, time, signal
from common import *
from hscapture import Subscriber

RUNS = int(sys.argv[1]); IDLE = float(sys.argv[2]) if len(sys.argv) > 2 else 12
END = sys.argv[3] if len(sys.argv) > 3 else "close"
DURABLE = len(sys.argv) > 4 and sys.argv[4] == "durable"
N = int(sys.argv[5]) if len(sys.argv) > 5 else 60
setup_env()

def one(run):
    ep = new_endpoint()
    pid = f"hd7-s2-{run}-{uuid.uuid4().hex[:4]}"
    plan1 = [["consumers", 1]] + [["cap", f"a{i}", 8, 4] for i in range(10)] + [["flush"], ["emit", "first"], ["stdin"]] + \
            [["cap", f"b{i}", 8, 3] for i in range(20)] + [["chunk", "c0", 8, 0, 4], ["flush"]]
    p1 = Prod({"endpoint": ep, "producer_id": pid, "plan": plan1, "capacity": 4 << 20})
    prods = [p1]
    sub = Subscriber(ep, name=(f"hd7-fol-{uuid.uuid4().hex[:6]}" if DURABLE else None))
    try:
        got = {}
        take(sub, got, lambda: p1.has("first") and len(got) >= 10, "B reads inc 1's first 10")
        # idle from here
        t_idle = time.monotonic()
        p1.send(); p1.wait_event("closed"); p1.wait()
        plan2 = [["sleep", 0.5]] + [["cap", f"d{i}", 12, 5] for i in range(N)] + [["flush"], ["emit", "captured"]]
        if END == "live":
            plan2 += [["stdin"]]
        elif END == "kill":
            plan2 += [["sleep", 0.3], ["kill"]]
        p2 = Prod({"endpoint": ep, "producer_id": pid, "plan": plan2, "capacity": 4 << 20})
        prods.append(p2)
        p2.wait_event("captured")
        if END != "live":
            p2.wait()
        rest = IDLE - (time.monotonic() - t_idle)
        if rest > 0:
            time.sleep(rest)
        # B wakes up
        deadline = time.monotonic() + 15
        def settled():
            st = sub.stats()
            return not st["in_flight"] and (END == "live" or not st["producers"]) and \
                   len(set(got) | set(st["dropped"]) | set(st["incomplete"])) >= 30 + N
        try:
            take(sub, got, settled, "settle", timeout=15)
        except AssertionError:
            pass
        time.sleep(1.2)
        take(sub, got, lambda: True, "last")
        st = sub.stats()
        print({k: v for k, v in st.items() if isinstance(v, (int, float)) and v}, st.get("producers"))
        probs, summ = verdict(f"run{run} idle={IDLE} end={END} durable={DURABLE}", prods, got, st)
        return bool(probs)
    finally:
        if END == "live" and len(prods) > 1:
            prods[-1].send()
            try: prods[-1].wait(10)
            except Exception: prods[-1].kill()
        sub.close()
        for p in prods: p.kill()
        cleanup_shm(prods)

bad = sum(one(r) for r in range(RUNS))
print(f"RESULT {bad}/{RUNS} runs with problems")
