"""The ring's position arithmetic against a plain Python model (property-based).

A real C++ Producer and a real Consumer (same process, real shared memory) run a random
sequence of reserve (data or control, with a random control_reserve) / commit / abort /
put / release, the consumer reading by poll() or take_into(); every returned position, every "full", every record the consumer sees, every padding
skip and the full counters must match the model below.
"""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hscapture import _ring
from hscapture.errors import RecordTooLargeError

HDR = _ring.RECORD_HEADER_SIZE
ALIGN = _ring.RECORD_ALIGN


def total_len(n: int) -> int:
    return (HDR + n + ALIGN - 1) // ALIGN * ALIGN


class RingModel:
    """Positions only: head, padding at wrap, control headroom, and one consumer that polls
    everything.

    A data reservation may occupy at most ``capacity - control_reserve`` bytes beyond the
    consumer's released position (it must leave the headroom free); a control reservation the
    whole capacity. Release rules of the consumer (mirrored from csrc/ring.cpp): skipped records (padding,
    aborted) are released at once when the consumer holds nothing; releasing the end of the
    last record returned also releases the skipped records after it.
    """

    def __init__(self, capacity: int, control_reserve: int = 0):
        self.capacity = capacity
        self.control_reserve = control_reserve
        self.full = 0
        self.control_full = 0
        self.head = 0
        self.released = 0
        self.position = 0   # consumer read position
        self.last_end = 0   # end of the last record the consumer got

    def reserve(self, n: int, control: bool = False) -> int | None:
        """Position of the new record, -1 if full, None if it can never fit."""
        avail = self.capacity - (0 if control else self.control_reserve)
        t = total_len(n)
        if t > avail:
            return None
        off = self.head % self.capacity
        pad = self.capacity - off if off + t > self.capacity else 0
        end = self.head + pad + t
        if end - self.released > avail:
            self.full += 1
            self.control_full += control
            if pad and self.head + pad - self.released <= avail:
                self.head += pad  # padding published early (within the headroom rule), record refused
            return -1
        pos = self.head + pad
        self.head = end
        return pos

    def poll(self, record: tuple[int, int] | None) -> None:
        """The consumer polls up to the head; `record` = (position, end) of the record it gets."""
        skip_to = record[0] if record else self.head
        if skip_to > self.position and self.released >= self.last_end:
            self.released = skip_to  # skipped space, nothing held: released at once
        if record:
            self.position = self.last_end = record[1]
        else:
            self.position = self.head

    def release(self, upto: int) -> None:
        if upto == self.last_end:
            upto = self.position
        self.released = max(self.released, upto)


def _unique() -> str:
    return f"hsctest-model-{uuid.uuid4().hex[:16]}"


capacities = st.sampled_from([128, 192, 256, 320, 1024, 4096]).flatmap(
    lambda cap: st.tuples(
        st.just(cap),
        st.one_of(st.just(0), st.integers(0, cap // 2 - 1), st.sampled_from([cap // 4, cap // 2 - 64, cap // 2 - 1])),
        st.lists(
            st.one_of(
                st.tuples(st.just("reserve"), st.integers(0, cap), st.sampled_from(["commit", "commit", "abort"]),
                          st.booleans()),
                # exact fit to the end of the data region
                st.tuples(st.just("reserve_fit"), st.just(0), st.just("commit"), st.booleans()),
                st.tuples(st.just("release"), st.integers(0, 8), st.just(""), st.just(False)),
                # put(): the same placement, written and committed in one call; read back by
                # poll() or copied out by take_into() (into too small a buffer first, now and then)
                st.tuples(st.just("put"), st.integers(0, cap),
                          st.sampled_from(["poll", "take", "take_small"]), st.booleans()),
            ),
            min_size=1,
            max_size=120,
        ),
    )
)


def _put_and_read(p, c, model: RingModel, n: int, how: str, control: bool, seq: int,
                  read_ends: list[int]) -> list[int] | None:
    """One ``put`` of ``n`` bytes checked against the model, then read back ``how``. Returns
    the ends still held (None when nothing was committed: full or too large)."""
    data = bytes((seq * 7 + i) % 251 for i in range(n))
    want = model.reserve(n, control)
    if want is None:
        with pytest.raises(RecordTooLargeError):
            p.put(data, control=control)
        assert p.head == model.head
        return None
    got = p.put(data, tag=seq, control=control)
    assert got == want and p.head == model.head
    if got == -1:
        assert c.poll() is None
        model.poll(None)
        return None
    end = got + total_len(n)
    if how == "poll":
        rec = c.poll()
        assert (rec.position, rec.end, rec.payload_len, rec.seq, rec.tag) == (got, end, n, seq, seq)
        assert bytes(rec.payload) == data
        model.poll((got, end))
        return read_ends + [end]
    if how == "take_small" and n:
        with pytest.raises(ValueError, match=f"payload is {n} bytes"):
            c.take_into(bytearray(n - 1))
        assert c.position == got   # not taken: still the next record
    dst = bytearray(n + 5)
    assert c.take_into(dst) == (n, seq, seq)
    assert bytes(dst[:n]) == data and dst[n:] == bytes(5)
    model.poll((got, end))
    model.release(end)   # take_into releases through the record's end, as release(end) does
    return []


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(capacities)
def test_positions_padding_wrap_headroom_and_full_match_the_model(case):
    capacity, control_reserve, ops = case
    model = RingModel(capacity, control_reserve)
    name = _unique()
    p = _ring.Producer(name, capacity, 2, control_reserve=control_reserve)
    c = _ring.Consumer(name)
    try:
        read_ends: list[int] = []  # ends of records the consumer has read but not released
        expected_seq = 0
        for op, arg, how, control in ops:
            if op == "release":
                # release up to the end of the arg-th oldest read record (0 = release nothing)
                if arg and read_ends:
                    k = min(arg, len(read_ends))
                    upto = read_ends[k - 1]
                    c.release(upto)
                    model.release(upto)
                    del read_ends[:k]
                assert c.released == model.released
                continue
            if op == "put":
                read_ends = _put_and_read(p, c, model, arg, how, control, expected_seq, read_ends)
                if read_ends is not None:
                    expected_seq += 1
                read_ends = read_ends or []
                assert c.poll() is None
                assert c.position == model.position == model.head
                assert c.released == model.released
                continue
            if op == "reserve_fit":  # a payload that ends exactly at the end of the data region
                arg = capacity - model.head % capacity - HDR
                if arg < 0:
                    continue
            want = model.reserve(arg, control)
            if want is None:
                with pytest.raises(RecordTooLargeError):
                    p.reserve(arg, control=control)
                continue
            got = p.reserve(arg, tag=expected_seq, control=control)
            assert got == want, (op, arg, control, model.head)
            assert p.head == model.head
            if got == -1:
                assert c.poll() is None
                model.poll(None)
            else:
                assert p.record_seq(got) == expected_seq
                assert len(p.payload(got)) == arg
                (p.commit if how == "commit" else p.abort)(got)
                rec = c.poll()
                if how == "abort":
                    assert rec is None  # aborted records (and padding) are skipped
                    model.poll(None)
                else:
                    end = got + total_len(arg)
                    assert rec is not None
                    assert (rec.position, rec.end, rec.payload_len, rec.seq, rec.tag) == (
                        got, end, arg, expected_seq, expected_seq)
                    model.poll((got, end))
                    read_ends.append(end)
                expected_seq += 1
            assert c.poll() is None
            assert c.position == model.position == model.head
            assert c.released == model.released
        stats = p.stats()
        assert stats["head"] == model.head
        assert stats["min_released"] == model.released
        assert (stats["full_count"], stats["control_full"]) == (model.full, model.control_full)
    finally:
        c.close()
        p.close()


def test_record_of_exactly_capacity_fits_only_when_empty(ring_name):
    cap = 1024
    p = _ring.Producer(ring_name, cap)
    c = _ring.Consumer(ring_name)
    pos = p.reserve(cap - HDR)
    assert pos == 0 and p.head == cap
    p.commit(pos)
    assert p.reserve(0) == -1  # full until released
    rec = c.poll()
    assert rec.payload_len == cap - HDR and rec.end == cap
    c.release(rec.end)
    assert p.reserve(cap - HDR) == cap  # empty again, at offset 0: fits again
    c.close()
    p.close()


def test_record_larger_than_capacity_raises_record_too_large(ring_name):
    p = _ring.Producer(ring_name, 1024)
    with pytest.raises(RecordTooLargeError, match="expected at most the ring capacity 1024"):
        p.reserve(1024 - HDR + 1)
    with pytest.raises(RecordTooLargeError):
        p.reserve(1 << 40)
    assert p.head == 0
    p.close()


def test_wraps_many_times_with_padding(ring_name):
    cap = 1024
    model = RingModel(cap)
    p = _ring.Producer(ring_name, cap)
    c = _ring.Consumer(ring_name)
    sizes = [0, 1, 63, 64, 100, 300, 500, 800]
    for i in range(20000):
        n = sizes[i % len(sizes)]
        want = model.reserve(n)
        got = p.reserve(n)
        assert got == want
        if got == -1:  # padding published early; the consumer skips (and frees) it
            assert c.poll() is None
            model.poll(None)
            want = model.reserve(n)
            got = p.reserve(n)
            assert got == want >= 0
        p.commit(got)
        rec = c.poll()
        assert rec.position == got and rec.seq == i
        c.release(rec.end)
        model.poll((got, rec.end))
        model.release(rec.end)
        assert c.released == model.released
    assert p.head > 100 * cap
    c.close()
    p.close()


def test_no_consumer_means_never_full(ring_name):
    p = _ring.Producer(ring_name, 1024)
    for _ in range(1000):
        pos = p.reserve(200)
        assert pos >= 0
        p.commit(pos)
    p.close()


def test_consumer_starts_at_head_at_attach(ring_name):
    p = _ring.Producer(ring_name, 4096)
    for _ in range(3):
        p.commit(p.reserve(10))
    c = _ring.Consumer(ring_name)
    assert c.position == c.released == p.head == c.head
    assert c.poll() is None
    pos = p.reserve(5)
    p.commit(pos)
    assert c.poll().position == pos
    c.close()
    p.close()


def test_release_is_monotonic_and_bounded_by_read_position(ring_name):
    p = _ring.Producer(ring_name, 4096)
    c = _ring.Consumer(ring_name)
    p.commit(p.reserve(10))
    rec = c.poll()
    c.release(rec.end)
    c.release(0)  # going backwards is a no-op
    assert c.released == rec.end
    with pytest.raises(ValueError):
        c.release(rec.end + 64)
    c.close()
    p.close()


def test_the_producer_never_laps_over_its_own_uncommitted_records(ring_name):
    """With no consumer at all, a record still being written (its copy may be in flight) is
    never overwritten: the producer reports full instead, until that record is committed."""
    p = _ring.Producer(ring_name, 4096, 2)
    try:
        assert [p.reserve(1000, 0) for _ in range(3)] == [0, 1088, 2176]   # 1088 B each
        assert p.reserve(1000, 0) == -1, "lapped over the uncommitted record at 0"
        assert p.reserve(1000, 0) == -1
        p.commit(1088)                       # committing a later one frees nothing yet
        assert p.reserve(1000, 0) == -1
        p.commit(0)                          # the oldest: now 0..2176 may be reused
        assert p.reserve(1000, 0) == 4096
    finally:
        p.close(True)
