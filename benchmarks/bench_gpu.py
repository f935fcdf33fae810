"""GPU benchmarks of the capture path (issue #5). One section per subcommand:

    python benchmarks/bench_gpu.py copy      # GPU→ring copy GB/s vs pin_memory vs pageable
    python benchmarks/bench_gpu.py overhead  # prefill tokens/s of a Llama with capture off / on
    python benchmarks/bench_gpu.py notices   # notice rate and latency, tiny records, 2 processes
    python benchmarks/bench_gpu.py e2e       # bench_e2e.py --device cuda
    python benchmarks/bench_gpu.py all       # every section, one JSON + one PNG each

Results: ``--out-dir`` (default ``bench-results/gpu``) gets ``gpu_<section>.json`` and
``gpu_<section>.png`` (PNG needs matplotlib). ``--device cpu`` runs ``copy`` and ``overhead``
as a dry run on small sizes (checks the code path; the numbers mean nothing); ``notices`` uses
CPU records anyway. See benchmarks/README.md for what each section measures exactly.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from bench_e2e import emit, env_info, fs_info, get_pyplot, read_event, save_json, stop_child  # noqa: E402

MB = 1 << 20
GOAL_COPY = 0.90          # ring >= 90% of pin_memory
GOAL_OVERHEAD_PCT = 2.0   # <= 2% prefill slowdown
GOAL_NOTICES = 100_000    # notices/s


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _shm_budget(want: int, reserve: int = 512 * MB) -> int:
    """``want`` bytes, or less if /dev/shm cannot hold it (leaving ``reserve`` free)."""
    free = fs_info("/dev/shm")["free_bytes"]
    if free - reserve < want:
        got = max(64 * MB, (free - reserve) // MB * MB)
        print(f"  note: /dev/shm has {free / 1e9:.1f} GB free; ring lowered from "
              f"{want / MB:.0f} MiB to {got / MB:.0f} MiB", flush=True)
        return got
    return want


def _endpoint(tag: str) -> tuple[str, str]:
    from hscapture.endpoint import default_endpoint

    pid = f"bench-gpu-{tag}-{os.getpid()}-{random.randrange(1 << 30):x}"
    return default_endpoint(pid), pid


def _spawn(role: str, spec: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), role, json.dumps(spec)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=str(ROOT))


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(math.ceil(q / 100 * len(xs))) - 1))
    return xs[k]


# -- a) copy --------------------------------------------------------------------------------

def section_copy(a: argparse.Namespace) -> dict:
    """GPU→host copy GB/s: real ring payload (cudaHostRegister) vs pin_memory vs pageable, plus
    the full Producer.capture path (reserve, side-stream copy, commit, notice)."""
    from hscapture import Producer, _ring
    from hscapture.pinning import register_host_memory
    from hscapture.ring import segment_name

    dev = a.device
    cuda = dev == "cuda"
    sizes = [MB << k for k in range(0, 20) if (MB << k) <= a.max_mb * MB]
    top = sizes[-1]
    print(f"[copy] sizes {[s // MB for s in sizes]} MiB on {dev}, {a.copy_gb:g} GB per "
          f"measurement, {a.reps} reps", flush=True)
    src = torch.randint(0, 256, (top,), dtype=torch.uint8, device=dev)
    dsts: dict[str, torch.Tensor] = {}
    notes = {}
    if cuda:
        dsts["pinned"] = torch.empty(top, dtype=torch.uint8, pin_memory=True)
    else:
        notes["pinned"] = "skipped: pin_memory needs CUDA"
    dsts["pageable"] = torch.empty(top, dtype=torch.uint8)
    dsts["pageable"].fill_(1)          # fault the pages in before timing
    ring_cap = _shm_budget(top + 4 * MB)
    raw = _ring.Producer(segment_name("bench-copy"), ring_cap, 1)
    reg = register_host_memory(raw.map_address, raw.map_size)
    pos = raw.reserve(min(top, ring_cap - 2 * MB))
    payload = raw.payload(pos)
    dsts["ring"] = torch.frombuffer(payload, dtype=torch.uint8, count=len(payload))
    dsts["ring"].fill_(0)
    ring_pinned = reg is not None
    if cuda and not ring_pinned:
        notes["ring"] = "cudaHostRegister failed: ring copies are unpinned"
    ep, pid = _endpoint("copy")
    prod = Producer(ep, producer_id=pid, capacity=_shm_budget(2 * top + 64 * MB),
                    full_policy="drop")
    hidden = 4096                       # producer path: [rows, 4096] bf16 records
    results: dict[str, dict[str, list[float]]] = {}
    rid_n = [0]

    def measure(method: str, size: int) -> float:
        iters = max(5, min(500, math.ceil(a.copy_gb * 1e9 / size)))
        if method == "producer":
            rows = size // (hidden * 2)
            if rows == 0:
                return float("nan")
            t = src[:rows * hidden * 2].view(torch.bfloat16).view(rows, hidden)
            ids = np.zeros(rows, dtype=np.int32)

            def one() -> None:
                rid_n[0] += 1
                prod.capture(f"c{rid_n[0]}", [t], layers=[0], token_ids=ids)
            nbytes = rows * hidden * 2
        else:
            d, s = dsts[method][:size], src[:size]
            nb = method != "pageable"

            def one() -> None:
                d.copy_(s, non_blocking=nb)
            nbytes = size
        one()                              # warm-up
        if method == "producer":
            prod.flush()
        _sync(dev)
        t0 = time.perf_counter()
        for _ in range(iters):
            one()
        if method == "producer":
            prod.flush()
        _sync(dev)
        return iters * nbytes / (time.perf_counter() - t0) / 1e9

    methods = [m for m in ("ring", "pinned", "pageable", "producer") if m in dsts or
               m == "producer"]
    try:
        for size in sizes:
            for r in range(a.reps):
                order = methods if r % 2 == 0 else methods[::-1]
                for m in order:
                    results.setdefault(m, {}).setdefault(str(size), []).append(measure(m, size))
            line = ", ".join(f"{m} {statistics.median(results[m][str(size)]):.2f}"
                             for m in methods)
            print(f"[copy] {size // MB:4d} MiB: {line} GB/s", flush=True)
        pstats = prod.stats()
    finally:
        prod.close()
        if reg is not None:
            reg.close()
        raw.close(True)
    med = {m: {s: statistics.median(v) for s, v in per.items()} for m, per in results.items()}
    ratio = {}
    if "pinned" in med:
        ratio = {m: {s: med[m][s] / med["pinned"][s] for s in med[m]}
                 for m in ("ring", "producer")}
    big = str(top)
    goal = None
    if ratio:
        goal = {f"ring >= {GOAL_COPY:.0%} of pinned at {top // MB} MiB":
                ratio["ring"][big] >= GOAL_COPY,
                f"ring >= {GOAL_COPY:.0%} of pinned at every size":
                all(v >= GOAL_COPY for v in ratio["ring"].values())}
    out = {"benchmark": "gpu.copy", "device": dev, "dry_run": not cuda, "sizes": sizes,
           "ring_registered": ring_pinned, "median_GBps": med, "ratio_to_pinned": ratio,
           "runs_GBps": results, "goals": goal, "notes": notes,
           "producer_stats": {k: v for k, v in pstats.items() if isinstance(v, (int, bool))},
           "method_notes": {
               "ring": "copy_(non_blocking=True) into a reserved payload of a real hscapture "
                       "ring segment registered via hscapture.pinning (current stream)",
               "pinned": "copy_(non_blocking=True) into torch.empty(pin_memory=True)",
               "pageable": "copy_() into torch.empty() (pageable, pre-faulted)",
               "producer": "Producer.capture of one [rows, 4096] bf16 tensor per record "
                           "(reserve, meta, side-stream copy, commit, notice); timed until "
                           "Producer.flush() returned; no consumer attached (the ring wraps)"},
           "timing": "wall clock around N back-to-back copies, torch.cuda.synchronize() "
                     "before and after; median of reps", "env": env_info()}
    if goal:
        for k, v in goal.items():
            print(f"[copy] goal {k}: {'MET' if v else 'NOT MET'} "
                  f"(ring/pinned at {top // MB} MiB = {ratio['ring'][big]:.3f})", flush=True)
    return out


def plot_copy(res: dict, path: str) -> None:
    plt = get_pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m, per in res["median_GBps"].items():
        xs = [int(s) // MB for s in per]
        ax.plot(xs, list(per.values()), marker="o", label=m)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("copy size (MiB)")
    ax.set_ylabel("GB/s")
    ax.set_title(f"GPU → host copy ({res['device']}; ring registered: "
                 f"{res['ring_registered']})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}", flush=True)


# -- b) overhead ------------------------------------------------------------------------------

def build_llama(a: argparse.Namespace, device: str) -> torch.nn.Module:
    """A Llama-architecture causal LM with random weights, built directly on ``device``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden,
                      intermediate_size=a.intermediate, num_hidden_layers=a.num_layers,
                      num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                      max_position_embeddings=max(4096, a.seq))
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(prev)
    return model.to(device=device, dtype=torch.bfloat16).eval()


def section_overhead(a: argparse.Namespace) -> dict:
    import inspect

    from hscapture import Producer
    from hscapture.adapters.transformers import CONVENTION, HiddenStateCapture

    dev = a.device
    t_build = time.perf_counter()
    model = build_llama(a, dev)
    n_params = sum(p.numel() for p in model.parameters())
    _sync(dev)
    t_build = time.perf_counter() - t_build
    L = a.num_layers
    aux = [int(x) for x in a.aux_layers.split(",")] if a.aux_layers else \
        sorted({min(2, L - 1), L // 2, max(0, L - 3)})
    print(f"[overhead] Llama {n_params / 1e9:.2f} B params (hidden {a.hidden}, {L} layers), "
          f"built in {t_build:.1f}s on {dev}; batch {a.batch} x seq {a.seq}; capture layers "
          f"{aux} + final_norm", flush=True)
    fwd_kw = {"use_cache": False}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        fwd_kw["logits_to_keep"] = 1        # prefill computes logits for the last token only
    g = torch.Generator().manual_seed(1)
    ids_cpu = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
    ids_dev = ids_cpu.to(dev)
    tokens = a.batch * a.seq
    rec_bytes = tokens * a.hidden * 2 * (len(aux) + 1)
    ep, pid = _endpoint("overhead")
    ring = _shm_budget(a.ring_mb * MB)
    producer = Producer(ep, producer_id=pid, capacity=ring, full_policy="drop",
                        convention=CONVENTION, model="random-llama")
    consumer = _spawn("_consume", {"endpoint": ep})
    counter = [0]
    modes = ["off", "on"] + (["on_gpu_ids"] if a.gpu_ids_variant else [])
    try:
        read_event(consumer, "ready", timeout=120)
        if not producer.wait_for_consumers(1, timeout_s=60):
            raise RuntimeError("the consumer process did not attach within 60 s")
        cap = HiddenStateCapture(model, producer, aux)

        def forward(mode: str) -> None:
            if mode == "off":
                model(input_ids=ids_dev, **fwd_kw)
                return
            counter[0] += 1
            rids = [f"f{counter[0]}-{b}" for b in range(a.batch)]
            # "on": token ids the adapter slices are on the CPU, as in a server; "on_gpu_ids":
            # the same CUDA tensor the model gets (the adapter then copies ids to the CPU).
            with cap.request(rids, ids_cpu if mode == "on" else ids_dev):
                model(input_ids=ids_dev, **fwd_kw)

        def timed(mode: str) -> float:
            # The forward pass's own stream is what the server waits on; the capture's side
            # stream copies run behind it and are not part of prefill latency (they are
            # drained before the next measurement starts, outside the timing).
            _sync(dev)
            t0 = time.perf_counter()
            for _ in range(a.iters):
                forward(mode)
            if dev == "cuda":
                torch.cuda.current_stream().synchronize()
            t1 = time.perf_counter()
            _sync(dev)
            return a.iters * tokens / (t1 - t0)

        with torch.inference_mode():
            for m in modes:             # warm-up (kernels, allocator, side stream)
                for _ in range(a.warmup):
                    forward(m)
            producer.flush()
            runs: dict[str, list[float]] = {m: [] for m in modes}
            drops_before = producer.stats().get("dropped", 0)
            for r in range(a.reps):
                order = modes if r % 2 == 0 else modes[::-1]
                for m in order:
                    runs[m].append(timed(m))
                print(f"[overhead] rep {r}: " + ", ".join(
                    f"{m} {runs[m][-1]:,.0f}" for m in modes) + " tokens/s", flush=True)
            producer.flush()
        cap.close()
        pstats = producer.stats()
    finally:
        try:
            producer.close()
        finally:
            cons = {}
            try:
                consumer.stdin.close()
                cons = read_event(consumer, "done", timeout=60)
            except Exception as exc:
                cons = {"error": f"{type(exc).__name__}: {exc}"}
            stop_child(consumer)
    slow = {}
    for m in modes[1:]:
        pcts = [(off - on) / off * 100 for off, on in zip(runs["off"], runs[m])]
        slow[m] = {"median_pct": statistics.median(pcts), "min_pct": min(pcts),
                   "max_pct": max(pcts),
                   "stdev_pct": statistics.stdev(pcts) if len(pcts) > 1 else 0.0,
                   "per_rep_pct": pcts}
    med = {m: statistics.median(v) for m, v in runs.items()}
    drops = pstats.get("dropped", 0) - drops_before
    out = {"benchmark": "gpu.overhead", "device": dev, "dry_run": dev != "cuda",
           "model": {"params": n_params, "hidden": a.hidden, "layers": L,
                     "intermediate": a.intermediate, "heads": a.heads, "kv_heads": a.kv_heads,
                     "vocab": a.vocab, "dtype": "bfloat16", "build_seconds": t_build},
           "batch": a.batch, "seq": a.seq, "tokens_per_forward": tokens,
           "capture_layers": aux, "final_norm": True, "bytes_captured_per_forward": rec_bytes,
           "forward_kwargs": {k: v for k, v in fwd_kw.items()}, "iters_per_measurement": a.iters,
           "reps": a.reps, "median_tokens_per_s": med, "runs_tokens_per_s": runs,
           "slowdown": slow, "ring_bytes": ring, "producer_drops_during_timing": drops,
           "producer_stats": {k: v for k, v in pstats.items() if isinstance(v, (int, bool))},
           "consumer": cons,
           "goal": {f"capture on <= {GOAL_OVERHEAD_PCT:g}% slower (median)":
                    slow["on"]["median_pct"] <= GOAL_OVERHEAD_PCT},
           "modes": {"off": "forward only (capture hooks installed, outside request())",
                     "on": "forward inside HiddenStateCapture.request(), token ids on CPU",
                     "on_gpu_ids": "same, token ids passed as the CUDA tensor the model gets"},
           "timing": "wall clock of iters forwards between torch.cuda.synchronize() calls "
                     "(includes the side-stream copies); modes interleaved, order alternating",
           "env": env_info()}
    print(f"[overhead] median tokens/s: " + ", ".join(f"{m} {v:,.0f}" for m, v in med.items()),
          flush=True)
    for m, s in slow.items():
        print(f"[overhead] {m}: slowdown median {s['median_pct']:+.2f}% (min "
              f"{s['min_pct']:+.2f}%, max {s['max_pct']:+.2f}%)", flush=True)
    print(f"[overhead] drops during timing: {drops}; goal <= {GOAL_OVERHEAD_PCT:g}%: "
          f"{'MET' if out['goal'][next(iter(out['goal']))] else 'NOT MET'}", flush=True)
    return out


def plot_overhead(res: dict, path: str) -> None:
    plt = get_pyplot()
    if plt is None:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    runs = res["runs_tokens_per_s"]
    ax1.boxplot(list(runs.values()))
    ax1.set_xticks(range(1, len(runs) + 1), list(runs))
    ax1.set_ylabel("prefill tokens/s")
    ax1.set_title(f"{res['model']['params'] / 1e9:.1f}B Llama, {res['batch']}x{res['seq']}")
    sl = res["slowdown"]
    ax2.bar(list(sl), [s["median_pct"] for s in sl.values()],
            yerr=[[s["median_pct"] - s["min_pct"] for s in sl.values()],
                  [s["max_pct"] - s["median_pct"] for s in sl.values()]], capsize=6)
    ax2.axhline(GOAL_OVERHEAD_PCT, color="red", ls="--", label=f"goal {GOAL_OVERHEAD_PCT:g}%")
    ax2.set_ylabel("slowdown vs off (%), median and min..max")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}", flush=True)


def child_consume(spec: dict) -> None:
    """A subscriber that takes every sample and releases it at once (keeps the ring empty)."""
    from hscapture import Subscriber

    stop = threading.Event()

    def watch() -> None:
        sys.stdin.read()
        stop.set()
    threading.Thread(target=watch, daemon=True).start()
    n = nbytes = 0
    with Subscriber(spec["endpoint"]) as sub:
        emit(event="ready")
        while not stop.is_set():
            s = sub.poll(timeout=0.05)
            if s is not None:
                n += 1
                nbytes += s.nbytes
                s.release()
        sub.pump(0.2)
        st = sub.stats()
        emit(event="done", samples=n, bytes=nbytes, dropped=len(st["dropped"]),
             incomplete=len(st["incomplete"]), rejected=len(st["rejected"]),
             lost_notices=st.get("lost_notices", 0))


# -- d) notices -------------------------------------------------------------------------------

def child_notice_produce(spec: dict) -> None:
    from hscapture import Producer

    p = Producer(spec["endpoint"], producer_id=spec["producer_id"],
                 capacity=spec["ring_bytes"], full_policy="wait", wait_timeout_s=60.0)
    emit(event="ready")
    if not p.wait_for_consumers(1, timeout_s=60):
        emit(event="error", message="no consumer attached within 60 s")
        return
    time.sleep(0.2)                  # let the subscriber settle (attached via a heartbeat)
    t = torch.randn(1, spec["hidden"]).to(torch.bfloat16)
    ids = np.array([7], dtype=np.int32)
    n1, n2 = spec["burst"], spec["paced"]
    t0 = time.time_ns()
    drops = 0
    for i in range(n1):
        drops += not p.capture(f"b{i}", [t], layers=[0], token_ids=ids,
                               extra={"t": time.time_ns(), "ph": 1})
    t1 = time.time_ns()
    p.flush(timeout_s=120)
    t2 = time.time_ns()
    emit(event="burst_done")
    sys.stdin.readline()             # the subscriber has caught up: measure unloaded latency
    gap = 1.0 / spec["paced_rate"]
    nxt = time.perf_counter()
    for i in range(n2):
        nxt += gap
        drops += not p.capture(f"p{i}", [t], layers=[0], token_ids=ids,
                               extra={"t": time.time_ns(), "ph": 2})
        while time.perf_counter() < nxt:
            pass                     # spin: sleep() granularity would distort the pacing
    p.flush(timeout_s=120)
    emit(event="captured", t_start_ns=t0, t_issued_ns=t1, t_flushed_ns=t2, drops=drops,
         stats={k: v for k, v in p.stats().items() if isinstance(v, (int, bool))})
    sys.stdin.read()
    p.close()


def section_notices(a: argparse.Namespace) -> dict:
    from hscapture import Subscriber

    ep, pid = _endpoint("notices")
    spec = {"endpoint": ep, "producer_id": pid, "hidden": a.notice_hidden,
            "burst": a.notices, "paced": a.paced, "paced_rate": a.paced_rate,
            "ring_bytes": 256 * MB}
    print(f"[notices] {a.notices} records of 1 x {a.notice_hidden} bf16 as fast as possible, "
          f"then {a.paced} paced at {a.paced_rate:g}/s; producer and subscriber in separate "
          f"processes", flush=True)
    proc = _spawn("_notice_produce", spec)
    lat = {1: [], 2: []}
    first = {1: None, 2: None}
    last = {1: None, 2: None}
    total = a.notices + a.paced
    try:
        read_event(proc, "ready", timeout=120)
        with Subscriber(ep) as sub:
            sub.wait_ready(timeout=60)
            got = 0
            idle_deadline = time.monotonic() + 120
            while got < total and time.monotonic() < idle_deadline:
                stalled = got and last[1] and time.time_ns() - last[1] > 3e9
                if (got >= a.notices or stalled) and not first[2]:
                    proc.stdin.write("paced\n")      # burst fully received: start pacing
                    proc.stdin.flush()
                    first[2] = -1
                s = sub.poll(timeout=0.5)
                if s is None:
                    continue
                now = time.time_ns()
                ex = s.meta["extra"]
                ph = ex["ph"]
                lat[ph].append((now - ex["t"]) / 1e3)
                first[ph] = now if first[ph] in (None, -1) else first[ph]
                last[ph] = now
                s.release()
                got += 1
                idle_deadline = time.monotonic() + 30
            sub.pump(0.2)
            sst = sub.stats()
        cap = read_event(proc, "captured", timeout=120)
    finally:
        stop_child(proc)
    burst_s = (last[1] - cap["t_start_ns"]) / 1e9 if last[1] else float("nan")
    rate = len(lat[1]) / burst_s if last[1] else 0.0
    issue_rate = a.notices / ((cap["t_issued_ns"] - cap["t_start_ns"]) / 1e9)

    def summ(xs: list[float]) -> dict:
        return {"n": len(xs), "p50_us": _pct(xs, 50), "p90_us": _pct(xs, 90),
                "p99_us": _pct(xs, 99), "max_us": max(xs) if xs else float("nan"),
                "mean_us": statistics.fmean(xs) if xs else float("nan")}
    out = {"benchmark": "gpu.notices", "records": {"tokens": 1, "hidden": a.notice_hidden,
                                                   "dtype": "bfloat16", "layers": 1},
           "burst": {"n": a.notices, "received": len(lat[1]),
                     "end_to_end_per_s": rate, "producer_capture_per_s": issue_rate,
                     "seconds": burst_s, "latency": summ(lat[1])},
           "paced": {"n": a.paced, "rate_per_s": a.paced_rate, "received": len(lat[2]),
                     "latency": summ(lat[2])},
           "producer_drops": cap["drops"], "producer_stats": cap["stats"],
           "subscriber": {k: (len(v) if isinstance(v, (dict, list)) else v)
                          for k, v in sst.items() if k != "producers"},
           "latency_definition": "time.time_ns() when Subscriber.poll() returned the sample in "
                                 "the subscriber process minus time.time_ns() taken right before "
                                 "Producer.capture() in the producer process (stored in the "
                                 "record's extra). CPU records: the copy into the ring is done "
                                 "inside capture(), so capture time = copy-done time.",
           "rate_definition": "burst: samples received / (last receipt - producer's first "
                              "capture); the producer uses full_policy=wait, so this is the "
                              "sustained rate of the slower side",
           "goal": {f">= {GOAL_NOTICES:,} notices/s end to end": rate >= GOAL_NOTICES},
           "env": env_info()}
    print(f"[notices] burst: {rate:,.0f} samples/s end to end (producer issued "
          f"{issue_rate:,.0f}/s); latency p50 {out['burst']['latency']['p50_us']:.0f} us, "
          f"p99 {out['burst']['latency']['p99_us']:.0f} us", flush=True)
    print(f"[notices] paced {a.paced_rate:g}/s: latency p50 "
          f"{out['paced']['latency']['p50_us']:.0f} us, p99 "
          f"{out['paced']['latency']['p99_us']:.0f} us; received {len(lat[2])}/{a.paced}; "
          f"drops {cap['drops']}", flush=True)
    print(f"[notices] goal >= {GOAL_NOTICES:,}/s: {'MET' if rate >= GOAL_NOTICES else 'NOT MET'}",
          flush=True)
    out["_latencies_us"] = {"burst": lat[1], "paced": lat[2]}
    return out


def plot_notices(res: dict, path: str) -> None:
    plt = get_pyplot()
    if plt is None:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for name, xs in res.pop("_plot_latencies", {}).items():
        if xs:
            xs = sorted(xs)
            ax1.plot(xs, np.linspace(0, 1, len(xs)), label=name)
    ax1.set_xscale("log")
    ax1.set_xlabel("capture → subscriber receipt (µs)")
    ax1.set_ylabel("CDF")
    ax1.legend()
    ax1.grid(alpha=0.3)
    ax2.bar(["end to end", "producer issue"],
            [res["burst"]["end_to_end_per_s"], res["burst"]["producer_capture_per_s"]])
    ax2.axhline(GOAL_NOTICES, color="red", ls="--", label="goal")
    ax2.set_ylabel("records/s (1 token x %d)" % res["records"]["hidden"])
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}", flush=True)


# -- c) e2e -----------------------------------------------------------------------------------

def section_e2e(a: argparse.Namespace) -> dict:
    out_json = os.path.join(a.out_dir, "gpu_e2e.json")
    out_png = os.path.join(a.out_dir, "gpu_e2e.png")
    cmd = [sys.executable, str(HERE / "bench_e2e.py"), "--device", a.device, "--gb",
           str(a.e2e_gb), "--out", out_json, "--plot", out_png, *a.e2e_args]
    if a.disk_dir:
        cmd += ["--disk-dir", a.disk_dir]
    print(f"[e2e] {' '.join(cmd[1:])}", flush=True)
    rc = subprocess.call(cmd, cwd=str(ROOT))
    if rc != 0:
        raise RuntimeError(f"bench_e2e.py exited with {rc}")
    with open(out_json) as f:
        return json.load(f)


# -- main -------------------------------------------------------------------------------------

SECTIONS = {"copy": (section_copy, plot_copy), "overhead": (section_overhead, plot_overhead),
            "notices": (section_notices, plot_notices), "e2e": (section_e2e, None)}


def run_section(name: str, a: argparse.Namespace) -> dict:
    fn, plotter = SECTIONS[name]
    t0 = time.perf_counter()
    res = fn(a)
    res["seconds"] = time.perf_counter() - t0
    if name == "e2e":          # bench_e2e wrote its own JSON and PNG
        return res
    lats = res.pop("_latencies_us", None)
    if lats is not None:
        res["latency_samples_us_every_100th"] = {k: v[::100] for k, v in lats.items()}
    save_json(os.path.join(a.out_dir, f"gpu_{name}.json"), res)
    if plotter is not None:
        if lats is not None:
            res["_plot_latencies"] = lats
        plotter(res, os.path.join(a.out_dir, f"gpu_{name}.png"))
        res.pop("_plot_latencies", None)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("section", choices=[*SECTIONS, "all"])
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None,
                    help="cuda (default when available); cpu = dry run of copy/overhead")
    ap.add_argument("--out-dir", default="bench-results/gpu")
    ap.add_argument("--reps", type=int, default=None,
                    help="interleaved repetitions (copy: 3, overhead: 6)")
    g = ap.add_argument_group("copy")
    g.add_argument("--max-mb", type=int, default=256, help="largest copy (MiB); from 1 MiB x2")
    g.add_argument("--copy-gb", type=float, default=2.0, help="GB copied per measurement")
    g = ap.add_argument_group("overhead (defaults: ~3.6B Llama on cuda, tiny on cpu)")
    g.add_argument("--hidden", type=int, default=None)
    g.add_argument("--num-layers", type=int, default=None)
    g.add_argument("--intermediate", type=int, default=None)
    g.add_argument("--heads", type=int, default=None)
    g.add_argument("--kv-heads", type=int, default=None)
    g.add_argument("--vocab", type=int, default=None)
    g.add_argument("--batch", type=int, default=None)
    g.add_argument("--seq", type=int, default=None)
    g.add_argument("--iters", type=int, default=None, help="forwards per measurement")
    g.add_argument("--warmup", type=int, default=2)
    g.add_argument("--aux-layers", default="", help="comma list (default 2, L/2, L-3)")
    g.add_argument("--ring-mb", type=int, default=2048)
    g.add_argument("--no-gpu-ids-variant", dest="gpu_ids_variant", action="store_false",
                   help="skip the 'on_gpu_ids' mode")
    g = ap.add_argument_group("notices")
    g.add_argument("--notices", type=int, default=100_000, help="burst records")
    g.add_argument("--paced", type=int, default=5_000, help="paced records (latency)")
    g.add_argument("--paced-rate", type=float, default=5_000.0, help="paced records/s")
    g.add_argument("--notice-hidden", type=int, default=64)
    g = ap.add_argument_group("e2e")
    g.add_argument("--e2e-gb", type=float, default=4.0)
    g.add_argument("--disk-dir", default=None, help="passed to bench_e2e.py --disk-dir")
    g.add_argument("--e2e-args", nargs=argparse.REMAINDER, default=[],
                   help="everything after this goes to bench_e2e.py")
    a = ap.parse_args(argv)
    if a.device is None:
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available here")
    big = a.device == "cuda"
    defaults = dict(hidden=4096 if big else 256, num_layers=16 if big else 4,
                    intermediate=14336 if big else 512, heads=32 if big else 8,
                    kv_heads=8 if big else 4, vocab=32000 if big else 4096,
                    batch=4 if big else 2, seq=2048 if big else 128, iters=8 if big else 2)
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    os.makedirs(a.out_dir, exist_ok=True)
    names = list(SECTIONS) if a.section == "all" else [a.section]
    if a.section == "all":
        names = ["copy", "overhead", "notices", "e2e"]
    summary, failed = {}, []
    for name in names:
        sa = argparse.Namespace(**vars(a))
        if sa.reps is None:
            sa.reps = {"copy": 3, "overhead": 6}.get(name, 1)
        if name == "copy" and not big:
            sa.max_mb = min(sa.max_mb, 16)
            sa.copy_gb = min(sa.copy_gb, 0.2)
            print("[copy] dry run on CPU (no CUDA): sizes up to 16 MiB; numbers are memcpy",
                  flush=True)
        try:
            res = run_section(name, sa)
            summary[name] = {k: res.get(k) for k in ("goal", "goals", "seconds") if k in res}
        except Exception as exc:
            import traceback

            traceback.print_exc()
            failed.append(name)
            summary[name] = {"error": f"{type(exc).__name__}: {exc}"}
            if a.section != "all":
                break
    if a.section == "all":
        save_json(os.path.join(a.out_dir, "gpu_summary.json"), summary)
    if failed:
        print(f"FAILED sections: {failed}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1].startswith("_"):
        role, spec_ = sys.argv[1], json.loads(sys.argv[2])
        try:
            {"_consume": child_consume, "_notice_produce": child_notice_produce}[role](spec_)
        except Exception as exc:
            emit(event="error", message=f"{role}: {type(exc).__name__}: {exc}")
            raise
    else:
        sys.exit(main())
