"""The pass log's passes captured in one producer call: an arena for their rows, and the batch
of rows taken from it.

Why: every :meth:`hscapture.producer.Producer.capture_rows` call costs the scheduler's thread
the same fixed Python whatever its number of rows (the checks, the layout look-up, the capture
lock, a staged group and its bookkeeping: in a real server the largest share of a processed
pass, ``benchmarks/results/h200-2026-12-04/hook-profile-tiny-109afab.txt``). A logged pass
whose outputs are CUDA-graph buffers is copied at the pass anyway (the next replay overwrites
them). Copied into ONE :class:`LogArena` instead of a fresh tensor per pass, the rows of every
pass of a drain lie in the same source blocks, and the drain captures them in one call
(:class:`RowBatch`).

A chunked prompt's next chunk comes in the very next pass, first in its batch (SGLang adds the
chunked request before new ones), right after the previous chunk in the arena: the batch
merges it into that chunk's row (one row per rid per call, as a producer requires), its token
rows contiguous in the arena. A chunk that does not continue its rid's row that way starts a
new batch (the caller captures the old one first).

Guarantees: :meth:`LogArena.put` copies in the caller's current stream order, as the
``clone()`` it replaces did (on a GPU in one native call per pass where the native copy path
runs: :class:`hscapture._cuda_copy.DeviceRowCopier`), and never writes a row twice (a full
arena is replaced; the old one stays alive as long as a staged capture references it).
:meth:`RowBatch.take` returns rows in the order they were added, a merged row where its first
chunk was.
"""

from __future__ import annotations

import sys
from array import array
from typing import Any, Mapping, Sequence

import torch

from .._cuda_copy import DeviceRowCopier, native_available
from .._staging import continues, merged

__all__ = ["Arenas", "LogArena", "RowBatch", "ARENA_BYTES"]

#: the rows of one arena at most, in bytes: it is also bounded by 1/16 of the ring, what the
#: pass log holds at most (64 MiB with the default 1 GiB ring), so that a drain's passes lie
#: in one arena and go out in one call. 256 MiB: at the 1B shape (16 KiB a row with the final
#: norm) 64 MiB held two passes of 2,048 rows, a capture call every two passes. (A pass
#: larger than this gets an arena of its own size.)
ARENA_BYTES = 256 << 20


class LogArena:
    """Device (or host) blocks like a forward's output blocks (same widths, dtype, device),
    filled with logged passes' rows front to back."""

    __slots__ = ("blocks", "rows", "used", "key", "host", "row_bytes", "device", "copier",
                 "_dst")

    def __init__(self, like: Sequence[torch.Tensor], rows: int,
                 copier: DeviceRowCopier | None = None) -> None:
        self.key = arena_key(like)
        device = like[0].device
        # Host arenas (tests, the CPU proxy of bench_hook) are zero-filled here: their pages
        # are faulted in once, not by each pass's copy into fresh pages (~50 us a pass on the
        # CPU proxy, more than the copy). Device memory has no such cost: left uninitialized.
        self.host = device.type == "cpu"
        self.blocks = [(torch.zeros if self.host else torch.empty)(
            (rows, w), dtype=dt, device=device) for w, dt in self.key]
        self.row_bytes = sum(int(b.shape[1]) * b.element_size() for b in self.blocks)
        self.rows = rows
        self.used = 0
        #: device arenas: each block's (address, row bytes, element size), for ``copier``
        #: (one native call per :meth:`put` instead of two views and a ``copy_`` per block)
        self.device = device.index
        self.copier = None if self.host else copier
        self._dst = [(b.data_ptr(), int(b.shape[1]) * b.element_size(), b.element_size())
                     for b in self.blocks]

    def idle(self) -> bool:
        """Whether no view of the blocks is alive: every capture that took rows from it let
        go of them (a view, and a view of a view, keeps its base tensor referenced; the
        references counted here are the blocks list's, the loop's and the call's)."""
        return all(sys.getrefcount(b) <= 3 for b in self.blocks)

    @classmethod
    def sized_for(cls, like: Sequence[torch.Tensor], rows: int, max_bytes: int,
                  copier: DeviceRowCopier | None = None) -> "LogArena":
        """An arena for blocks like ``like`` holding ``rows`` rows at least, and as many as
        ``min(ARENA_BYTES, max_bytes)`` hold."""
        row_bytes = sum(int(b.shape[1]) * b.element_size() for b in like)
        return cls(like, max(rows, min(ARENA_BYTES, max_bytes) // max(1, row_bytes)), copier)

    def fits(self, key: tuple, rows: int) -> bool:
        """Whether ``rows`` more rows of blocks with key ``key`` (:func:`arena_key`) fit."""
        return key == self.key and self.used + rows <= self.rows

    def put(self, sources: Sequence[torch.Tensor], first: int, end: int,
            source_rows: int = -1) -> int:
        """Copy rows ``[first, end)`` of each source into the next free rows of its block (on
        the caller's current stream: ordered after the forward that wrote them, before
        anything enqueued next); returns the first of them. ``source_rows``: the sources'
        row count where the caller read it (all of them taken: no slice)."""
        pos, n = self.used, end - first
        copier = self.copier
        if copier is not None:
            copies = array("Q")
            for (dst, pitch, size), src in zip(self._dst, sources):
                st = src.stride()
                if st[1] != 1:          # not dense rows: the torch copy below
                    break
                sp = st[0] * size
                copies.extend((dst + pos * pitch, pitch, src.data_ptr() + first * sp, sp,
                               pitch, n))
            else:
                self.used = pos + n     # (written, or being written, whatever the driver says)
                copier.copy(self.device, copies)
                return pos
        whole = first == 0 and end == source_rows
        for dst, src in zip(self.blocks, sources):
            dst[pos:pos + n].copy_(src if whole else src[first:end])
        self.used = pos + n
        return pos


class Arenas:
    """The pass log's current arena, and for host arenas one spare, reused once idle.

    A full arena is replaced. On a GPU the replacement is a fresh allocation (the caching
    allocator hands out freed device memory at no cost). On the host a fresh allocation's
    pages are faulted in again, so the last full arena is kept and taken back once
    :meth:`LogArena.idle` (the captures that read it completed)."""

    __slots__ = ("current", "spare", "copier", "_native")

    def __init__(self) -> None:
        self.current: LogArena | None = None
        self.spare: LogArena | None = None
        #: the native device copier of device arenas (made at the first, where the native
        #: copy path runs: :func:`hscapture._cuda_copy.native_available`), else None
        self.copier: DeviceRowCopier | None = None
        self._native: bool | None = None

    def for_rows(self, sources: Sequence[torch.Tensor], rows: int, max_bytes: int) -> LogArena:
        """The arena to put ``rows`` rows of blocks like ``sources`` into: the current one
        where they fit, else an idle spare that holds them, else a new one sized by
        :meth:`LogArena.sized_for`."""
        key, cur = arena_key(sources), self.current
        if cur is not None and cur.fits(key, rows):
            return cur
        spare = self.spare
        if spare is not None and spare.key == key and spare.rows >= rows and spare.idle():
            spare.used = 0
            nxt = spare
        else:
            if self._native is None and sources[0].is_cuda:
                self._native = native_available() == ""
                self.copier = DeviceRowCopier() if self._native else None
            nxt = LogArena.sized_for(sources, rows, max_bytes, self.copier)
        self.spare = cur if cur is not None and cur.host else None
        self.current = nxt
        return nxt


def arena_key(blocks: Sequence[torch.Tensor]) -> tuple:
    """What an arena must share with a pass's blocks: per block (width, dtype). (Not the
    device: one scheduler's forwards all run on its one device.)"""
    return tuple((b.shape[1], b.dtype) for b in blocks)


class RowBatch:
    """Rows of logged passes, one arena and one layout, waiting to be captured in one call.

    ``maps[r]`` is a wire row map (``record.ROW_KEYS``) whose token rows are arena rows
    ``[starts[r], + token_count)``; ``ids[r]`` its token ids ``(buffer, start, count)``;
    ``accepted``: every chunk added, as the hook's bookkeeping needs it after the capture."""

    __slots__ = ("arena", "shape", "hidden", "mode", "maps", "starts", "ids", "accepted",
                 "since", "_by_rid")

    def __init__(self) -> None:
        self.arena: LogArena | None = None
        self.shape: Any = None
        self.hidden = 0
        self.mode = ""              # the hook's benchmark mode of the first pass added
        self.maps: list[dict[str, Any]] = []
        self.starts: list[int] = []
        self.ids: list[tuple[Any, int, int]] = []
        self.accepted: list[Any] = []
        self.since: float | None = None
        self._by_rid: dict[str, int] = {}

    def __bool__(self) -> bool:
        return bool(self.maps)

    def holds(self, rid: str) -> bool:
        """Whether a row of ``rid`` is here."""
        return rid in self._by_rid

    def accepts(self, arena: LogArena, shape: Any, hidden: int,
                maps: Sequence[Mapping[str, Any]], starts: Sequence[int],
                ids: Sequence[tuple[Any, int, int]]) -> bool:
        """Whether these rows may join: always when the batch is empty; else the same arena,
        layout (``shape`` is the hook's cached tuple: compared by identity) and hidden size,
        and every row of a rid already here its next chunk, right after it in the arena,
        with ``array`` ids (merged by :meth:`add`)."""
        if not self.maps:
            return True
        if arena is not self.arena or shape is not self.shape or hidden != self.hidden:
            return False
        by_rid, have = self._by_rid, self.maps
        for m, s, part in zip(maps, starts, ids):
            i = by_rid.get(m["rid"])
            if i is not None:
                prev = have[i]
                if (not continues(prev, m) or self.starts[i] + prev["token_count"] != s
                        or type(part[0]) is not array or type(self.ids[i][0]) is not array):
                    return False
        return True

    def add(self, arena: LogArena, shape: Any, hidden: int, maps: Sequence[dict[str, Any]],
            starts: Sequence[int], ids: Sequence[tuple[Any, int, int]], accepted: Sequence[Any],
            since: float | None, mode: str = "") -> None:
        """Add one pass's rows (the caller checked :meth:`accepts`)."""
        if not self.maps:
            self.arena, self.shape, self.hidden, self.mode = arena, shape, hidden, mode
        if since is not None and (self.since is None or since < self.since):
            self.since = since
        by_rid = self._by_rid
        for m, s, part in zip(maps, starts, ids):
            rid = m["rid"]
            i = by_rid.get(rid)
            if i is None:
                by_rid[rid] = len(self.maps)
                self.maps.append(m)
                self.starts.append(s)
                self.ids.append(part)
            else:
                self.maps[i] = merged(self.maps[i], m)
                buf, at, n = self.ids[i]
                nbuf, nat, nn = part
                self.ids[i] = (buf[at:at + n] + nbuf[nat:nat + nn], 0, n + nn)
        self.accepted.extend(accepted)

    def take(self) -> "RowBatch":
        """The rows so far, as a batch of their own; this one is empty afterwards."""
        out = RowBatch()
        for name in self.__slots__:
            setattr(out, name, getattr(self, name))
        self.__init__()
        return out
