"""ServedRanges and MapBudget (hscapture/_served_ranges.py): the reader's rule that no byte of
one shard map is served twice, and the budget after which a set makes fresh maps."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hscapture._served_ranges import MapBudget, ServedRanges

ranges = st.lists(st.tuples(st.integers(0, 200), st.integers(1, 40)).map(
    lambda t: (t[0], t[0] + t[1])), max_size=60)


@settings(max_examples=300, deadline=None)
@given(ranges)
def test_a_range_is_taken_exactly_when_it_shares_no_byte_with_one_taken_before(rs):
    got = ServedRanges()
    taken: set[int] = set()
    for lo, hi in rs:
        free = not any(b in taken for b in range(lo, hi))
        assert got.take(lo, hi) == free, (lo, hi)
        if free:
            taken.update(range(lo, hi))
    assert got.served_bytes == len(taken)


def test_adjacent_ranges_share_no_byte_and_are_both_taken():
    got = ServedRanges()
    assert got.take(10, 20) and got.take(20, 30) and got.take(0, 10)
    assert not got.take(19, 21) and not got.take(5, 6) and not got.take(0, 100)
    assert len(got) == 3 and got.served_bytes == 30


@pytest.mark.parametrize("lo, hi", [(5, 5), (6, 5), (-1, 3)])
def test_an_empty_reversed_or_negative_range_is_refused(lo, hi):
    with pytest.raises(ValueError, match="0 <= lo < hi"):
        ServedRanges().take(lo, hi)


def test_the_budget_moves_to_a_new_epoch_each_time_its_limit_is_served():
    b = MapBudget(100)
    b.spend(60)
    assert b.epoch == 0
    b.spend(40)
    assert (b.epoch, b.served) == (1, 0)
    b.spend(250)
    assert (b.epoch, b.served) == (2, 0)
    with pytest.raises(ValueError, match="positive limit"):
        MapBudget(0)
