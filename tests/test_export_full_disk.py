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

from export_support import big_shards, every_final_file_exact, export_exact
from hscapture.export import MANIFEST_NAME, ExportWriteError, export

N = 10


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
    d = tmp_path_factory.mktemp("shards")
    return d, big_shards(d, N)


@pytest.mark.parametrize("fmt", ["specforge", "speculators"])
def test_a_disk_that_fills_mid_export_stops_it_typed_and_a_rerun_after_growing_is_exact(
        fs, shards, fmt):
    src, samples = shards
    out = fs / "out"
    # 4 MiB: under one sample's 5 MiB, so the first sample file already fills the disk
    with pytest.raises(ExportWriteError, match=r"(?s)No space left.*rerun to resume"):
        export(src, out, fmt, progress=False, fsync=False, workers=2)
    assert every_final_file_exact(out, fmt, samples) == 0
    _grow(fs, 24 << 20)          # room for a few samples, not all
    with pytest.raises(ExportWriteError, match=r"(?s)No space left.*rerun to resume"):
        export(src, out, fmt, progress=False, fsync=False, workers=2)
    kept = every_final_file_exact(out, fmt, samples)
    assert 0 < kept < N
    _grow(fs, 256 << 20)
    r = export(src, out, fmt, progress=False, fsync=False, workers=2)
    assert r.skipped == kept and r.written == N - kept
    export_exact(out, fmt, samples)


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
    assert every_final_file_exact(out, "speculators", samples) == N
    assert '"status": "complete"' not in (out / MANIFEST_NAME).read_text()
    _grow(fs, 256 << 20)
    r = export(src, out, "speculators", progress=False, fsync=False, workers=2)
    assert (r.skipped, r.written) == (N, 0)
    export_exact(out, "speculators", samples)


def test_torch_save_on_a_full_disk_is_the_oserror_it_is(fs):
    # torch.save turns a failed write into a RuntimeError of its zip writer: the export
    # (token_freq.pt) then ended with a traceback instead of ExportWriteError (fault hunt,
    # 2026-12-05: a tmpfs sized so that the disk filled exactly there)
    import torch

    from hscapture.export import _write_atomic

    fd = os.open(fs / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    try:                                     # fill the disk, then give a few pages back
        while os.write(fd, b"\0" * 65536):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    os.truncate(fs / "filler", os.path.getsize(fs / "filler") - 8192)
    freq = {i: i for i in range(50_000)}
    with pytest.raises(OSError, match="No space left"):
        _write_atomic(str(fs / "token_freq.pt"), lambda f: torch.save(freq, f), False)
