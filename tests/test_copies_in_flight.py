"""The producer's publishing while copies are still in flight, on any machine.

On a GPU a capture's copy completes later, on a side stream, and the producer must commit and
announce each entry only after its copy completed, in reservation order. On the CPU the copy is
done when ``capture`` returns, so those branches only ran on the GPU host. Here the entry's
copy is made by the CPU as always, and its completion is withheld by a stand-in for the CUDA
``done`` event (``query()`` / ``synchronize()``, the two calls the producer makes on one),
released by the test: the ordering rules run in CI. tests/test_gpu.py checks the same with
real CUDA events.
"""

from __future__ import annotations

import threading

import pytest
import torch

from hscapture import Producer, Subscriber
from hscapture.errors import SampleDroppedError, SampleTimeoutError

from capture_support import assert_sample_exact, source

HIDDEN, LAYERS = 16, [0, 3]


class HeldCopy:
    """Completes when the test says so: ``query()`` is non-blocking, ``synchronize()`` blocks
    (like the CUDA event's, without the GIL held by the waiter's work)."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self.synchronized = 0
        self.waiters: set[str] = set()     # the threads that blocked on it

    def complete(self) -> None:
        self._done.set()

    def query(self) -> bool:
        return self._done.is_set()

    def synchronize(self) -> None:
        self.synchronized += 1
        self.waiters.add(threading.current_thread().name)
        self._done.wait(60)


def _holding(p: Producer, kinds: list[type] | None = None) -> list[HeldCopy]:
    """Make every later capture of ``p`` hand out a HeldCopy as its ``done`` event (or, in
    turn, an instance of each of ``kinds`` first)."""
    held: list[HeldCopy] = []
    real = p._copier.copy_into
    kinds = list(kinds or [])

    def copy_into(*args, **kwargs):
        done, keep = real(*args, **kwargs)
        assert done is None, "host tensors: the copy is complete when it returns"
        held.append((kinds.pop(0) if kinds else HeldCopy)())
        return held[-1], None
    p._copier.copy_into = copy_into
    return held


def _capture(p: Producer, rid: str, tokens: int) -> None:
    tensors, ids = source(rid, tokens, HIDDEN, len(LAYERS))
    assert p.capture(rid, tensors, layers=LAYERS, token_ids=ids)


@pytest.fixture
def pair(endpoint):
    p = Producer(endpoint, producer_id="held", capacity=8 << 20, commit_grace_s=0.005)
    sub = Subscriber(endpoint)
    sub.wait_ready(timeout=10)
    yield p, sub
    sub.close()
    p.close(timeout_s=5)


def test_an_entry_is_announced_only_after_its_copy_and_every_earlier_copy_completed(pair):
    """Three entries, the later two complete first: nothing is announced (the first is still
    copying, and entries are committed in reservation order), by the capturing thread or by
    the publisher thread, until the first completes; then all three, in order, exact. The
    capturing thread never blocks on a copy (only the publisher thread waits for one)."""
    p, sub = pair
    held = _holding(p)
    for rid in ("a", "b", "c"):
        _capture(p, rid, 8 + len(held))
    held[1].complete()
    held[2].complete()
    p.publish_completed()                       # the capturing thread's path: head not done
    with pytest.raises(SampleTimeoutError):
        sub.get("b", timeout=0.3)               # nor did the publisher thread announce it
    assert p.stats()["next_seq"] == 3
    assert held[0].synchronized >= 1, "the publisher thread did not wait on the head's copy"
    main = threading.current_thread().name
    assert not any(main in h.waiters for h in held), "a capture blocked on a copy in flight"
    held[0].complete()                          # its synchronize() returns: it publishes
    got = [sub.poll(timeout=10) for _ in range(3)]
    assert [s.rid for s in got if s is not None] == ["a", "b", "c"]   # announced in order
    for s, rid, n in zip(got, "abc", (8, 9, 10)):
        assert_sample_exact(s, rid, n, HIDDEN, LAYERS)
        s.release()


def test_flush_waits_for_copies_in_flight_and_says_how_many_when_it_times_out(pair):
    p, sub = pair
    held = _holding(p)
    _capture(p, "x", 12)
    with pytest.raises(TimeoutError, match="1 entries still pending"):
        p.flush(timeout_s=0.2)
    held[0].complete()
    p.flush(timeout_s=10)
    s = sub.get("x", timeout=10)
    assert_sample_exact(s, "x", 12, HIDDEN, LAYERS)
    s.release()


def test_close_waits_for_a_copy_in_flight_and_announces_it_before_bye(pair):
    """``close`` with a copy still running: the entry is committed and announced once the copy
    completes (here: released from another thread while close waits), before the producer's
    ``bye``; the subscriber gets it exactly."""
    p, sub = pair
    held = _holding(p)
    _capture(p, "last", 20)
    closing = threading.Thread(target=p.close, kwargs={"timeout_s": 30})
    closing.start()
    held[0].complete()
    closing.join(30)
    assert not closing.is_alive()
    s = sub.get("last", timeout=10)
    assert_sample_exact(s, "last", 20, HIDDEN, LAYERS)
    s.release()



class FailedCopy(HeldCopy):
    """A copy the device reports as failed: ``query()`` and ``synchronize()`` raise, as a CUDA
    event's do after a device error."""

    def query(self) -> bool:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def synchronize(self) -> None:
        self.synchronized += 1
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


@pytest.mark.parametrize("inline", [True, False], ids=["capturing thread", "publisher thread"])
def test_a_copy_that_failed_is_reported_by_rid_never_delivered_and_later_entries_flow(
        pair, inline):
    """A copy whose completion query raises: its entry is never committed or announced, its
    rid reaches the subscriber as dropped (``commit_error``), and the next entry, whose copy
    is fine, is delivered exactly, whichever thread publishes."""
    p, sub = pair
    p.inline_publish = inline
    held = _holding(p, [FailedCopy])
    _capture(p, "broken", 8)
    _capture(p, "fine", 9)
    held[1].complete()
    p.publish_completed()
    with pytest.raises(SampleDroppedError, match="commit_error: RuntimeError"):
        sub.get("broken", timeout=10)
    s = sub.get("fine", timeout=10)
    assert_sample_exact(s, "fine", 9, HIDDEN, LAYERS)
    s.release()
    assert p.stats()["errors"] == 1
