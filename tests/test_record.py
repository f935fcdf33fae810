"""Ring entries (protocol v3): golden bytes, the batch layout's fixed point, full round trips,
every block rule, and a parser that raises nothing but RecordFormatError for any bytes."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hscapture import notice as nt
from hscapture import record as rc
from hscapture.errors import HSCaptureError, InvalidRidError, NoticeError, RecordFormatError

EPOCH = 0x1234
ROWS = [
    {"rid": "req-a", "token_start": 0, "token_count": 2, "last": False, "cached_prefix": 0,
     "extra": {}, "fields": {"loss_mask": b"\x00\x01"}},
    {"rid": "req-b", "token_start": 4, "token_count": 1, "last": True, "cached_prefix": 4,
     "extra": {"lang": "en"}, "fields": {}},
]
BATCH = dict(producer="p0", epoch=EPOCH, seq=7, dp_rank=0, layers=[3, 31],
             layer_kinds=["residual", "final_norm"], convention="hf", model="m", hidden=2,
             dtype="bfloat16", rows=ROWS, block_cols=[4])


def golden_batch_payload(plan: rc.Plan) -> bytes:
    """The golden batch: header and pads by write_header, the rest 0xee, data 0..11, ids."""
    buf = bytearray(b"\xee" * plan.length)
    rc.write_header(memoryview(buf), plan)
    off = plan.block_offsets[0]
    buf[off:off + 24] = np.arange(12, dtype="<u2").tobytes()
    buf[plan.ids_offset:plan.length] = np.array([101, 102, 201], "<i4").tobytes()
    return bytes(buf)


# --- golden bytes: these pin the ring entry format; a change here is a protocol change -----

GOLDEN_BATCH = (
    "78010000de0012a17603a46b696e64a56261746368a870726f6475636572a27030a565706f6368cd1234a373"
    "657107a764705f72616e6b00a66c617965727392031fab6c617965725f6b696e647392a8726573696475616c"
    "aa66696e616c5f6e6f726daa636f6e76656e74696f6ea26866a56d6f64656ca16da668696464656e02a56474"
    "797065a862666c6f61743136a6746f6b656e7303a96c617965725f6d617092920000920002a4726f77739287"
    "a3726964a57265712d61ab746f6b656e5f737461727400ab746f6b656e5f636f756e7402a46c617374c2ad63"
    "61636865645f70726566697800a5657874726180a66669656c647381a96c6f73735f6d61736bc402000187a3"
    "726964a57265712d62ab746f6b656e5f737461727404ab746f6b656e5f636f756e7401a46c617374c3ad6361"
    "636865645f70726566697804a5657874726181a46c616e67a2656ea66669656c647380a6626c6f636b739192"
    "cd018004aa6964735f6f6666736574cd01c0a66c656e677468cd01cc00000000000001000200030004000500"
    "06000700080009000a000b000000000000000000000000000000000000000000000000000000000000000000"
    "00000000000000006500000066000000c9000000")
GOLDEN_DROP = (
    "9e00000088a17603a46b696e64a464726f70a870726f6475636572a27030a565706f6368cd1234a373657109"
    "a764705f72616e6b00a6726561736f6ea972696e675f66756c6ca4726f77739284a3726964a57265712d61ab"
    "746f6b656e5f737461727400ab746f6b656e5f636f756e7402a46c617374c284a3726964a57265712d62ab74"
    "6f6b656e5f737461727404ab746f6b656e5f636f756e7401a46c617374c3")
GOLDEN_ABORT = (
    "690000008aa17603a46b696e64a561626f7274a870726f6475636572a27030a565706f6368cd1234a3736571"
    "0aa764705f72616e6b00a3726964a57265712d61a6726561736f6eac636c69656e745f61626f7274a7726573"
    "74617274c3a5657874726181a7617474656d707401")
GOLDEN_UNHEARD = (
    "7c00000089a17603a46b696e64a7756e6865617264a870726f6475636572a27030a565706f6368cd1234a373"
    "65710ba764705f72616e6b00a4726f77739283a3726964a57265712d61a373657107a46c617374c283a37269"
    "64a57265712d62a373657108a46c617374c3a86f766572666c6f7703a96469736361726465649106")


def golden_drop() -> bytes:
    return rc.control_payload(rc.drop_meta("p0", EPOCH, 9, 0, "ring_full", ROWS))


def golden_abort() -> bytes:
    return rc.control_payload(rc.abort_meta("p0", EPOCH, 10, 0, "req-a", "client_abort", True,
                                            {"attempt": 1}))


def golden_unheard() -> bytes:
    return rc.control_payload(rc.unheard_meta(
        "p0", EPOCH, 11, 0, [{"rid": "req-a", "seq": 7, "last": False}, {"rid": "req-b", "seq": 8, "last": True}],
        3, [6]))


def read(payload: bytes, **kw) -> rc.Entry:
    kw.setdefault("epoch", EPOCH)
    return rc.read_entry(payload, payload_len=len(payload), **kw)


def test_golden_bytes_of_a_two_row_batch_are_stable():
    plan = rc.plan_batch(**BATCH)
    # meta 376 bytes: block at align64(4 + 376) = 384, 3 tokens x 4 cols x bf16 = 24 bytes,
    # ids at align64(408) = 448, 3 x int32: length 460
    assert (len(plan.meta_bytes), plan.block_offsets, plan.ids_offset, plan.length) == (
        376, [384], 448, 460)
    assert plan.pads == [(380, 384), (408, 448)] and plan.tokens == 3
    assert plan.row_starts == [0, 2] and plan.tag == nt.rid_tag("req-a")
    assert golden_batch_payload(plan) == bytes.fromhex(GOLDEN_BATCH)


@pytest.mark.parametrize("build,golden,kind,seq,n", [
    (golden_drop, GOLDEN_DROP, "drop", 9, 2),
    (golden_abort, GOLDEN_ABORT, "abort", 10, 1),
    (golden_unheard, GOLDEN_UNHEARD, "unheard", 11, 0),
])
def test_golden_bytes_of_control_entries_are_stable(build, golden, kind, seq, n):
    payload = build()
    assert payload == bytes.fromhex(golden)
    e = read(payload, producer="p0")
    assert (e.kind, e.seq, e.n) == (kind, seq, n)
    assert e.meta_bytes == payload[4:]


def test_the_golden_batch_reads_back_row_by_row():
    payload = bytes.fromhex(GOLDEN_BATCH)
    e = read(payload, producer="p0", tag=nt.rid_tag("req-a"))
    assert (e.kind, e.seq, e.n, e.rows) == ("batch", 7, 2, ROWS)
    a, b = e.row_views(payload)
    assert (a.rid, a.seq, a.token_start, a.token_count, a.last, a.cached_prefix) == (
        "req-a", 7, 0, 2, False, 0)
    assert (b.rid, b.seq, b.last, b.cached_prefix, b.extra) == ("req-b", 8, True, 4,
                                                                {"lang": "en"})
    assert a.fields == {"loss_mask": b"\x00\x01"} and b.fields == {}
    assert a.token_ids.tolist() == [101, 102] and b.token_ids.tolist() == [201]
    data = np.arange(12, dtype="<u2").reshape(3, 4)  # [token, layer 0 | layer 1]
    assert a.layer(0).tolist() == data[0:2, 0:2].tolist()
    assert a.layer(1).tolist() == data[0:2, 2:4].tolist()
    assert b.layer(1).tolist() == data[2:3, 2:4].tolist()
    assert a.layer(0).dtype == np.uint16 and a.n_layers == 2


def test_row_views_are_zero_copy_views_of_the_payload():
    payload = bytearray.fromhex(GOLDEN_BATCH)
    e = read(bytes(payload))
    (a, _) = e.row_views(payload)
    payload[384:386] = (777).to_bytes(2, "little")
    assert a.layer(0)[0, 0] == 777
    ro = e.row_views(bytes(payload))[0].layer(0)
    assert not ro.flags.writeable


def test_bfloat16_layers_reinterpret_exactly_through_torch():
    torch = pytest.importorskip("torch")
    src = torch.randn(5, 3 * 8).to(torch.bfloat16)
    rows = [dict(ROWS[0], token_count=5, fields={})]
    plan = rc.plan_batch(**dict(BATCH, rows=rows, layers=[0, 1, 2],
                                layer_kinds=["residual"] * 3, hidden=8, block_cols=[24]))
    buf = bytearray(plan.length)
    rc.write_header(memoryview(buf), plan)
    off = plan.block_offsets[0]
    buf[off:off + plan.block_bytes[0]] = src.view(torch.uint16).numpy().tobytes()
    (row,) = read(bytes(buf)).row_views(buf)
    for i in range(3):
        got = torch.from_numpy(row.layer(i)).view(torch.bfloat16)
        assert torch.equal(got, src[:, 8 * i:8 * (i + 1)])


# --- writer -----------------------------------------------------------------------------------


def test_plan_meta_holds_its_own_fixed_point_offsets():
    plan = rc.plan_batch(**BATCH)
    meta = msgpack.unpackb(plan.meta_bytes)
    assert meta["blocks"] == [[o, 4] for o in plan.block_offsets]
    assert (meta["ids_offset"], meta["length"], meta["tokens"]) == (plan.ids_offset,
                                                                    plan.length, 3)
    assert list(meta) == list(rc._BATCH_KEYS)
    assert meta == rc.batch_meta(**{k: v for k, v in BATCH.items() if k != "block_cols"},
                                 tokens=3, layer_map=[[0, 0], [0, 2]], blocks=meta["blocks"],
                                 ids_offset=plan.ids_offset, length=plan.length)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 400), st.integers(1, 3), st.integers(1, 40), st.integers(0, 300))
def test_plan_reaches_the_fixed_point_across_alignment_and_int_size_boundaries(
        rid_len, n_blocks, tokens, model_len):
    # model_len moves the meta across 64-byte boundaries; tokens and block count move the
    # offsets across msgpack's 1/2/3/5-byte int sizes.
    rows = [dict(ROWS[1], rid="r" * rid_len, token_count=tokens, extra={}, fields={})]
    plan = rc.plan_batch(**dict(BATCH, rows=rows, model="m" * model_len,
                                layers=list(range(n_blocks)), layer_kinds=["residual"] * n_blocks,
                                hidden=64, block_cols=[64] * n_blocks))
    assert plan.block_offsets[0] == -(-(4 + len(plan.meta_bytes)) // 64) * 64
    meta = msgpack.unpackb(plan.meta_bytes)
    assert [o for o, _ in meta["blocks"]] == plan.block_offsets
    assert meta["length"] == plan.length
    read(_written(plan))


def _written(plan: rc.Plan) -> bytes:
    buf = bytearray(plan.length)
    rc.write_header(memoryview(buf), plan)
    return bytes(buf)


def test_default_layer_map_fills_blocks_in_order():
    assert rc.default_layer_map([2, 4], 2, 3) == ((0, 0), (1, 0), (1, 2))
    with pytest.raises(RecordFormatError, match="multiple of hidden=2"):
        rc.default_layer_map([3], 2, 1)
    with pytest.raises(RecordFormatError, match="expected 3 slots"):
        rc.default_layer_map([2, 2], 2, 3)


def test_write_header_zeroes_the_pads_over_old_ring_bytes():
    plan = rc.plan_batch(**BATCH)
    buf = bytearray(b"\xff" * plan.length)
    rc.write_header(memoryview(buf), plan)
    for start, end in plan.pads:
        assert buf[start:end] == bytes(end - start)
    assert buf[:4] == len(plan.meta_bytes).to_bytes(4, "little")


@pytest.mark.parametrize("change,error,why", [
    (dict(rows=[dict(ROWS[0], rid="a\x00")]), InvalidRidError, "U\\+0000"),
    (dict(rows=[ROWS[0], dict(ROWS[1], rid="req-a")]), RecordFormatError, "more than one row"),
    (dict(rows=[dict(ROWS[0], fields={"loss_mask": b"\x01"})]), RecordFormatError,
     "expected 2 bytes"),
    (dict(rows=[dict(ROWS[0], cached_prefix=3)]), RecordFormatError, "cached_prefix"),
    (dict(rows=[dict(ROWS[0], surprise=1)]), RecordFormatError, "unknown key"),
    (dict(rows=[dict(ROWS[0], token_count=0)]), RecordFormatError, "token_count >= 1"),
    (dict(rows=[]), RecordFormatError, "non-empty"),
    (dict(dtype="int8"), RecordFormatError, "dtype"),
    (dict(block_cols=[3]), RecordFormatError, "multiple of hidden"),
    (dict(layer_kinds=["residual", "logits"]), RecordFormatError, "layer_kinds"),
    (dict(layers=[3, 3], layer_kinds=["residual", "residual"]), RecordFormatError, "twice"),
    (dict(producer="p 0"), RecordFormatError, "producer id"),
    (dict(epoch=0), RecordFormatError, "epoch"),
])
def test_plan_batch_with_check_rejects_what_a_reader_would(change, error, why):
    with pytest.raises(error, match=why):
        rc.plan_batch(**dict(BATCH, **change))


def test_plan_batch_without_check_trusts_its_caller():
    rows = [dict(ROWS[0], cached_prefix=99)]  # invalid, but not looked at
    plan = rc.plan_batch(**dict(BATCH, rows=rows), check=False)
    with pytest.raises(RecordFormatError, match="cached_prefix"):
        read(_written(plan))


def test_control_payload_with_check_rejects_an_invalid_meta():
    with pytest.raises(RecordFormatError, match="rid"):
        rc.control_payload(rc.abort_meta("p0", EPOCH, 1, 0, "", "x", False, {}))
    with pytest.raises(RecordFormatError, match="use plan_batch"):
        rc.control_payload(msgpack.unpackb(bytes.fromhex(GOLDEN_BATCH)[4:380]))
    with pytest.raises(RecordFormatError, match="cannot be encoded"):
        rc.control_payload({"x": object()})
    assert rc.control_payload(rc.abort_meta("p0", EPOCH, 1, 0, "", "x", False, {}),
                              check=False)


def test_drop_meta_keeps_only_the_drop_row_keys():
    assert rc.drop_meta("p0", EPOCH, 9, 0, "ring_full", ROWS)["rows"][1] == {
        "rid": "req-b", "token_start": 4, "token_count": 1, "last": True}


def test_entry_tag_per_kind():
    assert read(golden_drop()).tag == nt.rid_tag("req-a")
    assert read(golden_abort()).tag == nt.rid_tag("req-a")
    assert read(golden_unheard()).tag == 0


# --- round trip -------------------------------------------------------------------------------

_rid = st.text(min_size=1, max_size=24).filter(lambda s: _is_rid(s))


def _is_rid(s: str) -> bool:
    try:
        nt.check_rid(s)
        return True
    except InvalidRidError:
        return False


@st.composite
def batches(draw):
    dtype = draw(st.sampled_from(sorted(nt.DTYPES)))
    hidden = draw(st.integers(1, 9))
    n_layers = draw(st.integers(1, 5))
    # partition the layers into blocks of 1..n consecutive layers
    cuts = sorted(draw(st.sets(st.integers(1, n_layers - 1), max_size=n_layers - 1))
                  ) if n_layers > 1 else []
    bounds = [0, *cuts, n_layers]
    block_cols = [(b - a) * hidden for a, b in zip(bounds, bounds[1:])]
    rids = draw(st.lists(_rid, min_size=1, max_size=6, unique=True))
    rows = []
    for rid in rids:
        count = draw(st.integers(1, 7))
        start = draw(st.integers(0, 1000))
        rows.append({
            "rid": rid, "token_start": start, "token_count": count,
            "last": draw(st.booleans()), "cached_prefix": draw(st.integers(0, start + count)),
            "extra": draw(st.dictionaries(st.text(max_size=5), st.one_of(
                st.integers(-5, 5), st.text(max_size=5), st.lists(st.booleans(), max_size=2)),
                max_size=2)),
            "fields": {name: draw(st.binary(min_size=count, max_size=count)) for name in
                       draw(st.sets(st.sampled_from(["loss_mask", "role", "w.1"]), max_size=2))},
        })
    layers = draw(st.lists(st.integers(-1, 200), min_size=n_layers, max_size=n_layers,
                           unique=True))
    kwargs = dict(producer=draw(st.from_regex(r"[A-Za-z0-9_.\-]{1,20}", fullmatch=True)),
                  epoch=draw(st.integers(1, 2**64 - 1)), seq=draw(st.integers(0, 2**40)),
                  dp_rank=draw(st.integers(0, 7)), layers=layers,
                  layer_kinds=draw(st.lists(st.sampled_from(nt.LAYER_KINDS),
                                            min_size=n_layers, max_size=n_layers)),
                  convention=draw(st.text(max_size=6)), model=draw(st.text(max_size=6)),
                  hidden=hidden, dtype=dtype, rows=rows, block_cols=block_cols)
    seed = draw(st.integers(0, 2**32 - 1))
    return kwargs, seed


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches(), st.booleans())
def test_plan_write_read_round_trips_every_row_layer_id_and_field(case, check):
    kw, seed = case
    plan = rc.plan_batch(**kw, check=check)
    rng = np.random.default_rng(seed)
    itemsize = nt.DTYPES[kw["dtype"]]
    T = plan.tokens
    data = [rng.integers(0, 256, size=(T, cols * itemsize), dtype=np.uint8)
            for cols in kw["block_cols"]]
    ids = rng.integers(-2**31, 2**31, size=T, dtype=np.int64).astype("<i4")
    buf = bytearray(b"\xa5" * plan.length)  # stale ring bytes
    rc.write_header(memoryview(buf), plan)
    for off, block in zip(plan.block_offsets, data):
        buf[off:off + block.nbytes] = block.tobytes()
    buf[plan.ids_offset:plan.ids_offset + 4 * T] = ids.tobytes()
    payload = bytes(buf)

    e = read(payload, epoch=kw["epoch"], producer=kw["producer"], tag=plan.tag)
    assert (e.kind, e.seq, e.n) == ("batch", kw["seq"], len(kw["rows"]))
    assert e.meta_bytes == plan.meta_bytes and e.rows == kw["rows"]
    lmap = rc.default_layer_map(kw["block_cols"], kw["hidden"], len(kw["layers"]))
    np_dtype = rc.NUMPY_DTYPES[kw["dtype"]]
    views = e.row_views(payload)
    for r, (row, view) in enumerate(zip(kw["rows"], views)):
        t0 = plan.row_starts[r]
        assert (view.rid, view.seq, view.token_count) == (row["rid"], kw["seq"] + r,
                                                          row["token_count"])
        assert view.fields == row["fields"] and view.extra == row["extra"]
        assert view.token_ids.tolist() == ids[t0:t0 + row["token_count"]].tolist()
        for i, (b, c) in enumerate(lmap):
            want = data[b].view(np_dtype)[t0:t0 + row["token_count"],
                                          c:c + kw["hidden"]]
            got = view.layer(i)
            assert got.shape == (row["token_count"], kw["hidden"]) and got.dtype == np_dtype
            assert got.tobytes() == want.tobytes()
    # the whole-entry form the subscriber reads whole samples from: the same values and bytes
    assert e.row_columns() == tuple(zip(*([row[k] for k in rc.ROW_KEYS] for row in kw["rows"])))
    all_ids, layers, _ = e.arrays(payload)
    assert all_ids.tolist() == ids.tolist()
    for i, (b, c) in enumerate(lmap):
        assert layers[i].shape == (T, kw["hidden"]) and layers[i].dtype == np_dtype
        assert layers[i].tobytes() == data[b].view(np_dtype)[:, c:c + kw["hidden"]].tobytes()


# --- the block rules and the rest of the schema, one violation at a time ---------------------

# A valid batch meta with generous offsets (meta changes below never reach the first block).
BASE = rc.batch_meta(
    producer="p0", epoch=EPOCH, seq=7, dp_rank=0, layers=[3, 31],
    layer_kinds=["residual", "final_norm"], convention="hf", model="m", hidden=2,
    dtype="bfloat16", tokens=3, layer_map=[[0, 0], [1, 0]],
    rows=[dict(r) for r in ROWS], blocks=[[1024, 2], [1088, 2]], ids_offset=1152,
    length=1164)


def framed(meta, length: int | None = None) -> bytes:
    """u32 + meta, zero-filled up to ``length`` (default: the meta's own ``length``)."""
    blob = msgpack.packb(meta, use_bin_type=True)
    if length is None:
        length = meta.get("length", 4 + len(blob)) if isinstance(meta, dict) else 4 + len(blob)
    if not isinstance(length, int) or length < 4 + len(blob):
        length = 4 + len(blob)
    return (len(blob).to_bytes(4, "little") + blob).ljust(length, b"\0")


def changed(path, value):
    meta = msgpack.unpackb(msgpack.packb(BASE))
    node = meta
    for key in path[:-1]:
        node = node[key]
    if value is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return meta


DELETE = object()


def test_the_base_meta_is_valid():
    e = read(framed(BASE))
    assert e.n == 2 and [v.layer(1).shape for v in e.row_views(framed(BASE))] == [(2, 2),
                                                                                   (1, 2)]


@pytest.mark.parametrize("path,value,why", [
    (("blocks", 0, 0), 1000, "not a multiple of 64"),
    (("blocks", 0, 0), 0, "overlaps the meta"),
    (("blocks", 0, 0), -64, "expected an int in 0"),
    (("blocks", 1, 0), 1024, "overlaps the block 0"),
    (("blocks", 1, 0), 960, "overlaps the block 0"),  # out of order
    (("blocks", 1, 0), 1152 + 64, "after the payload length"),
    (("blocks", 0, 1), 0, "cols: expected an int in 1"),
    (("blocks", 0), [1024], "expected \\[offset, cols\\]"),
    (("blocks", 0), {"offset": 1024}, "expected \\[offset, cols\\]"),
    (("blocks",), [], "at least one block"),
    (("ids_offset",), 1100, "not a multiple of 64"),
    (("ids_offset",), 1088, "overlaps the last block"),
    (("ids_offset",), 1216, "ids_offset \\+ 4 \\* tokens"),
    (("length",), 1165, "payload length"),
    (("layer_map", 1, 0), 2, "block: expected an int in 0..1"),
    (("layer_map", 1, 1), 1, "columns 1..3 exceed block 1's 2"),
    (("layer_map", 1), [0, 0], "hold no layer"),
    (("layer_map",), [[0, 0]], "expected 2 entries"),
    (("tokens",), 4, "token_count sum 3"),
    (("tokens",), 0, "expected an int in 1"),
    (("hidden",), 0, "'hidden'"),
    (("dtype",), "int4", "'dtype'"),
    (("dtype",), ["bfloat16"], "found list\\[1\\]"),
    (("layers",), [], "at least one layer"),
    (("layers", 0), True, "'layers'\\[0\\]"),
    (("layers", 0), 2**31, "'layers'\\[0\\]"),
    (("layer_kinds", 1), "logits", "'layer_kinds'"),
    (("seq",), [7], "'seq': expected an int"),
    (("seq",), -1, "'seq'"),
    (("seq",), 2**64 - 1, "seq \\+ n"),
    (("epoch",), EPOCH + 1, "the ring's"),
    (("v",), 1, "protocol version 3, found 1"),
    (("kind",), "record", "'kind'"),
    (("producer",), "", "producer id"),
    (("dp_rank",), -1, "dp_rank"),
    (("convention",), None, "'convention': expected str"),
    (("surprise",), 1, "unknown key"),
    (("rows",), DELETE, "required key 'rows' is missing"),
    (("rows",), [], "at least one row"),
    (("rows", 0), "req-a", "expected a map"),
    (("rows", 0, "rid"), "", "rid"),
    (("rows", 0, "rid"), "a\x1fb", "U\\+001F"),
    (("rows", 1, "rid"), "req-a", "more than one row"),
    (("rows", 1, "token_count"), 2, "token_count sum 4"),
    (("rows", 0, "token_count"), 2**64 - 1, "token_count"),
    (("rows", 0, "token_start"), 2**63 - 2, "exceeds 2\\*\\*63-1"),
    (("rows", 0, "last"), 0, "'last': expected bool"),
    (("rows", 1, "cached_prefix"), 6, "token_start \\+ token_count = 5"),
    (("rows", 0, "fields", "loss_mask"), b"\x01", "expected 2 bytes"),
    (("rows", 0, "fields", "loss_mask"), "ab", "expected 2 bytes .* found str"),
    (("rows", 0, "fields", "bad name"), b"\x01\x01", "field name"),
    (("rows", 0, "extra"), [], "'extra': expected a map"),
    (("rows", 0, "extra"), {b"k": 2}, "str keys"),
    (("rows", 0, "fields"), DELETE, "required key 'fields'"),
])
def test_every_batch_rule_violation_is_a_record_format_error_naming_it(path, value, why):
    meta = changed(path, value)
    payload = framed(meta, 1164)
    with pytest.raises(RecordFormatError, match=why):
        read(payload)


PLAIN_ROWS = [dict(r, extra={}, fields={}) for r in ROWS]


@pytest.mark.parametrize("row,value,why", [
    ({"cached_prefix": 6}, None, "token_start \\+ token_count = 5"),
    ({"token_count": 0}, None, "'token_count': expected an int in 1"),
    ({"token_start": -1}, None, "'token_start'"),
    ({"token_start": 2**63 - 1}, None, "exceeds 2\\*\\*63-1"),
    ({"last": 1}, None, "'last': expected bool"),
    ({"rid": ""}, None, "1..512 UTF-8 bytes, found 0"),
    ({"rid": "x" * 513}, None, "found 513"),
    ({"rid": "a\tb"}, None, "U\\+0009"),
    ({"rid": 5}, None, "expected str, found int"),
    ({"extra": {b"k": 1}}, None, "str keys"),
    ({"extra": {"t": 1, "ph": "x", b"j": 4}}, None, "str keys"),
    ({"extra": [("t", 1)]}, None, "'extra': expected a map"),
    ({"rid": "a\tb", "extra": {"t": 1}}, None, "U\\+0009"),
    ({"fields": {"m": b""}}, None, "expected 1 bytes"),
])
def test_plain_rows_obey_the_same_rules_on_the_fast_path(row, value, why):
    """Rows without fields (and an extra map, empty or not) take read_entry's fast path:
    same rules, same errors."""
    meta = changed(("rows",), [PLAIN_ROWS[0], dict(PLAIN_ROWS[1], **row)])
    with pytest.raises(RecordFormatError, match=why):
        read(framed(meta, 1164))


_ROW_VALUES = {
    "rid": st.one_of(st.text("ab-_.7", min_size=1, max_size=3),            # valid, may repeat
                     st.text(max_size=3),                                   # any: "", "\t", "é"
                     st.sampled_from(["x" * 512, "x" * 513, "é" * 256]), st.integers(),
                     st.binary(max_size=2)),
    "token_start": st.one_of(st.integers(0, 9), st.integers(-2, 2**63 + 1),
                             st.sampled_from([2**63 - 2, 2**63 - 1, True]), st.floats(0, 2)),
    "token_count": st.one_of(st.integers(1, 9), st.integers(-1, 2**63),
                             st.sampled_from([2, True, False]), st.none()),
    "last": st.one_of(st.booleans(), st.integers(0, 1), st.none()),
    "cached_prefix": st.one_of(st.integers(0, 9), st.integers(-1, 2**63), st.just(False)),
    "extra": st.one_of(st.dictionaries(st.text(max_size=2), st.integers(), max_size=3),
                       st.dictionaries(st.one_of(st.text(max_size=1), st.binary(max_size=1)),
                                       st.integers(), max_size=2),
                       st.lists(st.integers(), max_size=1), st.none()),
    "fields": st.one_of(st.just({}), st.dictionaries(st.sampled_from(["m", "bad name"]),
                                                     st.binary(max_size=2), max_size=1),
                        st.lists(st.none(), max_size=1), st.none(), st.just(0)),
}
_PLAIN_ROW = st.fixed_dictionaries({
    "rid": st.text("abcdef-_.", min_size=1, max_size=8), "token_start": st.integers(0, 2**40),
    "token_count": st.integers(1, 2**20), "last": st.booleans(),
    "cached_prefix": st.integers(0, 2**20),
    "extra": st.dictionaries(st.text(max_size=4), st.one_of(st.integers(), st.text(max_size=3)),
                             max_size=3),
    "fields": st.just({})}).map(
        lambda r: dict(r, cached_prefix=min(r["cached_prefix"],
                                            r["token_start"] + r["token_count"])))


@st.composite
def _rows_maybe_broken(draw):
    """1..6 rows: plain valid ones, each value perhaps swapped for a doubtful one, a key
    perhaps missing or added, a row perhaps not a map."""
    rows = []
    for _ in range(draw(st.integers(1, 6))):
        row = dict(draw(_PLAIN_ROW))
        for key in draw(st.sets(st.sampled_from(rc.ROW_KEYS), max_size=2)):
            row[key] = draw(_ROW_VALUES[key])
        change = draw(st.sampled_from(["none"] * 6 + ["drop", "add", "list"]))
        if change == "drop":
            del row[draw(st.sampled_from(rc.ROW_KEYS))]
        elif change == "add":
            row[draw(st.sampled_from(["seq", "rid2", b"rid"]))] = 1
        rows.append(list(row.items()) if change == "list" else row)
    return rows


@settings(max_examples=600, deadline=None)
@given(_rows_maybe_broken())
def test_the_rows_checked_all_at_once_are_rows_the_row_by_row_checks_accept(rows):
    """read_entry checks a batch's rows all at once (record._common_rows) and falls back to
    the row-by-row checks for anything that is not the common row: whatever the first
    accepts, the second accepts too, with the same values and token total."""
    columns = rc._common_rows(rows)
    try:
        total = rc._check_rows(rows)
    except RecordFormatError:
        assert columns is None, "rows the rules reject were accepted all at once"
        return
    if columns is not None:
        assert sum(columns[2]) == total
        assert columns == tuple(zip(*([row[k] for k in rc.ROW_KEYS] for row in rows)))


@settings(max_examples=300, deadline=None)
@given(st.lists(_PLAIN_ROW, min_size=1, max_size=20, unique_by=lambda r: r["rid"]))
def test_plain_rows_are_checked_all_at_once(rows):
    """(The speed of a subscriber: rows of an ASCII rid, no fields, take the one-pass check.)"""
    assert rc._common_rows(rows) is not None


@pytest.mark.parametrize("build,path,value,why", [
    (golden_drop, ("rows",), [], "at least one row"),
    (golden_drop, ("rows", 0, "cached_prefix"), 0, "unknown key"),
    (golden_drop, ("reason",), 5, "'reason': expected str"),
    (golden_drop, ("overflow",), 1, "unknown key"),
    (golden_abort, ("restart",), 1, "'restart': expected bool"),
    (golden_abort, ("rid",), "x" * 513, "513"),
    (golden_abort, ("extra",), None, "'extra': expected a map"),
    (golden_unheard, ("rows", 0, "seq"), 11, "'seq': expected an int in 0..10"),
    (golden_unheard, ("overflow",), -1, "overflow"),
    (golden_unheard, ("rows",), [], None),  # overflow 3 still says something: valid
])
def test_every_control_rule_violation_is_a_record_format_error(build, path, value, why):
    meta = msgpack.unpackb(build()[4:])
    node = meta
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    payload = framed(meta)
    if why is None:
        assert read(payload).n == 0
    else:
        with pytest.raises(RecordFormatError, match=why):
            read(payload)


def test_an_unheard_entry_names_something():
    meta = msgpack.unpackb(golden_unheard()[4:])
    meta.update(rows=[], overflow=0, discarded=[])
    with pytest.raises(RecordFormatError, match="found none"):
        read(framed(meta))
    meta.update(discarded=[11])          # at or past the entry's own seq
    with pytest.raises(RecordFormatError, match="'discarded' \\[0\\]"):
        read(framed(meta))
    meta.update(discarded=[10])
    assert read(framed(meta)).meta["discarded"] == [10]


def test_framing_errors_are_record_format_errors():
    good = bytes.fromhex(GOLDEN_BATCH)
    for payload, why in [
        (b"", "at least 4"),
        (b"\x00\x00\x00", "at least 4"),
        (b"\x00\x00\x00\x00", "meta length: expected 1.."),
        (b"\xff\xff\xff\x7f" + good[4:], "meta length"),
        (good[:200], "meta length"),
        (good[:4] + b"\xc1" + good[5:], "not valid msgpack"),  # 0xc1 is never used
    ]:
        with pytest.raises(RecordFormatError, match=why):
            read(payload)
    with pytest.raises(RecordFormatError, match="payload length 524, found 460"):
        rc.read_entry(good + b"\0" * 64, payload_len=len(good) + 64, epoch=EPOCH)
    with pytest.raises(RecordFormatError, match="payload_len"):
        rc.read_entry(good, payload_len=len(good) + 1, epoch=EPOCH)
    # a control entry is exactly its meta: nothing may follow
    with pytest.raises(RecordFormatError, match="no blocks"):
        read(golden_abort() + b"\0")
    # meta_len covering more than the msgpack object
    abort = golden_abort()
    longer = (len(abort) - 3).to_bytes(4, "little") + abort[4:] + b"\0"
    with pytest.raises(RecordFormatError, match="ExtraData"):
        read(longer)


def test_a_meta_with_a_duplicate_key_is_rejected():
    abort = golden_abort()
    blob = abort[4:]
    dup = bytes([blob[0] + 1]) + blob[1:] + msgpack.packb("restart") + msgpack.packb(False)
    with pytest.raises(RecordFormatError, match="not canonical"):
        read(len(dup).to_bytes(4, "little") + dup)


def test_epoch_producer_and_tag_must_match_the_ring_record():
    good = bytes.fromhex(GOLDEN_BATCH)
    with pytest.raises(RecordFormatError, match="the ring's"):
        read(good, epoch=EPOCH + 1)
    with pytest.raises(RecordFormatError, match="'producer': expected 'p1'"):
        read(good, producer="p1")
    with pytest.raises(RecordFormatError, match="tag"):
        read(good, tag=nt.rid_tag("req-b"))


def test_row_views_refuses_a_short_buffer_and_control_entries():
    good = bytes.fromhex(GOLDEN_BATCH)
    with pytest.raises(RecordFormatError, match="expected 460"):
        read(good).row_views(good[:400])
    with pytest.raises(RecordFormatError, match="no rows of data"):
        read(golden_drop()).row_views(golden_drop())


def test_notice_mismatches_names_each_disagreement():
    good = bytes.fromhex(GOLDEN_BATCH)
    e = read(good)
    notice = nt.entry_notice("p0", EPOCH, 7, 2, "batch", "seg", 4096, 460, 3, e.meta_bytes)
    assert rc.notice_mismatches(notice, e, offset=4096, record_seq=3, length=460) == []
    notice.update(n=3, meta=e.meta_bytes[:-1] + b"\0")
    out = rc.notice_mismatches(notice, e, offset=8192, record_seq=3, length=460)
    assert [m.split(":")[0] for m in out] == ["offset", "n", "meta"]


# --- never anything but RecordFormatError -----------------------------------------------------

SEEDS = {"batch": GOLDEN_BATCH, "drop": GOLDEN_DROP, "abort": GOLDEN_ABORT,
         "unheard": GOLDEN_UNHEARD}


def only_format_errors(payload: bytes, payload_len: int | None = None) -> None:
    """read_entry (and row_views of what it accepts) raise RecordFormatError or nothing."""
    n = len(payload) if payload_len is None else payload_len
    try:
        e = rc.read_entry(payload, payload_len=n, epoch=EPOCH, producer="p0")
    except RecordFormatError:
        return
    except HSCaptureError as exc:  # pragma: no cover - would be a hierarchy bug
        raise AssertionError(f"{type(exc).__name__} is not a RecordFormatError") from exc
    if e.kind == "batch":
        with np.errstate(all="ignore"):  # random float bits: NaN/inf sums are fine
            for view in e.row_views(payload):
                for i in range(view.n_layers):
                    view.layer(i).sum()
                view.token_ids.sum()


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(SEEDS)),
       st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 7)), min_size=1, max_size=8))
def test_bit_flips_raise_only_record_format_errors(kind, flips):
    payload = bytearray.fromhex(SEEDS[kind])
    for pos, bit in flips:
        payload[pos % len(payload)] ^= 1 << bit
    only_format_errors(bytes(payload))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(SEEDS)), st.integers(0, 600), st.integers(0, 600),
       st.binary(max_size=80))
def test_truncation_and_extension_raise_only_record_format_errors(kind, cut, plen, tail):
    payload = bytes.fromhex(SEEDS[kind])[:cut] + tail
    only_format_errors(payload, min(plen, len(payload)))


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


_nasty = st.one_of(
    st.sampled_from([-1, 0, 1, 63, 64, 65, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1, -2**63,
                     True, False, None, "", "x" * 600, b"", b"\x00" * 3, [], {}, [0], [[0, 0]],
                     [64, 1], 1.5, float("inf"), "batch", "bfloat16", "\x00"])
    | st.integers(-2**63, 2**64 - 1) | st.text(max_size=10) | st.binary(max_size=10))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(SEEDS)), st.data(), st.integers(0, 3))
def test_meta_value_swaps_raise_only_record_format_errors(kind, data, extra_swaps):
    """Structure-aware: replace any node of a valid meta (a list-typed seq, a negative,
    overlapping or misaligned offset, a huge int, a wrong-length field...), re-frame it with
    a correct meta length, keep the data region."""
    payload = bytes.fromhex(SEEDS[kind])
    meta_len = int.from_bytes(payload[:4], "little")
    meta = msgpack.unpackb(payload[4:4 + meta_len])
    for _ in range(1 + extra_swaps):
        paths = list(_paths(meta))
        path = data.draw(st.sampled_from(paths))
        # a copy: sampled_from hands out its own list and dict objects, and a later swap may
        # write into one (a path into a value swapped in before): mutated, they would change
        # what later examples draw (hypothesis: FlakyStrategyDefinition)
        value = copy.deepcopy(data.draw(_nasty | st.sampled_from([
            ["x", 1], {"rid": "r"}, [[-64, 1]], [[1000, 1]], [[0, 2**62]]])))
        if not path:
            meta = value
            break
        node = meta
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    blob = msgpack.packb(meta, use_bin_type=True)
    rest = payload[4 + meta_len:]
    only_format_errors(len(blob).to_bytes(4, "little") + blob + rest)


def test_the_fuzz_script_finds_no_foreign_exception_in_a_short_run():
    script = os.path.join(os.path.dirname(__file__), "..", "scripts", "fuzz_protocol.py")
    out = subprocess.run([sys.executable, script, "4000", "--workers", "1", "--seed", "7"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"foreign exceptions: 0\b", out.stdout), out.stdout


def test_record_format_error_is_a_notice_error_in_the_one_hierarchy():
    assert issubclass(RecordFormatError, NoticeError)
    assert issubclass(NoticeError, HSCaptureError)
