"""abort(): long reasons, extras near the control headroom, control_reserve choices; an anonymous
subscriber must name each aborted rid once, with the (clipped) reason."""
import os, sys, json, uuid, time
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h14/subs"
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/work/main/tests")
import torch, hscapture
from fault_support import source
d = f"/tmp/hunt-h14/ep/{uuid.uuid4().hex[:8]}"; os.makedirs(d, mode=0o700); ep = f"ipc://{d}/p.sock"
cr = os.environ.get("CR"); cr = None if cr in (None, "") else int(cr)
p = hscapture.Producer(ep, producer_id=f"h14ab-{uuid.uuid4().hex[:4]}", capacity=int(os.environ.get("CAP", 65536)), full_policy="drop",
                       wait_timeout_s=0.0, heartbeat_interval_s=0.05, **({"control_reserve": cr} if cr is not None else {}))
print("control_reserve", p._ring.control_reserve)
s = hscapture.Subscriber(ep, incomplete_timeout_s=3) if hasattr(hscapture, "Subscriber") else None
[s.poll(0.1) for _ in range(10)]; print("attached", p.stats().get("consumers"))
res = {}
for i, (rl, ex) in enumerate([(10, 0), (5000, 0), (100000, 0), (10, 500), (10, p._ring.control_reserve // 2), (10, p._ring.control_reserve - 300), (10, p._ring.control_reserve)]):
    rid = f"a-{i}"
    t, ids = source(rid, 8)
    p.capture(rid, [x[:4] for x in t], layers=[0, 1], token_start=0, is_last_chunk=False, token_ids=ids[:4])
    try:
        p.abort(rid, "R" * rl, extra={"blob": "x" * ex} if ex else None); res[rid] = "aborted"
    except Exception as e:
        res[rid] = "refused: " + str(e)[:120]
    # fill a bit to force backlog
    for j in range(20):
        r2 = f"f-{i}-{j}"; t2, ids2 = source(r2, 8)
        p.capture(r2, list(t2), layers=[0, 1], token_start=0, is_last_chunk=True, token_ids=ids2)
p.flush()
got = []
t0 = time.time()
while time.time() - t0 < 6:
    x = s.poll(0.5)
    if x is not None: got.append(x.rid)
st = s.stats()
print(json.dumps(res, indent=0))
inc = st.get("incomplete") or {}
print("incomplete:", {k: (len(v), v[:60]) for k, v in inc.items()})
print("dropped:", len(st.get("dropped") or {}), "lost:", st.get("lost"), "got:", len(got), "pstats:", {k: v for k, v in p.stats().items() if k in ("aborted", "dropped", "unrecorded", "backlog", "errors")})
p.close(); s.close()
