"""Compact storage (hscapture/codec.py and its plumbing): ``ShardWriter(compression="zstd"|"fp8")``,
``drain --compress``, and every reader path decoding it; plus the final norm's metadata (no
residual-looking layer id) for new and old shards.

Real ShardWriter, real files, real drain and producer processes; exports are read back with
SpecForge's and speculators' own loaders.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

import hscapture
from hscapture import codec
from hscapture.cli import main
from hscapture.codec import CodecError, CodecUnavailableError
from hscapture.errors import ShardError
from hscapture.export import MANIFEST_NAME, export
from hscapture.reader import ShardDataset, open_shards
from hscapture.sample import Sample
from hscapture.shard_check import verify_dir
from hscapture.shards import ShardWriter, load_sample, read_index
from capture_support import source, start_producer
from shard_support import NUM_LAYERS, make_sample, write_shards

from specforge.data.preprocessing import OfflineEagle3Dataset, list_local_files
from specforge.runtime.data_plane.feature_store import load_feature_file
from speculators.train.data import ArrowDataset

REPO = os.path.dirname(os.path.dirname(os.path.abspath(hscapture.__file__)))
DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.int32, torch.int64]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def write(d, samples, compression=None, **kw) -> None:
    kw.setdefault("max_shard_bytes", 4096)
    with ShardWriter(d, fsync=False, compression=compression,
                     metadata={"convention": "test-convention"}, **kw) as w:
        for s in samples:
            w.add(s)


def random_bits(shape, dtype, seed: int) -> torch.Tensor:
    """A tensor of arbitrary bit patterns (NaNs, infs, subnormals included) of ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    n = 1
    for x in shape:
        n *= x
    size = torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(shape)


def fp8_bound(x: torch.Tensor) -> torch.Tensor:
    """Per element, what fp8 e4m3 with a per-row scale amax/448 may be off by (in float32),
    before and after rounding to x's dtype: e4m3's half-ulp 2^-4 |x| (normal range), half its
    subnormal step 2^-10 * scale, then the dtype's own half-ulp of the result."""
    xf = x.float()
    scale = xf.abs().amax(dim=1, keepdim=True) / 448
    half_ulp = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24}[x.dtype]
    # half the dtype's smallest subnormal step: rounding a tiny result to the dtype
    tiny = {torch.bfloat16: 2.0 ** -134, torch.float16: 2.0 ** -25, torch.float32: 2.0 ** -150}[x.dtype]
    return (2.0 ** -4 * xf.abs() + 2.0 ** -10 * scale) * (1 + 2 * half_ulp) + half_ulp * xf.abs() \
        + tiny


# -- zstd: lossless -------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(DTYPES),
       shape=st.lists(st.integers(0, 40), min_size=1, max_size=3).map(tuple),
       level=st.sampled_from([1, 3, 9]), seed=st.integers(0, 2**31 - 1))
def test_zstd_round_trip_is_bit_exact_for_every_dtype_and_shape_including_empty(dtype, shape,
                                                                                level, seed):
    x = random_bits(shape, dtype, seed)
    comp = codec.resolve("zstd", level)
    [(name, st_dtype, stored_shape, frame)], rec = codec.encode(comp, "layer_1", x, "X")
    assert st_dtype == "U8" and stored_shape == [len(frame)] and rec["codec"] == "zstd"
    rec["dtype"] = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32",
                    torch.int32: "I32", torch.int64: "I64"}[dtype]
    stored = torch.frombuffer(bytearray(frame), dtype=torch.uint8) if frame else \
        torch.empty(0, dtype=torch.uint8)
    got = codec.decode(rec, "layer_1", lambda n: stored, "test")
    assert got.dtype == dtype and tuple(got.shape) == shape
    assert torch.equal(bits(got), bits(x))


def test_byte_shuffling_is_what_makes_bf16_activations_compress():
    x = torch.randn(256, 512, generator=torch.Generator().manual_seed(0)).bfloat16()
    raw = x.reshape(-1).view(torch.uint8).numpy()
    shuffled = codec.shuffle_compress(raw, 2, 3)
    import zstandard

    plain = zstandard.ZstdCompressor(level=3).compress(raw.tobytes())
    assert len(shuffled) < 0.95 * len(plain) and len(shuffled) < 0.75 * raw.size


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
       tokens=st.lists(st.integers(0, 30), min_size=1, max_size=6),
       seed=st.integers(0, 2**31 - 1))
def test_zstd_shards_read_back_bit_exact_through_the_reader_and_load_sample(
        tmp_path_factory, dtype, tokens, seed):
    d = tmp_path_factory.mktemp("zstd")
    samples = []
    for i, T in enumerate(tokens):
        s = make_sample(i, T=T, dtype=dtype, mask=T > 0)
        s.tensors = {k: random_bits((T, 16), dtype, seed + i) for k in s.tensors}
        samples.append(s)
    write(d, samples, "zstd", max_shard_bytes=2000)
    ss = open_shards(d)
    for s in samples:
        got = ss.get(s.rid)
        assert set(got.tensors) == set(s.tensors)
        for k, v in s.tensors.items():
            assert got.tensors[k].dtype == v.dtype and torch.equal(bits(got.tensors[k]), bits(v))
        assert torch.equal(got.token_ids, s.token_ids) and got.token_ids.dtype == s.token_ids.dtype
        assert set(got.fields) == set(s.fields)
        for k, v in s.fields.items():
            assert torch.equal(got.fields[k], v)
        old = load_sample(d, s.rid)
        for k, v in s.tensors.items():
            assert torch.equal(bits(old[k]), bits(v))
    rep = verify_dir(d)
    assert rep["ok"], rep["problems"]


def test_zstd_shards_stay_valid_safetensors_with_the_codec_recorded_per_tensor(tmp_path):
    s = make_sample(0, T=20)
    write(tmp_path, [s], "zstd", compression_level=5)
    path = str(tmp_path / "shard-00000.safetensors")
    with safe_open(path, "pt") as f:                 # a plain safetensors reader opens it
        meta = f.metadata()
        assert meta["codec"] == "zstd"
        assert json.loads(meta["codec_params"])["level"] == 5
        assert json.loads(meta["codec_params"])["lossless"] is True
        rec = json.loads(meta[f"codec:{s.rid}"])
        assert set(rec) == set(s.tensors)                     # hidden states only
        assert rec["layer_1"] == {"codec": "zstd", "dtype": "BF16", "shape": [20, 16],
                                  "shuffle": 2}
        assert f.get_slice(f"{s.rid}/layer_1").get_dtype() == "U8"
        # token ids and fields stay exact and directly readable
        assert torch.equal(f.get_tensor(f"{s.rid}/token_ids"), s.token_ids)
        assert torch.equal(f.get_tensor(f"{s.rid}/field.loss_mask"), s.fields["loss_mask"])
    ent = read_index(tmp_path)[s.rid]
    assert ent["codec"] == "zstd" and ent["nbytes"] == s.nbytes
    assert 0 < ent["stored_nbytes"] < s.nbytes


def test_compressed_samples_flushed_before_a_sigkill_are_recovered_readable(tmp_path):
    code = f"""
import os, signal, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from shard_support import make_sample
from hscapture.shards import ShardWriter
w = ShardWriter({str(tmp_path)!r}, compression=sys.argv[1])
for i in range(6):
    w.add(make_sample(i, T=30))
w.flush()
w.add(make_sample(99, T=30))          # added, never flushed: lost
os.kill(os.getpid(), signal.SIGKILL)
"""
    for comp in ("zstd", "fp8"):
        for f in os.listdir(tmp_path):
            os.unlink(tmp_path / f)
        proc = subprocess.run([sys.executable, "-c", code, comp], capture_output=True)
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        assert any(f.endswith(".journal") for f in os.listdir(tmp_path))
        ShardWriter(tmp_path).close()                      # recovers from the journal
        ss = open_shards(tmp_path)
        assert sorted(ss.rids) == sorted(make_sample(i).rid for i in range(6))
        for i in range(6):
            want, got = make_sample(i, T=30), ss.get(make_sample(i).rid)
            for k, v in want.tensors.items():
                if comp == "zstd":
                    assert torch.equal(got.tensors[k], v)
                else:
                    assert ((got.tensors[k].float() - v.float()).abs() <= fp8_bound(v)).all()
        assert verify_dir(tmp_path)["ok"], verify_dir(tmp_path)["problems"]


def test_header_accounting_stays_exact_with_codec_records(tmp_path):
    w = ShardWriter(tmp_path, compression="zstd", fsync=False)
    for r in ["a", "x/y", 'q"\\\u00e9\u4e2d\x7f', "r" * 100]:
        w.add(make_sample(0, rid=r, T=3))
    sh = w._shard
    body = {f"{e.rid}/{n}": {"dtype": d, "shape": s_, "data_offsets": o}
            for e in sh.entries for n, d, s_, o in e.tensors}
    body.update({f"codec:{e.rid}": json.dumps(e.codecs, separators=(",", ":"),
                                              ensure_ascii=False) for e in sh.entries})
    raw = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    assert sh.tensors_json_len == len(raw) - 2 + 1
    w.close()
    with ShardWriter(tmp_path, compression="fp8", header_reserve=4096, fsync=False) as w:
        for i in range(60):                        # fills the reserve: shards close early
            w.add(make_sample(i, rid=f"rid-{i:04d}", T=1))
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]) > 2
    assert verify_dir(tmp_path)["ok"]


def test_max_shard_bytes_counts_stored_bytes(tmp_path):
    samples = [make_sample(i, T=40) for i in range(30)]
    for s in samples:
        s.tensors = {k: torch.zeros_like(v) for k, v in s.tensors.items()}  # compresses well
    write(tmp_path / "raw", samples, None, max_shard_bytes=20000)
    write(tmp_path / "z", samples, "zstd", max_shard_bytes=20000)
    n = lambda d: len([f for f in os.listdir(d) if f.endswith(".safetensors")])  # noqa: E731
    assert n(tmp_path / "z") < n(tmp_path / "raw") / 3


def test_a_missing_zstandard_is_a_typed_error_naming_the_extra(tmp_path):
    write(tmp_path / "z", [make_sample(0)], "zstd")
    code = f"""
import sys
sys.modules["zstandard"] = None                  # as if the package were not installed
from hscapture.codec import CodecUnavailableError
from hscapture.errors import ShardError
from hscapture.shards import ShardWriter
from hscapture.reader import open_shards
try:
    ShardWriter({str(tmp_path / 'w')!r}, compression="zstd")
except CodecUnavailableError as e:
    assert isinstance(e, ShardError)
    print("WRITE", e)
try:
    open_shards({str(tmp_path / 'z')!r})[0]
except CodecUnavailableError as e:
    print("READ", e)
ShardWriter({str(tmp_path / 'f')!r}, compression="fp8").close()   # fp8 needs no package
print("FP8 OK")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "WRITE" in out.stdout and "READ" in out.stdout and "FP8 OK" in out.stdout
    assert out.stdout.count("pip install 'hscapture[compress]'") == 2
    cli = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['zstandard'] = None; "
         "from hscapture.cli import main; main()", "drain", "-e", "ipc:///nowhere/x.sock",
         "-o", str(tmp_path / "d"), "--compress", "zstd"],
        capture_output=True, text=True, timeout=60)
    assert cli.returncode == 1
    assert "hscapture[compress]" in cli.stderr and "waiting" not in cli.stderr
    assert "Traceback" not in cli.stderr


def test_bad_compression_choices_are_refused_clearly(tmp_path):
    with pytest.raises(ValueError, match="one of"):
        ShardWriter(tmp_path, compression="lz4")
    with pytest.raises(ValueError, match="fp8' takes no level"):
        ShardWriter(tmp_path, compression="fp8", compression_level=3)
    with pytest.raises(ValueError, match="zstd level"):
        ShardWriter(tmp_path, compression="zstd", compression_level=99)
    with pytest.raises(ValueError, match="reserved"):
        ShardWriter(tmp_path, metadata={"codec": "zstd"})
    res = CliRunner().invoke(main, ["drain", "-e", "ipc:///x.sock", "-o", str(tmp_path / "o"),
                                    "--compress-level", "5"])
    assert res.exit_code == 2 and "--compress zstd only" in res.output
    res = CliRunner().invoke(main, ["drain", "-e", "ipc:///x.sock", "-o", str(tmp_path / "o"),
                                    "--compress", "lz4"])
    assert res.exit_code == 2


def test_a_codec_this_version_does_not_know_is_named_by_the_reader_and_inspect(tmp_path):
    s = make_sample(0)
    write(tmp_path, [s], "zstd")
    path = tmp_path / "shard-00000.safetensors"
    rewrite_meta(path, lambda m: m.update({f"codec:{s.rid}": m[f"codec:{s.rid}"].replace(
        '"zstd"', '"lz9"')}))
    with pytest.raises(CodecError, match="codec 'lz9' is not supported"):
        open_shards(tmp_path)[0]
    rep = verify_dir(tmp_path)
    assert not rep["ok"] and any("'lz9'" in p for p in rep["problems"])
    assert open_shards(tmp_path).load(0, names=[]).token_ids.numel() == s.num_tokens


# -- fp8: lossy, bounded --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fp8_stays_within_e4m3s_error_bound_and_returns_the_original_dtype(tmp_path, dtype):
    g = torch.Generator().manual_seed(3)
    T, H = 64, 96
    x = torch.randn(T, H, generator=g) * torch.logspace(-6, 4, T)[:, None]   # 10 decades
    x[5] = 0                                                               # an all-zero row
    x[6, 7] = 300.0                                                        # an outlier
    x[7, :] = torch.randn(H, generator=g) * 1e-3
    x[7, 0] = 1e3                                      # a row of small values beside a big one
    if dtype == torch.float16:
        x = x.clamp(-6e4, 6e4)
    x = x.to(dtype)
    s = make_sample(0, T=T, H=H, dtype=dtype)
    s.tensors = {"layer_1": x, "layer_3": x.flip(0), "layer_5": -x, "layer_7": x * 0.5,
                 "final_norm": x.roll(3, 1)}
    write(tmp_path, [s], "fp8", max_shard_bytes=1 << 30)
    got = open_shards(tmp_path).get(s.rid)
    for k, v in s.tensors.items():
        y = got.tensors[k]
        assert y.dtype == dtype and y.shape == v.shape
        assert torch.isfinite(y).all()
        err = (y.float() - v.float()).abs()
        assert (err <= fp8_bound(v)).all(), (k, (err - fp8_bound(v)).max())
        assert torch.equal(y[(v == 0).all(dim=1)], v[(v == 0).all(dim=1)])  # zero rows exact
        # e4m3's normal range after scaling: |x / scale| >= 2^-6, scale = amax / 448; there
        # the error is relative, within half an ulp (3 mantissa bits: 2^-4), plus the
        # rounding of the result to the dtype
        scale = v.float().abs().amax(1, keepdim=True) / 448
        normal = (v.float().abs() >= 2 ** -6 * scale) & (v.float().abs() > 0) & \
            (v.float().abs() >= 2 ** -14 if dtype == torch.float16 else True)
        assert normal.float().mean() > 0.75          # most elements are checked here
        rel = err[normal] / v.float().abs()[normal]
        assert rel.max() <= 2 ** -4 * (1 + 2 ** -6) + {torch.bfloat16: 2 ** -8,
                                                       torch.float16: 2 ** -11,
                                                       torch.float32: 2 ** -23}[dtype]
    assert torch.equal(got.token_ids, s.token_ids)                     # exact
    assert torch.equal(got.fields["loss_mask"], s.fields["loss_mask"])  # exact
    with safe_open(str(tmp_path / "shard-00000.safetensors"), "pt") as f:
        meta = f.metadata()
        assert meta["codec"] == "fp8" and json.loads(meta["codec_params"])["lossless"] is False
        assert f.get_slice(f"{s.rid}/layer_1").get_dtype() == "F8_E4M3"
        assert f.get_slice(f"{s.rid}/scale.layer_1").get_dtype() == "F32"
        scales = f.get_tensor(f"{s.rid}/scale.layer_1")
        assert torch.isfinite(scales).all() and scales[5] == 0
    ent = read_index(tmp_path)[s.rid]
    assert ent["codec"] == "fp8"
    assert ent["stored_nbytes"] == 5 * T * (H + 4)      # 1 byte per value + a scale per row
    if dtype == torch.bfloat16:
        assert ent["stored_nbytes"] < 0.55 * s.nbytes   # about half of bf16


def test_fp8_stores_a_tensor_holding_inf_or_nan_exactly_and_says_so(tmp_path):
    s = make_sample(0, T=4)
    s.tensors["layer_3"][1, 2] = float("inf")
    s.tensors["layer_5"][0, 0] = float("nan")
    write(tmp_path, [s], "fp8")
    got = open_shards(tmp_path).get(s.rid)
    for k in ("layer_3", "layer_5"):
        assert torch.equal(bits(got.tensors[k]), bits(s.tensors[k]))
    with safe_open(str(tmp_path / "shard-00000.safetensors"), "pt") as f:
        rec = json.loads(f.metadata()[f"codec:{s.rid}"])
    assert "layer_3" not in rec and "layer_5" not in rec and rec["layer_1"]["codec"] == "fp8"
    assert verify_dir(tmp_path)["ok"]


# -- every reader path ----------------------------------------------------------------------


def layer_3(s):
    return s.tensors["layer_3"]


@pytest.mark.parametrize("comp", ["zstd", "fp8"])
def test_every_reader_path_decodes_compressed_shards(tmp_path, comp):
    samples = [make_sample(i) for i in range(12)]
    write(tmp_path / "raw", samples)
    write(tmp_path / "c", samples, comp)
    raw, c = open_shards(tmp_path / "raw"), open_shards(tmp_path / "c")
    assert c.rids == raw.rids
    ds = ShardDataset(tmp_path / "c", transform=layer_3)
    ds2 = pickle.loads(pickle.dumps(ds))                     # what DataLoader workers get
    loader = torch.utils.data.DataLoader(ShardDataset(tmp_path / "c", names=["final_norm"]),
                                         batch_size=None, num_workers=1)
    via_loader = [s.tensors["final_norm"] for s in loader]
    for i, s in enumerate(samples):
        for k, v in s.tensors.items():
            got = [c[i].tensors[k], c.get(s.rid).tensors[k], load_sample(tmp_path / "c", s.rid)[k]]
            if k == "layer_3":
                got += [ds[i], ds2[i]]
            if k == "final_norm":
                got.append(via_loader[i])
            for y in got:
                assert y.dtype == v.dtype and y.shape == v.shape
                if comp == "zstd":
                    assert torch.equal(bits(y), bits(v))
                else:
                    assert ((y.float() - v.float()).abs() <= fp8_bound(v)).all()
        assert torch.equal(c[i].token_ids, s.token_ids)
    assert list(c.load(0, names=["layer_5"]).tensors) == ["layer_5"]
    rep = verify_dir(tmp_path / "c")
    assert rep["ok"], rep["problems"]
    assert rep["logical_bytes"] == verify_dir(tmp_path / "raw")["logical_bytes"]
    assert rep["stored_bytes"] < rep["logical_bytes"]
    assert rep["schemas"][0]["codec"]["name"] == comp


@pytest.mark.parametrize("comp", ["zstd", "fp8"])
def test_inspect_shows_the_codec_and_stored_vs_logical_bytes(tmp_path, comp):
    write(tmp_path, [make_sample(i, T=200) for i in range(4)], comp, max_shard_bytes=1 << 20)
    res = CliRunner().invoke(main, ["inspect", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert f"compression: {comp}" in res.output
    assert ("LOSSY" in res.output) == (comp == "fp8")
    assert "hidden states stored:" in res.output and "of their uncompressed size" in res.output
    rep = json.loads(CliRunner().invoke(main, ["inspect", str(tmp_path), "--json"]).output)
    assert rep["schemas"][0]["codec"]["name"] == comp
    assert rep["stored_bytes"] < rep["logical_bytes"]
    plain = tmp_path / "plain"
    write(plain, [make_sample(0)])
    res = CliRunner().invoke(main, ["inspect", str(plain)])
    assert "compression: none" in res.output and "hidden states stored:" not in res.output


def test_verify_dir_catches_a_damaged_codec_record(tmp_path):
    s = make_sample(0)
    write(tmp_path, [s], "fp8")
    rewrite_meta(tmp_path / "shard-00000.safetensors",
                 lambda m: m.update({f"codec:{s.rid}": m[f"codec:{s.rid}"].replace(
                     '"scale.layer_1"', '"scale.nothing"')}))
    rep = verify_dir(tmp_path)
    assert not rep["ok"] and any("scale.nothing" in p for p in rep["problems"])
    with pytest.raises(ShardError):
        open_shards(tmp_path)[0]


# -- drain --compress -----------------------------------------------------------------------


@pytest.mark.parametrize("comp", ["zstd", "fp8"])
def test_drain_compress_writes_shards_every_reader_decodes(endpoint, tmp_path, comp):
    out = tmp_path / "shards"
    requests = [[f"c{i}", 1 + 53 * i % 300, 64] for i in range(12)]
    hidden, layers = 64, [3, 7]
    drain = subprocess.Popen(
        [sys.executable, "-m", "hscapture", "drain", "-e", endpoint, "-o", str(out), "--quiet",
         "--json", "--connect-timeout", "20", "--samples", "12", "--compress", comp],
        cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    spec = {"endpoint": endpoint, "hidden": hidden, "layers": layers, "requests": requests,
            "threads": 2}
    proc = start_producer(spec, tmp_path)
    try:
        report = json.loads(drain.communicate(timeout=120)[0])
        assert drain.returncode == 0, report
        assert report["samples"] == 12
    finally:
        proc.wait(timeout=30)
    ss = open_shards(out)
    for rid, T, _ in requests:
        tensors, ids = source(rid, T, hidden, len(layers))
        got = ss.get(rid)
        assert torch.equal(got.token_ids.to(torch.int64), ids)
        for L, t in zip(layers, tensors):
            y = got.tensors[f"layer_{L}"]
            if comp == "zstd":
                assert torch.equal(y, t)
            else:
                assert y.dtype == t.dtype and ((y.float() - t.float()).abs() <= fp8_bound(t)).all()
    assert verify_dir(out)["ok"]


# -- exports --------------------------------------------------------------------------------


def tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*"))
            if p.is_file() and p.name != MANIFEST_NAME}


@pytest.mark.parametrize("fmt,gz", [("specforge", False), ("specforge", True),
                                    ("speculators", False)])
def test_exports_of_zstd_shards_are_byte_identical_to_exports_of_uncompressed_ones(
        tmp_path, fmt, gz):
    samples = [make_sample(i) for i in range(9)]
    write(tmp_path / "raw", samples)
    write(tmp_path / "z", samples, "zstd")
    kw = {"gzip": True} if gz else {}
    export(tmp_path / "raw", tmp_path / "out-raw", fmt, progress=False, fsync=False, **kw)
    r = export(tmp_path / "z", tmp_path / "out-z", fmt, progress=False, fsync=False, **kw)
    a, b = tree(tmp_path / "out-raw"), tree(tmp_path / "out-z")
    assert len(a) >= 9 and a.keys() == b.keys()
    for k in a:
        assert a[k] == b[k], k
    m = json.loads((tmp_path / "out-z" / MANIFEST_NAME).read_text())
    assert m["source_compression"] == ["zstd"] and m["values_exact"] is True
    assert "values" not in m["conventions"]
    assert r.written == 9


def test_exports_of_fp8_shards_hold_the_dequantized_values_and_say_so(tmp_path):
    samples = [make_sample(i) for i in range(6)]
    write(tmp_path / "f", samples, "fp8")
    out = tmp_path / "sf"
    res = CliRunner().invoke(main, ["export", "-f", "specforge", str(tmp_path / "f"), str(out),
                                    "--no-fsync", "-q"])
    assert res.exit_code == 0, res.output
    assert "dequantized FP8" in res.output
    m = json.loads((out / MANIFEST_NAME).read_text())
    assert m["source_compression"] == ["fp8"] and m["values_exact"] is False
    assert "dequantized FP8" in m["conventions"]["values"]
    ss = open_shards(tmp_path / "f")
    for i, s in enumerate(samples):
        raw = load_feature_file(str(out / f"rows_0-2000/data_{i}.ckpt"))
        assert torch.equal(raw["hidden_state"][0], ss[i].tensors["final_norm"])
        assert ((raw["hidden_state"][0].float() - s.tensors["final_norm"].float()).abs()
                <= fp8_bound(s.tensors["final_norm"])).all()
        assert torch.equal(raw["input_ids"], s.token_ids.to(torch.int64))
    sp = tmp_path / "sp"
    export(tmp_path / "f", sp, "speculators", progress=False, fsync=False)
    assert json.loads((sp / MANIFEST_NAME).read_text())["values_exact"] is False
    ds = ArrowDataset(max_len=4096, datapath=str(sp), on_missing="raise")
    assert all(isinstance(ds[i], dict) for i in range(len(samples)))


# -- SpecForge .ckpt.gz ---------------------------------------------------------------------


def gzip_save(d: dict, level: int) -> bytes:
    import io

    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", compresslevel=level, fileobj=buf, mtime=0) as z:
        torch.save(d, z)
    return buf.getvalue()


def test_specforge_gzip_export_is_the_same_torch_save_bytes_through_gzip_6_read_by_specforge(
        tmp_path):
    samples = [make_sample(i) for i in range(7)]
    write(tmp_path / "s", samples)
    plain, gz = tmp_path / "plain", tmp_path / "gz"
    export(tmp_path / "s", plain, "specforge", progress=False, fsync=False)
    res = CliRunner().invoke(main, ["export", "-f", "specforge", str(tmp_path / "s"), str(gz),
                                    "--gzip", "--no-fsync", "-q"])
    assert res.exit_code == 0, res.output
    files = list_local_files(str(gz))                          # SpecForge's own listing
    assert len(files) == 7 and all(f.endswith(".ckpt.gz") for f in files)
    for i in range(7):
        data = (gz / f"rows_0-2000/data_{i}.ckpt.gz").read_bytes()
        assert data[:2] == b"\x1f\x8b" and data[8] == 0     # gzip, XFL 0 = level 2..8
        assert data[3] == 0 and data[4:8] == b"\0\0\0\0"     # no file name, mtime 0
        assert gzip.decompress(data) == (plain / f"rows_0-2000/data_{i}.ckpt").read_bytes()
        raw = load_feature_file(files[i])                       # SpecForge's loader
        # torch.save streamed through gzip at level 6 gives these bytes; 1 and 9 do not
        assert [gzip_save(raw, lv) == data for lv in (1, 6, 9)] == [False, True, False]
        s = samples[i]
        assert torch.equal(raw["hidden_state"][0], s.tensors["final_norm"])
        assert torch.equal(raw["input_ids"], s.token_ids.to(torch.int64))
    ds = OfflineEagle3Dataset(files, max_len=2048)
    for k in range(len(ds)):
        assert torch.equal(ds[k]["input_ids"][0], samples[k].token_ids.to(torch.int64))
    m = json.loads((gz / MANIFEST_NAME).read_text())
    assert m["plan"]["gzip"] is True and ".ckpt.gz" in m["files"]
    r = export(tmp_path / "s", gz, "specforge", gzip=True, progress=False, fsync=False)
    assert (r.skipped, r.written) == (7, 0)                    # a rerun resumes: all complete
    with pytest.raises(Exception, match="another export"):
        export(tmp_path / "s", gz, "specforge", progress=False)
    with pytest.raises(Exception, match="gzip applies to SpecForge"):
        export(tmp_path / "s", tmp_path / "x", "speculators", gzip=True, progress=False)


# -- the final norm's layer id --------------------------------------------------------------


def rewrite_meta(path: Path, change) -> None:
    """Rewrite a shard's ``__metadata__`` in place (same header length, space-padded), as an
    older writer (or a damaged file) would have it."""
    raw = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    change(header["__metadata__"])
    body = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    assert len(body) <= n
    raw[8:8 + n] = body + b" " * (n - len(body))
    path.write_bytes(bytes(raw))


def make_old(d: Path) -> None:
    """Turn every shard in ``d`` into what writers before final_norm_after_layer wrote: the
    final norm listed with the id of the layer it follows, no num_layers key."""
    for p in d.glob("shard-*.safetensors"):
        def old(m: dict) -> None:
            kinds = json.loads(m["layer_kinds"])
            after = m.pop("final_norm_after_layer", None)
            m.pop("num_layers", None)
            layers = json.loads(m["layers"])
            m["layers"] = json.dumps([int(after) if k == "final_norm" else l
                                      for l, k in zip(layers, kinds)], separators=(",", ":"))
        rewrite_meta(p, old)


def test_new_shards_record_the_final_norm_without_a_residual_looking_id(tmp_path):
    write(tmp_path, [make_sample(i) for i in range(3)])
    with safe_open(str(tmp_path / "shard-00000.safetensors"), "pt") as f:
        meta = f.metadata()
    assert json.loads(meta["layers"]) == [1, 3, 5, 7, None]
    assert json.loads(meta["layer_kinds"])[-1] == "final_norm"
    assert meta["final_norm_after_layer"] == str(NUM_LAYERS - 1)
    assert meta["num_layers"] == str(NUM_LAYERS)
    sch = verify_dir(tmp_path)["schemas"][0]
    assert sch["layers"] == [1, 3, 5, 7, None] and sch["num_layers"] == NUM_LAYERS
    res = CliRunner().invoke(main, ["inspect", str(tmp_path)])
    assert "final_norm (after the final norm, applied to layer_7's output)" in res.output
    assert f"decoder layers: {NUM_LAYERS}" in res.output
    assert "layer_7 (residual)" in res.output


def test_old_shards_with_the_final_norms_id_read_the_same_way(tmp_path):
    samples = [make_sample(i) for i in range(5)]
    write(tmp_path / "new", samples)
    write(tmp_path / "old", samples)
    make_old(tmp_path / "old")
    with safe_open(str(next((tmp_path / "old").glob("shard-*"))), "pt") as f:
        assert json.loads(f.metadata()["layers"]) == [1, 3, 5, 7, 7]   # the old ambiguity
        assert "num_layers" not in f.metadata()
    new, old = verify_dir(tmp_path / "new"), verify_dir(tmp_path / "old")
    assert old["ok"], old["problems"]
    for key in ("layers", "final_norm_after_layer", "num_layers", "layer_names"):
        assert old["schemas"][0][key] == new["schemas"][0][key], key
    a = CliRunner().invoke(main, ["inspect", str(tmp_path / "new")]).output
    b = CliRunner().invoke(main, ["inspect", str(tmp_path / "old")]).output
    assert a.replace(str(tmp_path / "new"), "D") == b.replace(str(tmp_path / "old"), "D")
    # the export infers the layer count from either (speculators needs it)
    for d in ("new", "old"):
        r = export(tmp_path / d, tmp_path / f"sp-{d}", "speculators", progress=False, fsync=False)
        assert r.manifest["layers"]["num_layers"] == NUM_LAYERS
        assert r.manifest["layers"]["target"]["speculators_id"] == NUM_LAYERS
    assert tree(tmp_path / "sp-new") == tree(tmp_path / "sp-old")


def test_the_export_takes_the_layer_count_from_the_shards_num_layers_key(tmp_path):
    write(tmp_path, [make_sample(i) for i in range(3)])
    for p in tmp_path.glob("shard-*.safetensors"):
        rewrite_meta(p, lambda m: m.update(num_layers="12"))    # says 12, the index says 8
    with pytest.raises(Exception, match="residual layer 11"):
        export(tmp_path, tmp_path / "sp", "speculators", progress=False)


def test_fp8_dequantization_table_gives_torchs_own_float8_values_for_every_code():
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).reshape(2, 128)
    scale = torch.tensor([1.0, 0.5])
    want = codes.float() * scale[:, None]
    got = codec.fp8_dequantize(codes, scale, torch.float32)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())
