"""Samples whose rows a subscriber never reads, reported by rid when their fate is known.

Two kinds of rows reach a subscriber without their data: the rows an ``unheard`` entry names
(committed before any subscriber attached to the ring) and the rows of an entry that lies
before this subscriber's place in the ring, known from its notice alone. A row that ends its
sample (``last``) reports the sample dropped at once; a row that does not may yet be
discarded by a restart abort (the sample is then captured again whole, and arrives), so its
sample is held as *cut* (:attr:`Source.cut <hscapture._source.Source.cut>`) and reported
when its later rows come (the delivery's row path), an abort names it, no row of it comes
for ``incomplete_timeout_s`` (:meth:`UnreadRows.timeout`) or its incarnation ends
(:meth:`UnreadRows.cut_short`). A durable owner keeps the unheard record of cut samples in the
ring for its resumer (:meth:`RecordHolds.hold_cut <hscapture._holds.RecordHolds.hold_cut>`).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from ._holds import RecordHolds
from ._ledger import LostRange
from ._ledger import failure_event as _event
from ._source import Source

__all__ = ["UnreadRows", "UNHEARD"]

#: why a sample an ``unheard`` entry names was never delivered
UNHEARD = ("committed before any subscriber attached (start the subscriber first, or use "
           "Producer(wait_for_subscribers=1))")


class _Owner(Protocol):
    ledger: Any
    asm: Any
    holds: RecordHolds
    rid_filter: Any
    incomplete_timeout_s: float

    def wants(self, rid: str) -> bool: ...

    def fail(self, key: tuple[int, str], reason: str, kind: str,
             event: str | None = None) -> None: ...

    def hold_failure(self, src: Source, position: int, borrowed: bool = False) -> None: ...

    def of_a_failed_sample(self, src: Source, key: tuple[int, str], token_start: int,
                           cached_prefix: int, seq: int | None = None) -> bool: ...

    def drop_row(self, src: Source, row: dict[str, Any], entry: Any, r: int) -> None: ...

    def abort(self, src: Source, entry: Any) -> bool: ...


class UnreadRows:
    """The rows of unheard and unreadable entries, for the delivery that owns this."""

    def __init__(self, owner: _Owner) -> None:
        self._owner = owner

    def unheard(self, src: Source, record: Any, entry: Any) -> None:
        """An ``unheard`` entry read from ``src``'s ring (``record``): its rows' samples are
        reported dropped or held as cut; a durable owner holds the record while it names a
        failure or a cut sample; ``overflow`` rows it could not name are a lost range."""
        owner = self._owner
        ledger = owner.ledger
        src.unheard_read = True
        failed = len(ledger.failure_log)
        was_cut = len(src.cut)
        for row in entry.rows:
            seq = row["seq"]
            if src.seqs.seen(seq):
                continue
            if owner.rid_filter is not None and not owner.rid_filter(row["rid"]):
                pass      # (not skip_rid: a drain still names a failure it wrote)
            elif row["last"]:
                src.cut.pop(row["rid"], None)
                key = (src.epoch, row["rid"])
                if not ledger.has_failed(key):   # (an abort read first named it)
                    owner.fail(key, UNHEARD, "dropped", _event(src, seq))
            elif owner.wants(row["rid"]):
                # a row that does not end its sample: a restart abort may yet discard
                # it (the sample is then captured again whole, and arrives), so it is
                # held as a cut sample and reported when its fate is known, as
                # unreadable() does (protocol v3; until 2026-12-06 it was
                # reported at once, and a sample restarted after its first chunk was
                # delivered AND reported dropped: fault hunt s3_unheard_restart.py)
                src.cut.setdefault(row["rid"], (seq, UNHEARD))
                src.cut_seen[row["rid"]] = time.monotonic()
            if src.continuing:   # named: not lost as a number too
                src.seqs.add(seq, 1)
        if src.continuing:       # discarded by a restart: nothing to report, not lost
            for seq in entry.meta["discarded"]:
                src.seqs.add(seq, 1)
        if len(ledger.failure_log) > failed:
            owner.hold_failure(src, record.position)
        if len(src.cut) > was_cut:
            owner.holds.hold_cut(src, record.position)
        # (a continuing source reports the numbers no row names as lost, by range)
        if entry.meta["overflow"] and not src.continuing:
            ledger.lost.append(LostRange(
                src.producer or "?", src.epoch, -1, entry.meta["overflow"],
                "committed before any subscriber attached (not named)"))

    def unreadable(self, src: Source, entry: Any, why: str) -> None:
        """An entry of ``src`` this subscriber will never read (it lies before its place in
        the ring), known from its notice alone. Each sample it names is reported once, by
        rid, when its fate is known: a row that ends a sample (``last``) reports the sample
        dropped with ``why``; a row that does not is remembered (:attr:`Source.cut`), since
        a restart abort may yet discard it (the sample is then captured again, and arrives),
        and reported when the sample's later rows come (the delivery's row path), an abort
        names it, or its incarnation ends (:meth:`cut_short`). Drop and abort entries report
        as reading them would. Nothing is held (there is no record to hold); the entry's
        numbers count as seen. (Until 2026-12-05 every row was reported at once: a sample
        restarted after its first chunk was delivered AND reported dropped, and one of two
        chunks was reported twice: final fault hunt.)"""
        owner = self._owner
        kind, epoch = entry.kind, src.epoch
        if kind == "drop":
            for r, row in enumerate(entry.rows):
                if not src.seqs.seen(entry.seq + r):
                    owner.ledger.counts["dropped_rows"] += 1
                    owner.drop_row(src, row, entry, r)
        elif kind == "batch":
            for r, row in enumerate(entry.rows):
                rid, seq = row["rid"], entry.seq + r
                key = (epoch, rid)
                if src.seqs.seen(seq) or not owner.wants(rid) or \
                        owner.of_a_failed_sample(src, key, row["token_start"],
                                                 row["cached_prefix"], seq):
                    continue
                if row["last"]:
                    src.cut.pop(rid, None)
                    owner.fail(key, why, "dropped", _event(src, seq))
                else:
                    src.cut.setdefault(rid, (seq, why))
                    src.cut_seen[rid] = time.monotonic()
        elif kind == "abort" and not src.seqs.seen(entry.seq):
            owner.abort(src, entry)
        if entry.n:
            src.seqs.add(entry.seq, entry.n)

    def timeout(self, src: Source, now: float) -> None:
        """Report, as a partial would be, each :attr:`Source.cut` sample of which no row came
        for ``incomplete_timeout_s`` while its incarnation lives (until 2026-12-05 it waited
        for the incarnation to end: fault hunt 2026-12-05, s4b_cut_timeout.py)."""
        owner = self._owner
        limit = owner.incomplete_timeout_s
        seen = src.cut_seen
        for rid in [r for r in seen if r not in src.cut]:
            del seen[rid]
        for rid, (seq, why) in list(src.cut.items()):
            if now - seen.get(rid, now) > limit:
                del src.cut[rid]
                seen.pop(rid, None)
                key = (src.epoch, rid)
                if not owner.ledger.has_failed(key) and owner.asm.get(key) is None:
                    owner.fail(key, f"{why}; then no row of it for {limit:g}s", "incomplete",
                               _event(src, seq))

    def cut_short(self, src: Source, reason: str) -> None:
        """``src`` ends: report each sample whose first rows lay before this subscriber's
        place and of which nothing more came (:meth:`unreadable`)."""
        owner = self._owner
        for rid, (seq, why) in list(src.cut.items()):
            key = (src.epoch, rid)
            if not owner.ledger.has_failed(key) and owner.asm.get(key) is None:
                owner.fail(key, f"{why}; then {reason}", "incomplete", _event(src, seq))
        src.cut.clear()
