"""Threaded producer: T capture threads doing chunked samples continuously, optional CPU
spinner threads (GIL contention), for D seconds; logs every chunk's seq at the end."""
import json, os, sys, threading, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from fault_support import source, LAYERS
from hscapture import Producer

def emit(ev, **kw):
    print(json.dumps({"event": ev, **kw}), flush=True)

spec = json.load(open(sys.argv[1]))
p = Producer(spec["endpoint"], producer_id=spec.get("producer_id", "hr"), **spec.get("kw", {}),
             capacity=spec.get("capacity", 1 << 22), full_policy=spec.get("policy", "drop"),
             heartbeat_interval_s=spec.get("hb", 0.05), max_consumers=spec.get("max_consumers", 16))
emit("ready", epoch=p.epoch, segment=p.segment, pid=os.getpid())
log = []
seqlog = []   # (seq, rid, token_start, token_count) of every row that took a number, under the producer lock
E = p._entries
_orig = E.capture_locked
def _wrapped(row_maps, *a, **k):
    seq = E.next_seq
    r = _orig(row_maps, *a, **k)
    if E.next_seq != seq:
        for i, m in enumerate(row_maps):
            seqlog.append((seq + i, m["rid"], m["token_start"], m["token_count"]))
    return r
E.capture_locked = _wrapped
lock = threading.Lock()
stop = time.monotonic() + spec["dur"]
pre = {}
def worker(t):
    k = 0
    while time.monotonic() < stop:
        rid = f"t{t}-{k}"; k += 1
        tokens = spec.get("tokens", 12); ch = spec.get("ch", 4)
        tensors, ids = source(rid, tokens)
        for s in range(0, tokens, ch):
            e = min(tokens, s + ch)
            with lock:   # (only to read the seq the capture takes: numbers are taken under the producer lock)
                pass
            seq_before = p.stats()["next_seq"]
            ok = p.capture(rid, [x[s:e] for x in tensors], layers=LAYERS, token_start=s,
                           is_last_chunk=e == tokens, token_ids=ids[s:e])
            with lock:
                log.append(dict(rid=rid, start=s, end=e, last=e == tokens, ok=bool(ok), seq_hint=seq_before, epoch=p.epoch))
            if spec.get("gap"):
                time.sleep(spec["gap"])
def spinner():
    x = 0
    while time.monotonic() < stop:
        x += 1
ths = [threading.Thread(target=worker, args=(t,)) for t in range(spec.get("threads", 3))]
ths += [threading.Thread(target=spinner) for _ in range(spec.get("spin", 1))]
for t in ths: t.start()
for t in ths: t.join()
p.flush()
time.sleep(0.3)
p.close()
emit("closed", caps=log, seqs=seqlog, stats={k: v for k, v in p.stats().items() if k != "ring"})
