"""How one ring entry's rows get from the engine's tensors into the ring: the copy paths.

:class:`EntryCopier` starts, for one entry, the copies of every block's captured token rows
and of their token ids into the entry's payload, by one of three paths:

- host tensors: copied now, by the CPU (nothing in flight when it returns);
- CUDA, page-locked ring, CUDA driver at hand: ONE native call
  (:mod:`hscapture._cuda_copy`);
- CUDA otherwise (an unpinned ring, column-strided sources, ``HSCAPTURE_COPY_PATH=torch``):
  torch copies on a side stream.

Guarantees, every path: the copies read what the forward pass produced (the side stream
waits for the caller's stream, an event, never a host sync); token ids are taken on the
caller's stream (engines reuse their id tensors right after the forward), and with
``snapshot`` the sources too (CUDA-graph outputs); the ``done`` event returned completes when
every byte is in the ring, and the ``keepalive`` returned holds every source and staging
buffer until then. The producer commits the entry only after ``done`` completed.
"""

from __future__ import annotations

import collections
import logging
import time
from array import array
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from . import _cuda_copy
from ._staging import StagedGroup, StagedRow, entry_spans

log = logging.getLogger("hscapture")

__all__ = ["EntryCopier", "HostRowIds", "recycle_event"]

_EVENT_POOL = 64        # completed copy events kept for reuse, per device


class HostRowIds:
    """The token ids of a capture's rows given per row, in row order, as ``(buffer, start,
    count)``: ``count`` ids from ``buffer[start:]``, a host buffer of int64 or int32 items
    (``array('q')``, a numpy array). They are written into the entry by the CPU in one native
    call (``_ring.write_ids``: bounds and the int32 range checked first) before any copy is
    issued: no device op on the engine's thread, where taking device ids is a torch kernel.
    The buffers are read during the capture call only."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[tuple[Any, int, int]]) -> None:
        self.parts = parts


class EntryCopier:
    """Per producer: the copy path in use, the side streams, the reused "forward done"
    events and the pools of completed ``done`` events, per device. Used under the producer's
    capture lock (one entry at a time); the pools are shared with the publisher thread
    (``deque`` append/pop are atomic). ``counters`` gets ``native_copies`` /
    ``torch_copies``, and ``host_id_captures`` for entries whose ids were
    :class:`HostRowIds`."""

    def __init__(self, pinned: bool, counters: collections.Counter) -> None:
        from . import _ring

        self._counters = counters
        # the host ids' writer, looked up once (the SGLang hook's default path, every forward)
        self._write_ids = _ring.write_ids
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._ready: dict[torch.device, Any] = {}       # one reused "forward done" event
        self._events: dict[torch.device, collections.deque] = {}   # completed copy events
        #: the native CUDA copier, or None (the torch path; why is logged once)
        self.native: _cuda_copy.NativeCopier | None = None
        if pinned:
            why = _cuda_copy.native_available()
            if why:
                log.info("hscapture: CUDA copies go through torch (native path: %s)", why)
            else:
                self.native = _cuda_copy.NativeCopier()

    def _side_stream(self, device: torch.device) -> "torch.cuda.Stream":
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device=device)
        return stream

    def copy_into(self, buf: memoryview, payload_address: int, plan: Any, starts: list[int],
                  maps: list[dict[str, Any]], blocks: list[torch.Tensor], token_ids: Any,
                  snapshot: bool, timed: bool = False) -> tuple[Any, Any]:
        """Start copying the rows' token rows of every block, and their token ids, into the
        entry; return (done event or None, keepalive).

        CUDA, per forward: the token ids are taken (and made int32) with one kernel on the
        caller's stream; the caller's stream is marked with one reused event that the side
        stream waits on; per block one gather (none when the rows are one contiguous span:
        a view) and one device-to-host copy on the side stream; one pooled ``done`` event.
        Many scattered spans use one ``index_select`` per tensor with an index copied from
        pinned memory (stream-ordered, no synchronization). Nothing waits for the device.

        With the ring page-locked and the CUDA driver at hand, all of that is instead one
        native call (:mod:`hscapture._cuda_copy`: one copy per block and span, no kernel).
        ``timed`` adds the host ids' write to ``counters["time_ids_ns"]`` and the native
        call's to ``counters["time_submit_ns"]``.
        """
        tokens = plan.tokens
        spans = _spans(starts, maps)
        ids: Any
        if isinstance(token_ids, HostRowIds):
            t = time.perf_counter_ns() if timed else 0
            self._write_ids(buf, plan.ids_offset, token_ids.parts)   # written: ids = None
            if timed:
                self._counters["time_ids_ns"] += time.perf_counter_ns() - t
            self._counters["host_id_captures"] += 1
            ids = None
        elif isinstance(token_ids, torch.Tensor):
            ids = token_ids
        else:
            ids = torch.from_numpy(np.ascontiguousarray(np.asarray(token_ids).reshape(-1)))
        if not blocks[0].is_cuda:
            for dst, src in zip(_block_views(buf, plan, blocks), blocks):
                _gather_into(dst, src, spans)
            if ids is not None:
                _gather_into(_ids_view(buf, plan), ids.reshape(-1).to("cpu").to(torch.int32),
                             spans)
            return None, None
        if self.native is not None and _cuda_copy.eligible(blocks, ids):
            # the native call writes through addresses: no tensor views of the entry needed
            if ids is not None and not ids.is_cuda:
                _gather_into(_ids_view(buf, plan), ids.reshape(-1).to(torch.int32), spans)
            got = self.native.submit(payload_address, plan.block_offsets, plan.ids_offset,
                                     tokens, spans, blocks, ids, snapshot,
                                     self._counters if timed else None)
            self._counters["native_copies"] += 1
            return got
        self._counters["torch_copies"] += 1
        device = blocks[0].device
        caller = torch.cuda.current_stream(device)
        index = None
        if len(spans) > _CAT_SPANS:
            # pinned host -> device on the caller's stream; the host block is held by torch's
            # caching host allocator until that copy completed
            index = _cuda_copy.span_index(spans, tokens).to(device, non_blocking=True)
        if snapshot:
            # The sources may be overwritten after we return (graph buffers): copy the rows on
            # the caller's stream, ordered before whatever the caller enqueues next.
            blocks = [_gather(b, spans, copy=True, index=index) for b in blocks]
        if ids is not None and ids.is_cuda:
            # Token ids are tiny and engines reuse or mutate their id tensors right after the
            # forward (SGLang's speculative path does): always take them on the caller's
            # stream, in one kernel when they are one span (slice + int32 copy).
            flat = ids.reshape(-1)
            if len(spans) == 1:
                ids = flat[spans[0][0]:spans[0][1]].to(torch.int32, copy=True)
            else:
                ids = _gather(flat, spans, index=index).to(torch.int32)
        if snapshot:
            spans = [(0, tokens)]
        ready = self._ready.get(device)
        if ready is None:
            ready = self._ready[device] = torch.cuda.Event()
        # One event per device, re-recorded every forward: a wait enqueued earlier keeps the
        # record it saw (CUDA semantics), and captures are serialized by the lock.
        ready.record(caller)
        side = self._side_stream(device)
        side.wait_event(ready)      # the copy starts after the forward pass produced the data
        pool = self._events.get(device)
        if pool is None:
            pool = self._events[device] = collections.deque()
        try:
            done = pool.pop()        # an event the publisher saw complete (append is atomic)
        except IndexError:
            done = torch.cuda.Event()
        with torch.cuda.stream(side):
            srcs = [_gather(b, spans, index=index) for b in blocks]
            for dst, src in zip(_block_views(buf, plan, blocks), srcs):
                dst.copy_(src, non_blocking=True)
            if ids is None:
                pass                                   # host row ids: written already
            elif ids.is_cuda:
                _ids_view(buf, plan).copy_(ids, non_blocking=True)
            else:
                _gather_into(_ids_view(buf, plan), ids.reshape(-1).to(torch.int32), spans)
            done.record(side)
        # Sources and staging buffers stay referenced until ``done`` completed.
        return done, (blocks, srcs, ids, index, pool)


    # -- staged captures (hscapture._staging): the rows kept now, copied when written --------

    def stage(self, maps: list[dict[str, Any]], starts: list[int], blocks: list[torch.Tensor],
              token_ids: HostRowIds, snapshot: bool, block_cols: list[int] | None = None
              ) -> tuple[StagedGroup, list[int], list[tuple[Any, int, int]]] | None:
        """The sources of one capture kept for a later entry (:mod:`hscapture._staging`) as
        ``(group, starts, ids)``: the rows' first source rows in the group's sources and
        their token ids (copied out of the engine's buffers now); or None when this path
        cannot stage them (device token ids, or CUDA sources the native path does not take:
        the caller captures them at once).

        With ``snapshot`` the rows are copied now: on the host by the CPU (the rows, back to
        back); on a GPU device-to-device on the caller's stream, one copy per block of the
        source rows that cover every row (first row to last, unwanted rows between them
        included: one driver call per block however many rows, in stream order before
        anything the caller enqueues next). Without it the sources are referenced until the
        entry's copy completed (the engine's allocator cannot hand their memory out again
        while they are). ``block_cols``: the blocks' widths, where the caller has them
        (read from the blocks otherwise)."""
        if not isinstance(token_ids, HostRowIds):
            return None
        first = blocks[0]
        cuda = first.is_cuda
        if cuda and self.native is None:
            return None
        # (an array('q') slice, the SGLang hook's ids, is a copy: taken here without a call)
        ids = [(buf[s:s + n] if type(buf) is array else _copy_ids(buf, s, n), 0, n)
               for buf, s, n in token_ids.parts]
        if cuda:
            got = self.native.stage(blocks, starts, maps, snapshot)
            if got is None:
                return None
            where, sources, keepalive, nbytes, starts = got
            return StagedGroup(where, sources, nbytes, keepalive), starts, ids
        if block_cols is None:
            block_cols = [int(b.shape[1]) for b in blocks]
        width = sum(block_cols) * first.element_size()
        if not snapshot:
            return StagedGroup(("host",), list(blocks), int(first.shape[0]) * width,
                               blocks), starts, ids
        spans = _spans(starts, maps)
        sources: list[Any] = [_gather(b, spans, copy=True) for b in blocks]
        return (StagedGroup(("host",), sources, sum(e - s for s, e in spans) * width, sources),
                _dense_starts(maps), ids)

    def copy_staged_into(self, buf: memoryview, payload_address: int, plan: Any,
                         groups: list[StagedGroup], rows: list[StagedRow],
                         timed: bool = False) -> tuple[Any, Any]:
        """Start copying staged rows (one layout, one ``where``) into one entry, in row
        order; return (done event or None, keepalive), as :meth:`copy_into`."""
        t = time.perf_counter_ns() if timed else 0
        self._write_ids(buf, plan.ids_offset, [p for r in rows for p in r.ids])
        if timed:
            self._counters["time_ids_ns"] += time.perf_counter_ns() - t
        self._counters["host_id_captures"] += 1
        spans = entry_spans(rows)
        if groups[0].where[0] == "host":
            views = _block_views(buf, plan, groups[0].sources)
            for b, dst in enumerate(views):
                at = 0
                for g, s, e in spans:
                    dst[at:at + e - s].copy_(groups[g].sources[b][s:e])
                    at += e - s
            return None, None
        self._counters["native_copies"] += 1
        return self.native.submit_staged(
            payload_address, plan.block_offsets, spans, [g.sources for g in groups],
            groups[0].where, [g.keepalive for g in groups], self._counters if timed else None)


def _copy_ids(buf: Any, start: int, count: int) -> Any:
    """``count`` ids from ``buf[start:]``, copied (an ``array`` slice is a copy, a numpy one
    a view)."""
    part = buf[start:start + count]
    return part.copy() if isinstance(part, np.ndarray) else part


def _dense_starts(maps: Sequence[Mapping[str, Any]]) -> list[int]:
    """The rows' first token rows once their rows were copied out back to back."""
    out, at = [], 0
    for m in maps:
        out.append(at)
        at += m["token_count"]
    return out


def _block_views(buf: memoryview, plan: Any, blocks: list[torch.Tensor]) -> list[torch.Tensor]:
    """The entry's block regions as ``[tokens, cols]`` tensors over ``buf``."""
    t = plan.tokens
    return [torch.frombuffer(buf, dtype=b.dtype, count=t * int(b.shape[1]),
                             offset=off).view(t, int(b.shape[1]))
            for b, off in zip(blocks, plan.block_offsets)]


def _ids_view(buf: memoryview, plan: Any) -> torch.Tensor:
    """The entry's int32 token-id region as a tensor over ``buf``."""
    return torch.frombuffer(buf, dtype=torch.int32, count=plan.tokens, offset=plan.ids_offset)


def recycle_event(done: Any, keepalive: Any) -> None:
    """Give a COMPLETED ``done`` event back to the pool it came from (``keepalive`` is what
    :meth:`EntryCopier.copy_into` returned with it), so a later capture records it again."""
    pool = keepalive[-1]
    if isinstance(pool, collections.deque) and len(pool) < _EVENT_POOL:
        pool.append(done)


def _spans(starts: Sequence[int], maps: Sequence[Mapping[str, Any]]) -> list[tuple[int, int]]:
    """The rows' source token ranges, adjacent ones merged, in row order."""
    spans: list[tuple[int, int]] = []
    s0 = e0 = -1
    for s, m in zip(starts, maps):
        if s == e0:
            e0 = s + m["token_count"]
            continue
        if e0 >= 0:
            spans.append((s0, e0))
        s0, e0 = s, s + m["token_count"]
    spans.append((s0, e0))
    return spans


#: More spans than this are gathered with one ``index_select`` per tensor (the index goes to
#: the device from pinned memory, stream-ordered: no synchronization) instead of a slice per
#: span and a ``torch.cat``.
_CAT_SPANS = 2


def _gather(src: torch.Tensor, spans: list[tuple[int, int]], copy: bool = False,
            index: torch.Tensor | None = None) -> torch.Tensor:
    """The rows of ``spans``, contiguous; a fresh tensor if ``copy`` (else maybe a view).
    ``index`` (the rows as a device index, :func:`._cuda_copy.span_index`) replaces the
    per-span cat."""
    if len(spans) == 1:
        s, e = spans[0]
        view = src[s:e]
        if copy:
            return view.clone(memory_format=torch.contiguous_format)
        return view if view.is_contiguous() else view.contiguous()
    if index is not None:
        return src.index_select(0, index)
    return torch.cat([src[s:e] for s, e in spans])


def _gather_into(dst: torch.Tensor, src: torch.Tensor, spans: list[tuple[int, int]]) -> None:
    at = 0
    for s, e in spans:
        dst[at:at + e - s].copy_(src[s:e])
        at += e - s
