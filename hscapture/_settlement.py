"""A durable place's acknowledgements, as a resumer of the place must read them.

A durable subscriber gives the ring back only up to the oldest record it still references
(``Source.release``), so a place resumed after a crash or a close replays records whose
samples were already acknowledged. The consumer slot keeps two numbers for the resumer
(``csrc/ring.cpp``, SYNC POINT 8), both sequence numbers of rows, stored only by the owner:

- ``delivered`` = 1 + the last row's sequence number of the last sample of the longest
  acknowledged prefix of the samples queued for the user, in queue order. Samples are
  queued when their last-read row arrives, and rows are read in sequence order, so every
  queued sample whose last row is below ``delivered`` was acknowledged: a resumer skips
  such a sample once it is whole (:attr:`Settlement.acknowledged_below`).
- ``unsettled`` = 1 + the lowest first sequence number of a sample this owner holds as a
  partial whose rows a resumer might not all find in the ring (0: none): a partial that
  stopped pinning the ring (``partial_hold_s``, a quarter of the ring) or whose first row
  read does not start the sample. A sample that was acknowledged can have its first rows
  before the place's ``released`` and its later rows after it (another partial held the
  ring back): a resumer sees rows that continue a sample it never saw start. Such a row
  below :attr:`Settlement.continuations_below` = ``min(delivered, unsettled - 1)`` belongs
  to an acknowledged sample, and is skipped: every sample not acknowledged and not
  unsettled holds all its rows in the ring from its first one, which a resumer then reads
  first. Above that bound such a row opens a partial as any other (the sample, if it can
  never complete, is reported incomplete; never skipped).

Guarantees: a row is skipped only by those two rules; the owner stores a smaller
``unsettled`` before the ring may pass the rows it protects (:meth:`Settlement.track` runs
before the partial's records are released) and lets it grow only once ``delivered``
covers the sample (:meth:`Settlement.finish`, :meth:`Settlement.acknowledge`); the value a
resumer inherits stays in force until it has read a row at or past the inherited
``delivered`` (until then the previous owner's unsettled partials may still be ahead).
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Hashable

__all__ = ["Settlement"]


class Settlement:
    """One durable place's acknowledgement cursor and unsettled partials (module docstring).

    For an anonymous consumer (nothing resumes it) every method is a cheap no-op and both
    bounds are 0."""

    def __init__(self, consumer: Any, resumed: bool) -> None:
        self.consumer = consumer
        self.durable = bool(getattr(consumer, "durable", False))
        delivered = int(consumer.delivered) if resumed and self.durable else 0
        unsettled = int(getattr(consumer, "unsettled", 0)) if resumed and self.durable else 0
        #: samples whose last row's sequence number is below this were acknowledged by an
        #: earlier owner of the place: skipped, not repeated
        self.acknowledged_below = delivered
        #: a row below this that continues a sample whose start was not seen belongs to a
        #: sample an earlier owner acknowledged: skipped
        self.continuations_below = min(delivered, unsettled - 1) if unsettled else delivered
        #: ``[last row's seq, acknowledged]`` of every sample queued for the user and not
        #: yet part of the acknowledged prefix, in queue (= sequence) order
        self.unacked: collections.deque[list[Any]] = collections.deque()
        self._delivered = delivered                # the slot's value now
        #: the previous owner's ``unsettled``, while in force (see the module docstring)
        self.inherited = unsettled
        self._open: dict[Hashable, list[Any]] = {}  # key -> [first seq, last seq or None]
        self._stored = unsettled
        #: (a resumed durable place) last rows' numbers of samples an earlier owner
        #: acknowledged out of queue order (above its ``delivered``; the name's acknowledged
        #: file): skipped as those below :attr:`acknowledged_below` are
        #: (:meth:`was_acknowledged`). Set by the subscriber's registry
        self.ahead: set[int] = set()
        #: the same samples by rid: ``(first row, last row)`` of each, so that a row of one
        #: met without its start (its first rows left the ring) is skipped, not reported
        #: incomplete (:meth:`acked_row`; fault hunt H20, 8 of 9 runs)
        self.ahead_rows: dict[str, list[tuple[int, int]]] = {}
        #: durable: records ``(last row, rid, first row)`` of a sample acknowledged out of
        #: queue order where a resumer reads it, before the acknowledgement counts
        #: (``delivered`` cannot say it)
        self.on_ahead: Callable[[int, str, int], None] | None = None

    def was_acknowledged(self, last_seq: int) -> bool:
        """Whether an earlier owner acknowledged the sample whose last row is ``last_seq``:
        below ``delivered``, or acknowledged out of order (:attr:`ahead`). Until 2026-12-06
        (thirty-first session) a resumer handed out again every sample taken out of queue
        order (``get(rid)``, a release order of the user's own) and acknowledged while an
        earlier one was not (fault hunt H19: 10 of 10 samples twice)."""
        return last_seq < self.acknowledged_below or last_seq in self.ahead

    def acked_row(self, rid: str, seq: int) -> bool:
        """Whether row ``seq`` of ``rid`` belongs to a sample an earlier owner acknowledged
        out of queue order (:attr:`ahead_rows`)."""
        spans = self.ahead_rows.get(rid)
        return spans is not None and any(first <= seq <= last for first, last in spans)

    def inherit_ahead(self, acked: list[tuple[int, str, int]]) -> None:
        """A resumed durable place: ``(last row, rid, first row)`` of the samples earlier
        owners acknowledged out of queue order (the name's acknowledged file)."""
        for last, rid, first in acked:
            self.ahead.add(last)
            if rid:
                self.ahead_rows.setdefault(rid, []).append((first, last))

    # -- acknowledgements ----------------------------------------------------------------

    def queue(self, last_seq: int, rid: str = "", first_seq: int | None = None
              ) -> list[Any] | None:
        """A sample (``rid``, rows ``first_seq`` .. ``last_seq``) was queued for the user: its
        place in the in-order acknowledgements (None for an anonymous consumer)."""
        if not self.durable:
            return None
        entry = [last_seq, False, rid, last_seq if first_seq is None else first_seq]
        self.unacked.append(entry)
        return entry

    def acknowledge(self, entry: list[Any]) -> None:
        """The sample of ``entry`` (from :meth:`queue`) was acknowledged: store how far every
        sample is, in order, then let go of the unsettled partials that covers."""
        entry[1] = True
        q, through = self.unacked, 0
        if q and q[0] is not entry and self.on_ahead is not None:
            # (out of queue order: delivered will not cover it)
            self.on_ahead(entry[0], entry[2], entry[3])
        while q and q[0][1]:
            through = q.popleft()[0] + 1
        if through and self.consumer is not None:
            self.consumer.store_delivered(through)   # release: before unsettled may grow
            if through > self._delivered:
                self._delivered = through
                if self._open:
                    self._prune()

    # -- unsettled partials -------------------------------------------------------------

    def track(self, key: Hashable, first_seq: int) -> None:
        """``key``'s partial may not be found whole by a resumer (it stops pinning the ring,
        or began with a row that does not start the sample). Call before any of its records
        is released."""
        if not self.durable or key in self._open:
            return
        self._open[key] = [first_seq, None]
        self._store()

    def finish(self, key: Hashable, last_seq: int) -> None:
        """``key``'s sample completed (queued) or failed (reported) with ``last_seq`` its
        highest row read: it stops counting once ``delivered`` passes that."""
        got = self._open.get(key)
        if got is not None:
            got[1] = last_seq
            self._prune()

    def read(self, seq: int) -> None:
        """A row ``seq`` was read: at or past the inherited ``delivered``, the previous
        owner's unsettled partials are behind us (ours are tracked by now)."""
        if self.inherited and seq >= self.acknowledged_below:
            self.inherited = 0
            self._store()

    def _prune(self) -> None:
        done = [k for k, (_, last) in self._open.items()
                if last is not None and last < self._delivered]
        for k in done:
            del self._open[k]
        if done:
            self._store()

    def _store(self) -> None:
        low = min((first for first, _ in self._open.values()), default=None)
        value = 0 if low is None else low + 1
        if self.inherited and (not value or self.inherited < value):
            value = self.inherited
        if value != self._stored and self.consumer is not None:
            self.consumer.store_unsettled(value)
            self._stored = value
