"""hscapture._files, the exports' native writer: writev_rows gathers token rows of K layer-major
buffers straight into the file (no bounce copy). It writes exactly the interleaving (any K, row
width, first row, row count), refuses sources too small before it writes a byte, reports a
failed write with what was written; writev_rows_crc32 also returns the CRC-32 of what it wrote;
crc32 equals zlib.crc32 in every implementation this CPU has (tables, 128-bit and AVX-512
carry-less folds), at every length, alignment and starting value; and both exports write the
same bytes through the native writer as through the bounce path."""

from __future__ import annotations

import errno
import os
import zipfile
import zlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from hscapture import _files
from hscapture import _tensor_files as TF
from hscapture import export as E


def _write(path, sources, row_bytes, first, rows) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        return _files.writev_rows(fd, sources, row_bytes, first, rows)
    finally:
        os.close(fd)


@settings(max_examples=60, deadline=None)
@given(k=st.integers(1, 6), total=st.integers(0, 700), row_bytes=st.integers(1, 97),
       data=st.data())
def test_writev_rows_writes_exactly_the_row_interleaving(tmp_path_factory, k, total,
                                                         row_bytes, data):
    # 700 rows x 6 sources is past IOV_MAX (1,024 iovecs): several writev calls
    first = data.draw(st.integers(0, total))
    rows = data.draw(st.integers(0, total - first))
    rng = np.random.default_rng(total * 131 + row_bytes)
    srcs = [rng.integers(0, 256, (total, row_bytes), dtype=np.uint8) for _ in range(k)]
    path = tmp_path_factory.mktemp("rows") / "out.bin"
    n = _write(path, [s.reshape(-1) for s in srcs], row_bytes, first, rows)
    want = np.stack([s[first:first + rows] for s in srcs], axis=1).tobytes()
    assert n == len(want)
    assert path.read_bytes() == want


IMPLS = [i for i in ("table", "pclmul", "vpclmul")
         if i == "table" or _files.CRC32_IMPL in (i, "vpclmul")]


@settings(max_examples=200, deadline=None)
@given(data=st.binary(min_size=0, max_size=3000), skip=st.integers(0, 15),
       value=st.integers(0, 2**32 - 1), impl=st.sampled_from(IMPLS + ["auto"]))
def test_crc32_equals_zlibs_at_every_length_alignment_and_start(data, skip, value, impl):
    # lengths around the 16/64/256-byte steps of the folds, unaligned starts, continued CRCs
    view = memoryview(data)[min(skip, len(data)):]
    assert _files.crc32(view, value, impl) == zlib.crc32(view, value)


def test_crc32_of_megabytes_equals_zlibs_in_each_implementation():
    b = np.random.default_rng(5).integers(0, 256, (3 << 20) + 77, dtype=np.uint8)
    want = zlib.crc32(b)
    for impl in IMPLS:
        assert _files.crc32(b, 0, impl) == want, impl
    head = _files.crc32(b[:1 << 20])
    assert _files.crc32(b[1 << 20:], head) == want         # continued across calls


def test_crc32_refuses_an_implementation_this_cpu_lacks_by_name():
    with pytest.raises(ValueError, match=r"'sse9' is unknown or not supported by this CPU"):
        _files.crc32(b"abc", 0, "sse9")


@settings(max_examples=40, deadline=None)
@given(k=st.integers(1, 5), total=st.integers(0, 500), row_bytes=st.integers(1, 300),
       start=st.integers(0, 2**32 - 1), helper=st.booleans(), data=st.data())
def test_writev_rows_crc32_returns_the_crc_of_exactly_what_it_wrote(tmp_path_factory, k, total,
                                                                   row_bytes, start, helper,
                                                                   data):
    # helper: the CRC taken by the helper thread beside the write (from 0 bytes), else inline
    first = data.draw(st.integers(0, total))
    rows = data.draw(st.integers(0, total - first))
    rng = np.random.default_rng(total * 7 + row_bytes)
    srcs = [rng.integers(0, 256, (total, row_bytes), dtype=np.uint8) for _ in range(k)]
    path = tmp_path_factory.mktemp("crc") / "out.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        n, crc = _files.writev_rows_crc32(fd, [s.reshape(-1) for s in srcs], row_bytes, first,
                                          rows, start, 0 if helper else 2**62)
    finally:
        os.close(fd)
    got = path.read_bytes()
    assert got == np.stack([s[first:first + rows] for s in srcs], axis=1).tobytes()
    assert n == len(got) and crc == zlib.crc32(got, start)


def test_a_crc_past_the_helper_threads_threshold_is_the_crc_of_what_was_written(tmp_path):
    # the default threshold, crossed by rows of several sources past IOV_MAX iovecs and past
    # the inline path's ~1 MiB batches; the same bytes and CRC as the inline path
    k, rows, row_bytes = 3, 1500, 1000
    assert k * rows * row_bytes > _files.CRC_THREAD_MIN
    rng = np.random.default_rng(11)
    srcs = [rng.integers(0, 256, rows * row_bytes, dtype=np.uint8) for _ in range(k)]
    want = np.stack([s.reshape(rows, row_bytes) for s in srcs], axis=1).tobytes()
    for name, at in (("helper", _files.CRC_THREAD_MIN), ("inline", 2**62)):
        path = tmp_path / f"{name}.bin"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            n, crc = _files.writev_rows_crc32(fd, srcs, row_bytes, 0, rows, 7, at)
        finally:
            os.close(fd)
        assert path.read_bytes() == want and n == len(want), name
        assert crc == zlib.crc32(want, 7), name


def test_a_failed_write_with_the_crc_helper_running_raises_and_returns_cleanly(tmp_path):
    # the helper is joined on the error path too (the buffers it reads are released after)
    fd = os.open(tmp_path / "ro.bin", os.O_RDONLY | os.O_CREAT, 0o644)
    big = np.zeros(4 << 20, dtype=np.uint8)
    try:
        with pytest.raises(OSError) as e:
            _files.writev_rows_crc32(fd, [big], 1 << 12, 0, 1 << 10, 0, 0)
        assert e.value.errno == errno.EBADF
    finally:
        os.close(fd)
    del big


def test_the_specforge_file_is_the_same_through_the_native_writer_and_the_bounce_path(
        tmp_path, monkeypatch):
    g = torch.Generator().manual_seed(4)
    T, H = 1100, 512       # past the writer's ~1 MiB CRC batches; hidden_state past 1 MiB
    d = {"input_ids": torch.arange(T, dtype=torch.int64),
         "loss_mask": torch.ones(T, dtype=torch.int64),
         "hidden_state": torch.randn(1, T, H, generator=g).bfloat16(),
         "aux_hidden_state": TF._join([torch.randn(T, H, generator=g).bfloat16()
                                       for _ in range(3)], (1, T, 3 * H))}
    called = []
    real = TF._write_rows
    monkeypatch.setattr(TF, "_write_rows",
                        lambda *a: (called.append((len(a[1]), a[2])), real(*a))[1])
    native = tmp_path / "native.ckpt"
    with open(native, "wb") as f:
        TF._torch_save(d, f)
    # hidden_state (one source), then aux_hidden_state (three), each with its CRC; the small
    # id and mask records stay with the sink
    assert called == [(1, True), (3, True)], "the native writer (with its CRC) was not used"
    monkeypatch.setattr(TF, "_files", None)
    bounce = tmp_path / "bounce.ckpt"
    with open(bounce, "wb") as f:
        TF._torch_save(d, f)
    assert native.read_bytes() == bounce.read_bytes()
    with zipfile.ZipFile(native) as z:
        assert z.testzip() is None                  # every record's CRC-32 checks
    got = torch.load(native, mmap=True, weights_only=True)
    assert torch.equal(got["aux_hidden_state"], d["aux_hidden_state"].materialize())


def test_a_source_too_small_is_refused_before_anything_is_written(tmp_path):
    a, b = bytearray(64), bytearray(63)
    path = tmp_path / "out.bin"
    with pytest.raises(ValueError, match=r"source 1 holds 63 bytes, expected at least 64"):
        _write(path, [a, b], 16, 0, 4)
    assert path.read_bytes() == b""


def test_a_failed_write_raises_oserror_saying_how_much_was_written(tmp_path):
    path = tmp_path / "ro.bin"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(OSError, match=r"after 0 of 32 bytes") as got:
            _files.writev_rows(fd, [bytearray(16), bytearray(16)], 8, 0, 2)
        assert got.value.errno == errno.EBADF      # the errno travels (ENOSPC: a full disk)
    finally:
        os.close(fd)


def test_the_speculators_file_is_the_same_through_the_native_writer_and_the_bounce_path(
        tmp_path, monkeypatch):
    g = torch.Generator().manual_seed(3)
    layers = [torch.randn(300, 96, generator=g).bfloat16() for _ in range(4)]
    items = [("token_ids", torch.arange(300, dtype=torch.int64)),
             ("hidden_states", TF._join(layers, (300, 4, 96)))]
    called = []
    real = TF._write_rows
    monkeypatch.setattr(TF, "_write_rows", lambda *a: (called.append(1), real(*a))[1])
    native = tmp_path / "native.safetensors"
    E._write_atomic(str(native), lambda f: E._write_safetensors(f, items), False)
    assert called, "the native writer was not used"
    monkeypatch.setattr(TF, "_files", None)
    bounce = tmp_path / "bounce.safetensors"
    E._write_atomic(str(bounce), lambda f: E._write_safetensors(f, items), False)
    assert native.read_bytes() == bounce.read_bytes()
    with safe_open(str(native), "pt") as f:
        assert torch.equal(f.get_tensor("hidden_states"), torch.stack(layers, dim=1))
