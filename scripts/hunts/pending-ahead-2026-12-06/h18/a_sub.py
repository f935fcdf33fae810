"""a_sub.py EP NAME DIR MODE [IDLE]: a durable Subscriber recording every delivered rid (got.txt) and
every failure (fails.jsonl) with fsync at every return of poll() (MODE poll) or every yield of
samples() (MODE samples), acknowledging right after. Logs failure-hold give-backs to unpin.log.
IDLE: exit after IDLE s without a sample (final run)."""
import os, sys, json, time
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h18/subs"
import hscapture, hscapture._holds as _hl
ep, name, d, mode = sys.argv[1:5]; idle = float(sys.argv[5]) if len(sys.argv) > 5 else None
ul = open(os.path.join(d, "unpin.log"), "a", buffering=1)
_o = _hl.RecordHolds.bound_failures   # (Delivery._bound_failure_holds until 2026-12-07)
def _b(self, now):
    b = self._owner.ledger.counts["failures_unpinned"]; hs = list(self._failures); _o(self, now); n = self._owner.ledger.counts["failures_unpinned"] - b
    if n:
        gone = [h for h in hs if h not in self._failures]; src = gone[0].src; c = src.consumer
        ul.write("UNPIN %.4f %d %d pid=%d gone=%s..%s released=%s oldest=%s pos=%s kept=%d\n" % (time.time(), n, len(self._owner.ledger.failure_log), os.getpid(),
                 gone[0].position, gone[-1].position, c.released if c else None, src.borrowed.oldest(), c.position if c else None, len(self._failures)))
_hl.RecordHolds.bound_failures = _b
known = {}
fp = os.path.join(d, "fails.jsonl")
if os.path.exists(fp):
    for l in open(fp).read().split("\n")[:-1]:
        try: j = json.loads(l)
        except ValueError: continue
        if j["event"]: known[j["event"]] = j["rid"]
sub = hscapture.Subscriber(ep, name=name)
sub.known_failures(known)
got = open(os.path.join(d, "got.txt"), "a"); fl = open(fp, "a"); rec = 0
def record():
    global rec
    new = sub.failures(rec)
    if new:
        for k, rid, why, ev in new: fl.write(json.dumps({"kind": k, "rid": rid, "event": ev, "why": why[:80], "pid": os.getpid()}) + "\n")
        fl.flush(); os.fsync(fl.fileno()); rec += len(new); sub.acknowledge_failures(rec)
def take(s):
    n = int(s.rid[2:]); ts = list(s.tensors.values())
    ok = len(ts) == 2 and bool((ts[0].float() == float(n % 256)).all()) and bool((ts[1].float() == float(n // 256)).all())
    got.write("%s %d\n" % (s.rid, ok)); got.flush(); os.fsync(got.fileno()); s.release()
print("started", flush=True)
last = time.monotonic()
if mode == "poll":
    while True:
        s = sub.poll(timeout=0.2)
        if s is not None: take(s); last = time.monotonic()
        if sub.failures(rec): last = time.monotonic()
        record()
        if idle and time.monotonic() - last > idle: break
else:
    for s in sub.samples(timeout=idle or 1e9):
        take(s); record()
    record()
st = sub.stats(); sub.close()
print(json.dumps({"final": True, "lost": st["lost"], "unresolved": st["unresolved"], "in_flight": st["in_flight"], "undelivered": st["undelivered"]}), flush=True)
