"""u1 producer: N samples (1 token, whole) with long rids captured BEFORE any subscriber;
then waits for a consumer, lets heartbeats run, captures M more, flushes, closes on stdin."""
import json, os, sys, time
sys.path.insert(0, "/work/main/tests"); sys.path.insert(0, "/work/main")
from fault_support import source
from hscapture import Producer
def emit(ev, **kw): print(json.dumps({"event": ev, **kw}), flush=True)
spec = json.loads(sys.argv[1])
p = Producer(spec["endpoint"], producer_id=spec["pid"], capacity=spec["cap"], full_policy="drop",
             wait_timeout_s=0.0, heartbeat_interval_s=0.05, max_consumers=8)
emit("ready")
def cap(rid, tokens=1):
    t, ids = source(rid, tokens)
    return bool(p.capture(rid, t, layers=[0, 1], token_start=0, is_last_chunk=True, token_ids=ids))
pre = {}
for i in range(spec["n"]):
    rid = f"{spec['prefix']}-pre-{i:05d}"
    pre[rid] = cap(rid)
p.flush()
emit("pre", oks=pre, stats={k: v for k, v in p.stats().items() if isinstance(v, int)})
p.wait_for_consumers(1, timeout_s=60)
time.sleep(1.0)
post = {}
for i in range(spec["m"]):
    rid = f"{spec['prefix']}-post-{i:05d}"
    post[rid] = cap(rid)
p.flush()
emit("post", oks=post, stats={k: v for k, v in p.stats().items() if isinstance(v, int)})
sys.stdin.readline()
p.close(); emit("done")
