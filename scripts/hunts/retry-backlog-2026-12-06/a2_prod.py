"""area 2 producer: stdin-driven. X's first chunk, fill the ring, abort X, then (on 'retry') capture X again whole."""
import json, os, sys
sys.path.insert(0, "/work/main/tests"); sys.path.insert(0, "/work/main")
from fault_support import source
def emit(ev, **kw): print(json.dumps({"event": ev, **kw}), flush=True)
spec = json.loads(sys.argv[1])
from hscapture import Producer
p = Producer(spec["endpoint"], producer_id=spec["pid"], capacity=spec["cap"], full_policy="drop",
             wait_timeout_s=0.0, heartbeat_interval_s=spec["hb"], max_consumers=8)
emit("ready")
p.wait_for_consumers(1, timeout_s=60)
emit("attached")
X, XT, XC = "x-0", 16, 4
def cap(rid, tokens, s, e):
    t, ids = source(rid, tokens)
    return bool(p.capture(rid, [a[s:e] for a in t], layers=[0, 1], token_start=s,
                          is_last_chunk=e == tokens, token_ids=ids[s:e]))
st = lambda: {k: v for k, v in p.stats().items() if isinstance(v, int)}
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "x1":
        emit("x1", ok=cap(X, XT, 0, XC))
    elif cmd == "fill":
        res = {}
        i = 0; falses = 0
        while falses < spec["extra_drops"]:
            ok = cap(f"f-{i}", 8, 0, 8); res[f"f-{i}"] = ok; i += 1
            falses += not ok
        emit("filled", res=res, stats=st())
    elif cmd == "abort":
        p.abort(X, "client abort; will retry"); emit("aborted", stats=st())
    elif cmd == "retry":
        b = st().get("backlog")
        oks = [cap(X, XT, s, min(XT, s + XC)) for s in range(0, XT, XC)]
        emit("retried", oks=oks, backlog_before=b, stats=st())
    elif cmd == "end":
        p.flush(); emit("flushed", stats=st())
    elif cmd == "close":
        p.close(); emit("done"); break
