"""Golden tests of the export's own torch.save writer (hscapture/_tensor_files.py ``_torch_save``, used by hscapture/export.py).

SpecForge's ``.ckpt`` files are written without torch.save (no assembled aux tensor, no
torch CRC pass), so these pin that the bytes ARE torch.save's, for the installed torch: any
change in torch's zip container (record order, padding, descriptors, zip64 end records,
serialization id) fails here, not in a trainer. They also prove what other readers need:
torch.load with mmap=True, Python's zipfile with every CRC checked, and the safetensors
files of speculators against the safetensors library.
"""

from __future__ import annotations

import io
import os
import zipfile
import zlib

import pytest
import torch
from safetensors import safe_open

from hscapture import _tensor_files as TF
from hscapture import export as E


def _layers(T: int, H: int, K: int, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(T, H, generator=g).to(dtype) for _ in range(K)]


def _specforge_dict(T: int, H: int, dtype: torch.dtype, meta: dict | None, seed: int = 0):
    *aux, fin = _layers(T, H, 4, dtype, seed)
    d = {"input_ids": torch.arange(T, dtype=torch.int64),
         "loss_mask": (torch.arange(T) % 3 != 0).to(torch.int64),
         "hidden_state": fin.unsqueeze(0),
         "aux_hidden_state": TF._join(aux, (1, T, 3 * H))}
    if meta is not None:
        d[E.META_KEY] = meta
    # what the export saved before this writer: aux preallocated [1, T, 3H], copied into
    # (its strides, which differ from cat's only for T = 0)
    want = {**d, "aux_hidden_state": torch.empty(1, T, 3 * H, dtype=dtype).copy_(
        torch.cat(aux, dim=-1).unsqueeze(0))}
    return d, want


def _torch_bytes(d: dict) -> bytes:
    b = io.BytesIO()
    torch.save(d, b)
    return b.getvalue()


@pytest.mark.parametrize("T,H,dtype,meta", [
    (37, 16, torch.bfloat16, None),                       # rows of 32 bytes
    (5, 2048, torch.bfloat16, {"row": 3, "split": "train"}),
    (1, 8, torch.float32, None),
    (0, 16, torch.float16, None),                         # no tokens: empty records
    (300, 96, torch.bfloat16, None),                      # several bounce-buffer slices
])
@pytest.mark.parametrize("crc", ["default", "zlib"])
def test_the_writer_gives_torch_saves_exact_bytes(T, H, dtype, meta, crc, monkeypatch):
    monkeypatch.setattr(TF, "BOUNCE_BYTES", 4096)   # many slices, a short last one
    if crc == "zlib":                               # what runs where isal is not installed
        monkeypatch.setattr(TF, "_crc32", zlib.crc32)
    d, want = _specforge_dict(T, H, dtype, meta)
    out = io.BytesIO()
    TF._torch_save(d, out)
    assert out.getvalue() == _torch_bytes(want)


def test_samples_of_one_shape_are_pickled_once_and_each_file_is_still_torch_saves_bytes(
        monkeypatch):
    monkeypatch.setattr(TF, "_RECORDS", {})
    real, calls = torch.serialization._save, []
    monkeypatch.setattr(torch.serialization, "_save",
                        lambda obj, zf, *a: (calls.append(type(zf) is TF._Recording),
                                             real(obj, zf, *a))[1])
    for seed in range(3):                   # one length and model: one pickling, three files
        d, want = _specforge_dict(24, 64, torch.bfloat16, None, seed=seed)
        out = io.BytesIO()
        TF._torch_save(d, out)
        assert out.getvalue() == _torch_bytes(want)
    assert sum(calls) == 1
    d, want = _specforge_dict(25, 64, torch.bfloat16, None)       # another length: its own
    out = io.BytesIO()
    TF._torch_save(d, out)
    assert out.getvalue() == _torch_bytes(want) and sum(calls) == 2
    for row in range(2):                    # metadata is pickled with each sample, every time
        d, want = _specforge_dict(24, 64, torch.bfloat16, {"row": row})
        out = io.BytesIO()
        TF._torch_save(d, out)
        assert out.getvalue() == _torch_bytes(want)
    assert sum(calls) == 4


def test_a_file_loads_with_mmap_passes_every_zip_crc_and_writes_only_the_views_bytes(tmp_path):
    big = torch.randn(64, 512).bfloat16()
    view = big[8:40]                                   # a view: torch.save would write `big`
    d, want = _specforge_dict(32, 512, torch.bfloat16, None, seed=1)
    d["hidden_state"] = view.unsqueeze(0)
    want["hidden_state"] = view.clone().unsqueeze(0)
    p = tmp_path / "data_0.ckpt"
    with open(p, "wb") as f:                          # the os.writev path of a real file
        TF._torch_save(d, f)
    assert p.read_bytes() == _torch_bytes(want)
    with zipfile.ZipFile(p) as z:
        assert z.testzip() is None                    # every CRC-32 checked
    got = torch.load(p, mmap=True, weights_only=True)
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k])


@pytest.fixture
def torch_crc_off():
    """torch.save writing every record's CRC-32 as 0 (torch's process-wide switch), restored."""
    torch.serialization.set_crc32_options(False)
    yield
    torch.serialization.set_crc32_options(True)


@pytest.mark.parametrize("T,H,dtype", [(37, 16, torch.bfloat16), (300, 2048, torch.bfloat16),
                                       (0, 16, torch.float16)])
def test_without_crc_a_file_is_torch_saves_bytes_under_its_crc_off_switch_and_loads(
        T, H, dtype, tmp_path, torch_crc_off):
    d, want = _specforge_dict(T, H, dtype, {"row": 1}, seed=3)
    p = tmp_path / "data_0.ckpt"
    with open(p, "wb") as f:                          # a real file: the native writer's path
        TF._torch_save(d, f, crc32=False)
    assert p.read_bytes() == _torch_bytes(want)      # taken with torch's CRCs off
    with zipfile.ZipFile(p) as z:
        assert all(i.CRC == 0 for i in z.infolist())
    got = torch.load(p, mmap=True, weights_only=True)   # what SpecForge's loader does
    for k in want:
        if isinstance(want[k], torch.Tensor):
            assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k])


def test_the_default_writer_keeps_its_crcs_when_a_caller_turned_torchs_off(tmp_path,
                                                                           torch_crc_off):
    """The serialization id's names part is read from a torch.save; with torch's CRCs off
    that file has none, and the export's default files still carry every CRC."""
    TF._torch_names_hash.cache_clear()
    d, want = _specforge_dict(12, 64, torch.bfloat16, None, seed=4)
    p = tmp_path / "data_0.ckpt"
    with open(p, "wb") as f:
        TF._torch_save(d, f)
    with zipfile.ZipFile(p) as z:
        assert z.testzip() is None
    got = torch.load(p, mmap=True, weights_only=True)
    assert torch.equal(got["aux_hidden_state"], want["aux_hidden_state"])
    TF._torch_names_hash.cache_clear()


def test_join_interleaves_rows_of_each_source_in_order():
    ls = _layers(7, 4, 3, torch.float32, 2)
    j = TF._join(ls, (7, 3, 4))
    assert torch.equal(j.materialize(), torch.stack(ls, dim=1))
    chunks = b"".join(bytes(b) for b, _ in j.chunks())
    assert chunks == torch.stack(ls, dim=1).numpy().tobytes()
    with pytest.raises(E.ExportError, match="one dtype and shape"):
        TF._join([ls[0], ls[1][:3]], (7, 2, 4))
    with pytest.raises(E.ExportError, match="as shape"):
        TF._join(ls, (7, 3, 5))


def test_short_writes_are_resumed_until_every_byte_is_written(tmp_path, monkeypatch):
    real = os.writev
    calls = []

    def short(fd, bufs):                  # at most 1000 bytes per call, like a full pipe
        calls.append(len(bufs))
        data = b"".join(bytes(b) for b in bufs)[:1000]
        return real(fd, [data])

    monkeypatch.setattr(TF.os, "writev", short)
    d, want = _specforge_dict(20, 64, torch.bfloat16, None, seed=3)
    p = tmp_path / "x.ckpt"
    with open(p, "wb") as f:
        TF._torch_save(d, f)
    assert len(calls) > 5
    assert p.read_bytes() == _torch_bytes(want)


def test_speculators_file_is_read_by_safetensors_exactly(tmp_path, monkeypatch):
    monkeypatch.setattr(TF, "BOUNCE_BYTES", 1000)   # slices of 1 token (and one over it)
    ls = _layers(9, 128, 4, torch.bfloat16, 4)
    ids = torch.arange(100, 109, dtype=torch.int64)
    p = tmp_path / "hs_0.safetensors"
    with open(p, "wb") as f:
        E._write_safetensors(f, [("hidden_states", TF._join(ls, (9, 4, 128))),
                                 ("token_ids", ids)])
    with safe_open(str(p), "pt") as f:
        assert torch.equal(f.get_tensor("hidden_states"), torch.stack(ls, dim=1))
        assert torch.equal(f.get_tensor("token_ids"), ids)


def test_gzip_path_is_torch_save_through_gzip(tmp_path):
    import gzip

    d, want = _specforge_dict(11, 32, torch.bfloat16, {"row": 1})
    b = io.BytesIO()
    E._save_specforge(d, b, gz=True)
    assert gzip.decompress(b.getvalue()) == _torch_bytes(want)
