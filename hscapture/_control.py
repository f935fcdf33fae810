"""The producer's control accounting: drops and aborts waiting for ring room, and captures
made before any subscriber attached.

Nothing here touches the ring or a socket; :class:`hscapture.producer.Producer` owns both and
calls in under its lock. The invariant it keeps with the producer: every sequence number the
producer took is in the ring, in this backlog, or counted in :attr:`ControlLog.unrecorded`.
"""

from __future__ import annotations

import collections
from typing import Any

__all__ = ["ControlLog", "BACKLOG_ROWS", "UNHEARD_ROWS"]

#: Rows (dropped chunks / aborts) the backlog names before it only counts them.
BACKLOG_ROWS = 1 << 16
#: Rows an ``unheard`` entry names before it only counts the rows that end their sample;
#: rows that do not (their fate still open: a restart may discard them) and abort numbers are
#: named up to twice this (until 2026-12-06 they were counted too: a restart-discarded row
#: stayed in ``overflow``, a false count, and an abort's number went unlisted, so a follower
#: reported it lost; fault hunt i1, GUARANTEES 13(f)).
UNHEARD_ROWS = 4096


def _rows(meta: dict[str, Any]) -> int:
    return len(meta["rows"]) if meta["kind"] == "drop" else 1


def _named(meta: dict[str, Any]) -> int:
    """What an ``unheard`` meta names or counts (counted unrecorded if it is dropped)."""
    return len(meta["rows"]) + meta["overflow"] + len(meta["discarded"])


class ControlLog:
    """Control entries the ring had no room for, oldest first, and the unheard list."""

    def __init__(self, backlog_rows: int = BACKLOG_ROWS, unheard_rows: int = UNHEARD_ROWS):
        self._backlog: collections.deque[dict[str, Any]] = collections.deque()
        self._limit = backlog_rows
        self.backlog_rows = 0
        #: rows whose drop/abort could be neither written nor kept (named nowhere)
        self.unrecorded = 0
        self.heard = False          # a subscriber has attached since the producer started
        #: the unheard entry waits in the backlog (the ring had no room when it was due)
        self.unheard_waiting = False
        #: [position, seq, rid, last, discarded] of each row named so far
        self._unheard: list[list[Any]] = []
        #: rid -> indices in _unheard of its rows whose sample has not ended (yet)
        self._open: dict[str, list[int]] = {}
        self._unheard_limit = unheard_rows
        # past the limit, only (position, rows) per entry is kept (bounded too; beyond that,
        # rows are counted as unheard whatever their position: reported, never hidden)
        self._overflow: collections.deque[tuple[int, int]] = collections.deque()
        self._overflow_unplaced = 0

    # -- backlog ---------------------------------------------------------------------------

    def add(self, meta: dict[str, Any]) -> None:
        """Queue a drop/abort meta (or the unheard one) behind the others (bounded: past the
        bound its rows are counted unrecorded)."""
        n = _rows(meta)
        if self.backlog_rows + n > self._limit:
            self.unrecorded += _named(meta) if meta["kind"] == "unheard" else n
            return
        self._backlog.append(meta)
        self.backlog_rows += n
        if meta["kind"] == "unheard":
            self.unheard_waiting = True

    def peek(self) -> dict[str, Any] | None:
        return self._backlog[0] if self._backlog else None

    def backlog_first(self) -> int:
        """The first sequence number of the backlog's oldest entry (-1: empty)."""
        return self._backlog[0]["seq"] if self._backlog else -1

    def pending(self) -> list[dict[str, Any]]:
        """The backlog's metas, oldest first (a copy)."""
        return list(self._backlog)

    def pop(self) -> None:
        meta = self._backlog.popleft()
        self.backlog_rows -= _rows(meta)
        if meta["kind"] == "unheard":
            self.unheard_waiting = False

    def give_up_first(self) -> int:
        """Drop the oldest entry, one the ring can never hold (larger than it), counting what
        it names as unrecorded; returns that count. Kept, it would stop every later control
        entry, and every later data entry with it (they never go ahead of the backlog)."""
        meta = self._backlog[0]
        self.pop()
        n = _named(meta) if meta["kind"] == "unheard" else _rows(meta)
        self.unrecorded += n
        return n

    @property
    def told(self) -> bool:
        """What a heartbeat calls ``heard``: the first subscriber's attach was handled and its
        unheard entry (if any) is in the ring, so none comes after this."""
        return self.heard and not self.unheard_waiting

    def recorded_through(self, next_seq: int) -> int:
        """Every number below this is in the ring or counted unrecorded (not in the backlog)."""
        return self._backlog[0]["seq"] if self._backlog else next_seq

    # -- captures before the first subscriber ----------------------------------------------

    def note_unheard(self, item: Any) -> None:
        """Remember a committed entry's rows while no subscriber has attached yet, with
        whether each ends its sample (``last``). What comes later settles a rid's rows that
        did not: a restart abort discards them (the new attempt is captured again, and
        arrives), any other abort or a row that ends the sample ends them too (named as
        ended: the subscriber reports the sample at once, whether or not it read that later
        entry before the unheard one)."""
        if item.abort is not None:
            self._settle_unheard(*item.abort)
            # its number names nothing to report (the rows it settled are named, or
            # discarded): listed with the discarded ones, so that a subscriber promised every
            # number (a follower of a restarted producer) does not count it lost
            if len(self._unheard) < 2 * self._unheard_limit:
                self._unheard.append([item.position, item.seq, item.abort[0], True, True])
            return
        extra = 0
        unheard, open_rows = self._unheard, self._open
        for r, row in enumerate(item.rows):
            rid = row["rid"]
            # (a drop row carries ``last`` as a batch row does; an abort has no rows)
            last = bool(row.get("last", True))
            if last and rid in open_rows:
                self._settle_unheard(rid, False)
            if len(unheard) < self._unheard_limit or \
                    (not last and len(unheard) < 2 * self._unheard_limit):
                if not last:
                    open_rows.setdefault(rid, []).append(len(unheard))
                unheard.append([item.position, item.seq + r, rid, last, False])
            else:
                extra += 1
        if extra:
            if len(self._overflow) < self._unheard_limit:
                self._overflow.append((item.position, extra))
            else:
                self._overflow_unplaced += extra

    def _settle_unheard(self, rid: str, restart: bool) -> None:
        """``rid``'s open rows: discarded by a restart (their numbers named as such, never
        reported), else ended."""
        for i in self._open.pop(rid, ()):
            self._unheard[i][4 if restart else 3] = True

    def take_unheard(self, attached_at: int, in_flight: Any = ()
                     ) -> tuple[list[dict[str, Any]], int, list[int]] | None:
        """The first subscribers attached, the last of them at ring position
        ``attached_at``: the rows of entries before it (never delivered to that one; a
        subscriber that read a row skips it; committed ones noted so far, plus the
        ``in_flight`` entries not yet committed), the overflow count and the numbers of rows
        a restart discarded, or None if none."""
        self.heard = True
        for item in in_flight:
            if item is not None and item.position < attached_at:
                self.note_unheard(item)
        # only rows of entries before a subscriber's start were never delivered to it
        before = [u for u in self._unheard if u[0] < attached_at]
        rows = [{"rid": rid, "seq": seq, "last": last}
                for _, seq, rid, last, discarded in before if not discarded]
        discarded = [u[1] for u in before if u[4]]
        overflow = sum(n for pos, n in self._overflow if pos < attached_at) + \
            self._overflow_unplaced
        self._unheard.clear()
        self._open.clear()
        self._overflow.clear()
        self._overflow_unplaced = 0
        return (rows, overflow, discarded) if rows or overflow or discarded else None

