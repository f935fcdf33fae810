"""The native CUDA copy path's copy plan (``hscapture._cuda_copy.plan_copies``), executed.

The plan is what ``cuda_submit`` hands the CUDA driver: 2D copies (dst, dst_pitch, src,
src_pitch, width, height), ``pre`` on the caller's stream, then ``post`` on the side stream.
Here the same copies run on host memory (``ctypes.memmove`` row by row: what a 2D copy
means) with host arrays standing in for the device sources and the staging allocation, and
the token ids taken by the real ``take_ids`` from a CPU tensor, so the arithmetic is checked
for any rows, spans, row pitches, id widths and strides; tests/test_gpu.py runs the real
thing on a GPU.
"""

from __future__ import annotations

import ctypes
from array import array

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hscapture import _ring
from hscapture._cuda_copy import plan_copies, plan_staged_copies, staging_bytes, take_ids


def _run(copies, *buffers: np.ndarray) -> None:
    """Execute a flat plan: each sextuple is ``height`` rows of ``width`` bytes. Every row
    must lie inside one of ``buffers`` (a plan that strays fails here, it never writes)."""
    spans = [(_addr(b), _addr(b) + b.nbytes) for b in buffers]

    def inside(a: int, n: int) -> bool:
        return any(lo <= a and a + n <= hi for lo, hi in spans)
    v = list(copies)
    assert len(v) % 6 == 0
    for i in range(0, len(v), 6):
        dst, dpitch, src, spitch, width, height = v[i:i + 6]
        assert width <= dpitch and width <= spitch, "a pitch narrower than the row"
        for r in range(height):
            assert inside(dst + r * dpitch, width) and inside(src + r * spitch, width), \
                f"copy {i // 6} row {r} leaves the buffers"
            ctypes.memmove(dst + r * dpitch, src + r * spitch, width)


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


@st.composite
def cases(draw):
    t_src = draw(st.integers(1, 40))
    # row spans in order, non-overlapping, not adjacent or adjacent (merged or not: both valid)
    cuts = sorted(draw(st.sets(st.integers(0, t_src), min_size=2, max_size=14)))
    pairs = [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]
    spans = draw(st.lists(st.sampled_from(pairs), min_size=1, max_size=len(pairs), unique=True)
                 ) if pairs else [(0, t_src)]
    spans = sorted(spans)
    blocks = draw(st.lists(st.tuples(st.sampled_from(["<u2", "<f4", "<u1"]),
                                     st.integers(1, 9), st.integers(0, 5)),
                           min_size=1, max_size=3))          # (dtype, cols, extra pitch cols)
    ids = draw(st.sampled_from([None, "<i8", "<i4"]))
    ids_stride = draw(st.integers(1, 3))
    snapshot = draw(st.booleans())
    return t_src, spans, blocks, ids, ids_stride, snapshot


@settings(max_examples=300, deadline=None)
@given(cases())
def test_the_plan_puts_every_spans_rows_and_ids_exactly_where_the_entry_layout_says(case):
    t_src, spans, blocks, ids_kind, ids_stride, snapshot = case
    rng = np.random.default_rng(len(spans) * 31 + t_src)
    tokens = sum(e - s for s, e in spans)
    srcs, wants, metas = [], [], []
    for dt, cols, pad in blocks:
        wide = rng.integers(0, 255, size=(t_src, (cols + pad) * np.dtype(dt).itemsize),
                            dtype=np.uint8)              # rows of cols + pad elements
        srcs.append(wide)
        esz = np.dtype(dt).itemsize
        metas.append((_addr(wide), wide.shape[1], cols * esz))   # pitch > width when pad
        wants.append(np.concatenate([wide[s:e, :cols * esz] for s, e in spans]))
    ids_full = taken = id_want = None
    if ids_kind is not None:
        vals = rng.integers(0, 2**31 - 1, size=t_src * ids_stride, dtype=np.int64)
        ids_full = torch.from_numpy(vals.astype(ids_kind))   # the engine's id tensor
        id_want = np.concatenate([vals[s * ids_stride:e * ids_stride:ids_stride]
                                  for s, e in spans]).astype("<i4")
        taken, id_address, id_spans = take_ids(ids_full[::ids_stride], spans, tokens)
        assert taken.dtype == torch.int32 and taken.is_contiguous()
    # the entry: each block region 64-aligned after the previous one, then the ids
    offsets, at = [], 64
    for w in wants:
        offsets.append(at)
        at = -(-(at + w.nbytes) // 64) * 64
    ids_offset = at
    payload = np.zeros(ids_offset + 4 * tokens, dtype=np.uint8)
    need = staging_bytes(tokens, [m[2] for m in metas], snapshot)
    stage = np.full(max(need, 1), 0xAB, dtype=np.uint8)
    pre, post = plan_copies(_addr(payload), offsets, ids_offset, tokens, spans, metas,
                            None if taken is None else (id_address, id_spans),
                            snapshot, _addr(stage) if need else 0)
    assert (len(pre) > 0) == snapshot, "only snapshots are copied on the caller's stream"
    assert need == 0 or snapshot, "nothing to stage without a snapshot"
    lo, hi = _addr(payload) + ids_offset, _addr(payload) + ids_offset + 4 * tokens
    v = list(post)
    for i in range(0, len(v), 6):
        if lo <= v[i] < hi:
            assert v[i + 5] == 1, "token ids are copied as whole rows, never 4-byte rows"
    bufs = [payload, stage, *srcs] + ([taken.numpy()] if taken is not None else [])
    _run(pre, *bufs)
    if ids_full is not None:
        ids_full.fill_(-1)          # the engine reuses its id tensor right after the forward
    if snapshot:
        for a in srcs:              # graph outputs: overwritten by the next replay
            a.fill(0x5A)
    _run(post, *bufs)               # (without a snapshot the sources live until `done`)
    for w, off in zip(wants, offsets):
        got = payload[off:off + w.nbytes].reshape(w.shape)
        assert np.array_equal(got, w), "a block's rows differ"
    if ids_kind is not None:
        got_ids = payload[ids_offset:ids_offset + 4 * tokens].view("<i4")
        assert np.array_equal(got_ids, id_want), "token ids differ"
    else:
        assert not payload[ids_offset:].any(), "host ids are the caller's to write"


@settings(max_examples=200, deadline=None)
@given(cases())
def test_without_a_snapshot_the_side_stream_reads_the_spans_straight_from_the_sources(case):
    t_src, spans, blocks, _, _, _ = case
    rng = np.random.default_rng(t_src)
    tokens = sum(e - s for s, e in spans)
    srcs, wants, metas, offsets, at = [], [], [], [], 0
    for dt, cols, pad in blocks:
        esz = np.dtype(dt).itemsize
        wide = rng.integers(0, 255, size=(t_src, (cols + pad) * esz), dtype=np.uint8)
        srcs.append(wide)
        metas.append((_addr(wide), wide.shape[1], cols * esz))
        w = np.concatenate([wide[s:e, :cols * esz] for s, e in spans])
        wants.append(w)
        offsets.append(at)
        at = -(-(at + w.nbytes) // 64) * 64
    payload = np.zeros(at + 4 * tokens, dtype=np.uint8)
    pre, post = plan_copies(_addr(payload), offsets, at, tokens, spans, metas, None, False, 0)
    assert len(pre) == 0 and len(post) == 6 * len(spans) * len(blocks)
    _run(post, payload, *srcs)
    for w, off in zip(wants, offsets):
        assert np.array_equal(payload[off:off + w.nbytes].reshape(w.shape), w)


@settings(max_examples=150, deadline=None)
@given(st.lists(cases(), min_size=1, max_size=4), st.integers(1, 4), st.randoms())
def test_a_staged_entrys_spans_go_back_to_back_in_order_from_each_groups_sources(
        groups, n_blocks, rnd):
    """``plan_staged_copies``: several forwards' sources (each its own row pitches) and the
    entry's token rows as ``(group, start, end)`` spans in any order across the groups (a
    merged row's pieces come from several): executed on host memory and compared with the
    spans' rows concatenated in order, block by block."""
    rng = np.random.default_rng(len(groups) * 7 + n_blocks)
    cols = [int(rng.integers(1, 9)) for _ in range(n_blocks)]
    esz = 2
    sources, arrays, spans = [], [], []
    for g, (t_src, g_spans, _, _, _, _) in enumerate(groups):
        metas, mine = [], []
        for b in range(n_blocks):
            pad = int(rng.integers(0, 4))
            wide = rng.integers(0, 255, size=(t_src, (cols[b] + pad) * esz), dtype=np.uint8)
            mine.append(wide)
            metas.append((_addr(wide), wide.shape[1], cols[b] * esz))
        sources.append(metas)
        arrays.append(mine)
        spans += [(g, s, e) for s, e in g_spans]
    rnd.shuffle(spans)
    wants = [np.concatenate([arrays[g][b][s:e, :cols[b] * esz] for g, s, e in spans])
             for b in range(n_blocks)]
    offsets, at = [], 64
    for w in wants:
        offsets.append(at)
        at = -(-(at + w.nbytes) // 64) * 64
    payload = np.zeros(at, dtype=np.uint8)
    post = plan_staged_copies(_addr(payload), offsets, spans, sources)
    assert len(post) == 6 * n_blocks * len(spans)
    _run(post, payload, *[a for mine in arrays for a in mine])
    for w, off in zip(wants, offsets):
        assert np.array_equal(payload[off:off + w.nbytes].reshape(w.shape), w)


@pytest.mark.parametrize("dtype,stride", [(torch.int64, 1), (torch.int32, 1), (torch.int64, 2)])
def test_token_ids_covering_the_whole_tensor_are_taken_without_a_slice_as_a_fresh_copy(
        dtype, stride):
    """Every request row of a forward captured: the spans cover the whole id tensor, which is
    then converted as it is (no slice). The result is still a fresh dense int32 copy, so the
    engine may overwrite its ids right after."""
    full = torch.arange(100, 100 + 12 * stride, dtype=dtype)[::stride]
    taken, address, id_spans = take_ids(full, [(0, 5), (5, 12)], 12)
    assert taken.dtype == torch.int32 and taken.is_contiguous() and id_spans == [(0, 5), (5, 12)]
    assert address == taken.data_ptr() and taken.tolist() == full.tolist()
    full.fill_(-1)
    assert taken.tolist() == list(range(100, 100 + 12 * stride, stride))


@st.composite
def id_sources(draw):
    parts, want = [], []
    for _ in range(draw(st.integers(0, 6))):
        vals = draw(st.lists(st.integers(0, 2**31 - 1), min_size=0, max_size=40))
        kind = draw(st.sampled_from(["array_q", "np_i8", "np_i4"]))
        buf = (array("q", vals) if kind == "array_q" else
               np.array(vals, dtype=np.int64 if kind == "np_i8" else np.int32))
        start = draw(st.integers(0, len(vals)))
        count = draw(st.integers(0, len(vals) - start))
        parts.append((buf, start, count))
        want += vals[start:start + count]
    return parts, want


@settings(max_examples=200, deadline=None)
@given(id_sources(), st.integers(0, 70))
def test_host_row_ids_are_written_as_little_endian_int32_in_row_order(sources, offset):
    """``_ring.write_ids`` (the HostRowIds path): every source's range, in order, as int32 LE
    at the offset; the bytes around it untouched."""
    parts, want = sources
    dst = bytearray(b"\xee" * (offset + 4 * len(want) + 8))
    assert _ring.write_ids(memoryview(dst), offset, parts) == len(want)
    assert np.frombuffer(bytes(dst[offset:offset + 4 * len(want)]), "<i4").tolist() == want
    assert dst[:offset] == b"\xee" * offset and dst[offset + 4 * len(want):] == b"\xee" * 8


@pytest.mark.parametrize("parts,offset,match", [
    ([(array("q", [1, 2, 2**31]), 0, 3)], 0, r"outside \[0, 2\*\*31\)"),
    ([(array("q", [1, -1]), 0, 2)], 0, r"outside \[0, 2\*\*31\)"),
    ([(array("q", [1, 2]), 1, 2)], 0, r"rows \[1, 3\) outside its 2 ids"),
    ([(array("q", [1, 2, 3]), 0, 3)], 6, "do not fit a destination of 16 bytes"),
    ([(array("d", [1.0]), 0, 1)], 0, "expected int64 or int32 items"),
    ([(array("q", [1]), 0)], 0, r"\(buffer, start, count\)"),
])
def test_bad_host_row_ids_are_refused_before_a_byte_is_written(parts, offset, match):
    dst = bytearray(b"\xee" * 16)
    with pytest.raises((ValueError, TypeError), match=match):
        _ring.write_ids(memoryview(dst), offset, parts)
    assert dst == bytearray(b"\xee" * 16)


@st.composite
def split_cases(draw):
    if draw(st.booleans()):           # rows of a block: split between rows
        width = draw(st.integers(1, 300))
        height = draw(st.integers(2, 60))
    else:                             # one linear copy: split between bytes, >= 1 MiB a part
        width = draw(st.integers(1, 3 << 20))
        height = 1
    src_pad, dst_pad = draw(st.integers(0, 40)), draw(st.integers(0, 40))
    budget = draw(st.one_of(st.just(0), st.integers(1, 5_000), st.integers(1, 4 << 20)))
    return width, height, src_pad, dst_pad, budget


@settings(max_examples=200, deadline=None)
@given(split_cases())
def test_a_budgeted_flushs_parts_of_a_copy_write_exactly_its_bytes_each_within_the_budget(case):
    """``cuda_split_copy``: how ``cuda_flush(max_bytes=B)`` (``HSCAPTURE_COPY_STEP_BYTES``)
    issues a copy over several flushes. Taking a part, then a part of the rest, until nothing
    is left, and executing them in that order writes exactly what the copy whole writes (the
    destination's padding untouched); each part holds at most B bytes, or one row where a row
    is wider, or 1 MiB of a one-row copy; B = 0 (no budget) or a copy within it is one part.
    tests/test_gpu.py runs the flush itself."""
    width, height, src_pad, dst_pad, budget = case
    rng = np.random.default_rng(width * 7 + height)
    spitch, dpitch = width + src_pad, width + dst_pad
    src = rng.integers(0, 255, size=spitch * height, dtype=np.uint8)
    want = np.full(dpitch * height, 0xAB, dtype=np.uint8)
    got = want.copy()
    whole = [_addr(want), dpitch, _addr(src), spitch, width, height]
    _run(whole, want, src)
    copy = [_addr(got), dpitch, _addr(src), spitch, width, height]
    parts = 0
    while copy is not None:
        part, copy = _ring.cuda_split_copy(copy, budget)
        parts += 1
        n = part[4] * part[5]
        assert n > 0
        assert budget == 0 or n <= budget or (height > 1 and part[5] == 1) or \
            (height == 1 and n <= max(budget, 1 << 20)), (part, budget)
        _run(part, got, src)
        assert parts <= width * height
    assert np.array_equal(got, want)
    if budget == 0 or width * height <= budget:
        assert parts == 1
