"""Control headroom: data reservations leave `control_reserve` bytes free; control ones may use
them. Exact positions, in the middle of the ring and at the wrap point."""

from __future__ import annotations

import pytest

from hscapture import _ring
from hscapture.errors import RecordTooLargeError

CAP, RESERVE = 4096, 1024
P448 = 448  # total 512
P960 = 960  # total 1024
P1472 = 1472  # total 1536


def test_record_sizes_used_below():
    assert [_ring.record_total_len(n) for n in (P448, P960, P1472)] == [512, 1024, 1536]


def test_data_fails_full_while_control_still_fits_in_the_headroom(ring_name):
    p = _ring.Producer(ring_name, CAP, 2, control_reserve=RESERVE)
    c = _ring.Consumer(ring_name)  # releases nothing: only the headroom rule decides
    try:
        assert p.control_reserve == RESERVE
        assert [p.reserve(P448) for _ in range(6)] == [0, 512, 1024, 1536, 2048, 2560]
        for pos in range(0, 3072, 512):
            p.commit(pos)
        assert p.reserve(P448) == -1, "a 7th data record would leave only 512 of the 1024 bytes of headroom"
        assert p.head == 3072
        assert p.reserve(P448, control=True) == 3072
        assert p.reserve(P448, control=True) == 3584
        assert p.reserve(0, control=True) == -1  # the whole ring is in use now
        stats = p.stats()
        assert (stats["full_count"], stats["control_full"]) == (2, 1)
        assert _ring.segment_info(ring_name)["control_full"] == 1
        p.commit(3072)
        p.commit(3584)
        seen = []
        while (r := c.poll()) is not None:
            seen.append(r.position)
        assert seen == list(range(0, 4096, 512))
        c.release(1024)  # 1024 free again: exactly the headroom, still no room for data
        assert p.reserve(0) == -1
        assert p.reserve(0, control=True) == 4096
    finally:
        c.close()
        p.close(True)


def test_at_the_wrap_point_padding_for_data_never_eats_the_headroom_and_control_may(ring_name):
    p = _ring.Producer(ring_name, CAP, 2, control_reserve=RESERVE)
    c = _ring.Consumer(ring_name)
    try:
        for _ in range(3):
            p.commit(p.reserve(P960))  # 0, 1024, 2048: head 3072 = capacity - headroom
        # A 1536-byte record does not fit before the end (1024 left): it needs 1024 of padding.
        assert p.reserve(P1472) == -1
        assert p.head == 3072, "the data padding (to 4096) would leave no headroom: not published"
        assert p.reserve(P1472, control=True) == -1, "even a control record needs 5632 - 0 <= 4096"
        assert p.head == 4096, "a control reservation may publish the padding into the headroom"
        recs = []
        while (r := c.poll()) is not None:
            recs.append(r)
        assert [r.position for r in recs] == [0, 1024, 2048]
        c.release(recs[1].end)  # released 2048
        assert p.reserve(P1472) == -1, "data at 4096..5632 would leave 512 < 1024 free"
        assert p.reserve(P1472, control=True) == 4096
        stats = p.stats()
        assert (stats["full_count"], stats["control_full"]) == (3, 1)
    finally:
        c.close()
        p.close(True)


def test_a_control_record_at_the_wrap_point_fits_with_its_padding_where_data_does_not(ring_name):
    p = _ring.Producer(ring_name, CAP, 2, control_reserve=RESERVE)
    c = _ring.Consumer(ring_name)
    try:
        for _ in range(3):
            p.commit(p.reserve(P960))
        while (r := c.poll()) is not None:
            last = r
            if r.position == 1024:
                c.release(r.end)  # released 2048
        assert last.position == 2048
        # data: padding 3072..4096 + record 4096..5632 would leave 6144 - 5632 = 512 < 1024 free;
        # the padding alone (ending at 4096) leaves 2048, so it is published early
        assert p.reserve(P1472) == -1 and p.head == 4096
        p2 = _ring.Producer(ring_name + "-b", CAP, 2, control_reserve=RESERVE)
        c2 = _ring.Consumer(ring_name + "-b")
        try:
            for _ in range(3):
                p2.commit(p2.reserve(P960))
            while (r := c2.poll()) is not None:
                if r.position == 1024:
                    c2.release(r.end)
            # control: padding and record placed by one reservation, at offset 0 of the next lap
            pos = p2.reserve(P1472, tag=7, control=True)
            assert pos == 4096 and p2.head == 5632
            p2.commit(pos)
            r = c2.poll()  # the padding is skipped
            assert (r.position, r.tag) == (4096, 7)
        finally:
            c2.close()
            p2.close(True)
    finally:
        c.close()
        p.close(True)


def test_a_data_record_larger_than_capacity_minus_headroom_can_never_fit(ring_name):
    p = _ring.Producer(ring_name, CAP, 2, control_reserve=RESERVE)
    try:
        with pytest.raises(RecordTooLargeError, match="expected at most 3072 .capacity 4096 minus control_reserve 1024"):
            p.reserve(3072 - 64 + 1)
        assert p.reserve(3072 - 64) == 0  # exactly the data limit
        p.commit(0)
        p2 = _ring.Producer(ring_name + "-c", CAP, 2, control_reserve=RESERVE)
        try:
            assert p2.reserve(CAP - 64, control=True) == 0  # a control record may fill the ring
        finally:
            p2.close(True)
    finally:
        p.close(True)


@pytest.mark.parametrize("reserve", [2048, 4096, 1 << 40])
def test_control_reserve_of_half_the_capacity_or_more_is_refused(ring_name, reserve):
    with pytest.raises(ValueError, match=f"control_reserve {reserve}: expected less than capacity / 2"):
        _ring.Producer(ring_name, CAP, 2, control_reserve=reserve)
    p = _ring.Producer(ring_name, CAP, 2, control_reserve=2047)
    p.close(True)
