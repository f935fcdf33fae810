"""a_prod.py SPECJSON: whole one-chunk samples s-0.. at RATE/s for DUR s (drop policy, small ring);
prints ready, then done with every rid's capture() result; closes on a stdin line."""
import os, sys, json, time
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h18/subs"
import torch, hscapture
spec = json.loads(sys.argv[1])
p = hscapture.Producer(spec["ep"], producer_id=spec["pid"], capacity=spec["cap"], full_policy=spec.get("policy", "drop"),
                       wait_timeout_s=spec.get("wait", 0.0), heartbeat_interval_s=0.05)
print(json.dumps({"event": "ready"}), flush=True)
p.wait_for_consumers(1, timeout_s=60)
T, H = spec.get("tokens", 16), spec.get("hidden", 96)
ids = torch.arange(T)
rate = spec["rate"]; dur = spec["dur"]; t0 = time.monotonic(); n = 0; res = {}
while time.monotonic() - t0 < dur:
    x = [torch.full((T, H), float(n % 256), dtype=torch.bfloat16), torch.full((T, H), float(n // 256), dtype=torch.bfloat16)]
    res[f"s-{n}"] = bool(p.capture(f"s-{n}", x, layers=[0, 1], token_ids=ids)); n += 1
    ahead = t0 + n / rate - time.monotonic()
    if ahead > 0: time.sleep(ahead)
p.flush()
st = {k: v for k, v in p.stats().items() if isinstance(v, (int, float))}
print(json.dumps({"event": "done", "n": n, "ok": sum(res.values()), "res": res, "stats": st}), flush=True)
sys.stdin.readline()
p.close()
