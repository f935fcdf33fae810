"""The queue between a producer's captures and their announcement: WHEN an entry may be
committed and announced, and WHICH thread does it.

What committing and announcing mean (the ring's commit, the notice, a failed copy turned into
a drop entry) is the announcer's (:mod:`hscapture._announcer`), and what an entry holds is
:mod:`hscapture._entries`'s; this module only orders and hands out the entries, and
coordinates the two threads that publish them.

Guarantees:

- Entries leave the queue in the order they were put on it (the entry writer puts them in
  reservation order, which is sequence order), each exactly once.
- An entry leaves only once its copy completed: ``done`` is None (the bytes are in the ring)
  or ``done.query()`` is true; a ``query`` that raises counts as completed, with what it
  raised in ``Pending.error``, so the publish reports the failed copy instead of waiting
  forever (and never commits it).
- One publisher at a time: :attr:`PublishQueue.send_lock` is held while entries are
  published, and the announcer holds it for every other socket send (ZeroMQ sockets are not
  thread-safe).
- :meth:`PublishQueue.wait_published` returns once every entry queued before the call was
  published (or raises :class:`TimeoutError` saying how many were not).

GIL economy (the publisher thread shares the interpreter with the engine's thread, and every
time it takes the GIL the engine's thread waits for it): the capturing thread publishes what
completed right after each capture (:meth:`PublishQueue.publish_ready` without blocking), the
publisher thread steps in (:meth:`PublishQueue.next_for_publisher`) only once no entry was
queued for the commit grace, and is woken by an enqueue only when it has to act.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["Pending", "PublishQueue", "STOP", "completed"]


@dataclass(slots=True)
class Pending:
    """One entry for the publisher, in reservation (= sequence) order."""

    kind: str
    position: int
    seq: int
    n: int
    length: int
    meta_bytes: bytes
    done: Any = None          # the copy's completion event (CUDA), or None (already in the ring)
    keepalive: Any = None     # sources and staging kept alive until ``done`` completed
    rows: list[dict[str, Any]] = field(default_factory=list)
    #: what ``done.query()`` raised when the queue asked: the copy failed (the publish must
    #: report the rows, never commit them)
    error: BaseException | None = None
    #: an abort entry's (rid, restart): the unheard list settles the rid's open rows by it
    abort: tuple[str, bool] | None = None


#: :meth:`PublishQueue.next_for_publisher`'s answer once the close marker was reached
STOP = object()


def completed(event: Any) -> bool:
    """``event.query()``; True when the query itself fails (the publish reports the copy)."""
    try:
        return bool(event.query())
    except Exception:
        return True


class PublishQueue:
    """The entries waiting to be committed and announced, and the locks of publishing."""

    def __init__(self) -> None:
        #: one publisher at a time; also held for every socket send
        self.send_lock = threading.Lock()
        self._cond = threading.Condition()      # guards the queue; wakes the publisher thread
        self._progress = threading.Condition()  # wait_published waits on it
        self._items: collections.deque[Pending | None] = collections.deque()
        self._queued = 0                        # entries put on the queue (under _cond)
        self._published = 0                     # entries handed to ``publish`` (_progress)
        self._flushing = 0                      # wait_published calls waiting (under _cond)
        #: ring bytes of the queued entries (``Pending.length``; a racy read is fine)
        self.held_bytes = 0
        #: time.monotonic() of the last entry queued
        self.last_enqueue = 0.0

    @property
    def pending(self) -> bool:
        """Whether anything is queued (a racy peek, for a cheap "nothing to do")."""
        return bool(self._items)

    def put(self, item: Pending | None, wake: bool = False, wake_first: bool = True) -> None:
        """Queue ``item`` (None: the close marker, after which nothing is put). The publisher
        thread is woken for the close marker, for ``wake``, and, with ``wake_first``, for a
        first entry whose copy is still running (a complete one is published by the thread
        that put it, right after); otherwise it keeps sleeping, so a busy engine thread does
        not hand it the GIL once per capture. (If that thread cannot take the send lock, the
        publisher holds it and looks at the queue again before it sleeps.) ``wake_first``
        false: the caller knows the publisher looks at the queue in time anyway (its sleep on
        an empty queue, a heartbeat interval, is no longer than its commit grace)."""
        with self._cond:
            self._items.append(item)
            self.last_enqueue = time.monotonic()
            if item is not None:
                self._queued += 1
                self.held_bytes += item.length
            if item is None or wake or (wake_first and item.done is not None
                                        and len(self._items) == 1):
                self._cond.notify_all()

    def in_flight(self) -> list[Pending | None]:
        """The queued entries, oldest first (a copy)."""
        with self._cond:
            return list(self._items)

    def publish_ready(self, block: bool, publish: Callable[[Pending], None],
                      wait_s: float = 0.0) -> bool:
        """Hand every entry at the queue's front whose copy completed to ``publish``, in
        order, under the send lock; with ``block`` false, return False when another thread
        holds that lock (it is publishing) and does not give it up within ``wait_s`` (0: at
        once), else True. ``publish`` must not raise."""
        if block:
            got = self.send_lock.acquire()
        elif wait_s > 0:
            got = self.send_lock.acquire(timeout=wait_s)
        else:
            got = self.send_lock.acquire(blocking=False)
        if not got:
            return False
        n = 0
        items = self._items
        try:
            while True:
                with self._cond:
                    item = items[0] if items else None
                    if item is None:
                        break
                    done = item.done
                    if done is not None and item.error is None:
                        try:
                            if not done.query():
                                break
                        except Exception as exc:   # the copy failed: publish reports it
                            item.error = exc
                    items.popleft()
                    self.held_bytes -= item.length
                publish(item)
                n += 1
        finally:
            self.send_lock.release()
        if n:
            with self._progress:
                self._published += n
                # wait_published counts itself in _flushing BEFORE it takes this lock to look
                # at _published, so a waiter either sees the sum above or is counted here
                if self._flushing:
                    self._progress.notify_all()
        return True

    def wait_published(self, timeout_s: float) -> None:
        """Wait until every entry queued so far was published; while waiting, the publisher
        thread's commit grace is cut short. Raises TimeoutError after ``timeout_s``."""
        with self._cond:
            target = self._queued
            self._flushing += 1
            self._cond.notify_all()
        try:
            with self._progress:
                if not self._progress.wait_for(lambda: self._published >= target, timeout_s):
                    raise TimeoutError(
                        f"Producer.flush: {target - self._published} entries still pending "
                        f"after {timeout_s:g}s (a copy that never completes?)")
        finally:
            with self._cond:
                self._flushing -= 1

    def next_for_publisher(self, grace_s: float, wait_s: float) -> Pending | object | None:
        """For the publisher thread: the head entry to wait for and publish now; None when
        there is nothing to do yet (it waited up to ``wait_s`` for an entry, or up to the rest
        of the grace); :data:`STOP` once the close marker is at the head (removed).

        The grace (``grace_s`` > 0): while entries keep being queued, i.e. until none was
        queued for ``grace_s``, the head is left to the capturing thread; a pending close or
        :meth:`wait_published` cuts it short."""
        with self._cond:
            if not self._items:
                self._cond.wait(wait_s)
                return None
            head = self._items[0]
            if head is None:
                self._items.popleft()
                return STOP
            if grace_s and self._items[-1] is not None and not self._flushing:
                idle = time.monotonic() - self.last_enqueue
                if idle < grace_s:
                    # entries are still coming: the next capture publishes this one
                    self._cond.wait(min(grace_s - idle, wait_s))
                    return None
            return head
