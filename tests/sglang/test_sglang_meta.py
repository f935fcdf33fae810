"""Per-sample metadata (``custom_params.hscapture_meta``) through the real hook, with SGLang's
real ``Req`` / ``SamplingParams`` / ``ScheduleBatch`` objects, into a real Producer, read by
the real Subscriber; and on through a real ``hscapture drain`` process, the shard reader and
the SpecForge export (re-read by SpecForge's own loader)."""

from __future__ import annotations

import logging
import shutil
import tempfile

import pytest

pytest.importorskip("sglang")  # local convenience only: CI installs sglang

from hscapture.export import META_KEY, export  # noqa: E402
from hscapture.reader import open_shards  # noqa: E402
from hscapture.sglang.config import META_PARAM  # noqa: E402

from sglang_support import chunks  # noqa: E402


def meta_params(meta, **more):
    return {META_PARAM: meta, **more}


def test_the_meta_of_whole_and_chunked_samples_arrives_with_every_sample(rig):
    hook, sub, srv = rig()
    # one entry per forward, so the chunks arrive as chunks (staged, they would be merged
    # into one row: tests/test_staging.py)
    hook.producer.stage_interval_s = 0.0
    whole = srv.new_req("hscap-whole", 7, custom_params=meta_params({"id": "w", "row": 3}))
    long = srv.new_req("hscap-long", 25, custom_params=meta_params(
        {"id": "l", "split": "eval", "weight": 0.25, "hard": True, "note": None}))
    none = srv.new_req("hscap-none", 5)
    srv.extend([(whole, 0, 7), (long, 0, 10), (none, 0, 5)])
    srv.extend([(long, 10, 10)])
    srv.extend([(long, 20, 5)])
    got = {r.rid: sub.get(r.rid, timeout=10) for r in (whole, long, none)}
    assert got["hscap-whole"].extra == {"attempt": 0, "meta": {"id": "w", "row": 3}}
    assert got["hscap-long"].extra == {"attempt": 0, "meta": {
        "id": "l", "split": "eval", "weight": 0.25, "hard": True, "note": None}}
    assert got["hscap-long"].meta["chunks"] == 3
    assert got["hscap-none"].extra == {"attempt": 0}
    for s in got.values():
        s.release()
    assert hook.counters.get("invalid_meta", 0) == 0 and hook.counters.get("errors", 0) == 0


def test_the_meta_is_read_once_at_the_first_chunk_and_later_chunks_reuse_it(rig):
    hook, sub, srv = rig()
    custom = meta_params({"id": "first"})
    r = srv.new_req("hscap-once", 20, custom_params=custom)
    srv.extend([(r, 0, 8)])
    # the request's params change after the first chunk (even into an invalid meta): later
    # chunks do not look again, so neither the new value nor its error reaches the sample
    r.sampling_params.custom_params[META_PARAM] = {"id": ["not", "flat"]}
    for start, size in chunks(20, 8)[1:]:
        srv.extend([(r, start, size)])
    s = sub.get(r.rid, timeout=10)
    assert s.extra == {"attempt": 0, "meta": {"id": "first"}}
    assert hook.counters.get("invalid_meta", 0) == 0


@pytest.mark.parametrize("bad", [
    {"nested": {"a": 1}},
    {f"k{i}": i for i in range(17)},
    {"s": "x" * 2000},
    {"s": "lone \ud800 surrogate"},          # would break the record's msgpack encoding
    {"f": float("nan")},
    ["id", 1],
    "row-7",
], ids=["nested", "too-many-keys", "too-large", "surrogate", "nan", "list", "str"])
def test_an_invalid_meta_costs_the_meta_never_the_sample_and_is_counted_and_logged_once(
        rig, caplog, bad):
    hook, sub, srv = rig()
    a = srv.new_req("hscap-bad-a", 6, custom_params=meta_params(bad))
    b = srv.new_req("hscap-bad-b", 12, custom_params=meta_params(bad))
    mate = srv.new_req("hscap-good-mate", 5, custom_params=meta_params({"id": "ok"}))
    with caplog.at_level(logging.WARNING, logger="hscapture.sglang"):
        srv.extend([(a, 0, 6), (b, 0, 6), (mate, 0, 5)])
        srv.extend([(b, 6, 6)])
    for r in (a, b):
        s = sub.get(r.rid, timeout=10)
        assert s.num_tokens == len(r.origin_input_ids)           # the sample is complete
        assert "meta" not in s.extra and s.extra["attempt"] == 0
        assert "expected" in s.extra["meta_error"] and "found" in s.extra["meta_error"]
    assert sub.get(mate.rid, timeout=10).extra["meta"] == {"id": "ok"}
    assert hook.counters["invalid_meta"] == 2                    # once per sample, not chunk
    assert hook.counters.get("errors", 0) == 0 and hook.counters.get("aborted", 0) == 0
    logged = [m for m in caplog.messages if "without its metadata" in m]
    assert len(logged) == 1 and "hscap-bad-a" in logged[0]


def test_a_retracted_sample_restarts_with_its_meta_read_again(rig):
    hook, sub, srv = rig()
    r = srv.new_req("hscap-retract-meta", 20, custom_params=meta_params({"id": "r"}))
    srv.extend([(r, 0, 8)])
    r.reset_for_retract()
    r.init_next_round_input(None)
    for start, size in chunks(20, 8):
        srv.extend([(r, start, size)])
    s = sub.get(r.rid, timeout=10)
    assert s.extra == {"attempt": 1, "meta": {"id": "r"}}


def test_the_meta_goes_from_the_hook_through_a_drain_to_the_reader_and_the_specforge_export(
        rig, tmp_path):
    from fault_support import drain_report, start_drain
    from specforge.runtime.data_plane.feature_store import load_feature_file

    hook, _, srv = rig(subscribe=False)
    out = tmp_path / "shards"
    d = start_drain(hook.producer.endpoint, out, "-n", "3", cwd=tmp_path)
    try:
        assert hook.producer.wait_for_consumers(1, timeout_s=30), "the drain never attached"
        reqs = [srv.new_req(f"hscap-d{i}", 9 + i, custom_params=meta_params(
            {"id": f"d{i}", "split": "train"}, hscapture_loss_mask=[1] * (9 + i)))
            for i in range(2)]
        reqs.append(srv.new_req("hscap-d-plain", 4, custom_params={
            "hscapture_loss_mask": [0, 1, 1, 1]}))
        srv.extend([(r, 0, len(r.origin_input_ids)) for r in reqs])
        rc, report, err = drain_report(d, timeout=60)
    finally:
        if d.poll() is None:
            d.kill()
            d.wait()
    assert rc == 0, (report, err)
    ss = open_shards(out)
    metas = {s.rid: s.extra.get("meta") for s in ss}
    assert metas == {"hscap-d0": {"id": "d0", "split": "train"},
                     "hscap-d1": {"id": "d1", "split": "train"}, "hscap-d-plain": None}
    sf = tmp_path / "sf"
    export(out, sf, "specforge", progress=False, fsync=False)
    for i, rid in enumerate(ss.rids):
        raw = load_feature_file(str(sf / "rows_0-2000" / f"data_{i}.ckpt"))
        assert raw.get(META_KEY) == metas[rid]


@pytest.mark.parametrize("mask, why", [
    ([2] * 25, "found 2 at index 0"),
    ([1] * 24 + [255], "found 255 at index 24"),
    ([0] + [1] * 25, "found 26 values"),
    ([1] * 24, "found 24 values"),
    ([1] * 12, "found 12 values"),
    ([1.0] * 25, "found 1.0"),
    ([1] * 12 + [-1] + [1] * 12, "found -1"),
    ("1" * 25, "found str"),
])
def test_a_loss_mask_that_is_not_one_0_or_1_per_prompt_token_is_left_out_and_the_sample_says_why(
        rig, mask, why):
    # fault hunt 5 (2026-12-05): values 2 or 255 were stored (as loss weights), a mask one
    # too long was cut off by one, a short one cost the sample its mask in silence
    hook, sub, srv = rig()
    r = srv.new_req("hscap-bad-mask", 25, custom_params={"hscapture": True,
                                                        "hscapture_loss_mask": mask})
    good = srv.new_req("hscap-good-mask", 25, custom_params={
        "hscapture_loss_mask": [int(i % 2 == 0) for i in range(25)]})
    for start, size in chunks(25, 10):
        srv.extend([(r, start, size), (good, start, size)])
    s = sub.get(r.rid, timeout=10)
    assert "loss_mask" not in s.fields and why in s.extra["mask_error"], s.extra
    assert "hscapture_loss_mask: expected 25 values 0 or 1" in s.extra["mask_error"]
    g = sub.get(good.rid, timeout=10)
    assert g.fields["loss_mask"].tolist() == [int(i % 2 == 0) for i in range(25)]
    assert "mask_error" not in g.extra
    assert hook.counters["invalid_loss_masks"] == 1
