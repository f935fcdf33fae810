"""Follower S (read incarnation 1) of a restarted producer whose small ring is pinned by an
away durable name 'dur'. S's socket is disconnected while incarnation 2 captures N samples
(fill the ring; rest dropped into the backlog). S reconnects and attaches (first live
subscriber): the unheard entry has no room -> backlog (heard=false). Then 'dur' returns and
reads: room comes, a heartbeat flushes the backlog (drops + unheard) and says heard=true
with the head read BEFORE the flush.
Expect: S names every committed rid by rid (unheard entry), every dropped rid (drop entries);
no lost range over numbers the unheard entry names."""
import sys, time
from common import *
import hscapture

def run(i, n_caps, grace):
    setup_env()
    ep = new_endpoint()
    hscapture.Subscriber(ep, name="dur").close()
    S = hscapture.Subscriber(ep, producer_timeout_s=1.0)
    kw = {"commit_grace_s": grace} if grace is not None else {}
    P1 = Prod({"endpoint": ep, "hb": 0.05, "plan": [["consumers", 1], ["cap", "p1", 8, 8], ["flush"], ["sleep", 0.3]]})
    got = {}
    take(S, got, lambda: P1.has("closed"), "P1 close", timeout=20)
    P1.wait(10)
    t0 = time.monotonic()
    take(S, got, lambda: time.monotonic() - t0 > 1.6, "retire P1", timeout=20)
    S._sock.disconnect(ep)
    plan = [["cap", f"w{k}", 8, 8] for k in range(n_caps)] + [["flush"], ["stats"], ["emit", "pre"],
            ["consumers", 1], ["stats"], ["emit", "attached"], ["stdin"], ["sleep", 1.0], ["stats"]]
    P2 = Prod({"endpoint": ep, "capacity": 1 << 16, "policy": "drop", "hb": 0.05, "kw": kw, "plan": plan})
    P2.wait_event("pre")
    S._sock.connect(ep)
    take(S, got, lambda: P2.has("attached"), "S attach", timeout=20)
    t0 = time.monotonic()
    take(S, got, lambda: time.monotonic() - t0 > 0.5, "settle", timeout=20)
    lost_before = list(S.stats()["lost"])
    D = hscapture.Subscriber(ep, name="dur")
    dgot = {}
    P2.send("go")
    take_many([(S, got), (D, dgot)], lambda: P2.has("closed"), "P2 close", timeout=30)
    t0 = time.monotonic()
    take_many([(S, got), (D, dgot)], lambda: time.monotonic() - t0 > 2.5, "retire", timeout=20)
    st = S.stats()
    caps = P2.caps()
    named = set(st["dropped"]) | set(st["incomplete"]) | set(st["rejected"])
    lost = [(x["epoch"], x["first"], x["count"], x["reason"][:70]) for x in st["lost"]]
    ep2 = P2.epoch()
    in_lost = lambda s: any(e == ep2 and f <= s < f + c for e, f, c, _ in lost)
    ok_caps = [c for c in caps if c["ok"]]
    ranged = [c["rid"] for c in caps if c["rid"] not in named and c["rid"] not in got and in_lost(c["seq"])]
    silent = [c["rid"] for c in caps if c["rid"] not in named and c["rid"] not in got and not in_lost(c["seq"])]
    both = [c["rid"] for c in caps if c["rid"] in named and in_lost(c["seq"])]
    dgot_w = {r for r in dgot if r.startswith("w")}
    print(i, "caps", len(caps), "committed", len(ok_caps), "S got", len([r for r in got if r.startswith('w')]),
          "S named", len(named & {c['rid'] for c in caps}), "lost", lost, "lost_before_dur", len(lost_before),
          "ranged-only", len(ranged), "silent", len(silent), "named+lost", len(both),
          "D got", len(dgot_w), "D dropped", len(set(D.stats()["dropped"])), flush=True)
    print("  prod stats", [(s["stats"].get("backlog"), s["stats"].get("unrecorded"), s["stats"].get("dropped")) for s in P2.events if s["event"] == "stats"], flush=True)
    S.close(); D.unsubscribe() if hasattr(D, "unsubscribe") else D.close()
    P2.wait(10)
    cleanup_shm([P1, P2])
    return bool(ranged or silent or both or [l for l in lost if l[0] == ep2])

n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
caps = int(sys.argv[2]) if len(sys.argv) > 2 else 300
grace = float(sys.argv[3]) if len(sys.argv) > 3 else None
bad = sum(run(i, caps, grace) for i in range(n))
print(f"RESULT {bad}/{n} runs with problems")
