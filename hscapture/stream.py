"""Train from a running server: hidden states straight from the ring into a training loop.

``StreamDataset`` is a :class:`torch.utils.data.IterableDataset` over a live
:class:`~hscapture.Subscriber`; :func:`stream` is the same feed as a plain iterator of
:class:`~hscapture.Sample`. Nothing touches disk.

Guarantees (both):

- **Bounded memory, back-pressure to the ring.** The subscriber reads the ring zero-copy: a
  sample received but not yet handed to the trainer is a borrowed view of ring memory, not a
  copy. The feed takes at most ``prefetch`` samples out of the subscriber ahead of the one it
  hands out (``max_buffered`` records the high-water mark) and pumps the subscriber only
  when it has room. A trainer slower than the server therefore leaves the ring full; the
  producer then waits or drops (its ``full_policy``), and every drop reaches :meth:`report`
  by rid. The trainer's memory holds the samples it holds, never a backlog.
- **Exactly once or reported.** Every sample handed out is complete and verified (see
  :class:`~hscapture.Subscriber`) and copied out of the ring (it owns its tensors). When the
  feed stops, :meth:`report` names what was not handed out: ``dropped``, ``incomplete``,
  ``rejected`` rids, ``lost`` sequence ranges whose rids can never be known, ``unresolved``
  ranges, ``in_flight`` samples still assembling, ``conflicts`` and ``undelivered`` (samples
  received and verified but not handed out because the feed stopped: with a durable
  ``name`` they are NOT acknowledged and the next subscriber of that name receives them;
  without one, also the samples committed before the stop and still unread in the ring,
  named without their data being read: :meth:`Subscriber.skim_unread`).
  With a durable ``name`` this holds across a crash of the trainer's process too: each
  failure is logged by rid (a warning) as soon as the feed learns of it (within
  :data:`NAME_FAILURES_S` while it waits) and only then acknowledged; one not logged yet is
  read again and reported by the next stream of the name. A sample
  is acknowledged as it is handed out (``device="cpu"``), or once its copy to the GPU has
  completed (``device="cuda"``: a crash before that hands it out again). An acknowledged
  sample is never handed out again. The samples taken out of the subscriber but not handed
  out (up to ``prefetch``) go to the next subscriber of the name
  (tests/test_stream_durable.py, CPU).
- **Clean shutdown.** The subscriber is closed when the feed stops (``max_samples`` reached,
  ``idle_timeout_s`` without a sample), when :meth:`close` is called, or when the iterator is
  garbage collected. A durable subscription keeps its place (``close``, not ``unsubscribe``).
- **Straight onto the GPU** (``device="cuda[:N]"``). Samples arrive as tensors already on that
  device, copied from the ring's zero-copy views with ``non_blocking`` host-to-device copies
  on a dedicated copy stream. The consumer registers each ring's mapping with CUDA once
  (``cudaHostRegister``, read-only) when it first copies from it and unregisters it before
  the ring is unmapped; where registration fails it warns once per ring and copies through
  a pinned staging buffer instead (one extra host copy). The ring slot of a sample is
  released (for a durable ``name``: acknowledged) only after the sample was handed out AND a
  CUDA event recorded after its copies has completed; the iterator polls that event
  (``event.query()``) and never synchronizes the training stream. The tensors handed out are
  safe to use on the stream that was current on that device when ``next()`` returned them
  (that stream waits for the copy stream's event, and ``record_stream`` keeps the memory
  from being reused before the work queued on it is done); on another stream, order it
  yourself (``other.wait_stream(torch.cuda.current_stream())``). At most ``prefetch``
  samples are held out of the ring at once: copied or being copied and not handed out, plus
  handed out with their copy still running (at ``prefetch`` held, nothing more is taken);
  when it has nothing to hand out, the iterator first waits for the running copies' events
  (a wait on the copy stream only) and gives their slots back, so a producer waiting for
  ring space never waits for a copy that has finished. A sample's tensors are contiguous and
  share one device allocation; a copy that fails stops the feed (``stopped="copy_failed"``,
  the sample reported undelivered) and raises. ``device="cpu"`` (or None) hands out owned
  host copies.
- **DataLoader workers are refused.** One subscriber cannot be shared across processes, and
  splitting one producer's stream between workers would need a split the ring does not have.
  Iterating a :class:`StreamDataset` inside a DataLoader worker (``num_workers > 0``) raises
  :class:`~hscapture.errors.CaptureConfigError`; use ``num_workers=0`` (the stream is already
  asynchronous: the server produces while the trainer computes).
"""

from __future__ import annotations

import collections
import ctypes
import logging
import sys
import time
import types
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
from torch.utils.data import IterableDataset, get_worker_info

from .errors import CaptureConfigError
from .record import ENDED
from .sample import Sample
from .subscriber import Subscriber

log = logging.getLogger("hscapture")

__all__ = ["StreamDataset", "SampleStream", "stream", "sample_to_dict", "resolve_device"]

#: the keys of :meth:`SampleStream.report`
#: how long (seconds) a durable feed waiting for a sample goes without naming the failures
#: it learnt meanwhile (their records are held for a resumer until then: partial_hold_s)
NAME_FAILURES_S = 0.25

REPORT_KEYS = ("delivered", "stopped", "dropped", "incomplete", "rejected", "lost",
               "unresolved", "in_flight", "conflicts", "undelivered")


def _empty_report() -> dict[str, Any]:
    return {k: ([] if k in ("lost", "unresolved", "undelivered") else
                0 if k == "delivered" else None if k == "stopped" else {}) for k in REPORT_KEYS}


def sample_to_dict(sample: Sample) -> dict[str, Any]:
    """One sample as a dict of tensors: ``input_ids`` (int64 ``[T]``), every captured layer by
    its name (``layer_{L}``, ``final_norm``, ...; ``[T, H]``), every per-token field by its
    name (``loss_mask`` when the sample has one: int64 ``[T]``, the dtype trainers use),
    ``rid`` (str) and, when the client attached per-sample metadata, ``meta`` (its dict,
    ``sample.extra["meta"]``). A field whose name is taken by one of those keys or a layer is
    ``field.{name}`` instead (nothing is overwritten). The tensors are the sample's own (not
    views of the ring)."""
    out: dict[str, Any] = {"rid": sample.rid, "input_ids": sample.token_ids.to(torch.int64)}
    out.update(sample.tensors)
    meta = sample.extra.get("meta")
    taken = set(out) | ({"meta"} if isinstance(meta, dict) else set())
    for name, value in sample.fields.items():
        out[f"field.{name}" if name in taken else name] = \
            value.to(torch.int64) if name == "loss_mask" else value
    if isinstance(meta, dict):
        out["meta"] = meta
    return out


# -- device= ------------------------------------------------------------------------------------

def resolve_device(device: str | torch.device | None) -> torch.device | None:
    """The device a stream hands its samples out on: None (and ``"cpu"``) for owned host
    copies, else a ``torch.device("cuda", index)`` that exists here. Anything else raises
    :class:`~hscapture.errors.CaptureConfigError` saying what was expected and found."""
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise CaptureConfigError(f"device: expected None, 'cpu', 'cuda' or 'cuda:N', found "
                                 f"{device!r} ({exc})") from None
    if dev.type == "cpu":
        return None
    if dev.type != "cuda":
        raise CaptureConfigError(f"device: expected None, 'cpu', 'cuda' or 'cuda:N', found "
                                 f"{device!r} (device type {dev.type!r} is not supported)")
    if not torch.cuda.is_available():
        raise CaptureConfigError(f"device={device!r}: expected a usable CUDA device, found "
                                 f"none (torch.cuda.is_available() is False)")
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if not 0 <= index < count:
        raise CaptureConfigError(f"device={device!r}: expected a CUDA device index in "
                                 f"0..{count - 1}, found {index}")
    return torch.device("cuda", index)


#: cudaHostRegisterPortable | cudaHostRegisterReadOnly (a consumer maps the data read-only)
_REGISTER_FLAGS = (1 | 8, 1)
#: cudaErrorHostMemoryAlreadyRegistered: the range is registered already in this process
_ALREADY_REGISTERED = 712


def register_ring(address: int, size: int) -> Any:
    """Register ``[address, address+size)`` (a ring's read-only data region) with CUDA.

    Returns a handle with ``close()`` (unregisters; a no-op where the range was registered
    already by someone else in this process, e.g. a producer sharing the mapping), or None
    after warning once (RuntimeWarning) that copies from this ring go through a pinned
    staging buffer. The failed call's CUDA error is cleared so that no later kernel launch
    reports it."""
    from .pinning import HostRegistration, _clear_last_cuda_error

    cudart = torch.cuda.cudart()
    detail = "no attempt"
    for flags in _REGISTER_FLAGS:
        try:
            err = cudart.cudaHostRegister(address, size, flags)
            code = int(getattr(err, "value", err))
        except Exception as exc:  # pragma: no cover - depends on the CUDA runtime
            code, detail = -1, f"{type(exc).__name__}: {exc}"
        else:
            detail = f"cudaError {code} with flags {flags}"
        if code == 0:
            log.debug("stream: registered %d bytes of ring memory with CUDA (flags %d)",
                      size, flags)
            return HostRegistration(address, size)
        _clear_last_cuda_error()
        if code == _ALREADY_REGISTERED:
            return HostRegistration(address, 0)     # usable, not ours to unregister
    warnings.warn(
        f"hscapture stream: cudaHostRegister of the ring's mapping ({size} bytes at "
        f"{address:#x}) failed ({detail}); copying its samples through a pinned staging "
        f"buffer instead (one extra host copy per sample)", RuntimeWarning, stacklevel=2)
    return None


#: gap (bytes) between two host ranges up to which one copy covers both (cheaper than two)
_MERGE_GAP = 128 << 10
#: alignment of every piece inside a sample's device buffer (>= any element size)
_ALIGN = 256


@dataclass
class _Plan:
    """How one sample's host tensors land in one flat device buffer of ``total`` bytes.

    ``spans``: ``(host_address, nbytes, offset)`` ranges copied straight from registered ring
    memory; ``staged``: ``(index, offset)`` tensors copied (contiguous) into a pinned buffer
    of ``staged_bytes`` at ``staged_base`` first; ``places[i]``: the byte offset in the buffer
    where tensor ``i`` (with its host strides; ``direct[i]``) or its contiguous copy starts."""

    spans: list[tuple[int, int, int]]
    staged: list[tuple[int, int]]
    staged_base: int
    staged_bytes: int
    total: int
    places: list[int]
    direct: list[bool]


def _up(n: int, a: int = _ALIGN) -> int:
    return (n + a - 1) // a * a


def _extent(t: torch.Tensor) -> int:
    """Bytes from ``t.data_ptr()`` to the end of its last element (non-negative strides)."""
    return (sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * t.element_size()


def plan_copy(host: Sequence[torch.Tensor], region: tuple[int, int] | None) -> _Plan:
    """Lay out ``host`` tensors in one device buffer: those inside ``region`` (registered ring
    memory) are covered by as few straight copies as possible (overlapping or nearly adjacent
    byte ranges merged; strided layer views of one block become one copy of the block's rows),
    the others are staged. Pure arithmetic on addresses (tested without CUDA)."""
    lo, hi = region if region is not None else (0, 0)
    ranges: list[tuple[int, int, int]] = []
    staged_idx: list[int] = []
    for i, t in enumerate(host):
        if t.numel() == 0:
            staged_idx.append(i)
            continue
        ptr = t.data_ptr()
        end = ptr + _extent(t)
        if lo <= ptr and end <= hi and ptr % t.element_size() == 0 and \
                all(s >= 0 for s in t.stride()):
            ranges.append((ptr, end, i))
        else:
            staged_idx.append(i)
    ranges.sort()
    spans: list[tuple[int, int, int]] = []
    places = [0] * len(host)
    direct = [False] * len(host)
    offset = 0
    k = 0
    while k < len(ranges):
        start = ranges[k][0] // 64 * 64         # host and device agree modulo 64
        end = ranges[k][1]
        members = [ranges[k]]
        k += 1
        while k < len(ranges) and ranges[k][0] <= end + _MERGE_GAP:
            end = max(end, ranges[k][1])
            members.append(ranges[k])
            k += 1
        end = min(_up(end, 64), hi)
        spans.append((start, end - start, offset))
        for ptr, _, i in members:
            places[i] = offset + (ptr - start)
            direct[i] = True
        offset = _up(offset + end - start)
    staged_base = offset
    staged: list[tuple[int, int]] = []
    for i in staged_idx:
        t = host[i]
        places[i] = offset
        staged.append((i, offset - staged_base))
        offset = _up(offset + t.numel() * t.element_size())
    return _Plan(spans, staged, staged_base, offset - staged_base, max(offset, _ALIGN),
                 places, direct)


def _host_bytes(address: int, nbytes: int) -> torch.Tensor:
    """A uint8 CPU tensor over ``nbytes`` of mapped memory at ``address`` (read it only; valid
    while the mapping is)."""
    return torch.frombuffer((ctypes.c_ubyte * nbytes).from_address(address), dtype=torch.uint8)


def run_plan(plan: _Plan, host: Sequence[torch.Tensor], flat: torch.Tensor,
             pinned: torch.Tensor | None) -> list[torch.Tensor]:
    """Fill ``flat`` (the sample's buffer, on its device) as ``plan`` says and return the
    tensors, contiguous, in ``host`` order. Straight copies are ``non_blocking`` (on CUDA: on
    the current stream); staged tensors are copied into ``pinned`` (or, without one, a plain
    host buffer) first. On CPU ``flat`` this is a plain copy (the tests check the layout)."""
    for address, nbytes, off in plan.spans:
        flat[off:off + nbytes].copy_(_host_bytes(address, nbytes), non_blocking=True)
    if plan.staged:
        stage = pinned if pinned is not None else torch.empty(plan.staged_bytes,
                                                              dtype=torch.uint8)
        for i, off in plan.staged:
            t = host[i]
            n = t.numel() * t.element_size()
            if n:
                stage[off:off + n].view(t.dtype).view(t.shape).copy_(t)
        b = plan.staged_base
        flat[b:b + plan.staged_bytes].copy_(stage[:plan.staged_bytes], non_blocking=True)
    out = []
    for i, t in enumerate(host):
        typed = flat.view(t.dtype)
        esize = t.element_size()
        if plan.direct[i]:
            v = torch.as_strided(typed, t.shape, t.stride(), plan.places[i] // esize)
            out.append(v if v.is_contiguous() else v.contiguous())
        else:
            n = t.numel()
            start = plan.places[i] // esize
            out.append(typed[start:start + n].view(t.shape))
    return out


class _DeviceCopier:
    """Copies samples onto one CUDA device on its own stream (see the module docstring).

    Guarantees: :meth:`copy` never blocks on the device; the returned event completes only
    when every byte of the sample is on the device; ring memory is registered once per ring
    (``register=False``: never, every sample is staged) and unregistered through the ring's
    ``on_detach`` hook before it is unmapped."""

    def __init__(self, device: torch.device, *, register: bool = True) -> None:
        self.device = device
        self.register = register
        self.stream = torch.cuda.Stream(device)
        self._pins: dict[int, tuple[Any, tuple[int, int] | None]] = {}   # by id(source)
        self.staged_samples = 0     # samples (part) staged through pinned host memory
        self.copied_bytes = 0       # bytes put on the device

    def region(self, sub: Subscriber, sample: Sample) -> tuple[int, int] | None:
        """The registered ``[lo, hi)`` of the ring ``sample`` borrows from, if any."""
        if not sample.borrowed or not self.register:
            return None
        src = sub._sources.get(sample.epoch)
        if src is None:
            return None
        got = self._pins.get(id(src))
        if got is not None and got[0] is src:
            return got[1]
        where = src.data_region()
        if where is None:
            return None
        reg = register_ring(*where)
        span = None if reg is None else (where[0], where[0] + where[1])
        self._pins[id(src)] = (src, span)
        key = id(src)

        def unregister() -> None:
            # whoever detaches the ring (a stop, a retirement, a refused incarnation), no
            # copy still reads it when it is unregistered and unmapped
            self._pins.pop(key, None)
            if reg is not None:
                self.stream.synchronize()
                reg.close()
        src.on_detach.append(unregister)
        return span

    def copy(self, sub: Subscriber, sample: Sample) -> tuple[Sample, torch.cuda.Event]:
        """Issue the copies of ``sample`` (host or ring memory) to the device; returns the
        device sample (its tensors must not be used before ``event`` on another stream) and
        the event recorded after the copies on the copy stream."""
        names = list(sample.tensors)
        fields = list(sample.fields)
        host = [sample.tensors[n] for n in names] + [sample.token_ids] + \
            [sample.fields[n] for n in fields]
        plan = plan_copy(host, self.region(sub, sample))
        pinned = None
        if plan.staged_bytes:
            self.staged_samples += 1
            pinned = torch.empty(plan.staged_bytes, dtype=torch.uint8, pin_memory=True)
        with torch.cuda.stream(self.stream):
            flat = torch.empty(plan.total, dtype=torch.uint8, device=self.device)
            out = run_plan(plan, host, flat, pinned)
            event = torch.cuda.Event()
            event.record(self.stream)
        self.copied_bytes += sum(n for _, n, _ in plan.spans) + plan.staged_bytes
        L = len(names)
        dev = Sample(rid=sample.rid, producer_id=sample.producer_id, epoch=sample.epoch,
                     num_tokens=sample.num_tokens, token_ids=out[L],
                     tensors=dict(zip(names, out[:L])), layers=list(sample.layers),
                     layer_kinds=list(sample.layer_kinds), dtype=sample.dtype,
                     hidden=sample.hidden, meta=dict(sample.meta),
                     fields=dict(zip(fields, out[L + 1:])))
        return dev, event

    def hand_out(self, dev: Sample, event: torch.cuda.Event) -> None:
        """Make ``dev`` safe on the device's current stream: it waits for ``event`` (no host
        wait) and the allocator keeps the memory until the work queued on it is done."""
        current = torch.cuda.current_stream(self.device)
        current.wait_event(event)
        for t in (*dev.tensors.values(), dev.token_ids, *dev.fields.values()):
            t.record_stream(current)

    def close(self) -> None:
        """Wait for every copy issued (a wait on the copy stream only)."""
        self.stream.synchronize()


class SampleStream:
    """An iterator of owned, verified :class:`Sample` from live producers (see the module
    docstring for its guarantees). Stops after ``max_samples`` samples, or after
    ``idle_timeout_s`` seconds without one (``None``: wait for ever). With ``device="cuda[:N]"``
    every sample's tensors are on that device (see "Straight onto the GPU" in the module
    docstring); ``device="cpu"`` or None: owned host copies. An invalid ``device`` raises
    :class:`~hscapture.errors.CaptureConfigError` before anything is attached."""

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        name: str = "",
        max_samples: int | None = None,
        idle_timeout_s: float | None = 30.0,
        prefetch: int = 8,
        device: str | torch.device | None = None,
        **subscriber_kw: Any,
    ) -> None:
        self._sub: Subscriber | None = None
        self._copier: _DeviceCopier | None = None
        if prefetch < 1:
            raise CaptureConfigError(f"prefetch: expected at least 1 sample, found {prefetch}")
        register = bool(subscriber_kw.pop("_register_rings", True))
        self.device = resolve_device(device)
        if max_samples is not None and max_samples < 0:
            raise CaptureConfigError(f"max_samples: expected >= 0 or None, found {max_samples}")
        if idle_timeout_s is not None and idle_timeout_s < 0:
            raise CaptureConfigError(
                f"idle_timeout_s: expected >= 0 seconds or None, found {idle_timeout_s}")
        if "zero_copy" in subscriber_kw:
            raise CaptureConfigError(
                "zero_copy: a stream always reads the ring zero-copy (that is how back-pressure "
                "reaches it) and hands out owned copies; do not pass it")
        self.max_samples = max_samples
        self.idle_timeout_s = idle_timeout_s
        self.prefetch = int(prefetch)
        self.delivered = 0
        #: handed out but not used (StreamDataset's transform raised on it): named undelivered
        self._unused: list[str] = []
        #: the most samples this feed ever held taken out of the subscriber but not handed out
        self.max_buffered = 0
        #: the most samples this feed ever held out of the ring at once (<= ``prefetch``):
        #: not handed out, or (device=) handed out with their copy still running
        self.max_held = 0
        self.stopped: str | None = None
        # host: borrowed samples; device: (borrowed sample, device sample, copy event)
        self._buffer: collections.deque[Any] = collections.deque()
        # device: handed out, their ring slot kept until the copy event completes
        self._releasing: collections.deque[tuple[Sample, Any]] = collections.deque()
        self._report: dict[str, Any] | None = None
        #: durable: the failures logged (and acknowledged) so far (:meth:`_name_failures`)
        self._named = 0
        if self.device is not None:
            self._copier = _DeviceCopier(self.device, register=register)
        self._sub = Subscriber(endpoints, name=name, zero_copy=True, **subscriber_kw)

    @property
    def subscriber(self) -> Subscriber | None:
        """The live subscriber (None once the stream stopped)."""
        return self._sub

    @property
    def buffered(self) -> int:
        """Samples taken out of the subscriber and not yet handed out (never > ``prefetch``)."""
        return len(self._buffer)

    @property
    def held(self) -> int:
        """Samples holding ring space now: :attr:`buffered` plus (device=) those handed out
        whose copy has not completed yet (never > ``prefetch``)."""
        return len(self._buffer) + len(self._releasing)

    def __iter__(self) -> "SampleStream":
        return self

    def __next__(self) -> Sample:
        sub = self._sub
        if sub is None:
            raise StopIteration
        if self.max_samples is not None and self.delivered >= self.max_samples:
            self._stop("max_samples")
            raise StopIteration
        self._reap()
        self._top_up(sub)
        self._name_failures(sub)
        if not self._buffer and self._releasing:
            # nothing to hand out: give every slot back before waiting for the producer (it
            # may be waiting for ring space itself); a wait on the copy stream only
            while self._releasing:
                self._wait_oldest()
            self._top_up(sub)
        if not self._buffer:
            timeout = 1e9 if self.idle_timeout_s is None else self.idle_timeout_s
            sample = self._poll(sub, timeout)
            if sample is None:
                self._stop("idle_timeout")
                raise StopIteration
            self._take(sub, sample)
        if self._copier is None:
            out = self._buffer.popleft().detach()   # an owned copy; the ring space goes back
        else:
            host, out, event = self._buffer.popleft()
            self._copier.hand_out(out, event)
            if event.query():
                host.release()
            else:
                self._releasing.append((host, event))
        self.delivered += 1
        return out

    def _poll(self, sub: Subscriber, timeout: float) -> Sample | None:
        """``sub.poll(timeout)`` in slices of at most :data:`NAME_FAILURES_S`, naming the
        failures learnt meanwhile after each (a quiet server must not keep them unnamed)."""
        deadline = time.monotonic() + timeout
        while True:
            sample = sub.poll(max(0.0, min(NAME_FAILURES_S, deadline - time.monotonic())))
            self._name_failures(sub)
            if sample is not None or time.monotonic() >= deadline:
                return sample

    def _name_failures(self, sub: Subscriber) -> None:
        """Durable: log every failure learnt since the last call, by rid, then acknowledge
        it (the log is its report; :meth:`report` has it too). Its ring records stay for a
        resumer only until then: until 2026-12-05 a durable feed named its failures only
        when it stopped, while their records went after ``partial_hold_s``, so a trainer
        that crashed later left them named nowhere."""
        if not sub.name:
            return
        new = sub.failures(self._named)
        if not new:
            return
        by_kind: dict[str, list[str]] = {}
        for kind, rid, _reason, _event in new:
            if kind != ENDED:   # (an abort that ended a sample named failed before)
                by_kind.setdefault(kind, []).append(rid)
        for kind, rids in by_kind.items():
            log.warning("hscapture: stream %r: %d sample(s) %s (report()[%r]; acknowledged "
                        "right after this line: the next stream of this name names them "
                        "again only if this one dies first): %s", sub.name,
                        len(rids), kind, kind, ", ".join(rids))
        self._named += len(new)
        sub.acknowledge_failures(self._named)

    def _take(self, sub: Subscriber, sample: Sample) -> None:
        if self._copier is None:
            self._buffer.append(sample)
        else:
            try:
                dev, event = self._copier.copy(sub, sample)
            except BaseException:
                # the feed stops; the sample is reported undelivered (not acknowledged)
                self._buffer.append((sample, None, None))
                self._stop("copy_failed")
                raise
            self._buffer.append((sample, dev, event))
        self.max_buffered = max(self.max_buffered, len(self._buffer))
        self.max_held = max(self.max_held, self.held)

    def _top_up(self, sub: Subscriber) -> None:
        # poll(0) pumps the subscriber only when it has no sample ready: with a full buffer
        # nothing is read, the ring stays occupied and the producer feels it
        while self.held < self.prefetch:
            sample = sub.poll(0.0)
            if sample is None:
                return
            self._take(sub, sample)

    def _reap(self) -> None:
        """Release (acknowledge) handed-out samples whose copy has completed, in order."""
        releasing = self._releasing
        while releasing and releasing[0][1].query():
            releasing.popleft()[0].release()

    def _wait_oldest(self) -> None:
        """Wait for the oldest running copy (its event, on the copy stream) and release it."""
        host, event = self._releasing.popleft()
        event.synchronize()
        host.release()

    def report(self) -> dict[str, Any]:
        """What this feed did and did not hand out (keys :data:`REPORT_KEYS`); a live
        snapshot while it runs, final once it stopped."""
        if self._report is not None:
            return dict(self._report)
        if self._sub is None:
            return _empty_report()
        return self._snapshot(self._sub, self._buffered_rids())

    def _buffered_rids(self) -> list[str]:
        return [(x if self._copier is None else x[0]).rid for x in self._buffer]

    def unused(self, rid: str) -> None:
        """The sample ``rid``, handed out (and acknowledged), never reached its user (a
        transform raised on it): :meth:`report` names it ``undelivered``, not delivered."""
        self._unused.append(rid)
        self.delivered -= 1

    def _snapshot(self, sub: Subscriber, undelivered: list[str]) -> dict[str, Any]:
        st = sub.stats()
        undelivered = self._unused + undelivered
        return {"delivered": self.delivered, "stopped": self.stopped,
                **{k: st[k] for k in ("dropped", "incomplete", "rejected", "lost",
                                      "unresolved", "in_flight", "conflicts")},
                "undelivered": undelivered}

    def close(self) -> None:
        """Stop now: close the subscriber (a durable one keeps its place)."""
        self._stop("closed")

    def _stop(self, why: str) -> None:
        sub, self._sub = self._sub, None
        if sub is None:
            return
        self.stopped = why
        # Take every ready sample into our hands first: closing would release (acknowledge)
        # the subscriber's ready samples; ours stay unacknowledged and are released only after
        # the close, so a durable subscription gets them again.
        ready = sub.stats()["ready"]
        held: list[Sample] = [x if self._copier is None else x[0] for x in self._buffer]
        self._buffer.clear()
        for _ in range(ready):
            sample = sub.poll(0.0)
            if sample is None:
                break
            held.append(sample)
        undelivered = list(dict.fromkeys(s.rid for s in held))
        # an anonymous subscription ends here: what is still unread in the rings is named
        # too (until 2026-12-05 a stream stopped early said nothing of it)
        named = set(undelivered) | set(sub.in_flight())
        undelivered += [r for r in sub.skim_unread() if r not in named]
        self._report = self._snapshot(sub, undelivered)
        self._say_what_was_not_handed_out(why, bool(sub.name))
        if why == "idle_timeout" and not sub.stats().get("attached"):
            # an empty feed that never met a producer is a wrong endpoint or a server
            # without capture, not a quiet server: say so (until 2026-12-05: nothing)
            log.warning("hscapture: stream stopped after %g s without a sample, and no "
                        "producer ever announced itself on %s: is the server running with "
                        "capture on, and is the endpoint right? (`hscapture endpoints "
                        "--live` lists running producers)", self.idle_timeout_s,
                        ", ".join(sub.endpoints))
        if sub.name and why != "garbage_collected":
            # durable: the failures are in the report this feed keeps (report()); their
            # records can go. A crash never gets here: the next stream of the name reads
            # them again. (A feed collected unseen leaves them to that next stream too.)
            sub.acknowledge_failures(len(sub.failures()))
        try:
            if self._copier is not None:
                # no copy may still read a ring when it is unregistered and unmapped; the
                # handed-out samples are acknowledged (delivered), the others are not
                self._copier.close()
                while self._releasing:
                    self._releasing.popleft()[0].release()
        finally:
            try:
                sub.close()
            finally:
                for sample in held:
                    sample.release()

    def _say_what_was_not_handed_out(self, why: str, durable: bool) -> None:
        """Log what the final report names as not handed out. The report alone is not
        enough: a loop that ``break``s or raises drops its iterator, and a feed collected
        that way is read by nobody (until 2026-12-05 its undelivered samples were named only
        there); its failures (dropped, incomplete, ...) are logged too, every rid of them
        when the feed was collected, the first ten otherwise (the report has them all)."""
        rep = self._report or {}
        # handed out and acknowledged, never used (a transform raised on them): gone for
        # good, unlike the others (until 2026-12-05 they were said to come back)
        unused = set(self._unused)
        spent = [r for r in rep.get("undelivered") or [] if r in unused]
        left = [r for r in rep.get("undelivered") or [] if r not in unused]
        # collected, the log is the only place that can name them: every rid
        shown = 1 << 62 if why == "garbage_collected" else 10
        if left:
            log.warning("hscapture: stream stopped (%s) with %d sample(s) not handed out "
                        "(report()['undelivered']%s): %s", why, len(left),
                        "; not acknowledged: the next stream of this name hands them out"
                        if durable else "", _rids(left, shown))
        if spent:
            log.warning("hscapture: %d sample(s) were handed out but never used (the "
                        "transform raised on them; acknowledged: not handed out again): %s",
                        len(spent), _rids(spent, shown))
        # The failures too, at every stop: a durable feed's are acknowledged now (its
        # report is where they are kept), and a loop left by an exception or Ctrl-C may
        # never read that report (until 2026-12-05 they were then named nowhere)
        failed = {k: rep[k] for k in ("dropped", "incomplete", "rejected", "in_flight",
                                       "conflicts") if rep.get(k)}
        for kind, rids in failed.items():
            log.warning("hscapture: stream stopped (%s); %d sample(s) %s (report()[%r]): %s",
                        why, len(rids), kind.replace("_", " "), kind,
                        _rids(list(rids), shown))
        ranges = (rep.get("lost") or []) + (rep.get("unresolved") or [])
        if ranges:
            log.warning("hscapture: stream stopped (%s); %d range(s) of samples lost whose "
                        "rids are unknown: %s", why, len(ranges), ranges[:5])

    def __enter__(self) -> "SampleStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._stop("garbage_collected")
        except Exception:   # interpreter shutdown: nothing left to report to
            pass


def _rids(rids: list[str], shown: int) -> str:
    return ", ".join(rids[:shown]) + (" ..." if len(rids) > shown else "")


def stream(endpoints: str | Sequence[str], **kw: Any) -> SampleStream:
    """``for sample in hscapture.stream(endpoint, max_samples=..., idle_timeout_s=...)``:
    owned, verified samples from live producers; ``.report()`` afterwards says what was not
    seen. ``device="cuda:0"``: the samples' tensors arrive on that GPU (module docstring,
    "Straight onto the GPU"). Keywords: those of :class:`SampleStream` and of
    :class:`~hscapture.Subscriber`."""
    return SampleStream(endpoints, **kw)


class StreamDataset(IterableDataset):
    """A :class:`torch.utils.data.IterableDataset` of samples from live producers.

    Each item is :func:`sample_to_dict` of one sample, passed through ``transform`` when given.
    Each ``iter()`` is one subscription (:class:`SampleStream`) that stops after
    ``max_samples`` samples or ``idle_timeout_s`` seconds without one; a non-durable
    subscription sees only what is captured while it is attached, so pass ``name`` to carry
    the place across iterations and restarts. :meth:`report` describes the latest iteration.
    Use with ``DataLoader(dataset, batch_size=None, num_workers=0)`` (samples differ in
    length: batch them in ``transform`` / ``collate_fn``); ``num_workers > 0`` is refused with
    :class:`~hscapture.errors.CaptureConfigError` (see the module docstring). With
    ``device="cuda[:N]"`` every tensor of every item is on that device, safe on the stream
    current when the item was yielded (module docstring, "Straight onto the GPU"); leave the
    DataLoader's ``pin_memory`` off (there is nothing on the host to pin).
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        name: str = "",
        max_samples: int | None = None,
        idle_timeout_s: float | None = 30.0,
        prefetch: int = 8,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        device: str | torch.device | None = None,
        **subscriber_kw: Any,
    ) -> None:
        super().__init__()
        if prefetch < 1:
            raise CaptureConfigError(f"prefetch: expected at least 1 sample, found {prefetch}")
        resolve_device(device)           # refused here, not at the first iter()
        self.device = device
        self.endpoints = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        self.name = name
        self.max_samples = max_samples
        self.idle_timeout_s = idle_timeout_s
        self.prefetch = prefetch
        self.transform = transform
        self.subscriber_kw = subscriber_kw
        self._feed: SampleStream | None = None
        self._finished: list[dict[str, Any]] = []   # the earlier iterations' final reports

    @property
    def max_buffered(self) -> int:
        """The latest iteration's high-water mark of samples held ahead (<= ``prefetch``)."""
        return self._feed.max_buffered if self._feed is not None else 0

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        if info is not None:
            raise CaptureConfigError(
                f"StreamDataset cannot run in DataLoader worker processes (found worker "
                f"{info.id} of num_workers={info.num_workers}): one subscriber cannot be "
                f"shared across processes; expected DataLoader(..., num_workers=0)")
        if self._feed is not None:
            self._feed.close()
            done = self._feed.report()
            self._finished.append(done)
            unsaid = len(done["undelivered"]) + len(done["in_flight"])
            if unsaid:
                log.warning("hscapture stream: a new iteration ended the previous one with %d "
                            "sample(s) not handed out (StreamDataset.reports() names them)",
                            unsaid)
        feed = SampleStream(self.endpoints, name=self.name, max_samples=self.max_samples,
                            idle_timeout_s=self.idle_timeout_s, prefetch=self.prefetch,
                            device=self.device, **self.subscriber_kw)
        self._feed = feed
        return self._items(feed)

    def _items(self, feed: SampleStream) -> Iterator[Any]:
        try:
            for sample in feed:
                item = sample_to_dict(sample)
                if self.transform is not None:
                    try:
                        item = self.transform(item)
                    except BaseException:
                        feed.unused(sample.rid)   # acknowledged, never used: named
                        raise
                yield item
        finally:
            feed.close()

    def report(self) -> dict[str, Any]:
        """:meth:`SampleStream.report` of the latest iteration (empty before the first)."""
        if self._feed is None:
            return _empty_report()
        return self._feed.report()

    def reports(self) -> list[dict[str, Any]]:
        """The report of every iteration so far, oldest first (the latest live while it
        runs): what an iteration that a new ``iter()`` ended did not hand out stays named
        here."""
        return self._finished + ([self._feed.report()] if self._feed is not None else [])

    def close(self) -> None:
        """Stop the current iteration's subscription, if any."""
        if self._feed is not None:
            self._feed.close()

    def __getstate__(self) -> dict[str, Any]:
        # a live subscriber never travels to another process (DataLoader workers pickle us)
        state = dict(self.__dict__)
        state["_feed"] = None
        return state


class _CallableModule(types.ModuleType):
    """``hscapture.stream`` is both this module and the function: importing the submodule
    (``from hscapture.stream import StreamDataset``) rebinds the package attribute to the
    module, so the module forwards calls to :func:`stream`."""

    def __call__(self, endpoints: str | Sequence[str], **kw: Any) -> SampleStream:
        return stream(endpoints, **kw)


sys.modules[__name__].__class__ = _CallableModule
