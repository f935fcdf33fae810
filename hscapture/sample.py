"""A captured sample: the hidden states of one request, exactly as the producer published them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

__all__ = ["Sample", "layer_name"]


def layer_name(layer: int, kind: str) -> str:
    """The tensor name of one captured layer inside a sample and a shard.

    ``residual`` tensors (output of decoder layer ``L``, pre-norm, HF ``hidden_states[L+1]``)
    are named ``layer_{L}``; ``final_norm`` (post final norm of the last layer, HF
    ``hidden_states[-1]``) is named ``final_norm``; any other kind is ``{kind}_{L}``.
    """
    if kind == "residual":
        return f"layer_{layer}"
    if kind == "final_norm":
        return "final_norm"
    return f"{kind}_{layer}"


@dataclass
class Sample:
    """One request's captured hidden states.

    Guarantees: ``tensors[name]`` has shape ``[num_tokens, hidden]`` for every layer,
    ``token_ids`` has shape ``[num_tokens]`` and covers positions ``0..num_tokens-1`` exactly
    once; every chunk it was assembled from agreed with its notice and its ring record on rid,
    epoch, sequence number, byte length and token count.

    By default a sample owns its tensors (they were copied out of the ring) and
    :meth:`release` is a no-op. A *borrowed* sample (``Subscriber(zero_copy=True)``) holds
    read-only views into the shared-memory ring instead: use it inside ``with sample:`` (or
    ``with sample.view() as tensors:``) or call :meth:`release`; on release the ring space is
    given back and every tensor the sample handed out becomes EMPTY (``numel() == 0``), so a
    use after release sees no bytes rather than stale or overwritten ones. (Views sliced from
    those tensors by the user are the user's to drop before release.) Closing the subscriber
    releases every borrowed sample it handed out that is still held (emptied, not
    acknowledged: a durable subscription gets it again). :meth:`detach` turns a borrowed
    sample into an owned one.
    """

    rid: str
    producer_id: str
    epoch: int
    num_tokens: int
    token_ids: torch.Tensor
    tensors: dict[str, torch.Tensor]
    layers: list[int]
    layer_kinds: list[str]
    dtype: str
    hidden: int
    meta: dict[str, Any] = field(default_factory=dict)
    #: per-token side fields (e.g. ``loss_mask``): name -> uint8 tensor of shape ``[num_tokens]``;
    #: stored as ``"{rid}/field.{name}"`` in shards and handed to every reader and export.
    fields: dict[str, torch.Tensor] = field(default_factory=dict)
    _release: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    borrowed: bool = field(default=False, compare=False)

    @property
    def extra(self) -> dict[str, Any]:
        """Small per-sample metadata from the producer (``meta["extra"]``): ``attempt``, and
        ``meta`` when the client attached one (``custom_params.hscapture_meta``); ``{}`` if
        none. The same map :attr:`hscapture.reader.StoredSample.extra` returns after a drain."""
        ex = self.meta.get("extra") if isinstance(self.meta, dict) else None
        return ex if isinstance(ex, dict) else {}

    @property
    def nbytes(self) -> int:
        """Bytes of hidden-state payload (token ids excluded)."""
        return self.num_tokens * self.hidden * len(self.tensors) * \
            next(iter(self.tensors.values())).element_size() if self.tensors else 0

    def release(self) -> None:
        """Give the ring space back; a borrowed sample's tensors become empty."""
        if self.borrowed:
            for t in (*self.tensors.values(), self.token_ids, *self.fields.values()):
                t.set_()          # no longer a view of the ring: an empty tensor
            self.borrowed = False
        if self._release is not None:
            release, self._release = self._release, None
            release()

    def __enter__(self) -> "Sample":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def view(self) -> "_Borrow":
        """``with sample.view() as tensors:`` the tensors, valid inside the block only."""
        return _Borrow(self)

    @property
    def released(self) -> bool:
        return self._release is None

    def detach(self) -> "Sample":
        """Copy every tensor into process memory and release the ring space."""
        if self.borrowed:
            self.tensors = {k: _owned(v) for k, v in self.tensors.items()}
            self.token_ids = _owned(self.token_ids)
            self.fields = {k: _owned(v) for k, v in self.fields.items()}
            self.borrowed = False
        self.release()
        return self


class _Borrow:
    def __init__(self, sample: Sample) -> None:
        self.sample = sample

    def __enter__(self) -> dict[str, torch.Tensor]:
        return self.sample.tensors

    def __exit__(self, *exc: object) -> None:
        self.sample.release()


def _owned(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` in process memory, made by numpy on this thread (bytes, any dtype).

    Not ``t.clone()``: torch runs a copy of megabytes on its intra-op thread pool, and on a
    host whose cores are busy (a trainer's process, a server beside it) the pool's barrier
    waits for descheduled threads. On the 2-core CPU machine with both cores busy, an 8 MB
    bf16 clone took p90 8.0 ms against 0.67 ms for this copy; idle, 2.95 vs 0.62 ms
    (``hscapture._sample_tensors.copy_view`` has the same reason)."""
    if not t.is_contiguous() or t.numel() == 0:
        return t.clone()
    flat = t.reshape(-1).view(torch.uint8).numpy()
    return torch.from_numpy(np.array(flat, copy=True)).view(t.dtype).reshape(t.shape)
