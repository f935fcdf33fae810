"""The AFTER hook on ``TpModelWorker.forward_batch_generation`` that publishes captures.

Called by SGLang's ``HookRegistry`` wrapper as ``hook(result, worker, batch, ...)`` right
after the forward pass was launched, in the scheduler thread, before SGLang processes the
result. It reads only host-side metadata (``batch.reqs``, ``batch.prefix_lens``,
``batch.extend_lens``, ``batch.decoding_reqs``, ``req.full_untruncated_fill_ids``) and tensor
shapes, slices views of ``result.logits_output.hidden_states`` / ``last_hidden_states`` and
hands them to :meth:`hscapture.producer.Producer.capture`, which copies them on a side
stream. Nothing here synchronizes a CUDA stream or reads a device value.

What is read off SGLang 0.5.23 (``tests/sglang/test_tripwire.py`` pins every name):

- Only ``ForwardMode.EXTEND`` and ``MIXED`` batches carry prefill rows. ``prefix_lens``,
  ``extend_lens`` and ``decoding_reqs`` are stale on DECODE passes, so nothing is read then.
- Row ``i`` owns rows ``[sum(extend_lens[:i]), +extend_lens[i])`` of the hidden states
  (decode rows of a MIXED batch and DP-attention decode-as-extend rows have
  ``extend_lens[i] == 1`` and are in ``decoding_reqs``: skipped). Trailing padding rows
  (DP attention / MLP sync) are ignored: slicing uses the real count.
- The chunk covers positions ``[prefix_lens[i], prefix_lens[i] + extend_lens[i])`` of
  ``req.full_untruncated_fill_ids``; it is the last chunk when the end equals its length.
- Capture-only mode (``--enable-return-aux-hidden-states --speculative-algorithm EAGLE3``)
  makes ``hidden_states`` the aux states packed ``[T, K*H]`` in ascending layer order
  (output of decoder layer L, pre-norm, all-reduced == HF ``hidden_states[L+1]``) and
  ``last_hidden_states`` the post-final-norm last layer ``[T, H]``.

Request life cycle, per rid (the opt-in is decided by :meth:`CaptureConfig.wants`):

- first chunk with ``prefix_lens > 0`` (radix-cache hit): positions ``[0, prefix)`` were
  never computed; the chunks are published with ``cached_prefix=prefix`` so the subscriber
  reports the sample incomplete instead of silently short.
- chunk that does not start where the previous one ended: ``abort`` (never a mixed sample).
- retraction (``req.retraction_count`` grew) of a partially captured request:
  ``abort(rid, ..., extra={"restart": True})`` (subscribers discard the partial sample
  quietly) and the re-prefill is captured from scratch; every chunk carries
  ``extra["attempt"] = retraction_count``. A retraction after the sample was complete: the
  re-prefill is not published (no duplicate).
- ``custom_params.hscapture_meta`` (per-sample metadata, :func:`.config.check_meta`) is read
  once, at a sample's first chunk, and every chunk carries it as ``extra["meta"]``; one that
  breaks the rule is counted (``invalid_meta``), logged once, and the sample is captured
  without it, carrying ``extra["meta_error"]`` (why) instead.
- aborted request (``req.to_finish`` / ``req.finished_reason`` set; an abort replaces the
  prompt by a 1-token stub before its last forward) or one that disappears between chunks:
  ``abort(rid, reason)``: reported incomplete.
- a new request reusing the rid (a client's retry): a new sample; an earlier request with the
  rid still in flight (stopped before a sweep saw it) is reported incomplete first.
- the ring is full: the producer drops the chunk and announces the drop; the rest of that
  sample is not published.
- any exception inside the hook: caught, counted, logged once per kind with context; the
  batch's opted-in requests are aborted (reported), the server goes on.

Garbage collection: the hook's calls on the scheduler's thread (the forward hook and the
sweep) hold the cyclic collector off while they run (``gc.disable()``, and ``gc.enable()``
after, only when it was enabled: a host that turned it off keeps it off). Python starts a
collection at whichever allocation takes the count of container objects past its threshold;
a call that builds a few hundred short-lived ones (processing the pass log) started them
inside the hook, ~0.5-0.7 ms each in a real 1B-shape server. Held off, a collection the call
would have started runs at the scheduler's next allocation past the threshold instead: never
skipped, and never inside the hook's own time. What it does not change (measured,
benchmarks/results/h200-2026-12-04c): at the 1B shape, short prompts, as many collections
ran in the turns with captures (138 per 1,193 turns, against 66 in the skipped ones) as
before: the count they come from is what the hook's objects keep alive across turns (the
pass log's, the stage's), not its short-lived ones. Of those, the done samples' memory kept
two tracked objects per sample until 65,536 later samples; a done sample is now marked on its
request object instead (samples.py), and a captured pass leaves none behind
(``benchmarks/gc_survivors.py``: +16.2 tracked objects a pass before, +0.2 after,
benchmarks/results/cpu-2core-2026-12-04).

Ranks: hidden states are replicated across attention-TP (and attention-CP) ranks after the
all-reduce, so only ``attn_tp_rank == 0 and attn_cp_rank == 0`` publish. Every DP rank owns
disjoint requests and publishes its own, on its own endpoint, tagged with its DP rank.
"""

from __future__ import annotations

import collections
import enum
import gc
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from torch.profiler import record_function as _record_function

try:  # one C call: is torch's profiler recording? (a private name, so guarded)
    from torch._C._autograd import _profiler_enabled
except ImportError:  # pragma: no cover - a torch without it: no profiler ranges
    def _profiler_enabled() -> bool:
        return False

from ..errors import CaptureConfigError
from .modes import BenchModes
from .log_batch import Arenas
from .passes import Pass, hold, record_pass
from .pass_capture import PassCapture
from .timing import ForwardLog, HookProfile, HookTiming, TurnCosts
from .config import (
    DEFAULT_PASS_LOG_MS,
    DEFAULT_PUBLISH_INTERVAL_MS,
    DEFAULT_STAGE_INTERVAL_MS,
    CaptureConfig,
    endpoint_for_dp_rank,
)

log = logging.getLogger("hscapture.sglang")

__all__ = ["Ranks", "read_ranks", "SGLangCaptureHook", "commit_grace_for", "make_producer"]

#: Forward modes whose rows are prefill chunks (by ``ForwardMode`` member name).
CAPTURE_MODES = ("EXTEND", "MIXED")

#: how often the forward hook looks for requests that stopped between chunks (the scheduler's
#: chunked-abort hook, ``SGLangCaptureHook.sweep``, looks at every scheduling step; this
#: catches requests released silently where no step runs)
_SWEEP_INTERVAL_S = 0.05
#: how long the scheduler may go without a capture before the producer's publisher thread publishes
#: a completed copy itself (Producer ``commit_grace_s``); an entry is announced at most this long
#: after its copy completed, and at the first forward (a capture, or a decode step's
#: ``publish_completed``) after PUBLISH_INTERVAL_S when one comes first. Longer than a forward step,
#: so through steady traffic the publisher thread sleeps instead of waking between forwards to take
#: the GIL from the scheduler's thread. Measured in a real server (H200, bench_server with a steady
#: load and the candidates' order rotated, benchmarks/results/h200-2026-12-01g): tiny shape, short
#: prompts, capture on/off 1.014 [CI 0.999-1.035] with 50 ms against 0.845 [0.634-0.969] with 5 ms,
#: in the same run. (The earlier A/B of ...-01f, which favoured 5 ms on the hook's own time, had the
#: benchmark's position effect in its throughput ratios, and the hook's own time leaves out what the
#: woken publisher thread costs the scheduler.) The floor of the grace: the hook's producer gets
#: :func:`commit_grace_for` (twice the pass log's interval with the defaults).
COMMIT_GRACE_S = 0.05
#: the producer's ``publish_interval_s``: the scheduler's thread publishes (commits and
#: announces completed copies) at most once per this long while captures keep coming, so it
#: wakes ZeroMQ's I/O thread (~25 us of its CPU per idle-pipe send) once per interval, not
#: once per forward; notices come at most this much later (in the real server at the tiny
#: shape, ~4 ms forwards: the hook's p50 311 -> 256 us, benchmarks/results/h200-2026-12-02b).
#: At the 1B long mix's ~3 GB/s of capture 20 ms is ~60 MB of ring; the producer publishes
#: early, whatever the interval, once queued entries hold 1/8 of its ring.
PUBLISH_INTERVAL_S = DEFAULT_PUBLISH_INTERVAL_MS / 1e3   # HSCAPTURE_PUBLISH_INTERVAL_MS sets it
#: the producer's ``stage_interval_s``: the hook's captures are deferred
#: (``Producer.capture_rows(defer=True)``) and those of up to this long become one ring entry,
#: so the fixed part of an entry's cost on the scheduler's thread (plan and encode, reserve,
#: header, the copies' description and submission, queueing: ~190 us of a 1B forward's ~280 us
#: hook, benchmarks/results/h200-2026-12-02c) is paid once per interval instead of once per
#: forward. Meanwhile the forward's outputs stay referenced (or, for CUDA-graph outputs, their
#: rows are copied on the GPU at once), bounded by 1/16 of the ring.
STAGE_INTERVAL_S = DEFAULT_STAGE_INTERVAL_MS / 1e3   # HSCAPTURE_STAGE_INTERVAL_MS sets it
#: the pass log (``HSCAPTURE_PASS_LOG_MS``; 0: off): a prefill pass only reads what changes
#: after it (per wanted request its attempt, finish state and prompt length; the token ids and,
#: for CUDA-graph outputs, the rows, copied) and is appended to a log; the log's passes are
#: processed (the in-flight bookkeeping, the row maps, ``Producer.capture_rows``) back to back
#: once per interval, and the producer's stage, whose interval counts from the passes' own
#: times, written when due (at once, with the default intervals). Why: in a real server the hook
#: runs with cold caches (SGLang's own Python runs between its calls) and costs 3-4x its
#: tight-loop time; processed back to back, the passes share warm caches. On the CPU proxy
#: (bench_hook --cold-mib 64) the per-pass part cost 49-89 us against 139-257 us for the
#: whole hook, and the whole hook's mean (its drains included) 21-28 % less
#: (benchmarks/results/h200-2026-12-03b). In the real server (benchmarks/results/
#: h200-2026-12-04, on/off in alternating windows of one server) the saving is smaller: the
#: hook's mean per capturing pass 274-301 vs 296-307 us (tiny Llama), on/off 0.4-0.6 points
#: higher, never lower at any shape or mix measured: ON by default (50 ms);
#: HSCAPTURE_PASS_LOG_MS=0 processes each pass at once. With CUDA-graph passes copied into one
#: arena and a drain's rows captured in one producer call (log_batch), 0.5-1.1 points higher
#: (runs 5-7 of the same folder).
PASS_LOG_INTERVAL_S = DEFAULT_PASS_LOG_MS / 1e3


def commit_grace_for(config: CaptureConfig) -> float:
    """The producer's commit grace for ``config``: :data:`COMMIT_GRACE_S`, or twice the
    longest of the pass log's, the stage's and the publish intervals where that is longer.

    Why: through steady traffic the scheduler's thread publishes at least once per such
    interval (a drain of the pass log writes the stage and publishes; a forward that captures
    nothing publishes once the publish interval passed), so the publisher thread, whose grace
    counts from the last entry queued, must wait longer than that gap or it often wins the
    race and publishes the entry itself, taking the GIL from the scheduler in the middle of a
    turn. With the defaults (pass log and stage 50 ms, COMMIT_GRACE_S 50 ms) it did: on the
    CPU proxy (bench_hook's driver, 4.5 ms turns) the publisher thread published 28-30 of
    ~66 drains' entries (benchmarks/results/h200-2026-12-04e). Twice the interval covers a
    turn as long as the interval itself. An entry is announced at most this long after its
    copy completed once the server stops stepping (100 ms with the defaults)."""
    return max(COMMIT_GRACE_S, 2.0 * max(config.pass_log_interval_s, config.stage_interval_s,
                                         config.publish_interval_s))


_MAX_LOGGED = 64          # passes held at most (bounds besides its interval: this, and the
#                           memory they keep referenced, 1/16 of the ring, as the stage's)
#: benchmark modes whose passes may be logged ("": production, and alt=N); the others
#: (nocapture, nostage, nosnapstage, devids) change how a pass is captured and are processed
#: at once
_LOGGED_MODES = frozenset({""})


@dataclass(frozen=True)
class Ranks:
    attn_tp_rank: int
    attn_cp_rank: int
    dp_rank: int

    @property
    def publisher(self) -> bool:
        return self.attn_tp_rank == 0 and self.attn_cp_rank == 0


def _read(ctx: Any, name: str) -> int | None:
    try:
        value = getattr(ctx, name)
    except Exception:  # sglang raises RuntimeError/ValueError for unpublished names
        return None
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def read_ranks() -> Ranks:
    """This process's ranks from ``sglang.srt.runtime_context.get_parallel()``.

    Raises :class:`CaptureConfigError` when the attention-TP rank cannot be read (publishing
    from every TP rank would duplicate every sample, so the hook stays inert instead).
    """
    from sglang.srt.runtime_context import get_parallel

    p = get_parallel()
    attn_tp = _read(p, "attn_tp_rank")
    if attn_tp is None:
        attn_tp_size = _read(p, "attn_tp_size")
        tp_size = _read(p, "tp_size")
        if attn_tp_size == 1 or (attn_tp_size is None and tp_size == 1):
            attn_tp = 0
        else:
            raise CaptureConfigError("cannot read attn_tp_rank from sglang's get_parallel()")
    attn_cp = _read(p, "attn_cp_rank")
    if attn_cp is None:
        cp_size = _read(p, "attn_cp_size")
        if cp_size not in (None, 1):
            raise CaptureConfigError("cannot read attn_cp_rank from sglang's get_parallel()")
        attn_cp = 0
    dp = _read(p, "dp_rank")
    if dp is None:
        dp = _read(p, "attn_dp_rank") or 0
    return Ranks(attn_tp_rank=attn_tp, attn_cp_rank=attn_cp, dp_rank=dp)


def _sglang_model_path() -> str | None:
    try:
        from sglang.srt.runtime_context import get_model

        return str(get_model().model_path)
    except Exception:
        return None


def make_producer(config: CaptureConfig, ranks: Ranks, model: str | None) -> Any:
    """The default producer factory: one :class:`~hscapture.producer.Producer` per DP rank."""
    from ..producer import Producer

    return Producer(
        endpoint_for_dp_rank(config.endpoint, ranks.dp_rank),
        producer_id=f"{config.producer_id}-dp{ranks.dp_rank}",
        capacity=config.ring_bytes,
        full_policy=config.full_policy,
        wait_timeout_s=config.wait_timeout_s,
        model=model,
        convention=config.convention,
        dp_rank=ranks.dp_rank,
        commit_grace_s=commit_grace_for(config),
        publish_interval_s=config.publish_interval_s,
        stage_interval_s=config.stage_interval_s,
    )


class SGLangCaptureHook:
    """Callable installed as the AFTER hook. One per scheduler process.

    ``producer_factory(config, ranks, model)`` and ``ranks_fn()`` are injectable for tests;
    by default the producer is created at start-up (or the first forward) on a publishing rank
    and the ranks are read from SGLang's runtime context at the first call.
    ``on_producer(hook)`` runs once the producer exists (the plugin installs its SIGTERM
    close there, in the scheduler's main thread).
    """

    def __init__(
        self,
        config: CaptureConfig,
        *,
        producer_factory: Callable[[CaptureConfig, Ranks, str | None], Any] | None = None,
        ranks_fn: Callable[[], Ranks] | None = None,
        on_producer: Callable[["SGLangCaptureHook"], Any] | None = None,
    ) -> None:
        self.config = config
        self._on_producer = on_producer
        self._producer_factory = producer_factory or make_producer
        self._ranks_fn = ranks_fn or read_ranks
        self.ranks: Ranks | None = None
        self._producer: Any = None
        self.disabled: str | None = None
        #: the plugin installed :meth:`sweep` on SGLang's scheduling step: captures' device-to-
        #: host copies are then deferred to it (``config.defer_copies``; :meth:`sweep` says why)
        self.step_hook = False
        self._deferring = False
        self.counters: collections.Counter[str] = collections.Counter()
        self._logged: set[str] = set()
        self._stats_file = os.environ.get("HSCAPTURE_STATS_FILE", "")
        self._stats_written = 0
        # benchmark only (benchmarks/bench_server.py): the file naming the hook's mode
        # (hscapture.sglang.modes), or None
        mode_file = os.environ.get("HSCAPTURE_EXPERIMENT_FILE", "")
        self._bench = BenchModes(mode_file, commit_grace_for(config)) if mode_file else None
        # per-phase timing (several us a capturing forward: two thread-CPU clock reads, a
        # syscall each, and the producer's own timers) only where someone asks for it
        # (HSCAPTURE_HOOK_PHASES=1, with a stats file to read it from): a benchmark of the
        # server's throughput measures the hook as it runs in production
        self._timing = HookTiming(phases=bool(self._stats_file) and os.environ.get(
            "HSCAPTURE_HOOK_PHASES", "") not in ("", "0"))
        #: a recorded pass turned into rows and captured (pass_capture.py); it owns the
        #: samples in flight and the done ones (samples.py): each chunk's row, restarts,
        #: reports by rid
        self._capture = PassCapture(config, self.counters, self._timing, self._log_once,
                                    self._report)
        self._samples = self._capture.samples
        # benchmark only: every forward pass, in every mode, for a throughput measure from
        # inside the scheduler (timing.ForwardLog)
        self._forward_log = _open_forward_log(os.environ.get("HSCAPTURE_FORWARD_LOG", ""))
        # diagnostic only: a cProfile of the hook's calls (timing.HookProfile), written with the
        # stats file, or every 1,000 calls without one, and at close
        prof = os.environ.get("HSCAPTURE_HOOK_PROFILE", "")
        self._profile = HookProfile(prof) if prof else None
        # diagnostic only (HSCAPTURE_TURN_COSTS=1, with a stats file): the GC's and the
        # publisher thread's time per turn, by mode and alt=N side (timing.TurnCosts)
        self._costs = TurnCosts() if self._stats_file and os.environ.get(
            "HSCAPTURE_TURN_COSTS", "") not in ("", "0") else None
        self._mode = ""          # the benchmark mode of this pass ("" outside benchmarks)
        self._swept = 0.0
        #: time.monotonic() of the last forward the hook looked at (_upstream: whether the
        #: scheduler stopped stepping)
        self._last_forward = 0.0
        #: the pass log (PASS_LOG_INTERVAL_S): recorded passes not processed yet, oldest first,
        #: and when the oldest was recorded
        self._log: list[Pass] = []
        self._log_since = 0.0
        self._log_bytes = 0       # what the logged passes keep referenced (bound: 1/16 ring)
        #: where logged passes' rows are copied (log_batch.LogArena)
        self._arenas = Arenas()
        #: the pass log's interval (the config's; settable: 0 processes each pass at once)
        self.pass_log_interval_s = config.pass_log_interval_s
        #: held by every hook call and by the producer's hand-over of the log (its flush,
        #: close, and its publisher thread once captures stop): the log and the in-flight
        #: state change under it only
        self._lock = threading.RLock()
        #: inside a hook call (a close() from a signal handler on this thread sees it: the
        #: interrupted call may hold the producer's lock, so the log is not processed then)
        self._busy = False
        #: id(forward mode) -> (that mode, whether it captures): Enum members only (_on_forward)
        self._captures_by_mode: dict[int, tuple[Any, bool]] = {}

    @property
    def producer(self) -> Any:
        """This process's producer: None before it starts, on a rank that does not publish,
        and after :meth:`close`."""
        return self._producer

    @producer.setter
    def producer(self, producer: Any) -> None:
        self._producer = self._capture.producer = producer

    # -- entry points --------------------------------------------------------------------

    def __call__(self, result: Any, worker: Any = None, batch: Any = None, *args: Any,
                 **kwargs: Any) -> None:
        """HookRegistry AFTER signature: ``(result, self_worker, batch, ...)``. Returns None
        so SGLang's result passes through unchanged. While torch's profiler records (SGLang's
        ``/start_profile``) the call is one ``hscapture.hook`` range in the trace.

        The call never runs the cyclic garbage collector (the module docstring's "Garbage
        collection" says why): it is held off for the call, and left as the call found it."""
        gc_on = gc.isenabled()
        if gc_on:
            gc.disable()
        with self._lock:
            self._busy = True
            try:
                if _profiler_enabled():
                    with _record_function("hscapture.hook"):
                        return self._forward_hook(result, worker, batch, kwargs)
                if self._profile is not None:
                    return self._profiled(result, worker, batch, kwargs)
                return self._forward_hook(result, worker, batch, kwargs)
            finally:
                self._busy = False
                if gc_on:
                    gc.enable()

    def _profiled(self, result: Any, worker: Any, batch: Any, kwargs: dict[str, Any]) -> None:
        prof = self._profile
        prof.profile.enable()
        try:
            self._forward_hook(result, worker, batch, kwargs)
        finally:
            prof.profile.disable()
            prof.calls += 1
            if not self._stats_file and prof.calls % 1000 == 0:
                self._write_profile()
        return None

    def _write_profile(self) -> None:
        try:
            self._profile.write()
        except Exception as exc:  # a diagnostic: never fail the forward
            self._log_once("profile", logging.WARNING, "hscapture: cannot write the hook "
                           "profile: %s", exc)

    def _forward_hook(self, result: Any, worker: Any, batch: Any,
                      kwargs: dict[str, Any]) -> None:
        if batch is None:
            batch = kwargs.get("batch")
        wanted: list[tuple[int, Any]] = []
        if self._costs is not None:
            self._costs.turn()
        t0 = self._timing.start()
        bench = self._bench
        try:
            if bench is not None:
                bench.phase = 0
                mode = self._mode = bench.read(t0)
                if mode == "noop":
                    return None
                if self.producer is not None:
                    bench.apply(self.producer, self.config.publish_interval_s)
                    log_s = bench.log_s
                    self.pass_log_interval_s = (self.config.pass_log_interval_s
                                                if log_s is None else log_s)
            self._on_forward(result, worker, batch, wanted)
        except Exception as exc:  # never let capture break the server
            reason = self._capture.failed(
                exc, "hscapture: capture hook failed (%s: %s) on a %s batch of %d requests; "
                "capture of this batch is dropped and reported", _mode_name(batch),
                len(getattr(batch, "reqs", None) or ()))
            try:
                self._drain()        # the logged passes before this pass's reports
            except Exception:
                self.counters["errors"] += 1
            self._capture.abort_rows(wanted, reason)
        finally:
            t1 = self._timing.mark("after")
            self._timing.add(t1 - t0, len(wanted), self._mode)
            if self._forward_log is not None:
                self._forward_log.add(t0, t1 - t0, batch, len(wanted),
                                      bench.phase if bench is not None else 0)
            if self._stats_file and t0 - self._stats_written > 1_000_000_000:
                self._stats_written = t0
                self._write_stats()
        return None

    def _write_stats(self) -> None:
        if self._forward_log is not None:
            self._forward_log.flush()     # before the report: a fresh report covers the log
        if self._profile is not None:
            self._write_profile()
        try:
            tmp = f"{self._stats_file}.tmp"
            with open(tmp, "w") as f:
                json.dump({"pid": os.getpid(), "mode": self._mode,
                           "timing": self._timing.summary(),
                           "counters": dict(self.counters),
                           **({"turn_costs": self._costs.summary()}
                              if self._costs is not None else {}),
                           "producer": {k: v for k, v in (self.producer.stats().items()
                                        if self.producer is not None else ())
                                        if isinstance(v, (int, float, str))}}, f)
            os.replace(tmp, self._stats_file)
        except Exception as exc:  # stats are best effort; never fail the forward
            self._log_once("stats", logging.WARNING, "hscapture: cannot write stats: %s", exc)

    def sweep(self, *args: Any, **kwargs: Any) -> None:
        """Report requests that stopped between chunks (aborted, finished, released).

        Installed as an AFTER hook on the scheduler's chunked-abort step, which SGLang runs at
        EVERY scheduling step (``get_next_batch_to_run``), so an abort is reported at the step
        that handles it, even when no further batch runs. It looks at the requests in flight
        only (rarely more than the one being chunked) and never processes the pass log: a
        stopped request with a chunk in the log is left until the log is processed (by a
        forward, the producer's publisher thread once forwards stop, flush or close: each
        sweeps after it), since that chunk may be its last. Why: processing the log here, as
        this did until 2026-12-04, ran at every step, kept the log from ever holding more than
        one pass and moved its processing outside the forward hook's measured time
        (benchmarks/results/h200-2026-12-04).
        """
        producer = self.producer
        if self._deferring and producer is not None:
            # The device-to-host copies of the captures made since the last step: issued
            # here, after SGLang queued the read-back of that step's results on its copy
            # stream, so that read-back (which the next turn waits for) is not queued behind
            # them in the copy engine (Producer.defer_device_copies). One native call.
            try:
                step = None if self._bench is None else self._bench.step_bytes
                producer.flush_device_copies(
                    _readback_event(args) if self.config.copies_after_readback else 0,
                    self.config.copy_step_bytes if step is None else step)
            except Exception as exc:     # each failed capture is reported by its own entry
                self._log_once("flush_copies", logging.WARNING,
                               "hscapture: deferred copies: %s", exc)
        if not self._samples.inflight:
            return None
        bench = self._bench
        if bench is not None and bench.phase == 2:
            return None    # alt=N, a skipped block: what the captured passes owe stays theirs
        gc_on = gc.isenabled()     # (held off for the call: the module docstring says why)
        if gc_on:
            gc.disable()
        try:
            with self._lock:
                if self.producer is not None:
                    t0 = time.perf_counter_ns()
                    self._samples.sweep(self._logged_requests)
                    # (outside the forward hook's clock: the stats report it)
                    self.counters["sweep_calls"] += 1
                    self.counters["sweep_ns"] += time.perf_counter_ns() - t0
        except Exception as exc:
            self.counters["errors"] += 1
            self._log_once("sweep", logging.ERROR, "hscapture: sweep failed: %s", exc,
                           exc_info=True)
        finally:
            if gc_on:
                gc.enable()
        return None

    def close(self, timeout_s: float | None = None) -> None:
        """Stop capturing in this process and close the producer: everything captured so far
        is published, the endpoint's socket and claim are removed, and the segment is
        unlinked unless a durable subscriber has not read it all
        (:meth:`hscapture.producer.Producer.close`, bounded by ``timeout_s``). Later forwards
        capture nothing (the producer is not started again)."""
        with self._lock:
            try:
                if self.producer is not None and not self._busy:
                    self._drain_and_sweep()     # the logged passes are captured passes
            except Exception as exc:
                self.counters["errors"] += 1
                self._log_once("close_drain", logging.ERROR, "hscapture: the pass log could "
                               "not be processed at close: %s", exc, exc_info=True)
            self._log = []
        self.disabled = self.disabled or "closed"
        if self._costs is not None:
            self._costs.close()
        if self._forward_log is not None:
            self._forward_log.flush()
        if self._profile is not None:
            self._write_profile()
        producer, self.producer = self.producer, None
        if producer is not None:
            producer.close(timeout_s=timeout_s)

    def stats(self) -> dict[str, Any]:
        """The hook's counters and its producer's stats (``"producer"``). The hook counts
        what it handed to the producer (``samples``, ``chunks``: rows taken for capture);
        what reached the ring is the producer's (``producer["captured_rows"]``; drops in
        ``producer["dropped"]`` and the like, once there are any), and every sample that
        did not reach it is named by rid to the subscribers."""
        out: dict[str, Any] = dict(self.counters)
        out.update(inflight=len(self._samples.inflight), disabled=self.disabled,
                   logged_passes=len(self._log),
                   logged_rows=sum(len(r.wanted) for r in self._log),
                   ranks=self.ranks, layers=self._capture.layers)
        if self.producer is not None:
            try:
                out["producer"] = self.producer.stats()
            except Exception:
                pass
        return out

    # -- internals -----------------------------------------------------------------------

    def start(self, *args: Any, **kwargs: Any) -> None:
        """Read the ranks and start the producer now (publishing ranks only). Never raises.

        Installed as an AFTER hook on ``Scheduler.__init__`` so the producer (and its
        endpoint) exists once the server is up, before any request: a subscriber attached
        then sees every capture. Otherwise the first forward pass starts it.
        """
        try:
            self._ensure_started()
        except Exception as exc:
            self.counters["errors"] += 1
            self._log_once("start", logging.ERROR, "hscapture: start failed: %s", exc,
                           exc_info=True)
        return None

    def _ensure_started(self) -> bool:
        """True when this process publishes and its producer is running."""
        if self.disabled is not None:
            return False
        if self.ranks is None:
            try:
                self.ranks = self._ranks_fn()
            except Exception as exc:
                self._disable(f"cannot determine this process's ranks: {exc}")
                return False
        if not self.ranks.publisher:
            return False
        if self.producer is None:
            try:
                self.producer = self._producer_factory(
                    self.config, self.ranks, self.config.model or _sglang_model_path())
                self.producer.timed = self._timing.phases
                self.producer.upstream = self._upstream
                if self.step_hook and self.config.defer_copies and \
                        hasattr(self.producer, "defer_device_copies"):
                    self._deferring = bool(self.producer.defer_device_copies(True))
            except Exception as exc:
                self._disable(f"cannot start the producer: {type(exc).__name__}: {exc}")
                return False
            log.info("hscapture: capturing on DP rank %d (attn TP/CP rank 0), endpoint %s",
                     self.ranks.dp_rank, getattr(self.producer, "endpoint", "?"))
            if self._costs is not None and hasattr(self.producer, "publisher_thread"):
                self._costs.watch(self.producer.publisher_thread)
            if self._on_producer is not None:
                try:
                    self._on_producer(self)   # the plugin: close on SIGTERM
                except Exception as exc:
                    self._log_once("on_producer", logging.WARNING,
                                   "hscapture: start-up callback failed: %s", exc)
        return True

    def _on_forward(self, result: Any, worker: Any, batch: Any,
                    wanted: list[tuple[int, Any]]) -> None:
        if batch is None or (self.producer is None and not self._ensure_started()):
            return
        # Whether this pass's mode captures, remembered per mode: SGLang's ForwardMode members
        # are singletons with a fixed name, and reading an Enum's ``.name`` runs several
        # Python calls each pass. Anything but an Enum member is read every pass.
        mode = getattr(batch, "forward_mode", None)
        known = self._captures_by_mode.get(id(mode))
        if known is not None and known[0] is mode:
            prefill = known[1]
        else:
            prefill = _mode_name(batch) in CAPTURE_MODES
            if isinstance(mode, enum.Enum):   # (kept referenced: its id stays its own)
                self._captures_by_mode[id(mode)] = (mode, prefill)
        # benchmark mode alt=N: whether this pass is on the skipped side
        skip = self._bench is not None and self._bench.side(prefill)
        if self._costs is not None:
            self._costs.key = (self._mode, self._bench.phase if self._bench is not None else 0)
        now = self._last_forward = time.monotonic()
        if self._log and not skip and now - self._log_since >= self.pass_log_interval_s:
            self._drain_and_sweep()     # the pass log is due (also when no prefill comes)
        if self._samples.inflight and not skip and now - self._swept > _SWEEP_INTERVAL_S:
            # a request stopped between chunks is reported within this; one with a chunk in
            # the log is left to the log's processing, as the scheduler's step leaves it
            # (sweep()); the log is processed by its own interval alone. (Until 2026-12-04
            # this drained the log too: a second 50 ms timer, with no measured effect.)
            self._swept = now
            self._samples.sweep(self._logged_requests)
        if not prefill:
            # DECODE/IDLE/verify/...: prefix_lens & co are stale, read nothing; announce what
            # the last captures' copies finished (else it waits for the commit grace)
            if not skip:
                self.producer.publish_completed()
            return
        dec = batch.decoding_reqs
        decoding = {id(r) for r in dec} if dec else None
        cfg = self.config
        prefix, param, wants = cfg.rid_prefix, cfg.param, cfg.wants
        for i, r in enumerate(batch.reqs):
            if decoding is not None and id(r) in decoding:
                continue
            rid = r.rid
            if (prefix and type(rid) is str and rid.startswith(prefix)) or (param and wants(r)):
                wanted.append((i, r))
        if skip:
            # a skipped pass of alt=N costs what a pass of "off" costs (the selection above),
            # and publishes nothing: what the capturing passes owe stays theirs
            wanted.clear()
            return
        if not wanted:
            self.producer.publish_completed()
            return
        self.counters["batches"] += 1
        self._timing.mark("select")
        mode = self._mode
        if self.pass_log_interval_s > 0 and (mode in _LOGGED_MODES or mode.startswith("alt=")):
            self._log_pass(result, worker, batch, wanted)
        else:
            self._drain()
            self._capture.process(record_pass(result, worker, batch, wanted, self._mode,
                                      self.config.final_norm))

    def _log_pass(self, result: Any, worker: Any, batch: Any,
                  wanted: list[tuple[int, Any]]) -> None:
        """Keep this pass for later (the pass log, ``HSCAPTURE_PASS_LOG_MS``), or process it
        now when it cannot wait (see :func:`.passes.hold`) or the log is due."""
        rec = record_pass(result, worker, batch, wanted, self._mode, self.config.final_norm)
        if not hold(rec, self._arenas, self.config.ring_bytes // 16):
            self._drain()               # what came before it first: the calls' order
            self._capture.process(rec)
            return
        log = self._log
        rec.since = now = time.monotonic()
        if not log:
            self._log_since = now
            self._log_bytes = 0
        log.append(rec)
        self._log_bytes += rec.nbytes
        if len(log) >= _MAX_LOGGED or self._log_bytes >= self.config.ring_bytes // 16 or \
                now - self._log_since >= self.pass_log_interval_s:
            self._drain()

    def _drain(self) -> None:
        """Process every logged pass, oldest first; the producer's stage counts its interval
        from the passes' own times, so it is written now when that passed (the log's interval
        is the stage's by default). A pass whose processing fails has its opted-in requests
        reported (as a failed hook call does), the others go on."""
        log = self._log
        if not log:
            return
        self._log = []
        self._capture.process_log(log)
        if self.producer is not None:
            # the stage counts its interval from the logged passes' own times: due now
            # (unless its interval is the longer), and written at once
            self.producer.publish_completed()

    def _upstream(self, idle: bool) -> None:
        """The producer's hand-over (``Producer.upstream``): the logged passes, at once from
        its ``flush`` / ``close``, and from its publisher thread (``idle``) once the scheduler
        stopped stepping: no forward for the log's interval (and the log that old). While
        forwards come, the next one processes a due log itself (``_on_forward``); the
        publisher thread doing it instead, as it did at any wake-up once the log was due until
        2026-12-04, took the GIL and this hook's lock in the middle of a turn."""
        if not self._log:
            return
        if idle:
            now, interval = time.monotonic(), self.pass_log_interval_s
            if now - self._log_since < interval or now - self._last_forward < interval:
                return
        with self._lock:
            self._drain_and_sweep()

    def _drain_and_sweep(self) -> None:
        """Process the pass log, then report the requests in flight that stopped: those the
        scheduler's step (:meth:`sweep`) left because the log held a chunk of them. Every
        hand-over of the log but the ones that keep a call's order ends this way."""
        self._drain()
        if self._samples.inflight:
            self._samples.sweep()

    def _report(self, rid: str, reason: str, restart: bool, attempt: int) -> None:
        """Report ``rid`` to the producer (:class:`SampleTracker`'s ``abort``)."""
        if self.producer is not None:
            self.producer.abort(rid, reason, restart=restart, extra={"attempt": attempt})

    def _logged_requests(self) -> set[int]:
        """The ids of the requests with a pass in the log (a sweep leaves them to the log's
        processing: that pass may hold the last chunk)."""
        return {id(r) for rec in self._log for _, r in rec.wanted}

    def _disable(self, why: str) -> None:
        self.disabled = why
        log.error("hscapture: capture disabled in this process: %s", why)

    def _log_once(self, key: str, level: int, msg: str, *args: Any, exc_info: bool = False
                  ) -> None:
        if key in self._logged:
            return
        self._logged.add(key)
        log.log(level, msg, *args, exc_info=exc_info)


def _open_forward_log(path: str) -> ForwardLog | None:
    """The forward log at ``path`` (``HSCAPTURE_FORWARD_LOG``), or None: none asked for, or
    the file cannot be made (logged; the hook runs without it)."""
    if not path:
        return None
    try:
        return ForwardLog(path)
    except OSError as exc:
        log.warning("hscapture: no forward log at %s: %s", path, exc)
        return None


def _mode_name(batch: Any) -> str:
    mode = getattr(batch, "forward_mode", None)
    return getattr(mode, "name", str(mode))


def _readback_event(args: tuple) -> int:
    """The CUDA event handle SGLang records behind its latest result read-back (the overlap
    scheduler's ``result_queue[-1]``'s ``copy_done``), from the step hook's arguments
    (``(result, scheduler, ...)``); 0 where there is none (the normal loop processes each
    result before the next step, an event never recorded, another engine version).

    Why the flush waits for it: the deferred copies are issued after SGLang queued that
    read-back, but they wait only for the forward's end, which comes before the sampling the
    read-back waits for: the copy engine may then be busy with them (a drain's ~270 MB at the
    1B shape: ~5 ms at 55 GB/s) when the read-back, and the turn that waits for it, arrive.
    The candidate cause of the 1B shape's 2-3 ms longer turns after a drain
    (benchmarks/results/h200-2026-12-05b); ``benchmarks/bench_copy_contention.py --orders``
    measures the pattern. Off by default until measured (``copies_after_readback``)."""
    try:
        queue = getattr(args[1], "result_queue", None)
        if not queue:
            return 0
        handle = getattr(queue[-1][1].copy_done, "cuda_event", 0)
        return handle if type(handle) is int and handle > 0 else 0
    except (IndexError, AttributeError, TypeError):
        return 0
