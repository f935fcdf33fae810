"""Shared by the export fault tests (full disk, real signals): shards of large samples, and
checks that what an export left is exact, through the trainers' own loaders."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from shard_support import make_sample, write_shards

from specforge.data.preprocessing import list_local_files
from specforge.runtime.data_plane.feature_store import load_feature_file
from speculators.train.data import ArrowDataset

T, H = 512, 1024          # 1 MiB a layer: the final layer goes by the native CRC writer too
AUX = (1, 3, 5)


def big_shards(d: Path, n: int) -> list:
    """``n`` samples of ~``T`` tokens x ``H`` written as shards into ``d``; returns them."""
    samples = [make_sample(i, T=T + i, H=H) for i in range(n)]
    write_shards(d, samples, max_shard_bytes=64 << 20)
    return samples


def aux_of(s) -> torch.Tensor:
    return torch.cat([s.tensors[f"layer_{l}"] for l in AUX], dim=-1)


def final_files(out: Path, fmt: str) -> list[Path]:
    """The sample files under their final names (what a trainer would read)."""
    if fmt == "specforge":
        return [Path(f) for f in list_local_files(str(out))] if out.exists() else []
    return sorted((out / "hidden_states").glob("hs_*.safetensors"))


def every_final_file_exact(out: Path, fmt: str, samples) -> int:
    """Each final-named sample file reads back exactly (a partial one would not); returns
    how many there are."""
    files = final_files(out, fmt)
    for f in files:
        if fmt == "specforge":
            s = samples[int(f.name[len("data_"):-len(".ckpt")])]
            raw = load_feature_file(str(f))
            assert torch.equal(raw["input_ids"], s.token_ids.to(torch.int64)), f
            assert torch.equal(raw["hidden_state"][0], s.tensors["final_norm"]), f
            assert torch.equal(raw["aux_hidden_state"][0], aux_of(s)), f
        else:
            s = samples[int(f.stem[len("hs_"):])]
            got = load_file(str(f))
            assert torch.equal(got["token_ids"], s.token_ids.to(torch.int64)), f
            assert torch.equal(got["hidden_states"][:, :len(AUX)].reshape(len(s.token_ids), -1),
                               aux_of(s)), f
    return len(files)


def export_exact(out: Path, fmt: str, samples) -> None:
    """The finished export holds every sample, exact, through the trainer's own loader."""
    assert every_final_file_exact(out, fmt, samples) == len(samples)
    assert not [q for q in out.rglob("*") if q.name.endswith(".hscapture-tmp")]
    if fmt == "speculators":
        ds = ArrowDataset(max_len=8192, datapath=str(out), on_missing="raise")
        assert len(ds) == len(samples)
        for i, s in enumerate(samples):
            item = ds[i]
            assert isinstance(item, dict), item     # a token-id mismatch comes back unavailable
            assert torch.equal(item["input_ids"], s.token_ids.to(torch.int64))
            assert torch.equal(item["hidden_states"], aux_of(s))
    assert '"status": "complete"' in (out / "hscapture_export.json").read_text()
