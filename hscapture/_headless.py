"""Rows a resumed durable place meets without their sample's start, below ``delivered``.

A durable place inherits ``delivered`` (every sample whose last row lies below it was
acknowledged by an earlier owner) and ``unsettled`` (the lowest open partial that stopped
pinning the ring): rows below ``min(delivered, unsettled - 1)`` that continue a sample are
skipped, rows at or above ``delivered`` without their start are reported incomplete at once
(:mod:`hscapture._delivery`, #13b). Between the two, a row may belong to a sample an earlier
owner received whole and acknowledged (its first rows left the ring while a later record
held it) or to one that owner never finished. :class:`HeadlessSamples` tells them apart by
the sample's last row: below ``delivered``, acknowledged, skipped; a row or entry at or
above ``delivered`` first, a new attempt of the rid, or ``incomplete_timeout_s`` without a
row: reported incomplete, the first row read held as a failure is. Until 2026-12-06 every
such row was reported at once, and an unrelated open partial that stopped pinning made a
resumer report samples the killed owner had received whole (GUARANTEES gap 14(a)).
"""

from __future__ import annotations

import time
import types
from typing import Any, Mapping, Protocol

from ._holds import RecordHolds
from ._ledger import failure_event as _event
from ._source import Source

__all__ = ["HeadlessSamples", "gone"]


def gone(segment: str, start: int) -> str:
    """Why a sample whose first rows an earlier owner read cannot complete here."""
    return (f"its first rows were read by an earlier subscriber of {segment}'s durable place "
            f"and are gone from the ring; positions from {start} on arrived")


class _Owner(Protocol):
    ledger: Any
    holds: RecordHolds

    def fail(self, key: tuple[int, str], reason: str, kind: str,
             event: str | None = None) -> None: ...

    def hold_failure(self, src: Source, position: int, borrowed: bool = False) -> None: ...


class HeadlessSamples:
    """The samples of :func:`row`'s kind whose last row has not come yet, by key: ``[src,
    first seq read, record position held, first token position read, since]``."""

    def __init__(self, owner: _Owner) -> None:
        self._owner = owner
        self._held: dict[tuple[int, str], list[Any]] = {}
        self._view = types.MappingProxyType(self._held)

    def __bool__(self) -> bool:
        return bool(self._held)

    def __contains__(self, key: object) -> bool:
        return key in self._held

    @property
    def keys_held(self) -> Mapping[tuple[int, str], Any]:
        """The keys held, as a live read-only view (for a hot loop's truth test and ``in``,
        without a call per row)."""
        return self._view

    def row(self, src: Source, record: Any, key: tuple[int, str], rv: Any) -> bool:
        """A resumed durable place read ``rv``, a row continuing a sample whose start it never
        saw, at or above ``continuations_below``: True when this decided it (skipped, or
        reported from a row held earlier), False when the caller reports it now (at or above
        ``delivered`` with nothing held)."""
        held = self._held.get(key)
        if rv.seq >= src.settlement.acknowledged_below:
            if held is None:
                return False
            self._report(key)
            return True
        owner = self._owner
        if rv.last:     # its last row below `delivered`: an earlier owner acknowledged it
            owner.ledger.counts["acknowledged_before"] += 1
            if held is not None:
                del self._held[key]
                self._owner.holds.give_back(held[0], held[2])
            return True
        owner.ledger.counts["discarded_chunks"] += 1
        if held is None:
            src.borrowed.add(record.position)
            self._held[key] = [src, rv.seq, record.position, rv.token_start, time.monotonic()]
        return True

    def settle(self, src: Source | None = None, older_than: float | None = None,
               key: tuple[int, str] | None = None) -> None:
        """Report incomplete the samples held (of ``src``; idle since before ``older_than``;
        only ``key``): their last rows did not come below ``delivered``."""
        for k, (hsrc, _seq, _pos, _start, since) in list(self._held.items()):
            if (key is not None and k != key) or (src is not None and hsrc is not src) or \
                    (older_than is not None and since > older_than):
                continue
            self._report(k)

    def forget(self, key: tuple[int, str]) -> None:
        """A restart abort discarded the sample: nothing to report, its record given back."""
        held = self._held.pop(key, None)
        if held is not None:
            self._owner.holds.give_back(held[0], held[2])

    def failed(self, key: tuple[int, str]) -> None:
        """The sample failed otherwise (an abort, a drop): its held record names it to a
        resumer, as a failure's record does."""
        held = self._held.pop(key, None)
        if held is not None:
            self._owner.hold_failure(held[0], held[2], borrowed=True)

    def _report(self, key: tuple[int, str]) -> None:
        src, seq0, _position, start, _since = self._held[key]
        self._owner.fail(key, gone(src.segment, start), "incomplete", _event(src, seq0))
        # (fail() calls failed(), which turns the held record into a failure hold)
