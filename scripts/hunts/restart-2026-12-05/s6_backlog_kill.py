"""A live anonymous subscriber A, stalled (polls nothing) while a producer (drop policy, 64 KiB
ring) captures until its ring and control headroom are full, so drops wait in the producer's
backlog; flush() returns; then the producer is SIGKILLed (after SLEEP s). A then reads the ring
to its end. Known gap 5 says a live subscriber reports the backlog's numbers as lost (from the
heartbeats). Check: every capture that returned False is named by rid or in a lost range."""
import sys, os
SLEEPS = [float(x) for x in os.environ.get("SLEEPS", "0.3,1.0").split(",")]
from common import *
setup_env()
from hscapture import Subscriber
from hscapture import _registry

orig = _registry.SourceRegistry.retire
def retire(self, src, reason):
    hb = src.hb or {}
    print(f"   retire: reason={reason[:50]!r} hb.next_seq={hb.get('next_seq')} hb.recorded_through={hb.get('recorded_through')} hb.backlog={hb.get('backlog')} hb.dropped={hb.get('dropped')} bye={src.bye_next_seq} seqs.high={src.seqs.high}")
    return orig(self, src, reason)
_registry.SourceRegistry.retire = retire

def run(sleep_s, follow):
    ep = new_endpoint()
    prods = []
    ga = {}
    A = Subscriber(ep)
    try:
        if follow:
            p1 = Prod(dict(endpoint=ep, plan=[["consumers", 1], ["cap", "i1-a", 3, 3], ["flush"], ["stdin"]]))
            prods.append(p1)
            take(A, ga, lambda: "i1-a" in ga, "inc1")
            p1.send(); p1.wait()
            take(A, ga, lambda: not A._sources, "retire inc1")
        plan = [["emit", "started"], ["stdin"]] + [["cap", f"r{i}", 8, 8] for i in range(300)] + \
               [["flush"], ["stats"], ["sleep", sleep_s], ["stats"], ["kill"]]
        p2 = Prod(dict(endpoint=ep, plan=plan, capacity=64 << 10, policy="drop"))
        prods.append(p2)
        p2.wait_event("started")
        take(A, ga, lambda: p2.epoch() in A._sources, "A attaches")
        p2.send(); p2.wait()
        take(A, ga, lambda: p2.epoch() not in A._sources, "A retires inc2")
        st = A.stats()
        caps = p2.caps()
        failed = [c["rid"] for c in caps if not c["ok"]]
        lost = [(x["epoch"], x["first"], x["count"]) for x in st["lost"]]
        named = set(st["dropped"]) | set(st["incomplete"])
        silent = [c["rid"] for c in caps if not c["ok"] and c["rid"] not in named and
                  not any(e == c["epoch"] and f <= c["seq"] < f + n for e, f, n in lost)]
        s_ev = [e["stats"] for e in p2.events if e["event"] == "stats"]
        print(f"sleep={sleep_s} follow={follow}: captured ok={sum(c['ok'] for c in caps)} dropped={len(failed)} "
              f"backlog_at_kill={s_ev[-1]['backlog']} named={len(named & set(failed))} lost={st['lost'] and [(x['first'], x['count']) for x in st['lost']]} "
              f"SILENT={len(silent)} {silent[:5]}")
        return silent
    finally:
        A.close()
        for p in prods:
            p.kill(); p.wait()
        cleanup_shm(prods)

if __name__ == "__main__":
    k = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    follow = len(sys.argv) > 2 and sys.argv[2] == "follow"
    bad = 0
    for s in SLEEPS:
        for _ in range(k):
            bad += bool(run(s, follow))
    print(f"RESULT {bad}/{len(SLEEPS) * k} runs with silent drops")
