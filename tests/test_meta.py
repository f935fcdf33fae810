"""Per-sample metadata (``custom_params.hscapture_meta``): the meta rule, and the metadata's way
from a producer process through the Subscriber, a ``hscapture drain`` process, the shard
reader, the torch Dataset, the live stream and both trainer exports (re-read through
SpecForge 0.2.0's and speculators 0.9.0's own loaders). The hook's side is in
tests/sglang/test_sglang_meta.py."""

from __future__ import annotations

import json
import math
import os
from types import SimpleNamespace

import msgpack
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from hscapture.errors import HSCaptureError, InvalidMetaError
from hscapture.export import META_KEY, export
from hscapture.reader import ShardDataset, open_shards
from hscapture.sample import layer_name
from hscapture.sglang.config import (MAX_META_BYTES, MAX_META_ERROR_CHARS, MAX_META_KEY_CHARS,
                                     MAX_META_KEYS, META_PARAM, CaptureConfig, check_meta)
from hscapture.stream import StreamDataset, sample_to_dict
from capture_support import source
from fault_support import drain_report, start_drain
from meta_support import ALL_LAYERS, HIDDEN, KINDS
from shard_support import make_sample, write_shards

from specforge.data.preprocessing import OfflineEagle3Dataset, list_local_files
from specforge.runtime.data_plane.feature_store import load_feature_file
from speculators.train.data import ArrowDataset
from speculators.train.vocab_mapping import save_token_frequency_distribution

HERE = os.path.dirname(os.path.abspath(__file__))
NAMES = [layer_name(l, k) for l, k in zip(ALL_LAYERS, KINDS)]


def compact_json(value) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


# -- the rule -------------------------------------------------------------------------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                    st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=80))           # text() includes lone surrogates
anything = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=70), inner, max_size=4)),
    max_leaves=12)
metas = st.one_of(anything, st.dictionaries(
    st.one_of(st.text(max_size=70), st.integers(), st.none()), anything, max_size=20))


@settings(max_examples=400, deadline=None)
@given(metas)
def test_the_rule_accepts_exactly_small_flat_maps_of_scalars_and_raises_only_its_error(value):
    try:
        got = check_meta(value)
    except InvalidMetaError as exc:
        assert "expected" in str(exc) and "found" in str(exc)
        assert len(str(exc)) < MAX_META_ERROR_CHARS
        bad = (not isinstance(value, dict) or len(value) > MAX_META_KEYS
               or any(not isinstance(k, str) or not 0 < len(k) <= MAX_META_KEY_CHARS
                      or any(ord(c) < 0x20 or 0xD800 <= ord(c) < 0xE000 for c in k)
                      for k in value)
               or any(not (v is None or isinstance(v, (bool, str))
                           or (isinstance(v, int) and -(2**63) <= v < 2**63)
                           or (isinstance(v, float) and math.isfinite(v)))
                      or (isinstance(v, str) and any(0xD800 <= ord(c) < 0xE000 for c in v))
                      for v in value.values()))
        if not bad:   # then only the size can be what broke it
            assert len(compact_json(value)) > MAX_META_BYTES, exc
        return
    # accepted: every bound holds, the map is unchanged, and it survives msgpack and JSON
    assert type(got) is dict and got == value and list(got) == list(value)
    assert len(got) <= MAX_META_KEYS
    assert all(type(k) is str and 0 < len(k) <= MAX_META_KEY_CHARS for k in got)
    assert all(v is None or type(v) in (bool, int, float, str) for v in got.values())
    assert len(compact_json(got)) <= MAX_META_BYTES
    assert msgpack.unpackb(msgpack.packb(got), raw=False) == got
    assert json.loads(compact_json(got)) == got
    assert check_meta(got) == got


key_chars = st.characters(min_codepoint=0x20, exclude_categories=("Cs",))
valid_metas = st.dictionaries(
    st.text(key_chars, min_size=1, max_size=MAX_META_KEY_CHARS),
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
              st.floats(allow_nan=False, allow_infinity=False),
              st.text(st.characters(exclude_categories=("Cs",)), max_size=40)),
    max_size=MAX_META_KEYS).filter(lambda m: len(compact_json(m)) <= MAX_META_BYTES)


@settings(max_examples=200, deadline=None)
@given(valid_metas)
def test_every_map_within_the_bounds_is_accepted_unchanged(value):
    assert check_meta(value) == value


def test_the_bounds_are_inclusive_and_the_first_value_past_each_is_refused():
    check_meta({f"k{i}": i for i in range(MAX_META_KEYS)})
    with pytest.raises(InvalidMetaError, match=r"at most 16 keys, found 17"):
        check_meta({f"k{i}": i for i in range(MAX_META_KEYS + 1)})
    check_meta({"k" * MAX_META_KEY_CHARS: 1})
    with pytest.raises(InvalidMetaError, match=r"1\.\.64 characters, found .* \(65 characters\)"):
        check_meta({"k" * (MAX_META_KEY_CHARS + 1): 1})
    fill = MAX_META_BYTES - len(compact_json({"s": ""}))
    assert len(compact_json({"s": "x" * fill})) == MAX_META_BYTES
    check_meta({"s": "x" * fill})
    with pytest.raises(InvalidMetaError, match=r"at most 1024 bytes of compact JSON, found 1025"):
        check_meta({"s": "x" * (fill + 1)})
    check_meta({"i": 2**63 - 1, "j": -(2**63)})
    with pytest.raises(InvalidMetaError, match=r"\['i'\]: expected an int"):
        check_meta({"i": 2**63})
    for v in (math.nan, math.inf):
        with pytest.raises(InvalidMetaError, match="finite float"):
            check_meta({"f": v})
    with pytest.raises(InvalidMetaError, match=r"found dict \(values are not nested\)"):
        check_meta({"d": {"x": 1}})
    with pytest.raises(InvalidMetaError, match="lone surrogate"):
        check_meta({"s": "ok\ud800"})
    with pytest.raises(InvalidMetaError, match="control characters, found U\\+000A"):
        check_meta({"a\nb": 1})
    with pytest.raises(InvalidMetaError, match="expected a map .* found list"):
        check_meta([["id", 1]])
    assert issubclass(InvalidMetaError, HSCaptureError) and issubclass(InvalidMetaError,
                                                                      ValueError)


def test_subclasses_become_exact_builtin_types_and_other_numbers_are_named():
    import enum

    import numpy as np

    class Split(str, enum.Enum):
        TRAIN = "train"

    got = check_meta({"f": np.float64(0.5), "s": Split.TRAIN, "i": enum.IntEnum("E", "A").A})
    assert got == {"f": 0.5, "s": "train", "i": 1}
    assert [type(v) for v in got.values()] == [float, str, int]
    for v, name in ((np.int64(3), "int64"), (np.bool_(True), "bool"), (b"x", "bytes")):
        with pytest.raises(InvalidMetaError, match=f"found {name}"):
            check_meta({"v": v})             # not a subclass of an accepted type: named


def req_with(custom):
    return SimpleNamespace(sampling_params=SimpleNamespace(custom_params=custom))


def test_sample_extra_carries_a_valid_meta_and_says_why_an_invalid_one_is_missing():
    cfg = CaptureConfig()
    assert cfg.sample_extra(req_with(None), 2) == ({"attempt": 2}, None)
    assert cfg.sample_extra(req_with({META_PARAM: {}}))[0] == {"attempt": 0}
    assert cfg.sample_extra(req_with({META_PARAM: None}))[0] == {"attempt": 0}
    extra, err = cfg.sample_extra(req_with({META_PARAM: {"id": "q1", "split": "train"}}))
    assert extra == {"attempt": 0, "meta": {"id": "q1", "split": "train"}} and err is None
    extra, err = cfg.sample_extra(req_with({META_PARAM: {"id": ["x" * 5000]}}))
    assert isinstance(err, InvalidMetaError) and "meta" not in extra
    assert extra["meta_error"] == str(err)[:MAX_META_ERROR_CHARS]
    assert "not nested" in extra["meta_error"]
    extra, err = cfg.sample_extra(req_with({META_PARAM: "x" * 100_000}))
    assert len(extra["meta_error"]) <= MAX_META_ERROR_CHARS and "found str" in extra["meta_error"]
    off = CaptureConfig(meta=False)
    assert off.sample_extra(req_with({META_PARAM: {"id": 1}})) == ({"attempt": 0}, None)


def test_sample_extra_and_the_live_stream_dict_expose_the_meta():
    s = make_sample(0, extra={"attempt": 0, "meta": {"id": "q0"}})
    assert s.extra["meta"] == {"id": "q0"}
    assert sample_to_dict(s)["meta"] == {"id": "q0"}
    assert "meta" not in sample_to_dict(make_sample(1))


def test_a_field_named_like_a_stream_key_or_a_layer_never_overwrites_it():
    s = make_sample(2, extra={"attempt": 0, "meta": {"id": "q2"}})
    T = s.num_tokens
    for name in ("meta", "rid", "input_ids", "layer_1"):
        s.fields[name] = torch.full((T,), 7, dtype=torch.uint8)
    d = sample_to_dict(s)
    assert d["meta"] == {"id": "q2"} and d["rid"] == s.rid
    assert torch.equal(d["input_ids"], s.token_ids.to(torch.int64))
    assert torch.equal(d["layer_1"], s.tensors["layer_1"])
    for name in ("meta", "rid", "input_ids", "layer_1"):
        assert torch.equal(d[f"field.{name}"], torch.full((T,), 7, dtype=torch.uint8)), name
    assert "loss_mask" in d and "field.loss_mask" not in d


# -- end to end -----------------------------------------------------------------------------


def requests(n: int):
    """[rid, tokens, chunk, custom_params]: single- and multi-chunk samples, most with a meta,
    one with an invalid one (captured without it), one with none."""
    out = []
    for i in range(n):
        tokens = 5 + (i * 7) % 23
        custom = {"hscapture_loss_mask": [int(t % 3 != 0) for t in range(tokens)]}
        if i == 3:
            custom[META_PARAM] = {"id": f"row-{i}", "nested": {"no": 1}}
        elif i != 5:
            custom[META_PARAM] = {"id": f"row-{i}", "split": "eval" if i % 4 == 0 else "train",
                                  "row": i, "weight": i / 8, "hard": i % 2 == 0, "note": None}
        out.append([f"hscap-m{i:03d}", tokens, 6 if i % 2 else tokens, custom])
    return out


def want_meta(r):
    m = r[3].get(META_PARAM)
    return None if m is None or "nested" in m else m


def start_meta_producer(spec, cwd):
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, os.path.join(HERE, "meta_support.py"),
                             json.dumps(spec)], cwd=cwd, stdout=subprocess.PIPE, text=True)


def finish(proc):
    try:
        out, _ = proc.communicate(timeout=60)
        assert '"done"' in out, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def drained(tmp_path_factory):
    """A real producer process -> a real `hscapture drain` process -> a shard directory."""
    import tempfile
    import shutil

    tmp = tmp_path_factory.mktemp("meta")
    sock = tempfile.mkdtemp(prefix="hsc-meta-", dir="/tmp")
    endpoint = f"ipc://{sock}/p.sock"
    reqs = requests(12)
    out = tmp / "shards"
    prod = start_meta_producer({"endpoint": endpoint, "requests": reqs}, tmp)
    try:
        d = start_drain(endpoint, out, "-n", str(len(reqs)), "--shard-size", "4K", cwd=tmp)
        rc, report, err = drain_report(d, timeout=120)
        assert rc == 0, (report, err)
        finish(prod)
    finally:
        if prod.poll() is None:
            prod.kill()
            prod.wait()
        shutil.rmtree(sock, ignore_errors=True)
    return out, reqs, tmp


def test_the_meta_travels_through_a_drain_into_the_shards_the_reader_and_the_dataset(drained):
    out, reqs, _ = drained
    ss = open_shards(out)
    assert sorted(ss.rids) == sorted(r[0] for r in reqs)
    assert len({ss.entry(i)["shard"] for i in range(len(ss))}) > 2    # several shards
    by_rid = {r[0]: r for r in reqs}
    for s in ss:
        r = by_rid[s.rid]
        tensors, ids = source(s.rid, r[1], HIDDEN, len(ALL_LAYERS))
        assert torch.equal(s.token_ids.to(torch.int64), ids)
        for name, t in zip(NAMES, tensors):
            assert torch.equal(s.tensors[name], t), (s.rid, name)
        assert s.loss_mask.tolist() == r[3]["hscapture_loss_mask"]
        assert s.extra.get("meta") == want_meta(r), s.rid
        assert s.extra["attempt"] == 0
        if r[0].endswith("003"):
            assert "not nested" in s.extra["meta_error"]       # captured, and says why
        else:
            assert "meta_error" not in s.extra
        line = ss.entry(s.rid)
        assert line["meta"]["extra"].get("meta") == want_meta(r)   # index.jsonl itself
    ds = ShardDataset(out, transform=lambda s: (s.rid, s.extra.get("meta")))
    got = dict(DataLoader(ds, batch_size=None, num_workers=2, collate_fn=lambda x: x))
    assert got == {r[0]: want_meta(r) for r in reqs}


def test_the_meta_reaches_both_exports_and_their_trainers_loaders_ignore_it(drained):
    out, reqs, tmp = drained
    ss = open_shards(out)
    rids = ss.rids
    by_rid = {r[0]: r for r in reqs}
    with_meta = sum(want_meta(r) is not None for r in reqs)

    sf = tmp / "sf"
    r = export(out, sf, "specforge", progress=False, fsync=False)
    assert r.written == len(reqs) and r.manifest["meta"]["samples"] == with_meta
    files = list_local_files(str(sf))
    for f in files:
        i = int(os.path.basename(f)[len("data_"):-len(".ckpt")])
        raw = load_feature_file(f)
        want = want_meta(by_rid[rids[i]])
        assert raw.get(META_KEY) == want
        base = {"input_ids", "loss_mask", "hidden_state", "aux_hidden_state"}
        assert set(raw) == (base | {META_KEY} if want is not None else base)
    items = OfflineEagle3Dataset(files, max_len=2048)
    for k in range(len(items)):              # SpecForge's own dataset reads only its keys
        i = int(os.path.basename(files[k])[len("data_"):-len(".ckpt")])
        item = items[k]
        assert set(item) == {"attention_mask", "loss_mask", "target", "hidden_state",
                             "input_ids"}
        assert torch.equal(item["input_ids"][0], ss[i].token_ids.to(torch.int64))
    again = export(out, sf, "specforge", progress=False, fsync=False)
    assert again.skipped == len(reqs) and again.written == 0     # the meta check resumes

    sp = tmp / "sp"
    r = export(out, sp, "speculators", progress=False, fsync=False)
    assert r.manifest["meta"]["samples"] == with_meta
    ds = ArrowDataset(max_len=4096, datapath=str(sp), on_missing="raise")
    assert len(ds) == len(reqs)
    for i, rid in enumerate(rids):
        item = ds[i]
        assert isinstance(item, dict), item           # aligned: token ids matched
        assert torch.equal(item["input_ids"], ss[i].token_ids.to(torch.int64))
        col = ds.data[i][META_KEY]
        want = want_meta(by_rid[rid])
        assert (None if col is None else json.loads(col)) == want
    save_token_frequency_distribution(ds.data, tmp / "freq.pt")   # their tool, our column
    assert torch.load(sp / "token_freq.pt") == torch.load(tmp / "freq.pt")


def test_an_export_without_any_meta_is_unchanged_and_one_whose_meta_changed_is_rewritten(
        tmp_path):
    plain = tmp_path / "plain"
    write_shards(plain, [make_sample(i) for i in range(4)])
    sp = tmp_path / "sp"
    export(plain, sp, "speculators", progress=False, fsync=False)
    ds = ArrowDataset(max_len=4096, datapath=str(sp), on_missing="raise")
    assert META_KEY not in ds.data.column_names
    assert json.loads((sp / "hscapture_export.json").read_text())["meta"]["samples"] == 0

    d = tmp_path / "shards"
    write_shards(d, [make_sample(i, extra={"attempt": 0, "meta": {"id": i}})
                     for i in range(4)])
    sf = tmp_path / "sf"
    export(d, sf, "specforge", progress=False, fsync=False)
    # a file from an export that did not carry the meta: found wrong, written again
    path = sf / "rows_0-2000" / "data_2.ckpt"
    raw = torch.load(path, weights_only=True)
    raw.pop(META_KEY)
    torch.save(raw, path)
    r = export(d, sf, "specforge", progress=False, fsync=False)
    assert (r.rewritten, r.skipped) == (1, 3)
    assert load_feature_file(str(path))[META_KEY] == {"id": 2}


def test_the_live_stream_hands_each_item_its_meta(tmp_path):
    import tempfile
    import shutil

    sock = tempfile.mkdtemp(prefix="hsc-meta-", dir="/tmp")
    endpoint = f"ipc://{sock}/p.sock"
    reqs = requests(6)
    try:
        ds = StreamDataset(endpoint, max_samples=len(reqs), idle_timeout_s=30)
        it = iter(ds)           # subscribes before the producer waits for a subscriber
        prod = start_meta_producer({"endpoint": endpoint, "requests": reqs}, tmp_path)
        try:
            got = {item["rid"]: item.get("meta") for item in it}
        finally:
            finish(prod)
        assert got == {r[0]: want_meta(r) for r in reqs}
        assert ds.report()["delivered"] == len(reqs)
    finally:
        shutil.rmtree(sock, ignore_errors=True)


def test_the_transformers_adapter_refuses_an_extra_list_that_does_not_match_its_rows(endpoint):
    from hscapture import Producer
    from hscapture.adapters.transformers import HiddenStateCapture
    from hscapture.demo import tiny_llama
    from hscapture.errors import CaptureConfigError

    model = tiny_llama(layers=2, hidden=64)
    with Producer(endpoint, producer_id="meta-adapter", capacity=1 << 20) as p:
        cap = HiddenStateCapture(model, p, [0])
        with pytest.raises(CaptureConfigError, match=r"extra: expected one entry per row \(2\), "
                                                     r"found 1"):
            with cap.request(["a", "b"], torch.ones(2, 4, dtype=torch.long),
                             extra=[{"meta": {"id": 1}}]):
                pass
        cap.close()


def test_inspect_counts_the_samples_carrying_each_field_and_metadata_key(drained):
    """`hscapture inspect` (and `verify_dir`) say which per-sample fields and client-metadata
    keys the directory's samples carry, and how many were captured with a refused meta."""
    import subprocess
    import sys

    from hscapture.shard_check import verify_dir

    out, reqs, tmp = drained
    per = verify_dir(out)["per_sample"]
    with_meta = [want_meta(r) for r in reqs if want_meta(r) is not None]
    assert per["fields"] == {"loss_mask": len(reqs)}
    assert per["meta_keys"] == {k: len(with_meta) for k in with_meta[0]}
    assert per["meta_errors"] == 1
    shown = subprocess.run([sys.executable, "-m", "hscapture", "inspect", str(out)],
                           capture_output=True, text=True, cwd=tmp, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert f"per-token fields (samples): loss_mask ({len(reqs)})" in shown.stdout
    assert f"id ({len(with_meta)})" in shown.stdout and "refused at capture: 1" in shown.stdout
