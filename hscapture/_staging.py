"""Rows of several captures held back and written as ONE ring entry: the producer's stage.

Why: whatever its size, every ring entry costs the capturing thread a fixed ~150-200 us of
Python on an engine's scheduler thread (plan the layout and encode the meta, reserve, write the
header, describe and issue the copies, queue the entry), measured per forward in a real SGLang
server (benchmarks/results/h200-2026-12-02c). An engine that captures a few rows per forward
every few milliseconds pays that on its critical path once per forward. A stage pays it once
per :attr:`Stage.interval_s`: each capture only keeps its rows, and what it needs to copy them
later, as one :class:`StagedGroup` (its sources) and :class:`StagedRow` pieces.

What a group keeps (:meth:`hscapture._copies.EntryCopier.stage` builds it): the sources
(referenced, so the allocator cannot reuse them) or, for sources the engine overwrites after
the call (``snapshot``: CUDA-graph outputs), a copy of the rows taken during the call in the
caller's stream order; and the stream they were produced on. The rows' token ids are copied
out of the engine's buffers during the call.

A chunked prompt's next chunk usually comes in the very next forward (with 2,048-token chunks
and ~300-token prompts, the last prompt of almost every forward is split), so a chunk that
continues a staged row of its sample (same rid, starting where it ends, same ``extra``,
``cached_prefix`` and field names) is MERGED into that row: one row, one sequence number, its
token rows taken piece by piece from each forward's sources, exactly the row an engine with
longer chunks would have produced. (One entry never holds two rows of one rid: a subscriber
rejects such an entry whole.)

This module only decides WHICH rows go into one entry and WHEN; the entry writer
(:mod:`hscapture._entries`) gives the rows their sequence numbers and writes the entry.
Guarantees of a :class:`Stage`:

- Rows leave in the order their first piece was added, all at once (:meth:`Stage.take`); a
  merged row's pieces in the order they were added, i.e. token order.
- A capture is refused (:meth:`Stage.accepts`: the producer writes the stage first) when it
  has another layout (layers, kinds, dtype, hidden size, block widths, layer map, device and
  stream: one entry has one layout and one copy order) or a row of a staged rid that does not
  continue that rid's staged row.
- :meth:`Stage.due` is true once ``interval_s`` passed since the first group was added, or
  the groups hold ``max_bytes`` (of copies, or of referenced sources: the engine's memory).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Hashable, Mapping, Sequence

__all__ = ["Stage", "StagedGroup", "StagedRow", "entry_spans"]


@dataclass(slots=True)
class StagedGroup:
    """One capture's sources, held until its stage is written (see the module docstring).

    ``sources``: per block, a 2-D tensor (host path) or ``(address, row pitch, row width)``
    in bytes of device memory (native CUDA path). ``nbytes``: the memory the group holds
    (the rows' copies, else the whole sources). ``keepalive``: what must stay referenced until
    the entry's copy completed. ``where``: ``("host",)``, or ``("cuda", device index, raw
    handle of the stream the sources were produced on)``: part of the layout key."""

    where: tuple[Any, ...]
    sources: list[Any]
    nbytes: int
    keepalive: Any = None


@dataclass(slots=True)
class StagedRow:
    """One row of the entry to be: its wire map (a merged row's is a new map), and per piece
    ``(group index, first source row, count)`` and its token ids ``(buffer, start, count)``,
    in token order."""

    map: dict[str, Any]
    pieces: list[tuple[int, int, int]]
    ids: list[tuple[Any, int, int]]


class Stage:
    """The rows waiting to become one ring entry, the groups they come from, and the layout
    key they share."""

    __slots__ = ("interval_s", "max_bytes", "groups", "rows", "key", "nbytes", "since",
                 "_by_rid")

    def __init__(self, interval_s: float, max_bytes: int) -> None:
        self.interval_s = max(0.0, float(interval_s))
        self.max_bytes = max(1, int(max_bytes))
        self.groups: list[StagedGroup] = []
        self.rows: list[StagedRow] = []
        self.key: Hashable = None
        self.nbytes = 0
        self.since = 0.0            # time.monotonic() of the first group staged
        self._by_rid: dict[str, int] = {}

    def __bool__(self) -> bool:
        return bool(self.groups)

    def accepts(self, key: Hashable, maps: Sequence[Mapping[str, Any]]) -> bool:
        """Whether a capture of layout ``key`` with rows ``maps`` may join the staged ones:
        always when nothing is staged; else the same key, and each row of a staged rid
        continuing that rid's staged row."""
        if not self.groups:
            return True
        if key != self.key:
            return False
        by_rid, rows = self._by_rid, self.rows
        for m in maps:
            i = by_rid.get(m["rid"])
            if i is not None and not continues(rows[i].map, m):
                return False
        return True

    def add(self, key: Hashable, group: StagedGroup, maps: Sequence[dict[str, Any]],
            starts: Sequence[int], ids: Sequence[tuple[Any, int, int]],
            now: float | None = None) -> None:
        """Stage one capture (the caller checked :meth:`accepts`): ``maps[r]``'s token rows
        are ``[starts[r], starts[r] + token_count)`` of ``group``'s sources, its ids
        ``ids[r]``."""
        if not self.groups:
            self.key = key
            self.since = time.monotonic() if now is None else now
        g = len(self.groups)
        self.groups.append(group)
        self.nbytes += group.nbytes
        by_rid, rows = self._by_rid, self.rows
        for m, s, part in zip(maps, starts, ids):
            piece = (g, s, m["token_count"])
            i = by_rid.get(m["rid"])
            if i is None:
                by_rid[m["rid"]] = len(rows)
                rows.append(StagedRow(m, [piece], [part]))
            else:
                row = rows[i]
                row.map = merged(row.map, m)
                row.pieces.append(piece)
                row.ids.append(part)

    def due(self, now: float | None = None) -> bool:
        """Whether the staged rows should be written now: ``interval_s`` passed since the
        first group was staged, or ``max_bytes`` are held. False when nothing is staged."""
        if not self.groups:
            return False
        if self.nbytes >= self.max_bytes:
            return True
        return (time.monotonic() if now is None else now) - self.since >= self.interval_s

    def take(self) -> tuple[list[StagedGroup], list[StagedRow]]:
        """Every staged group and row, oldest first; the stage is empty afterwards."""
        groups, rows = self.groups, self.rows
        self.groups, self.rows, self._by_rid = [], [], {}
        self.key, self.nbytes = None, 0
        return groups, rows


def continues(staged: Mapping[str, Any], m: Mapping[str, Any]) -> bool:
    """Whether row ``m`` is the next chunk of the sample whose staged row is ``staged``."""
    return (not staged["last"]
            and m["token_start"] == staged["token_start"] + staged["token_count"]
            and m["cached_prefix"] == staged["cached_prefix"]
            and m["extra"] == staged["extra"]
            and m["fields"].keys() == staged["fields"].keys())


def merged(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Row ``a`` followed by its next chunk ``b`` (:func:`continues`), as one row (a new map,
    in ``a``'s key order; per-token fields concatenated)."""
    out = dict(a)
    out["token_count"] = a["token_count"] + b["token_count"]
    out["last"] = b["last"]
    if a["fields"]:
        out["fields"] = {k: bytes(v) + bytes(b["fields"][k]) for k, v in a["fields"].items()}
    return out


def entry_spans(rows: Sequence[StagedRow]) -> list[tuple[int, int, int]]:
    """The entry's token rows in order as ``(group, first source row, end)`` spans, adjacent
    pieces of one group merged (the fewest copies)."""
    spans: list[tuple[int, int, int]] = []
    for row in rows:
        for g, s, n in row.pieces:
            if spans and spans[-1][0] == g and spans[-1][2] == s:
                spans[-1] = (g, spans[-1][1], s + n)
            else:
                spans.append((g, s, s + n))
    return spans
