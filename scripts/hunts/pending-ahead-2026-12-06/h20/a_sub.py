"""a_sub.py EP NAME DIR MODE ZC [IDLE]: durable Subscriber, logs to DIR/got.log: 'G rid pid ok' (fsync, BEFORE release)
and 'R rid pid' (fsync, after release returned). MODE get: get(rid) of queued rids in random order, plus get of
not-yet-complete rids; batch: poll a batch of N, release shuffled, hold some across batches; final (IDLE): poll+release
until IDLE s without anything. Failures recorded in fails.jsonl (fsync) then acknowledged. Random self-SIGKILL between
G and R with prob KILLP."""
import os, sys, json, time, random, signal
import torch, hscapture
from hscapture.errors import SampleDroppedError, IncompleteSampleError, SampleMismatchError, SampleTimeoutError
ep, name, d, mode, zc = sys.argv[1:6]; zc = zc == "1"; idle = float(sys.argv[6]) if len(sys.argv) > 6 else None
killp = float(os.environ.get("KILLP", "0"))
known = {}
fp = os.path.join(d, "fails.jsonl")
if os.path.exists(fp):
    for l in open(fp).read().split("\n")[:-1]:
        try: j = json.loads(l)
        except ValueError: continue
        if j["event"]: known[j["event"]] = j["rid"]
sub = hscapture.Subscriber(ep, name=name, zero_copy=zc)
sub.known_failures(known)
g = open(os.path.join(d, "got.log"), "a"); fl = open(fp, "a"); rec = 0; pid = os.getpid()
def w(f, s): f.write(s); f.flush(); os.fsync(f.fileno())
def record():
    global rec
    new = sub.failures(rec)
    if new:
        w(fl, "".join(json.dumps({"kind": k, "rid": rid, "event": ev, "why": why[:80], "pid": pid}) + "\n" for k, rid, why, ev in new))
        rec += len(new); sub.acknowledge_failures(rec)
def check(s):
    n = int(s.rid[2:]); t = s.tensors
    ok = s.num_tokens > 0 and torch.equal(s.token_ids.to(torch.int64), torch.arange(s.num_tokens) + n * 1000)
    ts = list(t.values())
    ok = ok and len(ts) == 2 and torch.equal(ts[0][:, 0], torch.arange(s.num_tokens, dtype=torch.float32) + n * 1000) \
        and torch.equal(ts[1][:, 0], torch.arange(s.num_tokens, dtype=torch.float32) + n * 1000 + 0.5)
    return ok
def took(s): w(g, "G %s %d %d %d\n" % (s.rid, pid, check(s), s.num_tokens))
def release(s):
    if killp and random.random() < killp: os.kill(pid, signal.SIGKILL)
    s.release(); w(g, "R %s %d\n" % (s.rid, pid))
w(g, "S %d %s\n" % (pid, mode))
held = []
if idle:
    last = time.monotonic()
    while True:
        s = sub.poll(timeout=0.2)
        if s is not None: took(s); release(s); last = time.monotonic()
        if sub.failures(rec): last = time.monotonic()
        record()
        if time.monotonic() - last > idle: break
    w(g, "E %d\n" % pid); sub.close(); sys.exit(0)
rnd = random.Random()
nextget = 0
while True:
    if mode == "get":
        sub.pump(0.05)
        rids = [s.rid for s in sub._delivery.ready]
        rnd.shuffle(rids)
        # also a future rid or two (not yet complete)
        if rnd.random() < 0.3: rids.append(f"r-{nextget + rnd.randint(0, 6)}")
        for rid in rids[:rnd.randint(1, 8)]:
            try: s = sub.get(rid, timeout=0.1)
            except (SampleDroppedError, IncompleteSampleError, SampleMismatchError, SampleTimeoutError): continue
            took(s); nextget = max(nextget, int(rid[2:]) + 1)
            if rnd.random() < 0.2: held.append((s, time.monotonic() + rnd.uniform(0.1, 1.5)))
            else: release(s)
        if rnd.random() < 0.1:   # sometimes a plain poll
            s = sub.poll(timeout=0)
            if s is not None: took(s); release(s)
    else:
        batch = []
        n = rnd.randint(1, 12); t_end = time.monotonic() + 0.5
        while len(batch) < n and time.monotonic() < t_end:
            s = sub.poll(timeout=0.05)
            if s is not None: took(s); batch.append(s)
        rnd.shuffle(batch)
        for s in batch:
            if rnd.random() < 0.2: held.append((s, time.monotonic() + rnd.uniform(0.1, 1.5)))
            else:
                release(s)
                if rnd.random() < 0.1: time.sleep(0.01)
    now = time.monotonic()
    due = [h for h in held if h[1] <= now]; held = [h for h in held if h[1] > now]
    rnd.shuffle(due)
    for s, _ in due: release(s)
    record()
