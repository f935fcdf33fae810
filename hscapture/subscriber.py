"""``hscapture.Subscriber``: the public API that hands out exactly the captured samples.

A subscriber is a ZeroMQ SUB socket plus one ring consumer per producer incarnation. The
ring is the log (docs/PROTOCOL.md): every sequence-numbered event is a ring entry, so what a
subscriber receives and reports does not depend on the wire. Notices wake it up and are
cross-checked byte for byte against the entries they announce; heartbeats carry liveness and
tell it when numbers it never saw can no longer arrive.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
import logging
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
import zmq

from . import notice as nt
from . import record as rec
from ._assembly import Assembler, Chunk, Partial
from ._sequence import SequenceTracker
from .endpoint import check_endpoint
from .errors import (
    HSCaptureError,
    IncompleteSampleError,
    NoticeError,
    RingError,
    SampleDroppedError,
    SampleMismatchError,
    SampleTimeoutError,
    SubscriptionNotFoundError,
)
from .sample import Sample, layer_name

log = logging.getLogger("hscapture")

__all__ = ["Subscriber", "LostRange"]

_TORCH_DTYPES = {name: getattr(torch, name) for name in nt.DTYPES}
_MAX_ERRORS = 200
_MAX_NOTICES = 100_000        # notices kept waiting for their entries, per incarnation
_MAX_FAILED = 1 << 16         # (epoch, rid) of failed samples remembered to discard late chunks


@dataclass(frozen=True)
class LostRange:
    """Sequence numbers ``[first, first + count)`` of one producer incarnation whose events
    the subscriber can never learn (their rids are unknown): the producer could not record
    them (ring and backlog full), died before committing them, or the subscription expired."""

    producer: str
    epoch: int
    first: int
    count: int
    reason: str


class _Held:
    """Ring positions still referenced by borrowed samples; the oldest bounds the release."""

    def __init__(self) -> None:
        self._live: collections.Counter[int] = collections.Counter()
        self._heap: list[int] = []

    def add(self, position: int) -> None:
        if not self._live[position]:
            heapq.heappush(self._heap, position)
        self._live[position] += 1

    def discard(self, position: int) -> None:
        self._live[position] -= 1
        if self._live[position] <= 0:
            del self._live[position]

    def oldest(self) -> int | None:
        while self._heap and self._heap[0] not in self._live:
            heapq.heappop(self._heap)
        return self._heap[0] if self._heap else None

    def __len__(self) -> int:
        return len(self._live)


@dataclass
class _Source:
    """One producer incarnation (epoch) and our ring consumer on its segment."""

    epoch: int
    producer: str | None
    segment: str
    consumer: Any
    seqs: SequenceTracker = field(default_factory=SequenceTracker)
    lost_seqs: SequenceTracker = field(default_factory=SequenceTracker)   # reported lost
    notices: dict[int, dict[str, Any]] = field(default_factory=dict)
    held: Any = None                  # a record waiting for its notice
    held_since: float = 0.0
    hb: dict[str, Any] | None = None  # the last heartbeat
    max_notice_seq: int = -1
    last_seen: float = field(default_factory=time.monotonic)
    ended: bool = False               # bye received
    retired: bool = False
    borrowed: _Held = field(default_factory=_Held)
    pid: int = 0
    attach_head: int = 0              # producer head when we attached: older notices are gone
    order: int = 0                    # attach order: the earlier of two conflicting wins
    resumed: bool = False             # took over an existing durable place


class Subscriber:
    """Receive complete, verified samples from one or more hscapture producers.

    Guarantees:
    - A sample is handed out only when token positions ``0..N-1`` are all present exactly once
      and every entry it came from passed validation (docs/PROTOCOL.md) and agreed byte for
      byte with its notice when the notice arrived. Everything else is REPORTED by rid in
      :meth:`stats` and by the raising :meth:`get`: dropped, incomplete (with the reason) and
      rejected samples; and sequence ranges whose rids can never be known (:class:`LostRange`).
    - Samples own their tensors (copied out of the ring) unless ``zero_copy=True``; then each
      sample is a scoped borrow of read-only ring memory (``with sample:``), emptied on release.
    - Partial samples never pin the ring for long: non-final chunks are copied out on arrival
      (bounded by ``max_partial_bytes``, the oldest partial failing as incomplete past it);
      for a durable subscriber their ring records stay unreleased until the sample completes
      or fails, or for ``partial_hold_s`` at most, so that a crash mid-sample gets the whole
      sample again on return instead of a report.
    - With ``name`` the subscription is durable: from its first attach until
      :meth:`unsubscribe`, across clean and unclean exits of this process, every entry the
      producer committed is delivered to a subscriber of the same name exactly once (as far as
      this process released it) or reported. ``close()`` keeps the place; ``unsubscribe()``
      gives it up.
    - Records of different producer incarnations are never mixed; two live producers with one
      producer id are refused (reported in ``stats()["conflicts"]``), never merged.
    - Malformed or forged input never raises out of poll/iteration: it is counted, reported
      and skipped.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        name: str = "",
        zero_copy: bool = False,
        notice_grace_s: float = 1.0,
        incomplete_timeout_s: float = 120.0,
        producer_timeout_s: float = 10.0,
        rid_filter: Callable[[str], bool] | None = None,
        skip_rid: Callable[[str], bool] | None = None,
        max_partial_bytes: int = 4 << 30,
        partial_hold_s: float = 10.0,
    ) -> None:
        self.endpoints = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        for ep in self.endpoints:
            check_endpoint(ep)
        self.name = name
        self.zero_copy = zero_copy
        self.notice_grace_s = notice_grace_s
        self.incomplete_timeout_s = incomplete_timeout_s
        self.producer_timeout_s = producer_timeout_s
        self.rid_filter = rid_filter
        self.skip_rid = skip_rid
        self.partial_hold_s = partial_hold_s
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.RCVHWM, 0)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        for ep in self.endpoints:
            self._sock.connect(ep)
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._sources: dict[int, _Source] = {}          # by epoch, attached or draining
        self._current: dict[str, int] = {}              # producer id -> live epoch
        self._retired: set[int] = set()
        self._refused: dict[int, str] = {}              # epoch -> why (conflicts)
        self._attach_order = itertools.count()
        self._asm = Assembler(max_partial_bytes)
        self._ready: collections.deque[Sample] = collections.deque()
        self._expected: dict[str, int] = {}
        self._failed: collections.OrderedDict[tuple[int, str], None] = collections.OrderedDict()
        self.dropped: dict[str, str] = {}
        self.incomplete: dict[str, str] = {}
        self.rejected: dict[str, str] = {}
        self.lost: list[LostRange] = []
        self.conflicts: dict[str, str] = {}
        self.errors: collections.deque[str] = collections.deque(maxlen=_MAX_ERRORS)
        self._counts: collections.Counter[str] = collections.Counter()
        self._last_housekeeping = 0.0
        self._batch = 256
        self._closed = False
        if name:
            self._resume_durable()

    # -- public API --------------------------------------------------------------------

    def wait_ready(self, timeout: float = 10.0, producers: int = 1,
                   stop: Callable[[], bool] | None = None) -> bool:
        """Block until at least ``producers`` live producer incarnations are attached.

        Returns True when they are, False when ``stop()`` became true first; raises
        :class:`SampleTimeoutError` after ``timeout``."""
        deadline = time.monotonic() + timeout
        while len(self._current) < producers:
            if stop is not None and stop():
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SampleTimeoutError(
                    f"no hscapture producer announced itself on {self.endpoints} within "
                    f"{timeout:g}s (expected {producers}, attached {len(self._current)})")
            self._pump(min(remaining, 0.05))
        return True

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
        """The sample of ``rid``; raises :class:`SampleDroppedError`,
        :class:`IncompleteSampleError`, :class:`SampleMismatchError` as soon as it is known to
        have failed, :class:`SampleTimeoutError` after ``timeout``. Samples of other rids that
        complete meanwhile stay queued for :meth:`poll` / iteration."""
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
        """Yield complete samples until the subscriber is closed."""
        while not self._closed:
            sample = self.poll(timeout=0.1)
            if sample is not None:
                yield sample

    def samples(self, limit: int | None = None, timeout: float | None = None) -> Iterator[Sample]:
        """Yield up to ``limit`` samples; stop after ``timeout`` seconds without a new one."""
        n = 0
        while limit is None or n < limit:
            sample = self.poll(timeout=1e9 if timeout is None else timeout)
            if sample is None:
                return
            n += 1
            yield sample

    def in_flight(self) -> dict[str, str]:
        """Samples started but not complete (rid -> the positions still missing)."""
        return {p.key[1]: p.describe_gaps() for p in self._asm.partials.values()}

    def stats(self) -> dict[str, Any]:
        """Counters, and exactly what was not delivered: dropped / incomplete / rejected rids,
        lost and still-unresolved sequence ranges, producer-id conflicts, samples in flight."""
        unresolved = []
        for src in self._sources.values():
            for a, b in src.seqs.missing():
                unresolved.append({"producer": src.producer, "epoch": src.epoch,
                                   "first": a, "count": b - a})
        return {
            **self._counts,
            "ready": len(self._ready),
            "assembling": len(self._asm.partials),
            "partial_bytes": self._asm.nbytes,
            "dropped": dict(self.dropped),
            "incomplete": dict(self.incomplete),
            "rejected": dict(self.rejected),
            "lost": [dataclasses.asdict(x) for x in self.lost],
            "unresolved": unresolved,
            "conflicts": dict(self.conflicts),
            "in_flight": self.in_flight(),
            "errors": list(self.errors),
            "producers": {
                f"{s.producer}@{s.epoch:016x}": {
                    "segment": s.segment, "attached": s.consumer is not None,
                    "live": self._current.get(s.producer or "") == s.epoch,
                    **({k: s.hb[k] for k in ("dropped", "committed", "unrecorded", "backlog")}
                       if s.hb else {})}
                for s in self._sources.values()},
        }

    def pump(self, timeout: float = 0.0) -> None:
        """Process whatever arrived (notices, ring entries) for up to ``timeout`` seconds."""
        self._pump(timeout)

    def close(self) -> None:
        """Detach from every ring. A durable subscription keeps its place (see
        :meth:`unsubscribe`); borrowed samples not yet released are released."""
        self._shutdown(unsubscribe=False)

    def unsubscribe(self) -> None:
        """End a durable subscription: give its place in every ring back, then close."""
        self._shutdown(unsubscribe=True)

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
        if kind == "entry":
            seq = msg["seq"]
            if src.seqs.seen(seq):
                self._counts["late_notices"] += 1
                return
            src.max_notice_seq = max(src.max_notice_seq, seq)
            if len(src.notices) < _MAX_NOTICES:
                src.notices[seq] = msg
        elif kind == "heartbeat":
            if src.consumer is not None and msg["head"] > src.consumer.head:
                # the ring's head only grows: a heartbeat ahead of it was not the producer's
                self._error(f"heartbeat of {msg['producer']!r} names ring head {msg['head']}, "
                            f"past the ring's own head {src.consumer.head}", "forged_notices")
                return
            src.hb = msg
        elif kind == "bye":
            src.ended = True

    def _source_for(self, msg: dict[str, Any]) -> _Source | None:
        producer, epoch = msg["producer"], msg["epoch"]
        src = self._sources.get(epoch)
        if src is not None:
            if src.producer is None:
                src.producer = producer
            if src.producer != producer:
                self._error(f"{msg['kind']} notice names producer {producer!r} for epoch "
                            f"{epoch:#x} of producer {src.producer!r}", "forged_notices")
                return None
            if self._current.get(producer) != epoch and not src.retired:
                if not self._claim_current(producer, epoch, msg):
                    return None
            return src
        if epoch in self._retired:
            self._counts["stale_notices"] += 1
            return None
        if epoch in self._refused:
            self._counts["refused_notices"] += 1
            return None
        if "segment" not in msg:
            self._counts["before_attach"] += 1  # an incarnation we never attached to
            return None
        if not self._claim_current(producer, epoch, msg):
            return None
        return self._attach(producer, epoch, msg["segment"])

    def _claim_current(self, producer: str, epoch: int, msg: dict[str, Any]) -> bool:
        """Make ``epoch`` the live incarnation of ``producer``, unless another live one has it."""
        old_epoch = self._current.get(producer)
        old = self._sources.get(old_epoch) if old_epoch is not None else None
        if old is not None and old_epoch != epoch:
            alive = old.consumer is not None and old.consumer.producer_alive() and \
                time.monotonic() - old.last_seen < self.producer_timeout_s and not old.ended
            mine = self._sources.get(epoch)
            if alive and mine is not None and mine.consumer is not None and \
                    mine.order < old.order:
                # ``epoch`` held our place first (e.g. a durable place resumed before its
                # producer id was known): the newcomer is the one refused, and the place
                # this subscriber just took in its ring is given back.
                self._refuse(producer, old, epoch, msg)
                self._current[producer] = epoch
                return True
            if alive:
                why = (f"two live producers use the producer id {producer!r}: epoch "
                       f"{old_epoch:#x} (segment {old.segment}) and epoch {epoch:#x} (segment "
                       f"{msg.get('segment', '?')}, pid {msg.get('pid', '?')}); producer ids "
                       f"must be unique per subscriber: the second one is refused")
                self._refused[epoch] = why
                self.conflicts[f"{producer}@{epoch:016x}"] = why
                log.error("hscapture subscriber: %s", why)
                return False
            self._retire(old, f"producer restarted (epoch {old_epoch:#x} -> {epoch:#x})")
        self._current[producer] = epoch
        return True

    def _refuse(self, producer: str, newer: _Source, epoch: int, msg: dict[str, Any]) -> None:
        """Refuse the later-attached of two live incarnations with one producer id."""
        why = (f"two live producers use the producer id {producer!r}: epoch {epoch:#x} "
               f"(segment {msg.get('segment', '?')}) and epoch {newer.epoch:#x} (segment "
               f"{newer.segment}); producer ids must be unique per subscriber: the second one "
               f"is refused")
        self._refused[newer.epoch] = why
        self.conflicts[f"{producer}@{newer.epoch:016x}"] = why
        log.error("hscapture subscriber: %s", why)
        for p in self._asm.of_epoch(newer.epoch):
            self._fail(p.key, why, "incomplete")
        self._detach(newer, unsubscribe=bool(self.name) and not newer.resumed)
        self._sources.pop(newer.epoch, None)

    def _attach(self, producer: str | None, epoch: int, segment: str, *,
                resume_only: bool = False) -> _Source | None:
        from . import _ring

        try:
            consumer = _ring.Consumer(segment, epoch, self.name, resume_only=resume_only)
        except SubscriptionNotFoundError:
            return None
        except RingError as exc:
            self._error(f"cannot attach to segment {segment!r} of producer {producer!r}: "
                        f"{type(exc).__name__}: {exc}", "attach_errors")
            if producer is not None and self._current.get(producer) == epoch:
                del self._current[producer]
            return None
        src = _Source(consumer.epoch, producer, segment, consumer,
                      order=next(self._attach_order),
                      resumed=bool(getattr(consumer, "resumed", False)))
        self._sources[src.epoch] = src
        self._counts["attached"] += 1
        if getattr(consumer, "expired", False):
            lost = consumer.lost_to - consumer.lost_from
            self._error(f"durable subscription {self.name!r} on {segment} expired while away: "
                        f"ring bytes [{consumer.lost_from}, {consumer.lost_to}) were never "
                        f"read", "expired_subscriptions")
            self.lost.append(LostRange(producer or "?", src.epoch, -1, lost,
                                       "subscription expired while away (ring bytes lost)"))
        elif getattr(consumer, "resumed", False):
            self._counts["resumed"] += 1
            log.info("hscapture subscriber: resumed %r at ring position %d", segment,
                     consumer.position)
        return src

    def _resume_durable(self) -> None:
        """Take over this name's places in every ring (live or dead producers) at once."""
        from .ring import durable_segments

        for segment in durable_segments(self.name):
            self._attach(None, 0, segment, resume_only=True)

    def _detach(self, src: _Source, unsubscribe: bool = False) -> None:
        if src.consumer is None:
            return
        try:
            if unsubscribe and self.name:
                src.consumer.unsubscribe()
            else:
                src.consumer.close()
        except Exception:
            pass
        src.consumer = None

    def _retire(self, src: _Source, reason: str) -> None:
        """The incarnation is over: read what is left, report what never arrived."""
        if src.retired:
            return
        self._pump_ring(src, final=True)
        src.retired = True
        producer = src.producer or "?"
        hb_next = max((src.hb or {}).get("next_seq", 0), src.seqs.high)
        for a, b in src.seqs.missing_below(hb_next):
            self._lost(src, a, b - a, f"{reason}: never recorded in the ring")
        for p in self._asm.of_epoch(src.epoch):
            self._fail(p.key, f"{reason}; missing {p.describe_gaps()}", "incomplete")
        self._retired.add(src.epoch)
        if self._current.get(producer) == src.epoch:
            del self._current[producer]
        self._maybe_finish(src)

    def _maybe_finish(self, src: _Source) -> None:
        """Detach from a retired incarnation once no borrowed sample needs its ring; a durable
        subscription of a dead producer is then ended and the segment removed if unused."""
        if not src.retired or len(src.borrowed) or src.consumer is None:
            return
        dead = not src.consumer.producer_alive()
        self._detach(src, unsubscribe=bool(self.name) and dead)
        if dead:
            from .ring import cleanup_stale
            try:
                cleanup_stale(src.segment)
            except Exception:
                pass
        self._sources.pop(src.epoch, None)

    def _lost(self, src: _Source, first: int, count: int, reason: str) -> None:
        self.lost.append(LostRange(src.producer or "?", src.epoch, first, count, reason))
        src.seqs.add(first, count)      # reported once
        src.lost_seqs.add(first, count)  # ... unless the ring later shows them (_retract)
        log.warning("hscapture subscriber: %d events of producer %r (seq %d..%d) are lost: %s",
                    count, src.producer, first, first + count - 1, reason)

    def _retract(self, src: _Source, first: int, count: int) -> None:
        """Numbers reported lost (on a heartbeat's word) turned up in the ring: the report was
        wrong (a forged or stale heartbeat), so take them out of :attr:`lost`."""
        self._error(f"entries {first}..{first + count - 1} of producer {src.producer!r} were "
                    f"reported lost on a heartbeat's word but are in the ring: the heartbeat "
                    f"was forged or stale; the report is corrected", "retracted_losses")
        src.lost_seqs.remove(first, count)
        end = first + count
        kept: list[LostRange] = []
        for x in self.lost:
            if x.epoch != src.epoch or x.first < 0 or x.first + x.count <= first or \
                    x.first >= end:
                kept.append(x)
                continue
            if x.first < first:
                kept.append(LostRange(x.producer, x.epoch, x.first, first - x.first, x.reason))
            if x.first + x.count > end:
                kept.append(LostRange(x.producer, x.epoch, end, x.first + x.count - end,
                                      x.reason))
        self.lost[:] = kept

    # -- the ring ----------------------------------------------------------------------

    def _pump_ring(self, src: _Source, final: bool = False) -> None:
        consumer = src.consumer
        if consumer is None:
            return
        while True:
            record = src.held
            if record is None:
                try:
                    record = consumer.poll()
                except RingError as exc:
                    self._error(f"ring of {src.producer!r} is corrupt: {exc}", "ring_errors")
                    if not src.retired and not final:
                        self._retire(src, f"ring corrupt: {exc}")
                    return
                if record is None:
                    return
            try:
                entry = rec.read_entry(record.payload, payload_len=record.payload_len,
                                       epoch=src.epoch, producer=src.producer, tag=record.tag)
            except NoticeError as exc:
                src.held = None
                self._error(f"ring entry at {record.position} of {src.producer!r}: {exc}",
                            "corrupt_records")
                self._release_to(src)
                continue
            if src.producer is None:
                src.producer = entry.meta["producer"]
                self._current.setdefault(src.producer, src.epoch)
            notice = src.notices.pop(entry.seq, None) if entry.kind != "unheard" else None
            if notice is None and entry.kind != "unheard" and not final and \
                    not self._notice_lost(src, entry.seq, record):
                return   # its notice is on the way: wait (bounded by notice_grace_s)
            src.held = None
            if notice is None and entry.kind != "unheard":
                self._counts["recovered_from_ring"] += 1
            if notice is not None:
                why = rec.notice_mismatches(notice, entry, offset=record.position,
                                            record_seq=record.seq, length=record.payload_len)
                if why:
                    src.seqs.add(entry.seq, entry.n)
                    for row in entry.rows:
                        self._reject((src.epoch, row["rid"]),
                                     f"notice and ring entry disagree: {'; '.join(why)}")
                    self._release_to(src)
                    continue
            if entry.n:
                reported = src.lost_seqs.count(entry.seq, entry.n)
                if src.seqs.add(entry.seq, entry.n) - reported == entry.n:
                    self._counts["duplicate_entries"] += 1
                    self._release_to(src)
                    continue
                if reported:   # the ring has what a heartbeat called lost: the ring wins
                    self._retract(src, entry.seq, entry.n)
            self._on_entry(src, record, entry)
            self._release_to(src)

    def _notice_lost(self, src: _Source, seq: int, record: Any) -> bool:
        """True when the notice of entry ``seq`` will not come (so the entry is used as is)."""
        hb = src.hb or {}
        if seq < src.max_notice_seq or seq < hb.get("next_seq", 0) or src.ended or \
                record.position < src.attach_head or not src.consumer.producer_alive():
            return True   # (an entry from before we (re)attached: its notice went out then)
        now = time.monotonic()
        if src.held is None:
            src.held, src.held_since = record, now
            return False
        return now - src.held_since > self.notice_grace_s

    def _release_to(self, src: _Source) -> None:
        consumer = src.consumer
        if consumer is None:
            return
        limit = consumer.position if src.held is None else src.held.position
        oldest = src.borrowed.oldest()
        if oldest is not None:
            limit = min(limit, oldest)
        if limit > consumer.released:
            consumer.release(limit)

    # -- entries -------------------------------------------------------------------------

    def _on_entry(self, src: _Source, record: Any, entry: Any) -> None:
        kind = entry.kind
        if kind == "batch":
            self._counts["entries"] += 1
            meta = entry.meta
            schema = (tuple(meta["layers"]), tuple(meta["layer_kinds"]), meta["dtype"],
                      meta["hidden"])
            for rv in entry.row_views(record.payload):
                self._on_row(src, record, meta, schema, rv)
        elif kind == "drop":
            for row in entry.rows:
                self._counts["dropped_rows"] += 1
                self._fail((src.epoch, row["rid"]), f"dropped by producer: "
                           f"{entry.meta['reason']}", "dropped")
        elif kind == "abort":
            key = (src.epoch, entry.meta["rid"])
            if entry.meta["restart"]:
                self._counts["restarted"] += 1
                self._pop_partial(key)
            else:
                self._fail(key, f"aborted by producer: {entry.meta['reason']}", "incomplete")
        elif kind == "unheard":
            for row in entry.rows:
                if not src.seqs.seen(row["seq"]):
                    self._fail((src.epoch, row["rid"]), "committed before any subscriber "
                               "attached (start the subscriber first, or use "
                               "Producer(wait_for_subscribers=1))", "dropped")
            if entry.meta["overflow"]:
                self.lost.append(LostRange(src.producer or "?", src.epoch, -1,
                                           entry.meta["overflow"],
                                           "committed before any subscriber attached (not named)"))

    def _on_row(self, src: _Source, record: Any, meta: dict[str, Any], schema: tuple,
                rv: Any) -> None:
        rid = rv.rid
        key = (src.epoch, rid)
        if self.rid_filter is not None and not self.rid_filter(rid):
            self._counts["filtered"] += 1
            return
        if self.skip_rid is not None and self.skip_rid(rid):
            self._counts["already_written"] += 1
            return
        if key in self._failed:
            self._counts["discarded_chunks"] += 1
            return
        p = self._asm.get(key)
        if p is None and rv.token_start == 0 and rv.last:
            self._whole(src, record, meta, schema, [rv], rv.token_count)
            return
        if p is None:
            if rv.cached_prefix and rv.token_start == rv.cached_prefix:
                self._fail(key, f"prefix cache hit: positions [0, {rv.cached_prefix}) were "
                                f"not computed (disable the radix cache or bust it per "
                                f"request)", "incomplete")
                return
            p = self._asm.open(key, schema, {"producer": src.producer, "epoch": src.epoch,
                                             "convention": meta["convention"],
                                             "model": meta["model"], "dp_rank": meta["dp_rank"],
                                             "extra": rv.extra, "cached_prefix": rv.cached_prefix})
        if p.schema != schema:
            self._reject(key, "chunks disagree on layers, kinds, dtype or hidden size")
            return
        start, end = rv.token_start, rv.token_start + rv.token_count
        if any(c.start < end and start < c.start + c.count for c in p.chunks):
            self._reject(key, f"token positions [{start}, {end}) were delivered twice")
            return
        dtype = _TORCH_DTYPES[schema[2]]
        tensors = [_torch_view(rv.layer(i), dtype).clone() for i in range(len(schema[0]))]
        self._asm.add(p, Chunk(start, rv.token_count, tensors, rv.token_ids.copy(),
                               dict(rv.fields), rv.seq))
        if self.name and (not p.holds or p.holds[-1][1] != record.position):
            # durable: keep the chunk's record until the sample is acknowledged, so a crash
            # mid-sample loses nothing (bounded by partial_hold_s and by a quarter of the ring)
            src.borrowed.add(record.position)
            p.holds.append((src, record.position))
            self._bound_partial_holds(src)
        if rv.last:
            p.total = end
        if p.total is not None:
            covered, gaps = p.covered()
            if covered > p.total:
                self._reject(key, f"chunks reach token {covered}, past the last chunk's end "
                                  f"{p.total}")
            elif not gaps and covered == p.total:
                holds = list(p.holds)
                p.holds.clear()          # handed to the sample (durable) or released below
                self._pop_partial(key)
                self._assemble(src, p, holds)
        for victim in self._asm.over_budget():
            self._fail(victim.key, f"partial samples exceeded max_partial_bytes="
                                   f"{self._asm.max_bytes}; missing {victim.describe_gaps()}",
                       "incomplete")

    def _whole(self, src: _Source, record: Any, meta: dict[str, Any], schema: tuple,
               rows: list[Any], total: int) -> None:
        """A sample that came in one row: a borrowed view, or a copy."""
        rv = rows[0]
        if not self._check_expected(src, rv.rid, total):
            return
        dtype = _TORCH_DTYPES[schema[2]]
        names = [layer_name(l, k) for l, k in zip(schema[0], schema[1])]
        borrow = self.zero_copy
        tensors = {n: _torch_view(rv.layer(i), dtype) for i, n in enumerate(names)}
        ids = _torch_view(rv.token_ids, None)
        fields = {k: torch.frombuffer(bytearray(v), dtype=torch.uint8) for k, v in
                  rv.fields.items()}
        if not borrow:
            tensors = {n: t.clone() for n, t in tensors.items()}
            ids = ids.clone()
        sample = Sample(rid=rv.rid, producer_id=src.producer or "", epoch=src.epoch,
                        num_tokens=total, token_ids=ids, tensors=tensors,
                        layers=list(schema[0]), layer_kinds=list(schema[1]), dtype=schema[2],
                        hidden=schema[3],
                        meta={"convention": meta["convention"], "model": meta["model"],
                              "cached_prefix": rv.cached_prefix, "dp_rank": meta["dp_rank"],
                              "extra": rv.extra, "chunks": 1, "seqs": [rv.seq]},
                        fields=fields, borrowed=borrow)
        if borrow or self.name:
            # zero-copy: the views need the record; durable: release() is the acknowledgement
            # (an unreleased sample is delivered again after a restart)
            src.borrowed.add(record.position)
            sample._release = self._releaser([(src, record.position)])
        self._deliver(sample)

    def _assemble(self, src: _Source, p: Partial, holds: list[tuple[Any, int]]) -> None:
        chunks = sorted(p.chunks, key=lambda c: c.start)
        rid = p.key[1]
        total = p.total or 0
        release: Callable[[], None] | None = self._releaser(holds)
        if not self._check_expected(src, rid, total):
            release()
            return
        if not self.name:      # not durable: nothing to acknowledge, give the ring back now
            release()
            release = None
        layers, kinds, dtype, hidden = p.schema
        names = [layer_name(l, k) for l, k in zip(layers, kinds)]
        tensors = {n: torch.cat([c.tensors[i] for c in chunks]) for i, n in enumerate(names)}
        ids = torch.from_numpy(np.concatenate([c.token_ids for c in chunks]))
        fields = {}
        for name in chunks[0].fields:
            if all(name in c.fields for c in chunks):
                fields[name] = torch.frombuffer(bytearray(b"".join(c.fields[name]
                                                                   for c in chunks)),
                                                dtype=torch.uint8)
        meta = dict(p.meta)
        meta.update(chunks=len(chunks), seqs=[c.seq for c in chunks])
        meta.pop("producer", None)
        meta.pop("epoch", None)
        sample = Sample(rid=rid, producer_id=src.producer or "", epoch=src.epoch,
                        num_tokens=total, token_ids=ids, tensors=tensors, layers=list(layers),
                        layer_kinds=list(kinds), dtype=dtype, hidden=hidden, meta=meta,
                        fields=fields, _release=release)
        self._deliver(sample)

    def _check_expected(self, src: _Source, rid: str, total: int) -> bool:
        expected = self._expected.pop(rid, None)
        if expected is not None and expected != total:
            self._reject((src.epoch, rid), f"expected {expected} tokens, found {total}")
            return False
        return True

    def _deliver(self, sample: Sample) -> None:
        self._counts["samples"] += 1
        self._counts["sample_bytes"] += sample.nbytes
        self._ready.append(sample)

    def _releaser(self, holds: list[tuple[Any, int]]) -> Callable[[], None]:
        def release() -> None:
            for src, position in holds:
                src.borrowed.discard(position)
            if not self._closed:
                for src in {id(s): s for s, _ in holds}.values():
                    self._release_to(src)
                    self._maybe_finish(src)
        return release

    # -- failures ------------------------------------------------------------------------

    def _bound_partial_holds(self, src: _Source) -> None:
        """Partials never pin more than a quarter of a ring: past that, the oldest ones stop
        holding (their chunks are copies already; only a crash could then cost them)."""
        consumer = src.consumer
        if consumer is None:
            return
        limit = consumer.capacity // 4
        held = sorted((p.holds[0][1], id(p), p) for p in self._asm.partials.values()
                      if p.holds and p.holds[0][0] is src)
        for first, _, p in held:
            if consumer.position - first <= limit:
                break
            self._counts["partials_unpinned"] += 1
            self._unhold(p)

    def held_fraction(self) -> float:
        """The largest share of any ring this subscriber has read but not released (samples
        not yet acknowledged, partial chunks): a drain flushes early when it grows."""
        out = 0.0
        for src in self._sources.values():
            c = src.consumer
            if c is not None and c.capacity:
                out = max(out, (c.position - c.released) / c.capacity)
        return out

    def _pop_partial(self, key: tuple[int, str]) -> Partial | None:
        p = self._asm.pop(key)
        if p is not None:
            self._unhold(p)
        return p

    def _unhold(self, p: Partial) -> None:
        for src, position in p.holds:
            src.borrowed.discard(position)
            if not self._closed:
                self._release_to(src)
        p.holds.clear()

    def _fail(self, key: tuple[int, str], reason: str, kind: str) -> None:
        self._pop_partial(key)
        self._failed[key] = None
        self._failed.move_to_end(key)
        while len(self._failed) > _MAX_FAILED:
            self._failed.popitem(last=False)
        rid = key[1]
        target = {"dropped": self.dropped, "rejected": self.rejected}.get(kind, self.incomplete)
        target[rid] = reason
        self._counts[f"{kind}_samples"] += 1
        self._expected.pop(rid, None)

    def _reject(self, key: tuple[int, str], why: str) -> None:
        message = str(SampleMismatchError(f"sample {key[1]!r} rejected: {why}"))
        self._error(message, "mismatches")
        self._fail(key, message, "rejected")

    # -- housekeeping ------------------------------------------------------------------

    def _housekeeping(self, now: float) -> None:
        for src in list(self._sources.values()):
            if src.retired:
                continue
            hb = src.hb
            if hb is not None and src.consumer is not None and \
                    src.consumer.position >= hb["head"] and src.held is None:
                for a, b in src.seqs.missing_below(hb["recorded_through"]):
                    self._lost(src, a, b - a, "not recorded: the ring and the producer's "
                                              "backlog were full")
            alive = src.consumer is not None and src.consumer.producer_alive()
            quiet = now - src.last_seen
            if (src.ended and quiet > self.notice_grace_s) or \
                    (not alive and quiet > min(self.producer_timeout_s, 1.0)):
                self._retire(src, "producer stopped before the sample completed")
        for p in self._asm.stale(now - self.partial_hold_s):
            if p.holds:   # its chunks are copies: stop holding the ring for it
                self._counts["partials_unpinned"] += 1
                self._unhold(p)
        for p in self._asm.stale(now - self.incomplete_timeout_s):
            self._fail(p.key, f"no chunk for {self.incomplete_timeout_s:g}s; still missing "
                              f"{p.describe_gaps()}", "incomplete")

    def _shutdown(self, unsubscribe: bool) -> None:
        if self._closed:
            return
        for sample in list(self._ready):
            if sample.borrowed:
                sample.release()
        self._closed = True
        for src in list(self._sources.values()):
            self._detach(src, unsubscribe=unsubscribe)
        self._sock.close(0)
        self._ctx.term()

    def _raise_if_failed(self, rid: str) -> None:
        if rid in self.dropped:
            raise SampleDroppedError(f"sample {rid!r} was dropped: {self.dropped[rid]}")
        if rid in self.rejected:
            raise SampleMismatchError(self.rejected[rid])
        if rid in self.incomplete:
            raise IncompleteSampleError(f"sample {rid!r} is incomplete: {self.incomplete[rid]}")

    def _progress(self, rid: str) -> str:
        parts = [f"[{c.start}, {c.start + c.count})" for k, p in self._asm.partials.items()
                 if k[1] == rid for c in p.chunks]
        return ", ".join(parts) or "none"


def _torch_view(arr: np.ndarray, dtype: torch.dtype | None) -> torch.Tensor:
    """A torch tensor over a (read-only) numpy view of the ring, reinterpreted as ``dtype``.
    torch warns that it cannot protect read-only memory; that is the documented contract of
    a borrowed sample (the mapping itself is read-only), so the warning is silenced here,
    for this call only."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        t = torch.from_numpy(arr)
    return t.view(dtype) if dtype is not None and t.dtype != dtype else t
