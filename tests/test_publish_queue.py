"""hscapture._publish_queue: the order in which entries may be published, and by whom."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hscapture._publish_queue import STOP, Pending, PublishQueue, completed


class Copy:
    def __init__(self, done: bool = False) -> None:
        self.done = done

    def query(self) -> bool:
        return self.done


class Broken:
    def query(self) -> bool:
        raise RuntimeError("the device is gone")


def _entry(seq: int, done=None) -> Pending:
    return Pending("batch", 64 * seq, seq, 1, 64, b"", done)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=12), st.data())
def test_entries_leave_in_queue_order_and_only_behind_completed_copies(done_flags, data):
    """Whatever completes when, ``publish_ready`` hands out a prefix of the queue, in order,
    every entry once, and stops at the first copy still running."""
    q = PublishQueue()
    copies = [Copy(f) for f in done_flags]
    for i, c in enumerate(copies):
        q.put(_entry(i, c))
    out: list[int] = []
    for _ in range(3):
        q.publish_ready(False, lambda e: out.append(e.seq))
        first_running = next((i for i, c in enumerate(copies) if not c.done), len(copies))
        assert out == list(range(first_running))
        for i in data.draw(st.lists(st.integers(0, len(copies) - 1), max_size=4)):
            copies[i].done = True
    for c in copies:
        c.done = True
    q.publish_ready(True, lambda e: out.append(e.seq))
    assert out == list(range(len(copies))) and not q.pending


def test_a_copy_whose_query_fails_counts_as_completed_so_the_publish_reports_it():
    assert completed(Broken()) and completed(Copy(True)) and not completed(Copy(False))
    q = PublishQueue()
    q.put(_entry(0, Broken()))
    got: list[Pending] = []
    q.publish_ready(True, got.append)
    assert [e.seq for e in got] == [0]
    assert isinstance(got[0].error, RuntimeError)   # what the publish must report


def test_the_capturing_thread_does_not_publish_while_another_thread_holds_the_send_lock():
    q = PublishQueue()
    q.put(_entry(0))
    got: list[int] = []
    with q.send_lock:
        q.publish_ready(False, lambda e: got.append(e.seq))   # returns at once
    assert got == [] and q.pending
    q.publish_ready(False, lambda e: got.append(e.seq))
    assert got == [0]


def test_a_publish_told_to_wait_gives_up_after_wait_s_and_publishes_once_the_lock_is_free():
    q = PublishQueue()
    q.put(_entry(0))
    got: list[int] = []
    with q.send_lock:
        t0 = time.monotonic()
        assert not q.publish_ready(False, lambda e: got.append(e.seq), wait_s=0.02)
        assert time.monotonic() - t0 >= 0.015   # it waited (bounded), then left the entry
    assert got == [] and q.pending
    assert q.publish_ready(False, lambda e: got.append(e.seq), wait_s=0.02)
    assert got == [0] and not q.pending


def test_the_publisher_thread_waits_out_the_grace_then_takes_the_head_and_stops_at_close():
    q = PublishQueue()
    assert q.next_for_publisher(0.0, 0.01) is None            # nothing queued: waited, None
    head = _entry(0, Copy(False))
    q.put(head)
    assert q.next_for_publisher(60.0, 0.01) is None           # inside the grace: left alone
    q.last_enqueue = time.monotonic() - 61                    # (as if 61 s passed: no sleep)
    assert q.next_for_publisher(60.0, 0.01) is head
    assert q.next_for_publisher(0.0, 0.01) is head            # no grace: at once
    q.put(None)                                               # close cuts the grace
    q.last_enqueue = time.monotonic()
    assert q.next_for_publisher(60.0, 0.01) is head
    head.done.done = True
    q.publish_ready(True, lambda e: None)
    assert q.next_for_publisher(60.0, 0.01) is STOP and not q.pending


def test_wait_published_cuts_the_grace_and_says_how_many_are_pending_when_it_times_out():
    q = PublishQueue()
    released = threading.Event()
    q.put(_entry(0, Copy(False)))
    q.put(_entry(1))
    seen: list[object] = []

    def publisher() -> None:      # the producer's loop, in short (synchronize = released)
        while True:
            head = q.next_for_publisher(3600.0, 0.01)
            if head is STOP:
                return
            if head is not None:
                seen.append(head)
                if not completed(head.done):
                    released.wait(30)
                q.publish_ready(True, lambda e: None)

    t = threading.Thread(target=publisher, daemon=True)
    t.start()
    with pytest.raises(TimeoutError, match="2 entries still pending"):
        q.wait_published(0.2)
    assert seen, "wait_published did not cut the publisher's hour-long grace"
    q.in_flight()[0].done.done = True
    released.set()
    q.wait_published(10)
    q.put(None)
    t.join(10)
    assert not t.is_alive()


def test_wait_published_is_woken_by_a_publish_on_another_thread_every_time():
    """``publish_ready`` notifies only when a ``wait_published`` is counted in; a waiter
    counted in while its entry is still pending must be woken by the publish, never left to
    its timeout. 100 rounds, the interleaving forced each time: an entry is put, the waiter
    starts waiting for it, and only once it is counted in does the other thread publish."""
    q = PublishQueue()
    stop = threading.Event()

    def capturing() -> None:
        seq = 0
        while not stop.is_set():
            q.put(_entry(seq))
            seq += 1
            while not q._flushing and not stop.is_set():
                time.sleep(0)                # yield until the waiter is counted in
            q.publish_ready(False, lambda e: None)
            while q._flushing and not stop.is_set():
                time.sleep(0)                # until that waiter has returned

    t = threading.Thread(target=capturing, daemon=True)
    t.start()
    try:
        for i in range(100):
            while not q.pending:
                time.sleep(0)                # the next entry is queued, not yet published
            t0 = time.monotonic()
            q.wait_published(3.0)            # a lost wake-up waits out the whole 3 s
            took = time.monotonic() - t0
            assert took < 1.5, f"wait {i} took {took:.2f} s: a lost wake-up"
    finally:
        stop.set()
        t.join(10)


def _notifies(*puts) -> int:
    """How many times ``put`` notified the publisher thread's condition over ``puts``
    (``(item, put's keyword arguments)`` pairs, on a fresh queue)."""
    q = PublishQueue()
    n = [0]
    real = q._cond.notify_all

    def spy() -> None:
        n[0] += 1
        real()
    q._cond.notify_all = spy
    for item, kw in puts:
        q.put(item, **kw)
    return n[0]


def test_a_first_pending_entry_wakes_the_sleeping_publisher_only_with_wake_first():
    """``put`` wakes the publisher thread for the close marker, for ``wake``, and for a first
    entry whose copy is still running unless ``wake_first`` is false. The producer passes
    false when its commit grace is no shorter than the publisher's sleep on an empty queue (a
    heartbeat interval): the publisher then finds the entry before its grace ends without the
    capturing thread handing it the GIL for each entry (the SGLang hook's default since
    2026-12-04)."""
    assert _notifies((_entry(0, Copy(False)), {})) == 1
    assert _notifies((_entry(0, Copy(False)), {"wake_first": False})) == 0
    assert _notifies((_entry(0, Copy(False)), {}), (_entry(1, Copy(False)), {})) == 1
    assert _notifies((_entry(0, None), {})) == 0          # complete: its putter publishes it
    assert _notifies((_entry(0, Copy(False)), {"wake": True, "wake_first": False})) == 1
    assert _notifies((None, {"wake_first": False})) == 1  # the close marker, always


def test_an_entry_put_without_a_wake_is_taken_once_the_grace_after_it_passed():
    """What makes ``wake_first=False`` safe: the publisher's next look at the queue (its
    sleep on an empty queue ends within ``wait_s``) finds the entry inside the grace and
    leaves it, and takes it once the grace after the last entry passed, its copy done."""
    q = PublishQueue()
    assert q.next_for_publisher(0.5, 0.01) is None            # asleep on the empty queue
    head = _entry(0, Copy(False))
    q.put(head, wake_first=False)
    assert q.next_for_publisher(0.5, 0.01) is None            # inside the grace: left alone
    q.last_enqueue = time.monotonic() - 0.6                   # (as if 0.6 s passed)
    assert q.next_for_publisher(0.5, 0.01) is head
