"""``hscapture.Subscriber``: the public API that pulls exactly the captured samples.

A subscriber is a ZeroMQ SUB socket plus one ring consumer per producer incarnation. The ring
is the source of truth (a registered consumer gets every record committed after it attached);
notices are cross-checked against the ring records and carry what the ring cannot (drops,
aborts, heartbeats). A notice lost on the wire is recovered from the copy of it embedded in
the ring record; a lost drop/abort notice is recovered from heartbeats or reported.
"""

from __future__ import annotations

import collections
import heapq
import logging
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
import zmq

from . import notice as nt
from .endpoint import check_endpoint
from .errors import (
    HSCaptureError,
    IncompleteSampleError,
    NoticeError,
    RingError,
    SampleDroppedError,
    SampleMismatchError,
    SampleTimeoutError,
    StaleEpochError,
)
from .sample import Sample, layer_name

log = logging.getLogger("hscapture")

__all__ = ["Subscriber"]

# Ring payloads are read-only views; torch warns on wrapping them. We never write to them.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
warnings.filterwarnings("ignore", message="The given buffer is not writable")

_TORCH_DTYPES = {name: getattr(torch, name) for name in nt.DTYPES}
_COMPARED = ("v", "kind", "producer", "epoch", "seq", "rid", "token_start", "token_count",
             "last", "cached_prefix", "layers", "layer_kinds", "convention", "model", "hidden",
             "dtype",
             "token_ids", "tensor_offsets", "dp_rank", "extra")
_MAX_ERRORS = 200


@dataclass
class _Chunk:
    start: int
    count: int
    tensors: list[torch.Tensor]
    token_ids: np.ndarray
    position: int
    meta: dict[str, Any]


@dataclass
class _Assembly:
    key: tuple[str, int, str]
    chunks: list[_Chunk] = field(default_factory=list)
    failed: str | None = None           # reason; later chunks are discarded
    failure_kind: str = ""              # "dropped" | "incomplete" | "rejected"
    total: int | None = None            # N, known once the last chunk arrived
    updated: float = field(default_factory=time.monotonic)


class _Held:
    """Ring positions of records still referenced (by samples or partial assemblies).

    The oldest one bounds what may be released; a heap with lazy deletion keeps that O(log n).
    """

    def __init__(self) -> None:
        self._live: set[int] = set()
        self._heap: list[int] = []

    def add(self, position: int) -> None:
        self._live.add(position)
        heapq.heappush(self._heap, position)

    def discard(self, position: int) -> None:
        self._live.discard(position)

    def oldest(self) -> int | None:
        heap = self._heap
        while heap and heap[0] not in self._live:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def __len__(self) -> int:
        return len(self._live)


class _Source:
    """One producer incarnation (producer id + epoch) and our ring consumer on its segment."""

    def __init__(self, producer: str, epoch: int) -> None:
        self.producer, self.epoch = producer, epoch
        self.segment = ""
        self.consumer: Any = None
        self.start = 0                      # ring position we attached at
        self.notices: dict[int, dict[str, Any]] = {}      # record notices by seq
        self.control: list[dict[str, Any]] = []           # drop/abort notices, seq order
        self.max_notice_seq = -1
        self.hb_next_seq = 0                # highest next_seq announced by heartbeat/bye
        self.base_seq: int | None = None
        self.resolved: set[int] = set()
        self.low = 0                        # every seq below is resolved or declared lost
        self.missing_since: dict[int, float] = {}
        self.held: Any = None               # ring record waiting for its notice
        self.held_since = 0.0
        self.outstanding = _Held()                        # positions of held records
        self.last_seen = time.monotonic()
        self.producer_stats: dict[str, Any] = {}
        self.ended = False


class Subscriber:
    """Receive complete, verified samples from one or more hscapture producers.

    Guarantees:
    - A sample is yielded only when token positions ``0..N-1`` are all present exactly once
      and every chunk's notice, ring record header and embedded meta agree on rid, epoch,
      sequence number, byte length and token count. Anything else is reported (``stats()``)
      and never yielded: dropped rids, incomplete rids (with the reason), rejected rids.
    - Records of an old producer incarnation are never mixed with a new one: a new epoch
      retires the old one (its partial samples are reported incomplete) and late notices of
      retired epochs are rejected as stale.
    - Tensors are zero-copy views into the ring when a sample came in one chunk (valid until
      ``sample.release()``), or owned copies (multi-chunk samples, or ``copy=True``). Ring
      space is given back only when the sample is released.
    - Malformed input never raises out of the iteration: it is counted and reported.
    - With ``resume_name``, a subscriber restarted under the same name takes over the place of
      its dead predecessor in each ring (if the producer still keeps it, see
      ``Producer(dead_consumer_grace_s=...)``): every record that was not released is
      delivered again, so nothing acknowledged-but-unwritten is lost.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        copy: bool = False,
        auto_release: bool = True,
        notice_grace_s: float = 1.0,
        incomplete_timeout_s: float = 120.0,
        producer_timeout_s: float = 10.0,
        rid_filter: Callable[[str], bool] | None = None,
        resume_name: str = "",
    ) -> None:
        self.endpoints = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        for ep in self.endpoints:
            check_endpoint(ep)
        self.copy = copy
        self.auto_release = auto_release
        self.notice_grace_s = notice_grace_s
        self.incomplete_timeout_s = incomplete_timeout_s
        self.producer_timeout_s = producer_timeout_s
        self.rid_filter = rid_filter
        self.resume_name = resume_name
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.RCVHWM, 0)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        for ep in self.endpoints:
            self._sock.connect(ep)
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._sources: dict[str, _Source] = {}
        self._retired: set[tuple[str, int]] = set()
        # every incarnation still attached, current or retired (retired ones stay until the
        # samples holding views into their ring are released)
        self._incarnations: dict[tuple[str, int], _Source] = {}
        self._assembling: dict[tuple[str, int, str], _Assembly] = {}
        self._ready: collections.deque[Sample] = collections.deque()
        self._expected: dict[str, int] = {}
        self._last_yielded: Sample | None = None
        self.dropped: dict[str, str] = {}
        self.incomplete: dict[str, str] = {}
        self.rejected: dict[str, str] = {}
        self.errors: collections.deque[str] = collections.deque(maxlen=_MAX_ERRORS)
        self._counts = collections.Counter()
        self._last_housekeeping = 0.0
        # notices taken off the socket per pump: small batches keep few objects alive at
        # once (the garbage collector's cost grows with them) and samples flowing
        self._batch = 256
        self._closed = False

    # -- public API --------------------------------------------------------------------

    def wait_ready(self, timeout: float = 10.0, producers: int = 1) -> None:
        """Block until at least ``producers`` producer incarnations are attached."""
        deadline = time.monotonic() + timeout
        while sum(1 for s in self._sources.values() if s.consumer is not None) < producers:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SampleTimeoutError(
                    f"no hscapture producer announced itself on {self.endpoints} within "
                    f"{timeout:g}s (expected {producers}, attached "
                    f"{sum(1 for s in self._sources.values() if s.consumer is not None)})")
            self._pump(min(remaining, 0.05))

    def expect(self, rid: str, num_tokens: int) -> None:
        """Declare that ``rid`` must come with exactly ``num_tokens`` tokens, or be rejected."""
        self._expected[rid] = int(num_tokens)

    def poll(self, timeout: float = 0.0) -> Sample | None:
        """The next complete sample, waiting up to ``timeout`` seconds; None if none."""
        deadline = time.monotonic() + timeout
        while not self._ready:
            remaining = deadline - time.monotonic()
            self._pump(max(0.0, min(remaining, 0.05)))
            if not self._ready and remaining <= 0:
                return None
        return self._ready.popleft()

    def get(self, rid: str, timeout: float | None = None) -> Sample:
        """The sample of ``rid``; raises if it was dropped, incomplete, rejected or timed out.

        Samples of other rids that complete meanwhile stay queued for iteration.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            for i, sample in enumerate(self._ready):
                if sample.rid == rid:
                    del self._ready[i]
                    return sample
            self._raise_if_failed(rid)
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise SampleTimeoutError(
                    f"sample {rid!r} did not complete within {timeout:g}s "
                    f"(chunks so far: {self._progress(rid)})")
            self._pump(0.05 if remaining is None else max(0.0, min(remaining, 0.05)))

    def __iter__(self) -> Iterator[Sample]:
        """Yield complete samples forever; in auto-release mode the previous one is released."""
        while not self._closed:
            sample = self.poll(timeout=0.1)
            if sample is None:
                continue
            self._auto_release()
            self._last_yielded = sample
            yield sample

    def samples(self, limit: int | None = None, timeout: float | None = None) -> Iterator[Sample]:
        """Yield up to ``limit`` samples; stop after ``timeout`` seconds without a new one."""
        n = 0
        while limit is None or n < limit:
            sample = self.poll(timeout=1e9 if timeout is None else timeout)
            if sample is None:
                return
            self._auto_release()
            self._last_yielded = sample
            n += 1
            yield sample
        self._auto_release()

    def stats(self) -> dict[str, Any]:
        """Counters and the exact rids that were dropped, incomplete or rejected."""
        return {
            **self._counts,
            "ready": len(self._ready),
            "assembling": len(self._assembling),
            "dropped": dict(self.dropped),
            "incomplete": dict(self.incomplete),
            "rejected": dict(self.rejected),
            "errors": list(self.errors),
            "producers": {
                f"{s.producer}@{s.epoch:016x}": {
                    "segment": s.segment, "attached": s.consumer is not None,
                    "lost_notices": s.producer_stats.get("lost", 0),
                    **{k: s.producer_stats[k] for k in ("dropped", "committed", "errors")
                       if k in s.producer_stats}}
                for s in self._sources.values()},
        }

    def pump(self, timeout: float = 0.0) -> None:
        """Process whatever arrived (notices, ring records) for up to ``timeout`` seconds."""
        self._pump(timeout)

    def close(self) -> None:
        """Release everything and detach from every ring."""
        if self._closed:
            return
        self._closed = True
        for src in list(self._incarnations.values()):
            self._detach(src)
        self._sock.close(0)
        self._ctx.term()

    def __enter__(self) -> "Subscriber":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the pump ----------------------------------------------------------------------

    def _pump(self, timeout: float) -> None:
        if self._closed:
            raise HSCaptureError("Subscriber is closed")
        events = dict(self._poller.poll(int(timeout * 1000)))
        if events.get(self._sock):
            for _ in range(self._batch):
                try:
                    frame = self._sock.recv(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                self._on_frame(frame.buffer)
        for src in list(self._sources.values()):
            if src.consumer is not None:
                self._pump_ring(src)
        now = time.monotonic()
        if now - self._last_housekeeping > 0.05:
            self._last_housekeeping = now
            self._housekeeping(now)

    def _error(self, message: str, counter: str) -> None:
        self._counts[counter] += 1
        self.errors.append(message)
        if self._counts[counter] == 1:
            log.warning("hscapture subscriber: %s (further %s are counted)", message, counter)

    def _on_frame(self, frame: memoryview) -> None:
        try:
            msg = nt.decode(frame)
        except NoticeError as exc:
            self._error(f"rejected notice: {type(exc).__name__}: {exc}", "malformed_notices")
            return
        self._counts["notices"] += 1
        src = self._source_for(msg)
        if src is None:
            return
        src.last_seen = time.monotonic()
        kind = msg["kind"]
        if kind in ("record", "drop", "abort"):
            seq = msg["seq"]
            if src.base_seq is None:
                src.base_seq = src.low = seq
            if seq < src.low or seq in src.resolved:
                self._counts["duplicate_notices"] += 1
                return
            src.max_notice_seq = max(src.max_notice_seq, seq)
            src.missing_since.pop(seq, None)
            if kind == "record":
                if msg["offset"] < src.start:   # committed before we attached: not ours
                    self._counts["before_attach"] += 1
                    self._resolve(src, seq)
                else:
                    src.notices[seq] = msg
            else:
                src.control.append(msg)
                src.control.sort(key=lambda m: m["seq"])
        elif kind == "heartbeat":
            self._on_heartbeat(src, msg)
        elif kind == "bye":
            src.ended = True
            self._check_tail(src, msg["next_seq"])

    def _source_for(self, msg: dict[str, Any]) -> _Source | None:
        producer, epoch = msg["producer"], msg["epoch"]
        src = self._sources.get(producer)
        if src is not None and src.epoch == epoch:
            if src.consumer is None and "segment" in msg:
                self._attach(src, msg["segment"])
            return src
        if (producer, epoch) in self._retired:
            self._error(str(StaleEpochError(
                f"{msg['kind']} notice of producer {producer!r} epoch {epoch:#x}: that "
                f"incarnation was retired (current epoch "
                f"{src.epoch if src else 0:#x})")), "stale_notices")
            return None
        if "segment" not in msg:
            # a drop/abort/bye of an incarnation we never attached to: nothing of it is ours
            self._counts["before_attach"] += 1
            return None
        if src is not None:
            self._retire(src, f"producer restarted (epoch {src.epoch:#x} -> {epoch:#x})")
        src = self._sources[producer] = _Source(producer, epoch)
        self._incarnations[(producer, epoch)] = src
        self._attach(src, msg["segment"])
        return src

    def _attach(self, src: _Source, segment: str) -> None:
        from . import _ring

        try:
            src.consumer = _ring.Consumer(segment, src.epoch, self.resume_name)
        except RingError as exc:
            self._error(f"cannot attach to segment {segment!r} of producer "
                        f"{src.producer!r}: {type(exc).__name__}: {exc}", "attach_errors")
            return
        src.segment = segment
        src.start = src.consumer.position
        self._counts["attached"] += 1
        if src.consumer.resumed:
            self._counts["resumed"] += 1
            log.info("hscapture subscriber: resumed %r's ring at position %d", segment, src.start)

    def _detach(self, src: _Source) -> None:
        if src.consumer is not None:
            try:
                src.consumer.close()
            except Exception:
                pass
            src.consumer = None

    def _retire(self, src: _Source, reason: str) -> None:
        self._pump_ring(src)
        self._apply_control(src, None)
        for key in [k for k in self._assembling if k[:2] == (src.producer, src.epoch)]:
            self._fail(key, f"{reason}; missing {self._gaps(self._assembling[key])}",
                       "incomplete", finalize=True)
        self._retired.add((src.producer, src.epoch))
        self._sources.pop(src.producer, None)
        self._advance_release(src)   # detaches now unless samples still hold views into it

    # -- sequence accounting ------------------------------------------------------------

    def _resolve(self, src: _Source, seq: int) -> None:
        src.resolved.add(seq)
        src.missing_since.pop(seq, None)
        while src.low in src.resolved:
            src.resolved.discard(src.low)
            src.low += 1

    def _check_tail(self, src: _Source, next_seq: int) -> None:
        src.hb_next_seq = max(src.hb_next_seq, next_seq)
        if src.base_seq is None:
            src.base_seq = src.low = next_seq
            return
        now = time.monotonic()
        for seq in range(src.low, next_seq):
            if seq not in src.resolved and seq not in src.notices and not any(
                    m["seq"] == seq for m in src.control):
                src.missing_since.setdefault(seq, now)

    def _on_heartbeat(self, src: _Source, msg: dict[str, Any]) -> None:
        src.producer_stats.update(dropped=msg["dropped"], committed=msg["committed"],
                                  errors=msg["errors"], head=msg["head"])
        for entry in msg["recent_drops"]:
            if not (isinstance(entry, list) and len(entry) == 4):
                continue
            seq, rid, kind, reason = entry
            extra = {"restart": True} if kind == "restart" else {}
            kind = "abort" if kind == "restart" else kind
            if (isinstance(seq, int) and src.base_seq is not None and seq >= src.low
                    and seq not in src.resolved and seq in src.missing_since):
                self._counts["recovered_from_heartbeat"] += 1
                src.missing_since.pop(seq)
                src.control.append({"kind": kind, "seq": seq, "rid": str(rid),
                                    "reason": str(reason), "last": True, "extra": extra})
                src.control.sort(key=lambda m: m["seq"])
        self._check_tail(src, msg["next_seq"])

    # -- the ring ----------------------------------------------------------------------

    def _pump_ring(self, src: _Source) -> None:
        consumer = src.consumer
        if consumer is None:
            return
        while True:
            rec = src.held
            if rec is None:
                try:
                    rec = consumer.poll()
                except RingError as exc:
                    self._error(f"ring of {src.producer!r} is corrupt: {exc}", "ring_errors")
                    return
                if rec is None:
                    self._apply_control(src, None)
                    return
            checked = self._record_meta(src, rec)
            if checked is None:
                src.held = None
                self._release_now(src, rec)
                continue
            meta, diff = checked
            seq = meta["seq"]
            notice = src.notices.pop(seq, None)
            if notice is None:
                # Notices leave in seq order after their record's commit: the notice is lost
                # if a later one arrived, a heartbeat counted past it, or the producer ended.
                lost = (src.base_seq is not None and seq < src.low) or \
                    seq < src.max_notice_seq or seq < src.hb_next_seq or src.ended
                waited = src.held is not None and \
                    time.monotonic() - src.held_since > self.notice_grace_s
                if not (lost or waited):
                    if src.held is None:
                        src.held, src.held_since = rec, time.monotonic()
                    return  # the notice is in flight: wait for it
                self._counts["recovered_from_ring"] += 1
            src.held = None
            if src.base_seq is None:
                src.base_seq = src.low = seq
            self._apply_control(src, seq)
            if seq >= src.low:
                self._resolve(src, seq)
            self._on_record(src, rec, meta, notice, diff)

    def _record_meta(self, src: _Source, rec: Any
                     ) -> tuple[dict[str, Any], list[str] | None] | None:
        """The record's embedded meta, completed by its placement, and the fields in which it
        differs from its notice (None when no notice has arrived); None if unusable."""
        payload = rec.payload
        try:
            if rec.payload_len < 4:
                raise NoticeError(f"payload of {rec.payload_len} bytes has no meta")
            meta_len = int.from_bytes(payload[:4], "little")
            if 4 + meta_len > rec.payload_len:
                raise NoticeError(f"meta length {meta_len} exceeds payload {rec.payload_len}")
            meta = nt.decode_embedded(payload[4:4 + meta_len], {
                "offset": rec.position, "length": rec.payload_len, "record_seq": rec.seq,
                "segment": src.segment}, check=False)
            # Equal to an already validated notice in every field means valid; otherwise (no
            # notice, or a difference to report) the embedded copy is validated on its own.
            notice = src.notices.get(meta.get("seq"))
            diff = None if notice is None else nt.differing_fields(notice, meta, _COMPARED)
            if diff is None or diff:
                nt.validate(meta)
        except NoticeError as exc:
            self._error(f"ring record at {rec.position} of {src.producer!r}: {exc}",
                        "corrupt_records")
            return None
        problems = []
        if rec.epoch != src.epoch or meta["epoch"] != src.epoch:
            problems.append(f"epoch: expected {src.epoch:#x}, record header {rec.epoch:#x}, "
                            f"embedded {meta['epoch']:#x}")
        if meta["producer"] != src.producer:
            problems.append(f"producer: expected {src.producer!r}, found {meta['producer']!r}")
        if rec.tag != nt.rid_tag(meta["rid"]):
            problems.append("record header tag does not match the embedded rid")
        if problems:
            self._reject(meta["rid"], (src.producer, src.epoch, meta["rid"]),
                         f"ring record {rec.position}: " + "; ".join(problems))
            self._resolve(src, meta["seq"])
            return None
        return meta, diff

    def _verify(self, rec: Any, notice: dict[str, Any], diff: list[str]) -> str | None:
        """Why notice and ring record disagree, or None if they agree."""
        problems = []
        if notice["offset"] != rec.position:
            problems.append(f"offset: notice {notice['offset']}, record {rec.position}")
        if notice["record_seq"] != rec.seq:
            problems.append(f"record seq: notice {notice['record_seq']}, record {rec.seq}")
        if notice["length"] != rec.payload_len:
            problems.append(f"length: notice {notice['length']}, record {rec.payload_len}")
        if notice["epoch"] != rec.epoch:
            problems.append(f"epoch: notice {notice['epoch']:#x}, record {rec.epoch:#x}")
        if diff:
            problems.append("embedded meta differs from notice in " + ", ".join(diff))
        return "; ".join(problems) or None

    def _apply_control(self, src: _Source, before_seq: int | None) -> None:
        """Apply drop/abort notices numbered before ``before_seq`` (all if None), in order."""
        while src.control and (before_seq is None or src.control[0]["seq"] < before_seq):
            msg = src.control.pop(0)
            self._resolve(src, msg["seq"])
            key = (src.producer, src.epoch, msg["rid"])
            if msg["kind"] == "drop":
                self._counts["drop_notices"] += 1
                self._fail(key, f"dropped by producer: {msg['reason']}", "dropped",
                           finalize=msg["last"])
            elif msg["extra"].get("restart"):
                self._counts["restarted"] += 1
                asm = self._assembling.pop(key, None)
                if asm is not None:
                    self._release_chunks(src, asm)
            else:
                self._fail(key, f"aborted by producer: {msg['reason']}", "incomplete",
                           finalize=True)

    # -- assembly ------------------------------------------------------------------------

    def _on_record(self, src: _Source, rec: Any, meta: dict[str, Any],
                   notice: dict[str, Any] | None, diff: list[str] | None) -> None:
        rid = meta["rid"]
        key = (src.producer, src.epoch, rid)
        if self.rid_filter is not None and not self.rid_filter(rid):
            self._counts["filtered"] += 1
            self._release_now(src, rec)
            return
        if notice is not None:
            why = self._verify(rec, notice, diff or [])
            if why is not None:
                self._release_now(src, rec)
                self._reject(rid, key, f"notice and ring record disagree: {why}")
                return
        asm = self._assembling.get(key)
        if asm is None:
            asm = self._assembling[key] = _Assembly(key)
        asm.updated = time.monotonic()
        if asm.failed is not None:
            self._release_now(src, rec)
            if meta["last"]:
                self._finalize_failure(asm)
            return
        chunk = self._chunk(rec, meta)
        src.outstanding.add(rec.position)
        if asm.chunks and not self._compatible(asm.chunks[0].meta, meta):
            asm.chunks.append(chunk)
            self._reject(rid, key, "chunks disagree on layers, kinds, dtype or hidden size")
            return
        overlap = [c for c in asm.chunks
                   if c.start < chunk.start + chunk.count and chunk.start < c.start + c.count]
        asm.chunks.append(chunk)
        if overlap:
            self._reject(rid, key, f"token positions [{chunk.start}, "
                                   f"{chunk.start + chunk.count}) were delivered twice")
            return
        if meta["last"]:
            asm.total = chunk.start + chunk.count
        if asm.total is not None:
            self._complete(src, asm, asm.total)

    @staticmethod
    def _compatible(a: dict[str, Any], b: dict[str, Any]) -> bool:
        return all(a[k] == b[k] for k in ("layers", "layer_kinds", "dtype", "hidden"))

    @staticmethod
    def _chunk(rec: Any, meta: dict[str, Any]) -> _Chunk:
        count, hidden = meta["token_count"], meta["hidden"]
        dtype = _TORCH_DTYPES[meta["dtype"]]
        nbytes = count * hidden * nt.DTYPES[meta["dtype"]]
        raw = np.frombuffer(rec.payload, dtype=np.uint8)
        tensors = [torch.from_numpy(raw[o:o + nbytes]).view(dtype).view(count, hidden)
                   for o in meta["tensor_offsets"]]
        ids = np.frombuffer(meta["token_ids"], dtype="<i4")
        return _Chunk(meta["token_start"], count, tensors, ids, rec.position, meta)

    def _complete(self, src: _Source, asm: _Assembly, total: int) -> None:
        chunks = sorted(asm.chunks, key=lambda c: c.start)
        first = chunks[0].meta
        rid = first["rid"]
        covered, missing = 0, []
        for c in chunks:
            if c.start > covered:
                missing.append((covered, c.start))
            covered = max(covered, c.start + c.count)
        if covered > total:
            self._reject(rid, asm.key, f"chunks reach token {covered}, past the last chunk's "
                                       f"end {total}")
            return
        if missing or covered != total:
            cached = max(c.meta["cached_prefix"] for c in chunks)
            if cached and missing and missing[0] == (0, cached):
                self._fail(asm.key, f"prefix cache hit: positions [0, {cached}) were not "
                                    f"computed (disable the radix cache or bust it per request)",
                           "incomplete", finalize=True)
            return  # chunks may still arrive out of order; the timeout reports a gap for good
        expected = self._expected.pop(rid, None)
        if expected is not None and expected != total:
            self._reject(rid, asm.key, f"expected {expected} tokens, found {total}")
            return
        del self._assembling[asm.key]
        names = [layer_name(l, k) for l, k in zip(first["layers"], first["layer_kinds"])]
        positions = [c.position for c in chunks]
        if len(chunks) == 1 and not self.copy:
            tensors = dict(zip(names, chunks[0].tensors))
            token_ids = torch.from_numpy(chunks[0].token_ids)
            release = self._releaser(src, positions)
        else:
            tensors = {n: torch.cat([c.tensors[i] for c in chunks]) for i, n in enumerate(names)}
            token_ids = torch.from_numpy(np.concatenate([c.token_ids for c in chunks]))
            release = self._releaser(src, positions)
        meta = {k: first[k] for k in ("convention", "model", "cached_prefix", "dp_rank", "extra")}
        meta.update(chunks=len(chunks), seqs=[c.meta["seq"] for c in chunks])
        sample = Sample(rid=rid, producer_id=src.producer, epoch=src.epoch, num_tokens=total,
                        token_ids=token_ids, tensors=tensors, layers=list(first["layers"]),
                        layer_kinds=list(first["layer_kinds"]), dtype=first["dtype"],
                        hidden=first["hidden"], meta=meta, _release=release)
        self._counts["samples"] += 1
        self._counts["sample_bytes"] += sample.nbytes
        self._ready.append(sample)

    def _releaser(self, src: _Source, positions: list[int]) -> Callable[[], None]:
        def release() -> None:
            for p in positions:
                src.outstanding.discard(p)
            self._advance_release(src)
        return release

    def _release_now(self, src: _Source, rec: Any) -> None:
        src.outstanding.discard(rec.position)
        self._advance_release(src)

    def _release_chunks(self, src: _Source, asm: _Assembly) -> None:
        for c in asm.chunks:
            src.outstanding.discard(c.position)
        asm.chunks.clear()
        self._advance_release(src)

    def _advance_release(self, src: _Source) -> None:
        consumer = src.consumer
        if consumer is None:
            return
        # Everything before the oldest record still held (or before the read position,
        # excluding a record we hold waiting for its notice) goes back to the producer.
        limit = consumer.position if src.held is None else src.held.position
        oldest = src.outstanding.oldest()
        if oldest is not None:
            limit = min(limit, oldest)
        if limit > consumer.released:
            consumer.release(limit)
        if self._sources.get(src.producer) is not src and not src.outstanding:
            self._detach(src)
            self._incarnations.pop((src.producer, src.epoch), None)

    def _fail(self, key: tuple[str, int, str], reason: str, kind: str, finalize: bool) -> None:
        asm = self._assembling.get(key)
        if asm is None:
            asm = self._assembling[key] = _Assembly(key)
        if asm.failed is None:
            asm.failed, asm.failure_kind = reason, kind
        src = self._incarnations.get(key[:2])
        if src is not None:
            self._release_chunks(src, asm)
        if finalize:
            self._finalize_failure(asm)

    def _finalize_failure(self, asm: _Assembly) -> None:
        self._assembling.pop(asm.key, None)
        rid = asm.key[2]
        target = {"dropped": self.dropped, "rejected": self.rejected}.get(
            asm.failure_kind, self.incomplete)
        target[rid] = asm.failed or "unknown"
        self._counts[f"{asm.failure_kind or 'incomplete'}_samples"] += 1
        self._expected.pop(rid, None)

    def _reject(self, rid: str, key: tuple[str, int, str], why: str) -> None:
        message = str(SampleMismatchError(f"sample {rid!r} rejected: {why}"))
        self._error(message, "mismatches")
        self._fail(key, message, "rejected", finalize=True)

    # -- housekeeping ------------------------------------------------------------------

    def _housekeeping(self, now: float) -> None:
        for src in list(self._sources.values()):
            for seq, since in list(src.missing_since.items()):
                if now - since > self.notice_grace_s and seq >= src.low:
                    self._error(f"notice {seq} of producer {src.producer!r} epoch "
                                f"{src.epoch:#x} was lost and could not be recovered "
                                f"(a drop/abort notice; its rid is unknown)", "lost_notices")
                    src.producer_stats["lost"] = src.producer_stats.get("lost", 0) + 1
                    self._resolve(src, seq)
            stale = [s for s, n in src.notices.items()
                     if src.consumer is not None and n["offset"] < src.consumer.position
                     and (src.held is None or n["offset"] < src.held.position)]
            for seq in stale:
                n = src.notices.pop(seq)
                self._resolve(src, seq)
                self._reject(n["rid"], (src.producer, src.epoch, n["rid"]),
                             f"notice {seq} points at ring position {n['offset']}, where no "
                             f"record with that sequence number exists")
            alive = src.consumer is not None and src.consumer.producer_alive()
            quiet = now - src.last_seen
            if (src.ended and quiet > self.notice_grace_s) or \
                    (not alive and quiet > self.producer_timeout_s):
                self._retire(src, "producer stopped before the sample completed")
        for key, asm in list(self._assembling.items()):
            if now - asm.updated > self.incomplete_timeout_s:
                self._fail(key, f"no chunk for {self.incomplete_timeout_s:g}s; still missing "
                                f"{self._gaps(asm)}", "incomplete", finalize=True)

    def _auto_release(self) -> None:
        if self.auto_release and self._last_yielded is not None:
            self._last_yielded.release()
        self._last_yielded = None

    def _raise_if_failed(self, rid: str) -> None:
        if rid in self.dropped:
            raise SampleDroppedError(f"sample {rid!r} was dropped: {self.dropped[rid]}")
        if rid in self.rejected:
            raise SampleMismatchError(self.rejected[rid])
        if rid in self.incomplete:
            raise IncompleteSampleError(f"sample {rid!r} is incomplete: {self.incomplete[rid]}")

    @staticmethod
    def _gaps(asm: _Assembly) -> str:
        covered, gaps = 0, []
        for c in sorted(asm.chunks, key=lambda c: c.start):
            if c.start > covered:
                gaps.append(f"[{covered}, {c.start})")
            covered = max(covered, c.start + c.count)
        if asm.total is None:
            gaps.append(f"[{covered}, ?) (the last chunk never arrived)")
        elif covered < asm.total:
            gaps.append(f"[{covered}, {asm.total})")
        return ", ".join(gaps) or "nothing"

    def _progress(self, rid: str) -> str:
        parts = [f"[{c.start}, {c.start + c.count})" for k, a in self._assembling.items()
                 if k[2] == rid for c in a.chunks]
        return ", ".join(parts) or "none"
