"""Tests of the trainer exports (hscapture/export.py, hscapture/cli_export.py).

Every export is read back through the trainers' OWN published loader code, installed on CPU
with --no-deps (requirements-trainers-test.txt; scripts/setup.sh installs it):

* SpecForge 0.2.0: ``specforge.data.preprocessing.list_local_files`` +
  ``OfflineEagle3Dataset`` (what its offline trainer iterates) and
  ``specforge.runtime.data_plane.feature_store.load_feature_file`` (raw dict).
* speculators 0.9.0: ``speculators.train.data.ArrowDataset`` (``load_from_disk`` + the
  ``hs_connectors`` FileTransfer reading ``hidden_states/hs_{i}.safetensors``; it drops a sample
  whose token ids differ, so each returned item proves alignment),
  ``speculators.data_generation.offline.check_hidden_states`` and
  ``speculators.train.vocab_mapping.save_token_frequency_distribution``.

No re-implementation is needed: both import on CPU.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from hscapture.cli_export import export as export_cmd
from hscapture.export import MANIFEST_NAME, ExportError, export
from hscapture.reader import open_shards
from shard_support import NUM_LAYERS, make_sample, write_shards

from specforge.data.preprocessing import OfflineEagle3Dataset, list_local_files
from specforge.runtime.data_plane.feature_store import load_feature_file
from speculators.data_generation.offline import check_hidden_states
from speculators.train.data import ArrowDataset
from speculators.train.vocab_mapping import save_token_frequency_distribution

N = 25


@pytest.fixture
def samples():
    return [make_sample(i) for i in range(N)]


@pytest.fixture
def shard_dir(tmp_path, samples):
    d = tmp_path / "shards"
    write_shards(d, samples)
    return d


def manifest(out) -> dict:
    return json.loads((out / MANIFEST_NAME).read_text())


def aux_cat(s, layers=(1, 3, 5)) -> torch.Tensor:
    return torch.cat([s.tensors[f"layer_{l}"] for l in layers], dim=-1)


@pytest.mark.parametrize("gz,crc", [(False, True), (True, True), (False, False)],
                         ids=["ckpt", "ckpt.gz", "ckpt without zip CRCs"])
def test_specforge_export_reads_back_through_specforge_loaders_field_by_field(
        shard_dir, samples, tmp_path, gz, crc):
    out = tmp_path / "sf"
    r = export(shard_dir, out, "specforge", progress=False, fsync=False, gzip=gz, crc32=crc)
    assert (r.samples, r.written, r.skipped) == (N, N, 0)
    files = list_local_files(str(out))
    assert len(files) == N
    assert all(os.path.relpath(f, out).startswith("rows_0-2000/data_") for f in files)
    suffix = ".ckpt.gz" if gz else ".ckpt"
    assert all(f.endswith(suffix) for f in files)
    for f in files:
        i = int(os.path.basename(f)[len("data_"):-len(suffix)])
        s = samples[i]
        raw = load_feature_file(f)
        assert set(raw) == {"input_ids", "loss_mask", "hidden_state", "aux_hidden_state"}
        assert raw["input_ids"].dtype == torch.int64 and raw["loss_mask"].dtype == torch.int64
        assert torch.equal(raw["input_ids"], s.token_ids.to(torch.int64))
        assert torch.equal(raw["loss_mask"], s.fields["loss_mask"].to(torch.int64))
        T = s.num_tokens
        assert raw["hidden_state"].shape == (1, T, 16)
        assert raw["hidden_state"].dtype == torch.bfloat16
        assert torch.equal(raw["hidden_state"][0], s.tensors["final_norm"])   # post-norm
        assert raw["aux_hidden_state"].shape == (1, T, 48)
        assert torch.equal(raw["aux_hidden_state"][0], aux_cat(s))            # ascending
    ds = OfflineEagle3Dataset(files, max_len=2048)
    for k in range(len(ds)):
        item = ds[k]
        i = int(os.path.basename(files[k])[len("data_"):-len(suffix)])
        s = samples[i]
        want_mask = s.fields["loss_mask"].to(torch.int64).clone()
        want_mask[-1] = 0                                   # SpecForge's own adjustment
        assert torch.equal(item["loss_mask"][0], want_mask)
        assert torch.equal(item["target"][0], s.tensors["final_norm"])
        assert torch.equal(item["hidden_state"][0], aux_cat(s))
        assert torch.equal(item["input_ids"][0], s.token_ids.to(torch.int64))
    m = manifest(out)
    assert m["status"] == "complete" and m["format"] == "specforge"
    assert m["rids"] == [s.rid for s in samples]
    assert m["layers"]["aux_hscapture"] == [1, 3, 5]
    assert m["layers"]["aux_specforge_ids"] == [1, 3, 5]          # SGLang id j = layer j
    assert m["layers"]["target"]["hscapture"] == "final_norm"
    assert "SGLang" in m["conventions"]["specforge"] and "hscapture" in m["conventions"]
    assert m["source_convention"] == ["test-convention"]
    assert m["loss_mask"] == {"mode": "require", "stored": N, "all_ones": 0, "all_ones_rids": []}
    assert m["zip_crc32"] == (None if gz else crc)


def test_speculators_export_reads_back_through_speculators_loaders_field_by_field(
        shard_dir, samples, tmp_path):
    out = tmp_path / "sp"
    r = export(shard_dir, out, "speculators", progress=False, fsync=False)
    assert (r.samples, r.written) == (N, N)
    ds = ArrowDataset(max_len=4096, datapath=str(out), on_missing="raise")
    assert len(ds) == N
    assert ds.approx_lengths == [s.num_tokens for s in samples]
    for i, s in enumerate(samples):
        item = ds[i]
        assert isinstance(item, dict), item              # a mismatch comes back unavailable
        assert torch.equal(item["input_ids"], s.token_ids.to(torch.int64))
        assert torch.equal(item["hidden_states"], aux_cat(s))          # [:, :-1] flattened
        # last slot: the last decoder layer BEFORE the final norm (residual layer N-1)
        assert torch.equal(item["verifier_last_hidden_states"],
                           s.tensors[f"layer_{NUM_LAYERS - 1}"])
        assert not torch.equal(item["verifier_last_hidden_states"], s.tensors["final_norm"])
        assert torch.equal(item["loss_mask"], s.fields["loss_mask"].to(torch.int64))
        assert item["loss_mask"].dtype == torch.int64
        assert int(ds.data[i]["seq_len"]) == s.num_tokens
        hs = ds.transfer.get_cached(i)
        assert hs["hidden_states"].shape == (s.num_tokens, 4, 16)
        assert hs["token_ids"].dtype == torch.int64
        check_hidden_states(hs, s.token_ids.tolist())
    theirs = tmp_path / "their_freq.pt"
    save_token_frequency_distribution(ds.data, theirs)
    assert torch.load(out / "token_freq.pt") == torch.load(theirs)
    m = manifest(out)
    assert m["layers"]["aux_speculators_ids"] == [2, 4, 6]      # vLLM id j = layer j-1
    assert m["layers"]["target"]["speculators_id"] == NUM_LAYERS
    assert m["trainer_settings"] == {"--target-layer-ids": [2, 4, 6]}
    assert "vLLM" in m["conventions"]["speculators"]


def test_speculators_dataset_past_int32_offsets_is_large_list_and_reads_back_exactly(
        shard_dir, samples, tmp_path, monkeypatch):
    """More tokens in all than Arrow's int32 list offsets hold (2**31 - 1; lowered here to
    just below the samples' total) make the token columns large_list instead of wrapping
    the offsets (which numpy did silently); speculators' own loader reads them exactly."""
    import hscapture.export as E

    total = sum(s.num_tokens for s in samples)
    monkeypatch.setattr(E, "_LIST_OFFSETS_MAX", total - 1)
    out = tmp_path / "sp"
    export(shard_dir, out, "speculators", progress=False, fsync=False)
    ds = ArrowDataset(max_len=4096, datapath=str(out), on_missing="raise")
    assert "LargeList" in repr(ds.data.features["input_ids"]), ds.data.features
    for i, s in enumerate(samples):
        item = ds[i]
        assert torch.equal(item["input_ids"], s.token_ids.to(torch.int64))
        assert torch.equal(item["loss_mask"], s.fields["loss_mask"].to(torch.int64))
        assert int(ds.data[i]["seq_len"]) == s.num_tokens
    monkeypatch.setattr(E, "_LIST_OFFSETS_MAX", total)          # exactly at the limit: list
    export(shard_dir, tmp_path / "sp2", "speculators", progress=False, fsync=False)
    ds2 = ArrowDataset(max_len=4096, datapath=str(tmp_path / "sp2"), on_missing="raise")
    assert "LargeList" not in repr(ds2.data.features["input_ids"])


def test_no_crc_is_refused_where_there_is_no_zip_crc_and_an_export_resumes_only_in_its_mode(
        shard_dir, tmp_path):
    with pytest.raises(ExportError, match="safetensors, which have no CRC"):
        export(shard_dir, tmp_path / "sp", "speculators", progress=False, crc32=False)
    with pytest.raises(ExportError, match="gzip's own CRC"):
        export(shard_dir, tmp_path / "gz", "specforge", progress=False, gzip=True, crc32=False)
    assert not (tmp_path / "sp").exists() and not (tmp_path / "gz").exists()
    out = tmp_path / "sf"
    export(shard_dir, out, "specforge", progress=False, fsync=False, crc32=False)
    with pytest.raises(ExportError, match="holds another export"):
        export(shard_dir, out, "specforge", progress=False, fsync=False)
    r = export(shard_dir, out, "specforge", progress=False, fsync=False, crc32=False)
    assert (r.written, r.skipped) == (0, N)
    res = CliRunner().invoke(export_cmd, ["-f", "specforge", "--no-crc", "--overwrite", "-q",
                                          "--no-fsync", str(shard_dir), str(out)])
    assert res.exit_code == 0, res.output
    assert manifest(out)["zip_crc32"] is False
    res = CliRunner().invoke(export_cmd, ["-f", "speculators", "--no-crc", "-q",
                                          str(shard_dir), str(tmp_path / "sp2")])
    assert res.exit_code == 2 and "no CRC" in res.output


def test_speculators_refuses_a_capture_without_the_prenorm_final_layer(tmp_path):
    d = tmp_path / "shards"
    write_shards(d, [make_sample(i, last_residual=False) for i in range(3)])
    out = tmp_path / "sp"
    with pytest.raises(ExportError, match=r"BEFORE the final norm.*residual layer 7.*SGLang"):
        export(d, out, "speculators", progress=False)
    assert not out.exists() or not os.listdir(out)


def test_speculators_needs_the_layer_count_when_no_final_norm_records_it(tmp_path):
    d = tmp_path / "shards"
    write_shards(d, [make_sample(i, final_norm=False) for i in range(3)])
    with pytest.raises(ExportError, match="num_layers"):
        export(d, tmp_path / "sp", "speculators", progress=False)
    r = export(d, tmp_path / "sp", "speculators", num_layers=NUM_LAYERS, progress=False,
               fsync=False)
    assert r.written == 3


def test_a_layer_count_the_shards_contradict_is_refused_not_obeyed(tmp_path):
    # The shards record NUM_LAYERS (their final norm follows layer NUM_LAYERS - 1). A
    # smaller --num-layers named an intermediate layer the model's last, and the export
    # shipped it as speculators' final pre-norm slot without a word (a newcomer's finding,
    # 2026-12-05); now it is refused, and the recorded count works as before.
    d = tmp_path / "shards"
    write_shards(d, [make_sample(i, last_residual=True) for i in range(3)])
    for wrong in (NUM_LAYERS - 1, NUM_LAYERS + 1):
        with pytest.raises(ExportError, match=rf"num-layers\) {wrong} contradicts the shards: "
                                              rf"they record {NUM_LAYERS} decoder layers"):
            export(d, tmp_path / "sp", "speculators", num_layers=wrong, progress=False)
        assert not (tmp_path / "sp").exists() or not os.listdir(tmp_path / "sp")
    r = export(d, tmp_path / "sp", "speculators", num_layers=NUM_LAYERS, progress=False,
               fsync=False)
    assert r.written == 3


@pytest.mark.parametrize("fmt", ["specforge", "speculators"])
def test_samples_of_two_models_are_refused_naming_each_unless_asked(tmp_path, fmt):
    # same hidden size, dtype and layers: until 2026-12-05 the export took them as one
    # verifier's without a word (fault hunt 4); only the manifest listed both models
    from hscapture.shards import ShardWriter

    src = tmp_path / "src"
    with ShardWriter(src, fsync=False) as w:
        for i in range(6):
            s = make_sample(i)
            s.meta = {"model": "llama-8b" if i < 4 else "qwen-7b", "extra": {}}
            s.epoch = 1 if i < 4 else 2
            w.add(s)
    with pytest.raises(ExportError, match=r"2 models \('llama-8b': 4 sample\(s\).*'qwen-7b': 2"):
        export(src, tmp_path / "out", fmt, progress=False, fsync=False, num_layers=NUM_LAYERS)
    assert not (tmp_path / "out").exists()
    r = CliRunner().invoke(export_cmd, ["-f", fmt, str(src), str(tmp_path / "out"), "-q"])
    assert r.exit_code == 2 and "--allow-mixed-models" in r.output, r.output
    r = CliRunner().invoke(export_cmd, ["-f", fmt, str(src), str(tmp_path / "out"), "-q",
                                        "--allow-mixed-models"])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())["model"] == \
        ["llama-8b", "qwen-7b"]


def test_specforge_refuses_a_capture_without_final_norm(tmp_path):
    d = tmp_path / "shards"
    write_shards(d, [make_sample(i, final_norm=False) for i in range(3)])
    with pytest.raises(ExportError, match=r"AFTER the final norm.*HSCAPTURE_FINAL_NORM"):
        export(d, tmp_path / "sf", "specforge", progress=False)


def test_missing_loss_mask_is_refused_by_default_and_all_ones_only_when_asked(tmp_path):
    d = tmp_path / "shards"
    ss = [make_sample(i, mask=(i % 2 == 0)) for i in range(6)]
    write_shards(d, ss)
    with pytest.raises(ExportError, match=r"3 of 6 samples have no loss_mask.*--loss-mask all"):
        export(d, tmp_path / "sf", "specforge", progress=False)
    out = tmp_path / "sf"
    export(d, out, "specforge", loss_mask="all", progress=False, fsync=False)
    for i, s in enumerate(ss):
        raw = load_feature_file(str(out / f"rows_0-2000/data_{i}.ckpt"))
        want = s.fields["loss_mask"].to(torch.int64) if i % 2 == 0 else \
            torch.ones(s.num_tokens, dtype=torch.int64)
        assert torch.equal(raw["loss_mask"], want)   # a stored mask is always used
    lm = manifest(out)["loss_mask"]
    assert lm["mode"] == "all" and lm["stored"] == 3 and lm["all_ones"] == 3
    assert lm["all_ones_rids"] == [ss[1].rid, ss[3].rid, ss[5].rid]


def test_layers_are_hscapture_ids_written_ascending_and_must_be_captured(shard_dir, samples,
                                                                        tmp_path):
    out = tmp_path / "sf"
    export(shard_dir, out, "specforge", layers=[5, 1], progress=False, fsync=False)
    raw = load_feature_file(str(out / "rows_0-2000/data_4.ckpt"))
    assert torch.equal(raw["aux_hidden_state"][0], aux_cat(samples[4], (1, 5)))
    with pytest.raises(ExportError, match=r"layers \[2\] are not captured"):
        export(shard_dir, tmp_path / "x", "specforge", layers=[1, 2], progress=False)
    with pytest.raises(ExportError, match="final slot"):
        export(shard_dir, tmp_path / "y", "speculators", layers=[1, 7], progress=False)


@pytest.mark.parametrize("gz", [False, True], ids=["ckpt", "ckpt.gz"])
def test_rerun_skips_complete_files_rewrites_partial_ones_and_appends_new_samples(
        shard_dir, samples, tmp_path, gz):
    out = tmp_path / "sf"
    ext = ".ckpt.gz" if gz else ".ckpt"
    export(shard_dir, out, "specforge", progress=False, fsync=False, gzip=gz)
    f3, f8 = out / f"rows_0-2000/data_3{ext}", out / f"rows_0-2000/data_8{ext}"
    data = f3.read_bytes()
    f3.write_bytes(data[: len(data) // 2])                # torn
    f8.unlink()                                           # never written
    (out / f"rows_0-2000/data_9{ext}.hscapture-tmp").write_bytes(b"junk")
    r = export(shard_dir, out, "specforge", progress=False, fsync=False, gzip=gz)
    assert (r.written, r.rewritten, r.skipped) == (2, 1, N - 2)
    assert not (out / f"rows_0-2000/data_9{ext}.hscapture-tmp").exists()
    assert torch.equal(load_feature_file(str(f3))["aux_hidden_state"][0], aux_cat(samples[3]))
    more = [make_sample(i) for i in range(N, N + 3)]
    write_shards(shard_dir, more)
    r = export(shard_dir, out, "specforge", progress=False, fsync=False, gzip=gz)
    assert (r.samples, r.written, r.skipped) == (N + 3, 3, N)
    assert len(list_local_files(str(out))) == N + 3
    assert manifest(out)["rids"][-3:] == [s.rid for s in more]


def test_speculators_rerun_rewrites_a_file_with_other_token_ids(shard_dir, samples, tmp_path):
    out = tmp_path / "sp"
    export(shard_dir, out, "speculators", progress=False, fsync=False)
    os.replace(out / "hidden_states/hs_1.safetensors", out / "hidden_states/hs_2.safetensors")
    r = export(shard_dir, out, "speculators", progress=False, fsync=False)
    assert (r.written, r.rewritten) == (2, 1)
    ds = ArrowDataset(max_len=4096, datapath=str(out), on_missing="raise")
    assert all(isinstance(ds[i], dict) for i in range(N))


def test_another_export_in_out_is_refused_unless_overwrite(shard_dir, tmp_path):
    out = tmp_path / "sf"
    export(shard_dir, out, "specforge", progress=False, fsync=False)
    with pytest.raises(ExportError, match="another export"):
        export(shard_dir, out, "specforge", layers=[1, 3], progress=False)
    with pytest.raises(ExportError, match="another export"):
        export(shard_dir, out, "speculators", progress=False)
    r = export(shard_dir, out, "speculators", overwrite=True, progress=False, fsync=False)
    assert r.written == N
    assert not any(n.startswith("rows_") for n in os.listdir(out))   # the old export is gone
    assert manifest(out)["format"] == "speculators"


@pytest.mark.parametrize("other", ["recaptured", "fp8"])
def test_an_export_of_other_captures_of_the_same_rids_is_refused_not_kept(
        samples, shard_dir, tmp_path, other):
    # The same rids, token ids, masks and layers, but another capture (a new producer
    # incarnation: another checkpoint, a new run) or other values (the shards stored as FP8):
    # resuming would keep every file of the first export, whose keys, shapes and token ids
    # match. Until 2026-12-05 it did ("0 written, N already complete") and rewrote the
    # manifest to describe the new source over the old hidden states.
    second = tmp_path / "second"
    if other == "recaptured":
        again = [make_sample(i) for i in range(N)]
        for s_ in again:
            s_.epoch = 2
            for t in s_.tensors.values():
                t.add_(1)
        write_shards(second, again)
    else:
        from hscapture.shards import ShardWriter
        with ShardWriter(second, fsync=False, compression="fp8",
                         metadata={"convention": "test-convention"}) as w:
            for s_ in samples:
                w.add(s_)
    for fmt in ("specforge", "speculators"):
        out = tmp_path / fmt
        export(shard_dir, out, fmt, progress=False, fsync=False)
        with pytest.raises(ExportError, match="other captures of the same rids"):
            export(second, out, fmt, progress=False, fsync=False)
        r = export(second, out, fmt, overwrite=True, progress=False, fsync=False)
        assert r.written == N and r.skipped == 0
        export(second, out, fmt, progress=False, fsync=False)   # its own resume: accepted


def test_a_bad_worker_count_is_refused_before_anything_is_written(shard_dir, tmp_path):
    out = tmp_path / "sf"
    export(shard_dir, out, "specforge", progress=False, fsync=False)
    before = manifest(out)
    with pytest.raises(ExportError, match="workers: expected a number of threads >= 1"):
        export(shard_dir, out, "specforge", workers=-1, progress=False)
    assert manifest(out) == before                # still complete, untouched
    res = CliRunner().invoke(export_cmd, ["--format", "specforge", str(shard_dir), str(out),
                                          "--workers", "0"])
    assert res.exit_code == 2 and "--workers" in res.output


def test_stray_export_files_without_manifest_are_refused(shard_dir, tmp_path):
    out = tmp_path / "sf"
    (out / "rows_0-2000").mkdir(parents=True)
    with pytest.raises(ExportError, match="no hscapture_export.json"):
        export(shard_dir, out, "specforge", progress=False)


def test_cli_exports_with_progress_and_exits_2_with_the_reason_when_refused(shard_dir,
                                                                            tmp_path):
    runner = CliRunner()
    out = tmp_path / "sf"
    res = runner.invoke(export_cmd, ["--format", "specforge", str(shard_dir), str(out),
                                     "--no-fsync", "--layers", "1,3,5"])
    assert res.exit_code == 0, res.output
    assert f"{N} samples ({N} written" in res.output
    # as pasted: a YAML line for SpecForge's config, flag and values for speculators' command
    assert "  model.aux_hidden_state_layer_ids: [1, 3, 5]\n" in res.output, res.output
    res = runner.invoke(export_cmd, ["-f", "speculators", str(shard_dir), str(tmp_path / "sp"),
                                     "-q", "--no-fsync"])
    assert res.exit_code == 0, res.output
    assert "  --target-layer-ids 2 4 6\n" in res.output, res.output
    res = runner.invoke(export_cmd, ["-f", "speculators", str(shard_dir), str(tmp_path / "sp"),
                                     "--json", "-q", "--no-fsync"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output.strip().splitlines()[-1])["skipped"] == N
    d = tmp_path / "nomask"
    write_shards(d, [make_sample(0, mask=False)])
    res = runner.invoke(export_cmd, ["-f", "specforge", str(d), str(tmp_path / "o")])
    assert res.exit_code == 2
    assert "no loss_mask" in res.output


def test_reader_sees_what_export_read(shard_dir, samples):
    # the export's source of truth is the public reader
    ss = open_shards(shard_dir)
    assert [ss[i].rid for i in range(len(ss))] == [s.rid for s in samples]


def test_a_specforge_tensor_is_saved_alone_never_with_the_buffer_it_is_a_view_of():
    """torch.save writes a tensor's whole storage: a view into a larger buffer is copied
    first, a tensor that is all of its storage is saved as it is (no needless copy)."""
    from hscapture._tensor_files import _own

    whole = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert _own(whole) is whole
    for view in (whole[1:], whole[:, :2], whole.t()):
        got = _own(view)
        assert got.untyped_storage().nbytes() == view.numel() * view.element_size()
        assert torch.equal(got, view)
    buf = io.BytesIO()
    torch.save({"h": _own(torch.zeros(1000, 64)[:2])}, buf)
    assert buf.tell() < 64 * 1000 * 4 // 4, "the whole buffer was saved with the view"


def test_an_export_into_a_directory_of_other_files_is_refused_and_writes_nothing(shard_dir,
                                                                                 tmp_path):
    # a newcomer's `hscapture export -f specforge shards docs`: until 2026-12-05 the export
    # landed beside the directory's own files, exit 0
    out = tmp_path / "docs"
    out.mkdir()
    (out / "notes.md").write_text("mine")
    for overwrite in (False, True):
        with pytest.raises(ExportError, match=r"not empty and holds no export.*notes\.md"):
            export(shard_dir, out, "specforge", progress=False, overwrite=overwrite)
        assert sorted(p.name for p in out.iterdir()) == ["notes.md"]
    res = CliRunner().invoke(export_cmd, ["-f", "specforge", str(shard_dir), str(out)])
    assert res.exit_code == 2 and "hscapture: error:" in res.output, res.output
    # an export's own directory may hold a user's file beside it: it resumes
    good = tmp_path / "sf"
    export(shard_dir, good, "specforge", progress=False, fsync=False)
    (good / "README.txt").write_text("notes beside an export")
    assert export(shard_dir, good, "specforge", progress=False, fsync=False).skipped == N


def test_a_remedy_is_worded_as_a_flag_on_the_command_line_and_as_an_argument_in_python(
        shard_dir, tmp_path):
    out = tmp_path / "sf"
    export(shard_dir, out, "specforge", progress=False, fsync=False)
    (out / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(ExportError, match=r"pass overwrite=True \(--overwrite\)"):
        export(shard_dir, out, "specforge", progress=False, fsync=False)
    res = CliRunner().invoke(export_cmd, ["-f", "specforge", str(shard_dir), str(out)])
    assert res.exit_code == 2, res.output
    assert "pass --overwrite" in res.output and "overwrite=True" not in res.output, res.output
    res = CliRunner().invoke(export_cmd, ["-f", "specforge", str(shard_dir), str(shard_dir)])
    assert res.exit_code == 2 and "out_dir" not in res.output, res.output


def test_export_failures_are_one_line_hscapture_errors_and_debug_shows_the_traceback(
        shard_dir, tmp_path):
    args = ["export", "-f", "specforge", str(shard_dir), str(tmp_path / "o"), "--layers", "1,99",
            "--loss-mask", "all"]
    res = subprocess.run([sys.executable, "-m", "hscapture", *args], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and res.stderr.startswith("hscapture: error: layers [99]"), \
        res.stderr
    assert "Traceback" not in res.stderr
    dbg = subprocess.run([sys.executable, "-m", "hscapture", "--debug", *args],
                         capture_output=True, text=True, timeout=120)
    assert dbg.returncode == 2 and "Traceback" in dbg.stderr, dbg.stderr
    as_json = subprocess.run([sys.executable, "-m", "hscapture", *args, "--json"],
                             capture_output=True, text=True, timeout=120)
    assert as_json.returncode == 2 and json.loads(as_json.stdout)["error"].startswith(
        "layers [99]"), (as_json.stdout, as_json.stderr)
    missing = subprocess.run([sys.executable, "-m", "hscapture", "export", "-f", "specforge",
                              str(tmp_path), str(tmp_path / "p")],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and missing.stderr.startswith("hscapture: error:"), \
        missing.stderr


def test_a_speculators_export_without_the_datasets_package_says_what_to_install_and_exits_1(
        shard_dir, tmp_path):
    # exit 1 (an error), not 2 (a refusal): the environment lacks a package, the shards can
    # produce the export (README, exit codes)
    out = tmp_path / "sp"
    code = ("import sys; sys.modules['datasets'] = None\n"
            "from hscapture.cli import main\n"
            f"main(['export', '-f', 'speculators', {str(shard_dir)!r}, {str(out)!r}])")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 1, res.stderr
    assert res.stderr.startswith("hscapture: error:"), res.stderr
    assert "pip install 'hscapture[export]'" in res.stderr and "Traceback" not in res.stderr
    assert not out.exists() or not any(out.iterdir())      # nothing written
