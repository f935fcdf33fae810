"""Which bytes of one shard map a reader has served, so that it serves each byte once.

The reader (:mod:`hscapture.reader`) serves a large sample as tensors over a private
(copy-on-write) map of its shard file, one map for many reads. A tensor served is the
caller's to write into; so no byte of a map may be served twice (a write into the first
tensor would show in the second), and a read that would is served from a fresh map instead.
:class:`ServedRanges` is that rule for one map; :class:`MapBudget` bounds how much one
:class:`~hscapture.reader.ShardSet` serves from its current maps before it makes fresh ones
(the pages of a served tensor written in place stay in its map while the map lives, after
the tensor is freed: a map's life bounds them).

Pure bookkeeping: no file, no memory map, no lock (the caller holds its own).
"""

from __future__ import annotations

from bisect import bisect_right

__all__ = ["MapBudget", "ServedRanges"]


class ServedRanges:
    """The byte ranges ``[lo, hi)`` one map has served: disjoint, kept sorted.

    Guarantee: :meth:`take` accepts a range only if it shares no byte with any range it
    accepted before, so two tensors served from one map never share memory.
    """

    __slots__ = ("_starts", "_ends", "served_bytes")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        #: the bytes accepted so far
        self.served_bytes = 0

    def take(self, lo: int, hi: int) -> bool:
        """Record ``[lo, hi)`` as served and return True, or return False (recording
        nothing) when it shares a byte with a range served before. An empty or reversed
        range is refused (a ValueError): nothing of it could be served."""
        if not 0 <= lo < hi:
            raise ValueError(f"a served range needs 0 <= lo < hi, found [{lo}, {hi})")
        starts, ends = self._starts, self._ends
        i = bisect_right(starts, lo)
        if i and ends[i - 1] > lo:           # the range starting at or before lo reaches in
            return False
        if i < len(starts) and starts[i] < hi:  # the next range starts inside
            return False
        starts.insert(i, lo)
        ends.insert(i, hi)
        self.served_bytes += hi - lo
        return True

    def __len__(self) -> int:
        return len(self._starts)


class MapBudget:
    """How many bytes one set's current maps may serve before the set makes fresh ones.

    ``spend(n)`` counts ``n`` bytes served; once ``limit`` is reached, :attr:`epoch` grows by
    one and the count restarts: a map made in an earlier epoch is no longer used for new
    reads (its owner drops it; it is unmapped once its last tensor is freed).
    """

    __slots__ = ("limit", "served", "epoch")

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"a map budget needs a positive limit, found {limit}")
        self.limit = int(limit)
        self.served = 0
        self.epoch = 0

    def spend(self, n: int) -> None:
        self.served += n
        if self.served >= self.limit:
            self.served = 0
            self.epoch += 1
