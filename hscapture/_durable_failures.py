"""``DurableFailures``: what a durable subscriber keeps beside its name about failures and
out-of-order acknowledgements, so that a subscriber resumed under the name after a crash
reports every failure once and hands out no acknowledged sample again.

- ``acknowledge(through)``: the first ``through`` failures are recorded in the name's
  acknowledged file (``_subscriptions.record_acknowledged``); those of them in the pending
  file are taken out of it afterwards (a crash between leaves them known, not reported
  twice).
- ``record_pending(upto)``: called by the delivery (``Delivery.before_unpin``) before the
  ring bounds (a quarter of the ring, ``partial_hold_s``) give back the records of failures
  not yet acknowledged: they are appended to the name's pending file, per endpoint of the
  ring that named them (``_subscriptions.record_pending``), so that a resumer reports them
  as it would have from the ring.
- ``read_pending()``: once, before a resumer's first pump (after the caller's
  ``known_failures``): those pending failures are reported again, in the order they were
  numbered; those a caller or the acknowledged file knows are taken out of the file.
- ``record_ahead(...)``: a sample acknowledged out of queue order, recorded beside the name
  (``_settlement.Settlement`` calls it through the registry).

Imports only foundations (``_subscriptions``, ``record``); the ledger and the registry are
the subscriber's, passed in.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Sequence

from ._subscriptions import (Failure, endpoint_key, forget_pending, pending,
                             record_acknowledged, record_acknowledged_ahead, record_pending,
                             segments_of, settle_pending)
from .record import ENDED, parse_event

if TYPE_CHECKING:   # (annotations only: the subscriber passes its own)
    from ._ledger import Ledger
    from ._registry import SourceRegistry

log = logging.getLogger("hscapture")

#: failures in a durable name's pending file, never acknowledged, past which it warns once
PENDING_WARN = 1 << 16


class DurableFailures:
    """The failure files of durable subscription ``name`` at ``endpoints`` (see the module
    docstring). ``ledger.failure_log`` is the subscriber's ``failures()``."""

    def __init__(self, name: str, endpoints: Sequence[str], ledger: Ledger,
                 registry: SourceRegistry) -> None:
        self.name = name
        self.endpoints = list(endpoints)
        self.keys = [endpoint_key(e) for e in self.endpoints]
        self.ledger = ledger
        self.registry = registry
        #: failures acknowledged so far
        self.acked = 0
        #: ``failures()[:spilled]`` are acknowledged or in the pending file; ``pending``:
        #: those of ours in it, taken out when acknowledged
        self.spilled = 0
        self.pending: set[Failure] = set()
        #: read_pending() ran (it runs once, before the first pump)
        self.pending_read = False

    def acknowledge(self, through: int) -> None:
        """Record ``failures()[:through]`` as acknowledged beside the name, then settle
        those of them in the pending file."""
        if through <= self.acked:
            return
        done = self.ledger.failure_log[self.acked:through]
        record_acknowledged(self.name, done)
        self.acked = through
        if self.pending:     # (recorded as acknowledged first: a crash between leaves
            #                   them known to a resumer, not reported twice)
            settled = [f for f in done if f in self.pending]
            settle_pending(self.name, self.keys, settled)
            self.pending.difference_update(settled)

    def record_pending(self, upto: int) -> None:
        """The bounds on the ring are about to give back the records of failures
        ``failures()[:upto]`` not yet acknowledged: write those named by a ring record to
        the name's pending file first, so that a resumer after a crash reports them as it
        would have from the ring (:meth:`read_pending`). Until 2026-12-06 (thirty-first
        session) a consumer recording less often than at every return (`get()`, whose
        pumps do not return; a periodic acknowledgement) and killed then left them named by
        no one (GUARANTEES gap 1)."""
        start = max(self.acked, self.spilled)
        if upto <= start:
            return
        spill = [f for f in self.ledger.failure_log[start:upto] if f[3] is not None]
        if record_pending(self.name, [(ep, f) for f in spill
                                      for ep in self.endpoints_of(f[3])]):
            had = len(self.pending)
            self.pending.update(spill)
            self.ledger.counts["failures_pending_recorded"] += len(spill)
            if had < PENDING_WARN <= len(self.pending):
                log.warning("hscapture subscriber %r: %d failures read and never "
                            "acknowledged are kept in its pending file for a resumer (it "
                            "grows until they are): record failures() and call "
                            "acknowledge_failures()", self.name, len(self.pending))
        self.spilled = upto

    def endpoints_of(self, event: str) -> list[str]:
        """The endpoint (its key) whose ring named ``event``: a pending failure belongs to
        the subscription of the name at that endpoint only (until 2026-12-06 a subscriber of
        the same name at another endpoint reported, acknowledged and so removed another
        subscription's pending failures: fault hunt H19, 368-410 rids named by no one).
        Several when it cannot tell (the ring's incarnation gone): each of ours."""
        keys = self.keys
        number = parse_event(event)
        src = None if number is None or len(keys) == 1 else \
            self.registry.sources.get(number[0])
        if src is not None:
            for endpoint, key in zip(self.endpoints, keys):
                if src.segment in segments_of([endpoint]):
                    return [key]
        return keys

    def record_ahead(self, epoch: int, last_seq: int, rid: str, first_seq: int) -> None:
        """A sample acknowledged out of queue order (:class:`~hscapture._settlement.
        Settlement`): recorded beside the name, counted (``acknowledged_out_of_order``)."""
        self.ledger.counts["acknowledged_out_of_order"] += 1
        record_acknowledged_ahead(self.name, epoch, last_seq, rid, first_seq)

    def read_pending(self) -> None:
        """Once, before the first pump of a durable subscriber (after the caller's
        ``known_failures``): the failures an earlier subscriber of the name read and left
        unacknowledged with their ring records given back (:meth:`record_pending`) are
        reported again, in the order they were numbered; those a caller or the
        acknowledged file knows are taken out of the file."""
        self.pending_read = True
        ledger = self.ledger
        known: list[Failure] = []
        # (every event in the file parses: pending() reads only such lines)
        numbered = sorted((parse_event(f[3]) or (0, 0), f)
                          for f in pending(self.name, self.keys))
        for (epoch, seq), f in numbered:
            kind, rid, reason, event = f
            if event in ledger.known_events:
                known.append(f)
                continue
            if kind == ENDED:
                if not ledger.record_end((epoch, rid), reason, event):
                    ledger.known_failed((epoch, rid), seq, ended=True)
                    known.append(f)
                    continue
            else:
                ledger.record_failure((epoch, rid), reason, kind, event)
            ledger.known_events.add(event)      # (its ring record, read again: not twice)
            self.pending.add(f)
            ledger.counts["failures_pending_read"] += 1
        settle_pending(self.name, self.keys, known)
        self.spilled = len(ledger.failure_log)    # (they are in the file already)
        if self.pending:
            log.warning("hscapture subscriber %r: %d failure(s) an earlier subscriber of the "
                        "name read and never acknowledged (its ring records were given back "
                        "before it stopped): reported again, see failures()", self.name,
                        len(self.pending))

    def forget(self) -> None:
        """The subscription ends (``unsubscribe()``): its pending lines go with it."""
        forget_pending(self.name, self.keys)
