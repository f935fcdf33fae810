"""b_sub.py EP NAME DIR MODE [IDLE]: durable Subscriber. MODE periodic: records failures (fails.jsonl, fsync)
and acknowledges only every ACK_S (random 0.5-2 s per incarnation); never: records at every return, never
acknowledges; get: get(rid) for rids s-i in order, records+acks every ACK_S; final (IDLE given): poll, record+ack
at every return, exits after IDLE s without a sample or failure. Logs give-backs to unpin.log, acks to ack.log."""
import os, sys, json, time, random
os.environ["HSCAPTURE_SUBS_DIR"] = os.environ.get("HSCAPTURE_SUBS_DIR", "/tmp/hunt-h19/subs")
import hscapture, hscapture._holds as _hl
from hscapture.errors import SampleDroppedError, IncompleteSampleError, SampleMismatchError, SampleTimeoutError
ep, name, d, mode = sys.argv[1:5]; idle = float(sys.argv[5]) if len(sys.argv) > 5 else None
ul = open(os.path.join(d, "unpin.log"), "a", buffering=1)
_o = _hl.RecordHolds.bound_failures   # (Delivery._bound_failure_holds until 2026-12-07)
def _b(self, now):
    b = self._owner.ledger.counts["failures_unpinned"]; _o(self, now); n = self._owner.ledger.counts["failures_unpinned"] - b
    if n:
        ul.write("UNPIN %.4f %d log=%d pid=%d pend_rec=%d\n" % (time.time(), n, len(self._owner.ledger.failure_log), os.getpid(), self._owner.ledger.counts["failures_pending_recorded"]))
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
al = open(os.path.join(d, "ack.log"), "a")
got = open(os.path.join(d, "got.txt"), "a"); fl = open(fp, "a"); rec = 0
ack_s = float(os.environ["ACK_S"]) if os.environ.get("ACK_S") else random.uniform(0.5, 2.0); last_ack = time.monotonic()
def record(ack=True):
    global rec, last_ack
    new = sub.failures(rec)
    if new:
        for k, rid, why, ev in new: fl.write(json.dumps({"kind": k, "rid": rid, "event": ev, "why": why[:80], "pid": os.getpid()}) + "\n")
        fl.flush(); os.fsync(fl.fileno()); rec += len(new)
    # (the acknowledged count lives in DurableFailures since eadd912)
    if ack and rec > (sub._durable.acked if sub._durable is not None else 0):
        al.write("%d %d\n" % (os.getpid(), rec)); al.flush(); os.fsync(al.fileno())
        sub.acknowledge_failures(rec)
    last_ack = time.monotonic()
def take(s):
    n = int(s.rid[2:]); ts = list(s.tensors.values())
    ok = len(ts) == 2 and bool((ts[0].float() == float(n % 256)).all()) and bool((ts[1].float() == float(n // 256)).all())
    got.write("%s %d %d\n" % (s.rid, ok, os.getpid())); got.flush(); os.fsync(got.fileno()); s.release()
print("started", os.getpid(), mode, "ack_s=%.2f" % ack_s, flush=True)
last = time.monotonic()
def due(): return time.monotonic() - last_ack > ack_s
if idle:
    while True:
        s = sub.poll(timeout=0.2)
        if s is not None: take(s); last = time.monotonic()
        if sub.failures(rec): last = time.monotonic()
        record()
        if time.monotonic() - last > idle: break
elif mode == "never":
    while True:
        s = sub.poll(timeout=0.2)
        if s is not None: take(s)
        record(ack=False)
elif mode == "periodic":
    while True:
        s = sub.poll(timeout=0.2)
        if s is not None: take(s)
        if due(): record()
else:  # get
    seen = set()
    for p in ("got.txt",):
        for l in open(os.path.join(d, p)).read().split("\n"):
            if l: seen.add(int(l.split()[0][2:]))
    seen |= {int(r[2:]) for r in known.values()}
    i = max(seen) + 1 if seen else 0
    while True:
        try:
            take(sub.get(f"s-{i}", timeout=0.3))
        except (SampleDroppedError, IncompleteSampleError, SampleMismatchError):
            pass
        except SampleTimeoutError:
            while (s := sub.poll(timeout=0)) is not None: take(s)
        i += 1
        if due(): record()
