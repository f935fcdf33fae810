"""Which producer incarnations a subscriber reads, and how each one begins and ends.

:class:`SourceRegistry` routes every decoded notice to its :class:`~hscapture._source.Source`
(attaching to a new incarnation's ring on its first notice), settles producer-id conflicts,
retires incarnations that stopped or restarted, and pumps every attached ring into the
:class:`~hscapture._delivery.Delivery`.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from typing import Any, Callable

from ._delivery import Delivery
from ._leftover import read as read_leftover
from ._ledger import Ledger, LostRange
from . import record as rec
from ._source import Source
from ._subscriptions import remember, segments_of
from .errors import (NoticeError, RecordFormatError, RingError, SegmentNotFoundError,
                     SubscriptionInUseError, SubscriptionNotFoundError)
from .ring import read_ended

log = logging.getLogger("hscapture")

#: how often (seconds) a durable subscriber looks for rings that kept a place for it unheard
ADOPT_S = 1.0
#: the place of a source whose ring was gone before it attached: every entry lies before it
_BEYOND_THE_RING = 1 << 64

__all__ = ["SourceRegistry", "taken_numbers"]


class _HeldAt:
    """Where a leftover entry's failure is held (:meth:`Delivery.hold_failure`): the ring
    position the consumer reached, so that the segment stays (and a resumer reads the file
    again) until the failure is recorded."""

    __slots__ = ("position",)

    def __init__(self, position: int) -> None:
        self.position = position


class SourceRegistry:
    """Producer incarnations by epoch, and the live epoch of each producer id.

    Guarantees:
    - Records of different incarnations are never mixed: each epoch has its own consumer,
      sequence accounting and partial samples.
    - Two live incarnations with one producer id are never merged: the one whose ring place
      came first keeps it, the other is refused (``ledger.conflicts``) and its place given
      back; a restarted producer retires the older incarnation.
    - A retired incarnation is read to its end first; then every number it never recorded is
      reported as a :class:`~hscapture._ledger.LostRange` and every open partial of it fails
      as incomplete. Its ring is detached once no sample references it (a durable place of a
      dead producer is ended and the segment removed if unused).
    - Notices of retired, refused or never-attached incarnations are counted and ignored.
    """

    def __init__(self, ledger: Ledger, delivery: Delivery, *, name: str,
                 endpoints: list[str], notice_grace_s: float,
                 producer_timeout_s: float) -> None:
        self.ledger = ledger
        self.delivery = delivery
        self.name = name
        #: the endpoints read: a durable name is theirs, and adopts only rings made for them
        self.endpoints = list(endpoints)
        self.notice_grace_s = notice_grace_s
        self.producer_timeout_s = producer_timeout_s
        self.sources: dict[int, Source] = {}          # by epoch, attached or draining
        #: durable: epoch -> last rows of samples earlier owners of the name acknowledged out
        #: of queue order (the subscriber loads them), and how an owner records one
        self.ahead: dict[int, list[tuple[int, str, int]]] = {}
        self.record_ahead: Callable[[int, int, str, int], None] = \
            lambda epoch, last_seq, rid, first_seq: None
        self.current: dict[str, int] = {}             # producer id -> live epoch
        #: why a place of this name could not be taken: another live consumer holds it
        self.in_use: str | None = None
        self.retired: set[int] = set()
        self.refused: dict[int, str] = {}             # epoch -> why (conflicts)
        self._attach_order = itertools.count()
        #: segments this subscriber attached to (never adopted again: read to their end)
        self._segments_seen: set[str] = set()
        #: durable places resumed in rings whose producer had ended (by segment): each is a
        #: producer whose samples, drops and reports this subscriber reads (ready_producers)
        self._resumed_ended: dict[str, Source] = {}
        self._last_adopt = time.monotonic()
        #: producer ids of which this subscriber read an incarnation: the next incarnation of
        #: one is promised from its first number, wherever our place in its ring begins
        self._followed: set[str] = set()
        delivery.on_released = self.maybe_finish

    # -- notices -------------------------------------------------------------------------

    def route(self, msg: dict[str, Any]) -> None:
        """One decoded notice: to its source (attaching on a new incarnation's first one)."""
        self.ledger.counts["notices"] += 1
        src = self._source_for(msg)
        if src is None:
            return
        src.last_seen = time.monotonic()
        kind = msg["kind"]
        if kind == "entry":
            if msg["entry_kind"] == "unheard":
                # its seq is the producer's next number (it takes none): kept, it stood for
                # the notice of the entry that takes that number, which a read of that entry
                # before its own notice then found "disagreeing" and rejected (an intact
                # sample rejected; a restart abort skipped, its sample delivered AND reported:
                # fault hunt 2026-12-06, k3, k4). The ring is read whatever the notice.
                return
            src.take_entry_notice(msg)
            if src.continuing and msg["offset"] < src.start:
                self._name_unreadable(src, msg)
        elif kind == "heartbeat":
            src.take_heartbeat(msg)
        elif kind == "bye":
            src.ended = True
            # every number the producer took: those never read are reported lost on retire
            src.bye_next_seq = max(src.bye_next_seq, int(msg["next_seq"]))

    def _name_unreadable(self, src: Source, msg: dict[str, Any]) -> None:
        """An entry notice of a new incarnation of a producer we read, for an entry before
        our place in its ring (committed before we attached to it): its rows are named by rid
        now, from the notice (validated as the entry would be), since the ring will never
        show them to us. A notice that does not validate is counted; its numbers are then
        reported lost by range (:meth:`Source.lost_reason`)."""
        notice = src.notices.pop(msg["seq"], None)
        if notice is None:
            return          # a late notice: the ring or a report already settled it
        try:
            entry = rec.notice_entry(notice, epoch=src.epoch, producer=src.producer)
        except NoticeError as exc:
            self.ledger.error(f"entry notice of {src.key} before our place in its ring: {exc}",
                              "corrupt_notices")
            return
        self.delivery.unread.unreadable(src, entry, (
            f"committed before this subscriber attached to the producer's new incarnation "
            f"{src.epoch:#x} (it restarted): the entry lies at ring position "
            f"{notice['offset']}, before this subscriber's place ({src.start})"))

    def _source_for(self, msg: dict[str, Any]) -> Source | None:
        producer, epoch = msg["producer"], msg["epoch"]
        src = self.sources.get(epoch)
        if src is not None:
            if src.producer is None:
                src.producer = producer
            if src.producer != producer:
                self.ledger.error(f"{msg['kind']} notice names producer {producer!r} for epoch "
                                  f"{epoch:#x} of producer {src.producer!r}", "forged_notices")
                return None
            if self.current.get(producer) != epoch and not src.retired:
                if not self._claim_current(producer, epoch, msg):
                    return None
            return src
        if epoch in self.retired:
            self.ledger.counts["stale_notices"] += 1
            return None
        if epoch in self.refused:
            self.ledger.counts["refused_notices"] += 1
            return None
        if "segment" not in msg:
            self.ledger.counts["before_attach"] += 1  # an incarnation we never attached to
            return None
        if not self._claim_current(producer, epoch, msg):
            return None
        return self.attach(producer, epoch, msg["segment"])

    def _claim_current(self, producer: str, epoch: int, msg: dict[str, Any]) -> bool:
        """Make ``epoch`` the live incarnation of ``producer``, unless another live one has it."""
        old_epoch = self.current.get(producer)
        old = self.sources.get(old_epoch) if old_epoch is not None else None
        if old is not None and old_epoch != epoch:
            alive = old.consumer is not None and old.consumer.producer_alive() and \
                time.monotonic() - old.last_seen < self.producer_timeout_s and not old.ended
            mine = self.sources.get(epoch)
            if alive and mine is not None and mine.consumer is not None and \
                    mine.order < old.order:
                # ``epoch`` held our place first (e.g. a durable place resumed before its
                # producer id was known): the newcomer is the one refused, and the place
                # this subscriber just took in its ring is given back.
                self._refuse(producer, old, epoch, msg)
                self.current[producer] = epoch
                return True
            if alive:
                why = (f"two live producers use the producer id {producer!r}: epoch "
                       f"{old_epoch:#x} (segment {old.segment}) and epoch {epoch:#x} (segment "
                       f"{msg.get('segment', '?')}, pid {msg.get('pid', '?')}); producer ids "
                       f"must be unique per subscriber: the second one is refused")
                self.refused[epoch] = why
                self.ledger.conflicts[f"{producer}@{epoch:016x}"] = why
                log.error("hscapture subscriber: %s", why)
                return False
            self.retire(old, f"producer restarted (epoch {old_epoch:#x} -> {epoch:#x})")
        self.current[producer] = epoch
        return True

    def _refuse(self, producer: str, newer: Source, epoch: int, msg: dict[str, Any]) -> None:
        """Refuse the later-attached of two live incarnations with one producer id."""
        why = (f"two live producers use the producer id {producer!r}: epoch {epoch:#x} "
               f"(segment {msg.get('segment', '?')}) and epoch {newer.epoch:#x} (segment "
               f"{newer.segment}); producer ids must be unique per subscriber: the second one "
               f"is refused")
        self.refused[newer.epoch] = why
        self.ledger.conflicts[f"{producer}@{newer.epoch:016x}"] = why
        log.error("hscapture subscriber: %s", why)
        for p in self.delivery.partials_of(newer.epoch):
            self.delivery.fail(p.key, why, "incomplete")
        newer.detach(unsubscribe=bool(self.name) and not newer.resumed)
        self.sources.pop(newer.epoch, None)

    # -- attach and retire ---------------------------------------------------------------

    def attach(self, producer: str | None, epoch: int, segment: str, *,
               resume_only: bool = False) -> Source | None:
        """Take our place in ``segment``'s ring (durable under ``name``); None if we cannot
        (counted) or, with ``resume_only``, if this name has no place there."""
        from . import _ring

        try:
            consumer = _ring.Consumer(segment, epoch, self.name, resume_only=resume_only)
        except SubscriptionNotFoundError:
            return None
        except SubscriptionInUseError as exc:
            # another live consumer holds this name's place: a second subscriber of the name
            # would idle, reading nothing, as if no sample came (the subscriber raises it)
            self.in_use = str(exc)
            if producer is not None and self.current.get(producer) == epoch:
                del self.current[producer]
            return None
        except RingError as exc:
            self.ledger.error(f"cannot attach to segment {segment!r} of producer {producer!r}: "
                              f"{type(exc).__name__}: {exc}", "attach_errors")
            if producer is not None and producer in self._followed and not resume_only and \
                    isinstance(exc, SegmentNotFoundError):
                return self._unreadable(producer, epoch, segment)
            if producer is not None and self.current.get(producer) == epoch:
                del self.current[producer]
            return None
        self._segments_seen.add(segment)
        if self.name:
            # the next incarnations at our endpoints keep a place for us from their first
            # capture (_subscriptions), not only from when we attach to them; an attach
            # renews the name's time (a name away for HSCAPTURE_DURABLE_KEEP_S is forgotten)
            for endpoint in self.endpoints:
                remember(self.name, endpoint=endpoint)
        src = Source(consumer.epoch, producer, segment, consumer, self.ledger,
                     notice_grace_s=self.notice_grace_s, order=next(self._attach_order),
                     resumed=bool(getattr(consumer, "resumed", False)))
        settlement = src.settlement
        if settlement.durable:     # samples acknowledged out of queue order (Settlement)
            settlement.on_ahead = functools.partial(self.record_ahead, src.epoch)
            if src.resumed:
                settlement.inherit_ahead(self.ahead.get(src.epoch, []))
        # the entries committed before now had their notices sent before we listened: read
        # as they are, not held for notice_grace_s each (until 2026-12-06 this stayed 0, and
        # a resumer of a producer whose heartbeats were far apart read one such entry a
        # second)
        src.attach_head = int(consumer.head)
        self.sources[src.epoch] = src
        self.ledger.counts["attached"] += 1
        if producer is not None:
            if producer in self._followed and not src.resumed:
                # a restarted producer we read: its samples are ours from its first one
                src.follow_from_start(int(consumer.position))
            self._followed.add(producer)
        if not src.continuing and not src.resumed:
            # a new place: the numbers the producer takes from now on are ours, so those it
            # took but never committed before it died are reported even when we read nothing
            # of it (until 2026-12-06 nothing below the first number read counted as
            # missing, and with nothing read nothing did: fault hunt 2026-12-06, a1/a2)
            src.seqs.promise_from(taken_numbers(src))
        elif src.resumed and src.settlement.durable:
            src.promise_inherited()
        if getattr(consumer, "expired", False):
            lost = consumer.lost_to - consumer.lost_from
            self.ledger.error(f"durable subscription {self.name!r} on {segment} expired while "
                              f"away: ring bytes [{consumer.lost_from}, {consumer.lost_to}) were "
                              f"never read", "expired_subscriptions")
            self.ledger.lost.append(LostRange(producer or "?", src.epoch, -1, lost,
                                              "subscription expired while away (ring bytes "
                                              "lost)"))
        elif getattr(consumer, "resumed", False):
            if not consumer.producer_alive():
                self._resumed_ended[segment] = src
            self.ledger.counts["resumed"] += 1
            # a place a new ring kept for us from its start (_subscriptions) holds nothing
            # read before: no news for the user ("resumed" misled a first drain's user)
            log.log(logging.INFO if consumer.position else logging.DEBUG,
                    "hscapture subscriber: resumed %r at ring position %d", segment,
                    consumer.position)
        return src

    def _unreadable(self, producer: str, epoch: int, segment: str) -> Source:
        """A new incarnation of a producer we read whose ring is gone before we could attach
        (it ended, and no one kept the segment): a source without a ring, every entry of which
        lies before our place. Its notices name their rows by rid; at its end (bye, or silence)
        the numbers they did not name are reported lost. Until 2026-12-05 nothing was said
        but an ``attach_errors`` count (fault hunt A: 300 of 300)."""
        src = Source(epoch, producer, segment, None, self.ledger,
                     notice_grace_s=self.notice_grace_s, order=next(self._attach_order))
        src.follow_from_start(_BEYOND_THE_RING)
        self.sources[epoch] = src
        return src

    def ready_producers(self) -> int:
        """How many producers this subscriber reads: the live incarnations attached, and
        (durable) the rings of ended producers whose place it resumed (what they kept for
        it, their drops and their leftover file: read whether or not their producer comes
        back; until 2026-12-05 a drain that resumed only such a ring, with nothing left in
        it but a leftover file, waited for a live producer and failed)."""
        ids = set(self.current)
        for segment, src in self._resumed_ended.items():
            ids.add(src.producer or segment)
        return len(ids)

    def resume_durable(self) -> None:
        """Take over this name's places in every ring (live or dead producers) at once."""
        self.adopt_durable(ended_only=False)

    def retire(self, src: Source, reason: str) -> None:
        """The incarnation is over: read what is left, report what never arrived."""
        if src.retired:
            return
        self.pump(src, final=True)
        src.retired = True
        producer = src.producer or "?"
        hb_next = max((src.hb or {}).get("next_seq", 0), src.bye_next_seq, src.seqs.high,
                      self.read_leftovers(src), taken_numbers(src), self.ended_numbers(src))
        src.owed_numbers()     # (after the leftover file: it may hold the unheard entry)
        for a, b in src.seqs.missing_below(hb_next):
            src.report_lost(a, b - a, src.lost_reason(a, f"{reason}: never recorded in the "
                                                         f"ring"))
        if src.producer:
            self._followed.add(src.producer)
        for p in self.delivery.partials_of(src.epoch):
            self.delivery.fail(p.key, f"{reason}; missing {p.describe_gaps()}", "incomplete")
        if src.cut:
            self.delivery.unread.cut_short(src, reason)
        self.retired.add(src.epoch)
        if self.current.get(producer) == src.epoch:
            del self.current[producer]
        self.maybe_finish(src)

    def read_leftovers(self, src: Source) -> int:
        """What ``src``'s producer closed with and never got into its ring (the leftover
        file beside the segment, :mod:`hscapture._leftover`): each entry not read yet is
        dispatched as if the ring held it (its rows named by rid, held for a resumer until
        recorded, as a ring entry's are). Returns the file's ``next_seq`` (0: no file):
        numbers below it that are nowhere are reported lost."""
        try:
            left = read_leftover(src.segment, epoch=src.epoch, producer=src.producer)
        except (NoticeError, OSError) as exc:
            self.ledger.error(f"the leftover file of segment {src.segment!r} cannot be read: "
                              f"{type(exc).__name__}: {exc}", "leftover_errors")
            return 0
        if left is None:
            return 0
        at = _HeldAt(src.consumer.position if src.consumer is not None else 0)
        for entry in left.entries:
            if entry.kind == "unheard":
                if src.unheard_read:
                    continue      # read in the ring already (it takes no number to check)
            elif src.seqs.add(entry.seq, entry.n) == entry.n:
                continue          # read in the ring already (written there before the close)
            self.ledger.counts["leftover_entries"] += 1
            self.delivery.on_entry(src, at, entry)
        return left.next_seq

    def ended_numbers(self, src: Source) -> int:
        """For an incarnation whose ring was gone before this subscriber could attach to it
        (:meth:`_unreadable`): the numbers its producer took, from the ended record the
        ring's removal left (:func:`hscapture.ring.write_ended`), so that the samples whose
        notices died with a SIGKILLed producer are reported lost too; 0 when attached, or
        with no record (removed more than ``HSCAPTURE_ENDED_KEEP_S`` ago, or by a build
        that did not write one)."""
        if not src.ring_gone:
            return 0
        try:
            return read_ended(src.segment, epoch=src.epoch) or 0
        except (RecordFormatError, OSError, ValueError) as exc:
            self.ledger.error(f"the ended record of segment {src.segment!r} cannot be read: "
                              f"{type(exc).__name__}: {exc}", "leftover_errors")
            return 0

    def maybe_finish(self, src: Source) -> None:
        """Detach from a retired incarnation once no borrowed sample needs its ring; a durable
        subscription of a dead producer is then ended and the segment removed if unused."""
        if not src.retired or len(src.borrowed):
            return
        _detach(src, lambda dead: bool(self.name) and dead)   # (none left: nothing to do)
        self.sources.pop(src.epoch, None)

    # -- the rings -------------------------------------------------------------------------

    def pump(self, src: Source, final: bool = False, budget: int | None = None,
             budget_bytes: int | None = None) -> None:
        """Dispatch what ``src``'s ring holds now (at most about ``budget`` rows and
        ``budget_bytes`` payload bytes); a corrupt ring retires it."""
        anonymous = src.producer is None
        corrupt = src.pump(self.delivery, final, budget, budget_bytes)
        if anonymous and src.producer is not None:   # a resumed place learned its producer
            self.current.setdefault(src.producer, src.epoch)
        if corrupt is not None and not src.retired and not final:
            self.retire(src, f"ring corrupt: {corrupt}")

    def pump_all(self, budget: int | None = None, budget_bytes: int | None = None) -> None:
        """Pump every attached ring (each up to ``budget`` rows and ``budget_bytes`` payload
        bytes, None: all it holds)."""
        for src in list(self.sources.values()):
            if src.consumer is not None:
                self.pump(src, budget=budget, budget_bytes=budget_bytes)

    @property
    def unread(self) -> bool:
        """A budgeted pump left entries in some ring: the next pump must not wait."""
        return any(src.unread and src.consumer is not None for src in self.sources.values())

    def adopt_durable(self, ended_only: bool = True) -> None:
        """Attach to every ring made for one of our endpoints and holding a place of this
        name that we never attached to, whose producer has ended (``ended_only``): an
        incarnation that reserved our place at its start (_subscriptions) and stopped without
        our hearing a notice of it (a start and stop within a heartbeat). A live one is left
        to its notices, which attach it with the producer-id checks (a second live producer
        of an id is a conflict, never read). A ring of another endpoint is never adopted:
        its place of this name belongs to another subscription of the same name."""
        from .ring import durable_segments, is_stale, segment_info

        def created(segment: str) -> int:
            try:
                return int(segment_info(segment)["created_ns"])
            except Exception:          # vanished meanwhile: attach fails and says so
                return 0

        # oldest first: of two live incarnations with one producer id, the one attached first
        # keeps its place (_claim_current); a newer one reserves our place in its ring at its
        # start, so attach order must follow the rings' ages, not their names
        ours = segments_of(self.endpoints)
        for segment in sorted((s for s in durable_segments(self.name) if s in ours),
                              key=created):
            if segment in self._segments_seen:
                continue
            if ended_only:
                try:
                    if not is_stale(segment):
                        continue
                except Exception:      # vanished meanwhile
                    continue
            self.attach(None, 0, segment, resume_only=True)

    def housekeeping(self, now: float) -> None:
        """Report numbers heartbeats say can no longer arrive; retire incarnations whose
        producer said bye or died (after the grace periods); a durable subscriber adopts the
        rings of ended producers that kept a place for it unheard (every :data:`ADOPT_S`)."""
        if self.name and now - self._last_adopt >= ADOPT_S:
            self._last_adopt = now
            try:
                self.adopt_durable()
            except Exception as exc:   # a scan of /dev/shm: never stops the pump
                self.ledger.error(f"durable subscription {self.name!r}: cannot look for rings "
                                  f"that kept a place for it: {exc}", "adopt_errors")
        for src in list(self.sources.values()):
            if src.retired:
                continue
            src.heartbeat_losses()
            if src.cut_seen:
                self.delivery.unread.timeout(src, now)
            alive = src.consumer is not None and src.consumer.producer_alive()
            quiet = now - src.last_seen
            if (src.ended and quiet > self.notice_grace_s) or \
                    (not alive and quiet > min(self.producer_timeout_s, 1.0)):
                self.retire(src, "producer stopped before the sample completed")

    def close(self, unsubscribe: bool) -> None:
        """Detach from every ring (``unsubscribe``: give durable places up for good)."""
        for src in list(self.sources.values()):
            _detach(src, lambda dead: unsubscribe and bool(self.name))

    # -- reports ---------------------------------------------------------------------------

    def unresolved(self) -> list[dict[str, Any]]:
        return [u for src in self.sources.values() for u in src.unresolved()]

    def describe(self) -> dict[str, Any]:
        """Per incarnation: segment, attached, live, and the last heartbeat's counters."""
        return {
            src.key: {
                "segment": src.segment, "attached": src.consumer is not None,
                "live": self.current.get(src.producer or "") == src.epoch,
                **({k: src.hb[k] for k in ("dropped", "committed", "unrecorded", "backlog")}
                   if src.hb else {})}
            for src in self.sources.values()}

    def held_fraction(self) -> float:
        out = 0.0
        for src in self.sources.values():
            c = src.consumer
            if c is not None and c.capacity:
                out = max(out, (c.position - c.released) / c.capacity)
        return out


def taken_numbers(src: Source) -> int:
    """The numbers ``src``'s producer took, as its segment header says (0: not attached,
    or a segment of an older build): a SIGKILL can leave drops named neither by a heartbeat
    nor by the leftover file, but never this."""
    consumer = src.consumer
    if consumer is None or consumer.closed:
        return 0
    try:
        return int(consumer.taken)
    except Exception:   # unmapped meanwhile: the other bounds stand
        return 0


def _detach(src: Source, unsubscribe: Callable[[bool], bool]) -> None:
    """Detach from ``src``'s ring (``unsubscribe(producer_dead)``: whether to give a durable
    place up for good); a ring whose producer is dead is then removed unless another
    subscriber still needs it (a segment its producer left for us, with a leftover file:
    not left to the next start)."""
    from .ring import cleanup_stale

    consumer = src.consumer
    if consumer is None:
        return
    dead = not consumer.producer_alive()
    src.detach(unsubscribe=unsubscribe(dead))
    if dead:
        try:
            cleanup_stale(src.segment)
        except Exception:     # vanished meanwhile, or not ours to judge
            pass
