"""Follower process for s3: reads ENDPOINT anonymously until told to stop (file STOPFILE
exists and nothing arrived for 1.5 s), then prints {got: {rid: [n, exact]}, stats}."""
import sys, os, json, time
sys.path.insert(0, "/work/main/tests"); sys.path.insert(0, "/work/main")
from fault_support import check_exact
from hscapture import Subscriber
ep, stopfile, sizes_file = sys.argv[1:4]
sizes = json.load(open(sizes_file))
sub = Subscriber(ep, producer_timeout_s=10.0)
print(json.dumps({"event": "up"}), flush=True)
got = {}; last = time.monotonic()
while True:
    s = sub.poll(0.05)
    if s is not None:
        last = time.monotonic()
        try:
            check_exact(s.tensors, s.token_ids, s.rid, sizes[s.rid]); ok = True
        except Exception as e:
            ok = str(e)[:100]
        got.setdefault(s.rid, []).append(ok)
    elif os.path.exists(stopfile) and time.monotonic() - last > 1.5:
        st = sub.stats()
        if not st["in_flight"] and not st["producers"]:
            break
        if time.monotonic() - last > 15:
            print(json.dumps({'event': 'gave_up_waiting', 'producers': list(st['producers'])}), flush=True)
            break
st = sub.stats()
sub.close()
st2 = sub.stats()
print(json.dumps({"event": "done", "got": got, "stats": {k: st2[k] for k in ("dropped", "incomplete", "rejected", "undelivered", "in_flight", "lost")},
                  "counts": {k: v for k, v in st2.items() if isinstance(v, int) and v}}), flush=True)
