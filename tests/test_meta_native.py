"""The producer's native batch-meta encoder (``hscapture._meta``) is record.plan_batch's twin:
the same msgpack bytes as msgpack-python for every value it accepts, the same entry layout
for any batch, and ``Unsupported`` (so the Python reference runs) for anything else. Its
copies of whole rows for the subscriber (``copy_rows``) are the bytes of the entry's views."""

from __future__ import annotations

import collections
import dataclasses
import enum
import math

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hscapture import record as rc
from hscapture.notice import DTYPES, PROTOCOL_VERSION

native = pytest.importorskip("hscapture._meta")

# every exact builtin type msgpack-python packs, at the edges of each of its encodings
ints = st.one_of(st.integers(-(1 << 63), (1 << 64) - 1),
                 st.sampled_from([0, 127, 128, 255, 256, 65535, 65536, (1 << 32) - 1, 1 << 32,
                                  -1, -32, -33, -128, -129, -32768, -32769, -(1 << 31),
                                  -(1 << 31) - 1, -(1 << 63), (1 << 64) - 1]))
scalars = st.one_of(st.none(), st.booleans(), ints, st.floats(allow_nan=True),
                    st.text(max_size=40), st.text(min_size=30, max_size=300),
                    st.binary(max_size=300),
                    st.binary(min_size=250, max_size=70_000).map(bytearray))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=20), st.lists(inner, max_size=5).map(tuple),
                            st.dictionaries(st.one_of(st.text(max_size=10), ints), inner,
                                            max_size=20)),
    max_leaves=60)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(values)
def test_packb_writes_msgpack_pythons_bytes_for_every_builtin_value(value):
    assert native.packb(value) == msgpack.packb(value, use_bin_type=True)


def test_packb_covers_every_length_class_of_strings_bins_arrays_and_maps():
    for n in (0, 15, 16, 31, 32, 255, 256, 65535, 65536):
        for value in ("x" * n, b"y" * n, [0] * n, {i: None for i in range(n)}):
            assert native.packb(value) == msgpack.packb(value, use_bin_type=True), (type(value), n)
    assert native.packb(-0.0) == msgpack.packb(-0.0)
    assert native.packb(math.inf) == msgpack.packb(math.inf)


def _nested(depth: int) -> list:
    value: list = [0]
    for _ in range(depth):
        value = [value]
    return value


class Flag(enum.IntEnum):
    ON = 1


@dataclasses.dataclass
class Thing:
    x: int = 1


@pytest.mark.parametrize("value", [
    1 << 64, -(1 << 63) - 1,                 # out of msgpack's range: msgpack raises
    Flag.ON, collections.OrderedDict(a=1),   # subclasses: msgpack-python's own rules apply
    Thing(), {1, 2}, memoryview(b"ab"), "\ud800",   # other types; a lone surrogate
    _nested(70),                             # deeper than the native limit
])
def test_anything_but_an_exact_builtin_in_range_is_unsupported_never_guessed(value):
    with pytest.raises(native.Unsupported):
        native.packb(value)
    with pytest.raises(native.Unsupported):
        native.plan_batch(PROTOCOL_VERSION, "p", 1, 0, 0, [1], ["residual"], "", "", 8,
                          "bfloat16", 2, [dict(ROW, extra={"x": value})], [8], [[0, 0]])


ROW = {"rid": "r", "token_start": 0, "token_count": 3, "last": True, "cached_prefix": 0,
       "extra": {}, "fields": {}}
rids = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FFF, blacklist_categories=("Cs",)),
               min_size=1, max_size=40)
rows = st.lists(st.fixed_dictionaries({
    "rid": rids, "token_start": st.integers(0, 1 << 20), "token_count": st.integers(1, 5000),
    "last": st.booleans(), "cached_prefix": st.integers(0, 1 << 20),
    "extra": st.dictionaries(st.text(max_size=8), values, max_size=4),
    "fields": st.dictionaries(st.sampled_from(["loss_mask", "w"]), st.binary(max_size=64)),
}), min_size=1, max_size=12)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@example(batch_rows=[dict(ROW, token_count=5000)] * 12, hidden=20_000, widths=[4] * 20,
         dtype="float32", epoch=(1 << 64) - 1, seq=1 << 40, dp_rank=300, explicit_map=False)
@given(rows, st.integers(1, 20_000), st.lists(st.integers(1, 4), min_size=1, max_size=20),
       st.sampled_from(sorted(DTYPES)), st.integers(0, (1 << 64) - 1), st.integers(0, 1 << 40),
       st.integers(0, 300), st.booleans())
def test_a_natively_planned_batch_is_the_reference_plan_byte_for_byte(
        batch_rows, hidden, widths, dtype, epoch, seq, dp_rank, explicit_map):
    """Any rows, block widths (up to offsets past 2**32, so every int width of the placement
    fields), dtype and producer values: ``plan_batch(check=False)`` (native) gives the Plan
    of the Python reference, field by field."""
    cols = [hidden * w for w in widths]
    n_layers = len(cols) if explicit_map else sum(widths)
    kw = dict(producer="sglang_dp0", epoch=epoch, seq=seq, dp_rank=dp_rank,
              layers=list(range(n_layers)), layer_kinds=["residual"] * n_layers,
              convention="sglang", model="/m/llama", hidden=hidden, dtype=dtype,
              rows=batch_rows, block_cols=cols,
              layer_map=[[b, 0] for b in range(len(cols))] if explicit_map else None)
    got = rc.plan_batch(check=False, **kw)
    layer_map = kw.pop("layer_map") or rc.default_layer_map(cols, hidden, n_layers)
    want = rc._plan_batch_py(itemsize=DTYPES[dtype], layer_map=layer_map, check=False, **kw)
    assert got == want
    # and it was the native path that planned it (every value here is an exact builtin)
    raw = native.plan_batch(PROTOCOL_VERSION, kw["producer"], epoch, seq, dp_rank, kw["layers"],
                            kw["layer_kinds"], kw["convention"], kw["model"], hidden, dtype,
                            DTYPES[dtype], batch_rows, cols, layer_map)
    assert raw == (want.meta_bytes, want.block_offsets, want.block_bytes, want.ids_offset,
                   want.length, want.tokens, want.row_starts, want.pads)


def test_the_native_encoder_is_in_use_and_agrees_on_the_alignment():
    assert rc._native is native and native.ALIGN == rc.ALIGN


def test_the_golden_batch_comes_out_of_the_native_path_unchanged():
    """tests/test_record.py pins the format through the checking path; the hot path (no
    checks: native) writes the very same golden bytes."""
    from test_record import BATCH, GOLDEN_BATCH, golden_batch_payload

    plan = rc.plan_batch(check=False, **BATCH)
    assert golden_batch_payload(plan) == bytes.fromhex(GOLDEN_BATCH)
    assert plan == rc.plan_batch(**BATCH)


def test_a_value_only_python_can_encode_takes_the_reference_path_with_the_same_result():
    """A row whose extra holds an IntEnum (msgpack-python packs it as its int) is planned by
    the Python reference: the producer's meta is what it always was, never an error."""
    row = dict(ROW, extra={"attempt": Flag.ON})
    kw = dict(producer="p", epoch=1, seq=2, dp_rank=0, layers=[1], layer_kinds=["residual"],
              convention="", model="", hidden=8, dtype="bfloat16", rows=[row], block_cols=[8])
    with pytest.raises(native.Unsupported):
        native.plan_batch(PROTOCOL_VERSION, "p", 1, 2, 0, [1], ["residual"], "", "", 8,
                          "bfloat16", 2, [row], [8], [[0, 0]])
    plan = rc.plan_batch(check=False, **kw)
    assert plan == rc.plan_batch(check=False, **dict(kw, rows=[dict(ROW, extra={"attempt": 1})]))


# --- copy_rows: the subscriber's owned copies of whole rows ----------------------------------

@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(1, 6), min_size=1, max_size=8), st.integers(1, 9),
       st.lists(st.integers(1, 3), min_size=1, max_size=3), st.sampled_from(sorted(DTYPES)),
       st.data())
def test_row_capsules_hold_the_bytes_of_the_entrys_views(counts, hidden, widths, dtype, data):
    """Any rows, blocks of one to three layers side by side, any dtype: each row's capsules
    are its token ids and layers exactly as Entry.arrays shows them, C-contiguous, in the
    sample's dtype; an fp8 entry has none (numpy copies it)."""
    cols = [hidden * w for w in widths]
    n_layers = sum(widths)
    rows_ = [dict(ROW, rid=f"r{i}", token_count=c) for i, c in enumerate(counts)]
    plan = rc.plan_batch(producer="p", epoch=1, seq=0, dp_rank=0, layers=list(range(n_layers)),
                         layer_kinds=["residual"] * n_layers, convention="", model="",
                         hidden=hidden, dtype=dtype, rows=rows_, block_cols=cols)
    buf = bytearray(np.random.default_rng(len(counts) * hidden).integers(
        0, 256, plan.length, dtype=np.uint8).tobytes())
    rc.write_header(memoryview(buf), plan)
    payload = memoryview(bytes(buf))
    entry = rc.read_entry(payload, payload_len=plan.length, epoch=1)
    ids, layers, _ = entry.arrays(payload)
    picked = data.draw(st.lists(st.sampled_from(range(len(counts))), unique=True))
    ranges = [x for r in picked for x in (plan.row_starts[r], counts[r])]
    caps = entry.row_capsules(payload, ranges)
    if dtype not in native.ROW_DTYPES:
        assert caps is None and dtype.startswith("float8")
        return
    assert len(caps) == len(picked) * (1 + n_layers)
    tdtype = getattr(torch, dtype)
    at = 0
    for r in picked:
        r0, n = plan.row_starts[r], counts[r]
        t = torch.from_dlpack(caps[at])
        assert t.dtype == torch.int32 and t.tolist() == ids[r0:r0 + n].tolist()
        for i in range(n_layers):
            t = torch.from_dlpack(caps[at + 1 + i])
            assert (t.dtype, tuple(t.shape), t.is_contiguous()) == (tdtype, (n, hidden), True)
            assert t.untyped_storage().nbytes() == layers[i][r0:r0 + n].nbytes
            assert t.view(torch.uint8).numpy().tobytes() == layers[i][r0:r0 + n].tobytes()
        at += 1 + n_layers


def test_copy_rows_refuses_ranges_outside_the_payload_and_unknown_dtypes():
    """(Entries are validated before; the copy checks every range all the same.)"""
    buf = bytes(1024)
    ok = native.copy_rows(buf, [0, 4], [64, 16], 8, 960, "bfloat16")
    assert [tuple(torch.from_dlpack(c).shape) for c in ok] == [(4,), (4, 8)]
    for rows_, layers, ids in [([0, 4], [1000, 16], 960), ([0, 4], [64, 16], 1010),
                               ([60, 4], [64, 16], 0), ([0, 0], [64, 16], 0),
                               ([-1, 2], [64, 16], 0), ([0, 1], [64, 8], 0),
                               ([(1 << 62), 1], [0, 1 << 4], 0)]:
        with pytest.raises(ValueError):
            native.copy_rows(buf, rows_, layers, 8, ids, "bfloat16")
    with pytest.raises(native.Unsupported):
        native.copy_rows(buf, [0, 1], [64, 16], 8, 960, "float8_e4m3fn")


def test_row_copies_never_taken_are_freed():
    """A row copied and then not delivered (turned away, a failed rid's new attempt) leaves
    its capsules unused: they free their memory with the list."""
    import resource

    buf = bytes(8 << 20)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for i in range(200):      # 200 x 8 MB, half never taken
        caps = native.copy_rows(buf, [0, 1024], [0, 8192], 4096, 0, "bfloat16")
        if i % 2:
            del caps[:]
        else:
            torch.from_dlpack(caps[1])
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 << 10   # KiB
