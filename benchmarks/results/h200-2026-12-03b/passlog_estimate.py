"""Estimate of a 'pass log' hook: per pass only the selection, the pass-time reads per row and
an append (cold caches), the rest later in a warm loop. Measures the per-pass part cold."""
import os, sys, time, random, statistics, itertools
from array import array
sys.path.insert(0, "/work/main/benchmarks")
import numpy as np
import bench_hook as bh
bh.install_stubs()
import torch
torch.set_num_threads(1)
from hscapture.sglang.config import load_config
from hscapture.sglang.hook import SGLangCaptureHook
layers = [2, 8, 13]
bh.publish_context(layers)
pid = f"pl-{os.getpid()}"
hook = SGLangCaptureHook(load_config({"HSCAPTURE_ENDPOINT": f"ipc:///tmp/{pid}.sock", "HSCAPTURE_PRODUCER_ID": pid,
                                      "HSCAPTURE_RING_BYTES": "1G", "HSCAPTURE_FULL_POLICY": "drop"}))
hook.start()
log = []
def minimal(result, worker, batch, wanted):
    pl, el = batch.prefix_lens, batch.extend_lens
    lo = result.logits_output
    hidden, last = lo.hidden_states, lo.last_hidden_states
    rows = []
    off = 0
    offs = list(itertools.accumulate(el, initial=0))
    for i, r in wanted:
        fill = r.full_untruncated_fill_ids
        p, e = pl[i], el[i]
        rows.append((r, r.rid, p, e, offs[i], getattr(r, "retraction_count", 0),
                     getattr(r, "to_finish", None) or getattr(r, "finished_reason", None),
                     len(fill), fill[p:p + e]))
    log.append((hidden, last, hidden.shape, rows))
    if len(log) > 64:
        log.clear()
if os.environ.get("PASSLOG"):
    hook._publish_batch = minimal
drv = bh.Driver(hook, 16, "cpu")
H = 32
aux = torch.randn(40000, 3 * H).to(torch.bfloat16)
last = torch.randn(40000, H).to(torch.bfloat16)
mixes = [(int(m.split("x")[0]), *map(int, m.split("x")[1].split("-"))) for m in sys.argv[1].split(",")]
rng = random.Random(1)
sweep = np.zeros(int(os.environ.get("COLD_MIB", "0")) << 20, dtype=np.uint8)
for b, lo, hi in mixes:
    batches = [drv.batch([rng.randint(lo, hi) for _ in range(b)]) for _ in range(400)]
    drv.cpu_ns.clear()
    for bt in batches:
        if sweep.size:
            sweep[::64] += 1
        drv.run(bt, aux, last)
    t = sorted(x / 1e3 for x in drv.cpu_ns[80:])
    print(f"{'passlog' if os.environ.get('PASSLOG') else 'current'} {b}x{lo}-{hi}: cpu median {statistics.median(t):6.1f} p10 {t[len(t)//10]:6.1f}", flush=True)
hook.close()
