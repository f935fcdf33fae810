"""The producer: engine-agnostic capture into the ring, with ZeroMQ notices.

``Producer.capture`` does the reserve → async copy → (publisher thread) commit → notice dance.
It never blocks the caller on the GPU: on CUDA it records an event on the caller's current
stream, copies on a side stream that waits on that event, keeps the sources alive until the
copy's own event completed, and only then commits the ring record and publishes its notice.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import queue
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import zmq

from . import notice as nt
from .endpoint import check_endpoint, claim_endpoint, default_endpoint
from .errors import CaptureConfigError, EndpointError, RecordTooLargeError
from .pinning import register_host_memory
from .ring import segment_name

log = logging.getLogger("hscapture")

__all__ = ["Producer", "FULL_POLICIES"]

FULL_POLICIES = ("drop", "wait")
_RECENT_DROPS = 64


@dataclass
class _Pending:
    """One queue item for the publisher thread."""

    notice: dict[str, Any]
    position: int = -1            # ring position to commit (records only)
    done: Any = None              # torch.cuda.Event recorded after the copy, or None
    keepalive: Any = None         # source tensors kept alive until ``done`` completed


def _dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in nt.DTYPES:
        raise CaptureConfigError(
            f"dtype: expected one of {sorted(nt.DTYPES)}, found {name}")
    return name


def _drop_notice(record: Mapping[str, Any], reason: str) -> dict[str, Any]:
    """The ``drop`` notice that stands in for a record notice whose record never arrives."""
    msg = {k: record[k] for k in ("v", "producer", "epoch", "seq", "rid", "token_start",
                                   "token_count", "last", "dp_rank", "extra")}
    msg.update(kind="drop", reason=reason)
    return msg


def _token_bytes(token_ids: Any, count: int) -> bytes:
    """Token ids as little-endian int32 bytes (a device tensor is copied to the host here:
    engines should pass host-side ids, as SGLang's requests hold them)."""
    if isinstance(token_ids, torch.Tensor):
        arr = token_ids.detach().to("cpu").numpy()
    else:
        arr = np.asarray(token_ids)
    arr = arr.reshape(-1)
    if arr.size != count:
        raise CaptureConfigError(
            f"token_ids: expected {count} ids (one per captured token), found {arr.size}")
    if arr.dtype != np.int32:
        if arr.dtype.kind not in "iu":
            raise CaptureConfigError(f"token_ids: expected integers, found {arr.dtype}")
        if arr.size and (arr.min() < -(2**31) or arr.max() >= 2**31):
            raise CaptureConfigError("token_ids: values do not fit int32")
    return arr.astype("<i4", copy=False).tobytes()


class Producer:
    """Captures hidden states into a shared-memory ring and announces them over ZeroMQ.

    A subscriber that dies keeps its place in the ring for ``dead_consumer_grace_s`` once the
    ring needs that space (captures meanwhile are dropped, or wait under the ``wait`` policy);
    after that it is dropped and the producer goes on as if it had never attached.

    Guarantees:
    - ``capture`` never blocks on the GPU and never synchronizes the caller's stream; with the
      ``drop`` policy it never waits for ring space either (``wait`` waits at most
      ``wait_timeout_s``).
    - A notice is published only after its record's bytes are completely in the ring.
    - Every capture that is not delivered is counted and announced (``drop`` notice with the
      rid), and notices are numbered so subscribers detect any loss.
    - Each Producer is one incarnation with a fresh random epoch and a fresh segment.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        producer_id: str = "default",
        capacity: int = 1 << 30,
        max_consumers: int = 8,
        full_policy: str = "drop",
        wait_timeout_s: float = 0.0,
        model: str | None = None,
        convention: str = "",
        heartbeat_interval_s: float = 0.1,
        dp_rank: int = 0,
        pin: bool = True,
        sndhwm: int = 1_000_000,
        dead_consumer_grace_s: float = 5.0,
    ) -> None:
        from . import _ring

        if full_policy not in FULL_POLICIES:
            raise CaptureConfigError(
                f"full_policy: expected one of {FULL_POLICIES}, found {full_policy!r}")
        self.producer_id = producer_id
        self.endpoint = check_endpoint(endpoint or default_endpoint(producer_id))
        self.full_policy = full_policy
        self.wait_timeout_s = float(wait_timeout_s)
        self.model = model
        self.convention = convention
        self.dp_rank = int(dp_rank)
        self.heartbeat_interval_s = heartbeat_interval_s
        self._claim = claim_endpoint(self.endpoint)   # before anything else is created

        capacity = -(-int(capacity) // 64) * 64   # the ring's record alignment
        self._ring = _ring.Producer(segment_name(producer_id), capacity, int(max_consumers))
        # A dead subscriber keeps its place (its unread records) this long once the ring needs
        # the space, so a restarted drain resumes exactly where it stopped; then it is dropped.
        self._ring.dead_consumer_grace_ns = int(dead_consumer_grace_s * 1e9)
        self.epoch: int = self._ring.epoch
        self.segment: str = self._ring.name
        self._pinned = register_host_memory(self._ring.map_address, self._ring.map_size) \
            if pin else None

        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.SNDHWM, sndhwm)
        self._sock.setsockopt(zmq.LINGER, 2000)
        try:
            self._sock.bind(self.endpoint)
        except zmq.ZMQError as exc:
            self._sock.close(0)
            self._ctx.term()
            if self._pinned is not None:
                self._pinned.close()
            self._ring.close(True)
            self._release_claim()
            raise EndpointError(f"cannot bind {self.endpoint}: {exc}") from exc

        self._lock = threading.Lock()          # reserve order == seq order == queue order
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._next_seq = 0
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._counters = collections.Counter()
        self._recent_drops: collections.deque[list[Any]] = collections.deque(maxlen=_RECENT_DROPS)
        self._closed = False
        self._send({"kind": "hello", "segment": self.segment, "capacity": self._ring.capacity,
                    "pid": os.getpid(), "time_ns": time.time_ns()})
        self._thread = threading.Thread(target=self._publish_loop, name="hscapture-publisher",
                                        daemon=True)
        self._thread.start()
        self._finalizer = weakref.finalize(self, Producer._atexit_close, weakref.ref(self))
        atexit.register(self._finalizer)

    # -- public API --------------------------------------------------------------------

    def capture(
        self,
        rid: str,
        tensors: Sequence[torch.Tensor],
        *,
        layers: Sequence[int],
        layer_kinds: Sequence[str] | None = None,
        token_start: int = 0,
        is_last_chunk: bool = True,
        token_ids: Any,
        cached_prefix: int = 0,
        snapshot: bool = False,
        extra: Mapping[str, Any] | None = None,
    ) -> bool:
        """Capture one chunk of one request: ``tensors[i]`` is layer ``layers[i]``, ``[T, H]``.

        Returns True when the chunk went into the ring (its notice follows once the copy is
        done), False when it was dropped (ring full / too large): the drop is counted and a
        ``drop`` notice names the rid. ``snapshot=True`` means the sources may be overwritten
        once this returns (CUDA graph output buffers): they are first copied on the caller's
        current stream. Raises :class:`CaptureConfigError` for inconsistent arguments.
        """
        if self._closed:
            raise CaptureConfigError("capture() on a closed Producer")
        tensors = list(tensors)
        layers = [int(x) for x in layers]
        kinds = list(layer_kinds) if layer_kinds is not None else ["residual"] * len(layers)
        if not tensors or len(tensors) != len(layers) or len(kinds) != len(layers):
            raise CaptureConfigError(
                f"expected one tensor and one kind per layer: {len(layers)} layers, "
                f"{len(tensors)} tensors, {len(kinds)} kinds")
        first = tensors[0]
        if first.dim() != 2:
            raise CaptureConfigError(f"tensors must be [tokens, hidden], found {tuple(first.shape)}")
        count, hidden = first.shape
        for i, t in enumerate(tensors):
            if t.shape != first.shape or t.dtype != first.dtype or t.device != first.device:
                raise CaptureConfigError(
                    f"tensor {i} (layer {layers[i]}): expected {tuple(first.shape)} "
                    f"{first.dtype} on {first.device}, found {tuple(t.shape)} {t.dtype} "
                    f"on {t.device}")
        if count == 0:
            raise CaptureConfigError("a chunk must hold at least one token")
        if token_start < 0 or cached_prefix < 0 or cached_prefix > token_start + count:
            raise CaptureConfigError(
                f"token_start={token_start}, cached_prefix={cached_prefix}: expected "
                f"0 <= cached_prefix <= token_start + token_count")
        dtype = _dtype_name(first.dtype)
        meta = {
            "v": nt.PROTOCOL_VERSION, "kind": "record", "producer": self.producer_id,
            "epoch": self.epoch, "seq": 0, "rid": str(rid), "token_start": int(token_start),
            "token_count": int(count), "last": bool(is_last_chunk),
            "cached_prefix": int(cached_prefix), "layers": layers, "layer_kinds": kinds,
            "convention": self.convention, "model": self.model or "", "hidden": int(hidden),
            "dtype": dtype,
            "token_ids": _token_bytes(token_ids, count), "tensor_offsets": [],
            "dp_rank": self.dp_rank, "extra": dict(extra or {}),
        }
        with self._lock:
            meta["seq"] = seq = self._next_seq
            self._next_seq += 1
            itemsize = nt.DTYPES[dtype]
            # tensor_offsets depend on the meta's length, which contains them: fix the list's
            # length first (same number of ints, msgpack size depends on magnitude), iterate.
            meta["tensor_offsets"] = [0] * len(tensors)
            while True:  # converges in at most a few rounds: offsets only grow
                blob = nt.encode_embedded(meta)
                offsets, length = nt.payload_layout(len(blob), count, hidden, itemsize,
                                                    len(tensors))
                if offsets == meta["tensor_offsets"]:
                    break
                meta["tensor_offsets"] = offsets
            notice = dict(meta, offset=0, length=length, record_seq=0, segment=self.segment)
            nt.validate(notice)
            position = self._reserve(length, nt.rid_tag(meta["rid"]))
            if position < 0:
                reason = "ring_full" if position == -1 else "record_too_large"
                self._drop_locked(meta, reason, length)
                return False
            try:
                buf = self._ring.payload(position)
                buf[:4] = len(blob).to_bytes(4, "little")
                buf[4:4 + len(blob)] = blob
                done, keepalive = self._copy_into(buf, offsets, tensors, snapshot)
            except Exception as exc:
                self._ring.abort(position)
                self._drop_locked(meta, f"copy_error: {type(exc).__name__}: {exc}", length)
                self._counters["errors"] += 1
                log.exception("hscapture: copy of rid %r into the ring failed", rid)
                return False
            notice["offset"] = position
            notice["record_seq"] = self._ring.record_seq(position)
            self._counters["captured"] += 1
            self._counters["captured_bytes"] += length
            self._queue.put(_Pending(notice, position, done, keepalive))
        return True

    def abort(self, rid: str, reason: str, extra: Mapping[str, Any] | None = None) -> None:
        """Announce that ``rid``'s sample cannot complete (aborted request, failed attempt).

        With ``extra={"restart": True}`` subscribers discard the partial sample quietly
        because a new attempt (e.g. a re-prefill after retraction) follows.
        """
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
            msg = {"v": nt.PROTOCOL_VERSION, "kind": "abort", "producer": self.producer_id,
                   "epoch": self.epoch, "seq": seq, "rid": str(rid), "reason": str(reason),
                   "dp_rank": self.dp_rank, "extra": dict(extra or {})}
            kind = "restart" if msg["extra"].get("restart") else "abort"
            self._recent_drops.append([seq, str(rid), kind, str(reason)])
            self._counters["aborted"] += 1
            self._queue.put(_Pending(msg))

    def stats(self) -> dict[str, Any]:
        """Counters: captured, dropped (and bytes), aborted, errors, plus the ring's own."""
        out = dict(self._counters)
        out.update(ring=self._ring.stats(), epoch=self.epoch, segment=self.segment,
                   endpoint=self.endpoint, next_seq=self._next_seq,
                   pinned=self._pinned is not None)
        return out

    def wait_for_consumers(self, count: int = 1, timeout_s: float = 60.0) -> bool:
        """Wait until ``count`` live subscribers are attached to the ring; False on timeout.

        Captures made before a subscriber attached never reach it: call this first when the
        first samples matter (tests, offline extraction).
        """
        deadline = time.monotonic() + timeout_s
        while self._ring.stats()["live_consumers"] < count:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every capture so far has been committed and announced."""
        deadline = time.monotonic() + timeout_s
        while not self._queue.empty() or self._counters["published"] < self._next_seq:
            if time.monotonic() > deadline:
                raise TimeoutError("Producer.flush: publisher thread did not catch up")
            time.sleep(0.001)

    def close(self) -> None:
        """Publish everything pending, say ``bye``, and remove the segment's name."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join()
        self._sock.close()
        self._ctx.term()
        if self._pinned is not None:
            self._pinned.close()
        self._ring.close(True)
        self._release_claim()
        self._finalizer.detach()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------

    def _release_claim(self) -> None:
        if self._claim is not None:
            os.close(self._claim)
            self._claim = None

    @staticmethod
    def _atexit_close(ref: "weakref.ReferenceType[Producer]") -> None:
        obj = ref()
        if obj is not None:
            try:
                obj.close()
            except Exception:  # pragma: no cover - interpreter shutdown
                pass

    def _reserve(self, length: int, tag: int) -> int:
        """Ring position, -1 when full (after the wait policy), -2 when it can never fit."""
        try:
            position = self._ring.reserve(length, tag)
        except RecordTooLargeError as exc:
            log.warning("hscapture: %s", exc)
            return -2
        if position >= 0 or self.full_policy == "drop":
            return position
        deadline = time.monotonic() + self.wait_timeout_s
        while position < 0 and time.monotonic() < deadline:
            time.sleep(0.0005)
            self._ring.reap()
            position = self._ring.reserve(length, tag)
        return position

    def _drop_locked(self, meta: dict[str, Any], reason: str, length: int) -> None:
        msg = _drop_notice(meta, reason)
        self._counters["dropped"] += 1
        self._counters["dropped_bytes"] += length
        self._recent_drops.append([meta["seq"], meta["rid"], "drop", reason])
        if self._counters["dropped"] == 1 or reason != "ring_full":
            log.warning("hscapture: dropped rid %r (%s, %d bytes); drops are counted and "
                        "announced to subscribers", meta["rid"], reason, length)
        self._queue.put(_Pending(msg))

    def _side_stream(self, device: torch.device) -> "torch.cuda.Stream":
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device=device)
        return stream

    def _copy_into(self, buf: memoryview, offsets: list[int], tensors: list[torch.Tensor],
                   snapshot: bool) -> tuple[Any, Any]:
        """Start copying ``tensors`` into the record; return (done event, keepalive)."""
        count, hidden = tensors[0].shape
        nbytes = count * hidden * tensors[0].element_size()
        if not tensors[0].is_cuda:
            for o, src in zip(offsets, tensors):
                # one memcpy per tensor, straight into the ring
                buf[o:o + nbytes] = src.contiguous().view(torch.uint8).numpy().reshape(-1)
            return None, None
        # offsets are 64-byte aligned, so typed views need no byte reinterpretation
        dsts = [torch.frombuffer(buf, dtype=tensors[0].dtype, count=count * hidden, offset=o)
                .view(count, hidden) for o in offsets]
        device = tensors[0].device
        caller = torch.cuda.current_stream(device)
        if snapshot:
            # The sources may be overwritten after we return (graph buffers): take a copy on
            # the caller's stream, ordered before whatever the caller enqueues next.
            tensors = [torch.stack(tensors)]
            tensors = list(tensors[0].unbind(0))
        ready = torch.cuda.Event()
        ready.record(caller)
        side = self._side_stream(device)
        side.wait_event(ready)      # the copy starts after the forward pass produced the data
        with torch.cuda.stream(side):
            staged = [t if t.is_contiguous() else t.contiguous() for t in tensors]
            for dst, src in zip(dsts, staged):
                dst.copy_(src, non_blocking=True)
            done = torch.cuda.Event()
            done.record(side)
        # Sources and staging buffers stay referenced until ``done`` completed.
        return done, (tensors, staged)

    def _send(self, msg: dict[str, Any]) -> None:
        msg.setdefault("v", nt.PROTOCOL_VERSION)
        msg.setdefault("producer", self.producer_id)
        msg.setdefault("epoch", self.epoch)
        self._sock.send(nt.encode(msg, check=False), copy=True)

    def _heartbeat(self) -> None:
        ring = self._ring.stats()
        self._send({
            "kind": "heartbeat", "next_seq": self._counters["published"],
            "segment": self.segment, "head": int(ring["head"]),
            "committed": int(ring["committed"]), "dropped": self._counters["dropped"],
            "dropped_bytes": self._counters["dropped_bytes"],
            "errors": self._counters["errors"], "recent_drops": list(self._recent_drops),
            "time_ns": time.time_ns()})

    def _publish_loop(self) -> None:
        """Commit records in order once their copies completed, then publish their notices."""
        last_hb = 0.0
        while True:
            now = time.monotonic()
            if now - last_hb >= self.heartbeat_interval_s:
                self._safe(self._heartbeat)
                last_hb = now
            try:
                item = self._queue.get(timeout=self.heartbeat_interval_s)
            except queue.Empty:
                continue
            if item is None:
                break
            self._safe(self._publish, item)
        self._safe(self._heartbeat)
        self._safe(self._send, {"kind": "bye", "next_seq": self._counters["published"],
                                "time_ns": time.time_ns()})

    def _publish(self, item: _Pending) -> None:
        notice = item.notice
        if item.position >= 0:
            try:
                if item.done is not None:
                    item.done.synchronize()  # waits for the side-stream copy only (GIL released)
                # SYNC POINT: commit release-stores the record state; the notice goes out after.
                self._ring.commit(item.position)
            except Exception as exc:   # a failed copy or commit: announce a drop, never a record
                self._counters["errors"] += 1
                log.error("hscapture: record of rid %r could not be committed: %s",
                          notice["rid"], exc)
                with self._lock:
                    try:
                        self._ring.abort(item.position)
                    except Exception:
                        pass
                    self._counters["dropped"] += 1
                    self._recent_drops.append([notice["seq"], notice["rid"], "drop", "commit_error"])
                notice = _drop_notice(notice, f"commit_error: {type(exc).__name__}")
            item.keepalive = None
        self._send(notice)
        self._counters["published"] += 1

    def _safe(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception:  # never let the publisher thread die: count and log once
            self._counters["errors"] += 1
            if self._counters["errors"] == 1:
                log.exception("hscapture: publisher thread error (counted; continuing)")
