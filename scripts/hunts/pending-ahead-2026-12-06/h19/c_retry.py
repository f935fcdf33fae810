"""c_retry.py CASE(nonutf8|superscript): corrupt pending file holding good lines r1 (1:5), r2 (1:6); first poll raises;
does a second poll (the caller catching the error and going on) report r1/r2? then close, and a resumer?"""
import os, sys, json
os.environ.setdefault("HSCAPTURE_SUBS_DIR", "/tmp/hunt-h19/subs")
import hscapture
from hscapture import _subscriptions as S
case = sys.argv[1]; name = f"h19-cr-{case}-{os.getpid()}"
good = lambda rid, ev: (json.dumps({"kind": "dropped", "rid": rid, "reason": "ring full (drop)", "event": ev}) + "\n").encode()
bad = b'\xff\n' if case == "nonutf8" else good("r9", "\u00b2:1")
S._pending_path(name).write_bytes(good("r1", "1:5") + bad + good("r2", "1:6"))
ep = f"ipc:///tmp/hunt-h19/ep/cr-{case}.sock"
for inc in range(2):
    sub = hscapture.Subscriber(ep, name=name)
    for i in range(2):
        try: sub.poll(timeout=0.1); print(inc, "poll", i, "ok")
        except Exception as e: print(inc, "poll", i, "EXC", type(e).__name__, e)
    print(inc, "failures:", sub.failures(), "dropped:", sub.dropped, "file:", S._pending_path(name).exists())
    sub.close()
