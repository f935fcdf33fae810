"""SequenceTracker against a plain set model: seen numbers, duplicates, gaps, and that numbers
arriving in order stay one range (so the cost of a query is the number of gaps)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hscapture._sequence import SequenceTracker

ops = st.lists(st.tuples(st.integers(0, 200), st.integers(1, 20)), min_size=1, max_size=60)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_the_tracker_agrees_with_a_set_of_seen_numbers(adds):
    t, model = SequenceTracker(), set()
    for seq, n in adds:
        new = set(range(seq, seq + n))
        assert t.add(seq, n) == len(new & model)       # duplicates counted exactly
        model |= new
    base = min(s for s, _ in adds)
    assert t.base == base and t.high == max(model) + 1
    for x in range(0, 230):
        assert t.seen(x) == (x in model)
    gaps = {x for a, b in t.missing() for x in range(a, b)}
    assert gaps == set(range(base, max(model) + 1)) - model
    assert t.count(0, 230) == len(model)
    starts = t._starts
    assert all(e < s for e, s in zip(t._ends, starts[1:])), "ranges must be disjoint, not adjacent"


def test_numbers_arriving_in_order_stay_one_range():
    t = SequenceTracker()
    for seq in range(0, 100_000, 4):
        t.add(seq, 4)
    assert len(t._starts) == 1 and t.missing() == []


def test_numbers_below_a_promise_never_count_as_missing_whatever_is_seen_later():
    # a late subscriber is promised the numbers the producer takes from its attach on: gaps
    # count from there before anything is read, and a drop the backlog wrote out of order
    # (a number below the promise, named by rid) does not make the numbers between it and
    # the promise missing (fault hunt 2026-12-06, e1)
    t = SequenceTracker()
    t.promise_from(5)
    assert t.missing_below(8) == [(5, 8)]
    assert t.add(2, 1) == 0
    assert t.missing_below(8) == [(5, 8)] and t.base == 5
    t.add(6, 1)
    assert t.missing_below(8) == [(5, 6), (7, 8)]
    assert t.seen(2) and t.seen(6) and not t.seen(5)
