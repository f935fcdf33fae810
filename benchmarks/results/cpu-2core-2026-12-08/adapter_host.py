"""Host time of the transformers adapter's capture after a forward, on the CPU machine.

    .venv/bin/python benchmarks/results/cpu-2core-2026-12-08/adapter_host.py B S CHUNK

A tiny random Llama (bf16, 4 layers, hidden 256), B rows of S tokens (no padding), layers
0-2 + the final norm, CHUNK tokens a chunk (0: none); 12 forwards, the first 2 discarded.
Timed: from the end of the forward to the end of ``request()`` (the adapter's capture: on
the CPU the copies into the ring happen in it). Between forwards, outside the clock: a flush
and a subscriber in this process draining every sample. One-off measurement of
d0626ce against the per-row adapter before it (README here); not a goal's benchmark.
"""
import sys, time, tempfile, statistics, torch
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from hscapture import Producer, Subscriber
from hscapture.adapters.transformers import HiddenStateCapture
from hscapture.demo import tiny_llama
B, S, CH = int(sys.argv[1]), int(sys.argv[2]), (int(sys.argv[3]) or None)
model = tiny_llama(seed=0, dtype=torch.bfloat16, layers=4, hidden=256)
d = tempfile.mkdtemp(prefix="hsc-at-", dir="/tmp"); ep = f"ipc://{d}/p.sock"
ids = torch.randint(0, 4096, (B, S)); mask = torch.ones(B, S, dtype=torch.long)
with Producer(ep, producer_id="at", capacity=1 << 30, full_policy="drop") as p, Subscriber(ep) as sub:
    sub.wait_ready(timeout=20)
    cap = HiddenStateCapture(model, p, [0, 1, 2])
    ts = []
    with torch.no_grad():
        for i in range(12):
            rids = [f"r{i}-{b}" for b in range(B)]
            with cap.request(rids, ids, mask, chunk_size=CH):
                model(ids, attention_mask=mask)
                t0 = time.perf_counter()
            ts.append(time.perf_counter() - t0)     # the capture after the forward
            p.flush()
            while sub.poll(timeout=0.05) is not None:
                pass
    ts = ts[2:]
    print(f"B={B} S={S} chunk={CH}: capture after the forward median {statistics.median(ts)*1e3:.2f} ms (min {min(ts)*1e3:.2f}, max {max(ts)*1e3:.2f}), dropped {p.stats().get('dropped', 0)}")
