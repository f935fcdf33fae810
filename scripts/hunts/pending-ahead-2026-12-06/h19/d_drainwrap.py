"""d_drainwrap.py LOG ARGS...: `hscapture ARGS` with failure-hold give-backs and pending writes logged to LOG."""
import os, sys, time
os.environ.setdefault("HSCAPTURE_SUBS_DIR", "/tmp/hunt-h19/subs")
log = open(sys.argv[1], "a", buffering=1); sys.argv = ["hscapture"] + sys.argv[2:]
log.write("START %d\n" % os.getpid())
import hscapture._delivery as _dl, hscapture._durable_failures as _df
_o = _dl.Delivery._bound_failure_holds
def _b(self, now):
    b = self.ledger.counts["failures_unpinned"]; _o(self, now); n = self.ledger.counts["failures_unpinned"] - b
    if n: log.write("UNPIN %.4f %d log=%d pid=%d pend_rec=%d\n" % (time.time(), n, len(self.ledger.failure_log), os.getpid(), self.ledger.counts["failures_pending_recorded"]))
_dl.Delivery._bound_failure_holds = _b
# (Subscriber._read_pending until eadd912: DurableFailures.read_pending since)
_orp = _df.DurableFailures.read_pending
def _rp(self):
    _orp(self); log.write("PENDREAD pid=%d n=%d events=%s\n" % (os.getpid(), self.ledger.counts["failures_pending_read"], sorted(f[3] for f in self.pending)[:50]))
_df.DurableFailures.read_pending = _rp
from hscapture.cli import main
main()
