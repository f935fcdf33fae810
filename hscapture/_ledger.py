"""A subscriber's account of what it did NOT deliver, and its counters.

Everything a :class:`~hscapture.Subscriber` reports lives here: failed samples by rid
(``dropped``, ``incomplete``, ``rejected``), sequence ranges whose rids can never be known
(:class:`LostRange`), producer-id conflicts, error messages and counters. Nothing here reads a
ring or a socket; the modules above record into one :class:`Ledger` and the subscriber hands
its dicts out as they are.
"""

from __future__ import annotations

import collections
import logging
import types
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import IncompleteSampleError, SampleDroppedError, SampleMismatchError
from .record import ENDED, ended_by_abort, parse_event

log = logging.getLogger("hscapture")

__all__ = ["LostRange", "Ledger", "MAX_ERRORS", "MAX_FAILED", "failure_event"]

#: error messages kept (the counters keep counting past it)
MAX_ERRORS = 200
#: (epoch, rid) of failed samples remembered, so that their late chunks are discarded
MAX_FAILED = 1 << 16
#: distinct skipped rids kept by name (:attr:`Ledger.skipped`)
MAX_SKIPPED = 10_000


@dataclass(frozen=True)
class LostRange:
    """Sequence numbers ``[first, first + count)`` of one producer incarnation whose events
    the subscriber can never learn (their rids are unknown): the producer could not record
    them (ring and backlog full), died before committing them, or the subscription expired."""

    producer: str
    epoch: int
    first: int
    count: int
    reason: str


def _event_seq(event: str | None) -> int | None:
    """The sequence number of a failure event ``"epoch:seq"`` (None: none or malformed)."""
    got = parse_event(event)
    return None if got is None else got[1]


class Ledger:
    """The reports and counters of one subscriber.

    Guarantees:
    - A failed rid is recorded under exactly the kind it failed with (``dropped`` /
      ``incomplete`` / ``rejected``) with its reason, and stays there; :meth:`raise_if_failed`
      raises the matching typed error for it.
    - The failed ``(epoch, rid)`` keys are remembered (the newest :data:`MAX_FAILED`), so
      chunks of a failed sample arriving later are recognised (:meth:`has_failed`), until a
      new sample of the rid begins (:meth:`new_attempt`: the report stays).
    - Memory is bounded where input could grow it without limit: at most :data:`MAX_ERRORS`
      messages (counters keep counting); lost ranges are merged per report, never per number.
    """

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.errors: collections.deque[str] = collections.deque(maxlen=MAX_ERRORS)
        self.dropped: dict[str, str] = {}
        self.incomplete: dict[str, str] = {}
        self.rejected: dict[str, str] = {}
        self.lost: list[LostRange] = []
        self.conflicts: dict[str, str] = {}
        #: (epoch, rid) of a failed sample -> the sequence number of the row or entry that
        #: failed it (None: no record did)
        self._failed: collections.OrderedDict[tuple[int, str], int | None] = \
            collections.OrderedDict()
        self._failed_view = types.MappingProxyType(self._failed)
        #: every failure in the order it was recorded: ``(kind, rid, reason, event)``, kind
        #: one of ``dropped`` / ``incomplete`` / ``rejected``, event ``"epoch:seq"`` of the
        #: ring row or entry that named it (None when no record did: a timeout, a producer
        #: gone) (what a durable consumer persists before it acknowledges failures:
        #: :meth:`Subscriber.failures`); kind :data:`ENDED` is not a failure of its own: an
        #: abort that ended a sample reported failed before (:meth:`record_end`)
        self.failure_log: list[tuple[str, str, str, str | None]] = []
        #: events a caller already recorded (an earlier run's failures, read again from the
        #: ring by a resumer): the sample still fails, but is not reported twice
        self.known_events: set[str] = set()
        #: rids whose rows ``skip_rid`` turned away (a drain: already in its directory), the
        #: first :data:`MAX_SKIPPED` distinct ones; ``counts["already_written"]`` counts rows
        self.skipped: dict[str, None] = {}

    def error(self, message: str, counter: str) -> None:
        """Count ``counter``, keep ``message``; the first of each counter is logged."""
        self.counts[counter] += 1
        self.errors.append(message)
        if self.counts[counter] == 1:
            log.warning("hscapture subscriber: %s (further %s are counted)", message, counter)

    def record_failure(self, key: tuple[int, str], reason: str, kind: str,
                       event: str | None = None) -> None:
        """Sample ``key`` = (epoch, rid) failed: ``kind`` is ``dropped``, ``rejected`` or
        anything else (``incomplete``); ``event`` names the record that says so (see
        :attr:`failure_log`). A known event fails the sample without reporting it again."""
        self.known_failed(key, _event_seq(event), ended_by_abort(reason))
        if event is not None and event in self.known_events:
            self.counts["failures_known_before"] += 1
            return
        rid = key[1]
        kind = kind if kind in ("dropped", "rejected") else "incomplete"
        target = {"dropped": self.dropped, "rejected": self.rejected}.get(kind, self.incomplete)
        target[rid] = reason
        self.failure_log.append((kind, rid, reason, event))
        self.counts[f"{kind}_samples"] += 1

    def known_failed(self, key: tuple[int, str], seq: int | None = None,
                     ended: bool = False) -> None:
        """Sample ``key`` failed and a caller already reported it (an earlier owner of a
        durable place): its later chunks are recognised (:meth:`has_failed`) and neither used
        nor reported as another failure of the rid; a new sample of the rid begins as usual
        (:meth:`new_attempt`); ``seq``: the number of the row or entry that failed it;
        ``ended``: that was an abort, which ends the sample (:meth:`ended_before`)."""
        self._failed[key] = (seq, ended)
        self._failed.move_to_end(key)
        while len(self._failed) > MAX_FAILED:
            self._failed.popitem(last=False)

    def has_failed(self, key: tuple[int, str]) -> bool:
        return key in self._failed

    @property
    def failed_keys(self) -> Mapping[tuple[int, str], Any]:
        """The keys :meth:`has_failed` is true of, as a live read-only view (a hot loop's
        ``key in failed_keys``, without a call per row)."""
        return self._failed_view

    def failed_at(self, key: tuple[int, str]) -> int | None:
        """The number of the row or entry that failed ``key``'s sample (None: unknown): a
        start of the rid numbered below it is that sample's own, read out of order."""
        got = self._failed.get(key)
        return None if got is None else got[0]

    def ended_before(self, key: tuple[int, str], seq: int) -> bool:
        """Whether an abort numbered below ``seq`` ended ``key``'s failed sample: a row of the
        rid numbered ``seq`` is then a later attempt's, even one that does not start a
        sample (its start read by an earlier owner of a durable place and gone from the
        ring). Until 2026-12-06 such rows were taken for the aborted sample's and the retry
        was neither delivered nor reported (fault hunt H14, GUARANTEES gap 15)."""
        got = self._failed.get(key)
        return got is not None and got[1] and got[0] is not None and seq > got[0]

    def ended(self, key: tuple[int, str], seq: int | None) -> None:
        """An abort numbered ``seq`` came for ``key``'s sample, which had failed before (a
        dropped chunk): it ends the sample there."""
        if key in self._failed:
            self._failed[key] = (seq, True)

    def record_end(self, key: tuple[int, str], reason: str, event: str) -> bool:
        """An abort (``event``, ``reason``) came for ``key``'s sample, which had failed before
        (a dropped chunk): it ends the sample there (:meth:`ended_before`), and unless a
        caller recorded the event already it goes into :attr:`failure_log` as kind
        :data:`ENDED`, so that a durable consumer persists it beside the failure: a resumer
        that learns the failure from the consumer's record, not from the ring, knows too
        that later rows of the rid are another attempt's (until 2026-12-06 it knew only the
        drop and discarded a retry met without its start: GUARANTEES gap 15). Not reported
        to the user: the sample's failure was. Returns whether it went into the log."""
        if key not in self._failed:
            return False
        self.ended(key, _event_seq(event))
        if event in self.known_events:
            return False
        self.failure_log.append((ENDED, key[1], reason, event))
        self.counts["ended_after_failure"] += 1
        return True

    def new_attempt(self, key: tuple[int, str]) -> None:
        """A new sample of ``key``'s rid begins after its failed one (a client retrying with
        the same rid): its chunks are no longer the failed sample's. The failure's report
        stays where :meth:`record_failure` put it."""
        self._failed.pop(key, None)
        self.counts["new_attempts_after_failure"] += 1

    def retract_lost(self, epoch: int, first: int, count: int) -> None:
        """Take ``[first, first + count)`` of ``epoch`` out of :attr:`lost` (the list object
        stays the same: the subscriber hands it out)."""
        end = first + count
        kept: list[LostRange] = []
        for x in self.lost:
            if x.epoch != epoch or x.first < 0 or x.first + x.count <= first or x.first >= end:
                kept.append(x)
                continue
            if x.first < first:
                kept.append(LostRange(x.producer, x.epoch, x.first, first - x.first, x.reason))
            if x.first + x.count > end:
                kept.append(LostRange(x.producer, x.epoch, end, x.first + x.count - end,
                                      x.reason))
        self.lost[:] = kept

    def raise_if_failed(self, rid: str) -> None:
        """Raise the typed error of ``rid`` if it is known to have failed."""
        if rid in self.dropped:
            raise SampleDroppedError(f"sample {rid!r} was dropped: {self.dropped[rid]}")
        if rid in self.rejected:
            raise SampleMismatchError(self.rejected[rid])
        if rid in self.incomplete:
            raise IncompleteSampleError(f"sample {rid!r} is incomplete: {self.incomplete[rid]}")


def failure_event(src: Any, seq: int) -> str:
    """The failure event a ring row or entry numbered ``seq`` of source ``src`` names
    (:attr:`Ledger.failure_log`): read again by a resumer, the same event; a new attempt of
    the rid, another one."""
    return f"{src.epoch}:{seq}"
