"""A delivered sample's tensors, made from the ring's bytes: borrowed views of a record,
owned copies (made natively for a whole entry, or by numpy on this thread), and a chunked
sample's chunks end to end; with the per-schema facts (:class:`Shape`) every row of an
entry shares. What becomes a sample, and when, is :mod:`hscapture._delivery`'s.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from . import notice as nt
from . import record as rec
from .sample import layer_name

__all__ = ["Shape", "concat", "copy_view", "field_tensors", "from_dlpack", "joined",
           "row_tensors", "sample_meta", "torch_view", "TORCH_DTYPES"]

TORCH_DTYPES = {name: getattr(torch, name) for name in nt.DTYPES}
#: the torch dtype ``torch.from_numpy`` gives a view of ``record.NUMPY_DTYPES[name]``: where it
#: is not the sample's dtype (bf16, fp8 travel as raw ints), the tensor is reinterpreted
_FROM_NUMPY = {name: torch.from_numpy(np.zeros(1, dt)).dtype
               for name, dt in rec.NUMPY_DTYPES.items()}

#: a tensor that owns a DLPack capsule's memory (record.Entry.row_capsules). For a capsule
#: ``torch.from_dlpack`` only calls ``torch._C._from_dlpack`` after a ``hasattr`` test; calling
#: it directly saves ~0.9 us a sample (two tensors each) on the subscriber's hot path
#: (benchmarks/bench_delivery.py); the public function where a torch build lacks it
from_dlpack = getattr(torch._C, "_from_dlpack", torch.from_dlpack)


class Shape:
    """What every row of the entries of one ``schema`` (layers, kinds, dtype, hidden) shares:
    made once per schema (``Delivery._shape``), not per entry or row."""

    __slots__ = ("schema", "layers", "kinds", "dtype", "hidden", "names", "torch_dtype",
                 "reinterpret", "token_bytes")

    def __init__(self, schema: tuple) -> None:
        self.schema = schema
        self.layers, self.kinds, self.dtype, self.hidden = schema
        #: the tensor names, in layer order
        self.names = tuple(layer_name(l, k) for l, k in zip(self.layers, self.kinds))
        self.torch_dtype = TORCH_DTYPES[self.dtype]
        #: a tensor over a numpy array of the ring's dtype needs a .view(torch_dtype)
        self.reinterpret = _FROM_NUMPY[self.dtype] != self.torch_dtype
        #: hidden-state payload bytes per token (a sample's nbytes per token)
        self.token_bytes = self.hidden * len(self.names) * nt.DTYPES[self.dtype]


def sample_meta(common: tuple[Any, Any, Any], cached_prefix: int, extra: dict[str, Any],
                seq: int) -> dict[str, Any]:
    """``Sample.meta`` of a sample that came in one row (``seq``); ``common``: the entry's
    ``(convention, model, dp_rank)``."""
    return {"convention": common[0], "model": common[1], "cached_prefix": cached_prefix,
            "dp_rank": common[2], "extra": extra, "chunks": 1, "seqs": [seq]}


def field_tensors(fields: dict[str, bytes]) -> dict[str, torch.Tensor]:
    """A row's per-token fields as owned uint8 tensors."""
    return {k: torch.frombuffer(bytearray(v), dtype=torch.uint8) for k, v in
            fields.items()} if fields else {}


def row_tensors(shape: Shape, views: tuple[Any, ...] | None, r0: int, end: int, borrow: bool,
                caps: list[Any] | None, slot: int | None
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(token_ids, tensors by name)`` of a sample that came in one row: tokens ``[r0,
    end)`` of ``views`` (``(ids, layers, ...)``: the token ids and one array per layer,
    ``[tokens, hidden]``). ``borrow``: views of the record (the caller keeps it referenced);
    else the owned copies ``caps[slot:]`` when ``slot`` is given (made natively for the whole
    entry; ``views`` may then be None), else copies of ``views`` made here."""
    dtype = shape.torch_dtype
    if slot is None:
        ids, layers = views[0], views[1]
    if borrow:
        return (torch_view(ids[r0:end], None),
                {n: torch_view(a[r0:end], dtype) for n, a in zip(shape.names, layers)})
    if slot is not None:
        # owned copies made natively for the whole entry: each capsule already holds the
        # sample's dtype (bf16 too), so one tensor creation each
        if len(shape.names) == 1:
            return from_dlpack(caps[slot]), {shape.names[0]: from_dlpack(caps[slot + 1])}
        return from_dlpack(caps[slot]), {n: from_dlpack(caps[slot + 1 + i])
                                         for i, n in enumerate(shape.names)}
    # owned, writable copies (copy_view's, inline): torch.from_numpy has nothing to warn about
    tensors = {}
    for n, a in zip(shape.names, layers):
        t = torch.from_numpy(a[r0:end].copy())
        tensors[n] = t.view(dtype) if shape.reinterpret else t
    return torch.from_numpy(ids[r0:end].copy()), tensors


def joined(chunks: list[Any], schema: tuple
           ) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``(token_ids, tensors by name, fields)`` of a sample assembled from ``chunks``
    (:class:`~hscapture._assembly.Chunk`, in token order, each holding copies): each layer's
    chunks end to end; a field only where every chunk has it."""
    layers, kinds, dtype, _hidden = schema
    tdtype = TORCH_DTYPES[dtype]
    tensors = {layer_name(l, k): torch_view(concat([c.tensors[i] for c in chunks]), tdtype)
               for i, (l, k) in enumerate(zip(layers, kinds))}
    ids = torch.from_numpy(np.concatenate([c.token_ids for c in chunks]))
    fields = {}
    for name in chunks[0].fields:
        if all(name in c.fields for c in chunks):
            fields[name] = torch.frombuffer(bytearray(b"".join(c.fields[name]
                                                               for c in chunks)),
                                            dtype=torch.uint8)
    return ids, tensors, fields


def copy_view(arr: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``arr`` (a view of the ring), made by numpy on this thread.

    Not ``torch.clone`` / ``torch.cat``: torch runs copies of this size on its intra-op
    OpenMP pool, and next to a busy server (every core taken) a parallel copy waits at the
    pool's barrier for descheduled threads, spinning: a 6 MB copy that takes 0.2 ms alone
    took up to 270 ms wall (90 ms CPU) on a loaded 2-core host, while the same copy on one
    thread stayed under 6 ms. A subscriber shares its host with the engine, so it copies on
    one thread (memory bandwidth, not threads, bounds a copy). ``ndarray.copy()`` (C order
    by default) rather than ``np.array(arr, order="C", copy=True)``: the same copy, without
    the argument parsing that cost a third of a one-token row's."""
    return arr.copy()


def concat(arrs: list[np.ndarray]) -> np.ndarray:
    """The chunks of one layer end to end, by numpy on this thread (see :func:`copy_view`)."""
    return np.concatenate(arrs) if len(arrs) > 1 else arrs[0]


def torch_view(arr: np.ndarray, dtype: torch.dtype | None) -> torch.Tensor:
    """A torch tensor over a (read-only) numpy view of the ring, reinterpreted as ``dtype``.
    torch warns that it cannot protect read-only memory; that is the documented contract of
    a borrowed sample (the mapping itself is read-only), so the warning is silenced, for
    this call only, as long as torch would issue it at all (see :func:`_numpy_warning_gone`:
    torch warns once per process, and a ``catch_warnings`` per view cost more than the rest
    of a 1-token sample's delivery)."""
    if _numpy_warning_gone():
        t = torch.from_numpy(arr)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            t = torch.from_numpy(arr)
    return t.view(dtype) if dtype is not None and t.dtype != dtype else t


_WARNING_GONE: list[bool] = []


def _numpy_warning_gone() -> bool:
    """True once ``torch.from_numpy`` of a read-only array can no longer warn in this
    process. Probed once, on a read-only array of our own, with the warning swallowed: if a
    second call stays silent, torch has used up its warn-once and every later call is silent
    too; if torch warns every time, this stays False and each call silences its own."""
    if not _WARNING_GONE:
        probe = np.frombuffer(bytes(8), dtype=np.uint8)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.from_numpy(probe)
            first = len(seen)
            torch.from_numpy(probe)
            _WARNING_GONE.append(len(seen) == first)
    return _WARNING_GONE[0]
