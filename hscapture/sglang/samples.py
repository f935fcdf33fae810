"""Per-sample accounting of the SGLang hook: each opted-in request's chunks become one sample,
exactly once, or the sample is reported by rid.

SGLang prefills a long prompt in chunks, one per forward pass, and may retract a request (its
prefill restarts), abort or finish it between chunks, reuse its rid for a new request, or run
it again after it completed (a re-prefill). :class:`SampleTracker` turns each chunk the hook
sees into a wire row, or into nothing, or into a report, and remembers what it needs for the
next chunk:

- a sample of several chunks is followed (:class:`Inflight`) until its last one; a chunk that
  does not start where the previous one ended is reported; a retraction restarts the sample
  (the partial one reported with ``restart=True``, which a subscriber discards quietly); a new
  request with the same rid while the earlier one is in flight reports the earlier sample
  incomplete and starts a new one;
- a completed or failed sample is remembered on its request object (an attribute of this
  tracker's, holding the attempt: as long as the request lives, however many samples came
  after it) and by rid (the newest :data:`MAX_DONE`), so a re-prefill of the same request
  publishes no duplicate while a new request reusing the rid is a new sample;
- a request that stopped between chunks is reported once (:meth:`SampleTracker.sweep`).

Guarantees: a rid is reported at most once per sample (``counted_done`` aside: a batch whose
capture failed after its sample was counted complete); a rid's batched rows are captured
before its report (the ``flush`` callback), so a subscriber sees its chunks, then the report.
The hook owns when these run (the forward's order, its lock); this module owns what they
decide.
"""

from __future__ import annotations

import collections
import itertools
import logging
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ..errors import InvalidRidError
from ..notice import check_rid
from .config import MAX_META_ERROR_CHARS, CaptureConfig, custom_params

__all__ = ["Inflight", "SampleTracker", "MAX_DONE"]

#: completed/failed rids remembered by rid (a report by rid alone, without its request, is
#: not repeated); the request objects themselves carry the mark that suppresses a re-prefill
MAX_DONE = 1 << 16

_trackers = itertools.count()


@dataclass
class Inflight:
    """A sample whose first chunk was captured and whose last one was not yet."""

    attempt: int
    next_start: int
    cached_prefix: int
    ref: Callable[[], Any]
    pending_end: int = 0      # end of the chunk handed to the producer in this forward
    #: the sample's row ``extra`` (attempt, meta), built at its first chunk, reused by the rest
    extra: dict[str, Any] = field(default_factory=dict)
    #: the sample's loss mask (one byte 0/1 per prompt token), checked at its first chunk
    mask: bytes | None = None


def _ref(obj: Any) -> Callable[[], Any]:
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


class SampleTracker:
    """The samples in flight and the done ones, for one hook.

    ``flush(rid)`` captures whatever rows of ``rid`` the hook holds batched (before its
    report); ``abort(rid, reason, restart, attempt)`` reports ``rid`` to the producer (a
    restart: the partial sample is discarded and a new attempt follows). ``counters`` and
    ``log_once(key, level, msg, *args)`` are the hook's."""

    def __init__(self, config: CaptureConfig, counters: "collections.Counter[str]",
                 log_once: Callable[..., None], flush: Callable[[str], None],
                 abort: Callable[[str, str, bool, int], None]) -> None:
        self.config = config
        self.counters = counters
        self._log_once = log_once
        self._flush = flush
        self._abort = abort
        self.inflight: dict[str, Inflight] = {}
        #: rid -> the attempt of samples that completed or failed; for a request that cannot
        #: carry the mark below (no ``__dict__``), ``(attempt, ref to it)`` instead.
        #: In insertion order, the oldest entry evicted first: an OrderedDict, whose oldest
        #: entry is found and removed in O(1). (A plain dict's ``next(iter(d))`` skips every
        #: slot deleted before it: once full, evicting 8 rids a pass cost ~180 us of this
        #: thread.)
        self.done: collections.OrderedDict[str, Any] = collections.OrderedDict()
        #: the attribute a request of a completed or failed sample carries: that sample's
        #: attempt. Whether a request's sample is done is a question about the request object
        #: (a later request reusing the rid is a new sample), answered by the object itself:
        #: no eviction can make a re-prefill of it a duplicate, and remembering it allocates
        #: nothing the cyclic garbage collector tracks (an int in the request's own dict,
        #: where a ``(attempt, weakref)`` per sample kept two tracked objects alive until
        #: MAX_DONE later samples: in a real server, the hook's only net survivors, and ~40 %
        #: of the extra young collections of its captured turns, benchmarks/results/
        #: h200-2026-12-04e). One name per tracker: another hook's mark is not this one's.
        self._mark = f"_hscapture_done_{next(_trackers)}"

    def row(self, req: Any, prefix: int, ext: int, seen: set[str], attempt: int,
            stopping: Any, total: int
            ) -> tuple[dict[str, Any], tuple[str, int, Any, bool]] | None:
        """The wire-form row map for one request chunk and what to do with it after the
        capture, or None (skipped, or failed and reported). The rid rule is checked once per
        sample, at its first chunk (later chunks find the rid in :attr:`inflight`).
        ``attempt``, ``stopping`` and ``total`` are the request's retraction count, finish
        or abort state and prompt length as the pass saw them."""
        rid = req.rid
        st = self.inflight.get(rid) if type(rid) is str else None
        if st is None:
            try:
                rid = check_rid(rid)     # the protocol's one rid rule, at the edge
            except InvalidRidError as exc:
                self.counters["invalid_rids"] += 1
                self._log_once("invalid_rid", logging.ERROR, "hscapture: request %r is not "
                               "captured: %s (further invalid rids are counted)",
                               str(rid)[:80], exc)
                return None
        if stopping is not None:
            # An aborted request runs one last forward on a 1-token stub prompt: never a sample.
            self.fail(rid, attempt, f"request aborted/finished before its last chunk: "
                                    f"{reason_of(stopping)}", req)
            return None
        if ext <= 0:
            return None
        if rid in seen:
            # SGLang refuses a second live request with the same rid; never two rows of one
            # rid in one entry (the subscriber would reject the whole entry)
            self.counters["duplicate_rid_rows_skipped"] += 1
            self._log_once("duplicate_rid", logging.ERROR, "hscapture: two requests with rid "
                           "%r in one batch; the second is not captured", rid)
            return None
        seen.add(rid)
        done = self._done_attempt(rid, req)
        if done is not None:
            self.counters["reprefill_skipped" if attempt > done
                          else "post_complete_rows_skipped"] += 1
            return None
        if rid in self.done:
            del self.done[rid]  # a new request reusing the rid: a new sample
        end = prefix + ext
        if end > total:
            self.fail(rid, attempt, f"chunk [{prefix}, {end}) runs past the request's "
                                    f"{total} tokens", req)
            return None
        is_last = end == total
        custom = custom_params(req)      # read once for the meta and the fields below
        if st is not None:
            st = self._continues(st, rid, attempt, req)
        if st is None:
            if prefix > 0:
                self.counters["cached_prefix_samples"] += 1
                self._log_once("cached_prefix", logging.WARNING,
                               "hscapture: rid %r starts at token %d: a prefix-cache hit, "
                               "positions [0, %d) were not computed and the sample will be "
                               "reported incomplete. Start SGLang with --disable-radix-cache "
                               "(or make each prompt unique) for complete samples.",
                               rid, prefix, prefix)
            cached = prefix
            # custom_params.hscapture_meta is read once per sample, here; a bad one costs the
            # meta (the sample says why in extra["meta_error"]), never the sample
            extra, bad_meta = self.config.sample_extra(req, attempt, custom=custom)
            if bad_meta is not None:
                self.counters["invalid_meta"] += 1
                self._log_once("invalid_meta", logging.WARNING, "hscapture: rid %r is captured "
                               "without its metadata: %s (further invalid metas are counted)",
                               rid, bad_meta)
            # the loss mask too, checked whole once per sample: a bad one costs the mask
            # (the sample says why), never the sample
            mask, bad_mask = self.config.loss_mask_of(req, total, custom=custom) \
                if custom is not None else (None, None)
            if bad_mask is not None:
                extra = {**extra, "mask_error": bad_mask[:MAX_META_ERROR_CHARS]}
                self.counters["invalid_loss_masks"] += 1
                self._log_once("invalid_mask", logging.WARNING, "hscapture: rid %r is "
                               "captured without its loss mask: %s (further invalid masks are "
                               "counted)", rid, bad_mask)
            if not is_last:   # a sample of several chunks: followed until its last one
                self.inflight[rid] = Inflight(attempt=attempt, next_start=prefix,
                                              cached_prefix=prefix, ref=_ref(req),
                                              pending_end=end, extra=extra, mask=mask)
        elif prefix != st.next_start:
            self.fail(rid, attempt, f"chunk starts at token {prefix}, expected "
                                    f"{st.next_start}", req)
            return None
        else:
            cached = st.cached_prefix
            st.pending_end = end
            extra = st.extra
            mask = st.mask
        return ({"rid": rid, "token_start": prefix, "token_count": ext, "last": is_last,
                 "cached_prefix": cached, "extra": extra,
                 "fields": {"loss_mask": mask[prefix:end]} if mask is not None else {}},
                (rid, attempt, req, is_last))

    def _continues(self, st: Inflight, rid: str, attempt: int, req: Any) -> Inflight | None:
        """``st`` if this chunk continues its sample, else None after reporting why not."""
        if st.ref() is not req:
            # The earlier request with this rid stopped mid-sample (aborted or released
            # before a sweep saw it) and a new one reuses the rid (a client's retry): the
            # earlier sample can never complete, so it is reported (not a restart, which a
            # subscriber discards quietly: that lost it without a word until 2026-12-04);
            # the new request's chunks are a new sample, which a subscriber takes from its
            # first row on. (Not remembered as done: that is the new sample's rid now.)
            self.counters["superseded"] += 1
            del self.inflight[rid]
            self._flush(rid)        # (its chunks captured before the report)
            self._abort(rid, "request stopped before its last chunk; a new request reuses "
                             "its rid", False, st.attempt)
            return None
        if st.attempt != attempt:
            # Retracted mid-sample: the partial attempt is discarded, the re-prefill restarts.
            self.counters["restarts"] += 1
            del self.inflight[rid]
            self._flush(rid)        # (its chunks captured before the report)
            self._abort(rid, f"retracted after {st.next_start} tokens (attempt "
                             f"{st.attempt}); re-prefill follows", True, st.attempt)
            return None
        return st

    def settle(self, accepted: list[tuple[str, int, Any, bool]], ok: bool) -> int:
        """The bookkeeping after a capture of ``accepted`` chunks (``ok``: staged or written;
        else dropped and reported by the producer): a sample's last chunk, or any dropped
        one, moves its rid to the done ones; another chunk advances its sample. Returns the
        samples completed."""
        inflight, completed = self.inflight, 0
        for rid, attempt, req, is_last in accepted:
            if not ok or is_last:
                # complete, or dropped (the producer recorded the drop; nothing more of it
                # is published)
                completed += ok
                if inflight:
                    inflight.pop(rid, None)
                self.remember_done(rid, attempt, req)
            else:
                st = inflight.get(rid)
                if st is not None:
                    st.next_start = st.pending_end
        return completed

    def sweep(self, logged: Callable[[], set[int]] | None = None) -> None:
        """Report every request in flight that stopped (or was released) before its last
        chunk. ``logged``: the ids of the requests with a pass in the hook's log, left alone
        (processed later, that pass may hold the last chunk); a released request has none (a
        logged pass keeps it)."""
        held: set[int] | None = None
        for rid, st in list(self.inflight.items()):
            req = st.ref()
            if req is None:
                reason = "request released before its last chunk"
            else:
                stopping = getattr(req, "finished_reason", None) or getattr(req, "to_finish",
                                                                             None)
                if stopping is None:
                    continue
                if logged is not None:
                    if held is None:
                        held = logged()
                    if id(req) in held:
                        continue
                reason = f"request aborted/finished before its last chunk: {reason_of(stopping)}"
            self.fail(rid, st.attempt, reason)

    def fail(self, rid: str, attempt: int, reason: str, req: Any = None,
             counted_done: bool = False) -> None:
        """Report ``rid`` as unable to complete (once), and publish nothing more of it.
        ``counted_done``: report it even though its sample is among the done ones (a batch
        whose capture failed after its bookkeeping counted the sample complete)."""
        if not counted_done and self._reported(rid, req):
            return
        self._flush(rid)            # its chunks captured before the report
        if not counted_done and self._reported(rid, req):
            return                  # that capture dropped or failed: its sample is reported
        st = self.inflight.pop(rid, None)
        if req is None and st is not None:
            req = st.ref()
        self.remember_done(rid, attempt, req)
        self.counters["aborted"] += 1
        self._abort(rid, reason, False, attempt)

    def _reported(self, rid: str, req: Any) -> bool:
        """Whether ``rid``'s sample (``req``'s, where given) is among the done ones."""
        if req is None:
            return rid in self.done
        return self._done_attempt(rid, req) is not None

    def _done_attempt(self, rid: str, req: Any) -> int | None:
        """The attempt of ``req``'s completed or failed sample, or None (``rid``: its rid)."""
        d = getattr(req, "__dict__", None)
        if d is not None:
            return d.get(self._mark)
        got = self.done.get(rid)        # a request that cannot carry the mark
        return got[0] if type(got) is tuple and got[1]() is req else None

    def fail_requests(self, wanted: Iterable[tuple[int, Any]], reason: str) -> None:
        """Report every request of ``wanted`` (``(batch row, Req)`` pairs) with ``reason``.
        A request whose rid breaks the rid rule was never captured (counted at its row):
        nothing to report. One report that fails never keeps the others from being made
        (until 2026-12-05 an invalid rid's report raised and ended the loop: with two of
        them first, a failed pass's valid requests were reported nowhere)."""
        for _, req in wanted:
            rid = req.rid
            if type(rid) is not str or rid not in self.inflight:
                try:
                    rid = check_rid(rid)
                except InvalidRidError:
                    continue
            try:
                self.fail(rid, int(getattr(req, "retraction_count", 0) or 0), reason, req)
            except Exception as exc:   # the next request's report still goes out
                self.counters["errors"] += 1
                self._log_once("fail_report", logging.ERROR, "hscapture: cannot report "
                               "request %r as incomplete (%s): %s: %s", str(rid)[:80], reason,
                               type(exc).__name__, exc)

    def remember_done(self, rid: str, attempt: int, req: Any) -> None:
        """``req``'s sample (``rid``, ``attempt``) completed or failed: marked on the request
        (None: released; a later request reusing the rid is a new sample) and by rid."""
        done = self.done
        if rid in done:
            del done[rid]        # re-inserted: newest last
        value: Any = attempt
        if req is not None:
            d = getattr(req, "__dict__", None)
            if d is not None:
                d[self._mark] = attempt
            else:
                value = (attempt, _ref(req))
        done[rid] = value
        while len(done) > MAX_DONE:
            done.popitem(last=False)    # the oldest


def reason_of(finish: Any) -> str:
    """A request's finish or abort state in words (SGLang's ``BaseFinishReason.to_json``
    where it has one)."""
    try:
        js = finish.to_json()
        return str(js.get("message") or js.get("type") or js)
    except Exception:
        return type(finish).__name__
