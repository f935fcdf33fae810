"""a_prod.py SPEC: chunked interleaved samples r-N: K rids open at once, each CH chunks of T tokens,
entries hold 1..3 rows of different rids (capture_batch); some rids aborted mid-way (ABORT prob).
float32 values rid*1000+pos in every layer; token ids the same. Prints ready, then done with per-rid status."""
import os, sys, json, time, random
os.environ.setdefault("HSCAPTURE_SUBS_DIR", "/tmp/hunt-h21/subs")
import torch, hscapture
from hscapture.producer import Row
spec = json.loads(sys.argv[1])
rnd = random.Random(spec.get("seed", 1))
p = hscapture.Producer(spec["ep"], producer_id=spec["pid"], capacity=spec["cap"], full_policy=spec.get("policy", "drop"),
                       wait_timeout_s=spec.get("wait", 0.0), heartbeat_interval_s=0.05)
print(json.dumps({"event": "ready"}), flush=True)
from hscapture.ring import segment_info
DN = spec["durable_name"]; trans = []; last_state = [None]
def slot_state():
    try: info = segment_info(p.segment)
    except Exception as ex: return "err:" + type(ex).__name__
    st = [f"{c.get('state')}/{'d' if c.get('durable') else 'a'}/{c.get('alive')}" for c in info["consumers"] if c.get("name") == DN and c.get("durable")]
    return ",".join(st) if st else "none"
def note(e):
    s = slot_state()
    if s != last_state[0]: trans.append((e, time.monotonic(), s)); last_state[0] = s
    return s
waited = p.wait_for_consumers(1, timeout_s=60)
note(-1)
at = {}   # rid -> list of slot states at each of its chunk captures / abort
T, H, CH, K = spec.get("T", 4), spec.get("H", 32), spec.get("CH", 3), spec.get("K", 4)
nrid = spec["n"]; rate = spec["rate"]; abort_p = spec.get("abort", 0.0)
open_ = {}  # rid number -> next chunk
nxt = 0; status = {}; t0 = time.monotonic(); e = 0
def vals(n, start, cnt):
    return torch.arange(start, start + cnt, dtype=torch.float32) + n * 1000
while nxt < nrid or open_:
    while len(open_) < K and nxt < nrid:
        open_[nxt] = 0; nxt += 1
    pick = rnd.sample(sorted(open_), min(len(open_), rnd.randint(1, 3)))
    if abort_p and rnd.random() < abort_p:
        victim = pick.pop()
        p.abort(f"r-{victim}", "test abort"); status[f"r-{victim}"] = "aborted"; del open_[victim]
        at.setdefault(f"r-{victim}", []).append("A:" + note(e))
        if not pick: continue
    rows, cols, ids = [], [], []
    src = 0
    for n in pick:
        c = open_[n]; last = c == CH - 1
        rows.append(Row(f"r-{n}", src, T, token_start=c * T, last=last))
        v = vals(n, c * T, T); cols.append(v); src += T
    col = torch.cat(cols)
    blocks = [col[:, None].expand(-1, H).contiguous(), (col[:, None].expand(-1, H) + 0.5).contiguous()]
    ok = p.capture_batch(rows, blocks, layers=[0, 1], token_ids=col.to(torch.int64))
    sst = note(e)
    for n in pick: at.setdefault(f"r-{n}", []).append(sst)
    for n in pick:
        c = open_[n]
        if not ok: status[f"r-{n}"] = "dropped"; del open_[n]; continue
        if c == CH - 1: status[f"r-{n}"] = "ok"; del open_[n]
        else: open_[n] = c + 1
    e += 1
    ahead = t0 + e / rate - time.monotonic()
    if ahead > 0: time.sleep(ahead)
p.flush()
st = {k: v for k, v in p.stats().items() if isinstance(v, (int, float))}
note(e)
print(json.dumps({"event": "done", "status": status, "stats": st, "waited": waited, "at": at, "trans": trans,
                  "consumers_sample": segment_info(p.segment)["consumers"][:4]}, default=str), flush=True)
sys.stdin.readline()
st2 = {k: v for k, v in p.stats().items() if isinstance(v, (int, float))}
print(json.dumps({"event": "after", "stats": st2, "slot": slot_state()}), flush=True)
p.close()
