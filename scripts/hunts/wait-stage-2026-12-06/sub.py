"""h16 subscriber: anonymous or durable (name); logs each sample (exact check) and final stats.
usage: sub.py ENDPOINT OUTFILE IDLE [NAME] [SLEEP_PER_SAMPLE]"""
import json, sys, time
sys.path.insert(0, "/work/main/tests"); sys.path.insert(0, "/work/main")
from fault_support import check_exact
from hscapture import Subscriber
ep, outf, idle = sys.argv[1], sys.argv[2], float(sys.argv[3])
name = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] != "-" else None
slow = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
o = open(outf, "a", buffering=1)
s = Subscriber(ep, name=name) if name else Subscriber(ep)
o.write(json.dumps({"event": "sub_ready"}) + "\n")
last = time.monotonic(); n = 0
while time.monotonic() - last < idle:
    try:
        smp = s.poll(timeout=0.1)
    except Exception as e:
        o.write(json.dumps({"event": "raise", "err": repr(e)[:300]}) + "\n"); continue
    if smp is None: continue
    last = time.monotonic()
    rid = smp.rid; T = int(smp.token_ids.shape[0])
    try:
        check_exact(smp.tensors, smp.token_ids, rid, T); ok = True
    except AssertionError as e: ok = repr(e)[:200]
    o.write(json.dumps({"event": "sample", "rid": rid, "T": T, "exact": ok, "seqs": smp.meta.get("seqs")}) + "\n")
    n += 1
    if slow: time.sleep(slow)
s.close()
st = s.stats()
o.write(json.dumps({"event": "stats", "stats": st}, default=str) + "\n")
