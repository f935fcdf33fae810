"""Rows of several captures held back and written as ONE ring entry: the producer's stage.

Why: whatever its size, every ring entry costs the capturing thread a fixed ~150-200 us of
Python on an engine's scheduler thread (plan the layout and encode the meta, reserve, write the
header, describe and issue the copies, queue the entry), measured per forward in a real SGLang
server (benchmarks/results/h200-2026-12-02c). An engine that captures a few rows per forward
every few milliseconds pays that on its critical path once per forward. A stage pays it once
per :attr:`Stage.interval_s`: each capture only keeps its rows, and what it needs to copy them
later, in a :class:`StagedGroup`.

What a group keeps (:meth:`hscapture._copies.EntryCopier.stage` builds it): the rows' wire
maps; per row the first of its token rows in the group's sources; the sources themselves
(referenced, so the allocator cannot reuse them) or, for sources the engine overwrites after
the call (``snapshot``: CUDA-graph outputs), a copy of the rows taken during the call, in the
caller's stream order; the rows' token ids copied out of the engine's buffers during the call;
and the stream the sources were produced on.

This module only decides WHICH groups go into one entry and WHEN; the producer
(:mod:`hscapture.producer`) gives the rows their sequence numbers and writes the entry.
Guarantees of a :class:`Stage`:

- Groups leave in the order they were added, all at once (:meth:`Stage.take`).
- One entry never holds two rows of one rid (a subscriber rejects such an entry whole): a
  group with a staged rid is refused (:meth:`Stage.accepts`), so the producer writes the
  stage first. So are groups of another layout (layers, kinds, dtype, hidden size, block
  widths, layer map, device and stream: one entry has one layout and one copy order).
- :meth:`Stage.due` is true once ``interval_s`` passed since the first group was added, or
  the groups hold ``max_bytes`` (of copies, or of referenced sources: the engine's memory).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Hashable

__all__ = ["Stage", "StagedGroup"]


@dataclass(slots=True)
class StagedGroup:
    """One capture's rows, held until its stage is written (see the module docstring).

    ``sources``: per block, where the rows are: a 2-D tensor (host path) or ``(address, row
    pitch, row width)`` in bytes of device memory (native CUDA path); row ``r``'s token rows
    are ``[starts[r], starts[r] + maps[r]["token_count"])`` of them. ``ids``: per row
    ``(buffer, start, count)``, the token ids (copies, the engine's buffers are not kept).
    ``keepalive``: what must stay referenced until the entry's copy completed. ``nbytes``:
    the memory the group holds (the rows' copies, else the whole sources). ``where``: ``("host",)``, or ``("cuda", device
    index, raw handle of the stream the sources were produced on)``: part of the layout key."""

    where: tuple[Any, ...]
    maps: list[dict[str, Any]]
    starts: list[int]
    sources: list[Any]
    ids: list[tuple[Any, int, int]]
    tokens: int
    nbytes: int
    keepalive: Any = None
    rids: set[str] = field(default_factory=set)


class Stage:
    """The groups waiting to become one ring entry, with the layout key they share."""

    __slots__ = ("interval_s", "max_bytes", "groups", "key", "nbytes", "rows", "since",
                 "_rids")

    def __init__(self, interval_s: float, max_bytes: int) -> None:
        self.interval_s = max(0.0, float(interval_s))
        self.max_bytes = max(1, int(max_bytes))
        self.groups: list[StagedGroup] = []
        self.key: Hashable = None
        self.nbytes = 0
        self.rows = 0
        self.since = 0.0            # time.monotonic() of the first group staged
        self._rids: set[str] = set()

    def __bool__(self) -> bool:
        return bool(self.groups)

    def accepts(self, key: Hashable, rids: set[str]) -> bool:
        """Whether a group of layout ``key`` with rows of ``rids`` may join the staged ones
        (always, when nothing is staged)."""
        if not self.groups:
            return True
        return key == self.key and self._rids.isdisjoint(rids)

    def add(self, key: Hashable, group: StagedGroup, now: float | None = None) -> None:
        """Stage ``group`` (the caller checked :meth:`accepts`)."""
        if not self.groups:
            self.key = key
            self.since = time.monotonic() if now is None else now
        self.groups.append(group)
        self._rids |= group.rids
        self.nbytes += group.nbytes
        self.rows += len(group.maps)

    def due(self, now: float | None = None) -> bool:
        """Whether the staged groups should be written now: ``interval_s`` passed since the
        first was staged, or ``max_bytes`` are staged. False when nothing is staged."""
        if not self.groups:
            return False
        if self.nbytes >= self.max_bytes:
            return True
        return (time.monotonic() if now is None else now) - self.since >= self.interval_s

    def take(self) -> list[StagedGroup]:
        """Every staged group, oldest first; the stage is empty afterwards."""
        groups, self.groups = self.groups, []
        self._rids = set()
        self.key, self.nbytes, self.rows = None, 0, 0
        return groups
