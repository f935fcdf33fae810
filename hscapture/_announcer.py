"""A producer's publishing side: committing each entry once its copy completed and announcing
it over ZeroMQ, heartbeats, ``hello`` and ``bye``, and which thread publishes when (the
capturing thread inline, after a capture; the publisher thread once captures pause).

What goes into the ring is :mod:`hscapture._entries`'s (this module calls in, under the
capture lock, to write the control backlog, the ``unheard`` entry and the drop entry of a
failed commit); the order entries leave in and the hand-over between the two threads are
:mod:`hscapture._publish_queue`'s. The policy's settings (``inline_publish``,
``publish_interval_s``, ``commit_grace_s``, ``heartbeat_interval_s``) are the producer's public
attributes (:class:`hscapture.producer.Producer` says what each does), read at each use.

Guarantees:

- An entry is announced only after its commit (the commit release-stores the record's state,
  the notice goes out after); a failed copy or commit becomes a drop entry of the same rows
  and sequence numbers, reported, never a notice.
- Every socket send after ``hello`` holds the publish queue's ``send_lock`` (ZeroMQ sockets
  are not thread-safe; :mod:`hscapture._publish_queue`).
- :attr:`Announcer.announced`: every number below it has its notice sent; heartbeats say so
  (``next_seq``), with ``recorded_through`` never above it.
- Publishing never raises into the engine or kills the publisher thread: errors are counted
  (``errors``, ``publisher_errors``) and the first one logged.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from typing import Any, Callable, Protocol

from . import _leftover
from . import notice as nt
from . import record as rec
from ._control import ControlLog
from ._copies import recycle_event
from ._entries import EntryWriter
from ._producer_resources import last_attach
from ._publish_queue import STOP, Pending, PublishQueue, completed
from .ring import remove_leftover

log = logging.getLogger("hscapture")

__all__ = ["Announcer", "AnnouncerSettings", "LEFTOVER_INTERVAL_S"]

#: while capturing, how often (at most) the leftover file follows a changed backlog: a
#: producer killed with a backlog leaves named all the drops but those of its last interval
LEFTOVER_INTERVAL_S = 0.5
#: how long the capturing thread's publish waits for the send lock held by the publisher
#: thread (:meth:`Announcer.publish_inline`); past it the entry is left to that thread
INLINE_LOCK_WAIT_S = 0.0005


class AnnouncerSettings(Protocol):
    """What the announcer takes of its producer's public attributes
    (:class:`hscapture.producer.Producer`), read at each use: the policy ones may be set at
    any time."""

    producer_id: str
    epoch: int
    segment: str
    inline_publish: bool
    publish_interval_s: float
    commit_grace_s: float
    heartbeat_interval_s: float
    upstream: Callable[[bool], None] | None

    def run_upstream(self, idle: bool = False) -> None: ...


class Announcer:
    """Commits and announces one producer's entries, from the capturing thread (inline) and
    from the publisher thread (:meth:`publish_loop`, its body)."""

    def __init__(self, settings: AnnouncerSettings, entries: EntryWriter, pubq: PublishQueue,
                 ring: Any, sock: Any, control: ControlLog,
                 counters: collections.Counter[str]) -> None:
        self._settings = settings    # the producer (a back-reference: see AnnouncerSettings)
        self._entries = entries
        self._lock: threading.Lock = entries.lock   # the capture lock
        self._pubq = pubq
        #: the ring and the bound PUB socket (None once the producer gave them back)
        self.ring = ring
        self.sock = sock
        self._control = control
        self._counters = counters
        #: queued bytes past which the capturing thread publishes whatever the interval
        self.publish_bytes = max(1, ring.capacity // 8)
        #: every number below this has its notice sent
        self.announced = 0
        self.last_inline = float("-inf")   # time.monotonic() of the last inline publish
        #: the leftover file (_keep_leftover): when it was last brought up to date, the
        #: backlog state it records, and whether it exists
        self._leftover_at = 0.0
        self._leftover_state: tuple[int, int, int, bool] = (0, 0, -1, False)
        self._leftover_written = False
        #: the backlog's state at the last heartbeat (same form)
        self._backlog_state: tuple[int, int, int, bool] = (0, 0, -1, False)

    # -- the capturing thread --------------------------------------------------------------

    def inline_due(self) -> bool:
        """Whether the capturing thread publishes now: ``inline_publish`` on, and
        ``publish_interval_s`` passed since it last did or the queue holds a large share of
        the ring."""
        s = self._settings
        if not s.inline_publish:
            return False
        interval = s.publish_interval_s
        return not interval or time.monotonic() - self.last_inline >= interval or \
            self._pubq.held_bytes >= self.publish_bytes

    def publish_inline(self) -> None:
        """The capturing thread's publish; its time counts for the interval only when it ran
        (another thread publishing at that moment does not).

        When the publisher thread holds the send lock (a heartbeat, mostly), this waits for
        it up to :data:`INLINE_LOCK_WAIT_S` instead of leaving the entry queued: waiting on
        the lock releases the GIL, which the publisher thread needs to finish (after its
        ZeroMQ send, which ran without the GIL) and let go of the lock, so the wait is that
        thread's few microseconds of Python. Given up at once, the entry waited for the next
        capture or the publisher's commit grace, and a publisher that had lost the GIL to a
        capturing thread that never releases it (an engine loop that spins) waited for the
        interpreter's switch interval (5 ms) on top: paced 16-record entries at 5,000/s
        from a spinning thread had their notice-to-poll p99 at 4.4-4.7 ms with heartbeats
        every 0.1 s against 1.2-1.4 ms without heartbeats (CPU machine, 2026-12-07)."""
        if self._pubq.publish_ready(False, self.publish, INLINE_LOCK_WAIT_S):
            self.last_inline = time.monotonic()

    def publish_ready(self, block: bool) -> None:
        """Commit and announce, in order, every entry at the queue's front whose copy has
        completed. The capturing thread calls it after each capture without blocking (when
        the publisher thread is at it, it returns at once), the publisher thread blocking."""
        self._pubq.publish_ready(block, self.publish)

    # -- the publisher thread --------------------------------------------------------------

    def publish_loop(self) -> None:
        """Commit entries in order once their copies completed, then announce them: the
        publisher thread's side of :mod:`hscapture._publish_queue` (whose docstring says why
        it leaves entries to the capturing thread for ``commit_grace_s`` after the last
        capture). It waits for the oldest copy with the GIL released (``synchronize``);
        ``flush``, ``close`` and ``inline_publish = False`` cut the grace.
        """
        s, entries = self._settings, self._entries
        last_hb = 0.0
        while True:
            now = time.monotonic()
            if now - last_hb >= s.heartbeat_interval_s:
                self._safe(self._heartbeat)
                last_hb = now
                # (at once when the backlog shrank: it was written into the ring, and a
                # resumer reading a file that still lists entries it read and acknowledged in
                # the ring reports them again, fault hunt P3; and when the unheard entry
                # came or went: it names what no one else will, fault hunt x2)
                if self._backlog_state != self._leftover_state and \
                        (now - self._leftover_at >= LEFTOVER_INTERVAL_S or
                         self._backlog_state[0] < self._leftover_state[0] or
                         self._backlog_state[3] != self._leftover_state[3]):
                    self._safe(self._keep_leftover, False)
            head = self._pubq.next_for_publisher(
                s.commit_grace_s if s.inline_publish else 0.0, s.heartbeat_interval_s)
            if head is STOP:
                break
            if head is None:
                if s.upstream is not None:   # what the engine adapter still holds
                    self._safe(s.run_upstream, True)
                if entries.stage:          # captures stopped with rows staged
                    self._safe(entries.write_due_stage)
                continue
            if head.done is not None and not completed(head.done):
                try:
                    head.done.synchronize()  # waits for the side-stream copy only (GIL released)
                except Exception:
                    pass                     # publish reports the failed copy
            self.publish_ready(block=True)
        self._safe(self._heartbeat)           # (writes what of the backlog fits now)
        # ... and commits it: that heartbeat may write the unheard entry (a first subscriber
        # attached since the last one) and drop entries from the backlog, none of which had
        # a copy to wait for; left queued, they were never committed, and the rows committed
        # before that subscriber attached were named nowhere (until 2026-12-05)
        self.publish_ready(block=True)
        # every number taken: the ring holds it, or it never will (drops still in the
        # backlog, unrecorded ones). Subscribers report the numbers below this that they
        # never read as lost; with only the announced ones, drops taken after the last
        # announced entry were reported nowhere (until 2026-12-05)
        taken = self._keep_leftover(True)
        with self._pubq.send_lock:
            self._safe(self._send, {"kind": "bye", "next_seq": taken,
                                    "time_ns": time.time_ns()})

    def _keep_leftover(self, final: bool) -> int:
        """Keep the leftover file beside the segment equal to what the backlog holds (and
        counts unrecorded), or remove it once there is nothing; returns the ``next_seq`` it
        records. At close (``final``) for a subscriber that reads the ring after the
        ``bye`` (a durable one away now: :mod:`hscapture._leftover` says why); while
        capturing, at most every :data:`LEFTOVER_INTERVAL_S` and only when the backlog
        changed, so that a producer killed with a backlog leaves its drops named too (all
        but those of its last interval)."""
        entries, control = self._entries, self._control
        with self._lock:
            taken = max(self.announced, entries.next_seq)
            state = (control.backlog_rows, control.unrecorded, control.backlog_first(),
                     control.unheard_waiting)
            if not final and state == self._leftover_state:
                return taken
            pending = control.pending()
        left, unrecorded = state[0], state[1]
        s = self._settings
        self._leftover_at = time.monotonic()
        self._leftover_state = state
        if not (left or unrecorded):
            if self._leftover_written:
                remove_leftover(s.segment)
                self._leftover_written = False
            return taken
        where = "they are named by rid in the leftover file beside the segment"
        try:
            _leftover.write(s.segment, s.epoch, taken, unrecorded,
                            [rec.control_payload(m, check=False) for m in pending])
            self._leftover_written = True
        except Exception as exc:
            where = f"subscribers report their numbers as lost (no leftover file: {exc})"
            if not final:
                raise
        if final:
            log.warning("hscapture: closing with %d dropped row(s) the ring had no room to "
                        "record (%d counted only); %s", left + unrecorded, unrecorded, where)
        return taken

    def _heartbeat(self) -> None:
        entries, control = self._entries, self._control
        # (captures hold the lock only briefly: the wait policy waits outside it)
        with self._lock:
            entries.flush_backlog_locked()
            if not control.heard and self.ring.stats()["live_consumers"]:
                in_flight = self._pubq.in_flight()
                unheard = control.take_unheard(last_attach(self.ring.name), in_flight)
                if unheard is not None:
                    entries.write_unheard_locked(*unheard)
            # read after the writes above, and together: every number below
            # recorded_through is in the ring below head, and head lies past every entry
            # this heartbeat wrote (backlog drops, the unheard entry), so a subscriber
            # counts losses only once it read them (Source.heartbeat_losses): it reads the
            # rows they name by rid first. Until 2026-12-06 the head was read before the
            # backlog's flush, and a heartbeat flushing a waiting unheard entry said
            # ``heard`` with a head before it (fault hunt P2: its rows reported lost)
            ring = self.ring.stats()
            recorded = min(control.recorded_through(entries.next_seq), self.announced)
            # (for the leftover file: read here, under the lock this already holds, so that
            # the loop takes the lock again only when the backlog changed)
            self._backlog_state = (control.backlog_rows, control.unrecorded,
                                   control.backlog_first(), control.unheard_waiting)
            hb = {"kind": "heartbeat", "pid": os.getpid(), "segment": self._settings.segment,
                  "next_seq": self.announced, "head": int(ring["head"]),
                  "committed": int(ring["committed"]), "dropped": self._counters["dropped"],
                  "unrecorded": control.unrecorded,
                  "backlog": control.backlog_rows, "recorded_through": recorded,
                  "heard": control.told,
                  "errors": self._counters["errors"], "time_ns": time.time_ns()}
        with self._pubq.send_lock:
            self._send(hb)

    # -- both threads ----------------------------------------------------------------------

    def publish(self, item: Pending) -> None:
        """Commit one entry whose copy completed (the queue handed it out: ``done`` None or
        complete), then announce it. A failed copy (``item.error``) or commit becomes a drop
        entry of the same rows, reported, never a notice. Never raises (counted and logged):
        it runs on the engine's thread and on the publisher thread."""
        try:
            if item.error is not None:
                raise item.error             # the copy's completion query failed
            if item.done is not None:
                if item.keepalive is not None:
                    recycle_event(item.done, item.keepalive)   # completed: reusable
                item.done = None
            # SYNC POINT: commit release-stores the record state; the notice goes out after.
            self.ring.commit(item.position)
            if not self._control.heard:
                self._control.note_unheard(item)
        except Exception as exc:   # a failed copy or commit: the rows become a drop entry
            self._counters["errors"] += 1
            log.error("hscapture: entry %d could not be committed: %s", item.seq, exc)
            with self._lock:
                try:
                    self.ring.abort(item.position)
                except Exception:
                    pass
                if item.rows:   # same sequence numbers, now recorded as dropped
                    self._safe(self._entries.drop_locked, item.seq, item.rows,
                               f"commit_error: {type(exc).__name__}", item.length)
            return
        finally:
            item.keepalive = None
        try:
            try:
                record_seq = self.ring.record_seq(item.position)
            except Exception:
                record_seq = 0
            s = self._settings
            self.sock.send(nt.entry_frame(s.producer_id, s.epoch, item.seq, item.n,
                                          item.kind, s.segment, item.position,
                                          item.length, record_seq, item.meta_bytes),
                           copy=True)
        except Exception:
            self.count_publisher_error()
            return
        if item.kind != "unheard":
            self.announced = max(self.announced, item.seq + item.n)

    def hello(self) -> None:
        """Say ``hello`` (before the publisher thread starts: no other sender yet)."""
        self._send({"kind": "hello", "pid": os.getpid(), "segment": self._settings.segment,
                    "capacity": self.ring.capacity, "time_ns": time.time_ns()})

    def _send(self, msg: dict[str, Any]) -> None:
        s = self._settings
        msg.setdefault("v", nt.PROTOCOL_VERSION)
        msg.setdefault("producer", s.producer_id)
        msg.setdefault("epoch", s.epoch)
        self.sock.send(nt.encode(msg, check=False), copy=True)

    def _safe(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:  # never let the publisher thread die: count and log once
            self.count_publisher_error()

    def count_publisher_error(self) -> None:
        """Count, and log the first, error of publishing (called in an ``except`` block)."""
        self._counters["errors"] += 1
        if self._counters["publisher_errors"] == 0:
            log.exception("hscapture: publisher thread error (counted; continuing)")
        self._counters["publisher_errors"] += 1
