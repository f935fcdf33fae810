"""Ring records a durable subscriber keeps so that a resumer reads them again.

A durable subscriber that reads a failure (a drop or abort entry, a failed or rejected
sample's records) or an ``unheard`` record naming samples it holds as cut keeps that record
referenced in its source's ring (``Source.borrowed``) until the consumer has recorded what
it names (:meth:`RecordHolds.acknowledge`) or its fate is known: a subscriber killed before
then leaves the record to its resumer, which reads and reports it again. Each hold is
bounded, so that a consumer that never acknowledges cannot pin the ring: at most
``partial_hold_s`` and a quarter of the ring, but never in the pump that took it (its caller
has not seen the failure yet); a failure hold given back unacknowledged is first written where
a resumer reads it (the owner's ``before_unpin``, the name's pending file). GUARANTEES rows
#13, #14 and gap 1 say what this buys and where it stops.

:class:`RecordHolds` is the one place that takes, bounds and gives back such holds; the
delivery (:mod:`hscapture._delivery`) and the headless samples (:mod:`hscapture._headless`)
give records back through :meth:`RecordHolds.give_back`.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any, Protocol

from ._source import Source

__all__ = ["RecordHolds"]


class _Owner(Protocol):
    closed: bool
    durable: bool
    partial_hold_s: float
    ledger: Any

    def on_released(self, src: Source) -> None: ...

    def before_unpin(self, n: int) -> None: ...


@dataclasses.dataclass
class _Hold:
    """A ring record that keeps a failure readable by a resumer until it is acknowledged."""

    serial: int                    # the ledger's failure_log length when it was held
    src: Source
    position: int                  # the record (referenced in src.borrowed)
    since: float


class RecordHolds:
    """The records a durable owner keeps for its resumer: failures not yet acknowledged, in
    the order held, and per epoch one unheard record while its source holds cut samples."""

    def __init__(self, owner: _Owner) -> None:
        self._owner = owner
        #: what names failures not yet acknowledged, in the order held
        self._failures: collections.deque[_Hold] = collections.deque()
        #: by epoch, the unheard record whose rows a source holds as cut (:meth:`hold_cut`)
        self._cut: dict[int, _Hold] = {}
        #: the failure log's length when the current pump began: holds numbered past it were
        #: taken in this pump, and its caller has not had them yet (:meth:`begin_pump`)
        self._fresh_from = 0

    def give_back(self, src: Source, position: int) -> None:
        """Stop referencing the record at ``position`` of ``src``'s ring and, unless the
        owner is closed, release the ring up to the oldest record still referenced."""
        if src.borrowed.discard(position) and not self._owner.closed:
            src.release()
            self._owner.on_released(src)

    def hold_failure(self, src: Source, position: int, borrowed: bool = False) -> None:
        """Durable: keep the record at ``position`` (already referenced when ``borrowed``)
        until the failures recorded so far are acknowledged. Otherwise (or closed) a
        ``borrowed`` record is given back at once."""
        owner = self._owner
        if not owner.durable or owner.closed:
            if borrowed:
                self.give_back(src, position)
            return
        if not borrowed:
            src.borrowed.add(position)
        self._failures.append(_Hold(len(owner.ledger.failure_log), src, position,
                                    time.monotonic()))

    def begin_pump(self) -> None:
        """A pump begins: the failure holds it takes are its caller's to record first."""
        self._fresh_from = len(self._owner.ledger.failure_log)

    def acknowledge(self, through: int) -> None:
        """The first ``through`` failures of the ledger's ``failure_log`` are recorded by the
        consumer: give back what named only those."""
        holds = self._failures
        while holds and holds[0].serial <= through:
            hold = holds.popleft()
            self.give_back(hold.src, hold.position)

    def hold_cut(self, src: Source, position: int) -> None:
        """Durable: keep the unheard record at ``position`` in the ring while ``src`` holds a
        sample it names as cut (its first rows before our place, its fate unknown): a
        resumer of a subscriber that dies meanwhile reads it again and reports the sample
        when its fate is known. Until 2026-12-06 the record was released at once, and a
        drain SIGKILLed then left such a sample named nowhere (fault hunt h1, 4/4;
        GUARANTEES 13(e)). Given back once no sample is cut (the fate of each was reported,
        or a restart discarded it), or after ``partial_hold_s`` or a quarter of the ring, as a
        failure is."""
        owner = self._owner
        if not owner.durable or owner.closed or src.epoch in self._cut:
            return
        src.borrowed.add(position)
        self._cut[src.epoch] = _Hold(0, src, position, time.monotonic())

    def bound_cuts(self, now: float) -> None:
        """Give back each cut hold whose source holds no cut sample any more, or past
        ``partial_hold_s`` or a quarter of the ring."""
        for epoch, hold in list(self._cut.items()):
            consumer = hold.src.consumer
            if hold.src.cut and consumer is not None and \
                    now - hold.since <= self._owner.partial_hold_s and \
                    consumer.position - hold.position <= consumer.capacity // 4:
                continue
            del self._cut[epoch]
            self.give_back(hold.src, hold.position)

    def bound_failures(self, now: float) -> None:
        """Failures not acknowledged hold the ring for at most ``partial_hold_s`` and a
        quarter of it, each (past that, the owner's ``before_unpin`` writes them where a
        resumer reads them first: since 2026-12-06, thirty-first session; before, a consumer
        that recorded less often than at every return, a `get()` or a periodic
        acknowledgement, and died then left them to no one, GUARANTEES gap 1), but never in
        the pump that took them: its caller has not seen them yet, and could not have
        recorded them. Until 2026-12-06 a burst of failures read in one pump past a quarter
        of the ring (a producer's backlog of drops written when room came back) lost its
        holds within milliseconds, before the drain or a stream had them, and one killed
        then left them named by no one (fault hunts H14 problem B, H17; GUARANTEES gap 1).
        (A 2 s grace tried the same day let a subscriber that never acknowledges hold the
        whole ring; bounded to half, it still lost a burst larger than half, and a
        subscriber acknowledging every 1.5 s made its producer drop 2-5x as many captures:
        fault hunts H15, H17.)"""
        holds = self._failures
        if not holds:
            return
        owner = self._owner
        kept: collections.deque[_Hold] = collections.deque()
        unpinned: list[_Hold] = []
        for hold in holds:
            consumer = hold.src.consumer
            if hold.serial > self._fresh_from or now - hold.since <= owner.partial_hold_s and (
                    consumer is None
                    or consumer.position - hold.position <= consumer.capacity // 4):
                kept.append(hold)
            else:
                unpinned.append(hold)
        if not unpinned:
            return
        # what they name is written where a resumer finds it first (the subscriber's pending
        # file): given back, they no longer tell it
        owner.before_unpin(max(h.serial for h in unpinned))
        owner.ledger.counts["failures_unpinned"] += len(unpinned)
        for hold in unpinned:
            self.give_back(hold.src, hold.position)
        self._failures = kept
