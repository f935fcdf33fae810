"""Tests of the shard reader (hscapture/reader.py), per-token fields in the writer, and
shards.load_sample on top of the reader. Real ShardWriter, real files, several shards."""

from __future__ import annotations

import json
import os
import pickle

import pytest
import torch

import hscapture.reader as reader
import hscapture.shard_index as shard_index
from hscapture.errors import ShardError
from hscapture.reader import ShardDataset, StoredSample, open_shards
from hscapture.shard_check import verify_dir
from hscapture.shards import ShardWriter, load_sample
from shard_support import make_sample, write_shards


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def assert_same(got: StoredSample, want) -> None:
    assert got.rid == want.rid
    assert got.layers == want.layers and got.layer_kinds == want.layer_kinds
    assert set(got.tensors) == set(want.tensors)
    for k, v in want.tensors.items():
        assert got.tensors[k].dtype == v.dtype and torch.equal(bits(got.tensors[k]), bits(v)), k
    assert got.token_ids.dtype == want.token_ids.dtype
    assert torch.equal(got.token_ids, want.token_ids)
    assert set(got.fields) == set(want.fields)
    for k, v in want.fields.items():
        assert got.fields[k].dtype == torch.uint8 and torch.equal(got.fields[k], v)


@pytest.fixture
def samples():
    return [make_sample(i) for i in range(40)]


@pytest.fixture
def shard_dir(tmp_path, samples):
    d = tmp_path / "shards"
    write_shards(d, samples)
    assert len([f for f in os.listdir(d) if f.endswith(".safetensors")]) > 3
    return d


def test_every_sample_reads_back_bit_exact_by_position_and_by_rid(shard_dir, samples):
    ss = open_shards(shard_dir)
    assert len(ss) == len(samples)
    assert ss.rids == [s.rid for s in samples]
    for i, s in enumerate(samples):
        assert_same(ss[i], s)
        assert_same(ss.get(s.rid), s)
        assert ss.position(s.rid) == i
    assert_same(ss[-1], samples[-1])
    got = ss[5]
    assert got.dtype == "bfloat16" and got.hidden == 16 and got.num_tokens == samples[5].num_tokens
    assert got.model == "toy" and got.convention == "test-convention"
    assert got.extra == {"row": 5}
    assert torch.equal(got.loss_mask, samples[5].fields["loss_mask"])
    assert torch.equal(got.layer(3), samples[5].tensors["layer_3"])
    assert torch.equal(got.final_norm, samples[5].tensors["final_norm"])


def test_unknown_rid_and_position_fail_with_what_was_asked(shard_dir):
    ss = open_shards(shard_dir)
    with pytest.raises(KeyError, match="nope"):
        ss.get("nope")
    assert ss.get("nope", None) is None
    assert "nope" not in ss and "hscap-00000" in ss
    with pytest.raises(IndexError, match="40 samples"):
        ss[40]
    with pytest.raises(KeyError, match="not captured"):
        ss[0].layer(2)
    with pytest.raises(KeyError, match=r"layer_2"):
        ss.load(0, names=["layer_2"])


def test_reader_reads_the_index_once_then_never_again(shard_dir, samples):
    ss = open_shards(shard_dir)
    os.rename(shard_dir / "index.jsonl", shard_dir / "index.moved")  # a reread would now fail
    for i in (39, 0, 17, 3):
        assert_same(ss.get(samples[i].rid), samples[i])


def test_load_only_named_layers_reads_only_those(shard_dir, samples):
    got = open_shards(shard_dir).load(2, names=["layer_5"])
    assert list(got.tensors) == ["layer_5"]
    assert torch.equal(got.tensors["layer_5"], samples[2].tensors["layer_5"])
    assert torch.equal(got.token_ids, samples[2].token_ids)


def test_load_sample_reads_the_index_once_for_many_calls_and_sees_new_samples(
        shard_dir, samples, monkeypatch):
    calls = []
    real = shard_index.read_index_lines
    monkeypatch.setattr(shard_index, "read_index_lines",
                        lambda d: calls.append(d) or real(d))
    reader._SET_CACHE.clear()
    for s in samples * 3:
        loaded = load_sample(shard_dir, s.rid)
        assert set(loaded) == set(s.tensors) | {"token_ids", "field.loss_mask"}
        assert torch.equal(bits(loaded["layer_1"]), bits(s.tensors["layer_1"]))
    assert len(calls) == 1
    more = make_sample(99)
    write_shards(shard_dir, [more])            # the index changes: reread once
    calls.clear()                              # (the writer read it too)
    assert torch.equal(load_sample(shard_dir, more.rid)["token_ids"], more.token_ids)
    assert torch.equal(load_sample(shard_dir, samples[0].rid)["token_ids"], samples[0].token_ids)
    assert len(calls) == 1
    with pytest.raises(ShardError, match="not in the index"):
        load_sample(shard_dir, "absent")


def test_fields_and_extra_meta_travel_through_the_writer_into_index_and_shard(shard_dir):
    lines = [json.loads(l) for l in (shard_dir / "index.jsonl").read_text().splitlines()]
    assert all(l["fields"] == ["loss_mask"] for l in lines)
    assert lines[7]["meta"]["extra"] == {"row": 7}
    rep = verify_dir(shard_dir)
    assert rep["ok"], rep["problems"]


def test_index_lines_without_fields_key_find_fields_in_the_shard(shard_dir, samples):
    p = shard_dir / "index.jsonl"
    lines = [json.loads(l) for l in p.read_text().splitlines()]
    for l in lines:
        del l["fields"]
    p.write_text("".join(json.dumps(l) + "\n" for l in lines))
    ss = open_shards(shard_dir)
    for i in (0, 13, 39):
        assert_same(ss[i], samples[i])


def test_writer_rejects_a_field_of_the_wrong_shape_dtype_or_name(tmp_path):
    bad = [
        ({"loss_mask": torch.ones(2, dtype=torch.uint8)}, "shape"),
        ({"loss_mask": torch.ones(5, dtype=torch.int64)}, "uint8"),
        ({"a/b": torch.ones(5, dtype=torch.uint8)}, "invalid field name"),
        ({"": torch.ones(5, dtype=torch.uint8)}, "invalid field name"),
    ]
    with ShardWriter(tmp_path / "d", fsync=False) as w:
        for i, (fields, match) in enumerate(bad):
            s = make_sample(i, T=5)
            s.fields = fields
            with pytest.raises(ShardError, match=match):
                w.add(s)
        s = make_sample(9, T=5)
        s.fields = {"loss_mask": torch.tensor([0, 1, 1, 0, 1], dtype=torch.bool)}
        w.add(s)
    got = open_shards(tmp_path / "d")[0]
    assert got.fields["loss_mask"].dtype == torch.uint8
    assert got.fields["loss_mask"].tolist() == [0, 1, 1, 0, 1]


def test_verify_dir_flags_a_field_the_index_does_not_list(shard_dir):
    p = shard_dir / "index.jsonl"
    lines = [json.loads(l) for l in p.read_text().splitlines()]
    lines[3]["fields"] = []
    p.write_text("".join(json.dumps(l) + "\n" for l in lines))
    rep = verify_dir(shard_dir)
    assert not rep["ok"]
    assert any("fields ['loss_mask']" in x for x in rep["problems"])


def test_sample_without_fields_reads_back_with_none(tmp_path):
    write_shards(tmp_path / "d", [make_sample(0, mask=False)])
    got = open_shards(tmp_path / "d")[0]
    assert got.fields == {} and got.loss_mask is None


def test_a_shard_named_by_the_index_but_missing_fails_naming_it(shard_dir):
    ss = open_shards(shard_dir)
    shard = ss.entry(0)["shard"]
    os.unlink(shard_dir / shard)
    with pytest.raises(ShardError, match=shard):
        ss[0]


def test_torn_last_index_line_is_ignored(shard_dir, samples):
    with open(shard_dir / "index.jsonl", "ab") as f:
        f.write(b'{"v":1,"rid":"torn","sha')
    ss = open_shards(shard_dir)
    assert len(ss) == len(samples) and "torn" not in ss


def test_not_a_shard_directory_is_refused(tmp_path):
    with pytest.raises(ShardError, match="not a directory"):
        open_shards(tmp_path / "missing")
    with pytest.raises(ShardError, match="index.jsonl"):
        open_shards(tmp_path)


def _to_training(s: StoredSample) -> dict:
    return {"ids": s.token_ids.to(torch.int64), "mask": s.loss_mask.to(torch.int64),
            "l1": s.tensors["layer_1"].float()}


def test_dataset_in_dataloader_workers_returns_every_sample_once(shard_dir, samples):
    ds = ShardDataset(shard_dir, transform=_to_training, names=["layer_1"])
    pickle.loads(pickle.dumps(ds.shards))  # handles are not pickled
    ds.shards[0]  # open a handle in the parent: workers must not reuse it blindly
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                         multiprocessing_context="fork")
    got = list(loader)
    assert len(got) == len(samples)
    for g, s in zip(got, samples):
        assert torch.equal(g["ids"], s.token_ids.to(torch.int64))
        assert torch.equal(g["mask"], s.fields["loss_mask"].to(torch.int64))
        assert torch.equal(g["l1"], s.tensors["layer_1"].float())


def test_samples_of_different_layer_sets_read_back_each_with_its_own_and_never_share_lists(
        tmp_path):
    """The reader builds a layout (ids, kinds, names) once per distinct layer set, not once
    per sample; a directory that mixes layer sets still reads every sample with its own, and
    a caller editing one sample's lists changes no other sample's."""
    d = tmp_path / "shards"
    mixed = [make_sample(i, aux=(1, 3, 5) if i % 3 else (2, 4), final_norm=bool(i % 2))
             for i in range(12)]
    write_shards(d, mixed)
    ss = open_shards(d)
    for i in [5, 0, 11, 3, 7, 0, 6]:
        assert_same(ss[i], mixed[i])
    a, b = ss[1], ss[5]
    assert a.layers == b.layers and a.layers is not b.layers
    a.layers.append(99)
    a.layer_kinds.clear()
    assert_same(ss[5], mixed[5])
    assert_same(ss[1], mixed[1])


def _every_tensor(s: StoredSample) -> list[torch.Tensor]:
    return [s.token_ids, *s.tensors.values(), *s.fields.values()]


@pytest.fixture(params=["copied", "mapped", "out_of_maps"])
def read_path(request, monkeypatch):
    """How the reader gets a read's bytes: copied (samples under reader.MAP_AT_LEAST, all of
    these tests' by default), a private map of their own (every sample here), or copied
    because no map can be made (vm.max_map_count reached). Yields the count of maps made."""
    made = [0]
    real = reader._private_map

    def counted(*a):
        made[0] += 1
        if request.param == "out_of_maps":
            raise OSError(12, "Cannot allocate memory")
        return real(*a)

    monkeypatch.setattr(reader, "_private_map", counted)
    if request.param != "copied":
        monkeypatch.setattr(reader, "MAP_AT_LEAST", 0)
    yield made
    assert (made[0] > 0) == (request.param != "copied"), (request.param, made)


def test_each_served_tensor_has_a_storage_of_its_own_bytes_that_outlives_the_reader(
        shard_dir, samples, read_path):
    """The reader serves tensors from a memory map of the shard, each with a storage of its
    own bytes: sending one to another process (a DataLoader worker's queue moves it to shared
    memory, in the queue's feeder thread) copies that tensor alone and changes no other
    tensor's memory. (One storage over the whole map, shared by every tensor of the shard,
    was copied whole and swapped while the worker made the next sample's tensors from it: a
    worker died of a segmentation fault.) The tensors stay valid after the reader closed."""
    ss = open_shards(shard_dir)
    got = [ss.load(i) for i in range(len(ss))]
    storages = set()
    for s in got:
        for t in [s.token_ids, *s.tensors.values(), *s.fields.values()]:
            st = t.untyped_storage()
            assert st.nbytes() == t.numel() * t.element_size(), "a storage beyond its tensor"
            assert st.data_ptr() not in storages, "two tensors share a storage"
            storages.add(st.data_ptr())
    # what a DataLoader worker's queue does to a sample it sends: the tensor's storage moves
    # to shared memory; another tensor of the same shard is not touched
    from multiprocessing.reduction import ForkingPickler

    from torch.multiprocessing import reductions

    reductions.init_reductions()          # (what importing torch.multiprocessing does)

    a, b = got[0].token_ids, got[1].token_ids
    b_ptr = b.untyped_storage().data_ptr()
    ForkingPickler.dumps(a)
    assert a.untyped_storage().is_shared()
    assert b.untyped_storage().data_ptr() == b_ptr and not b.untyped_storage().is_shared()
    ss.close()
    del ss
    for s, want in zip(got, samples):
        assert_same(s, want)


@pytest.mark.parametrize("compression", [None, "zstd", "fp8"])
def test_writing_into_a_served_tensor_changes_no_later_read_of_it_or_its_shard(
        tmp_path, samples, compression, read_path):
    """A delivered sample's bytes never change: a tensor the reader returns is memory no other
    read shares, so writing into it in place (a transform that normalizes in place, a
    DataLoader without workers) changes no later read of that sample, by position or by rid,
    through the same set, ``load_sample``'s cached set or a ``ShardDataset``, nor any other
    sample of its shard, nor what an export reads. (Until 2026-12-05 every read of a shard
    was a view of one private map of it kept by the set: the write showed in every later read
    of that sample through the same set, GUARANTEES known gap 9.) Compressed shards decode
    their layers into fresh memory; their token ids and fields are stored as they are."""
    from hscapture.export import export

    d = tmp_path / "shards"
    with ShardWriter(d, max_shard_bytes=4096, fsync=False, compression=compression,
                     metadata={"convention": "test-convention"}) as w:
        for s in samples:
            w.add(s)
    fresh = open_shards(d)                  # the file's bytes, as a new set reads them
    want = [fresh[i] for i in range(len(fresh))]
    ss = open_shards(d)
    by_shard: dict[str, list[int]] = {}
    for i in range(len(ss)):
        by_shard.setdefault(ss.entry(i)["shard"], []).append(i)
    i, j = next(v for v in by_shard.values() if len(v) >= 3)[1:3]   # neighbours in one shard
    other = ss[j]                           # read before the write, kept

    def scribble(s: StoredSample) -> None:
        for t in _every_tensor(s):
            t.view(torch.uint8).fill_(0xA5)

    def assert_file(s: StoredSample, k: int) -> None:
        assert s.rid == want[k].rid
        for got, exp in zip(_every_tensor(s), _every_tensor(want[k]), strict=True):
            assert got.dtype == exp.dtype and torch.equal(bits(got), bits(exp)), s.rid

    got = ss[i]
    scribble(got)
    assert all(torch.equal(bits(t), torch.full_like(bits(t), 0xA5)) for t in _every_tensor(got))
    assert_file(ss[i], i)
    assert_file(ss.get(ss.rids[i]), i)
    assert torch.equal(bits(ss.load(i, names=["layer_3"]).tensors["layer_3"]),
                       bits(want[i].tensors["layer_3"]))
    assert_file(ss[j], j)
    assert_file(other, j)
    for k in range(len(ss)):                # and nothing else in the directory moved
        assert_file(ss[k], k)

    # load_sample keeps one set per directory between calls
    rid = ss.rids[j]
    first = load_sample(d, rid)
    for t in first.values():
        t.view(torch.uint8).fill_(0x5A)
    again = load_sample(d, rid)
    assert torch.equal(again["token_ids"], want[j].token_ids)
    assert torch.equal(bits(again["layer_3"]), bits(want[j].tensors["layer_3"]))
    assert torch.equal(again["field.loss_mask"], want[j].fields["loss_mask"])

    # a transform that normalizes in place, a DataLoader without workers, two epochs
    def normalize(s: StoredSample) -> StoredSample:
        for t in s.tensors.values():
            t.sub_(t.float().mean().to(t.dtype))
        s.token_ids.zero_()
        return s

    ds = ShardDataset(ss, transform=normalize)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0,
                                         collate_fn=lambda s: s)
    epochs = [[bits(s.tensors["layer_3"]).clone() for s in loader] for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*epochs, strict=True))
    for k in range(len(ss)):
        assert_file(ss[k], k)

    # the export reads the file's bytes, whatever was written into tensors served before
    scribble(ss[0])
    out = tmp_path / "sf"
    r = export(d, out, "specforge", progress=False, fsync=False)
    assert r.written == len(samples)
    for k, s in enumerate(want):
        raw = torch.load(out / "rows_0-2000" / f"data_{k}.ckpt", weights_only=True)
        assert torch.equal(raw["input_ids"], s.token_ids.to(torch.int64))
        assert torch.equal(raw["hidden_state"][0], s.tensors["final_norm"])


def test_dataloader_workers_send_every_sample_exact_through_several_epochs(shard_dir, samples,
                                                                         read_path):
    """Two DataLoader workers reading and sending whole samples (every layer, the token ids,
    the fields), three epochs: every sample arrives each epoch, bit for bit."""
    ds = ShardDataset(shard_dir)
    assert_same(ds[0], samples[0])                 # (read here too: read_path counts maps)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                         collate_fn=lambda s: s)
    want = {s.rid: s for s in samples}
    for _ in range(3):
        seen = set()
        for s in loader:
            assert s.rid not in seen
            seen.add(s.rid)
            assert_same(s, want[s.rid])
        assert seen == set(want)


#: argv: shard directory, export directory. Runs with an open-file limit of 64.
FEW_FDS = r"""
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from hscapture.export import export
from hscapture.reader import open_shards
src, out = sys.argv[1:3]
with open_shards(src) as ss:
    for _ in range(2):
        for i in range(len(ss)):
            assert ss[i].rid == ss.rids[i]
    n = len(ss)
r = export(src, out, "speculators", progress=False, fsync=False, workers=2)
assert r.written == n, r
# shards closed and reopened (4 open at most) while every tensor read stays kept: a map per
# read (each read is mapped here), none holding a descriptor (Python's mmap held one each:
# fault hunt 7)
import hscapture.reader as reader
reader.MAX_OPEN_SHARDS = 4
reader.MAP_AT_LEAST = 0
with open_shards(src) as ss:
    kept = [(i % n, ss[i % n].tensors) for i in range(3 * n)]
    again = open_shards(src)
    for i, tensors in kept:
        want = again[i].tensors
        assert all(tensors[k].equal(want[k]) for k in want), i
print("ok", n)
"""


@pytest.fixture
def maps_made(monkeypatch):
    """Every read is served from a map (reader.MAP_AT_LEAST 0); yields the list of maps made,
    each as (file offset, length asked, file size)."""
    made: list[tuple[int, int, int]] = []
    real = reader._private_map

    def counted(fd, offset, size, file_size):
        made.append((offset, size, file_size))
        return real(fd, offset, size, file_size)

    monkeypatch.setattr(reader, "_private_map", counted)
    monkeypatch.setattr(reader, "MAP_AT_LEAST", 0)
    return made


def _ptrs(s: StoredSample) -> set[int]:
    return {t.data_ptr() for t in _every_tensor(s) if t.numel()}


def test_reads_of_a_shard_share_one_map_until_a_byte_of_it_would_be_served_twice(
        shard_dir, samples, maps_made):
    """Reading every sample once maps each shard once, whole (not one map per read: each
    cost an mmap, a munmap and its page faults again, ~26 us a 2 MiB sample); reading a
    sample again, whole or one layer of it, gets a fresh map, so no two reads share a byte."""
    ss = open_shards(shard_dir)
    shards = {ss.entry(i)["shard"] for i in range(len(ss))}
    first = [ss[i] for i in range(len(ss))]
    assert len(maps_made) == len(shards)
    assert all(off == 0 and size == file_size for off, size, file_size in maps_made)
    for s, want in zip(first, samples):
        assert_same(s, want)
    again = ss[3]
    assert len(maps_made) == len(shards) + 1
    assert not _ptrs(again) & _ptrs(first[3])
    layer = ss.load(3, names=["layer_3"]).tensors["layer_3"]      # a third read of its bytes
    assert len(maps_made) == len(shards) + 2
    assert layer.data_ptr() not in _ptrs(again) | _ptrs(first[3])
    assert_same(again, samples[3])


def test_a_set_makes_fresh_maps_once_its_map_budget_is_served_and_keeps_none_of_the_old(
        shard_dir, samples, maps_made, monkeypatch):
    """A page of a served tensor written in place stays in its map while the map lives: a
    set stops using its maps once it served reader.MAP_BUDGET bytes from them (every read
    here), and no handle keeps one it stopped using (they are unmapped with their last
    tensor)."""
    monkeypatch.setattr(reader, "MAP_BUDGET", 1)
    ss = open_shards(shard_dir)
    for i in range(len(ss)):
        assert_same(ss[i], samples[i])
        assert len(maps_made) == i + 1
        assert all(h._map is None for h in ss._handles.values())


def test_threads_reading_one_sample_at_once_never_share_its_memory(shard_dir, samples,
                                                                  maps_made):
    """Threads of one set (an export's workers) reading the same samples at the same time
    each get memory of their own: the check and the record of a served range are one step."""
    import threading

    ss = open_shards(shard_dir)
    got: list[StoredSample] = []
    lock = threading.Lock()
    start = threading.Barrier(6)

    def reader_thread() -> None:
        start.wait()
        mine = [ss[i % 4] for i in range(40)]
        with lock:
            got.extend(mine)

    threads = [threading.Thread(target=reader_thread) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 240
    want = {w.rid: w for w in samples[:4]}
    seen: set[int] = set()
    for s in got:
        ptrs = _ptrs(s)
        assert not ptrs & seen, "two reads share memory"
        seen |= ptrs
        assert_same(s, want[s.rid])


def test_a_directory_of_more_shards_than_open_files_allowed_reads_and_exports_whole(tmp_path):
    # every shard used to stay open (one descriptor each): past the open-file limit the
    # reader failed with "Too many open files" and an export could never finish its resume
    # (fault hunt 4, 2026-12-05: 1,100 shards under `ulimit -n 1024`); and a tensor kept
    # from a shard closed and reopened kept a descriptor of its own (fault hunt 7)
    import subprocess
    import sys

    samples = [make_sample(i, T=3) for i in range(120)]
    write_shards(tmp_path / "src", samples, max_shard_bytes=512)     # one sample a shard
    shards = [n for n in os.listdir(tmp_path / "src") if n.endswith(".safetensors")]
    assert len(shards) >= 100, len(shards)
    r = subprocess.run([sys.executable, "-c", FEW_FDS, str(tmp_path / "src"),
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.split() == ["ok", "120"], r.stderr[-3000:]


def test_a_shard_replaced_under_an_open_set_is_still_read_from_the_file_it_opened(tmp_path,
                                                                                  samples):
    """Each read opens the shard again and checks it is the file the set opened (inode, size,
    mtime): a file renamed over it (another capture's) is not read through the old header's
    offsets; the sample comes from the file first opened (safe_open's map of it), copied, so
    a write into it still changes no later read."""
    write_shards(tmp_path / "a", samples)
    others = [make_sample(100 + i, rid=s.rid) for i, s in enumerate(samples)]
    write_shards(tmp_path / "b", others)
    ss = open_shards(tmp_path / "a")
    assert_same(ss[0], samples[0])
    shard = ss.entry(0)["shard"]
    os.replace(tmp_path / "b" / shard, tmp_path / "a" / shard)
    got = ss[0]
    assert_same(got, samples[0])
    for t in _every_tensor(got):
        t.view(torch.uint8).fill_(0xA5)
    assert_same(ss[0], samples[0])
    assert_same(open_shards(tmp_path / "a")[0], others[0])     # a new set reads the new file
