"""Real shard directories for reader/export tests: Samples built directly, written by the real
ShardWriter (real files, several shards)."""

from __future__ import annotations

import torch

from hscapture.sample import Sample, layer_name
from hscapture.shards import ShardWriter

NUM_LAYERS = 8   # the pretend model's decoder layers: final_norm is recorded as layer 7


def make_sample(i: int, *, T: int | None = None, H: int = 16, aux=(1, 3, 5),
                last_residual: bool = True, final_norm: bool = True, mask: bool = True,
                dtype=torch.bfloat16, tok=torch.int32, rid: str | None = None,
                extra: dict | None = None) -> Sample:
    """Sample ``i``: values encode (sample, layer, token, channel) so any mix-up shows."""
    T = T if T is not None else 3 + (i * 5) % 11
    layers = list(aux) + ([NUM_LAYERS - 1] if last_residual else [])
    kinds = ["residual"] * len(layers)
    if final_norm:
        layers.append(NUM_LAYERS - 1)
        kinds.append("final_norm")
    g = torch.Generator().manual_seed(1000 + i)
    tensors = {}
    for l, k in zip(layers, kinds):
        base = torch.randn(T, H, generator=g)
        tensors[layer_name(l, k)] = (base + (100 if k == "final_norm" else l)).to(dtype)
    fields = {}
    if mask:
        m = (torch.arange(T) % 3 != 0).to(torch.uint8)
        m[0] = 0
        fields["loss_mask"] = m
    return Sample(rid=rid or f"hscap-{i:05d}", producer_id="p", epoch=1, num_tokens=T,
                  token_ids=(torch.arange(T) * 7 + i).to(tok), tensors=tensors,
                  layers=layers, layer_kinds=kinds, dtype=str(dtype).removeprefix("torch."),
                  hidden=H, meta={"model": "toy", "extra": extra or {"row": i}}, fields=fields)


def write_shards(out_dir, samples, *, max_shard_bytes: int = 4096, metadata=None) -> None:
    with ShardWriter(out_dir, max_shard_bytes=max_shard_bytes, fsync=False,
                     metadata=metadata or {"convention": "test-convention"}) as w:
        for s in samples:
            w.add(s)
