"""python drainwrap.py HLLOG drain ARGS...: `hscapture drain` with HeadlessSamples decisions logged to HLLOG."""
import os, sys
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h14/subs"
sys.path.insert(0, "/work/main")
log = open(sys.argv[1], "a", buffering=1); sys.argv = ["hscapture"] + sys.argv[2:]
log.write("START %d\n" % os.getpid())
import hscapture._headless as _hl
_orow, _orep = _hl.HeadlessSamples.row, _hl.HeadlessSamples._report
def _row(self, src, record, key, rv):
    held = key in self._held
    r = _orow(self, src, record, key, rv)
    log.write("HL %s seq=%d last=%d ts=%d ack=%d cb=%d held_before=%d ->%s now_held=%d\n" % (key[1], rv.seq, bool(rv.last), rv.token_start,
              src.settlement.acknowledged_below, src.settlement.continuations_below, held, r, key in self._held))
    return r
def _rep(self, key):
    log.write("HLREP %s %s\n" % (key[1], self._held[key][1:4]))
    return _orep(self, key)
_hl.HeadlessSamples.row, _hl.HeadlessSamples._report = _row, _rep
import time, hscapture._delivery as _dl
_obfh = _dl.Delivery._bound_failure_holds
def _bfh(self, now):
    before = self.ledger.counts["failures_unpinned"]
    hs = list(self._failure_holds)
    _obfh(self, now)
    d = self.ledger.counts["failures_unpinned"] - before
    if d:
        gone = [h for h in hs if h not in self._failure_holds]
        c = gone[0].src.consumer
        log.write("UNPIN %.3f n=%d positions=%s..%s consumer_pos=%s cap=%s ages=%.3f..%.3f log=%d\n" % (time.time(), d, gone[0].position, gone[-1].position,
                  c.position if c is not None else None, c.capacity if c is not None else None, now - gone[0].since, now - gone[-1].since, len(self.ledger.failure_log)))
_dl.Delivery._bound_failure_holds = _bfh
if os.environ.get("TRACE_ROWS"):
    D = _dl.Delivery
    _okr, _ofail, _ow, _oa, _oab = D._on_kept_row, D.fail, D._whole, D._assemble, D._abort
    def _kr(self, src, record, meta, shape, rv):
        log.write("ROW %s seq=%d ts=%d n=%d last=%d pos=%d\n" % (rv.rid, rv.seq, rv.token_start, rv.token_count, bool(rv.last), record.position))
        return _okr(self, src, record, meta, shape, rv)
    def _fl(self, key, reason, kind, event=None):
        log.write("FAIL %s %s %s %s\n" % (key[1], kind, event, reason[:60]))
        return _ofail(self, key, reason, kind, event)
    def _wh(self, src, record, meta, shape, rid, seq, *a, **k):
        got = _ow(self, src, record, meta, shape, rid, seq, *a, **k)
        log.write("WHOLE %s seq=%d got=%s\n" % (rid, seq, got))
        return got
    def _as(self, src, p, holds):
        log.write("ASSEMBLE %s\n" % (p.key[1],))
        return _oa(self, src, p, holds)
    def _ab(self, src, entry):
        r = _oab(self, src, entry)
        log.write("ABORT %s seq=%d restart=%s reported=%s\n" % (entry.meta["rid"], entry.seq, entry.meta["restart"], r))
        return r
    D._on_kept_row, D.fail, D._whole, D._assemble, D._abort = _kr, _fl, _wh, _as, _ab
    import hscapture._ledger as _lg
    _ona, _okf = _lg.Ledger.new_attempt, _lg.Ledger.known_failed
    def _na(self, key):
        log.write("NEWATT %s\n" % (key[1],)); return _ona(self, key)
    def _kf(self, key, seq=None):
        log.write("KNOWN %s %s\n" % (key[1], seq)); return _okf(self, key, seq)
    _lg.Ledger.new_attempt, _lg.Ledger.known_failed = _na, _kf
from hscapture.cli import main
main()
