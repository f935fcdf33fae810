"""Scheduler-thread cost of the real SGLang capture hook, per forward pass.

    python benchmarks/bench_hook.py [--device cpu|cuda] [--mixes 1x4096,8x64-4096,...]
                                    [--forwards 20] [--steady] [--graph] [--cold-mib 64]
                                    [--pass-log-ms 50] [--profile F]
                                    [--out bench-results/bench_hook.json]

Drives the real ``hscapture.sglang.hook.SGLangCaptureHook`` through SGLang's real objects, built
the way ``tests/sglang/sglang_support.py`` (FakeModelServer) builds them: ``Req`` (with
``init_next_round_input``), ``ScheduleBatch.init_new``, ``ForwardMode.EXTEND`` with the
``prefix_lens`` / ``extend_lens`` that ``prepare_for_extend`` sets, ``LogitsProcessorOutput``,
``GenerationBatchResult``, a published SGLang runtime context (capture-only EAGLE-3 mode) and
SGLang's own AFTER-hook wrapper (``hook_registry._wrap_fn``). The model is fabricated: the
"forward" returns prebuilt hidden states ``[T, K*H]`` + ``last_hidden_states [T, H]`` on
``--device``. The hook's producer is real; a subscriber process takes and releases every sample.

For each batch mix (B requests, token counts uniform in LO..HI, every request a whole prompt,
all opted in) and each model shape, ``--forwards`` forwards after ``--warmup`` discarded ones:

- **hook time**: wall time of the hook call on the calling thread (``time.perf_counter_ns``
  around ``hook(result, worker, batch)``, called by SGLang's wrapper): median, p90, min–max.
  Outside: building the requests and the batch, SGLang's wrapper itself, and, between forwards,
  ``Producer.flush()`` + a device synchronize + waiting for the subscriber to release everything
  (so every forward starts with an empty ring and nothing is dropped; drops are counted anyway).
  ``--steady``: no flush or drain between forwards (only after each mix), as in a server: the
  deferred captures' stage is written inside whichever hook call finds it due, so those writes
  are amortized over the forwards instead of each forward starting with an empty stage.
  On CUDA the hook only issues the side-stream copies (they run behind the forward); on CPU the
  copy into the ring happens inside the hook, so CPU times include the memcpy.
- **forward time** (CUDA only): a *measured matmul-equivalent* of a 1B- / 8B-shape Llama at the
  same tokens: per layer ``x @ Wqkv``, ``x @ Wo``, ``x @ Wgate_up``, SiLU*mul, ``@ Wdown`` over
  all T rows, L layers (one layer's random weights reused), plus the LM head on the B last rows;
  no attention, norms or embeddings, so it is a LOWER bound of the forward and hook/forward is an
  upper bound of the real share. Timed between ``torch.cuda.synchronize()`` calls, median of 5
  after 2 warm-ups.

Goal: hook time <= 1 % of the forward, for every forward (the whole spread), every mix, every
shape. The SGLang import stubs for ``triton``/``torchvision`` on a CPU machine: the same logic as
``tests/sglang/conftest.py`` (copied: only what is needed, no pytest), using its ``_stubs``.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import io
import os
import pstats
import random
import sys
import time
from array import array
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.append(str(ROOT))   # an installed hscapture wins over the uncompiled checkout
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402

import _stats  # noqa: E402
from _harness import (MODEL_SHAPES, aux_layers, child_consume, child_main,  # noqa: E402
                      parse_mixes, read_event, spawn, stop_child)

STUBS = ROOT / "tests" / "sglang" / "_stubs"
GOAL_PCT = 1.0
VOCAB = 32000


def install_stubs() -> list[str]:
    """What tests/sglang/conftest.py does: put the permissive triton/torchvision stubs first on
    sys.path when either does not import (CPU machines). Returns the stubbed names."""
    need = []
    for name in ("triton", "torchvision"):
        try:
            importlib.import_module(name)
        except Exception:
            for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                del sys.modules[mod]
            need.append(name)
    if need:
        sys.path.insert(0, str(STUBS))
        for name in need:
            importlib.import_module(name)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return need


def publish_context(layers: list[int]) -> None:
    """A real SGLang runtime context for rank 0 in capture-only EAGLE-3 mode (as the tests'
    ``published`` fixture does)."""
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    reset_context()
    args = ServerArgs(model_path="dummy", enable_return_aux_hidden_states=True,
                      speculative_algorithm="EAGLE3", return_aux_hidden_state_layer_ids=layers)
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None))


class Driver:
    """Real SGLang batches through the real AFTER wrapper into ``hook`` (timed by a shim)."""

    def __init__(self, hook, num_layers: int, device: str, seed: int = 0, graph: bool = False,
                 profiler=None):
        from sglang.srt.plugins.hook_registry import HookType, _wrap_fn

        self.hook, self.device, self.graph = hook, device, graph
        self.rng = random.Random(seed)
        self.worker = SimpleNamespace(model_config=SimpleNamespace(num_hidden_layers=num_layers))
        self.times_ns: list[int] = []
        self.cpu_ns: list[int] = []     # this thread's CPU time in the hook (no waits)
        self._result = None
        self.n = 0

        def timed_hook(result, *args, **kwargs):
            if self.profiler is not None:
                self.profiler.enable()
            c0 = time.thread_time_ns()
            t0 = time.perf_counter_ns()
            hook(result, *args, **kwargs)
            self.times_ns.append(time.perf_counter_ns() - t0)
            self.cpu_ns.append(time.thread_time_ns() - c0)
            if self.profiler is not None:
                self.profiler.disable()

        self.profiler = profiler

        def forward_batch_generation(worker, batch, forward_batch=None, pp_proxy_tensors=None,
                                     is_verify=False, skip_attn_backend_init=None, *,
                                     capture_hidden_mode=None, return_kv_loc_plan=False):
            return self._result

        self.forward = _wrap_fn(forward_batch_generation, timed_hook, HookType.AFTER)

    def batch(self, lengths: list[int]):
        """A prefill batch of whole prompts, as PrefillAdder + prepare_for_extend leave it."""
        from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        reqs = []
        for n in lengths:
            self.n += 1
            ids = array("q", [self.rng.randrange(VOCAB) for _ in range(n)])
            req = Req(f"hscap-{self.n}", "", ids, SamplingParams(max_new_tokens=1))
            req.init_next_round_input(None)
            req.prefix_len, req.extend_end = 0, n
            reqs.append(req)
        b = ScheduleBatch.init_new(reqs, SimpleNamespace(device=self.device), None, None,
                                   SimpleNamespace(vocab_size=VOCAB), False,
                                   SpeculativeAlgorithm.NONE)
        b.forward_mode = ForwardMode.EXTEND
        b.prefix_lens = [0] * len(reqs)
        b.extend_lens = list(lengths)
        # resolve_forward_inputs: the forward's input ids, int64 on the device (the hook takes
        # them from here, as in a real server)
        import torch
        b.input_ids = torch.tensor([t for r in reqs for t in r.full_untruncated_fill_ids],
                                   dtype=torch.int64).to(self.device)
        return b

    def run(self, batch, aux, last) -> int:
        """One forward through SGLang's wrapper; returns the hook's time (ns)."""
        import torch
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult

        t = sum(batch.extend_lens)
        lo = LogitsProcessorOutput(next_token_logits=torch.zeros(len(batch.reqs), 8),
                                   hidden_states=aux[:t], last_hidden_states=last[:t])
        self._result = GenerationBatchResult(logits_output=lo, can_run_cuda_graph=self.graph)
        out = self.forward(self.worker, batch)
        assert out is self._result, "the AFTER hook must not replace SGLang's result"
        return self.times_ns[-1]


def wait_drained(producer, device: str, timeout_s: float = 120.0) -> None:
    """Every capture committed, announced, and released by the subscriber (outside the clock)."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
    producer.flush(timeout_s=timeout_s)
    deadline = time.monotonic() + timeout_s
    ring = producer._ring          # read-only peek at the ring's counters
    while True:
        st = ring.stats()
        if st["min_released"] >= st["head"]:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"subscriber did not release the ring within {timeout_s}s: {st}")
        time.sleep(0.0005)


def matmul_forward_ms(shape: dict, tokens: int, batch: int, reps: int = 5) -> dict:
    """Measured matmul-equivalent forward (see the module docstring), CUDA, bf16."""
    import torch

    h, inter, L = shape["hidden"], shape["intermediate"], shape["num_layers"]
    hd = h // shape["heads"]
    qkv = (shape["heads"] + 2 * shape["kv_heads"]) * hd
    g = torch.Generator(device="cuda").manual_seed(0)

    def w(*s):
        return torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    wqkv, wo, wgu, wd = w(h, qkv), w(h, h), w(h, 2 * inter), w(inter, h)
    head = w(h, shape["vocab"])
    x = w(tokens, h)

    def fwd():
        y = x
        for _ in range(L):
            a = y @ wqkv
            y = y + a[:, :h] @ wo
            gu = y @ wgu
            y = y + (torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]) @ wd
        return y[-batch:] @ head
    times = []
    with torch.inference_mode():
        for i in range(reps + 2):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fwd()
            torch.cuda.synchronize()
            if i >= 2:
                times.append((time.perf_counter() - t0) * 1e3)
    del wqkv, wo, wgu, wd, head, x
    torch.cuda.empty_cache()
    return _stats.summarize(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None)
    ap.add_argument("--shapes", default=None, help="cuda: 1b,8b; cpu: tiny (hidden size, layers)")
    ap.add_argument("--mixes", default="1x4096,8x64-4096,64x64-256,256x64",
                    help="batch mixes BxLO-HI: B requests of LO..HI tokens")
    ap.add_argument("--forwards", type=int, default=20, help="timed forwards per mix (>= 20)")
    ap.add_argument("--warmup", type=int, default=2, help="discarded forwards per mix")
    ap.add_argument("--ring-mb", type=int, default=None, help="ring MiB (cuda 2048, cpu 256)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steady", action="store_true",
                    help="no flush/drain between forwards (after each mix only): stage writes "
                         "amortized as in a server")
    ap.add_argument("--graph", action="store_true",
                    help="results as CUDA-graph replays hand them out (can_run_cuda_graph): the "
                         "hook asks the producer to snapshot the rows now, as in a server with "
                         "CUDA graphs on (the default)")
    ap.add_argument("--cold-mib", type=int, default=0,
                    help="before each forward (outside the clock) write one byte of every cache "
                         "line of a buffer this large: the hook then runs with the cold caches "
                         "it meets in a server, where SGLang's own Python runs between hook "
                         "calls (64: the hook's time 2.6-2.8x its tight-loop time on the CPU "
                         "machine, as the server's hook is 3-4x bench_hook's on the GPU host)")
    ap.add_argument("--pass-log-ms", type=float, default=0.0,
                    help="the hook's pass log interval (HSCAPTURE_PASS_LOG_MS; 0: each forward "
                         "processed at once)")
    ap.add_argument("--profile", default=None,
                    help="cProfile the timed hook calls (only those) of each mix; write the "
                         "top functions by own time to this text file (times inflated by the "
                         "profiler: read the proportions)")
    ap.add_argument("--out", default="bench-results/bench_hook.json")
    ap.add_argument("--plot", default=None)
    a = ap.parse_args(argv)
    stubbed = install_stubs()
    try:
        import sglang  # noqa: F401
        from sglang.srt.plugins.hook_registry import _wrap_fn  # noqa: F401
    except Exception as exc:
        print(f"SKIP bench_hook: sglang does not import here ({type(exc).__name__}: {exc}); "
              f"install its CPU-side packages (scripts/install-sglang-test.sh) to run it",
              flush=True)
        return 0
    import torch

    if a.device == "cpu" or (a.device is None and not torch.cuda.is_available()):
        # CPU copies of a few MB would fan out to OpenMP threads that spin against the
        # subscriber process on a small machine: one thread, so the figure is the hook's
        torch.set_num_threads(1)
    from hscapture.sglang.config import load_config
    from hscapture.sglang.hook import SGLangCaptureHook

    if a.device is None:
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available here")
    cuda = a.device == "cuda"
    a.shapes = a.shapes or ("1b,8b" if cuda else "tiny")
    a.ring_mb = a.ring_mb or (2048 if cuda else 256)
    mixes = parse_mixes(a.mixes)
    rows, goals = [], []
    for shape_name in a.shapes.split(","):
        shape = MODEL_SHAPES[shape_name]
        L, H = shape["num_layers"], shape["hidden"]
        layers = aux_layers(L)
        publish_context(layers)
        pid = f"bench-hook-{os.getpid()}-{shape_name}"
        sock = f"/tmp/{pid}.sock"
        hook = SGLangCaptureHook(load_config({
            "HSCAPTURE_ENDPOINT": f"ipc://{sock}", "HSCAPTURE_PRODUCER_ID": pid,
            "HSCAPTURE_RING_BYTES": f"{a.ring_mb}M", "HSCAPTURE_FULL_POLICY": "drop",
            "HSCAPTURE_PASS_LOG_MS": str(a.pass_log_ms)}))
        hook.start()
        if hook.producer is None:
            raise RuntimeError(f"the hook did not start its producer: {hook.stats()}")
        consumer = spawn(__file__, "_consume", {"endpoint": hook.producer.endpoint})
        try:
            read_event(consumer, "ready", timeout=120)
            if not hook.producer.wait_for_consumers(1, timeout_s=60):
                raise RuntimeError("the subscriber process did not attach within 60 s")
            drv = Driver(hook, L, a.device, seed=a.seed, graph=a.graph)
            max_t = max(b * hi for b, _, hi in mixes)
            g = torch.Generator().manual_seed(a.seed)
            aux = torch.randn(max_t, len(layers) * H, generator=g).to(torch.bfloat16).to(a.device)
            last = torch.randn(max_t, H, generator=g).to(torch.bfloat16).to(a.device)
            for b, lo, hi in mixes:
                rng = random.Random(a.seed + b)
                times, cpus, tokens, dropped = [], [], [], 0
                prof = None
                sweep = np.zeros(a.cold_mib << 20, dtype=np.uint8)
                for i in range(a.warmup + a.forwards):
                    if a.profile and i == a.warmup:
                        prof = drv.profiler = cProfile.Profile()
                    lengths = [rng.randint(lo, hi) for _ in range(b)]
                    batch = drv.batch(lengths)
                    d0 = int(hook.producer.stats().get("dropped", 0))
                    if sweep.size:
                        sweep[::64] += 1         # the caches cold (outside the clock)
                    ns = drv.run(batch, aux, last)
                    if not a.steady:
                        wait_drained(hook.producer, a.device)
                    if i >= a.warmup:
                        times.append(ns / 1e3)
                        cpus.append(drv.cpu_ns[-1] / 1e3)
                        tokens.append(sum(lengths))
                        dropped += int(hook.producer.stats().get("dropped", 0)) - d0
                drv.profiler = None
                if prof is not None:
                    write_profile(a.profile, f"{shape_name} {b} x {lo}-{hi}", prof, a.forwards)
                if a.steady:   # the mix's last stage, outside the clock; its drops count
                    d0 = int(hook.producer.stats().get("dropped", 0))
                    wait_drained(hook.producer, a.device)
                    dropped += int(hook.producer.stats().get("dropped", 0)) - d0
                row = {"shape": shape_name, "hidden": H, "aux_layers": layers, "batch": b,
                       "steady": a.steady, "graph": a.graph, "cold_mib": a.cold_mib,
                       "pass_log_ms": a.pass_log_ms,
                       "tokens_range": [lo, hi], "tokens_per_forward": _stats.summarize(tokens),
                       "hook_us": _stats.summarize(times),
                       "hook_us_p90": _stats.percentile(times, 90),
                       "hook_thread_cpu_us": _stats.summarize(cpus),
                       "hook_us_per_request": _stats.median(times) / b, "drops": dropped}
                line = (f"{shape_name} {b:>3} x {lo}-{hi} tok: hook {row['hook_us']['median']:,.0f}"
                        f" us median, p90 {row['hook_us_p90']:,.0f}, min-max "
                        f"{row['hook_us']['min']:,.0f}-{row['hook_us']['max']:,.0f} us "
                        f"({row['hook_us_per_request']:.1f} us/request), thread CPU "
                        f"{row['hook_thread_cpu_us']['median']:,.0f} us, drops {dropped}")
                if cuda:
                    fwd = matmul_forward_ms(shape, int(row["tokens_per_forward"]["median"]), b)
                    pct = [t / 1e3 / fwd["median"] * 100 for t in times]
                    row["forward_ms_matmul_equivalent"] = fwd
                    row["hook_pct_of_forward"] = _stats.summarize(pct)
                    gr = _stats.goal_record(f"hook/forward {shape_name} batch {b}", pct, GOAL_PCT,
                                            "<=", "%")
                    if dropped:
                        gr["met"], gr["why_not"] = False, f"{dropped} drops"
                    goals.append(gr)
                    line += (f"; forward (matmul-equivalent) {fwd['median']:.2f} ms -> hook "
                             f"{row['hook_pct_of_forward']['median']:.2f} % "
                             f"[{row['hook_pct_of_forward']['min']:.2f} .. "
                             f"{row['hook_pct_of_forward']['max']:.2f}] "
                             f"{'MET' if gr['met'] else 'MISSED'}")
                rows.append(row)
                print(line, flush=True)
            hstats = hook.stats()
        finally:
            hook.close()
            cons = {}
            try:
                consumer.stdin.close()
                cons = read_event(consumer, "done", timeout=60)
            except Exception as exc:
                cons = {"error": f"{type(exc).__name__}: {exc}"}
            stop_child(consumer)
        rows.append({"shape": shape_name, "hook_stats": {k: v for k, v in hstats.items()
                                                         if isinstance(v, (int, str))},
                     "consumer": cons})
    for g in goals:
        print(_stats.format_goal(g), flush=True)
    tr = {"hook": _stats.timed_region(
              ["SGLangCaptureHook.__call__(result, worker, batch) on the calling thread, as "
               "SGLang's AFTER wrapper calls it: reading the batch, slicing the hidden states, "
               "every producer call it makes (on CUDA: issuing side-stream copies; on CPU: the "
               "memcpy into the ring)"],
              ["building Req/ScheduleBatch objects", "SGLang's wrapper around the hook",
               "between forwards: Producer.flush, device synchronize, waiting for the "
               "subscriber to release the ring"], "time.perf_counter_ns"),
          "forward": _stats.timed_region(
              ["matmul-equivalent forward (CUDA only): L x (qkv, o, gate_up, SiLU*mul, down) "
               "over T rows + LM head on B rows, between torch.cuda.synchronize() calls"],
              ["attention, norms, rope, embeddings (so the forward is a lower bound)",
               "weight allocation"], "time.perf_counter")}
    rec = _stats.write_record(a.out, benchmark="bench_hook", timed_regions=tr,
                              results={"device": a.device, "rows": rows, "stubbed": stubbed},
                              config=vars(a), goals=goals,
                              notes=[f"import stubs used for {stubbed} (tests/sglang/_stubs)"]
                              if stubbed else [])
    plot(rec, a.plot or os.path.splitext(a.out)[0] + ".png")
    return 0


def write_profile(path: str, title: str, prof: "cProfile.Profile", forwards: int) -> None:
    """Append the profile's top functions by own time (per forward) to ``path``."""
    out = io.StringIO()
    st = pstats.Stats(prof, stream=out)
    st.sort_stats("tottime").print_stats(45)
    with open(path, "a") as f:
        f.write(f"==== {title}: {forwards} forwards (divide by it for per-forward times)\n")
        f.write(out.getvalue())
    print(f"profile of {title} appended to {path}", flush=True)


def plot(rec: dict, path: str) -> None:
    plt = _stats.get_pyplot()
    if plt is None:
        return
    rows = [r for r in rec["results"]["rows"] if "hook_us" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    for shape in sorted({r["shape"] for r in rows}):
        rs = [r for r in rows if r["shape"] == shape]
        med, err = _stats.errorbar_args([r["hook_us"] for r in rs])
        ax.errorbar([r["batch"] for r in rs], med, yerr=err, marker="o", capsize=3,
                    label=f"hook, {shape} (H={rs[0]['hidden']})")
        if "forward_ms_matmul_equivalent" in rs[0]:
            ax.plot([r["batch"] for r in rs],
                    [r["forward_ms_matmul_equivalent"]["median"] * 10 for r in rs], ls="--",
                    label=f"1 % of forward, {shape}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("requests per forward")
    ax.set_ylabel("us per forward on the scheduler thread")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    if not child_main({"_consume": child_consume}):
        sys.exit(main())
