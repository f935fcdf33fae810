import os, sys, json, time
class _TS:
    def __init__(s, f): s.f = f
    def write(s, x):
        return s.f.write("".join(("%.3f " % time.time()) + l if l.strip() else l for l in x.splitlines(True)))
    def flush(s): s.f.flush()
sys.stderr = _TS(sys.stderr)
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h10/subs"
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
import hscapture
from fault_support import check_exact
ep, name, log, idle = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
sizes = json.load(open(sys.argv[5]))
f = open(log, "a", buffering=1); f.write("START %d\n" % os.getpid())
s = hscapture.stream(ep, name=name, idle_timeout_s=idle, prefetch=4)
for x in s:
    f.write("GOT " + x.rid + " %.3f\n" % time.time())
    try: check_exact(x.tensors, x.token_ids, x.rid, sizes[x.rid])
    except AssertionError as e: f.write("BAD " + x.rid + "\n")
f.write("REPORT " + json.dumps(s.report(), default=str) + "\n")
