"""The producer: engine-agnostic capture into the ring, announced over ZeroMQ (protocol v3).

One :meth:`Producer.capture_batch` call (one forward pass of an engine) becomes ONE ring entry:
one reservation, one encoded meta (:mod:`hscapture.record`), one CUDA event on the caller's
stream and one copy per data block on a side stream. A publisher thread commits each entry
once its copy is done and only then announces it. Drops and aborts are ring entries too
(control entries, in the ring's reserved headroom), so a subscriber that was away finds in
the ring everything it missed (docs/PROTOCOL.md).
"""

from __future__ import annotations

import atexit
import collections
import logging
import math
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from . import notice as nt
from . import record as rec
from ._announcer import Announcer
from ._control import ControlLog
from ._copies import EntryCopier, HostRowIds
from ._cuda_copy import flush_deferred
from ._entries import SPLIT, EntryWriter
from ._fork import generation
from ._publish_queue import PublishQueue
from ._staging import Stage
from ._producer_resources import ProducerResources
from .endpoint import check_endpoint, default_endpoint
from .errors import CaptureConfigError, HSCaptureError
from .limits import MAX_WAIT_TIMEOUT_S

log = logging.getLogger("hscapture")

__all__ = ["Producer", "Row", "FULL_POLICIES", "EXIT_CLOSE_TIMEOUT_S"]

FULL_POLICIES = ("drop", "wait")
_TORCH_NAMES = {getattr(torch, name): name for name in nt.DTYPES}
#: How long the close at process exit (atexit, or a signal handler) may wait for copies in
#: flight and the last notices before it gives up the orderly part (see Producer.close).
EXIT_CLOSE_TIMEOUT_S = 5.0


@dataclass(slots=True)
class Row:
    """One request chunk of a batch: token rows ``[src_start, src_start + token_count)`` of
    the batch's source blocks hold positions ``[token_start, token_start + token_count)`` of
    request ``rid``. ``fields`` are per-token uint8 values (e.g. ``loss_mask``), each exactly
    ``token_count`` bytes."""

    rid: str
    src_start: int
    token_count: int
    token_start: int = 0
    last: bool = True
    cached_prefix: int = 0
    extra: Mapping[str, Any] | None = None
    fields: Mapping[str, bytes] | None = None


def _dtype_name(dtype: torch.dtype) -> str:
    name = _TORCH_NAMES.get(dtype)
    if name is None:
        raise CaptureConfigError(f"dtype: expected one of {sorted(nt.DTYPES)}, found {dtype}")
    return name


def _forward(part: str, name: str) -> property:
    """A Producer attribute that is its part's (``self.<part>.<name>``): reading it reads the
    part's, setting it (a wrapper, in a test or a benchmark) sets the part's, which the part
    then calls instead of its method, and deleting it gives the part its method back."""
    return property(lambda self: getattr(getattr(self, part), name),
                    lambda self, value: setattr(getattr(self, part), name, value),
                    lambda self: delattr(getattr(self, part), name),
                    doc=f"``{part}.{name}`` (see :func:`_forward`)")


class Producer:
    """Captures hidden states into a shared-memory ring and announces them over ZeroMQ.

    Guarantees:
    - ``capture``/``capture_batch`` never block on the GPU and never synchronize the caller's
      stream; under the ``drop`` policy they never wait for ring space (``wait`` waits at most
      ``wait_timeout_s``).
    - An entry is announced only after its bytes are completely in the ring.
    - Every row gets a sequence number only once it is certain to be recorded: in the ring as
      data, in the ring as a ``drop`` entry, in the bounded backlog (written as soon as the ring
      has room) or, past that bound, counted as ``unrecorded`` in every heartbeat.
    - Captures made before any subscriber attached are named to the first subscriber in an
      ``unheard`` entry (bounded; the rest counted); ``wait_for_subscribers`` holds the first
      captures back instead.
    - An entry is announced at most ``commit_grace_s`` after its copy completed, at once
      when a later capture, an abort or :meth:`flush` comes first: the capturing thread
      publishes completed entries itself (waiting at most 0.5 ms for the send lock while the
      publisher thread sends a heartbeat: ``_announcer.INLINE_LOCK_WAIT_S``), and the
      publisher thread steps in only once no capture came for ``commit_grace_s`` (through
      captures closer together than that it sleeps, so the engine's thread does not hand it
      the GIL once per capture). The default, 5 ms, keeps an idle producer's latency low.
      An engine that steps continuously wants a grace longer than its step: the SGLang hook
      uses 50 ms, because with 5 ms and ~7 ms steps the woken thread cost the scheduler
      throughput (H200 runs of ``benchmarks/results/h200-2026-12-01g``). With
      ``inline_publish`` false (settable at any time) only the publisher thread publishes,
      as soon as each copy completed (no grace): the capturing thread then never pays for a
      commit or a notice, at the price of GIL hand-offs.
    - ``publish_interval_s`` > 0 coalesces the capturing thread's publishing: after a capture
      (or :meth:`publish_completed`) it publishes only once that long passed since it last
      did, or once the queued entries hold ``capacity // 8`` bytes of the ring; then every
      completed entry goes out back to back. Why: a notice into an idle ZeroMQ pipe wakes the
      socket's I/O thread, which costs the sending thread ~25 us of CPU against ~1 us for a
      notice right behind another (benchmarks/results/cpu-2core-2026-12-02b); an engine
      stepping every few ms pays that once per interval instead of once per forward. An
      entry is then announced at most ``publish_interval_s`` (plus one step) after its copy
      completed while captures keep coming, and the commit grace covers the rest. Default 0:
      publish after every capture.
    - ``stage_interval_s`` > 0 lets an engine adapter defer its captures
      (``capture_rows(defer=True)``): those of up to that long (or ``stage_bytes``, default
      1/16 of the ring and at most 1/4, of memory held) become ONE entry, so the fixed cost of an entry on
      the capturing thread is paid once per interval (:mod:`hscapture._staging`). Staged
      rows are written before anything that takes a sequence number after them (another
      capture, an abort, ``flush``, ``close``), and by the publisher thread once captures
      stop: within ``heartbeat_interval_s`` after the interval passed.
    - ``close()`` waits for every copy in flight and publishes everything before it unmaps
      the ring; a segment that a durable subscriber has not finished reading is left in
      ``/dev/shm`` for it (``hscapture cleanup`` removes it once read or unsubscribed).
    - A constructor that fails releases everything it claimed.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        producer_id: str = "default",
        capacity: int = 1 << 30,
        max_consumers: int = 8,
        full_policy: str = "drop",
        wait_timeout_s: float = 0.0,
        model: str | None = None,
        convention: str = "",
        heartbeat_interval_s: float = 0.1,
        dp_rank: int = 0,
        pin: bool = True,
        sndhwm: int = 1_000_000,
        control_reserve: int | None = None,
        wait_for_subscribers: int = 0,
        wait_for_subscribers_s: float = 30.0,
        durable_expiry_s: float = 0.0,
        commit_grace_s: float = 0.005,
        inline_publish: bool = True,
        publish_interval_s: float = 0.0,
        stage_interval_s: float = 0.0,
        stage_bytes: int | None = None,
    ) -> None:
        #: the fork generation this producer was made in: a forked child's copy (its atexit
        #: close above all) gives nothing back (:mod:`hscapture._fork`)
        self._gen = generation()
        if full_policy not in FULL_POLICIES:
            raise CaptureConfigError(
                f"full_policy: expected one of {FULL_POLICIES}, found {full_policy!r}")
        try:
            self.producer_id = nt.check_producer_id(producer_id)
        except HSCaptureError as exc:
            raise CaptureConfigError(str(exc)) from None
        self.endpoint = check_endpoint(endpoint or default_endpoint(producer_id))
        self.full_policy = full_policy
        try:
            wait = float(wait_timeout_s)
        except (TypeError, ValueError):
            wait = math.nan
        if not 0.0 <= wait <= MAX_WAIT_TIMEOUT_S:   # (nan fails too; inf would block forever)
            raise CaptureConfigError(
                f"wait_timeout_s: expected seconds from 0 to {MAX_WAIT_TIMEOUT_S:g}, found "
                f"{wait_timeout_s!r}")
        self.wait_timeout_s = wait
        self.model = _utf8("model", model or "")
        self.convention = _utf8("convention", convention)
        self.dp_rank = int(dp_rank)
        self.heartbeat_interval_s = heartbeat_interval_s
        self.commit_grace_s = max(0.0, float(commit_grace_s))
        #: whether the capturing thread publishes completed entries (see the class docstring)
        self.inline_publish = bool(inline_publish)
        #: the capturing thread's publish coalescing (see the class docstring); settable
        self.publish_interval_s = max(0.0, float(publish_interval_s))
        #: whether captures time their stages into the ``time_*`` counters of :meth:`stats`
        #: (~2 us a capture; off unless a benchmark or an engine's stats report asks)
        self.timed = False
        #: an engine adapter's hand-over of captures it holds back (``upstream(idle)``; None:
        #: none): called, never under the capture lock, by :meth:`flush` and :meth:`close`
        #: first (``idle=False``), and by the publisher thread with ``idle=True`` while no
        #: entry waits to be published (about every ``heartbeat_interval_s`` once captures
        #: stop), so what the adapter holds reaches the ring even when its engine goes quiet
        self.upstream: Callable[[bool], None] | None = None
        capacity = -(-int(capacity) // 64) * 64   # the ring's record alignment
        if control_reserve is None:
            control_reserve = min(4 << 20, capacity // 8) // 64 * 64
        self._res = ProducerResources(
            self.endpoint, producer_id, capacity=capacity, max_consumers=max_consumers,
            control_reserve=control_reserve, durable_expiry_s=durable_expiry_s, pin=pin,
            sndhwm=sndhwm)
        self._ring = self._res.ring
        self.epoch: int = self._ring.epoch
        self.segment: str = self._ring.name

        self._lock = threading.Lock()          # reserve order == seq order == queue order
        self._pubq = PublishQueue()            # entries until committed + announced
        self._counters: collections.Counter[str] = collections.Counter()
        self._control = ControlLog()
        self._copier = EntryCopier(self._res.pinned is not None, self._counters)
        #: deferred captures (``capture_rows(defer=True)``) waiting to become one entry
        # (at most a quarter of the ring: a staged entry, merged rows included, always fits
        # an empty ring; only one forward's own rows can be larger, as without a stage)
        self._stage = Stage(stage_interval_s, min(
            self._ring.capacity // 4,
            self._ring.capacity // 16 if stage_bytes is None else int(stage_bytes)))
        #: the last deferred capture's layout and stage key, and what they were built from
        #: (:meth:`_staged_layout`)
        self._layout_memo: tuple | None = None
        #: what goes into the ring, under ``_lock`` (:mod:`hscapture._entries`); it holds the
        #: next sequence number and the closed flag
        self._entries = EntryWriter(self, self._lock, self._ring, self._pubq, self._control,
                                    self._counters, self._copier, self._stage)
        #: commits and announces it, heartbeats (:mod:`hscapture._announcer`)
        self._announcer = Announcer(self, self._entries, self._pubq, self._ring, self._res.sock,
                                    self._control, self._counters)
        self._announcer.hello()
        self._thread = threading.Thread(target=self._announcer.publish_loop,
                                        name="hscapture-publisher", daemon=True)
        self._thread.start()
        self._finalizer = weakref.finalize(self, Producer._atexit_close, weakref.ref(self))
        atexit.register(self._finalizer)
        if wait_for_subscribers:
            self.wait_for_consumers(wait_for_subscribers, wait_for_subscribers_s)

    # -- public API --------------------------------------------------------------------

    def capture(
        self,
        rid: str,
        tensors: Sequence[torch.Tensor],
        *,
        layers: Sequence[int],
        layer_kinds: Sequence[str] | None = None,
        token_start: int = 0,
        is_last_chunk: bool = True,
        token_ids: Any,
        cached_prefix: int = 0,
        snapshot: bool = False,
        extra: Mapping[str, Any] | None = None,
        fields: Mapping[str, Any] | None = None,
    ) -> bool:
        """Capture one chunk of one request: ``tensors[i]`` is layer ``layers[i]``, ``[T, H]``.

        A batch of one row (see :meth:`capture_batch`). Returns True when the chunk went into
        the ring, False when it was dropped (the drop is recorded and announced).
        """
        tensors = list(tensors)
        n_kinds = len(layer_kinds) if layer_kinds is not None else len(layers)
        if not tensors or len(tensors) != len(layers) or n_kinds != len(layers):
            raise CaptureConfigError(
                f"expected one tensor and one kind per layer: {len(layers)} layers, "
                f"{len(tensors)} tensors, {n_kinds} kinds")
        first = tensors[0]
        if first.dim() != 2:
            raise CaptureConfigError(f"tensors must be [tokens, hidden], found {tuple(first.shape)}")
        for i, t in enumerate(tensors):
            if t.shape != first.shape or t.dtype != first.dtype or t.device != first.device:
                raise CaptureConfigError(
                    f"tensor {i} (layer {layers[i]}): expected {tuple(first.shape)} "
                    f"{first.dtype} on {first.device}, found {tuple(t.shape)} {t.dtype} "
                    f"on {t.device}")
        count = int(first.shape[0])
        if count == 0:
            raise CaptureConfigError("a chunk must hold at least one token")
        row = Row(rid, 0, count, token_start, is_last_chunk, cached_prefix, extra,
                  _field_bytes(fields, count))
        return self.capture_batch([row], tensors, layers=layers, layer_kinds=layer_kinds,
                                  token_ids=token_ids, snapshot=snapshot)

    def capture_batch(
        self,
        rows: Sequence[Row],
        blocks: Sequence[torch.Tensor],
        *,
        layers: Sequence[int],
        layer_kinds: Sequence[str] | None = None,
        token_ids: Any,
        layer_map: Sequence[Sequence[int]] | None = None,
        hidden: int | None = None,
        snapshot: bool = False,
    ) -> bool:
        """Capture several request chunks of one forward pass as ONE ring entry.

        ``blocks`` are 2-D ``[T_src, cols]`` tensors of one dtype on one device (e.g. SGLang's
        packed aux states ``[T, K*H]`` and ``last_hidden_states`` ``[T, H]``); ``layer_map``
        says where each of ``layers`` lies in them (default: consecutive ``hidden``-wide slots;
        ``hidden`` defaults to the narrowest block's width). ``token_ids`` is ``[T_src]``
        (host or device), or a :class:`hscapture._copies.HostRowIds` giving each row's ids
        from a host buffer (written by the CPU, no device op). Each row takes its token rows
        from the sources. ``snapshot=True``: the sources may be
        overwritten once this returns (CUDA graph buffers), so the captured rows are first
        copied on the caller's current stream. Returns True when the entry went into the ring,
        False when its rows were dropped (recorded and announced). Raises
        :class:`CaptureConfigError` / :class:`InvalidRidError` for bad arguments, before any
        sequence number is taken.
        """
        rows = list(rows)
        blocks = list(blocks)
        narrowest, dtype, t_src, _ = _check_blocks(blocks, token_ids)
        maps = _row_maps(rows, t_src)
        if isinstance(token_ids, HostRowIds):
            _check_row_ids(token_ids, maps)
        return self._capture(maps, [r.src_start for r in rows],
                             blocks, layers, layer_kinds, token_ids, layer_map,
                             narrowest if hidden is None else int(hidden), dtype, snapshot)

    def capture_rows(
        self,
        rows: Sequence[dict[str, Any]],
        src_starts: Sequence[int],
        blocks: Sequence[torch.Tensor],
        *,
        layers: Sequence[int],
        layer_kinds: Sequence[str] | None = None,
        token_ids: Any,
        layer_map: Sequence[Sequence[int]] | None = None,
        hidden: int | None = None,
        snapshot: bool = False,
        defer: bool = False,
        held_since: float | None = None,
    ) -> bool:
        """:meth:`capture_batch` for an engine adapter's hot path: the rows are already in
        their wire form, so no per-row object is built or converted here.

        ``defer=True`` (with ``stage_interval_s`` > 0, the ``drop`` policy, host token ids
        and host or native-CUDA sources; otherwise it captures at once) stages the rows
        instead of writing an entry now: the captures of up to ``stage_interval_s`` (or
        ``stage_bytes``) become ONE entry (:mod:`hscapture._staging` says why and what is
        kept meanwhile). The rows take their sequence numbers when that entry is written:
        at the first deferred capture past the interval, at :meth:`publish_completed`, an
        immediate capture, :meth:`abort`, :meth:`flush` or :meth:`close`, or by the
        publisher thread within ``heartbeat_interval_s`` once captures stop; a full ring
        then drops the whole entry and reports every row by rid (a subscriber discards the
        later chunks of a sample reported dropped). Returns True when staged.
        ``held_since``: the ``time.monotonic()`` of the forward the rows come from, where the
        caller held them back itself: the stage counts its interval from there.

        ``rows[r]`` is a batch row map exactly as ``record.ROW_KEYS`` lists it (``rid``,
        ``token_start``, ``token_count``, ``last``, ``cached_prefix``, ``extra``, ``fields``:
        plain Python values, the rid already accepted by :func:`hscapture.notice.check_rid`,
        ``fields`` values ``token_count`` bytes each); its token rows are
        ``[src_starts[r], src_starts[r] + token_count)`` of the sources. The maps are stored
        as given (not copied: do not change them afterwards). Blocks, token ids and every
        row's source range are checked here (:class:`CaptureConfigError`, before a sequence
        number is taken); the rest of each row is the caller's promise, and a row that breaks
        it makes the subscriber reject the entry (reported), never a wrong sample. Returns
        what :meth:`capture_batch` returns.
        """
        blocks = list(blocks)
        narrowest, dtype, t_src, cols = _check_blocks(blocks, token_ids)
        if not rows or len(rows) != len(src_starts):
            raise CaptureConfigError(
                f"capture_rows: expected one source start per row and at least one row, "
                f"found {len(rows)} rows and {len(src_starts)} starts")
        host_ids = isinstance(token_ids, HostRowIds)
        if not _rows_fit(rows, src_starts, token_ids.parts if host_ids else None, t_src):
            # a row breaks a rule: the checks one by one, in their order, say which
            for s, m in zip(src_starts, rows):
                _check_source_range(m["rid"], s, m["token_count"], t_src)
            if host_ids:
                _check_row_ids(token_ids, rows)
        if host_ids:
            if defer and self._stage.interval_s > 0 and self.full_policy == "drop":
                layout, key = self._staged_layout(layers, layer_kinds, blocks, layer_map, cols,
                                                  narrowest if hidden is None else int(hidden),
                                                  dtype)
                if self._entries.stage_rows(rows if isinstance(rows, list) else list(rows),
                                            list(src_starts), blocks, layout, key, token_ids,
                                            snapshot, held_since):
                    if self._announcer.inline_due():
                        self._announcer.publish_inline()
                    return True
        return self._capture(rows if isinstance(rows, list) else list(rows),
                             src_starts if isinstance(src_starts, list) else list(src_starts),
                             blocks, layers, layer_kinds, token_ids, layer_map,
                             narrowest if hidden is None else int(hidden), dtype, snapshot)

    def _staged_layout(self, layers: Sequence[int], layer_kinds: Sequence[str] | None,
                       blocks: list[torch.Tensor], layer_map: Any, cols: list[int],
                       hidden: int, dtype: str) -> tuple[tuple, tuple]:
        """A deferred capture's layout ``(layers, kinds, block widths, layer map, hidden,
        dtype)`` as :func:`_layout` makes it, and the stage's key for it (the same as tuples).

        An engine passes the same layout at every forward, and building both costs ~10 us
        of the scheduler's thread per forward: the last one is kept with the arguments it was
        built from (copies: a caller's later change cannot alter it) and reused when this
        call's arguments are EQUAL to those (plain lists compared in C). Anything else (a
        tuple, an array, another layout) is built, and checked, as before."""
        memo = self._layout_memo
        plain = (type(layers) is list and (layer_kinds is None or type(layer_kinds) is list)
                 and (layer_map is None or type(layer_map) is list))
        if (plain and memo is not None and memo[0] == layers and memo[1] == layer_kinds
                and memo[2] == layer_map and memo[3] == (cols, hidden, dtype)):
            return memo[4], memo[5]
        lay, kinds, block_cols, lmap = _layout(layers, layer_kinds, blocks, layer_map)
        layout = (lay, kinds, block_cols, lmap, hidden, dtype)
        key = (tuple(lay), tuple(kinds), tuple(block_cols), hidden, dtype,
               None if lmap is None else tuple(map(tuple, lmap)))
        if plain and (layer_map is None or all(type(x) is list for x in layer_map)):
            self._layout_memo = (list(layers), None if layer_kinds is None else list(layer_kinds),
                                 None if layer_map is None else [list(x) for x in layer_map],
                                 (list(cols), hidden, dtype), layout, key)
        return layout, key

    def _capture(self, maps: list[dict[str, Any]], starts: list[int],
                 blocks: list[torch.Tensor], layers: Sequence[int],
                 layer_kinds: Sequence[str] | None, token_ids: Any, layer_map: Any,
                 hidden: int, dtype: str, snapshot: bool) -> bool:
        layers, kinds, block_cols, layer_map = _layout(layers, layer_kinds, blocks, layer_map)
        entries, announcer = self._entries, self._announcer
        if self._stage:
            with self._lock:     # staged rows first: the ring's order is the calls' order
                entries.write_stage_locked()
        deadline = time.monotonic() + self.wait_timeout_s if self.full_policy == "wait" else 0.0
        counters, timed = self._counters, self.timed
        while True:
            t = time.perf_counter_ns() if timed else 0
            with self._lock:
                if timed:
                    counters["time_lock_ns"] += time.perf_counter_ns() - t
                done = entries.capture_locked(
                    maps, starts, blocks, block_cols, layers, kinds, token_ids, layer_map,
                    hidden, dtype, snapshot,
                    may_wait=bool(deadline) and time.monotonic() < deadline)
            if done is not None:
                if done is SPLIT:   # too large as one entry: the halves (each takes the lock)
                    half = len(maps) // 2
                    a = self._capture(maps[:half], starts[:half], blocks, layers, kinds,
                                      token_ids, layer_map, hidden, dtype, snapshot)
                    b = self._capture(maps[half:], starts[half:], blocks, layers, kinds,
                                      token_ids, layer_map, hidden, dtype, snapshot)
                    done = a and b
                if announcer.inline_due():
                    if timed:
                        t, c = time.perf_counter_ns(), time.thread_time_ns()
                        announcer.publish_inline()
                        counters["time_publish_ns"] += time.perf_counter_ns() - t
                        counters["time_publish_cpu_ns"] += time.thread_time_ns() - c
                        counters["inline_publishes"] += 1
                    else:
                        announcer.publish_inline()
                return done
            # The wait policy polls for ring space WITHOUT holding the capture lock: the
            # publisher thread needs it for heartbeats, and only its commits (and the
            # subscribers' releases) free space. The next try takes a fresh sequence number.
            time.sleep(0.0005)
            if self.inline_publish:
                # what completed frees space once announced and read: do not leave it to the
                # publisher thread's grace
                announcer.publish_ready(block=False)
            self._ring.reap()

    @property
    def publisher_thread(self) -> threading.Thread:
        """The thread that commits and announces what the capturing threads leave (for
        diagnostics: e.g. its CPU clock, hscapture.sglang.timing.TurnCosts)."""
        return self._thread

    @property
    def stage_interval_s(self) -> float:
        """How long deferred captures may wait to become one entry (0: they do not wait;
        settable at any time, the stage's rows then go out by the new interval)."""
        return self._stage.interval_s

    @stage_interval_s.setter
    def stage_interval_s(self, value: float) -> None:
        self._stage.interval_s = max(0.0, float(value))

    def publish_completed(self) -> None:
        """Commit and announce, in order and without blocking, every queued entry whose copy
        has completed. For an engine's thread between captures (e.g. at decode steps): with
        it, an entry is announced at the first step after its copy completed instead of
        after the publisher thread's ``commit_grace_s`` (with a ``publish_interval_s``: at
        the first step once the interval passed). A no-op (one check) when nothing is queued,
        ``inline_publish`` is off or the interval has not passed."""
        if self._stage:
            self._entries.write_due_stage()
        if self._pubq.pending and self._announcer.inline_due():
            self._announcer.publish_inline()

    def abort(self, rid: str, reason: str, *, restart: bool = False,
              extra: Mapping[str, Any] | None = None) -> None:
        """Record that ``rid``'s sample cannot complete (aborted request, failed attempt).

        ``restart=True``: a new attempt (e.g. a re-prefill after retraction) follows, so
        subscribers discard the partial sample quietly.
        """
        rid = nt.check_rid(rid)
        entries = self._entries
        with self._lock:
            if entries.closed:
                raise CaptureConfigError("abort on a closed Producer")
            entries.write_stage_locked()   # staged rows first: they were captured before
            meta = rec.abort_meta(self.producer_id, self.epoch, entries.next_seq, self.dp_rank,
                                  rid, rec.clip_reason(str(reason)), bool(restart),
                                  _plain(extra, "extra"))
            try:
                # encodable and at most half the ring (as the unheard entry), before taking
                # the number (one that never fits would be given up, counted, not named; the
                # control headroom, which may be 0, is only what data leaves free)
                size = len(rec.control_payload(meta, check=False))
            except HSCaptureError as exc:
                raise CaptureConfigError(f"abort: {exc}") from None
            if size > self._ring.capacity // 2:
                raise CaptureConfigError(
                    f"abort: its entry would be {size} bytes (rid, reason cut to "
                    f"{rec.REASON_MAX_CHARS} characters, and extra of {len(repr(extra))} "
                    f"characters); expected at most half the ring, {self._ring.capacity // 2} "
                    f"bytes: pass a smaller extra")
            entries.next_seq += 1
            self._counters["aborted"] += 1
            entries.control_locked(meta)
        if self.inline_publish:
            self._announcer.publish_ready(block=False)

    def stats(self) -> dict[str, Any]:
        """Counters: captured rows/bytes, dropped, aborted, unrecorded, errors, the ring's own;
        and, while ``timed`` is set, where the capturing thread's time went (cumulative ns
        over ``captures`` entries written): ``time_lock_ns`` waiting for the capture lock,
        ``time_plan_ns`` encoding the entry's metadata, ``time_reserve_ns`` reserving ring
        space and writing the header, ``time_copy_ns`` submitting the copies,
        ``time_publish_ns`` announcing entries whose copies completed, inline after a
        capture (``inline_publishes`` times: fewer than ``captures`` with a
        ``publish_interval_s``), and of that ``time_publish_cpu_ns`` the thread's CPU time
        (the notice's send releases the GIL, so another thread may take it there); inside
        ``time_copy_ns``, ``time_ids_ns`` writing host token ids and ``time_submit_ns`` the
        native CUDA call itself (the driver's share)."""
        out: dict[str, Any] = dict(self._counters)
        with self._lock:
            out.update(ring=self._ring.stats() if not self._entries.closed else {},
                       epoch=self.epoch, segment=self.segment, endpoint=self.endpoint,
                       next_seq=self._entries.next_seq,
                       pinned=self._res.pinned is not None, backlog=self._control.backlog_rows,
                       unrecorded=self._control.unrecorded)
        return out

    def wait_for_consumers(self, count: int = 1, timeout_s: float = 60.0) -> bool:
        """Wait until ``count`` live subscribers are attached to the ring; False on timeout.

        Polls the ring's consumer slots (shared memory: there is no cross-process condition
        to wait on) every 5 ms. Captures made before the first subscriber attached are named
        to it in an ``unheard`` entry, so use this where those samples matter.
        """
        deadline = time.monotonic() + timeout_s
        while self._ring.stats()["live_consumers"] < count:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every entry so far has been committed and announced (cutting the
        publisher thread's commit grace short); what :attr:`upstream` holds is handed over,
        and staged rows are written, first. Raises TimeoutError after ``timeout_s``."""
        self.run_upstream()
        if self._stage:
            with self._lock:
                if not self._entries.closed:
                    self._entries.write_stage_locked()
        self.flush_device_copies()
        self._pubq.wait_published(timeout_s)

    def defer_device_copies(self, on: bool = True) -> bool:
        """Queue the device-to-host copies of later CUDA captures until
        :meth:`flush_device_copies` (or until a wait for one of them has waited 0.2 s); True
        when that is in effect, False where captures do not take the native CUDA path (the
        torch path issues its copies at once).

        Why: a device-to-host copy waits in the copy engine behind every one issued before it,
        on any stream. An engine that reads its own results back right after the forward pass
        (SGLang's overlap scheduler, every pass) waits behind the capture's copies issued
        during that pass: 0.57 ms behind 40 MB on an H200 (benchmarks/bench_copy_contention.py).
        The engine adapter defers the copies and flushes them once the engine has issued its
        read-back (SGLang: at the next scheduling step). Nothing else changes: the snapshots
        a CUDA-graph output needs are still taken during the call, every source stays
        referenced until its copy completed, and an entry is committed only then."""
        native = self._copier.native
        if native is None:
            return False
        native.defer = bool(on)
        return native.defer

    def flush_device_copies(self, after_event: int = 0, max_bytes: int = 0) -> int:
        """Issue the deferred device-to-host copies (:meth:`defer_device_copies`) of this
        process now, in capture order; how many captures were issued whole. Cheap when none
        is queued. ``after_event``: the handle of a CUDA event recorded behind the engine's
        own result read-back (``torch.cuda.Event.cuda_event``; 0: none): the copies start only
        once it completed. Why: deferred, the copies are issued after that read-back but
        become ready at the same instant (both wait for the forward's end), and the copy
        engine may still take them first. ``max_bytes`` (0: every queued copy): issue at most
        about that many bytes (a copy is split between rows), the rest at the next call; a
        capture queued for 0.1 s or longer is issued whole. Why: what is queued in the copy
        engine delays the engine's next read-back by its whole length (a drain of several
        passes' captures at once: milliseconds); spread over steps, each read-back waits
        for one step's share at most. A capture is committed once its last copy completed."""
        if self._copier.native is None:
            return 0
        return flush_deferred(after_event, max_bytes)

    def _flush_device_copies_quietly(self) -> None:
        try:
            self.flush_device_copies()
        except Exception:
            self._announcer.count_publisher_error()   # each failed capture reports itself

    def close(self, timeout_s: float | None = None) -> None:
        """Publish everything pending (waiting for copies in flight), say ``bye``, unmap, and
        remove this producer's names: the ipc socket and its claim, and the segment unless a
        durable subscriber has not read it all (it stays in ``/dev/shm`` for that subscriber).

        ``timeout_s`` bounds the wait (None: no bound; process exit uses
        :data:`EXIT_CLOSE_TIMEOUT_S`). When the capture lock cannot be taken within
        ``min(timeout_s, 1 s)`` (e.g. a signal handler interrupted a capture on this very
        thread) or the publisher has not finished in time (a copy that never completes), the
        orderly part is given up: the names are removed as above right away and the mapping
        is left to the process's exit, so nothing waits longer and no copy in flight writes
        into unmapped memory. Never raises for that; a second call returns at once.

        In a forked child (at its exit above all: ``atexit``) it does nothing: the ring, the
        socket, the endpoint and its claim are the parent's, still in use (until 2026-12-06
        a child's normal exit said ``bye`` for the parent and removed its names).
        """
        if self._gen != generation():
            return
        deadline = None if timeout_s is None else time.monotonic() + max(0.0, timeout_s)
        if not self._entries.closed:
            self.run_upstream()
        if not self._lock.acquire(timeout=-1 if timeout_s is None
                                  else min(1.0, max(0.0, timeout_s))):
            self._abandon("the capture lock is held (a capture in progress on this thread?)")
            return
        try:
            if self._entries.closed:
                return
            try:
                self._entries.write_stage_locked()   # staged rows are captured rows: first
            except Exception:
                self._announcer.count_publisher_error()
            self._entries.closed = True          # no capture can start after this
            self._flush_device_copies_quietly()
        finally:
            self._lock.release()
        send_lock = self._pubq.send_lock
        if not send_lock.acquire(timeout=-1 if timeout_s is None
                                 else min(1.0, max(0.0, timeout_s))):
            self._abandon("the publish lock is held (a publish in progress on this thread?)")
            return
        send_lock.release()
        self._enqueue(None)
        self._thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            self._abandon(f"the publisher did not finish within {timeout_s:g} s (a copy that "
                          f"never completes?)")
            return
        self._release_resources(unlink=None)
        self._finalizer.detach()

    def run_upstream(self, idle: bool = False) -> None:
        """Call :attr:`upstream` (never with the capture lock held); its errors are logged
        and counted, never raised."""
        fn = self.upstream
        if fn is None:
            return
        try:
            fn(idle)
        except Exception:
            self._announcer.count_publisher_error()
            log.exception("hscapture: producer %s: the upstream hand-over failed",
                          self.producer_id)

    def _abandon(self, why: str) -> None:
        """:meth:`close` could not finish: remove the names now, leave the mapping."""
        self._entries.closed = True
        log.warning("hscapture: producer %s could not close in order (%s): its socket, claim "
                    "and segment name are removed now, the mapping at process exit",
                    self.producer_id, why)
        self._res.abandon()
        self._finalizer.detach()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals: the parts' hooks, as tests and benchmarks reach them ------------------

    _reserve = _forward("_entries", "reserve")
    _enqueue = _forward("_entries", "enqueue")
    _publish = _forward("_announcer", "publish")
    _publish_inline = _forward("_announcer", "publish_inline")
    _publish_bytes = _forward("_announcer", "publish_bytes")

    # -- internals: lifetime ---------------------------------------------------------------

    def _release_resources(self, unlink: bool | None) -> None:
        """Give back the socket, the ring and the endpoint (:meth:`ProducerResources.release
        <hscapture._producer_resources.ProducerResources.release>`)."""
        self._res.release(unlink)
        self._ring = self._entries.ring = self._announcer.ring = self._announcer.sock = None

    @staticmethod
    def _atexit_close(ref: "weakref.ReferenceType[Producer]") -> None:
        obj = ref()
        if obj is not None:
            try:
                obj.close(timeout_s=EXIT_CLOSE_TIMEOUT_S)
            except Exception:  # pragma: no cover - interpreter shutdown
                pass


# -- helpers -----------------------------------------------------------------------------


def _utf8(name: str, value: Any) -> str:
    """``value`` if it is a str that UTF-8 can encode (what every ring entry carries), else
    :class:`CaptureConfigError` at construction: until 2026-12-05 a model path with an
    undecodable byte (a surrogate from the environment) started a producer that then failed
    every capture."""
    if type(value) is not str:
        raise CaptureConfigError(f"{name}: expected str, found {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CaptureConfigError(
            f"{name} {value[:60]!r}: expected text UTF-8 can encode, found an undecodable "
            f"character at index {exc.start}") from None
    return value


def _layout(layers: Sequence[int], layer_kinds: Sequence[str] | None,
            blocks: list[torch.Tensor], layer_map: Any
            ) -> tuple[list[int], list[str], list[int], list[list[int]] | None]:
    """(layers, kinds, block widths, layer map) of a capture, as plain ints and strs."""
    layers = [int(x) for x in layers]
    kinds = list(layer_kinds) if layer_kinds is not None else ["residual"] * len(layers)
    if not layers or len(kinds) != len(layers):
        raise CaptureConfigError(
            f"expected at least one layer and one kind per layer: {len(layers)} layers, "
            f"{len(kinds)} kinds")
    if min(layers) < -rec.I32 or max(layers) >= rec.I32:
        # the protocol's range (a subscriber rejects the entry as corrupt: every sample of
        # it lost unnamed, until 2026-12-05); refused here, before a number is taken
        raise CaptureConfigError(
            f"layers: expected ids in {-rec.I32}..{rec.I32 - 1}, found {layers}")
    block_cols = [int(b.shape[1]) for b in blocks]
    if layer_map is not None:
        layer_map = [[int(b), int(c)] for b, c in layer_map]
    return layers, kinds, block_cols, layer_map


def _check_blocks(blocks: list[torch.Tensor], token_ids: Any
                  ) -> tuple[int, str, int, list[int]]:
    """(narrowest block width, dtype name, source token rows, block widths) of valid sources. Each
    tensor's shape, dtype and device are read once (on an engine's thread every torch
    attribute read costs ~1 us with the caches cold: bench_capture_host.py --torch-costs)."""
    if not blocks:
        raise CaptureConfigError("expected at least one block, found none")
    first = blocks[0]
    shape = first.shape
    if len(shape) != 2:
        raise CaptureConfigError(f"blocks must be [tokens, cols], found {tuple(shape)}")
    t_src, hidden = shape
    cols = [hidden]
    dtype, device = first.dtype, first.device
    for i in range(1, len(blocks)):
        b = blocks[i]
        shape = b.shape
        if len(shape) != 2 or shape[0] != t_src or b.dtype != dtype or b.device != device:
            raise CaptureConfigError(
                f"block {i}: expected [{t_src}, cols] {dtype} on {device}, "
                f"found {tuple(shape)} {b.dtype} on {b.device}")
        cols.append(shape[1])
        if shape[1] < hidden:
            hidden = shape[1]
    if isinstance(token_ids, HostRowIds):   # per row: checked against the rows' counts
        return hidden, _dtype_name(dtype), t_src, cols
    n_ids = int(token_ids.numel() if isinstance(token_ids, torch.Tensor)
                else np.asarray(token_ids).size)
    if n_ids != t_src:
        raise CaptureConfigError(
            f"token_ids: expected {t_src} ids (one per source token row), found {n_ids}")
    return hidden, _dtype_name(dtype), t_src, cols


def _rows_fit(rows: Sequence[Mapping[str, Any]], starts: Sequence[int], parts: Any,
              t_src: int) -> bool:
    """Whether every row passes :func:`_check_source_range` and (``parts``: host ids) its
    :func:`_check_row_ids` rule: the same conditions in one pass, without a call per row
    (the hot path of every capture). False: run those checks, which raise naming the row."""
    if parts is not None and (type(parts) is not list or len(parts) != len(rows)):
        return False
    for r, (s, m) in enumerate(zip(starts, rows)):
        m["rid"]         # (read as the checks read it: a row without one raises KeyError)
        n = m["token_count"]
        if s < 0 or n <= 0 or s + n > t_src:
            return False
        if parts is not None:
            part = parts[r]
            if type(part) is not tuple or len(part) != 3 or part[2] != n:
                return False
    return True


def _check_row_ids(ids: HostRowIds, rows: Sequence[Mapping[str, Any]]) -> None:
    """One ``(buffer, start, count)`` per row, each ``count`` its row's token count."""
    parts = ids.parts
    if type(parts) is not list or len(parts) != len(rows):
        raise CaptureConfigError(
            f"token_ids: expected one (buffer, start, count) per row ({len(rows)} rows), "
            f"found {len(parts) if isinstance(parts, list) else type(parts).__name__}")
    for part, m in zip(parts, rows):
        if type(part) is not tuple or len(part) != 3 or part[2] != m["token_count"]:
            raise CaptureConfigError(
                f"row {m['rid']!r}: expected its token ids as (buffer, start, "
                f"{m['token_count']}), found {part!r:.80}")


def _check_source_range(rid: str, start: int, count: int, t_src: int) -> None:
    """A row's token rows ``[start, start + count)`` lie inside the ``t_src`` source rows."""
    if start < 0 or count <= 0 or start + count > t_src:
        raise CaptureConfigError(
            f"row {rid!r}: expected 1..{t_src} token rows inside the sources, found "
            f"[{start}, {start + count})")


def _row_maps(rows: list[Row], t_src: int) -> list[dict[str, Any]]:
    """Every row's wire map (``record.ROW_KEYS`` order), its rid, token range, fields and
    ``extra`` checked first, before a sequence number is taken (the first defect raises,
    naming the row). One pass over the rows: a call per row less than checking and then
    converting them (``capture_batch`` is on an engine's hot path)."""
    if not rows:
        raise CaptureConfigError("capture_batch: expected at least one row, found none")
    if len(rows) > 1 and len({r.rid for r in rows}) != len(rows):
        seen: set = set()
        dup = next(r.rid for r in rows if r.rid in seen or seen.add(r.rid))
        raise CaptureConfigError(f"row {dup!r}: expected one row per rid in a batch (a reader "
                                 f"rejects the whole entry), found it twice")
    check_rid = nt.check_rid
    maps = []
    for r in rows:
        rid = r.rid
        check_rid(rid)   # InvalidRidError
        start, count = r.src_start, r.token_count
        if start < 0 or count <= 0 or start + count > t_src:
            _check_source_range(rid, start, count, t_src)    # raises, naming the range
        token_start, cached = r.token_start, r.cached_prefix
        if token_start < 0 or not 0 <= cached <= token_start + count:
            raise CaptureConfigError(
                f"row {rid!r}: token_start={token_start}, cached_prefix={cached}: expected "
                f"0 <= cached_prefix <= token_start + count")
        fields = r.fields
        if fields:
            for name, value in fields.items():
                if not isinstance(name, str) or nt.FIELD_NAME.fullmatch(name) is None:
                    raise CaptureConfigError(
                        f"row {rid!r} field name: expected {nt.FIELD_NAME_RULE}, found "
                        f"{name!r}")
                if not isinstance(value, (bytes, bytearray)) or len(value) != count:
                    raise CaptureConfigError(
                        f"row {rid!r} field {name!r}: expected {count} bytes (uint8 "
                        f"per token), found {type(value).__name__} of {len(value)}")
        extra = r.extra
        maps.append({"rid": rid, "token_start": int(token_start), "token_count": int(count),
                     "last": bool(r.last), "cached_prefix": int(cached),
                     "extra": _plain(extra, f"row {rid!r} extra") if extra else {},
                     "fields": dict(fields) if fields else {}})
    return maps


#: value types :func:`_plain` keeps as they are (``notice.plain_value_problem`` accepts every
#: one); an int only inside msgpack's range, ``[_I64_MIN, _U64_END)``
_PLAIN_SCALARS = frozenset((str, bytes, float, bool, type(None)))
_I64_MIN, _U64_END = -(1 << 63), 1 << 64


def _plain(value: Mapping[str, Any] | None, what: str) -> dict[str, Any]:
    """A copy of ``value`` with numpy/torch scalars turned into Python ones, checked by the
    rule every reader applies (:func:`hscapture.notice.plain_value_problem`): a value a
    reader would reject (a nested non-str key, an extension type) is a
    :class:`CaptureConfigError` here, before a sequence number is taken, not an entry every
    subscriber rejects whole, its other rows with it (until 2026-12-05)."""
    out: dict[str, Any] = {}
    for k, v in (value or {}).items():
        # the common case first, taken as it is: a str key and a value of an exact builtin
        # leaf type the rule accepts (the general checks below cost the capturing thread
        # ~0.6 us a row more: capture_batch of 64 one-token rows 0.82x the time with this,
        # paired runs on the CPU machine, 2026-12-07)
        t = type(v)
        if type(k) is str and (t in _PLAIN_SCALARS or (t is int and _I64_MIN <= v < _U64_END)):
            out[k] = v
            continue
        if not isinstance(k, str):
            raise CaptureConfigError(f"{what}: keys must be str, found {type(k).__name__}")
        if isinstance(v, (np.generic, torch.Tensor)) and getattr(v, "ndim", 0) == 0:
            v = v.item()
        why = nt.plain_value_problem(v, 1)
        if why:
            raise CaptureConfigError(f"{what} {k!r}: expected msgpack's builtin kinds, found {why}")
        out[k] = v
    return out


def field_values(name: Any, value: Any, count: int) -> np.ndarray:
    """A per-token field given as bytes, a tensor, an array or a list, as a flat uint8 array
    (its length is the caller's to check against ``count``); CaptureConfigError for a name
    that is not a str or a value that is not uint8 values."""
    if not isinstance(name, str):
        raise CaptureConfigError(f"field names: expected str, found {type(name).__name__} "
                                 f"{name!r}")
    try:
        if isinstance(value, (bytes, bytearray, memoryview)):
            arr = np.frombuffer(value, dtype=np.uint8)
        elif isinstance(value, torch.Tensor):
            arr = value.detach().to("cpu").numpy()
        else:
            arr = np.asarray(value)
        return arr.reshape(-1).astype(np.uint8)
    except (TypeError, ValueError) as exc:
        raise CaptureConfigError(f"field {name!r}: expected {count} uint8 values (bytes, a "
                                 f"tensor, an array or a list), found {type(value).__name__} "
                                 f"({exc})") from None


def _field_bytes(fields: Mapping[str, Any] | None, count: int) -> dict[str, bytes] | None:
    if not fields:
        return None
    return {name: field_values(name, value, count).tobytes() for name, value in fields.items()}
