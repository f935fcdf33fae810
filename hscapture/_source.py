"""One producer incarnation as a subscriber reads it: its ring consumer, the sequence numbers
seen, the notices waiting for their entries, and the ring positions still referenced.

The ring is the log (docs/PROTOCOL.md): :meth:`Source.pump` reads entries in ring order,
validates each one and cross-checks it against its notice, then hands it to an
:class:`EntrySink` (the delivery layer). What to do with the rows is not decided here.
"""

from __future__ import annotations

import collections
import heapq
import logging
import time
from typing import Any, Callable, Protocol

from . import record as rec
from ._ledger import Ledger, LostRange
from ._sequence import SequenceTracker
from ._settlement import Settlement
from .errors import NoticeError, RingError

log = logging.getLogger("hscapture")

__all__ = ["Source", "EntrySink", "PositionHolds", "MAX_NOTICES"]

#: notices kept waiting for their entries, per incarnation (beyond: the entry does not wait)
MAX_NOTICES = 100_000


class PositionHolds:
    """Ring positions still referenced (borrowed samples, unacknowledged samples, held
    partials), with multiplicity; :meth:`oldest` bounds what may be released."""

    def __init__(self) -> None:
        self._live: collections.Counter[int] = collections.Counter()
        self._heap: list[int] = []

    def add(self, position: int) -> None:
        if not self._live[position]:
            heapq.heappush(self._heap, position)
        self._live[position] += 1

    def discard(self, position: int) -> bool:
        """One reference to ``position`` fewer; True when that was its last (it may be given
        back now)."""
        self._live[position] -= 1
        if self._live[position] <= 0:
            del self._live[position]
            return True
        return False

    def oldest(self) -> int | None:
        while self._heap and self._heap[0] not in self._live:
            heapq.heappop(self._heap)
        return self._heap[0] if self._heap else None

    def __len__(self) -> int:
        return len(self._live)


class EntrySink(Protocol):
    """Where a :class:`Source` hands validated entries (``hscapture._delivery.Delivery``)."""

    def on_entry(self, src: "Source", record: Any, entry: Any) -> None: ...

    def reject(self, key: tuple[int, str], why: str) -> None: ...

    def hold_failure(self, src: "Source", position: int) -> None: ...


class Source:
    """One producer incarnation (epoch) and our ring consumer on its segment.

    Guarantees:
    - :meth:`pump` dispatches entries in ring order, each one validated by
      ``record.read_entry`` first (a corrupt one is counted, released and skipped, and its
      numbers, from its notice, reported lost with the reason: :meth:`_report_unreadable`).
    - An entry whose notice has arrived is dispatched only if the two agree (offset, record
      sequence, length, epoch, meta bytes, producer, seq, n, kind); otherwise every row of it
      is rejected through the sink. An entry waits for its notice at most ``notice_grace_s``
      and never when the notice cannot come any more (see :meth:`notice_lost`).
    - Every sequence number is dispatched at most once (a duplicate entry is counted and
      skipped). Numbers reported lost on a heartbeat's word that the ring then delivers are
      dispatched and taken out of the report (the ring wins).
    - :meth:`release` never gives back ring space at or after the oldest referenced record:
      the record waiting for its notice, or any position in :attr:`borrowed`.
    - The cost of any notice or heartbeat is independent of the numbers it names.
    """

    def __init__(self, epoch: int, producer: str | None, segment: str, consumer: Any,
                 ledger: Ledger, *, notice_grace_s: float, order: int = 0,
                 resumed: bool = False) -> None:
        self.epoch = epoch
        self.producer = producer
        self.segment = segment
        self.consumer = consumer
        #: the ring was gone before this subscriber could attach to it (never attached)
        self.ring_gone = consumer is None
        self.ledger = ledger
        self.notice_grace_s = notice_grace_s
        self.seqs = SequenceTracker()
        self.lost_seqs = SequenceTracker()          # reported lost
        #: (ring offset, record seq) -> why, of entries read before their notice that no
        #: reader can read: their notice, when it comes, says which numbers were lost
        self.unreadable_at: dict[tuple[int, int], str] = {}
        self.notices: dict[int, dict[str, Any]] = {}
        self.held: Any = None                       # a record waiting for its notice
        self.held_since = 0.0
        self.hb: dict[str, Any] | None = None       # the last heartbeat
        self.max_notice_seq = -1
        self.last_seen = time.monotonic()
        self.ended = False                          # bye received
        self.bye_next_seq = 0                       # ... and the numbers it said were taken
        self.retired = False
        self.borrowed = PositionHolds()
        self.pid = 0
        self.attach_head = 0      # producer head when we attached: older notices are gone
        #: a later incarnation of a producer this subscriber read (:meth:`follow_from_start`):
        #: every number from 0 is promised, those before :attr:`start` cannot be read
        self.continuing = False
        self.start = 0            # (continuing) our first ring position
        self.first_read: int | None = None   # the sequence number of the first entry read
        #: (continuing) rid -> (seq, why) of samples whose first rows lay before our place
        #: and whose fate is not known yet (UnreadRows.unreadable)
        self.cut: dict[str, tuple[int, str]] = {}
        #: rid -> time.monotonic() a row of a :attr:`cut` sample was last seen (the incomplete
        #: timeout counts from there; entries of rids no longer cut are dropped by it)
        self.cut_seen: dict[str, float] = {}
        #: the incarnation's unheard entry (one at most) was read in the ring: a copy of it
        #: in the leftover file (kept there while the ring had no room) is not read again
        self.unheard_read = False
        #: (a new place) an unheard entry is owed to us: the last heartbeat said ``heard``
        #: false, so the producer had not yet named the rows it committed before our attach;
        #: None before any heartbeat (:meth:`owed_numbers`)
        self.owed_unheard: bool | None = None
        self.owed_below = 0       # numbers below it: owed by an unheard entry that never came
        self.order = order        # attach order: the earlier of two conflicting wins
        self.resumed = resumed    # took over an existing durable place
        #: durable: the acknowledgements a resumer of this place reads (what an earlier owner
        #: acknowledged is skipped, not repeated: :mod:`hscapture._settlement`)
        self.settlement = Settlement(consumer, resumed)
        #: durable: 1 + the highest number of an entry read from this ring (and the value
        #: stored in the slot): stored before each release, so that a resumer knows the
        #: numbers no owner of the place read (:meth:`promise_inherited`)
        self.read_max = self.read_stored = 0
        self.unread = False       # the last budgeted pump stopped with entries maybe left
        #: called (no arguments) just before the ring is unmapped: a reader that registered
        #: :meth:`data_region` with CUDA unregisters it here (hscapture.stream, device=)
        self.on_detach: list[Callable[[], None]] = []

    def follow_from_start(self, position: int) -> None:
        """This incarnation succeeds one of a producer this subscriber read (it restarted):
        its samples are promised from its first sequence number, not from where this
        subscriber's place in its ring begins (``position``, the ring's head when it
        attached). The numbers before that place are named by rid from their notices
        (``SourceRegistry``) or, with no notice, reported lost (:meth:`lost_reason`)."""
        self.continuing = True
        self.start = position
        if self.seqs.base is None:
            self.seqs.base = 0

    def promise_inherited(self) -> None:
        """A resumed durable place: every number at or above the slot's ``read_through`` (no
        earlier owner of the place read it) is promised, so those its producer took and never
        committed are reported lost when the incarnation retires, even when this resumer
        reads nothing (until 2026-12-06 nothing counted as missing below the first number
        a resumer read: fault hunt f1, GUARANTEES gap 13(a)). 0 (nothing read, or a segment
        of an older build): no promise, as before."""
        through = int(getattr(self.consumer, "read_through", 0) or 0)
        if through:
            self.read_max = self.read_stored = through
            self.seqs.promise_from(through)

    def owed_numbers(self) -> None:
        """At the end of the incarnation: if the unheard entry owed to this new place never
        came (the producer was SIGKILLed, or closed, before the heartbeat that writes it; not
        in the ring, not in the leftover file), the numbers it took before our attach are
        missing too, reported as lost by number (their rids died with the producer). Until
        2026-12-06 they were named nowhere (GUARANTEES gap 13(b), fault hunt a3: 6/6)."""
        if self.owed_unheard and not self.unheard_read and self.seqs.floor:
            self.owed_below = self.seqs.floor
            self.seqs.floor = self.seqs.base = 0

    def lost_reason(self, first: int, reason: str) -> str:
        """Why numbers from ``first`` on are lost: ``reason``, unless they came before this
        (continuing) subscriber's place in the ring, or before this new place's attach."""
        if first < self.owed_below:
            return ("committed before this subscriber attached; the producer ended before it "
                    "named them (its unheard entry was never written)")
        if self.ring_gone:     # (SourceRegistry._unreadable)
            return ("taken by the producer's new incarnation (it restarted), whose ring was "
                    "removed before this subscriber could attach to it (the producer ended), "
                    "and named by no notice it received")
        if self.continuing and (self.first_read is None or first < self.first_read):
            return ("committed before this subscriber attached to the producer's new "
                    "incarnation (it restarted), before its place in the ring, and named by no "
                    "notice it received")
        return reason

    @property
    def key(self) -> str:
        """``producer@epoch`` as the reports name an incarnation."""
        return f"{self.producer}@{self.epoch:016x}"

    # -- notices -------------------------------------------------------------------------

    def take_entry_notice(self, msg: dict[str, Any]) -> None:
        """Keep an ``entry`` notice until its entry is read (late ones are counted)."""
        seq = msg["seq"]
        if self.seqs.seen(seq):
            self.ledger.counts["late_notices"] += 1
            return
        if self.unreadable_at:
            why = self.unreadable_at.pop((msg.get("offset"), msg.get("record_seq")), None)
            if why is not None:     # its entry was read first, and could not be
                self._lost_unreadable(msg, why)
                return
        self.max_notice_seq = max(self.max_notice_seq, seq)
        if len(self.notices) < MAX_NOTICES:
            self.notices[seq] = msg

    def take_heartbeat(self, msg: dict[str, Any]) -> None:
        """Keep a heartbeat, unless it names a ring head the ring itself has not reached."""
        if self.consumer is not None and msg["head"] > self.consumer.head:
            # the ring's head only grows: a heartbeat ahead of it was not the producer's
            self.ledger.error(f"heartbeat of {msg['producer']!r} names ring head {msg['head']}, "
                              f"past the ring's own head {self.consumer.head}", "forged_notices")
            return
        self.hb = msg
        # (a new place: neither continuing nor resumed, promised from its attach)
        if not self.continuing and not self.resumed and self.owed_unheard is not False:
            self.owed_unheard = not msg["heard"]   # once heard, never owed again

    # -- the ring --------------------------------------------------------------------------

    def pump(self, sink: EntrySink, final: bool = False, budget: int | None = None,
             budget_bytes: int | None = None) -> str | None:
        """Read and dispatch every entry available now (``final``: without waiting for any
        notice), or, with ``budget`` / ``budget_bytes``, stop after the entry that brings the
        rows dispatched / the payload bytes read in this call to that bound (at least one
        entry is read; :attr:`unread` then says entries may be waiting; the ring keeps them).
        The byte bound is what bounds the work of one call: a row can be a chunk of megabytes
        that the sink copies. Returns the error text if the ring is corrupt (the caller
        retires us)."""
        consumer = self.consumer
        self.unread = False
        if consumer is None:
            return None
        counts = self.ledger.counts
        spent = spent_bytes = 0
        while True:
            if (budget is not None and spent >= budget) or \
                    (budget_bytes is not None and spent_bytes >= budget_bytes):
                self.unread = True
                return None
            record = self.held
            if record is None:
                try:
                    record = consumer.poll()
                except RingError as exc:
                    self.ledger.error(f"ring of {self.producer!r} is corrupt: {exc}",
                                      "ring_errors")
                    return str(exc)
                if record is None:
                    return None
                spent_bytes += record.payload_len
                counts["ring_bytes_read"] += record.payload_len
            try:
                entry = rec.read_entry(record.payload, payload_len=record.payload_len,
                                       epoch=self.epoch, producer=self.producer, tag=record.tag)
            except NoticeError as exc:
                self.held = None
                self.ledger.error(f"ring entry at {record.position} of {self.producer!r}: {exc}",
                                  "corrupt_records")
                self._report_unreadable(record, exc)
                self.release()
                continue
            if self.producer is None:
                self.producer = entry.meta["producer"]
            if entry.n and entry.seq + entry.n > self.read_max:
                self.read_max = entry.seq + entry.n
            if self.first_read is None:
                self.first_read = entry.seq
            notice = self.notices.pop(entry.seq, None) if entry.kind != "unheard" else None
            if notice is None and entry.kind != "unheard" and not final and \
                    not self.notice_lost(entry.seq, record):
                return None   # its notice is on the way: wait (bounded by notice_grace_s)
            self.held = None
            if notice is None and entry.kind != "unheard":
                counts["recovered_from_ring"] += 1
            if notice is not None:
                why = rec.notice_mismatches(notice, entry, offset=record.position,
                                            record_seq=record.seq, length=record.payload_len)
                if why:
                    self.seqs.add(entry.seq, entry.n)
                    for row in entry.rows:
                        sink.reject((self.epoch, row["rid"]),
                                    f"notice and ring entry disagree: {'; '.join(why)}")
                    if entry.rows:
                        sink.hold_failure(self, record.position)   # durable: names them
                    self.release()
                    continue
            if entry.n:
                reported = self.lost_seqs.count(entry.seq, entry.n)
                if self.seqs.add(entry.seq, entry.n) - reported == entry.n:
                    counts["duplicate_entries"] += 1
                    self.release()
                    continue
                if reported:   # the ring has what a heartbeat called lost: the ring wins
                    self.retract(entry.seq, entry.n)
            if self.settlement.inherited:
                self.settlement.read(entry.seq + max(entry.n, 1) - 1)
            sink.on_entry(self, record, entry)
            self.release()
            spent += entry.n or 1

    def skim(self, sink: EntrySink, giving_up: bool = False) -> list[str]:
        """A consumer that nothing resumes, about to stop: read every entry committed so far
        without copying its data, and return the rids of its data rows (samples it will
        never deliver: named, not lost in silence). Drop, abort and unheard entries go to
        ``sink`` as in :meth:`pump`. A durable place reads nothing here (its resumer gets
        them) unless it is ``giving_up`` its place (unsubscribing)."""
        consumer = self.consumer
        if consumer is None or (self.settlement.durable and not giving_up):
            return []
        stop_at = consumer.head       # what was committed before the stop
        rids: list[str] = []
        record, self.held = self.held, None
        while True:
            if record is None:
                try:
                    record = consumer.poll()
                except RingError:
                    break
                if record is None or record.position >= stop_at:
                    break
            try:
                entry = rec.read_entry(record.payload, payload_len=record.payload_len,
                                       epoch=self.epoch, producer=self.producer,
                                       tag=record.tag)
            except NoticeError as exc:   # named lost, from its notice (gap 12)
                entry = None
                self.ledger.error(f"ring entry at {record.position} of {self.producer!r}: "
                                  f"{exc}", "corrupt_records")
                self._report_unreadable(record, exc)
            if entry is not None and entry.kind == "batch":
                self.seqs.add(entry.seq, entry.n)     # (read: a closing subscriber counts it)
                rids.extend(row["rid"] for row in entry.rows)
            elif entry is not None and (not entry.n or not self.seqs.seen(entry.seq)):
                self.seqs.add(entry.seq, entry.n)
                sink.on_entry(self, record, entry)
                # rows read above of a sample this entry failed (an abort, a dropped later
                # chunk) are named by that failure, not as a sample never handed out too
                # (until 2026-12-06 both: fault hunt H18); a retry's rows come after it
                failed = {entry.meta["rid"]} if entry.kind == "abort" else \
                    {row["rid"] for row in entry.rows} if entry.kind == "drop" else ()
                failed = {r for r in failed if self.ledger.has_failed((self.epoch, r))}
                if failed:
                    rids = [r for r in rids if r not in failed]
            record = None
        self.release()
        return rids

    def notice_lost(self, seq: int, record: Any) -> bool:
        """True when the notice of entry ``seq`` will not come (so the entry is used as is);
        False holds ``record`` to wait for it."""
        hb = self.hb or {}
        if seq < self.max_notice_seq or seq < hb.get("next_seq", 0) or self.ended or \
                record.position < self.attach_head or not self.consumer.producer_alive():
            return True   # (an entry from before we (re)attached: its notice went out then)
        now = time.monotonic()
        if self.held is None:
            self.held, self.held_since = record, now
            return False
        return now - self.held_since > self.notice_grace_s

    def release(self) -> None:
        """Give the ring back up to the oldest record still referenced."""
        consumer = self.consumer
        if consumer is None:
            return
        limit = consumer.position if self.held is None else self.held.position
        oldest = self.borrowed.oldest()
        if oldest is not None:
            limit = min(limit, oldest)
        if limit > consumer.released:
            if self.read_max > self.read_stored and self.settlement.durable:
                # before the release: the records it passes have their numbers below it
                consumer.store_read_through(self.read_max)
                self.read_stored = self.read_max
            consumer.release(limit)

    def data_region(self) -> tuple[int, int] | None:
        """``(address, size)`` of this ring's data region as mapped in this process (every
        record and payload lies inside it; read-only; page-aligned start, size rounded up to
        4096 bytes inside the mapping), None once detached."""
        c = self.consumer
        if c is None:
            return None
        return int(c.data_address), (int(c.capacity) + 4095) // 4096 * 4096

    def detach(self, unsubscribe: bool = False) -> None:
        """Run :attr:`on_detach`, then close our consumer (``unsubscribe``: give a durable
        place up for good)."""
        if self.consumer is None:
            return
        hooks, self.on_detach = self.on_detach, []
        for hook in hooks:
            try:
                hook()
            except Exception as exc:   # never keeps the ring mapped
                log.warning("hscapture subscriber: a detach hook of %r failed: %s: %s",
                            self.producer, type(exc).__name__, exc)
        try:
            if unsubscribe:
                self.consumer.unsubscribe()
            else:
                self.consumer.close()
        except Exception:
            pass
        self.consumer = None
        self.settlement.consumer = None   # detached: it stores nothing more

    # -- numbers that can never arrive ---------------------------------------------------

    def heartbeat_losses(self) -> None:
        """Once we have read up to the last heartbeat's head, every number below its
        ``recorded_through`` that we never saw is lost (reported once, by range)."""
        hb = self.hb
        if hb is not None and self.consumer is not None and \
                self.consumer.position >= hb["head"] and self.held is None and \
                (not self.continuing or hb["heard"]):
            # (continuing: the numbers before our place may be named by the unheard entry,
            # which the producer writes at its first heartbeat after the first attach, or
            # later when the ring has no room; a heartbeat says ``heard`` once it is in the
            # ring, with a head past it. Until 2026-12-06 a follower counted from any
            # heartbeat (fault hunt g1, g2), then from one whose head lay past its place: a
            # follower attaching after another subscriber waited for an idle producer's head
            # to move (a CI failure), and flushed backlog drops moved it with the unheard
            # entry still waiting (fault hunt P1: its rows reported lost))
            for a, b in self.seqs.missing_below(hb["recorded_through"]):
                self.report_lost(a, b - a, self.lost_reason(
                    a, "not recorded: the ring and the producer's backlog were full"))

    def _report_unreadable(self, record: Any, exc: Exception) -> None:
        """A ring entry no reader can read (its meta breaks the format: a writer that broke
        ``capture_rows``' promise, a corrupted ring): its numbers, from its notice when that
        came first (matched by ring offset and record sequence), are reported lost with the
        reason (by this subscriber: not across a durable resume, docs/GUARANTEES.md gap 12).
        Without this they were named nowhere when the entry was the first one read (nothing
        below the first number seen counts as missing), and as "not recorded" otherwise
        (fault hunt 2026-12-05). A notice still on its way is matched when it comes
        (:meth:`take_entry_notice`)."""
        why = f"its ring entry at {record.position} cannot be read: {exc}"[:400]
        for seq, notice in self.notices.items():
            if notice.get("offset") == record.position and \
                    notice.get("record_seq") == record.seq:
                del self.notices[seq]
                self._lost_unreadable(notice, why)
                return
        if len(self.unreadable_at) < MAX_NOTICES:
            self.unreadable_at[(record.position, record.seq)] = why

    def _lost_unreadable(self, notice: dict[str, Any], why: str) -> None:
        seq, n = notice["seq"], notice.get("n") or 0
        if n > 0 and not self.seqs.seen(seq):
            self.report_lost(seq, n, why)

    def report_lost(self, first: int, count: int, reason: str) -> None:
        self.ledger.lost.append(LostRange(self.producer or "?", self.epoch, first, count,
                                          reason))
        self.seqs.add(first, count)       # reported once
        self.lost_seqs.add(first, count)  # ... unless the ring later shows them (retract)
        log.warning("hscapture subscriber: %d events of producer %r (seq %d..%d) are lost: %s",
                    count, self.producer, first, first + count - 1, reason)

    def retract(self, first: int, count: int) -> None:
        """Numbers reported lost (on a heartbeat's word) turned up in the ring: the report was
        wrong (a forged or stale heartbeat), so take them out of the lost report."""
        self.ledger.error(f"entries {first}..{first + count - 1} of producer {self.producer!r} "
                          f"were reported lost on a heartbeat's word but are in the ring: the "
                          f"heartbeat was forged or stale; the report is corrected",
                          "retracted_losses")
        self.lost_seqs.remove(first, count)
        self.ledger.retract_lost(self.epoch, first, count)

    def unresolved(self) -> list[dict[str, Any]]:
        """The numbers not seen yet below the highest one seen, as ranges."""
        return [{"producer": self.producer, "epoch": self.epoch, "first": a, "count": b - a}
                for a, b in self.seqs.missing()]
