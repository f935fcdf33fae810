"""area 2 anonymous subscriber process: prints each sample (exact or not) and at the end its stats."""
import json, sys, time
sys.path.insert(0, "/work/main/tests"); sys.path.insert(0, "/work/main")
from fault_support import check_exact
from hscapture import Subscriber
ep, idle = sys.argv[1], float(sys.argv[2])
sizes = {"x-0": 16}
s = Subscriber(ep)
print(json.dumps({"event": "sub_ready"}), flush=True)
last = time.monotonic(); got = []
while time.monotonic() - last < idle:
    smp = s.poll(timeout=0.1)
    if smp is None: continue
    last = time.monotonic()
    rid = smp.rid
    try:
        check_exact(smp.tensors, smp.token_ids, rid, sizes.get(rid, 8)); ok = True
    except AssertionError as e: ok = repr(e)[:200]
    print(json.dumps({"event": "sample", "rid": rid, "exact": ok}), flush=True)
s.close()
st = s.stats()
print(json.dumps({"event": "stats", "stats": {k: v for k, v in st.items()}}, default=str), flush=True)
