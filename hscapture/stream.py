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
  ``name`` they are NOT acknowledged and the next subscriber of that name receives them).
- **Clean shutdown.** The subscriber is closed when the feed stops (``max_samples`` reached,
  ``idle_timeout_s`` without a sample), when :meth:`close` is called, or when the iterator is
  garbage collected. A durable subscription keeps its place (``close``, not ``unsubscribe``).
- **DataLoader workers are refused.** One subscriber cannot be shared across processes, and
  splitting one producer's stream between workers would need a split the ring does not have.
  Iterating a :class:`StreamDataset` inside a DataLoader worker (``num_workers > 0``) raises
  :class:`~hscapture.errors.CaptureConfigError`; use ``num_workers=0`` (the stream is already
  asynchronous: the server produces while the trainer computes).
"""

from __future__ import annotations

import collections
import sys
import types
from typing import Any, Callable, Iterator, Sequence

import torch
from torch.utils.data import IterableDataset, get_worker_info

from .errors import CaptureConfigError
from .sample import Sample
from .subscriber import Subscriber

__all__ = ["StreamDataset", "SampleStream", "stream", "sample_to_dict"]

#: the keys of :meth:`SampleStream.report`
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
    ``sample.extra["meta"]``). The tensors are the sample's own (not views of the ring)."""
    out: dict[str, Any] = {"rid": sample.rid, "input_ids": sample.token_ids.to(torch.int64)}
    out.update(sample.tensors)
    for name, value in sample.fields.items():
        out[name] = value.to(torch.int64) if name == "loss_mask" else value
    meta = sample.extra.get("meta")
    if isinstance(meta, dict):
        out["meta"] = meta
    return out


class SampleStream:
    """An iterator of owned, verified :class:`Sample` from live producers (see the module
    docstring for its guarantees). Stops after ``max_samples`` samples, or after
    ``idle_timeout_s`` seconds without one (``None``: wait for ever)."""

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        name: str = "",
        max_samples: int | None = None,
        idle_timeout_s: float | None = 30.0,
        prefetch: int = 8,
        **subscriber_kw: Any,
    ) -> None:
        if prefetch < 1:
            raise CaptureConfigError(f"prefetch: expected at least 1 sample, found {prefetch}")
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
        #: the most samples this feed ever held taken out of the subscriber but not handed out
        self.max_buffered = 0
        self.stopped: str | None = None
        self._buffer: collections.deque[Sample] = collections.deque()
        self._report: dict[str, Any] | None = None
        self._sub: Subscriber | None = None
        self._sub = Subscriber(endpoints, name=name, zero_copy=True, **subscriber_kw)

    @property
    def subscriber(self) -> Subscriber | None:
        """The live subscriber (None once the stream stopped)."""
        return self._sub

    @property
    def buffered(self) -> int:
        """Samples taken out of the subscriber and not yet handed out (never > ``prefetch``)."""
        return len(self._buffer)

    def __iter__(self) -> "SampleStream":
        return self

    def __next__(self) -> Sample:
        sub = self._sub
        if sub is None:
            raise StopIteration
        if self.max_samples is not None and self.delivered >= self.max_samples:
            self._stop("max_samples")
            raise StopIteration
        self._top_up(sub)
        if not self._buffer:
            timeout = 1e9 if self.idle_timeout_s is None else self.idle_timeout_s
            sample = sub.poll(timeout)
            if sample is None:
                self._stop("idle_timeout")
                raise StopIteration
            self._take(sample)
        sample = self._buffer.popleft().detach()   # an owned copy; the ring space goes back
        self.delivered += 1
        return sample

    def _take(self, sample: Sample) -> None:
        self._buffer.append(sample)
        self.max_buffered = max(self.max_buffered, len(self._buffer))

    def _top_up(self, sub: Subscriber) -> None:
        # poll(0) pumps the subscriber only when it has no sample ready: with a full buffer
        # nothing is read, the ring stays occupied and the producer feels it
        while len(self._buffer) < self.prefetch:
            sample = sub.poll(0.0)
            if sample is None:
                return
            self._take(sample)

    def report(self) -> dict[str, Any]:
        """What this feed did and did not hand out (keys :data:`REPORT_KEYS`); a live
        snapshot while it runs, final once it stopped."""
        if self._report is not None:
            return dict(self._report)
        if self._sub is None:
            return _empty_report()
        return self._snapshot(self._sub, [s.rid for s in self._buffer])

    def _snapshot(self, sub: Subscriber, undelivered: list[str]) -> dict[str, Any]:
        st = sub.stats()
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
        for _ in range(ready):
            sample = sub.poll(0.0)
            if sample is None:
                break
            self._buffer.append(sample)
        self._report = self._snapshot(sub, [s.rid for s in self._buffer])
        try:
            sub.close()
        finally:
            while self._buffer:
                self._buffer.popleft().release()

    def __enter__(self) -> "SampleStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._stop("garbage_collected")
        except Exception:   # interpreter shutdown: nothing left to report to
            pass


def stream(endpoints: str | Sequence[str], **kw: Any) -> SampleStream:
    """``for sample in hscapture.stream(endpoint, max_samples=..., idle_timeout_s=...)``:
    owned, verified samples from live producers; ``.report()`` afterwards says what was not
    seen. Keywords: those of :class:`SampleStream` and of :class:`~hscapture.Subscriber`."""
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
    :class:`~hscapture.errors.CaptureConfigError` (see the module docstring).
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
        **subscriber_kw: Any,
    ) -> None:
        super().__init__()
        if prefetch < 1:
            raise CaptureConfigError(f"prefetch: expected at least 1 sample, found {prefetch}")
        self.endpoints = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        self.name = name
        self.max_samples = max_samples
        self.idle_timeout_s = idle_timeout_s
        self.prefetch = prefetch
        self.transform = transform
        self.subscriber_kw = subscriber_kw
        self._feed: SampleStream | None = None

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
        feed = SampleStream(self.endpoints, name=self.name, max_samples=self.max_samples,
                            idle_timeout_s=self.idle_timeout_s, prefetch=self.prefetch,
                            **self.subscriber_kw)
        self._feed = feed
        return self._items(feed)

    def _items(self, feed: SampleStream) -> Iterator[Any]:
        try:
            for sample in feed:
                item = sample_to_dict(sample)
                yield self.transform(item) if self.transform is not None else item
        finally:
            feed.close()

    def report(self) -> dict[str, Any]:
        """:meth:`SampleStream.report` of the latest iteration (empty before the first)."""
        if self._feed is None:
            return _empty_report()
        return self._feed.report()

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
