"""h16 producer: chunked interleaved rids, aborts/restarts/retries, wait or drop policy, optional defer.
Ledger lines (flushed) in spec['ledger']. Controlled by spec; stdin lines optional."""
import json, os, sys, time, random, signal
from array import array
sys.path.insert(0, "/work/main/tests"); sys.path.insert(0, "/work/main")
import torch
from fault_support import source
from hscapture import Producer
from hscapture._copies import HostRowIds
spec = json.loads(open(sys.argv[1]).read())
H = 32
led = open(spec["ledger"], "a", buffering=1)
def L(**kw): kw["t"] = round(time.monotonic(), 4); led.write(json.dumps(kw) + "\n")
def emit(ev, **kw): print(json.dumps({"event": ev, **kw}), flush=True)
p = Producer(spec["endpoint"], producer_id=spec["pid"], capacity=spec["cap"], full_policy=spec["policy"],
             wait_timeout_s=spec.get("wait", 0.0), heartbeat_interval_s=spec.get("hb", 0.1),
             stage_interval_s=spec.get("stage", 0.0), max_consumers=8, control_reserve=spec.get("cr"))
emit("ready", segment=p.segment)
if spec.get("consumers", 1):
    p.wait_for_consumers(spec.get("consumers", 1), timeout_s=60)
emit("attached")
rng = random.Random(spec.get("seed", 0))
N = spec["n"]; TOK = spec.get("tokens", [4, 8, 16, 24]); CH = spec.get("chunks", [2, 4, 8, 64])
defer = spec.get("defer", False); mode = spec.get("mode", "single")
src = {}
def S(rid, tokens):
    k = (rid, tokens)
    if k not in src:
        t, ids = source(rid, tokens)
        aux = torch.cat(t, dim=1)  # [T, 2H]
        src[k] = (t, ids, aux, array("q", ids.tolist()))
    return src[k]
# request state: rid -> dict(tokens, chunk, pos, att)
pending = [f"r-{i}" for i in range(N)]
inflight = {}
INTER = spec.get("interleave", 4)
kill_after = spec.get("kill_after")  # capture calls
calls = 0
maxdt = 0.0
maxbl = 0
def capture_one(rid, st, s, e):
    t, ids, aux, ida = S(rid, st["tokens"])
    last = e == st["tokens"]
    t0 = time.monotonic()
    if mode == "single":
        ok = bool(p.capture(rid, [a[s:e] for a in t], layers=[0, 1], token_start=s, is_last_chunk=last,
                            token_ids=ids[s:e]))
    else:
        row = {"rid": rid, "token_start": s, "token_count": e - s, "last": last, "cached_prefix": 0,
               "extra": {}, "fields": {}}
        ok = bool(p.capture_rows([row], [s], [aux], layers=[0, 1], token_ids=HostRowIds([(ida, s, e - s)]),
                                 layer_map=[[0, 0], [0, H]], hidden=H, defer=defer))
    dt = time.monotonic() - t0
    L(c=rid, att=st["att"], s=s, e=e, last=last, ok=ok, dt=round(dt, 4))
    return ok, dt
def capture_batch(group):
    # several rids' chunks as one capture_rows call
    rows, starts, parts, auxs = [], [], [], []
    off = 0
    for rid, st, s, e in group:
        t, ids, aux, ida = S(rid, st["tokens"])
        rows.append({"rid": rid, "token_start": s, "token_count": e - s, "last": e == st["tokens"],
                     "cached_prefix": 0, "extra": {}, "fields": {}})
        auxs.append(aux[s:e]); starts.append(off); parts.append((ida, s, e - s)); off += e - s
    blk = torch.cat(auxs, dim=0).contiguous()
    t0 = time.monotonic()
    ok = bool(p.capture_rows(rows, starts, [blk], layers=[0, 1], token_ids=HostRowIds(parts),
                             layer_map=[[0, 0], [0, H]], hidden=H, defer=defer))
    dt = time.monotonic() - t0
    for rid, st, s, e in group:
        L(c=rid, att=st["att"], s=s, e=e, last=e == st["tokens"], ok=ok, dt=round(dt, 4))
    return ok, dt
pace = spec.get("pace", 0.0)
ab_p = spec.get("abort_p", 0.05); rs_p = spec.get("restart_p", 0.05); retry_p = spec.get("retry_p", 0.5)
while pending or inflight:
    while pending and len(inflight) < INTER:
        rid = pending.pop(0)
        inflight[rid] = {"tokens": rng.choice(TOK), "chunk": rng.choice(CH), "pos": 0, "att": 0}
    if mode == "batch":
        k = rng.randint(1, len(inflight))
        group = []
        for rid in rng.sample(sorted(inflight), k):
            st = inflight[rid]; s = st["pos"]; e = min(st["tokens"], s + st["chunk"])
            group.append((rid, st, s, e))
        ok, dt = capture_batch(group)
        done = [(rid, st, e) for rid, st, s, e in group]
    else:
        rid = rng.choice(sorted(inflight)); st = inflight[rid]; s = st["pos"]; e = min(st["tokens"], s + st["chunk"])
        ok, dt = capture_one(rid, st, s, e)
        done = [(rid, st, e)]
    maxdt = max(maxdt, dt)
    bl = p._control.backlog_rows
    if bl > maxbl: maxbl = bl
    calls += 1
    for rid, st, e in done:
        st["pos"] = e
        if e == st["tokens"]:
            del inflight[rid]
        else:
            r = rng.random()
            if r < ab_p:
                p.abort(rid, "client abort"); L(a=rid, att=st["att"], restart=False)
                if rng.random() < retry_p:
                    st["att"] += 1; st["pos"] = 0
                else:
                    del inflight[rid]
            elif r < ab_p + rs_p:
                p.abort(rid, "retract", restart=True); L(a=rid, att=st["att"], restart=True)
                st["att"] += 1; st["pos"] = 0
    if kill_after is not None and calls >= kill_after:
        L(kill=calls); emit("killing", calls=calls, stats={k: v for k, v in p.stats().items() if isinstance(v, int)})
        os.kill(os.getpid(), signal.SIGKILL)
    if pace: time.sleep(pace)
    if spec.get("pub_completed"): p.publish_completed()
emit("captured", calls=calls, maxdt=maxdt, maxbl=maxbl, stats={k: v for k, v in p.stats().items() if isinstance(v, int)})
t0 = time.monotonic()
if spec.get("flush", True):
    try: p.flush(timeout_s=60); emit("flushed", dt=time.monotonic() - t0)
    except Exception as e: emit("flush_error", err=repr(e))
if spec.get("close_on_stdin"):
    sys.stdin.readline()
t0 = time.monotonic(); p.close(); emit("done", dt=time.monotonic() - t0)
