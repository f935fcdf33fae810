"""c_prod.py SPECJSON: a producer capturing whole one-chunk samples at RATE/s (0: as fast as it can)
for DUR seconds; prints one JSON line per 0.25 s window: ok, dropped, max/total capture seconds."""
import os, sys, json, time
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h15/subs"
sys.path.insert(0, "/work/main")
import torch, hscapture
spec = json.loads(sys.argv[1])
p = hscapture.Producer(spec["ep"], producer_id=spec["pid"], capacity=spec["cap"], full_policy=spec["policy"],
                       wait_timeout_s=spec.get("wait", 0.0), heartbeat_interval_s=0.05)
print(json.dumps({"event": "ready"}), flush=True)
p.wait_for_consumers(1, timeout_s=60)
T, H = spec.get("tokens", 16), spec.get("hidden", 64)
x = [torch.randn(T, H, dtype=torch.bfloat16) for _ in range(2)]; ids = torch.arange(T)
rate = spec.get("rate", 0); dur = spec["dur"]
t0 = time.monotonic(); n = 0; win = {"ok": 0, "drop": 0, "max": 0.0, "tot": 0.0}; wstart = t0
while time.monotonic() - t0 < dur:
    a = time.monotonic()
    ok = p.capture(f"s-{n}", x, layers=[0, 1], token_ids=ids)
    b = time.monotonic(); d = b - a
    win["ok" if ok else "drop"] += 1; win["max"] = max(win["max"], d); win["tot"] += d
    n += 1
    if b - wstart >= 0.25:
        print(json.dumps({"t": round(b - t0, 3), **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in win.items()}}), flush=True)
        win = {"ok": 0, "drop": 0, "max": 0.0, "tot": 0.0}; wstart = b
    if rate:
        ahead = t0 + n / rate - time.monotonic()
        if ahead > 0: time.sleep(ahead)
p.flush()
st = {k: v for k, v in p.stats().items() if isinstance(v, (int, float))}
print(json.dumps({"event": "done", "n": n, "stats": st}), flush=True)
sys.stdin.readline()
p.close()
