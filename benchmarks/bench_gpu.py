"""GPU benchmarks of the capture path. One section per subcommand:

    python benchmarks/bench_gpu.py copy      # GPU->ring copy GB/s vs pinned vs pageable vs Producer
    python benchmarks/bench_gpu.py overhead  # prefill slowdown, 1B/8B Llama, batch mixes, tail charged
    python benchmarks/bench_gpu.py notices   # samples/s end to end, latency at paced rates
    python benchmarks/bench_gpu.py e2e       # bench_e2e.py --device cuda
    python benchmarks/bench_gpu.py all       # every section

Each section writes ``<out-dir>/gpu_<section>.json`` (via ``_stats.write_record``: timed region,
machine, commit) and a PNG when matplotlib imports. ``--device cpu`` (default without CUDA) runs
every section on small sizes to check the code path; those numbers mean nothing. Every
comparison alternates its methods in every repetition (``--reps``, default 5, after one
discarded warm-up) and a goal is met only when the whole spread clears it.
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.append(str(ROOT))   # an installed hscapture wins over the uncompiled checkout
sys.path.insert(0, str(HERE))

import _stats  # noqa: E402
from _harness import (MODEL_SHAPES, Row, aux_layers, capture_forward, child_consume,  # noqa: E402
                      child_main, committed_rows, emit, parse_mixes, read_event, spawn,
                      stop_child, unique_producer)

MB = 1 << 20
GOAL_COPY = 0.90           # ring >= 90 % of pinned, whole spread, every size
GOAL_OVERHEAD_PCT = 1.0    # <= 1 % prefill slowdown, whole spread, every shape and mix
GOAL_NOTICES = 100_000     # samples/s end to end
GOAL_LATENCY_P99_US = 1000.0


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()   # every stream of the device, the capture side stream too


def _shm_budget(want: int, reserve: int = 512 * MB) -> int:
    """``want`` bytes, or less if /dev/shm cannot hold it (leaving ``reserve`` free)."""
    free = _stats.fs_info("/dev/shm")["free_bytes"]
    if free - reserve < want:
        got = max(64 * MB, (free - reserve) // MB * MB)
        print(f"  note: /dev/shm has {free / 1e9:.1f} GB free; ring lowered from "
              f"{want / MB:.0f} MiB to {got / MB:.0f} MiB", flush=True)
        return got
    return want


def _spawn(role: str, spec: dict):
    return spawn(__file__, role, spec)


# -- copy -------------------------------------------------------------------------------------

def section_copy(a: argparse.Namespace) -> dict:
    """GPU->host copy GB/s into: a real ring payload (registered), pinned, pageable memory; and
    the whole Producer path (capture_forward + flush), counting committed bytes only."""
    from hscapture import Producer, _ring
    from hscapture.pinning import register_host_memory
    from hscapture.ring import segment_name

    dev = a.device
    cuda = dev == "cuda"
    sizes = [MB << k for k in range(0, 20) if (MB << k) <= a.max_mb * MB]
    top = sizes[-1]
    hidden = 4096                      # producer path: one [rows, 4096] bf16 tensor per record
    print(f"[copy] sizes {[s // MB for s in sizes]} MiB on {dev}, {a.copy_gb:g} GB per "
          f"measurement, {a.reps} reps + 1 warm-up", flush=True)
    src = torch.randint(0, 256, (top,), dtype=torch.uint8, device=dev)
    dsts: dict[str, torch.Tensor] = {}
    notes = []
    if cuda:
        dsts["pinned"] = torch.empty(top, dtype=torch.uint8, pin_memory=True)
    else:
        notes.append("pinned skipped: pin_memory needs CUDA")
    dsts["pageable"] = torch.empty(top, dtype=torch.uint8)
    dsts["pageable"].fill_(1)          # fault the pages in before timing
    ring_cap = _shm_budget(top + 4 * MB)
    raw = _ring.Producer(segment_name("bench-copy"), ring_cap, 1)
    reg = register_host_memory(raw.map_address, raw.map_size)
    pos = raw.reserve(min(top, ring_cap - 2 * MB))
    payload = raw.payload(pos)
    dsts["ring"] = torch.frombuffer(payload, dtype=torch.uint8, count=len(payload))
    dsts["ring"].fill_(0)
    if cuda and reg is None:
        notes.append("cudaHostRegister failed: ring copies are unpinned")
    ep, pid = unique_producer("copy")
    prod = Producer(ep, producer_id=pid, capacity=_shm_budget(2 * top + 64 * MB),
                    full_policy="wait", wait_timeout_s=60.0)
    n_rid = [0]

    def measure(method: str, size: int) -> dict:
        iters = max(5, min(500, math.ceil(a.copy_gb * 1e9 / size)))
        if method == "producer":
            rows = size // (hidden * 2)
            t = src[:rows * hidden * 2].view(torch.bfloat16).view(rows, hidden)
            ids = np.zeros(rows, dtype=np.int32)
            nbytes = rows * hidden * 2
            _sync(dev)
            before = prod.stats()
            ok: list[bool] = []
            t_issue = 0.0
            t0 = time.perf_counter()
            for _ in range(iters):
                n_rid[0] += 1
                ti = time.perf_counter()
                ok += capture_forward(prod, [Row(f"c{n_rid[0]}", [t], ids)], layers=[0])
                t_issue += time.perf_counter() - ti
            prod.flush(timeout_s=120)     # every copy done and committed (the tail is charged)
            _sync(dev)
            dt = time.perf_counter() - t0
            done = committed_rows(ok, before, prod.stats())
            return {"GBps": done * nbytes / dt / 1e9, "seconds": dt, "iters": iters,
                    "committed": done, "dropped": iters - done,
                    "capture_call_us": t_issue / iters * 1e6}
        d, s = dsts[method][:size], src[:size]
        nb = method != "pageable"
        _sync(dev)
        t0 = time.perf_counter()
        for _ in range(iters):
            d.copy_(s, non_blocking=nb)
        _sync(dev)
        dt = time.perf_counter() - t0
        return {"GBps": iters * size / dt / 1e9, "seconds": dt, "iters": iters}

    methods = [m for m in ("ring", "pinned", "pageable") if m in dsts] + ["producer"]
    rows_out, goals = [], []
    try:
        for size in sizes:
            runs, order = _stats.run_alternating(
                {m: (lambda m: lambda i: measure(m, size))(m) for m in methods},
                reps=a.reps, warmup=1)
            row = {"size": size, "order": order, "runs": runs,
                   "GBps": {m: _stats.summarize([r["GBps"] for r in v]) for m, v in runs.items()},
                   "producer_dropped": sum(r["dropped"] for r in runs["producer"]),
                   "producer_capture_call_us": _stats.summarize(
                       [r["capture_call_us"] for r in runs["producer"]])}
            ref = "pinned" if "pinned" in runs else "pageable"
            row["ratio_to_" + ref] = {m: _stats.ratio_summary(
                [r["GBps"] for r in runs[m]], [r["GBps"] for r in runs[ref]])
                for m in ("ring", "producer")}
            rows_out.append(row)
            print(f"[copy] {size // MB:4d} MiB: " + ", ".join(
                f"{m} {_stats.fmt_spread(row['GBps'][m])}" for m in methods) +
                f" GB/s; producer drops {row['producer_dropped']}, capture_forward() "
                f"{row['producer_capture_call_us']['median']:.0f} us/call", flush=True)
        if cuda:
            goals.append(_stats.goal_record(
                "ring/pinned at every size",
                [x for r in rows_out for x in r["ratio_to_pinned"]["ring"]["values"]],
                GOAL_COPY, ">="))
    finally:
        prod.close()
        if reg is not None:
            reg.close()
        raw.close(True)
    for g in goals:
        print("[copy] " + _stats.format_goal(g), flush=True)
    tr = {m: _stats.timed_region(
        [f"{_copy_what(m)}, N back-to-back (N = --copy-gb / size, 5..500)",
         "torch.cuda.synchronize() before the first and after the last (device-wide)"] +
        (["Producer.flush(): every side-stream copy done, committed and announced"]
         if m == "producer" else []),
        ["allocation and page faulting of the destinations", "source fill"] +
        (["bytes of dropped captures (not counted)"] if m == "producer" else []),
        "time.perf_counter") for m in methods}
    return {"timed_regions": tr, "goals": goals, "notes": notes,
            "results": {"device": dev, "dry_run": not cuda, "sizes": sizes,
                        "ring_registered": reg is not None, "rows": rows_out}}


def _copy_what(m: str) -> str:
    return {"ring": "copy_(non_blocking=True) into a reserved payload of a real ring segment "
                    "registered with cudaHostRegister (hscapture.pinning)",
            "pinned": "copy_(non_blocking=True) into torch.empty(pin_memory=True)",
            "pageable": "copy_() into a pre-faulted torch.empty()",
            "producer": "capture_forward(Producer, one [rows, 4096] bf16 row): reserve, meta, "
                        "side-stream copy, commit, notice (full_policy=wait, no consumer)"}[m]


def plot_copy(rec: dict, path: str) -> None:
    plt = _stats.get_pyplot()
    if plt is None:
        return
    rows = rec["results"]["rows"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [r["size"] // MB for r in rows]
    for m in rows[0]["GBps"]:
        med, err = _stats.errorbar_args([r["GBps"][m] for r in rows])
        ax.errorbar(xs, med, yerr=err, marker="o", capsize=3, label=m)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("copy size (MiB)")
    ax.set_ylabel("GB/s (median, min..max; producer: committed bytes)")
    ax.set_title(f"GPU -> host copy ({rec['results']['device']})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}", flush=True)


# -- overhead -------------------------------------------------------------------------------------

def build_llama(shape: dict, device: str, max_pos: int) -> torch.nn.Module:
    """A Llama-architecture causal LM with random bf16 weights, built directly on ``device``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=shape["vocab"], hidden_size=shape["hidden"],
                      intermediate_size=shape["intermediate"],
                      num_hidden_layers=shape["num_layers"],
                      num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
                      max_position_embeddings=max(4096, max_pos))
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
    from hscapture import Producer
    from hscapture.adapters.transformers import CONVENTION, HiddenStateCapture

    dev = a.device
    mixes = parse_mixes(a.mixes)
    ep, pid = unique_producer("overhead")
    ring = _shm_budget(a.ring_mb * MB)
    producer = Producer(ep, producer_id=pid, capacity=ring, full_policy="drop",
                        convention=CONVENTION, model="random-llama")
    consumer = _spawn("_consume", {"endpoint": ep})
    results, goals, counter = [], [], [0]
    try:
        read_event(consumer, "ready", timeout=120)
        if not producer.wait_for_consumers(1, timeout_s=60):
            raise RuntimeError("the consumer process did not attach within 60 s")
        for shape_name in a.shapes.split(","):
            shape = MODEL_SHAPES[shape_name]
            t_build = time.perf_counter()
            model = build_llama(shape, dev, max(hi for _, _, hi in mixes))
            _sync(dev)
            t_build = time.perf_counter() - t_build
            n_params = sum(p.numel() for p in model.parameters())
            aux = aux_layers(shape["num_layers"])
            print(f"[overhead] {shape_name}: {n_params / 1e9:.2f} B params, built in "
                  f"{t_build:.1f}s; capture layers {aux} + final_norm", flush=True)
            fwd_kw = {"use_cache": False}
            if "logits_to_keep" in inspect.signature(model.forward).parameters:
                fwd_kw["logits_to_keep"] = 1
            cap = HiddenStateCapture(model, producer, aux)
            for b, lo, hi in mixes:
                seq = (lo + hi) // 2
                g = torch.Generator().manual_seed(1)
                ids_cpu = torch.randint(0, shape["vocab"], (b, seq), generator=g)
                ids_dev = ids_cpu.to(dev)
                tokens = b * seq

                def forward(on: bool) -> None:
                    if not on:
                        model(input_ids=ids_dev, **fwd_kw)
                        return
                    counter[0] += 1
                    rids = [f"f{counter[0]}-{k}" for k in range(b)]
                    with cap.request(rids, ids_cpu):   # token ids on the CPU, as a server has
                        model(input_ids=ids_dev, **fwd_kw)

                def timed(on: bool):
                    def run(i: int) -> dict:
                        producer.flush(timeout_s=120)   # the previous run's tail: not here
                        _sync(dev)
                        d0 = int(producer.stats().get("dropped", 0))
                        t0 = time.perf_counter()
                        for _ in range(a.iters):
                            forward(on)
                        _sync(dev)       # device-wide: the side-stream copy tail is charged
                        dt = time.perf_counter() - t0
                        return {"tokens_per_s": a.iters * tokens / dt, "seconds": dt,
                                "dropped": int(producer.stats().get("dropped", 0)) - d0}
                    return run
                with torch.inference_mode():
                    for _ in range(a.warmup_forwards):
                        forward(False)
                        forward(True)
                    p = _stats.run_paired(timed(True), timed(False), reps=a.reps, warmup=1,
                                          key="tokens_per_s")
                slow = _stats.slowdown_pct(p.candidate, p.baseline)
                drops = sum(r["dropped"] for r in p.candidate_runs)
                name = f"{shape_name} {b}x{seq}"
                g_rec = _stats.goal_record(f"capture slowdown {name}", slow, GOAL_OVERHEAD_PCT,
                                           "<=", "%")
                if drops:
                    g_rec["met"] = False
                    g_rec["why_not"] = f"{drops} captures dropped during timing"
                goals.append(g_rec)
                results.append({"shape": shape_name, "params": n_params, "batch": b,
                                "seq": seq, "tokens_per_forward": tokens,
                                "captured_bytes_per_forward": tokens * shape["hidden"] * 2 *
                                (len(aux) + 1), "aux_layers": aux,
                                "off_tokens_per_s": _stats.summarize(p.baseline),
                                "on_tokens_per_s": _stats.summarize(p.candidate),
                                "slowdown_pct": _stats.summarize(slow), "drops": drops,
                                "forward_ms_off": 1e3 * tokens / _stats.median(p.baseline),
                                "order": p.order, "build_seconds": t_build})
                print(f"[overhead] {name}: off {_stats.fmt_spread(results[-1]['off_tokens_per_s'])}"
                      f" tok/s, on {_stats.fmt_spread(results[-1]['on_tokens_per_s'])} tok/s, "
                      f"slowdown {_stats.fmt_spread(results[-1]['slowdown_pct'])} %, drops "
                      f"{drops} -> {'MET' if g_rec['met'] else 'MISSED'}", flush=True)
            cap.close()
            del model, cap
            if dev == "cuda":
                torch.cuda.empty_cache()
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
    for g in goals:
        print("[overhead] " + _stats.format_goal(g), flush=True)
    inside = [f"--iters forwards (model(input_ids), use_cache=False, logits_to_keep=1)",
              "torch.cuda.synchronize() at the end: device-wide, so the capture side stream's "
              "copies (the tail of the last forward) are charged to 'on'"]
    outside = ["Producer.flush() and a synchronize before each measurement (the previous "
               "measurement's tail)", "model build", "the consumer process's work (another "
                                                      "process; it shares the CPU)"]
    tr = {"off": _stats.timed_region(inside, outside, "time.perf_counter"),
          "on": _stats.timed_region(inside + ["the same forwards inside "
                                              "HiddenStateCapture.request(): hooks, per-row "
                                              "capture (reserve, meta, side-stream copy "
                                              "issue)"], outside, "time.perf_counter")}
    return {"timed_regions": tr, "goals": goals,
            "notes": ["transformers eager forward of a random-weight Llama; a batch mix BxS is "
                      "B requests of S tokens (padded batches cannot mix lengths: S is the "
                      "middle of the mix's range)",
                      "slowdown per repetition = 1 - on/off tokens/s; goal judged on every "
                      "repetition; a run with drops never meets it"],
            "results": {"device": dev, "dry_run": dev != "cuda", "mixes": results,
                        "ring_bytes": ring, "consumer": cons,
                        "producer_stats": {k: v for k, v in pstats.items()
                                           if isinstance(v, (int, bool))}}}


def plot_overhead(rec: dict, path: str) -> None:
    plt = _stats.get_pyplot()
    if plt is None:
        return
    rows = rec["results"]["mixes"]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows) + 2), 4))
    med, err = _stats.errorbar_args([r["slowdown_pct"] for r in rows])
    ax.bar(range(len(rows)), med, yerr=err, capsize=4)
    ax.set_xticks(range(len(rows)), [f"{r['shape']}\n{r['batch']}x{r['seq']}" for r in rows])
    ax.axhline(GOAL_OVERHEAD_PCT, color="red", ls="--", label=f"goal {GOAL_OVERHEAD_PCT:g} %")
    ax.set_ylabel("prefill slowdown, capture on vs off (%)\nmedian, min..max; tail charged")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}", flush=True)


# -- notices --------------------------------------------------------------------------------------

def child_notice_produce(spec: dict) -> None:
    """Bursts (as fast as possible) then paced phases, each started by a line on stdin:
    ``phase count rate rows pace``: ``count`` 1-token records, ``rows`` per forward pass (one
    ``Producer.capture_batch`` call = one ring entry), at ``rate`` records/s (0 = back to back).
    The rows are built as an engine adapter builds them: one ``producer.Row`` per request
    pointing at its token row of the pass's block (until 2026-12-05 this went through the
    harness's ``capture_forward``, which slices a tensor per row and finds the block back from
    the slices: ~60 % of the producer's issue time on the CPU machine, 107k rows/s issued
    against 285k/s this way, none of it hscapture's)."""
    from hscapture import Producer
    from hscapture.producer import Row as BatchRow

    p = Producer(spec["endpoint"], producer_id=spec["producer_id"],
                 capacity=spec["ring_bytes"], full_policy="wait", wait_timeout_s=60.0)
    emit(event="ready")
    if not p.wait_for_consumers(1, timeout_s=60):
        emit(event="error", message="no consumer attached within 60 s")
        return
    top = max(spec["rows"])
    block = torch.randn(top, spec["hidden"]).to(torch.bfloat16)    # one row per request
    ids = torch.full((top,), 7, dtype=torch.int32)
    n = 0
    _first_full_collection()
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "stop":
            break
        phase, count, rate, k, pace = cmd[0], int(cmd[1]), float(cmd[2]), int(cmd[3]), cmd[4]
        before = p.stats()
        ok: list[bool] = []
        returned: list[list[int]] = []   # paced: [stamp, ns capture_batch() took] per entry
        gap = k / rate if rate > 0 else 0.0
        t0 = time.time_ns()
        nxt = time.perf_counter()
        for f in range(0, count, k):
            if gap:
                nxt += gap
                _wait_until(nxt, pace)
            now = time.time_ns()
            extra = {"t": now, "ph": phase}
            m = min(k, count - f)
            rows = [BatchRow(f"n{n + j + 1}", j, 1, extra=extra) for j in range(m)]
            n += m
            ok += [p.capture_batch(rows, [block], layers=[0], token_ids=ids)] * m
            if gap:
                returned.append([now, time.time_ns() - now])
        t1 = time.time_ns()
        p.flush(timeout_s=120)
        emit(event="phase_done", phase=phase, t_start_ns=t0, t_issued_ns=t1,
             committed=committed_rows(ok, before, p.stats()), count=count, returned=returned)
    p.close()


_FIRST_GC = ("each process's first full garbage collection (run once before the phases: it "
             "walks torch's ~170k objects, 100-200 ms, whatever the process runs; later ones "
             "are inside)")


def _first_full_collection() -> None:
    """Run this process's first full garbage collection now, before anything is timed.

    CPython starts a process's first full collection as soon as a few objects have been
    promoted to its oldest generation (until a full collection has run, that generation's
    size counts as 0), and in a process that imported torch it walks ~170k objects: 100-200
    ms on the CPU machine, once, whatever the process runs (2026-12-07, paced runs of 2,000
    16-record entries: one pause of 80-180 ms in the subscriber process in each of 6 runs,
    none with the collector off; after one full collection the subscriber's steady state
    promoted nothing to the oldest generation over 32,000 samples). Timed, it was one
    burst's or one repetition's outlier. Later full collections stay inside the timed region
    (they need a quarter of the heap promoted first)."""
    import gc
    gc.collect()


def _wait_until(t: float, pace: str) -> None:
    """Wait for ``perf_counter() >= t``. ``spin``: a pure-Python spin (the thread never
    releases the GIL, like a scheduler thread that is never idle); ``sleep``: sleep (GIL
    released, as a scheduler thread waiting for its GPU does) until 100 us before, then spin."""
    if pace == "sleep":
        left = t - time.perf_counter() - 100e-6
        if left > 0:
            time.sleep(left)
    while time.perf_counter() < t:
        pass


def section_notices(a: argparse.Namespace) -> dict:
    from hscapture import Subscriber

    ep, pid = unique_producer("notices")
    rates = [float(x) for x in a.paced_rates.split(",") if x]
    paces = [x for x in a.paces.split(",") if x]
    k, kp = a.notice_rows, a.paced_rows
    spec = {"endpoint": ep, "producer_id": pid, "hidden": a.notice_hidden,
            "ring_bytes": 256 * MB, "rows": [k, kp, 1]}
    # (name, records, rate, rows per forward, pace); bursts of k rows and of 1 row alternate
    phases = [(f"burst{i}", a.notices, 0.0, k, "spin") for i in range(-1, 0)]
    for i in range(a.reps):
        phases += [(f"burst{i}", a.notices, 0.0, k, "spin")]
        if k != 1:
            phases += [(f"burst1row{i}", max(1000, a.notices // 4), 0.0, 1, "spin")]
    phases += [(f"paced{int(r)}{pace}-{i}", max(1000, int(r * a.paced_seconds)), r, kp, pace)
               for i in range(a.reps) for r in rates for pace in paces]
    print(f"[notices] {a.reps} bursts (+1 warm-up) of {a.notices} records of 1 x "
          f"{a.notice_hidden} bf16, {k} per forward (one ring entry each), alternating with "
          f"bursts of 1 per forward; then {a.reps} x paced at {rates}/s ({kp} per forward, "
          f"producer waiting by {paces}) for {a.paced_seconds:g} s each, rates alternating; "
          f"producer and subscriber in separate processes", flush=True)
    proc = _spawn("_notice_produce", spec)
    per_phase: dict[str, dict] = {}
    try:
        read_event(proc, "ready", timeout=120)
        with Subscriber(ep) as sub:
            sub.wait_ready(timeout=60)
            _first_full_collection()
            for phase, count, rate, rows, pace in phases:
                proc.stdin.write(f"{phase} {count} {rate} {rows} {pace}\n")
                proc.stdin.flush()
                lat: list[float] = []
                first_last: dict[int, list[int]] = {}   # entry stamp -> [first, last] poll
                last = None
                deadline = time.monotonic() + 120
                while len(lat) < count and time.monotonic() < deadline:
                    s = sub.poll(timeout=0.5)
                    if s is None:
                        continue
                    now = time.time_ns()
                    ex = s.meta["extra"]
                    if ex.get("ph") == phase:
                        lat.append((now - ex["t"]) / 1e3)
                        last = now
                        if rate:
                            first_last.setdefault(ex["t"], [now, now])[1] = now
                    s.release()
                    deadline = time.monotonic() + 30
                done = read_event(proc, "phase_done", timeout=120)
                secs = (last - done["t_start_ns"]) / 1e9 if last else float("nan")
                per_phase[phase] = {
                    "count": count, "received": len(lat), "committed": done["committed"],
                    "rate_target": rate, "rows_per_forward": rows, "pace": pace,
                    "end_to_end_per_s": len(lat) / secs if last else 0.0,
                    "producer_issue_per_s": count / ((done["t_issued_ns"] - done["t_start_ns"])
                                                     / 1e9),
                    "latency_us": _lat(lat), "_lat": lat,
                    "latency_parts_us": _latency_parts(done.get("returned") or [], first_last)}
                print(f"[notices] {phase}: {per_phase[phase]['end_to_end_per_s']:,.0f}/s end to "
                      f"end (producer issued {per_phase[phase]['producer_issue_per_s']:,.0f}/s), "
                      f"latency p50 {per_phase[phase]['latency_us']['p50']:.0f} us p99 "
                      f"{per_phase[phase]['latency_us']['p99']:.0f} us, received "
                      f"{len(lat)}/{count}" + _parts_line(per_phase[phase]), flush=True)
            sub.pump(0.2)
            sst = sub.stats()
        proc.stdin.write("stop\n")
        proc.stdin.flush()
    finally:
        stop_child(proc)
    bursts = [per_phase[f"burst{i}"]["end_to_end_per_s"] for i in range(a.reps)]
    goals = [_stats.goal_record(f"samples/s end to end (bursts, {k} records per forward)",
                                bursts, GOAL_NOTICES, ">=")]
    _received_all(goals[0], [per_phase[f"burst{i}"] for i in range(a.reps)])
    one_row = [per_phase[f"burst1row{i}"]["end_to_end_per_s"] for i in range(a.reps)
               if f"burst1row{i}" in per_phase]
    paced = {}
    for r in rates:
        for pace in paces:
            phs = [per_phase[f"paced{int(r)}{pace}-{i}"] for i in range(a.reps)]
            key = f"{r:g}/{pace}"
            paced[key] = {"p50_us": _stats.summarize([p["latency_us"]["p50"] for p in phs]),
                          "p99_us": _stats.summarize([p["latency_us"]["p99"] for p in phs]),
                          "received": sum(p["received"] for p in phs),
                          "count": sum(p["count"] for p in phs),
                          # per entry, where the latency goes (one p50 / p99 per repetition)
                          "parts_us": {part: {q: _stats.summarize(
                              [p["latency_parts_us"][part][q] for p in phs
                               if p["latency_parts_us"]["received"]]) for q in ("p50", "p99")}
                              for part in ("capture", "to_first", "rest")}}
            g = _stats.goal_record(f"latency p99 at {r:,.0f}/s, producer thread waiting by "
                                   f"{pace} (one p99 per repetition)",
                                   [p["latency_us"]["p99"] for p in phs], GOAL_LATENCY_P99_US,
                                   "<=", " us")
            _received_all(g, phs)
            goals.append(g)
    for g in goals:
        print("[notices] " + _stats.format_goal(g), flush=True)
    lats = {k_: v.pop("_lat") for k_, v in per_phase.items()}
    tr = {"burst": _stats.timed_region(
              [f"producer process: Producer.capture_batch of --notices 1-token records, "
               f"--notice-rows ({k}) per call (one ring entry per call), back to back "
               f"(full_policy=wait), from its first capture", "subscriber process (this one): "
               "Subscriber.poll() with every check on (the Subscriber has no switch to turn "
               "them off) + release, until the last record of the burst"],
              ["process start", "the warm-up burst (burst-1)", _FIRST_GC],
              "time.time_ns (wall clock, shared by processes)"),
          "latency": _stats.timed_region(
              ["from time.time_ns() taken right before capture_batch() in the producer "
               "(stored in every record's extra; CPU records are copied inside capture_batch(), "
               "so this is at most capture_batch()'s own duration before copy-done) to "
               "Subscriber.poll() returning the sample in the subscriber process; per entry "
               "(parts_us) split into capture_batch()'s own call, its return -> the entry's "
               "first record's poll() (the notice's way, the wake-up, the entry's reading), and "
               "that -> its last record's poll()"],
              ["release()", _FIRST_GC, "the producer's wait between captures (sleep: "
               "time.sleep until 100 us before the next capture, then a spin; spin: a "
               "pure-Python spin that never releases the GIL)"],
              "time.time_ns (wall clock, shared by processes)")}
    return {"timed_regions": tr, "goals": goals,
            "results": {"records": {"tokens": 1, "hidden": a.notice_hidden, "dtype": "bfloat16",
                                    "rows_per_forward_burst": k, "rows_per_forward_paced": kp},
                        "bursts_per_s": _stats.summarize(bursts),
                        "bursts_one_row_per_entry_per_s":
                            _stats.summarize(one_row) if one_row else None,
                        "paced": paced, "phases": per_phase,
                        "subscriber": {k_: (len(v) if isinstance(v, (dict, list)) else v)
                                       for k_, v in sst.items() if k_ != "producers"},
                        "latency_samples_us_every_50th": {k_: v[::50] for k_, v in lats.items()}},
            "_lats": lats}


def _received_all(goal: dict, phases: list[dict]) -> None:
    """A goal is never met by a run that lost records."""
    got, want = sum(p["received"] for p in phases), sum(p["count"] for p in phases)
    if got < want:
        goal["met"] = False
        goal["why_not"] = f"received {got}/{want}"


def _parts_line(ph: dict) -> str:
    parts = ph["latency_parts_us"]
    if not parts["received"]:
        return ""
    return "; per entry p50/p99: " + ", ".join(
        f"{name} {parts[name]['p50']:.0f}/{parts[name]['p99']:.0f}"
        for name in ("capture", "to_first", "rest")) + " us"


def _latency_parts(returned: list[list[int]], first_last: dict[int, list[int]]) -> dict:
    """Where a paced entry's latency goes, per entry (p50/p90/p99/max of each, in us):
    ``capture``, the producer's ``capture_batch()`` call (the rows' copy, the commit and,
    inline, the notice's send); ``to_first``, from that call's return to the subscriber's
    ``poll()`` returning the entry's first record (the notice's way through ZeroMQ, the
    subscriber's wake-up, its reading and checking of the entry; below 0 when that poll()
    returned before the call did, the notice having gone out inside it); ``rest``, from the first
    record's ``poll()`` to the last's (the entry's other records, handed out from memory).
    Entries the subscriber never saw are left out (``received`` says how many)."""
    cap, first, rest = [], [], []
    for stamp, took in returned:
        fl = first_last.get(stamp)
        if fl is None:
            continue
        cap.append(took / 1e3)
        first.append((fl[0] - stamp - took) / 1e3)
        rest.append((fl[1] - fl[0]) / 1e3)
    return {"entries": len(returned), "received": len(cap), "capture": _lat(cap),
            "to_first": _lat(first), "rest": _lat(rest)}


def _lat(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0, "p50": float("nan"), "p90": float("nan"), "p99": float("nan"),
                "max": float("nan")}
    return {"n": len(xs), "p50": _stats.percentile(xs, 50), "p90": _stats.percentile(xs, 90),
            "p99": _stats.percentile(xs, 99), "max": max(xs)}


def plot_notices(rec: dict, path: str, lats: dict) -> None:
    plt = _stats.get_pyplot()
    if plt is None:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for name, xs in lats.items():
        if xs and not name.startswith("burst-"):
            xs = sorted(xs)
            ax1.plot(xs, np.linspace(0, 1, len(xs)), label=name)
    ax1.axvline(GOAL_LATENCY_P99_US, color="red", ls="--", label="p99 goal")
    ax1.set_xscale("log")
    ax1.set_xlabel("capture -> delivery (us)")
    ax1.set_ylabel("CDF")
    ax1.legend(fontsize=7)
    ax1.grid(alpha=0.3)
    b = rec["results"]["bursts_per_s"]
    ax2.bar(["end to end"], [b["median"]], yerr=[[b["median"] - b["min"]], [b["max"] - b["median"]]],
            capsize=6)
    ax2.axhline(GOAL_NOTICES, color="red", ls="--", label="goal")
    ax2.set_ylabel("samples/s (1-token records), median min..max")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}", flush=True)


# -- e2e ------------------------------------------------------------------------------------------

def section_e2e(a: argparse.Namespace) -> None:
    out_json = os.path.join(a.out_dir, "gpu_e2e.json")
    cmd = [sys.executable, str(HERE / "bench_e2e.py"), "--device", a.device, "--gb",
           str(a.e2e_gb), "--reps", str(a.reps), "--out", out_json, *a.e2e_args]
    if a.disk_dir:
        cmd += ["--disk-dir", a.disk_dir]
    print(f"[e2e] {' '.join(cmd[1:])}", flush=True)
    rc = subprocess.call(cmd, cwd=str(ROOT))
    if rc != 0:
        raise RuntimeError(f"bench_e2e.py exited with {rc}")


# -- main -----------------------------------------------------------------------------------------

SECTIONS = {"copy": (section_copy, plot_copy), "overhead": (section_overhead, plot_overhead),
            "notices": (section_notices, None), "e2e": (section_e2e, None)}


def run_section(name: str, a: argparse.Namespace) -> None:
    fn, plotter = SECTIONS[name]
    res = fn(a)
    if res is None:        # e2e: bench_e2e.py wrote its own record
        return
    lats = res.pop("_lats", None)
    cfg = {k: v for k, v in vars(a).items() if k != "e2e_args"}
    rec = _stats.write_record(os.path.join(a.out_dir, f"gpu_{name}.json"),
                              benchmark=f"bench_gpu.{name}", timed_regions=res["timed_regions"],
                              results=res["results"], config=cfg, goals=res["goals"],
                              notes=res.get("notes", []))
    png = os.path.join(a.out_dir, f"gpu_{name}.png")
    if name == "notices":
        plot_notices(rec, png, lats or {})
    elif plotter is not None:
        plotter(rec, png)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("section", choices=[*SECTIONS, "all"])
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None,
                    help="cuda (default when available); cpu = dry run on small sizes")
    ap.add_argument("--out-dir", default="bench-results/gpu")
    ap.add_argument("--reps", type=int, default=5, help="counted repetitions (after 1 warm-up)")
    g = ap.add_argument_group("copy")
    g.add_argument("--max-mb", type=int, default=None, help="largest copy, MiB (cuda 256, cpu 8)")
    g.add_argument("--copy-gb", type=float, default=None, help="GB per measurement (cuda 1)")
    g = ap.add_argument_group("overhead")
    g.add_argument("--shapes", default=None, help="comma list of " + ",".join(MODEL_SHAPES) +
                   " (cuda: 1b,8b; cpu: tiny)")
    g.add_argument("--mixes", default=None, help="batch mixes BxS or BxLO-HI (cuda: "
                   "1x4096,8x512,64x128,256x64; cpu: 1x64,4x16)")
    g.add_argument("--iters", type=int, default=None, help="forwards per measurement (cuda 3)")
    g.add_argument("--warmup-forwards", type=int, default=2)
    g.add_argument("--ring-mb", type=int, default=None, help="ring MiB (cuda 4096, cpu 256)")
    g = ap.add_argument_group("notices")
    g.add_argument("--notices", type=int, default=None, help="records per burst (cuda 50000)")
    g.add_argument("--paced-rates", default="5000,50000", help="paced records/s, comma list")
    g.add_argument("--paced-seconds", type=float, default=1.0, help="duration of each paced phase")
    g.add_argument("--notice-hidden", type=int, default=64)
    g.add_argument("--notice-rows", type=int, default=64,
                   help="records per forward pass (one ring entry) in the bursts; bursts of 1 "
                        "per forward alternate with them (reported, no goal)")
    g.add_argument("--paced-rows", type=int, default=1,
                   help="records per forward pass in the paced phases (1: every record is "
                        "its own entry)")
    g.add_argument("--paces", default="sleep,spin",
                   help="how the producer thread waits between paced captures: sleep (GIL "
                        "released), spin (GIL held), comma list")
    g = ap.add_argument_group("e2e")
    g.add_argument("--e2e-gb", type=float, default=2.0)
    g.add_argument("--disk-dir", default=None, help="passed to bench_e2e.py --disk-dir")
    g.add_argument("--e2e-args", nargs=argparse.REMAINDER, default=[],
                   help="everything after this goes to bench_e2e.py")
    a = ap.parse_args(argv)
    if a.device is None:
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available here")
    big = a.device == "cuda"
    defaults = dict(max_mb=256 if big else 8, copy_gb=1.0 if big else 0.05,
                    shapes="1b,8b" if big else "tiny",
                    mixes="1x4096,8x512,64x128,256x64" if big else "1x64,4x16",
                    iters=3 if big else 1, ring_mb=4096 if big else 256,
                    notices=50_000 if big else 5_000)
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    os.makedirs(a.out_dir, exist_ok=True)
    names = ["copy", "overhead", "notices", "e2e"] if a.section == "all" else [a.section]
    failed = []
    for name in names:
        try:
            run_section(name, a)
        except Exception:
            import traceback

            traceback.print_exc()
            failed.append(name)
    if failed:
        print(f"FAILED sections: {failed}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    if not child_main({"_consume": child_consume, "_notice_produce": child_notice_produce}):
        sys.exit(main())
