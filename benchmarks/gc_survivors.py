"""Objects the SGLang hook leaves alive per captured pass, that the cyclic GC tracks.

    python benchmarks/gc_survivors.py [--passes 500] [--rows 8] [--tokens 64]
                                      [--pass-log-ms 50] [--out FILE]

Why: in a real server a young collection of SGLang's scheduler process costs ~0.5-0.7 ms at
the 1B shape, and Python starts one whenever the count of tracked container objects allocated
and not freed since the last one passes its threshold (700). Every object a captured pass
leaves alive brings the next collection closer; captured turns ran twice the collections of
skipped ones (benchmarks/results/h200-2026-12-04e). This counts them on the CPU proxy, the
hook driven through SGLang's real objects as ``bench_hook.py`` drives it (its ``Driver``,
CUDA-graph outputs, a subscriber process taking every sample), forwards paced 4 ms apart so
the pass log runs on its own interval: after a warm-up, the collector is switched off, the
tracked objects listed, ``--passes`` passes run, the producer flushed, and the tracked
objects listed again. Reported: the net change per pass and the types of the new objects
(what the batches built before the count hold is outside it). Not a timing: one run says it.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--passes", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--rows", type=int, default=8, help="requests per pass")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per request")
    ap.add_argument("--pass-log-ms", default="50")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    import bench_hook as B
    B.install_stubs()
    import torch

    from _harness import MODEL_SHAPES, aux_layers, read_event, spawn, stop_child
    from hscapture.sglang.config import load_config
    from hscapture.sglang.hook import SGLangCaptureHook

    shape = MODEL_SHAPES["tiny"]
    n_layers, hidden = shape["num_layers"], shape["hidden"]
    layers = aux_layers(n_layers)
    B.publish_context(layers)
    pid = f"gcs-{os.getpid()}"
    hook = SGLangCaptureHook(load_config({
        "HSCAPTURE_ENDPOINT": f"ipc:///tmp/{pid}.sock", "HSCAPTURE_PRODUCER_ID": pid,
        "HSCAPTURE_RING_BYTES": "256M", "HSCAPTURE_FULL_POLICY": "drop",
        "HSCAPTURE_PASS_LOG_MS": a.pass_log_ms}))
    hook.start()
    consumer = spawn(B.__file__, "_consume", {"endpoint": hook.producer.endpoint})
    try:
        read_event(consumer, "ready", timeout=120)
        if not hook.producer.wait_for_consumers(1, timeout_s=60):
            raise SystemExit("the subscriber process never attached")
        drv = B.Driver(hook, n_layers, "cpu", graph=True)
        aux = torch.randn(a.rows * a.tokens, len(layers) * hidden).to(torch.bfloat16)
        last = torch.randn(a.rows * a.tokens, hidden).to(torch.bfloat16)
        batches = [drv.batch([a.tokens] * a.rows) for _ in range(a.warmup + a.passes)]

        def run(first: int, count: int) -> None:
            for b in batches[first:first + count]:
                time.sleep(0.004)          # a forward's time: the log's interval passes
                drv.run(b, aux, last)

        run(0, a.warmup)
        hook.producer.flush()
        gc.collect()
        gc.disable()
        before = {id(o) for o in gc.get_objects()}
        run(a.warmup, a.passes)
        hook.producer.flush()
        after = gc.get_objects()
        new = [o for o in after if id(o) not in before]
        types = collections.Counter(type(o).__name__ for o in new).most_common(12)
        gc.enable()
        out = {"benchmark": "gc_survivors", "passes": a.passes, "rows": a.rows,
               "tokens": a.tokens, "pass_log_ms": a.pass_log_ms,
               "net_tracked": len(after) - len(before),
               "net_tracked_per_pass": (len(after) - len(before)) / a.passes,
               "new_tracked": len(new), "new_types": types,
               "done_memory": len(hook._samples.done)}
        print(f"tracked objects: {out['net_tracked']:+d} over {a.passes} passes of {a.rows} "
              f"rows ({out['net_tracked_per_pass']:+.1f} a pass); new ones by type: {types}")
    finally:
        hook.close()
        consumer.stdin.close()
        read_event(consumer, "done", timeout=60)
        stop_child(consumer)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
