"""Sample.detach: a borrowed sample's tensors become owned, writable copies of exactly the
same bytes, dtypes and shapes (made by numpy on the calling thread, not torch's thread pool),
and the ring space is released once."""

from __future__ import annotations

import warnings

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hscapture.sample import Sample

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.int64, torch.int32,
          torch.uint8, torch.bool]


def _readonly(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes as a tensor over read-only memory, like a view of the ring."""
    ro = np.frombuffer(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes(),
                       dtype=np.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(ro).view(t.dtype).reshape(t.shape)


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(DTYPES), rows=st.integers(0, 40), width=st.integers(1, 33),
       seed=st.integers(0, 2**16))
def test_detach_gives_owned_writable_copies_of_exactly_the_borrowed_bytes(dtype, rows, width,
                                                                          seed):
    g = torch.Generator().manual_seed(seed)
    src = (torch.randn(rows, width, generator=g) * 50).to(dtype)
    ids = torch.arange(rows, dtype=torch.int32)
    mask = (torch.arange(rows) % 2).to(torch.uint8)
    released = []
    s = Sample(rid="r", producer_id="p", epoch=1, num_tokens=rows, token_ids=_readonly(ids),
               tensors={"layer_1": _readonly(src)}, layers=[1], layer_kinds=["residual"],
               dtype=str(dtype).removeprefix("torch."), hidden=width,
               fields={"loss_mask": _readonly(mask)}, borrowed=True,
               _release=lambda: released.append(1))
    s.detach()
    assert released == [1] and not s.borrowed
    got = s.tensors["layer_1"]
    assert got.dtype == dtype and got.shape == src.shape and torch.equal(got, src)
    assert torch.equal(s.token_ids, ids) and torch.equal(s.fields["loss_mask"], mask)
    for t in (got, s.token_ids, s.fields["loss_mask"]):
        if t.numel():
            t.view(-1)[0] = t.view(-1)[0]       # writable: owned memory, not the ring's
    s.release()
    assert released == [1]                      # released once
