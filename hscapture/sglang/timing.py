"""The hook's own instrumentation, for benchmarks: what it costs per forward pass
(:class:`HookTiming`) and what the scheduler did meanwhile (:class:`ForwardLog`).

Nothing here runs unless a benchmark asks for it (``HSCAPTURE_STATS_FILE``,
``HSCAPTURE_EXPERIMENT_FILE``, ``HSCAPTURE_FORWARD_LOG``), and nothing here ever raises into
the forward pass: a log that cannot be written is switched off, logged once.
"""

from __future__ import annotations

import collections
import logging
import os
import time
from array import array
from typing import Any, Iterable

import numpy as np

log = logging.getLogger("hscapture.sglang")

#: the fields of one :class:`ForwardLog` record, each a little-endian int64, in file order
FORWARD_FIELDS = ("t_ns", "hook_ns", "tokens", "rows", "extend", "phase")


class ForwardLog:
    """Every forward pass the hook is called for, in EVERY mode (capture off and ``noop``
    too): a throughput measure from inside the scheduler, which the HTTP front end's and the
    client's jitter do not reach.

    One record per call, :data:`FORWARD_FIELDS`: ``t_ns`` the hook's entry on the
    scheduler's thread (``time.perf_counter_ns``: CLOCK_MONOTONIC on Linux, one clock for every
    process of the host, so a client's ``time.perf_counter`` windows select records),
    ``hook_ns`` the hook's wall time, ``tokens`` the tokens the batch computed (a prefill
    pass: ``extend_num_tokens``, else the sum of ``extend_lens``; any other: one per request),
    ``rows`` the rows captured,
    ``extend`` 1 for a prefill (EXTEND/MIXED) pass, ``phase`` which side of the benchmark
    mode ``alt=N`` the pass was on (1 captured, 2 skipped; 0 outside that mode). The interval
    between two entries is one turn of the scheduler's loop: its sum over a busy window is
    that window's length.

    Records are buffered in memory (48 bytes each) and appended to ``path`` at
    :meth:`flush` (the hook flushes with its stats report, about once a second, and when
    :attr:`capacity` records are buffered); the file is truncated when the log is made.
    :func:`read_forward_log` reads it back. A write that fails switches the log off (logged
    once): the forward pass never sees it.
    """

    def __init__(self, path: str, capacity: int = 8192) -> None:
        self.path = path
        self.capacity = capacity
        self._buf = array("q")
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND,
                                       0o644)

    def add(self, t_ns: int, hook_ns: int, batch: Any, rows: int, phase: int = 0) -> None:
        """One forward pass: its hook's entry clock and wall time, its batch, rows captured,
        its side of ``alt=N``."""
        if self._fd is None:
            return
        mode = getattr(getattr(batch, "forward_mode", None), "name", "")
        extend = mode in ("EXTEND", "MIXED")
        tokens = getattr(batch, "extend_num_tokens", None) if extend else None
        if tokens is None:
            tokens = (sum(getattr(batch, "extend_lens", None) or ()) if extend
                      else len(getattr(batch, "reqs", None) or ()))
        self._buf.extend((t_ns, hook_ns, int(tokens), rows, extend, phase))
        if len(self._buf) >= self.capacity * len(FORWARD_FIELDS):
            self.flush()

    def flush(self) -> None:
        """Append the buffered records to the file (one ``write``)."""
        if self._fd is None or not self._buf:
            return
        data, self._buf = self._buf.tobytes(), array("q")
        try:
            while data:
                data = data[os.write(self._fd, data):]
        except OSError as exc:
            log.warning("hscapture: forward log %s switched off: %s", self.path, exc)
            self.close()

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def read_forward_log(path: str) -> np.ndarray:
    """The records of a :class:`ForwardLog` file: a structured array of
    :data:`FORWARD_FIELDS` (int64 each), in call order. A trailing partial record (a reader
    racing a flush) is left out. A path ending in ``.xz`` is read through ``lzma`` (the
    benchmark results keep their logs so: ~7x smaller)."""
    if str(path).endswith(".xz"):
        import lzma

        with lzma.open(path, "rb") as f:
            raw = np.frombuffer(f.read(), dtype="<i8")
    else:
        raw = np.fromfile(path, dtype="<i8")
    k = len(FORWARD_FIELDS)
    raw = raw[: len(raw) // k * k].reshape(-1, k)
    out = np.zeros(len(raw), dtype=[(f, "<i8") for f in FORWARD_FIELDS])
    for i, f in enumerate(FORWARD_FIELDS):
        out[f] = raw[:, i]
    return out


class HookTiming:
    """Wall time the hook spends per forward pass on the scheduler's thread, and the part of
    it spent inside ``Producer.capture_rows`` (the rest is the hook's own reading of the
    batch). Percentiles are over the last 4,096 capturing calls of each benchmark mode (the
    mode ``HSCAPTURE_EXPERIMENT_FILE`` names; ``""`` outside benchmarks), so modes that
    alternate in one run do not mix. With ``phases`` (the hook sets it when a stats file is
    configured and ``HSCAPTURE_HOOK_PHASES=1``) each capturing call is also cut into phases at
    :meth:`mark` (``select``: the experiment mode and picking the opted-in rows; ``rows``: the
    batch's checks and the row maps; ``ids``: the token ids and blocks; ``capture``:
    ``Producer.capture_rows``; ``after``: the in-flight bookkeeping), summed per mode: the
    summary's ``phases_mean_us`` is each phase's mean per capturing call, beside
    ``thread_cpu``, the calling thread's CPU time per such call (the rest of the wall time it
    waited: for the GIL, a lock, the driver). ``capturing_calls`` / ``producer_calls``: every
    capturing call and every ``Producer.capture_rows`` call per mode, not only the last 4,096
    (with the pass log, one producer call covers a drain's passes: their ratio is the passes
    per call)."""

    def __init__(self, phases: bool = False) -> None:
        #: whether calls are cut into phases (:meth:`mark`); without, marks only read the clock
        self.phases = phases
        self._last = self._cpu0 = 0
        self._marks: list[tuple[str, int]] = []
        self._phases: collections.defaultdict[str, collections.Counter[str]] = \
            collections.defaultdict(collections.Counter)
        self.calls = 0
        self.total_ns = 0
        self.max_ns = 0
        self.rows = 0
        self._recent: collections.defaultdict[str, collections.deque[int]] = \
            collections.defaultdict(lambda: collections.deque(maxlen=4096))
        self._producer: collections.defaultdict[str, collections.deque[int]] = \
            collections.defaultdict(lambda: collections.deque(maxlen=4096))
        self.capturing_calls: collections.Counter[str] = collections.Counter()
        self.producer_calls: collections.Counter[str] = collections.Counter()

    def start(self) -> int:
        """The clock at the start of a hook call (ns); forgets the last call's marks."""
        if self.phases:
            self._marks.clear()
            self._cpu0 = time.thread_time_ns()
        self._last = now = time.perf_counter_ns()
        return now

    def mark(self, phase: str) -> int:
        """End ``phase`` of this call now (with :attr:`phases`); returns the clock (ns)."""
        now = time.perf_counter_ns()
        if self.phases:
            self._marks.append((phase, now - self._last))
            self._last = now
        return now

    def add(self, ns: int, rows: int, mode: str = "") -> None:
        self.calls += 1
        self.total_ns += ns
        self.rows += rows
        self.max_ns = max(self.max_ns, ns)
        if rows:
            self._recent[mode].append(ns)
            self.capturing_calls[mode] += 1
            if len(self._marks) > 2:        # a call that reached its row maps: phases count
                sums = self._phases[mode]
                sums["calls"] += 1
                # the calling thread's CPU time: wall minus it is time spent waiting (for the
                # GIL another thread held, a lock, the driver)
                sums["thread_cpu"] += time.thread_time_ns() - self._cpu0
                for phase, dt in self._marks:
                    sums[phase] += dt

    def add_producer(self, ns: int, mode: str = "") -> None:
        self._producer[mode].append(ns)
        self.producer_calls[mode] += 1

    def summary(self) -> dict[str, Any]:
        def pct(values: Iterable[int]) -> dict[str, float]:
            got = sorted(values)
            if not got:
                return {"n": 0, "p50_us": 0.0, "p90_us": 0.0, "p99_us": 0.0}
            at = lambda q: got[min(len(got) - 1, int(q * len(got)))] / 1e3  # noqa: E731
            return {"n": len(got), "p50_us": at(0.5), "p90_us": at(0.9), "p99_us": at(0.99)}

        now = pct(self._recent.get("", ()))
        return {"calls": self.calls, "rows": self.rows, "total_ms": self.total_ns / 1e6,
                "max_us": self.max_ns / 1e3, "capturing_calls_recent": now["n"],
                "p50_us": now["p50_us"], "p90_us": now["p90_us"], "p99_us": now["p99_us"],
                "by_mode": {m: {"hook": pct(v), "producer": pct(self._producer.get(m, ())),
                                "capturing_calls": self.capturing_calls[m],
                                "producer_calls": self.producer_calls[m],
                                "phases_mean_us": _means(self._phases.get(m))}
                            for m, v in self._recent.items()}}


def _means(sums: "collections.Counter[str] | None") -> dict[str, float]:
    """Each phase's mean per call (µs) of a :class:`HookTiming` phase sum."""
    if not sums or not sums["calls"]:
        return {}
    n = sums["calls"]
    return {k: v / n / 1e3 for k, v in sums.items() if k != "calls"} | {"calls": n}


class HookProfile:
    """cProfile of the hook's own calls only (``HSCAPTURE_HOOK_PROFILE=FILE``, a diagnostic:
    the profiler slows every profiled call several times, so read proportions, not times).
    :meth:`write` replaces ``FILE`` with the functions sorted by own time and by cumulative
    time, and the number of hook calls to divide them by."""

    def __init__(self, path: str) -> None:
        import cProfile

        self.path = path
        self.profile = cProfile.Profile()
        self.calls = 0

    def write(self) -> None:
        import io
        import pstats

        out = io.StringIO()
        out.write(f"hook calls profiled: {self.calls}\n")
        try:
            st = pstats.Stats(self.profile, stream=out)
        except TypeError:        # nothing profiled yet
            return
        st.sort_stats("tottime").print_stats(60)
        st.sort_stats("cumulative").print_stats(40)
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            f.write(out.getvalue())
        os.replace(tmp, self.path)


class TurnCosts:
    """What the scheduler's process spends outside the hook, per benchmark mode and ``alt=N``
    side (``HSCAPTURE_TURN_COSTS=1`` with a stats file; a diagnostic): the cyclic garbage
    collector's runs and their time (``gc.callbacks``, whichever thread ran them), and the CPU
    time of the producer's publisher thread (its thread CPU clock, read once per hook call).

    A turn is one hook call's start to the next one's: :meth:`turn` at each call's start
    charges the publisher's CPU since the last start to the turn that ends, then the hook sets
    :attr:`key` to ``(mode, side)`` of the new pass once it knows it (the side: 1 captured,
    2 skipped, 0 outside ``alt=N``); a collection is charged to the key current when it ran.
    Why: after a long hook call the rest of its turn is longer too
    (benchmarks/results/h200-2026-12-04b, "After a long hook call"), and these are two of the
    candidates."""

    def __init__(self) -> None:
        import gc

        self._gc = gc
        self.key: tuple[str, int] = ("", 0)
        #: per key: turns, then per generation 0-2 collections and their ns, then publisher ns
        self.sums: collections.defaultdict[tuple[str, int], list[int]] = \
            collections.defaultdict(lambda: [0] * 8)
        self._gc_start = 0
        self._clock: int | None = None
        self._last_cpu = 0
        gc.callbacks.append(self._on_gc)

    def watch(self, thread: Any) -> None:
        """Read ``thread``'s CPU clock from now on (the producer's publisher thread)."""
        try:
            self._clock = time.pthread_getcpuclockid(thread.ident)
            self._last_cpu = time.clock_gettime_ns(self._clock)
        except (AttributeError, OSError, TypeError):   # no such clock here: GC alone
            self._clock = None

    def turn(self) -> None:
        """A hook call starts: the turn of :attr:`key` ends."""
        s = self.sums[self.key]
        s[0] += 1
        if self._clock is not None:
            try:
                now = time.clock_gettime_ns(self._clock)
            except OSError:          # the thread ended
                self._clock = None
                return
            s[7] += now - self._last_cpu
            self._last_cpu = now

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter_ns()
            return
        g = min(2, int(info.get("generation", 2)))
        s = self.sums[self.key]
        s[1 + g] += 1
        s[4 + g] += time.perf_counter_ns() - self._gc_start

    def summary(self) -> dict[str, dict[str, float]]:
        """Per ``"MODE|SIDE"``: turns, collections per generation, and per turn the GC's and
        the publisher thread's time (µs)."""
        out = {}
        for (mode, side), s in self.sums.items():
            n = max(1, s[0])
            out[f"{mode}|{side}"] = {
                "turns": s[0], "gc_runs": s[1:4], "gc_us_per_turn": sum(s[4:7]) / n / 1e3,
                "gc_gen2_us_per_turn": s[6] / n / 1e3, "publisher_us_per_turn": s[7] / n / 1e3}
        return out

    def close(self) -> None:
        try:
            self._gc.callbacks.remove(self._on_gc)
        except ValueError:
            pass
