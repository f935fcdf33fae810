"""From validated ring entries to delivered samples, and to failure reports.

:class:`Delivery` is the :class:`~hscapture._source.EntrySink` of every source: batch rows
become samples (whole ones at once, chunked ones through :class:`~hscapture._assembly.
Assembler`), drops, aborts and unheard entries fail their samples at once, and every failure
goes to the :class:`~hscapture._ledger.Ledger`. It also decides which ring records a sample
keeps referenced, and gives them back when the sample is released. Two concerns live beside
it: the rows it never reads (unheard entries, entries before its place:
:class:`~hscapture._unread_rows.UnreadRows`) and the records a durable subscriber keeps for
its resumer (:class:`~hscapture._holds.RecordHolds`).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import time
from typing import Any, Callable

from . import record as rec
from ._assembly import Assembler, Chunk, Partial
from ._headless import HeadlessSamples, gone
from ._holds import RecordHolds
from ._unread_rows import UnreadRows
from ._ledger import MAX_SKIPPED, Ledger
from ._ledger import failure_event as _event
from ._sample_tensors import (Shape, copy_view, field_tensors, from_dlpack, joined, row_tensors,
                              sample_meta)
from ._settlement import Settlement
from ._source import Source
from .errors import SampleMismatchError
from .sample import Sample

__all__ = ["Delivery"]

Holds = list[tuple[Source, int]]

# _whole builds each Sample positionally (half the cost of keywords for 14 fields): the order
# it relies on, checked once here so that a reordered dataclass fails at import, not silently
assert [f.name for f in dataclasses.fields(Sample)] == [
    "rid", "producer_id", "epoch", "num_tokens", "token_ids", "tensors", "layers",
    "layer_kinds", "dtype", "hidden", "meta", "fields", "_release", "borrowed"]


class Delivery:
    """Samples out of entries; the rows that cannot become samples are reported by rid.

    Guarantees:
    - A sample is queued in :attr:`ready` only when token positions ``0..N-1`` are each
      present exactly once, every chunk agrees on layers, kinds, dtype and hidden size, and
      the token count matches :meth:`Subscriber.expect <hscapture.Subscriber.expect>` when
      declared; otherwise the rid is rejected, never delivered.
    - A failed ``(epoch, rid)`` is failed once: its partial is dropped and later chunks of
      it are discarded, counted. Its ring records are released at once, except with
      ``durable``: the records that name a failure (a drop or abort entry, the failed
      partial's chunks) stay referenced until the failure is acknowledged
      (:meth:`acknowledge_failures`, after the consumer recorded it), for at most
      ``partial_hold_s`` and a quarter of the ring, so a resumer of a consumer that died
      first reads them again and reports the failure.
    - Samples own their tensors unless ``zero_copy``; a borrowed sample keeps its record
      referenced until released. Non-final chunks are always copied out on arrival; with
      ``durable`` their records stay referenced until the sample is acknowledged
      (``release()``), for at most ``partial_hold_s`` and a quarter of the ring.
    - Partial samples hold at most ``max_partial_bytes``: past it the oldest fail as
      incomplete; a partial without a new chunk for ``incomplete_timeout_s`` fails too.
    """

    def __init__(self, ledger: Ledger, *, zero_copy: bool, durable: bool,
                 rid_filter: Callable[[str], bool] | None,
                 skip_rid: Callable[[str], bool] | None, max_partial_bytes: int,
                 partial_hold_s: float, incomplete_timeout_s: float) -> None:
        self.ledger = ledger
        self.zero_copy = zero_copy
        self.durable = durable
        self.rid_filter = rid_filter
        self.skip_rid = skip_rid
        self.partial_hold_s = partial_hold_s
        self.incomplete_timeout_s = incomplete_timeout_s
        self.asm = Assembler(max_partial_bytes)
        self.ready: collections.deque[Sample] = collections.deque()
        self.expected: dict[str, int] = {}
        self.closed = False
        #: called with a source after a released sample gave some of its records back
        self.on_released: Callable[[Source], None] = lambda src: None
        #: durable: called with ``n`` before the bounds give back the holds of failures
        #: ``failure_log[:n]`` not yet acknowledged (the subscriber records them for a
        #: resumer: :func:`hscapture._subscriptions.record_pending`)
        self.before_unpin: Callable[[int], None] = lambda n: None
        #: durable: the records kept for a resumer (failures not yet acknowledged, an
        #: unheard record while samples are cut): taken, bounded and given back there
        self.holds = RecordHolds(self)
        #: the rows of unheard entries and of entries before our place: samples cut or
        #: reported by rid (:class:`UnreadRows`)
        self.unread = UnreadRows(self)
        #: durable: the settlement of every partial tracked as unsettled, by key
        self._unsettled: dict[tuple[int, str], Settlement] = {}
        #: borrowed (zero-copy) samples handed out and alive: emptied when the subscriber
        #: closes, as its places in the rings go (an anonymous one's records are reused)
        #: (a plain dict, emptied by each sample's release: a borrowed sample must be
        #: released anyway, its record stays referenced until it is)
        self.lent: dict[int, Sample] = {}
        #: durable, resumed: samples met without their start below the inherited
        #: ``delivered``, decided by their last row (GUARANTEES gap 14(a))
        self.headless = HeadlessSamples(self)
        #: :class:`Shape` by schema (an engine has one or two; bounded all the same)
        self._shapes: dict[tuple, Shape] = {}

    # -- entries -------------------------------------------------------------------------

    def on_entry(self, src: Source, record: Any, entry: Any) -> None:
        counts = self.ledger.counts
        kind = entry.kind
        if self.headless and entry.seq >= src.settlement.acknowledged_below:
            self.headless.settle(src)   # their last rows did not come below it
        if kind == "batch":
            counts["entries"] += 1
            self._on_batch(src, record, entry)
        elif kind == "drop":
            failed = len(self.ledger.failure_log)
            for r, row in enumerate(entry.rows):
                counts["dropped_rows"] += 1
                self.drop_row(src, row, entry, r)
            if len(self.ledger.failure_log) > failed:
                self.hold_failure(src, record.position)
        elif kind == "abort":
            if self.abort(src, entry):
                self.hold_failure(src, record.position)
        elif kind == "unheard":
            self.unread.unheard(src, record, entry)

    def of_a_failed_sample(self, src: Source, key: tuple[int, str], token_start: int,
                            cached_prefix: int, seq: int | None = None) -> bool:
        """Whether a row of ``key``'s rid belongs to a sample already reported (nothing of it
        is used or reported again). A row that starts a sample (at token 0, or where its
        cached prefix ends) begins a new one of the rid instead (the SGLang hook publishes
        nothing more of a sample it reported; a client retrying an aborted request reuses
        its rid, which discarding lost without a word until 2026-12-04)."""
        if not self.ledger.has_failed(key):
            return False
        if token_start != 0 and token_start != cached_prefix:
            # the failed sample's later rows; but for a resumed durable place, after an abort
            # numbered below this row, a later attempt's whose start an earlier owner read
            # (a subscriber that read on from the abort saw any retry's start: a row without
            # one is a straggler of the aborted sample, discarded)
            return seq is None or not (self.durable and src.resumed and
                                       self.ledger.ended_before(key, seq))
        at = self.ledger.failed_at(key)
        if seq is not None and at is not None and seq < at:
            # numbered before the row or entry that failed it: the failed sample's own start,
            # read out of order (a drop the producer's backlog wrote late), not a retry (a
            # retry is captured after the failure). Until 2026-12-06 it was taken for a new
            # attempt and its drop reported the rid a second time (fault hunt F3)
            return True
        self.ledger.new_attempt(key)
        return False

    def drop_row(self, src: Source, row: dict[str, Any], entry: Any, r: int) -> None:
        """A dropped chunk (row ``r`` of a drop entry): its sample is reported dropped, once
        (a later dropped chunk of a sample already reported is not named again; one that
        starts a sample is a new one of the rid), unless ``rid_filter`` turns the rid away (not
        ``skip_rid``: a drain still names the failure of a rid it has written)."""
        rid = row["rid"]
        key = (src.epoch, rid)
        if src.cut:
            src.cut.pop(rid, None)
        if self.rid_filter is not None and not self.rid_filter(rid):
            return
        if self.of_a_failed_sample(src, key, row["token_start"], row.get("cached_prefix", 0),
                                    entry.seq + r):
            return
        self.fail(key, f"dropped by producer: {entry.meta['reason']}", "dropped",
                  _event(src, entry.seq + r))

    def abort(self, src: Source, entry: Any) -> bool:
        """An abort entry: a restart discards the sample's rows so far (it is captured again
        from its start); any other abort reports the sample incomplete, once, unless
        ``rid_filter`` turns the rid away or it was reported already (then the abort's end
        of it goes into the failure log for a durable consumer to record:
        :meth:`Ledger.record_end`). Returns whether the failure log grew (the entry is then
        held until acknowledged)."""
        key = (src.epoch, entry.meta["rid"])
        if src.cut:   # its rows before our place: discarded with it, or reported here
            src.cut.pop(key[1], None)
        if entry.meta["restart"]:
            self.ledger.counts["restarted"] += 1
            self.headless.forget(key)
            self.pop_partial(key)
            return False
        reason = f"{rec.ABORTED}: {entry.meta['reason']}"
        if self.rid_filter is not None and not self.rid_filter(key[1]):
            self.ledger.ended(key, entry.seq)
            self.pop_partial(key)
            return False
        if self.ledger.has_failed(key):   # reported already; the end is recorded with it
            self.pop_partial(key)
            return self.ledger.record_end(key, reason, _event(src, entry.seq))
        self.fail(key, reason, "incomplete", _event(src, entry.seq))
        return True

    def _shape(self, meta: dict[str, Any]) -> Shape:
        schema = (tuple(meta["layers"]), tuple(meta["layer_kinds"]), meta["dtype"],
                  meta["hidden"])
        shape = self._shapes.get(schema)
        if shape is None:
            if len(self._shapes) >= 64:
                self._shapes.clear()
            shape = self._shapes[schema] = Shape(schema)
        return shape

    def _on_batch(self, src: Source, record: Any, entry: Any) -> None:
        """Every row of a batch entry, in order, as :meth:`_on_row` takes it. A row that
        ``rid_filter`` and ``skip_rid`` keep and that is a whole sample (from token 0,
        ``last``) of a rid with no partial and no failure goes straight to :meth:`_whole`,
        from the entry's columns and arrays; any other kept row goes through
        :meth:`_on_kept_row` (the decisions :meth:`_on_row` makes, in its order, per row, as
        the state stands when the row is reached)."""
        meta = entry.meta
        shape = self._shape(meta)
        rids, starts, counts, lasts, cached, extras, fields = entry.row_columns()
        filtering = self.rid_filter is not None or self.skip_rid is not None
        failed = self.ledger.failed_keys
        partials = self.asm.partials
        headless = self.headless.keys_held
        epoch, seq = src.epoch, entry.seq
        cut = src.cut          # (rids a restarted producer's ring began before our place)
        caps, slots = None, None
        if not self.zero_copy:
            caps, slots = self._owned_copies(src, record, entry, shape)
        # the entry's views, made when a row needs them (none may: every row copied natively)
        views: tuple[Any, ...] | None = None
        # a row copied natively (a slot) of an anonymous subscriber with nothing expect()ed
        # becomes its Sample here, without _whole's checks, none of which can apply: a slot
        # is only given to a row no earlier owner acknowledged (_owned_copies), and only
        # durable or zero-copy samples keep records. bench_delivery.py on the 2-core CPU
        # machine, this path against _whole for the same rows in one process, 10
        # alternating pairs: 1.09x the samples/s (median; pairs 0.93-1.43)
        lean = slots is not None and not self.durable and not self.expected
        if lean:
            ready_append = self.ready.append
            producer = src.producer or ""
            layer_list, kinds, dtype, hidden = shape.layers, shape.kinds, shape.dtype, \
                shape.hidden
            names, token_bytes = shape.names, shape.token_bytes
            one_layer = names[0] if len(names) == 1 else None
            common = (meta["convention"], meta["model"], meta["dp_rank"])
        r0 = delivered = nbytes = 0
        try:
            for r, rid in enumerate(rids):
                count = counts[r]
                slot = slots[r] if slots is not None else None
                if slot is None and views is None:
                    views = entry.arrays(record.payload)
                if filtering and self._turned_away(rid):
                    pass
                elif lasts[r] and not starts[r] and (epoch, rid) not in partials and \
                        (epoch, rid) not in failed and (not cut or rid not in cut) and \
                        (not headless or (epoch, rid) not in headless):
                    if lean and slot is not None:
                        ready_append(Sample(
                            rid, producer, epoch, count, from_dlpack(caps[slot]),
                            {one_layer: from_dlpack(caps[slot + 1])} if one_layer is not None else
                            {n: from_dlpack(caps[slot + 1 + i]) for i, n in enumerate(names)},
                            list(layer_list), list(kinds), dtype, hidden,
                            sample_meta(common, cached[r], extras[r], seq + r),
                            field_tensors(fields[r]), None, False))
                        delivered += 1
                        nbytes += count * token_bytes
                        r0 += count
                        continue
                    got = self._whole(src, record, meta, shape, rid, seq + r, count, cached[r],
                                      extras[r], fields[r], views, r0, caps, slot)
                    if got:
                        delivered += 1
                        nbytes += got
                else:
                    if views is None:
                        views = entry.arrays(record.payload)
                    ids, _, blocks = views
                    self._on_kept_row(src, record, meta, shape,
                                      rec.RowView(entry.rows[r], seq + r, r0, ids, blocks,
                                                  meta["layer_map"], meta["hidden"]))
                r0 += count
        finally:   # the samples _whole queued, counted once per entry
            if delivered:
                self._count_samples(delivered, nbytes)

    def _owned_copies(self, src: Source, record: Any, entry: Any,
                      shape: Shape) -> tuple[list[Any] | None, Any]:
        """The owned copies of an entry's rows that may become whole samples (from token 0,
        ``last``, not acknowledged by an earlier owner), made in one native call
        (:meth:`Entry.row_capsules <hscapture.record.Entry.row_capsules>`): ``(capsules,
        slots)``, ``slots[r]`` the index of row ``r``'s first capsule (None: not copied);
        ``(None, None)`` where the rows are copied one by one instead. A row that is copied
        and then goes another way (turned away, a failure's new attempt, expect()) leaves its
        copy unused, freed with the list."""
        rids, starts, counts, lasts = entry.row_columns()[:4]
        seq, n = entry.seq, len(rids)
        width = 1 + len(shape.names)
        ack_below = src.settlement.acknowledged_below
        r0s = list(itertools.accumulate(counts, initial=0))
        ahead = src.settlement.ahead   # (empty unless an earlier owner acknowledged ahead)
        if all(lasts) and not any(starts) and seq >= ack_below and not ahead:   # the common one
            ranges = list(itertools.chain.from_iterable(zip(r0s, counts)))
            slots: Any = range(0, n * width, width)
        else:
            ranges, slots = [], [None] * n
            for r in range(n):
                if lasts[r] and not starts[r] and seq + r >= ack_below and \
                        seq + r not in ahead:
                    slots[r] = len(ranges) // 2 * width
                    ranges += (r0s[r], counts[r])
            if not ranges:
                return None, None
        caps = entry.row_capsules(record.payload, ranges)
        return (caps, slots) if caps is not None else (None, None)

    def wants(self, rid: str) -> bool:
        """Whether a row of ``rid`` would be assembled (neither ``rid_filter`` nor
        ``skip_rid`` turns it away)."""
        return (self.rid_filter is None or self.rid_filter(rid)) and \
            (self.skip_rid is None or not self.skip_rid(rid))

    def _on_row(self, src: Source, record: Any, meta: dict[str, Any], shape: Shape,
                rv: Any) -> None:
        """One row of a batch entry (``rv``: its :class:`~hscapture.record.RowView`)."""
        if not self._turned_away(rv.rid):
            self._on_kept_row(src, record, meta, shape, rv)

    def _turned_away(self, rid: str) -> bool:
        """Whether ``rid_filter`` or ``skip_rid`` turns a row of ``rid`` away (counted)."""
        counts = self.ledger.counts
        if self.rid_filter is not None and not self.rid_filter(rid):
            counts["filtered"] += 1
            return True
        if self.skip_rid is not None and self.skip_rid(rid):
            counts["already_written"] += 1
            skipped = self.ledger.skipped
            if rid not in skipped and len(skipped) < MAX_SKIPPED:
                skipped[rid] = None
            return True
        return False

    def _on_kept_row(self, src: Source, record: Any, meta: dict[str, Any], shape: Shape,
                     rv: Any) -> None:
        """A row that neither ``rid_filter`` nor ``skip_rid`` turned away."""
        counts = self.ledger.counts
        schema = shape.schema
        rid = rv.rid
        key = (src.epoch, rid)
        if src.cut and rid in src.cut:
            # a sample whose first rows lay before this subscriber's place in a restarted
            # producer's ring (UnreadRows.unreadable): it can never complete here. Its later
            # rows are discarded; it is reported once its fate is known: at its last row (a
            # restart abort before that forgets it, an abort or a drop reports it), or when
            # its rid begins a new sample (then read as one, below)
            starts = rv.token_start == 0 or rv.token_start == rv.cached_prefix
            if not starts:
                counts["discarded_chunks"] += 1
                if not rv.last:
                    src.cut_seen[rid] = time.monotonic()   # (its incomplete timeout)
                    return
            seq0, why = src.cut.pop(rid)
            self.fail(key, f"{why}; " + ("its rid then began a new sample" if starts else
                                         f"positions from {rv.token_start} on arrived"),
                      "incomplete", _event(src, seq0))
            self.hold_failure(src, record.position)
            if not starts:
                return
        if self.headless and key in self.headless and \
                (rv.token_start == 0 or rv.token_start == rv.cached_prefix):
            self.headless.settle(key=key)   # its rid begins anew: the one held never ended
        if self.of_a_failed_sample(src, key, rv.token_start, rv.cached_prefix, rv.seq):
            counts["discarded_chunks"] += 1     # the failed sample's: nothing of it
            return
        p = self.asm.get(key)
        if p is None and rv.token_start == 0 and rv.last:
            got = self._whole(src, record, meta, shape, rid, rv.seq, rv.token_count,
                              rv.cached_prefix, rv.extra, rv.fields,
                              (rv.token_ids, [rv.layer(i) for i in range(len(shape.names))]), 0)
            if got:
                self._count_samples(1, got)
            return
        if p is None:
            starts = rv.token_start == 0 or rv.token_start == rv.cached_prefix
            if not starts and rv.seq < src.settlement.continuations_below:
                # it continues a sample an earlier owner of this durable place acknowledged
                # (its first rows lie before the place's resume position)
                counts["acknowledged_before"] += 1
                return
            if not starts and self.durable and src.resumed:
                if src.settlement.acked_row(key[1], rv.seq):
                    # of a sample an earlier owner acknowledged out of queue order (its first
                    # rows left the ring): until 2026-12-06 reported incomplete (hunt H20)
                    counts["acknowledged_before"] += 1
                    return
                if self.headless.row(src, record, key, rv):
                    return      # below `delivered`: its last row decides (_headless)
                # its first rows lie before where this resumed place starts (an earlier owner
                # read them, and they left the ring: a partial that stopped pinning it, or a
                # sample read whole but never acknowledged): it can never complete here.
                # Failed now, its record held until the failure is recorded; kept open as a
                # partial, it stopped pinning the ring in its turn, and a resumer killed
                # before the report left the next one nothing of it (until 2026-12-05)
                self.fail(key, gone(src.segment, rv.token_start), "incomplete",
                          _event(src, rv.seq))
                self.hold_failure(src, record.position)
                return
            if rv.cached_prefix and rv.token_start == rv.cached_prefix:
                self.fail(key, f"prefix cache hit: positions [0, {rv.cached_prefix}) were "
                               f"not computed (disable the radix cache or bust it per "
                               f"request)", "incomplete", _event(src, rv.seq))
                return
            p = self.asm.open(key, schema, {"producer": src.producer, "epoch": src.epoch,
                                            "convention": meta["convention"],
                                            "model": meta["model"], "dp_rank": meta["dp_rank"],
                                            "extra": rv.extra, "cached_prefix": rv.cached_prefix})
            if not starts and self.durable:
                # a resumer might find this partial's later rows without this one
                self._track(src, key, rv.seq)
        if p.schema != schema:
            self.reject(key, "chunks disagree on layers, kinds, dtype or hidden size",
                        _event(src, rv.seq))
            return
        start, end = rv.token_start, rv.token_start + rv.token_count
        if any(c.start < end and start < c.start + c.count for c in p.chunks):
            self.reject(key, f"token positions [{start}, {end}) were delivered twice",
                        _event(src, rv.seq))
            return
        # numpy copies (single-threaded memcpy), see copy_view
        tensors = [copy_view(rv.layer(i)) for i in range(len(schema[0]))]
        self.asm.add(p, Chunk(start, rv.token_count, tensors, rv.token_ids.copy(),
                              dict(rv.fields), rv.seq))
        held = self.durable and (not p.holds or p.holds[-1][1] != record.position)
        if held:
            # durable: keep the chunk's record until the sample is acknowledged, so a crash
            # mid-sample loses nothing (bounded by partial_hold_s and by a quarter of the ring)
            src.borrowed.add(record.position)
            p.holds.append((src, record.position))
        if rv.last:
            p.total = end
        if p.total is not None:
            covered, gaps = p.covered()
            if covered > p.total:
                self.reject(key, f"chunks reach token {covered}, past the last chunk's end "
                                 f"{p.total}", _event(src, rv.seq))
            elif not gaps and covered == p.total:
                holds = list(p.holds)
                p.holds.clear()          # handed to the sample (durable) or released below
                self.pop_partial(key)
                self._assemble(src, p, holds)
        if held:
            # only partials still open: a sample this row completed keeps every record it
            # holds until it is acknowledged, at least this row's. Bounded before the check,
            # a completing row over a quarter of the ring was given back with the rest, and
            # a drain killed before the sample was durable left a resumer no row of it: lost
            # without a word (until 2026-12-05). Now a resumer finds that row and reports
            # the sample (its earlier rows may be gone: known gap 1 of docs/GUARANTEES.md).
            self._bound_partial_holds(src)
        for victim in self.asm.over_budget():
            self.fail(victim.key, f"partial samples exceeded max_partial_bytes="
                                  f"{self.asm.max_bytes}; missing {victim.describe_gaps()}",
                      "incomplete")

    # -- samples ---------------------------------------------------------------------------

    def _whole(self, src: Source, record: Any, meta: dict[str, Any], shape: Shape, rid: str,
               seq: int, total: int, cached_prefix: int, extra: dict[str, Any],
               fields: dict[str, bytes], views: tuple[Any, ...] | None, r0: int,
               caps: list[Any] | None = None, slot: int | None = None) -> int:
        """A sample that came in one row (``seq``): tokens ``[r0, r0 + total)`` of ``views``
        (``(ids, layers, ...)``: the token ids and one array per layer, ``[tokens, hidden]``);
        a borrowed view, or a copy: ``caps[slot:]`` when ``slot`` is given (the row's owned
        copies, :meth:`_owned_copies`; ``views`` may then be None), else of ``views``.
        Returns its payload bytes once it is queued in :attr:`ready` (the caller counts it:
        :meth:`_count_samples`), 0 when it is not."""
        if self.expected and not self._check_expected(src, rid, total, seq):
            # rejected, whatever an earlier owner acknowledged (a rejected sample has no
            # place in the acknowledgements: a later acknowledged one covers it): its record
            # names the rejection to a resumer until the failure is acknowledged
            self.hold_failure(src, record.position)
            return 0
        if src.settlement.was_acknowledged(seq):   # an earlier owner acknowledged it
            self.ledger.counts["acknowledged_before"] += 1
            return 0
        borrow = self.zero_copy
        token_ids, tensors = row_tensors(shape, views, r0, r0 + total, borrow, caps, slot)
        # positionally (see the assert by Shape): rid, producer_id, epoch, num_tokens,
        # token_ids, tensors, layers, layer_kinds, dtype, hidden, meta, fields, _release,
        # borrowed
        sample = Sample(rid, src.producer or "", src.epoch, total, token_ids, tensors,
                        list(shape.layers), list(shape.kinds), shape.dtype, shape.hidden,
                        sample_meta((meta["convention"], meta["model"], meta["dp_rank"]),
                                     cached_prefix, extra, seq),
                        field_tensors(fields), None, borrow)
        if borrow or self.durable:
            # zero-copy: the views need the record; durable: release() is the acknowledgement
            # (an unreleased sample is delivered again after a restart)
            src.borrowed.add(record.position)
            sample._release = self._releaser([(src, record.position)],
                                             self._ack_entry(src, seq, rid, seq),
                                             id(sample) if borrow else None)
            if borrow:
                self.lent[id(sample)] = sample
        self.ready.append(sample)
        return total * shape.token_bytes

    def _assemble(self, src: Source, p: Partial, holds: Holds) -> None:
        chunks = sorted(p.chunks, key=lambda c: c.start)
        rid = p.key[1]
        total = p.total or 0
        last_seq = max(c.seq for c in chunks)
        settled = self._unsettled.pop(p.key, None)
        if settled is not None:
            settled.finish(p.key, last_seq)
        if not self._check_expected(src, rid, total, last_seq):
            for hold_src, position in holds:   # rejected: they name it (see _whole)
                self.hold_failure(hold_src, position, borrowed=True)
            return
        if src.settlement.was_acknowledged(last_seq):   # an earlier owner acknowledged it
            self.ledger.counts["acknowledged_before"] += 1
            self._releaser(holds)()
            return
        release: Callable[[], None] | None = self._releaser(
            holds, self._ack_entry(src, last_seq, rid, min(c.seq for c in chunks)))
        if not self.durable:   # nothing to acknowledge: give the ring back now
            release()
            release = None
        layers, kinds, dtype, hidden = p.schema
        ids, tensors, fields = joined(chunks, p.schema)
        meta = dict(p.meta)
        meta.update(chunks=len(chunks), seqs=[c.seq for c in chunks])
        meta.pop("producer", None)
        meta.pop("epoch", None)
        sample = Sample(rid=rid, producer_id=src.producer or "", epoch=src.epoch,
                        num_tokens=total, token_ids=ids, tensors=tensors, layers=list(layers),
                        layer_kinds=list(kinds), dtype=dtype, hidden=hidden, meta=meta,
                        fields=fields, _release=release)
        self._deliver(sample)

    def _check_expected(self, src: Source, rid: str, total: int, last_seq: int) -> bool:
        expected = self.expected.pop(rid, None)
        if expected is not None and expected != total:
            self.reject((src.epoch, rid), f"expected {expected} tokens, found {total}",
                        _event(src, last_seq))
            return False
        return True

    def _deliver(self, sample: Sample) -> None:
        """Count ``sample`` and queue it for the user."""
        self._count_samples(1, sample.nbytes)
        self.ready.append(sample)

    def _count_samples(self, n: int, nbytes: int) -> None:
        """``n`` samples of ``nbytes`` payload bytes in all were queued in :attr:`ready`."""
        counts = self.ledger.counts
        counts["samples"] += n
        counts["sample_bytes"] += nbytes

    def _ack_entry(self, src: Source, last_seq: int, rid: str, first_seq: int
                   ) -> tuple[Settlement, list[Any]] | None:
        """Durable: this sample's place in its source's in-order acknowledgements (queued
        now, in sequence order: see :meth:`Settlement.acknowledge
        <hscapture._settlement.Settlement.acknowledge>`)."""
        if not self.durable:
            return None
        entry = src.settlement.queue(last_seq, rid, first_seq)
        return None if entry is None else (src.settlement, entry)

    def _track(self, src: Source, key: tuple[int, str], first_seq: int) -> None:
        """Durable: ``key``'s partial may not be found whole by a resumer (before any of its
        records is released: :meth:`Settlement.track <hscapture._settlement.Settlement.
        track>`)."""
        src.settlement.track(key, first_seq)
        self._unsettled[key] = src.settlement

    def _unpin(self, p: Partial) -> None:
        """Stop holding the ring for ``p`` (its chunks are copies): tracked first (durable)."""
        self.ledger.counts["partials_unpinned"] += 1
        if self.durable and p.chunks:
            self._track(p.holds[0][0], p.key, min(c.seq for c in p.chunks))
        self._unhold(p)

    def _releaser(self, holds: Holds, ack: tuple[Settlement, list[Any]] | None = None,
                  lent: int | None = None) -> Callable[[], None]:
        """The release (for a durable subscriber: the acknowledgement) of a sample holding
        ``holds`` (``lent``: its key in :attr:`lent`); after :meth:`close` it gives nothing
        back and acknowledges nothing. A ring is given back to only where the release freed
        one of its records: a record that other samples of its entry still hold keeps the
        ring where it is (each of the entry's samples asking the ring again cost a
        zero-copy sample more than its copy)."""
        def release() -> None:
            if lent is not None:
                self.lent.pop(lent, None)
            freed = [src for src, position in holds if src.borrowed.discard(position)]
            if not self.closed:
                if ack is not None:
                    ack[0].acknowledge(ack[1])
                for src in (freed if len(freed) < 2 else {id(s): s for s in freed}.values()):
                    src.release()
                    self.on_released(src)
        return release

    def take(self, rid: str) -> Sample | None:
        """Remove and return the ready sample of ``rid``, if there is one."""
        for i, sample in enumerate(self.ready):
            if sample.rid == rid:
                del self.ready[i]
                return sample
        return None

    # -- partials and failures -----------------------------------------------------------

    def _bound_partial_holds(self, src: Source) -> None:
        """Partials never pin more than a quarter of a ring: past that, the oldest ones stop
        holding (their chunks are copies already; only a crash could then cost them)."""
        consumer = src.consumer
        if consumer is None:
            return
        limit = consumer.capacity // 4
        held = sorted((p.holds[0][1], id(p), p) for p in self.asm.partials.values()
                      if p.holds and p.holds[0][0] is src)
        for first, _, p in held:
            if consumer.position - first <= limit:
                break
            self._unpin(p)

    def pop_partial(self, key: tuple[int, str]) -> Partial | None:
        """Forget the partial sample ``key`` and release the records it held."""
        p = self.asm.pop(key)
        if p is not None:
            self._unhold(p)
        return p

    def _unhold(self, p: Partial) -> None:
        for src, position in p.holds:
            src.borrowed.discard(position)
            if not self.closed:
                src.release()
        p.holds.clear()

    def fail(self, key: tuple[int, str], reason: str, kind: str,
             event: str | None = None) -> None:
        """Sample ``key`` = (epoch, rid) cannot be delivered: report it as ``kind``
        (``event``: the record that says so, :attr:`Ledger.failure_log`)."""
        self.headless.failed(key)   # (its held first row names it to a resumer)
        p = self.asm.pop(key)
        settled = self._unsettled.pop(key, None)
        if settled is not None:
            settled.finish(key, max((c.seq for c in p.chunks), default=0) if p else 0)
        self.ledger.record_failure(key, reason, kind, event)
        self.expected.pop(key[1], None)
        if p is not None:
            if self.durable:   # its chunks name it to a resumer until acknowledged
                for src, position in p.holds:
                    self.hold_failure(src, position, borrowed=True)
                p.holds.clear()
            else:
                self._unhold(p)

    # -- failures a durable consumer has not recorded yet (kept in the ring: RecordHolds) -----

    def hold_failure(self, src: Source, position: int, borrowed: bool = False) -> None:
        """Durable: keep the record at ``position`` (already referenced when ``borrowed``)
        until the failures recorded so far are acknowledged (:class:`RecordHolds`)."""
        self.holds.hold_failure(src, position, borrowed)

    def begin_pump(self) -> None:
        """A pump begins: the failure holds it takes are its caller's to record first."""
        self.holds.begin_pump()

    def acknowledge_failures(self, through: int) -> None:
        """The first ``through`` failures of the ledger's ``failure_log`` are recorded by the
        consumer: give back what named only those."""
        self.holds.acknowledge(through)

    def reject(self, key: tuple[int, str], why: str, event: str | None = None) -> None:
        message = str(SampleMismatchError(f"sample {key[1]!r} rejected: {why}"))
        self.ledger.error(message, "mismatches")
        self.fail(key, message, "rejected", event)

    def partials_of(self, epoch: int) -> list[Partial]:
        return self.asm.of_epoch(epoch)

    def housekeeping(self, now: float) -> None:
        """Stop holding the ring for partials idle past ``partial_hold_s``; fail those idle
        past ``incomplete_timeout_s``; bound the failures not acknowledged."""
        self.holds.bound_failures(now)
        if self.headless:
            self.headless.settle(older_than=now - self.incomplete_timeout_s)
        self.holds.bound_cuts(now)
        if self.durable:
            # the quarter-of-the-ring bound, also when no chunk of a partial arrives (whole
            # samples only: until 2026-12-05 one open partial then pinned the ring for
            # partial_hold_s, and the producer dropped or waited)
            for src in {id(p.holds[0][0]): p.holds[0][0]
                        for p in self.asm.partials.values() if p.holds}.values():
                self._bound_partial_holds(src)
        for p in self.asm.stale(now - self.partial_hold_s):
            if p.holds:   # its chunks are copies: stop holding the ring for it
                self._unpin(p)
        for p in self.asm.stale(now - self.incomplete_timeout_s):
            self.fail(p.key, f"no chunk for {self.incomplete_timeout_s:g}s; still missing "
                             f"{p.describe_gaps()}", "incomplete")

    def in_flight(self) -> dict[str, str]:
        """Samples started but not complete (rid -> the positions still missing)."""
        return {p.key[1]: p.describe_gaps() for p in self.asm.partials.values()}

    def progress(self, rid: str) -> str:
        parts = [f"[{c.start}, {c.start + c.count})" for k, p in self.asm.partials.items()
                 if k[1] == rid for c in p.chunks]
        return ", ".join(parts) or "none"
