"""A producer process: runs a JSON plan of ops; prints events."""
import json, os, signal, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from fault_support import source, LAYERS
from hscapture import Producer

def emit(ev, **kw):
    print(json.dumps({"event": ev, **kw}), flush=True)

spec = json.load(open(sys.argv[1]))
p = Producer(spec["endpoint"], producer_id=spec.get("producer_id", "hr"), **spec.get("kw", {}),
             capacity=spec.get("capacity", 1 << 20), full_policy=spec.get("policy", "drop"),
             heartbeat_interval_s=spec.get("hb", 0.05), max_consumers=spec.get("max_consumers", 8))
emit("ready", epoch=p.epoch, segment=p.segment, pid=os.getpid())
# injected delays, inert until the ops "slow" / "slowcommit" arm them for one use: the
# capturing thread descheduled between ring.reserve (head moves) and the segment header's
# store_taken; the publishing thread between ring.commit and the entry notice's send
SLOW = [0.0]
SLOWC = [0.0]
_E = p._entries
_orig_reserve = _E.reserve
def _reserve(length, tag):
    pos = _orig_reserve(length, tag)
    if SLOW[0]:
        d, SLOW[0] = SLOW[0], 0.0
        emit("reserved", position=pos)
        time.sleep(d)
    return pos
_E.reserve = _reserve
class _RingProxy:
    def __init__(self, real): self._real = real
    def __getattr__(self, k): return getattr(self._real, k)
    def commit(self, position):
        self._real.commit(position)
        if SLOWC[0]:
            d, SLOWC[0] = SLOWC[0], 0.0
            time.sleep(d)
p._announcer.ring = _RingProxy(p._announcer.ring)
pending = []
def chunk(rid, tokens, s, e):
    tensors, ids = source(rid, tokens)
    seq = p.stats()["next_seq"]
    ok = p.capture(rid, [t[s:e] for t in tensors], layers=LAYERS, token_start=s,
                   is_last_chunk=e == tokens, token_ids=ids[s:e])
    pending.append(dict(rid=rid, start=s, end=e, last=e == tokens, ok=bool(ok), seq=seq, epoch=p.epoch))
for op in spec["plan"]:
    k = op[0]
    if k == "cap":
        _, rid, tokens, ch = op
        for s in range(0, tokens, ch):
            chunk(rid, tokens, s, min(tokens, s + ch))
    elif k == "chunk":
        chunk(*op[1:])
    elif k == "abort":
        seq = p.stats()["next_seq"]
        p.abort(op[1], "test", restart=bool(op[2]))
        pending.append(dict(kind="abort", rid=op[1], restart=bool(op[2]), seq=seq, epoch=p.epoch))
    elif k == "flush":
        p.flush()
        emit("flushed", caps=pending)
        pending = []
    elif k == "emit":
        emit(op[1])
    elif k == "stdin":
        sys.stdin.readline()
    elif k == "consumers":
        p.wait_for_consumers(op[1], timeout_s=60)
    elif k == "slow":
        SLOW[0] = op[1]
    elif k == "slowcommit":
        SLOWC[0] = op[1]
    elif k == "flush_no":
        emit("capd", caps=pending)
    elif k == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif k == "sleep":
        time.sleep(op[1])
    elif k == "stats":
        emit("stats", stats={k2: v for k2, v in p.stats().items() if k2 != "ring"}, ring=p.stats()["ring"])
p.close()
emit("closed")
