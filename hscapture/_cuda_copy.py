"""The native CUDA copy path of one capture: every copy of a forward pass in ONE native call.

Why: on an engine's scheduler thread each torch call of a copy (stream switch, event record,
tensor view, ``copy_``) costs 7-18 us of CPU, several per block and per span, once per forward
on the critical path. Here the copies are described as flat ``uint64`` lists and issued by
``hscapture._ring.cuda_submit`` with the CUDA driver (``csrc/cuda_copy.cpp``): copies (one
linear copy per span of dense rows, else 2D) straight from the sources' rows into the
page-locked ring, their memory kinds stated and the sources' context cached (no address
lookups per call); the only torch call is the one
kernel that takes device token ids as dense int32 on the caller's stream (none when the ids
come from the host, :class:`hscapture._copies.HostRowIds`: the CPU wrote them already).

Guarantees (the same as the torch path in :mod:`hscapture.producer`):

- The copies into the ring run on a side stream that waits (an event, never a host sync) for
  everything the caller's stream enqueued before the capture: they read what the forward
  pass produced. ``done`` completes when every byte is in the ring.
- Device token ids are always taken on the caller's stream (engines reuse their id tensors
  right after the forward): one torch kernel makes them dense int32 (:func:`take_ids`); with
  ``snapshot`` the sources are taken too (CUDA-graph output buffers are overwritten by the
  next replay): device-to-device copies into one staging allocation, in stream order before
  anything the caller enqueues next.
- No copy of narrow rows: the ids were once narrowed by 2D copies of 4-byte rows on the
  caller's stream, one driver call per span; one kernel instead cut the hook's time per
  forward at 64 / 256 requests from 1.54 / 3.22 ms to 0.95 / 2.05 ms (H200, 1B shape,
  ``bench_hook.py``; 1 request: 0.39 -> 0.41 ms). It did not change the prefill slowdown of
  ``bench_gpu.py overhead`` (5.2 -> 5.5 % at 1B x 4,096 tokens), whose cause is host time on
  the critical path (benchmarks/results/h200-2026-12-01d/README.md).
- Sources and staging stay referenced (``keepalive``) until ``done`` completed.

:func:`eligible` says when this path applies; otherwise the producer uses its torch path.
"""

from __future__ import annotations

import collections
import logging
import os
import time
from array import array
from typing import Any

import numpy as np
import torch

from .errors import CaptureConfigError

log = logging.getLogger("hscapture")

__all__ = ["DeviceRowCopier", "NativeCopier", "native_available", "plan_copies",
           "plan_staged_copies", "span_index", "staging_bytes", "take_ids"]

#: ``HSCAPTURE_COPY_PATH=torch`` forces the torch path (for comparison and as an escape hatch).
COPY_PATH_ENV = "HSCAPTURE_COPY_PATH"
_ALIGN = 256                     # staging regions start on 256-byte boundaries
#: up to this many spans the ids are one slice of the covering range (one kernel) and one
#: device-to-host copy per span; more, one gather by a device index (three small operations)
_ID_SPANS = 8

_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def native_available() -> str:
    """'' when the native path can run in this process, else why not (one line)."""
    if os.environ.get(COPY_PATH_ENV, "") == "torch":
        return f"{COPY_PATH_ENV}=torch"
    if _raw_stream is None:
        return "this torch has no CUDA build (torch._C._cuda_getCurrentRawStream)"
    from . import _ring

    return _ring.cuda_available()


def eligible(blocks: list[torch.Tensor], ids: Any) -> bool:
    """CUDA blocks whose rows are dense (column stride 1) and CUDA int64/int32 token ids, or
    token ids on the host."""
    for b in blocks:
        if not b.is_cuda or b.stride(1) != 1:
            return False
    if isinstance(ids, torch.Tensor) and ids.is_cuda:
        return ids.dim() == 1 and ids.dtype in (torch.int64, torch.int32) and \
            ids.device == blocks[0].device
    return True


class NativeCopier:
    """Per producer, per device: the side stream, the "forward done" event (whose CUDA context
    every submission uses: no per-call pointer lookup) and the pool of completed ``done``
    events. Used under the producer's capture lock (one capture at a time); the pool is
    shared with the publisher (``deque`` append/pop are atomic)."""

    def __init__(self) -> None:
        from . import _ring

        self._ring = _ring
        #: device index -> (side stream, its handle, ready event, its context, done pool)
        self._devices: dict[int, tuple[Any, int, Any, int, collections.deque]] = {}
        self.pools: dict[int, collections.deque] = {}
        #: queue each capture's device-to-host copies until :func:`flush_deferred` (csrc/
        #: hscapture/cuda_copy.h "Deferred device-to-host copies"; ``done`` reads as pending
        #: until then); the snapshots are issued at once either way
        self.defer = False
        #: device index -> the stream its last deferred-mode capture came from
        self._defer_streams: dict[int, int] = {}

    def _device(self, blocks: list[torch.Tensor]) -> tuple[Any, int, Any, int,
                                                           collections.deque]:
        idx = blocks[0].get_device()
        got = self._devices.get(idx)
        if got is None:
            s = torch.cuda.Stream(device=blocks[0].device)
            # the event is made in the context that owns the sources' allocation
            ready = self._ring.CudaEvent(blocks[0].data_ptr())
            pool = self.pools[idx] = collections.deque()
            got = self._devices[idx] = (s, int(s.cuda_stream), ready, ready.context, pool)
        return got

    def _ready_from(self, idx: int, caller: int) -> None:
        """Deferred copies wait for the device's ``ready`` event as last recorded when they
        are issued: that covers each one's capture point only while every capture of the
        device comes from one stream (SGLang's forward stream). A capture from another stream
        first issues what is queued."""
        if self.defer:
            last = self._defer_streams.get(idx)
            if last is not None and last != caller:
                flush_deferred()
            self._defer_streams[idx] = caller

    def submit(self, payload: int, block_offsets: list[int], ids_offset: int, tokens: int,
               spans: list[tuple[int, int]], blocks: list[torch.Tensor], ids: Any,
               snapshot: bool, timing: Any = None) -> tuple[Any, Any]:
        """Issue the copies of one entry whose payload starts at address ``payload``; return
        (done event, keepalive). Host token ids are written into the ring here, by the CPU.
        Raises :class:`CaptureConfigError` (nothing more in flight) if the driver refuses.
        ``timing`` (a Counter, or None): the native call's time goes to its
        ``time_submit_ns``."""
        _, side_h, ready, context, pool = self._device(blocks)
        caller = _raw_stream(blocks[0].get_device())
        try:
            done = pool.pop()              # an event the publisher saw complete
        except IndexError:
            done = self._ring.CudaEvent(blocks[0].data_ptr())
        srcs = []
        for b in blocks:
            size = b.element_size()
            srcs.append((b.data_ptr(), b.stride(0) * size, b.shape[1] * size))
        id_src = None
        if isinstance(ids, torch.Tensor) and ids.is_cuda:
            ids, address, id_spans = take_ids(ids, spans, tokens)   # kept alive: keepalive
            id_src = (address, id_spans)
        stage = None
        if snapshot:
            stage = torch.empty(staging_bytes(tokens, [w for _, _, w in srcs], True),
                                dtype=torch.uint8, device=blocks[0].device)
        pre, post = plan_copies(payload, block_offsets, ids_offset, tokens, spans, srcs, id_src,
                                snapshot, stage.data_ptr() if stage is not None else 0)
        self._ready_from(blocks[0].get_device(), caller)
        t = time.perf_counter_ns() if timing is not None else 0
        err = self._ring.cuda_submit(caller, side_h, ready.handle, done.handle, context,
                                     pre, post, self.defer)
        if timing is not None:
            timing["time_submit_ns"] += time.perf_counter_ns() - t
        if err:
            # Copies issued before the failing call may still run: wait for them before the
            # caller gives the ring position back (it would otherwise be written later).
            torch.cuda.synchronize(blocks[0].device)
            raise CaptureConfigError(f"native CUDA copy: {err}")
        return done, (blocks, stage, ids, pool)


    def stage(self, blocks: list[torch.Tensor], starts: list[int], maps: list[Any],
              snapshot: bool) -> tuple[tuple[Any, ...], list[tuple[int, int, int]], Any, int,
                                       list[int]] | None:
        """The sources of a staged group (:mod:`hscapture._staging`) whose rows ``maps[r]``
        take source rows ``[starts[r], + token_count)``: ``(where, sources, keepalive,
        nbytes, starts)`` with ``where = ("cuda", device index, caller stream)`` and per
        block ``(address, row pitch, row width)``; or None when a block's rows are not dense
        (the caller captures at once).

        Without ``snapshot`` the sources are the blocks' own (kept alive by ``keepalive``,
        ``nbytes`` their size) and ``starts`` unchanged. With it the source rows ``[lo, hi)``
        covering every row (the first row's first to the last one's end, rows between them
        included) are copied now, one device-to-device copy per block into one staging
        allocation, on the caller's stream (one native call with no device-to-host part:
        ``side`` is the caller's stream itself); the sources are that allocation's regions
        and ``starts`` are shifted by ``-lo``. One copy per block whatever the number of
        rows: in a real server each copy is a ~5.9 us driver call on the scheduler's thread
        (benchmarks/results/h200-2026-12-03b), and the bytes of the rows between (prompts
        that did not opt in) cost the device microseconds."""
        srcs = []
        for b in blocks:
            if not b.is_cuda:
                return None
            st = b.stride()
            if st[1] != 1:
                return None
            size = b.element_size()
            srcs.append((b.data_ptr(), st[0] * size, b.shape[1] * size))
        idx = blocks[0].get_device()
        _, _, ready, context, _ = self._device(blocks)
        caller = _raw_stream(idx)
        if not snapshot:
            return (("cuda", idx, caller), srcs, blocks,
                    int(blocks[0].shape[0]) * sum(w for _, _, w in srcs), starts)
        lo = min(starts)
        hi = max(s + m["token_count"] for s, m in zip(starts, maps))
        rows = hi - lo
        nbytes = sum(_up(rows * w) for _, _, w in srcs)
        stage = torch.empty(nbytes, dtype=torch.uint8, device=blocks[0].device)
        pre = array("Q")
        at = stage.data_ptr()
        dense = []
        for ptr, pitch, width in srcs:
            pre.extend((at, width, ptr + lo * pitch, pitch, width, rows))
            dense.append((at, width, width))
            at += _up(rows * width)
        self._ready_from(idx, caller)     # (it records the device's ready event)
        err = self._ring.cuda_submit(caller, caller, ready.handle, ready.handle, context, pre,
                                     None)
        if err:
            torch.cuda.synchronize(blocks[0].device)
            raise CaptureConfigError(f"native CUDA copy (staging snapshot): {err}")
        return (("cuda", idx, caller), dense, stage, nbytes,
                [s - lo for s in starts] if lo else starts)

    def submit_staged(self, payload: int, block_offsets: list[int],
                      spans: list[tuple[int, int, int]], sources: list[list[tuple[int, int, int]]],
                      where: tuple[Any, ...], keepalive: Any, timing: Any = None
                      ) -> tuple[Any, Any]:
        """Issue the device-to-host copies of a staged entry whose payload starts at
        ``payload``: its token rows in order as ``(group, first row, end)`` spans of the
        groups' ``sources`` (:func:`plan_staged_copies`; the token ids were written by the
        CPU); return (done event, keepalive). The side stream waits for an event recorded NOW
        on the stream the sources were produced on (``where``'s): it follows every staged
        forward and snapshot. Any thread may call it (the write of an idle stage runs on the
        publisher thread)."""
        _, idx, caller = where
        _, side_h, ready, context, pool = self._devices[idx]
        try:
            done = pool.pop()
        except IndexError:
            done = self._ring.CudaEvent(sources[0][0][0])
        post = plan_staged_copies(payload, block_offsets, spans, sources)
        self._ready_from(idx, caller)
        t = time.perf_counter_ns() if timing is not None else 0
        err = self._ring.cuda_submit(caller, side_h, ready.handle, done.handle, context, None,
                                     post, self.defer)
        if timing is not None:
            timing["time_submit_ns"] += time.perf_counter_ns() - t
        if err:
            torch.cuda.synchronize(idx)
            raise CaptureConfigError(f"native CUDA copy: {err}")
        return done, (keepalive, pool)


def flush_deferred(after_event: int = 0, max_bytes: int = 0) -> int:
    """Issue the device-to-host copies of the deferred captures of this process, in order
    (:attr:`NativeCopier.defer`); how many captures were issued whole. ``after_event``: a
    CUDA event handle (``torch.cuda.Event.cuda_event``; 0: none) the copies also wait for: the
    engine's own read-back's completion, so they never start level with it. ``max_bytes``
    (0: no bound): stop once that many bytes of copies were issued, between two rows of a copy
    if need be; the next call goes on from there (a capture queued for half the max age,
    0.1 s by default, is issued whole regardless). Raises :class:`CaptureConfigError` when the
    driver refused one (each failed capture's ``done`` reports it to its entry)."""
    from . import _ring

    try:
        return _ring.cuda_flush(after_event, max(0, int(max_bytes)))
    except RuntimeError as exc:
        raise CaptureConfigError(f"native CUDA copy (deferred): {exc}") from None


class DeviceRowCopier:
    """Device-to-device copies of row ranges, every block of one call in ONE native call
    (``cuda_submit`` with ``pre`` copies only: no side stream, no event): for the SGLang pass
    log's arena (:mod:`hscapture.sglang.log_batch`), where ``dst[a:b].copy_(src[c:d])`` costs
    the scheduler's thread two tensor views and a torch dispatch per block besides the
    driver's call (benchmarks/results/h200-2026-12-03b/call-costs-h200.txt: a view 1.6 us, a
    ``copy_`` 8.3 us, one native call of two copies 10.9 us).

    Guarantee: the copies are enqueued on torch's current stream of the sources' device,
    after everything enqueued there before the call and before anything enqueued after it,
    as the ``copy_`` they replace would be. A refusal by the driver raises
    :class:`CaptureConfigError` (copies issued before the failing one may still run: the
    destination rows must be treated as written)."""

    def __init__(self) -> None:
        from . import _ring

        self._submit = _ring.cuda_submit
        self._event = _ring.CudaEvent
        #: device index -> (an event kept alive, the CUcontext of that device's allocations)
        self._contexts: dict[int, tuple[Any, int]] = {}

    def copy(self, device: int, copies: array) -> None:
        """Issue ``copies`` (a flat ``array('Q')`` of (dst, dst_pitch, src, src_pitch, width,
        height) sextuples, device addresses on ``device``) on its current stream."""
        got = self._contexts.get(device)
        if got is None:
            ev = self._event(copies[2])      # the context owning the first source's allocation
            got = self._contexts[device] = (ev, ev.context)
        caller = _raw_stream(device)
        err = self._submit(caller, caller, 0, 0, got[1], copies, None)
        if err:
            raise CaptureConfigError(f"native CUDA copy (pass log): {err}")


def take_ids(ids: torch.Tensor, spans: list[tuple[int, int]], tokens: int
             ) -> tuple[torch.Tensor, int, list[tuple[int, int]]]:
    """The token ids of ``spans`` (rows of the 1-D CUDA int64/int32 ``ids``) taken now, on
    torch's current stream (the caller's), as a fresh dense int32 tensor: ``(tensor,
    address, id_spans)``, where the id of source row ``s`` of a span in ``id_spans`` is at
    ``address + 4 * s``. Up to ``_ID_SPANS`` spans: one kernel over the covering slice
    (``id_spans`` = ``spans``); more: one gather by a device index made from pinned memory
    (stream-ordered, no synchronization; ``id_spans`` = ``[(0, tokens)]``). Ids are < 2**31
    (the entry stores int32)."""
    if len(spans) <= _ID_SPANS:
        lo = min(s for s, _ in spans)
        hi = max(e for _, e in spans)
        # (the whole tensor, as when every request row of a forward is captured: no slice,
        # one torch dispatch less on the engine's thread)
        src = ids if lo == 0 and hi == ids.shape[0] else ids[lo:hi]
        t = src.to(torch.int32, memory_format=torch.contiguous_format, copy=True)
        return t, t.data_ptr() - 4 * lo, spans
    index = span_index(spans, tokens, pin=ids.is_cuda).to(ids.device, non_blocking=True)
    t = ids.index_select(0, index).to(torch.int32)
    return t, t.data_ptr(), [(0, tokens)]


def span_index(spans: list[tuple[int, int]], tokens: int, pin: bool = True) -> torch.Tensor:
    """The source row of every captured token row, as an int64 host tensor (page-locked with
    ``pin``, so that a non-blocking copy to the device is stream-ordered)."""
    starts = np.fromiter((s for s, _ in spans), dtype=np.int64, count=len(spans))
    lens = np.fromiter((e - s for s, e in spans), dtype=np.int64, count=len(spans))
    shift = starts - (np.cumsum(lens) - lens)          # source row - destination row, per span
    idx = np.arange(tokens, dtype=np.int64) + np.repeat(shift, lens)
    t = torch.from_numpy(idx)
    return t.pin_memory() if pin else t


def staging_bytes(tokens: int, widths: list[int], snapshot: bool) -> int:
    """Device staging one capture needs: with ``snapshot`` every block's rows, each region
    256-aligned; else 0."""
    return sum(_up(tokens * w) for w in widths) if snapshot else 0


def plan_copies(payload: int, block_offsets: list[int], ids_offset: int, tokens: int,
                spans: list[tuple[int, int]], blocks: list[tuple[int, int, int]],
                ids: tuple[int, list[tuple[int, int]]] | None, snapshot: bool, stage: int
                ) -> tuple[array, array]:
    """The copies of one entry, as ``cuda_submit`` takes them: ``(pre, post)``, each a flat
    ``array('Q')`` of (dst, dst_pitch, src, src_pitch, width, height) sextuples; ``pre`` runs
    on the caller's stream, then ``post`` on the side stream (csrc/hscapture/cuda_copy.h).

    ``blocks[b] = (address, row pitch, row width)`` in bytes; the rows of ``spans`` (source
    row ranges, in row order) go, concatenated and dense, to ``payload + block_offsets[b]``.
    ``ids = (address, id_spans)``: dense int32 token ids already taken on the caller's stream
    (:func:`take_ids`), the id of row ``s`` of a span in ``id_spans`` at ``address + 4 * s``;
    they go, concatenated, to ``payload + ids_offset`` (one row per span: no narrow rows), or
    None (the caller writes host ids itself). ``stage`` is a device allocation of
    :func:`staging_bytes` (0 when that is 0): with ``snapshot`` the rows are first copied into
    it on the caller's stream and from there to the ring."""
    pre = array("Q")
    post = array("Q")
    at = stage
    for (base, pitch, width), off in zip(blocks, block_offsets):
        dst = payload + off
        if snapshot:
            r = at
            for s, e in spans:           # the rows into staging, on the caller's stream
                pre.extend((r, width, base + s * pitch, pitch, width, e - s))
                r += (e - s) * width
            post.extend((dst, width, at, width, width, tokens))
            at += _up(tokens * width)
        else:
            for s, e in spans:           # straight from the sources, on the side stream
                post.extend((dst, width, base + s * pitch, pitch, width, e - s))
                dst += (e - s) * width
    if ids is not None:
        base, id_spans = ids
        dst = payload + ids_offset
        for s, e in id_spans:            # one contiguous row of 4 * (e - s) bytes per span
            n = 4 * (e - s)
            post.extend((dst, n, base + 4 * s, n, n, 1))
            dst += n
    return pre, post


def plan_staged_copies(payload: int, block_offsets: list[int],
                       spans: list[tuple[int, int, int]],
                       sources: list[list[tuple[int, int, int]]]) -> array:
    """The device-to-host copies of a staged entry (``post`` of :func:`plan_copies`' format):
    ``sources[g][b] = (address, row pitch, row width)`` of group ``g``'s block ``b``; the
    entry's token rows are the ``(g, s, e)`` ``spans`` in order (rows ``[s, e)`` of group
    ``g``), which go back to back, block by block, to ``payload + block_offsets[b]``."""
    post = array("Q")
    for b, off in enumerate(block_offsets):
        dst = payload + off
        for g, s, e in spans:
            base, pitch, width = sources[g][b]
            post.extend((dst, width, base + s * pitch, pitch, width, e - s))
            dst += (e - s) * width
    return post


def _up(n: int) -> int:
    return -(-int(n) // _ALIGN) * _ALIGN
