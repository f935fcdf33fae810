"""CPU micro-benchmark of the SGLang hook's per-pass Python cost (tiny tensors: no memcpy)."""
import os, sys, time, random, statistics
base = os.environ.get("HSC_BASE")
if base:
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower() and "skbc" not in repr(f).lower()]
    sys.path.insert(0, base)
sys.path.insert(0, "/work/main/benchmarks")
import bench_hook as bh
bh.install_stubs()
import torch
import numpy as np
torch.set_num_threads(1)
from hscapture.sglang.config import load_config
from hscapture.sglang.hook import SGLangCaptureHook
layers = [2, 8, 13]
bh.publish_context(layers)
pid = f"mb-{os.getpid()}"
hook = SGLangCaptureHook(load_config({"HSCAPTURE_ENDPOINT": f"ipc:///tmp/{pid}.sock", "HSCAPTURE_PRODUCER_ID": pid,
                                      "HSCAPTURE_RING_BYTES": "1G", "HSCAPTURE_FULL_POLICY": "drop", "HSCAPTURE_PASS_LOG_MS": os.environ.get("LOGMS", "50")}))
hook.start()
drv = bh.Driver(hook, 16, "cpu")
H = 32
aux = torch.randn(40000, 3 * H).to(torch.bfloat16)
last = torch.randn(40000, H).to(torch.bfloat16)
mixes = [(int(m.split("x")[0]), *map(int, m.split("x")[1].split("-"))) for m in sys.argv[1].split(",")]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 600
rng = random.Random(1)
for b, lo, hi in mixes:
    batches = [drv.batch([rng.randint(lo, hi) for _ in range(b)]) for _ in range(n)]
    drv.times_ns.clear(); drv.cpu_ns.clear()
    sweep = np.zeros(int(os.environ.get("COLD_MIB", "0")) << 20, dtype=np.uint8)
    for bt in batches:
        if sweep.size:
            sweep[::64] += 1
        drv.run(bt, aux, last)
    t = [x / 1e3 for x in drv.cpu_ns[n // 5:]]
    t.sort()
    print(f"log={os.environ.get('LOGMS', '50'):>2} {b}x{lo}-{hi}: cpu median {statistics.median(t):6.1f} p10 {t[len(t)//10]:6.1f} mean {statistics.mean(t):6.1f}  drops {hook.producer.stats().get('dropped', 0)}", flush=True)
hook.close()
