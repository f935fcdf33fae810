"""A durable name is recorded for the endpoint (its subscriber closed, not unsubscribed), so
the new producer keeps a place for it at position 0 that pins its small ring (64 KiB, drop
policy). 300 captures before any live subscriber: ~25 committed, the rest dropped (drop
entries fill the control headroom, then the backlog). Then the first live subscriber A
(anonymous) attaches; the producer closes cleanly 1 s later.
Expect: every rid delivered to A or reported to it (dropped/unheard) or in a lost range."""
import sys, time
from common import *
import hscapture

def run(i, n_caps):
    setup_env()
    ep = new_endpoint()
    D = hscapture.Subscriber(ep, name="dur")
    D.close()
    plan = [["cap", f"w{k}", 8, 8] for k in range(n_caps)] + [["flush"], ["stats"], ["emit", "w"],
            ["consumers", 1], ["sleep", 1.0], ["stats"]]
    P = Prod({"endpoint": ep, "capacity": 1 << 16, "policy": "drop", "hb": 0.1, "plan": plan})
    P.wait_event("w")
    A = hscapture.Subscriber(ep, producer_timeout_s=1.0)
    got = {}
    take(A, got, lambda: P.has("closed"), "close", timeout=30)
    t0 = time.monotonic()
    take(A, got, lambda: time.monotonic() - t0 > 2.5, "retire", timeout=20)
    st = A.stats()
    named = set(st["dropped"]) | set(st["incomplete"]) | set(st["rejected"])
    lost = [(x["first"], x["count"], x["reason"][:50]) for x in st["lost"]]
    caps = P.caps()
    silent = [c["rid"] for c in caps if c["rid"] not in got and c["rid"] not in named and
              not any(f <= c["seq"] < f + n for f, n, _ in lost)]
    sts = [e for e in P.events if e["event"] == "stats"]
    print(i, "caps", len(caps), "ok", sum(c["ok"] for c in caps), "A got", len(got), "named", len(named),
          "lost", lost, "silent", len(silent), "prod unrecorded/backlog",
          [(s["stats"].get("unrecorded"), s["stats"].get("backlog_rows"), s["stats"].get("dropped")) for s in sts], flush=True)
    A.close()
    P.wait(10)
    cleanup_shm([P])
    return bool(silent)

n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
caps = int(sys.argv[2]) if len(sys.argv) > 2 else 300
bad = sum(run(i, caps) for i in range(n))
print(f"RESULT {bad}/{n} runs with problems")
