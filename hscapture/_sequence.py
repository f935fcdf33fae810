"""Per-producer-incarnation sequence accounting: which numbers a subscriber has seen.

Numbers are tracked as sorted, disjoint half-open ranges, so the cost of any message is
independent of the numbers it names (a forged ``next_seq`` of 3,000,000 costs nothing).
"""

from __future__ import annotations

import bisect

__all__ = ["SequenceTracker"]


class SequenceTracker:
    """The numbers seen so far, from the first one seen (``base``) on.

    ``add`` returns the part of a range already seen (a duplicate); ``missing`` the gaps
    below the highest number seen; ``missing_below(limit)`` also the gap up to ``limit``.
    """

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self.base: int | None = None
        #: numbers below it were never promised (:meth:`promise_from`): ``base`` stays at or
        #: above it whatever is seen later
        self.floor: int | None = None

    def promise_from(self, first: int) -> None:
        """Every number from ``first`` on is promised, none below: gaps are counted from
        ``first`` even before anything is seen, and a number below it seen later (a drop
        the producer's backlog wrote out of order) does not make the numbers between it and
        ``first`` missing."""
        self.floor = first
        if self.base is None or self.base < first:
            self.base = first

    def add(self, seq: int, n: int) -> int:
        """Mark ``[seq, seq + n)`` seen; return how many of those numbers were seen before."""
        if n <= 0:
            return 0
        if self.base is None:
            self.base = seq if self.floor is None else max(seq, self.floor)
        end = seq + n
        # first range ending at or after seq: an adjacent range merges, so numbers that arrive
        # in order stay ONE range (the cost of every query is the number of gaps, not entries)
        i = bisect.bisect_left(self._ends, seq)
        dup = 0
        j = i
        new_s, new_e = seq, end
        while j < len(self._starts) and self._starts[j] <= end:
            dup += max(0, min(end, self._ends[j]) - max(seq, self._starts[j]))
            new_s = min(new_s, self._starts[j])
            new_e = max(new_e, self._ends[j])
            j += 1
        self._starts[i:j] = [new_s]
        self._ends[i:j] = [new_e]
        if seq < self.base and (self.floor is None or seq >= self.floor):
            self.base = seq
        elif self.floor is not None and seq < self.floor < self.base:
            self.base = self.floor
        return dup

    @property
    def high(self) -> int:
        """One past the highest number seen (``base`` if none)."""
        return self._ends[-1] if self._ends else (self.base or 0)

    def missing_below(self, limit: int) -> list[tuple[int, int]]:
        """Unseen ranges in ``[base, limit)``."""
        if self.base is None:
            return []
        out = []
        at = self.base
        for s, e in zip(self._starts, self._ends):
            if s >= limit:
                break
            if s > at:
                out.append((at, min(s, limit)))
            at = max(at, e)
        if at < limit:
            out.append((at, limit))
        return out

    def missing(self) -> list[tuple[int, int]]:
        """Unseen ranges below the highest number seen."""
        return self.missing_below(self.high)

    def seen(self, seq: int) -> bool:
        i = bisect.bisect_right(self._starts, seq) - 1
        return i >= 0 and seq < self._ends[i]

    def count(self, seq: int, n: int) -> int:
        """How many numbers of ``[seq, seq + n)`` were seen (cost: the ranges it touches)."""
        end = seq + n
        i = bisect.bisect_right(self._ends, seq)
        out = 0
        while i < len(self._starts) and self._starts[i] < end:
            out += max(0, min(end, self._ends[i]) - max(seq, self._starts[i]))
            i += 1
        return out

    def remove(self, seq: int, n: int) -> None:
        """Forget ``[seq, seq + n)`` (``base`` is kept)."""
        end = seq + n
        starts, ends = [], []
        for s, e in zip(self._starts, self._ends):
            if e <= seq or s >= end:
                starts.append(s)
                ends.append(e)
                continue
            if s < seq:
                starts.append(s)
                ends.append(seq)
            if e > end:
                starts.append(end)
                ends.append(e)
        self._starts, self._ends = starts, ends
