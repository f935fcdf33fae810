"""A producer's ring entries, written under its capture lock: WHAT goes into the ring for a
capture, for the staged captures of an interval, for a drop, an abort and an ``unheard``
list, and the sequence numbers they take.

When an entry is committed and announced, and by which thread, is :mod:`hscapture._announcer`'s
(on :mod:`hscapture._publish_queue`); the public API, its argument checks and the ``wait``
policy's retries are :class:`hscapture.producer.Producer`'s. This module writes entries and
queues them for publishing.

Guarantees:

- The methods named ``*_locked`` run under :attr:`EntryWriter.lock` (their caller holds it),
  and so do the sequence numbers: reservation order == sequence order == queue order.
- A row takes its sequence number only once it is certain to be recorded: as data (its entry
  reserved, header written and copies started), or as a ``drop`` entry in the ring's reserved
  headroom or in the control backlog (:mod:`hscapture._control`), behind which later control
  entries queue up so that the ring keeps them in order.
- An entry too large for the ring ever to hold is split before any number is taken: staged
  rows here, a capture by the producer (:data:`SPLIT`). A copy that fails to start gives its
  position back and drops its rows, recorded and reported.
- Once :attr:`EntryWriter.closed` is set (under the lock), no capture is written (it raises
  :class:`~hscapture.errors.CaptureConfigError`).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Callable, Protocol

import torch

from . import record as rec
from ._control import ControlLog
from ._copies import EntryCopier, HostRowIds
from ._publish_queue import Pending, PublishQueue
from ._staging import Stage, StagedGroup, StagedRow
from .errors import CaptureConfigError, HSCaptureError, RecordTooLargeError

log = logging.getLogger("hscapture")

__all__ = ["EntrySettings", "EntryWriter", "SPLIT"]

#: :meth:`EntryWriter.capture_locked`'s answer for a batch too large as one entry: nothing was
#: written and no number taken; the caller captures its halves, one after the other, each
#: taking the lock again (entries stay in sequence order)
SPLIT = object()


class EntrySettings(Protocol):
    """What the entries take of their producer's public settings
    (:class:`hscapture.producer.Producer`), read at each use: ``timed``, ``full_policy`` and
    ``inline_publish`` may be set at any time."""

    producer_id: str
    epoch: int
    dp_rank: int
    convention: str
    model: str
    timed: bool
    full_policy: str
    inline_publish: bool
    commit_grace_s: float
    heartbeat_interval_s: float


class EntryWriter:
    """Writes a producer's entries into its ring and queues them on its publish queue; holds
    what the capture lock guards: the next sequence number, the stage, the closed flag."""

    def __init__(self, settings: EntrySettings, lock: threading.Lock, ring: Any,
                 pubq: PublishQueue, control: ControlLog, counters: collections.Counter[str],
                 copier: EntryCopier, stage: Stage) -> None:
        self._settings = settings      # the producer (a back-reference: see EntrySettings)
        #: the capture lock: reserve order == seq order == queue order
        self.lock = lock
        #: the ring (None once the producer gave it back)
        self.ring = ring
        self._pubq = pubq
        self._control = control
        self._counters = counters
        self._copier = copier
        #: deferred captures (``capture_rows(defer=True)``) waiting to become one entry
        self.stage = stage
        self._stage_layout: tuple = ()   # the layout the staged groups share (set with the first)
        self._next_seq = 0
        #: set under the lock once no capture may start
        self.closed = False

    @property
    def next_seq(self) -> int:
        """The sequence number the next row takes (under the lock)."""
        return self._next_seq

    @next_seq.setter
    def next_seq(self, value: int) -> None:
        # Every number below it is taken from now on: the segment header says so at once
        # (one store), so that a subscriber retiring this incarnation after a SIGKILL reports
        # as lost the numbers that never reached the ring (drops still in the backlog, a copy
        # never committed), which neither a heartbeat nor the leftover file may have named yet.
        # A capture stores its numbers BEFORE it reserves their entry as well: a subscriber
        # registering between the two would otherwise read a `taken` below the numbers of an
        # entry that lies before its place, and count them as promised and missing (a false
        # loss, fault hunt 2026-12-06 k1/k2: 1 of 456 subscribers without injected delays)
        self._next_seq = value
        if self.ring is not None:
            self.ring.store_taken(value)

    def capture_locked(self, row_maps: list[dict[str, Any]], starts: list[int],
                       blocks: list[torch.Tensor], block_cols: list[int], layers: list[int],
                       kinds: list[str], token_ids: Any, layer_map: Any, hidden: int,
                       dtype: str, snapshot: bool, may_wait: bool) -> bool | object | None:
        """One try under the lock: True (in the ring), False (dropped and recorded), None
        (full, and the wait policy wants another try) or :data:`SPLIT` (too large as one
        entry: the caller captures the halves)."""
        if self.closed:
            raise CaptureConfigError("capture on a closed Producer")
        seq = self.next_seq
        timed = self._settings.timed
        t0 = time.perf_counter_ns() if timed else 0
        try:
            plan = self._plan(seq, row_maps, (layers, kinds, block_cols, layer_map, hidden,
                                              dtype))
        except HSCaptureError as exc:
            raise CaptureConfigError(f"capture: the batch cannot be encoded: {exc}") from None
        t1 = time.perf_counter_ns() if timed else 0
        self.ring.store_taken(seq + len(row_maps))   # before the reserve: see next_seq
        position = self.reserve_data(plan.length, plan.tag)
        if position == -1 and self._settings.full_policy == "wait" and may_wait:
            return None
        if position == -2 and len(row_maps) > 1:   # too large as one entry: split it
            return SPLIT
        self.next_seq = seq + len(row_maps)
        if position < 0:
            self.drop_locked(seq, row_maps, "ring_full" if position == -1
                             else "record_too_large", plan.length)
            return False
        return self._fill_locked(seq, row_maps, plan, position, "rows", timed, t0, t1,
                                 lambda buf, address: self._copier.copy_into(
                                     buf, address, plan, starts, row_maps, blocks, token_ids,
                                     snapshot, timed))

    def stage_rows(self, maps: list[dict[str, Any]], starts: list[int],
                   blocks: list[torch.Tensor], layout: tuple, key: tuple,
                   token_ids: HostRowIds, snapshot: bool, since: float | None = None) -> bool:
        """Stage one deferred capture (see :meth:`hscapture.producer.Producer.capture_rows`;
        takes the lock); False when its sources cannot be staged (the caller captures them at
        once). ``layout``: ``(layers, kinds, block widths, layer map, hidden, dtype)`` as
        :meth:`_plan` takes it; ``key``: the same as a hashable (the stage's layout key,
        with the group's ``where``). Both are the producer's, reused while the layout stays
        the same: neither is changed here. ``since``: when the rows were captured, where
        the caller held them back (the stage's interval counts from the oldest)."""
        timed = self._settings.timed
        t = time.perf_counter_ns() if timed else 0
        with self.lock:
            if self.closed:
                raise CaptureConfigError("capture on a closed Producer")
            got = self._copier.stage(maps, starts, blocks, token_ids, snapshot, layout[2])
            if got is None:
                return False
            group, starts, ids = got
            key = (group.where, key)
            stage = self.stage
            if stage and (not stage.accepts(key, maps) or stage.due() or
                          stage.nbytes + group.nbytes > stage.max_bytes):
                self.write_stage_locked()
            if not stage:
                self._stage_layout = layout
            stage.add(key, group, maps, starts, ids, since)
            self._counters["staged_rows"] += len(maps)
            if stage.nbytes >= stage.max_bytes:
                self.write_stage_locked()
        if timed:
            self._counters["time_stage_ns"] += time.perf_counter_ns() - t
            self._counters["stagings"] += 1
        return True

    def write_stage_locked(self) -> None:
        """Write every staged group as one entry (under the capture lock), splitting it when
        it can never fit; nothing staged afterwards."""
        groups, rows = self.stage.take()
        if rows:
            self._counters["stage_writes"] += 1
            self._write_rows_locked(groups, rows, self._stage_layout)

    def write_due_stage(self) -> None:
        """Write the stage if it is due (any thread; takes the capture lock only then)."""
        if self.stage and self.stage.due():
            with self.lock:
                if not self.closed and self.stage.due():
                    self.write_stage_locked()

    def _write_rows_locked(self, groups: list[StagedGroup], rows: list[StagedRow],
                           layout: tuple) -> None:
        maps = [r.map for r in rows]
        seq = self.next_seq
        timed = self._settings.timed
        t0 = time.perf_counter_ns() if timed else 0
        try:
            plan = self._plan(seq, maps, layout)
        except HSCaptureError as exc:
            # staged rows were accepted: they are reported (a drop entry names only rids and
            # token ranges, always encodable), never lost
            self.next_seq = seq + len(maps)
            self._counters["errors"] += 1
            log.error("hscapture: %d staged rows (first rid %r) cannot be encoded: %s",
                      len(maps), maps[0]["rid"], exc)
            self.drop_locked(seq, maps, f"encode_error: {exc}"[:200], 0)
            return
        t1 = time.perf_counter_ns() if timed else 0
        self.ring.store_taken(seq + len(maps))       # before the reserve: see next_seq
        position = self.reserve_data(plan.length, plan.tag)
        if position == -2 and len(rows) > 1:      # too large as one entry: halves
            half = len(rows) // 2
            self._write_rows_locked(groups, rows[:half], layout)
            self._write_rows_locked(groups, rows[half:], layout)
            return
        self.next_seq = seq + len(maps)
        if position < 0:
            self.drop_locked(seq, maps, "ring_full" if position == -1 else
                             "record_too_large", plan.length)
            return
        self._fill_locked(seq, maps, plan, position, "staged rows", timed, t0, t1,
                          lambda buf, address: self._copier.copy_staged_into(
                              buf, address, plan, groups, rows, timed))

    def _plan(self, seq: int, maps: list[dict[str, Any]], layout: tuple) -> Any:
        """The batch entry's plan for ``maps`` from ``seq`` (``layout``: layers, kinds, block
        widths, layer map, hidden, dtype); raises HSCaptureError if it cannot be encoded."""
        layers, kinds, block_cols, layer_map, hidden, dtype = layout
        s = self._settings
        return rec.plan_batch(
            producer=s.producer_id, epoch=s.epoch, seq=seq, dp_rank=s.dp_rank,
            layers=layers, layer_kinds=kinds, convention=s.convention, model=s.model,
            hidden=hidden, dtype=dtype, rows=maps, block_cols=block_cols,
            layer_map=layer_map, check=False)

    def _fill_locked(self, seq: int, maps: list[dict[str, Any]], plan: Any, position: int,
                     what: str, timed: bool, t0: int, t1: int,
                     copy: Callable[[Any, int], tuple[Any, Any]]) -> bool:
        """Write the header of the entry reserved at ``position`` and start its copies
        (``copy(buf, address) -> (done, keepalive)``), then queue it for publishing; a copy
        that fails gives the position back and drops the rows, recorded and reported
        (False)."""
        try:
            buf = self.ring.payload(position)
            rec.write_header(buf, plan)
            t2 = time.perf_counter_ns() if timed else 0
            done, keepalive = copy(buf, self.ring.payload_address(position))
        except Exception as exc:
            self.ring.abort(position)
            self._counters["errors"] += 1
            log.exception("hscapture: copy of %d %s (first rid %r) into the ring failed",
                          len(maps), what, maps[0]["rid"])
            self.drop_locked(seq, maps, f"copy_error: {type(exc).__name__}", plan.length)
            return False
        self._count_entry(len(maps), plan.length, timed, t0, t1, t2)
        self.enqueue(Pending("batch", position, seq, len(maps), plan.length,
                             plan.meta_bytes, done, keepalive, maps))
        return True

    def _count_entry(self, rows: int, length: int, timed: bool, t0: int, t1: int,
                     t2: int) -> None:
        counters = self._counters
        counters["captured_rows"] += rows
        counters["captured_bytes"] += length
        if timed:   # where a capture's time goes (cumulative ns; divide by captures)
            counters["captures"] += 1
            counters["time_plan_ns"] += t1 - t0
            counters["time_reserve_ns"] += t2 - t1
            counters["time_copy_ns"] += time.perf_counter_ns() - t2

    def reserve_data(self, length: int, tag: int) -> int:
        """:meth:`reserve` for a data entry, never ahead of the backlog: the drops and aborts
        waiting there for room are written first (their numbers are lower), and while any
        of them still waits the ring counts as full (-1): the entry is dropped, or waited
        for, behind them. Until 2026-12-06 a data entry took room freed before the next
        heartbeat wrote the backlog: a rid aborted while the ring was full and captured
        again at once had its retry read before the abort, as an overlap of the open
        first attempt; the retry was rejected ("delivered twice") and lost, and the abort
        reported nothing (fault hunt H11, 5/5)."""
        if self._control.peek() is not None:
            self.flush_backlog_locked()
            if self._control.peek() is not None:
                return -1
        return self.reserve(length, tag)

    def reserve(self, length: int, tag: int) -> int:
        """Ring position, -1 when full, -2 when it can never fit (one try, never waits)."""
        try:
            return self.ring.reserve(length, tag, False)
        except RecordTooLargeError:   # larger than capacity - control_reserve: never fits
            return -2

    def drop_locked(self, seq: int, rows: list[dict[str, Any]], reason: str,
                    length: int) -> None:
        """Record ``rows`` (numbered from ``seq``) as dropped for ``reason``."""
        self._counters["dropped"] += len(rows)
        self._counters["dropped_bytes"] += length
        if self._counters["dropped"] == len(rows) or reason != "ring_full":
            log.warning("hscapture: dropped %d rows (first rid %r: %s, %d bytes); drops are "
                        "recorded in the ring and named to subscribers", len(rows),
                        rows[0]["rid"], reason, length)
        s = self._settings
        self.control_locked(rec.drop_meta(s.producer_id, s.epoch, seq, s.dp_rank, reason,
                                          rows))

    def control_locked(self, meta: dict[str, Any]) -> None:
        """Record a drop/abort: in the ring's headroom now, else in the backlog (behind
        which later control entries queue up, so the ring keeps them in order)."""
        self._control.add(meta)
        self.flush_backlog_locked()

    def flush_backlog_locked(self) -> None:
        """Write backlog entries into the ring, oldest first, while control entries fit."""
        while True:
            meta = self._control.peek()
            if meta is None:
                return
            payload = rec.control_payload(meta, check=False)
            try:
                position = self.ring.reserve(len(payload), rec.entry_tag(meta), True)
            except RecordTooLargeError as exc:   # larger than the ring: it never fits
                n = self._control.give_up_first()
                self._counters["errors"] += 1
                log.error("hscapture: a %s entry (seq %d) can never fit the ring: %s; the %d "
                          "rows it names are counted unrecorded (reported as lost numbers)",
                          meta["kind"], meta["seq"], exc, n)
                continue
            if position < 0:
                return
            self.ring.write(position, payload)
            self._control.pop()
            kind = meta["kind"]
            n = len(meta["rows"]) if kind == "drop" else 0 if kind == "unheard" else 1
            abort = (meta["rid"], meta["restart"]) if kind == "abort" else None
            self.enqueue(Pending(meta["kind"], position, meta["seq"], n, len(payload),
                                 payload[4:], None, None,
                                 meta.get("rows", []) if kind == "drop" else [], abort=abort))

    def write_unheard_locked(self, rows: list[dict[str, Any]], overflow: int,
                             discarded: list[int]) -> None:
        """Write the ``unheard`` entry naming ``rows`` (and counting ``overflow`` more, and
        the numbers of ``discarded`` rows) to the first subscriber; without room in the ring
        it waits in the backlog as drops do (written when room comes, else in the leftover
        file at the close; until 2026-12-06 its rows were only counted ``unrecorded``:
        fault hunt b1)."""
        s = self._settings
        meta = rec.unheard_meta(s.producer_id, s.epoch, self.next_seq, s.dp_rank, rows,
                                overflow, discarded)
        payload = rec.control_payload(meta, check=False)
        limit = self.ring.capacity // 2
        if len(payload) > limit:
            # too large for the ring (thousands of long rids in a small one): the rows past
            # what fits are counted in `overflow`, which subscribers report as a lost range
            # (until 2026-12-06 such an entry was never written and its rows named nowhere:
            # fault hunt H13, 1,500 of 1,500 in a 64 KiB ring). Rows whose sample is still
            # open are kept named first, as past UNHEARD_ROWS (_control): counted, a later
            # chunk of theirs would be reported a second time
            rows = [r for r in rows if not r["last"]] + [r for r in rows if r["last"]]
        while len(payload) > limit and rows:
            keep = min(len(rows) - 1, int(len(rows) * limit / len(payload) * 0.9))
            overflow += len(rows) - keep
            rows = rows[:keep]
            meta = rec.unheard_meta(s.producer_id, s.epoch, self.next_seq, s.dp_rank, rows,
                                    overflow, discarded)
            payload = rec.control_payload(meta, check=False)
        try:
            position = self.ring.reserve(len(payload), 0, True)
        except RecordTooLargeError:
            # still larger than the ring (its `discarded` numbers alone): queued, the
            # backlog's flush gives it up and counts its rows unrecorded. Until 2026-12-06
            # the error escaped the heartbeat with the rows already taken from the list:
            # named nowhere, and heartbeats said `heard` (fault hunt H13, 3/3)
            position = -1
        if position < 0:
            self._control.add(meta)
            self.flush_backlog_locked()
            return
        self.ring.write(position, payload)
        self.enqueue(Pending("unheard", position, meta["seq"], 0, len(payload), payload[4:]))

    def enqueue(self, item: Pending | None) -> None:
        """Queue ``item`` for publishing (None: the close marker)."""
        s = self._settings
        # with inline publishing off, every entry is the publisher thread's: wake it for each.
        # With it on, the publisher thread sleeps at most a heartbeat interval on an empty
        # queue, so with a commit grace at least that long it finds a new entry before its
        # grace ends without being woken for it (PublishQueue.put)
        self._pubq.put(item, wake=not s.inline_publish,
                       wake_first=s.commit_grace_s < s.heartbeat_interval_s)
