"""The SGLang hook's pass-log arena and row batch (hscapture.sglang.log_batch): rows are copied
into an arena without overwriting one another, a host arena is taken back only once no capture
holds a view of it, and a batch merges a sample's chunks only where they continue each other
right after one another in the arena (one row per rid, its ids and fields end to end)."""

from __future__ import annotations

from array import array

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hscapture.sglang.log_batch import Arenas, LogArena, RowBatch


def _row(rid, start, count, last, fields=None):
    return {"rid": rid, "token_start": start, "token_count": count, "last": last,
            "cached_prefix": 0, "extra": {"attempt": 0}, "fields": fields or {}}


def _ids(*values):
    return (array("q", values), 0, len(values))


def test_an_arena_copies_each_pass_into_fresh_rows_and_never_overwrites_earlier_ones():
    hidden, last = torch.arange(40.).reshape(10, 4), torch.arange(20.).reshape(10, 2)
    arena = LogArena([hidden, last], rows=8)
    a = arena.put([hidden, last], 2, 5)
    b = arena.put([hidden * -1, last * -1], 0, 4)
    assert (a, b, arena.used) == (0, 3, 7)
    assert torch.equal(arena.blocks[0][0:3], hidden[2:5])
    assert torch.equal(arena.blocks[1][3:7], -last[0:4])
    assert not arena.fits(arena.key, 2) and arena.fits(arena.key, 1)


def test_a_full_host_arena_is_taken_back_only_once_no_view_of_it_is_alive():
    src = [torch.ones(6, 4)]
    arenas = Arenas()
    first = arenas.for_rows(src, 4, 4 * 16)           # 4 rows of 16 bytes
    first.put(src, 0, 4)
    held = first.blocks[0][0:4]                       # a staged capture's view
    second = arenas.for_rows(src, 4, 4 * 16)
    assert second is not first and arenas.spare is first
    second.put(src, 0, 4)
    third = arenas.for_rows(src, 4, 4 * 16)           # the spare is still read: a new one
    assert third is not first and third is not second
    third.put(src, 0, 4)
    del held
    fourth = arenas.for_rows(src, 4, 4 * 16)          # the spare (second) is idle: reused
    assert fourth is second and fourth.used == 0


def test_a_pass_larger_than_the_arena_bound_gets_an_arena_of_its_own_size():
    src = [torch.ones(100, 4)]
    arena = Arenas().for_rows(src, 100, 64)
    assert arena.rows == 100


def test_a_batch_merges_a_chunk_right_after_its_rows_and_refuses_any_other():
    arena, shape = LogArena([torch.ones(4, 2)], rows=64), ([0], ["residual"], None)
    b = RowBatch()
    b.add(arena, shape, 2, [_row("a", 0, 3, False, {"m": b"\x01\x01\x00"})], [5], [_ids(1, 2, 3)],
          [("a", 0, None, False)], 1.0)
    nxt = _row("a", 3, 2, True, {"m": b"\x00\x01"})
    assert not b.accepts(arena, shape, 2, [nxt], [9], [_ids(4, 5)])       # not right after
    assert not b.accepts(LogArena([torch.ones(4, 2)], 64), shape, 2, [nxt], [8], [_ids(4, 5)])
    assert not b.accepts(arena, shape, 2, [_row("a", 4, 2, True)], [8], [_ids(4, 5)])  # a gap
    assert b.accepts(arena, shape, 2, [nxt], [8], [_ids(4, 5)])
    b.add(arena, shape, 2, [nxt], [8], [_ids(4, 5)], [("a", 0, None, True)], 0.5)
    got = b.take()
    assert not b and got.maps[0]["token_count"] == 5 and got.maps[0]["last"]
    assert got.maps[0]["fields"] == {"m": b"\x01\x01\x00\x00\x01"}
    assert list(got.ids[0][0]) == [1, 2, 3, 4, 5] and got.ids[0][1:] == (0, 5)
    assert got.starts == [5] and got.since == 0.5 and len(got.accepted) == 2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=12), st.integers(0, 50))
def test_a_prompt_chunked_over_consecutive_passes_becomes_one_row_covering_it(sizes, at):
    """Whatever the chunk sizes: each chunk right after the last in the arena, the batch
    holds one row from the first chunk's arena row over every token, ids in order."""
    arena, shape = LogArena([torch.ones(1, 2)], rows=1000), ([0], ["residual"], None)
    b, start, pos = RowBatch(), 0, at
    for k, n in enumerate(sizes):
        m = _row("p", start, n, k == len(sizes) - 1)
        ids = _ids(*range(start, start + n))
        assert b.accepts(arena, shape, 2, [m], [pos], [ids])
        b.add(arena, shape, 2, [m], [pos], [ids], [("p", 0, None, m["last"])], None)
        start, pos = start + n, pos + n
    assert len(b.maps) == 1 and b.starts == [at]
    assert b.maps[0]["token_count"] == sum(sizes) and b.maps[0]["last"]
    assert list(b.ids[0][0][:b.ids[0][2]]) == list(range(sum(sizes)))
