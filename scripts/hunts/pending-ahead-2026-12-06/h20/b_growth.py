"""b_growth.py: unit-level: cost of record_acknowledged_ahead (per out-of-order ack), file growth, resumer load time,
and whether sample lines crowd failure-event lines out of acknowledged()'s last-ACKED_KEEP-lines window."""
import os, time
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h20/subs"
from hscapture import _subscriptions as S
name = "h20-growth"; p = S._acked_path(name)
if p.exists(): p.unlink()
S.record_acknowledged(name, [("dropped", "victim-rid", "test", "123:4")])
print("event known before:", S.acknowledged(name)[0])
N = 200_000; t0 = time.perf_counter(); sizes = []
for i in range(N):
    S.record_acknowledged_ahead(name, 777, i)
    if i % 50000 == 0: sizes.append(p.stat().st_size)
dt = time.perf_counter() - t0
print(f"{N} out-of-order acks: {dt*1e6/N:.1f} us each; sizes every 50k: {sizes}; final {p.stat().st_size} bytes, {p.read_text().count(chr(10))} lines")
t0 = time.perf_counter(); a = S.acknowledged_ahead(name); ev = S.acknowledged(name); dt = time.perf_counter() - t0
print(f"resumer load: {dt*1e3:.0f} ms, ahead seqs {len(a.get(777, ()))}, min {min(a[777])}; event still known: {ev[0]}")
