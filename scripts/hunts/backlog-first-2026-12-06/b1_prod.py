"""b1 producer: an abort whose meta (reason) is larger than the ring, then more captures."""
import json, os, sys, time, traceback
sys.path.insert(0, "/work/main/tests"); sys.path.insert(0, "/work/main")
from fault_support import source
from hscapture import Producer
def emit(ev, **kw): print(json.dumps({"event": ev, **kw}), flush=True)
spec = json.loads(sys.argv[1])
p = Producer(spec["endpoint"], producer_id=spec["pid"], capacity=spec["cap"], full_policy=spec.get("policy", "drop"),
             wait_timeout_s=spec.get("wait", 0.0), heartbeat_interval_s=0.05, max_consumers=8)
emit("ready"); p.wait_for_consumers(1, timeout_s=60)
def cap(rid, tokens=8, s=0, e=8):
    t, ids = source(rid, tokens)
    try:
        return bool(p.capture(rid, [a[s:e] for a in t], layers=[0, 1], token_start=s, is_last_chunk=e == tokens, token_ids=ids[s:e]))
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc)[:120]}"
res = {}
for i in range(5): res[f"pre-{i}"] = cap(f"pre-{i}")
res["a-0.first"] = cap("a-0", 8, 0, 4)
try:
    p.abort("a-0", "x" * spec["reason_len"]); res["abort"] = True
except Exception as exc:
    res["abort"] = f"{type(exc).__name__}: {str(exc)[:120]}"
for i in range(5): res[f"post-{i}"] = cap(f"post-{i}")
try: p.flush(5); res["flush"] = True
except Exception as exc: res["flush"] = repr(exc)[:120]
emit("res", res=res, stats={k: v for k, v in p.stats().items() if isinstance(v, int)})
sys.stdin.readline()
try: p.close(); emit("done")
except Exception as exc: emit("done", err=repr(exc)[:200])
