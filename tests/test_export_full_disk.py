"""An export onto a filesystem that fills: a real tmpfs of a few MiB, mounted for the test
(root and ``mount -t tmpfs`` needed, else skipped). Whatever file the disk fills in (a sample
file, its native aux-row write, the speculators dataset), the export stops with an
:class:`ExportError` that names the cause and says a rerun resumes. No final-named file is
partial. After the filesystem grows, the rerun keeps the complete files, writes the rest, and
every sample reads back exactly through the trainer's own loader.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from hscapture.export import MANIFEST_NAME, ExportWriteError, export
from shard_support import make_sample, write_shards

from specforge.data.preprocessing import list_local_files
from specforge.runtime.data_plane.feature_store import load_feature_file
from speculators.train.data import ArrowDataset

N = 10
T, H = 512, 1024          # 1 MiB per layer: the final layer goes by the native CRC writer too


def _mount(path: Path, size: int) -> bool:
    path.mkdir(exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True)
    return r.returncode == 0


def _grow(path: Path, size: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)


def _pages(root: Path, skip: set[str] = frozenset()) -> int:
    """tmpfs's accounting of ``root``'s files: whole 4 KiB pages."""
    total = 0
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            if p.relative_to(root).parts[0] not in skip:
                total += -(-p.stat().st_size // 4096) * 4096
    return total


@pytest.fixture
def fs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    mnt = tmp_path / "fs"
    if not _mount(mnt, 4 << 20):
        pytest.skip("`mount -t tmpfs` is not available here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    samples = [make_sample(i, T=T + i, H=H) for i in range(N)]
    d = tmp_path_factory.mktemp("shards")
    write_shards(d, samples, max_shard_bytes=64 << 20)
    return d, samples


def _specforge_exact(out: Path, samples) -> None:
    files = list_local_files(str(out))
    assert len(files) == N
    for f in files:
        i = int(os.path.basename(f)[len("data_"):-len(".ckpt")])
        s, raw = samples[i], load_feature_file(f)
        assert torch.equal(raw["input_ids"], s.token_ids.to(torch.int64))
        assert torch.equal(raw["hidden_state"][0], s.tensors["final_norm"])
        assert torch.equal(raw["aux_hidden_state"][0],
                           torch.cat([s.tensors[f"layer_{l}"] for l in (1, 3, 5)], dim=-1))


def _speculators_exact(out: Path, samples) -> None:
    ds = ArrowDataset(max_len=8192, datapath=str(out), on_missing="raise")
    assert len(ds) == N
    for i, s in enumerate(samples):
        item = ds[i]
        assert isinstance(item, dict), item          # a token-id mismatch comes back unavailable
        assert torch.equal(item["input_ids"], s.token_ids.to(torch.int64))
        assert torch.equal(item["hidden_states"],
                           torch.cat([s.tensors[f"layer_{l}"] for l in (1, 3, 5)], dim=-1))


def _no_partial_final_file(out: Path, fmt: str, samples) -> int:
    """The final-named sample files present each read back exactly (a partial one would not);
    returns how many there are."""
    if fmt == "specforge":
        files = list_local_files(str(out))
        for f in files:
            i = int(os.path.basename(f)[len("data_"):-len(".ckpt")])
            raw = load_feature_file(f)
            assert torch.equal(raw["hidden_state"][0], samples[i].tensors["final_norm"]), f
        return len(files)
    files = sorted((out / "hidden_states").glob("hs_*.safetensors"))
    from safetensors.torch import load_file
    for f in files:
        i = int(f.stem[len("hs_"):])
        got = load_file(str(f))
        assert torch.equal(got["token_ids"], samples[i].token_ids.to(torch.int64)), f
    return len(files)


@pytest.mark.parametrize("fmt", ["specforge", "speculators"])
def test_a_disk_that_fills_mid_export_stops_it_typed_and_a_rerun_after_growing_is_exact(
        fs, shards, fmt):
    src, samples = shards
    out = fs / "out"
    # 4 MiB: under one sample's 5 MiB, so the first sample file already fills the disk
    with pytest.raises(ExportWriteError, match=r"(?s)No space left.*rerun to resume"):
        export(src, out, fmt, progress=False, fsync=False, workers=2)
    assert _no_partial_final_file(out, fmt, samples) == 0
    _grow(fs, 24 << 20)          # room for a few samples, not all
    with pytest.raises(ExportWriteError, match=r"(?s)No space left.*rerun to resume"):
        export(src, out, fmt, progress=False, fsync=False, workers=2)
    kept = _no_partial_final_file(out, fmt, samples)
    assert 0 < kept < N
    _grow(fs, 256 << 20)
    r = export(src, out, fmt, progress=False, fsync=False, workers=2)
    assert r.skipped == kept and r.written == N - kept
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    (_specforge_exact if fmt == "specforge" else _speculators_exact)(out, samples)


def test_a_disk_that_fills_at_the_speculators_dataset_stops_it_typed_and_a_rerun_finishes(
        fs, shards, tmp_path):
    src, samples = shards
    ref = tmp_path / "ref"
    export(src, ref, "speculators", progress=False, fsync=False)
    files = _pages(ref / "hidden_states") + _pages(ref, {"hidden_states"} | {
        n for n in os.listdir(ref) if n != MANIFEST_NAME})
    rest = _pages(ref, {"hidden_states", MANIFEST_NAME})     # the dataset and token_freq.pt
    assert rest > 64 << 10, rest
    _grow(fs, files + 16384)     # every sample file and the manifest fit, the dataset does not
    out = fs / "out"
    with pytest.raises(ExportWriteError, match=r"rerun to resume"):
        export(src, out, "speculators", progress=False, fsync=False, workers=2)
    assert _no_partial_final_file(out, "speculators", samples) == N
    assert '"status": "complete"' not in (out / MANIFEST_NAME).read_text()
    _grow(fs, 256 << 20)
    r = export(src, out, "speculators", progress=False, fsync=False, workers=2)
    assert (r.skipped, r.written) == (N, 0)
    _speculators_exact(out, samples)
