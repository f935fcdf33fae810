import os, sys, json, time
class _TS:
    def __init__(s, f): s.f = f
    def write(s, x):
        return s.f.write("".join(("%.3f " % time.time()) + l if l.strip() else l for l in x.splitlines(True)))
    def flush(s): s.f.flush()
sys.stderr = _TS(sys.stderr)
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h14/subs"
from pathlib import Path
sys.path.insert(0, str(Path("/work/main") / "tests"))
import hscapture
from fault_support import check_exact
ep, name, log, idle = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
sizes = json.load(open(sys.argv[5]))
f = open(log, "a", buffering=1); f.write("START %d\n" % os.getpid())
import hscapture._headless as _hl
_orow, _orep = _hl.HeadlessSamples.row, _hl.HeadlessSamples._report
def _row(self, src, record, key, rv):
    held = key in self._held
    r = _orow(self, src, record, key, rv)
    f.write("HL %s seq=%d last=%d ts=%d ack=%d cb=%d held_before=%d ->%s now_held=%d\n" % (key[1], rv.seq, bool(rv.last), rv.token_start,
            src.settlement.acknowledged_below, src.settlement.continuations_below, held, r, key in self._held))
    return r
def _rep(self, key):
    f.write("HLREP %s %s\n" % (key[1], self._held[key][1:4]))
    return _orep(self, key)
_hl.HeadlessSamples.row, _hl.HeadlessSamples._report = _row, _rep
import hscapture._delivery as _dl
_obfh = _dl.Delivery._bound_failure_holds
def _bfh(self, now):
    before = self.ledger.counts["failures_unpinned"]
    hs = list(self._failure_holds)
    _obfh(self, now)
    d = self.ledger.counts["failures_unpinned"] - before
    if d:
        gone = [h for h in hs if h not in self._failure_holds]
        c = gone[0].src.consumer
        f.write("UNPIN %.3f n=%d positions=%s..%s consumer_pos=%s cap=%s ages=%.3f..%.3f log=%d\n" % (time.time(), d, gone[0].position, gone[-1].position,
                c.position if c is not None else None, c.capacity if c is not None else None, now - gone[0].since, now - gone[-1].since, len(self.ledger.failure_log)))
_dl.Delivery._bound_failure_holds = _bfh
if os.environ.get("TRACE_ROWS"):
    D = _dl.Delivery
    _okr, _ofail = D._on_kept_row, D.fail
    def _kr(self, src, record, meta, shape, rv):
        f.write("ROW %s seq=%d ts=%d last=%d failed_known=%s\n" % (rv.rid, rv.seq, rv.token_start, bool(rv.last), self.ledger.failed_at((src.epoch, rv.rid)) if self.ledger.has_failed((src.epoch, rv.rid)) else "-"))
        return _okr(self, src, record, meta, shape, rv)
    def _fl(self, key, reason, kind, event=None):
        f.write("FAIL %s %s %s %s\n" % (key[1], kind, event, reason[:50]))
        return _ofail(self, key, reason, kind, event)
    D._on_kept_row, D.fail = _kr, _fl
s = hscapture.stream(ep, name=name, idle_timeout_s=idle, prefetch=4)
for x in s:
    f.write("GOT " + x.rid + " %.3f\n" % time.time())
    try: check_exact(x.tensors, x.token_ids, x.rid, sizes[x.rid])
    except AssertionError as e: f.write("BAD " + x.rid + "\n")
f.write("REPORT " + json.dumps(s.report(), default=str) + "\n")
