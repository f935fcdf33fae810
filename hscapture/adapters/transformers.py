"""Capture from a plain PyTorch / transformers causal LM through forward hooks.

For offline extraction and for testing the capture path on real models. The hooks only keep a
reference to each chosen decoder layer's output during the forward pass; after the pass, each
sequence of the batch is published through the producer (optionally in chunks), exactly as an
inference-engine adapter would.

Layer convention (``convention`` = :data:`CONVENTION`): layer ``L`` of kind ``residual`` is the
output of decoder layer ``L`` (0-based), i.e. transformers' ``hidden_states[L + 1]``, before
the final norm; ``final_norm`` is the model's final norm applied to the last layer's output,
i.e. ``hidden_states[-1]``.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch

from ..errors import CaptureConfigError
from ..producer import Producer, Row, field_values

__all__ = ["HiddenStateCapture", "CONVENTION", "decoder_layers"]

CONVENTION = "hf: residual L = output of decoder layer L = hidden_states[L+1], pre-norm; " \
             "final_norm = final norm of the last layer = hidden_states[-1]"


def decoder_layers(model: torch.nn.Module) -> tuple[Sequence[torch.nn.Module], torch.nn.Module]:
    """The decoder layer list and the final norm of a transformers causal LM."""
    base = getattr(model, "model", None) or getattr(model, "transformer", None) or model
    layers = getattr(base, "layers", None) or getattr(base, "h", None)
    norm = getattr(base, "norm", None) or getattr(base, "ln_f", None) \
        or getattr(base, "final_layernorm", None)
    if layers is None or norm is None:
        raise CaptureConfigError(
            f"{type(model).__name__}: expected decoder layers at .model.layers or "
            f".transformer.h and a final norm at .norm/.ln_f; found layers={layers is not None}, "
            f"norm={norm is not None}")
    return layers, norm


class HiddenStateCapture:
    """Publishes chosen layers of every sequence of a forward pass through a Producer.

    ``layers`` are 0-based decoder layer indices (kind ``residual``); ``final_norm=True`` adds
    the post-norm last layer (kind ``final_norm``). Only forward passes run inside
    :meth:`request` are captured: any other forward (warm-up, evaluation) produces nothing.
    """

    def __init__(self, model: torch.nn.Module, producer: Producer, layers: Sequence[int],
                 *, final_norm: bool = True) -> None:
        self.model, self.producer = model, producer
        blocks, norm = decoder_layers(model)
        n = len(blocks)
        self.layers = [int(x) for x in layers]
        bad = [x for x in self.layers if not 0 <= x < n]
        if bad:
            raise CaptureConfigError(f"layers {bad}: expected indices in [0, {n})")
        self.kinds = ["residual"] * len(self.layers) + (["final_norm"] if final_norm else [])
        self.layer_ids = self.layers + ([n - 1] if final_norm else [])
        self._outputs: dict[int | str, torch.Tensor] = {}
        self._active = False
        self._handles = [blocks[i].register_forward_hook(self._hook(i)) for i in set(self.layers)]
        if final_norm:
            self._handles.append(norm.register_forward_hook(self._hook("norm")))

    def _hook(self, key: int | str) -> Any:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            if self._active:
                self._outputs[key] = output[0] if isinstance(output, tuple) else output
        return hook

    @contextmanager
    def request(self, rids: Sequence[str | None], input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None, *,
                chunk_size: int | None = None,
                fields: Sequence[Mapping[str, Any] | None] | None = None,
                extra: Sequence[Mapping[str, Any] | None] | None = None) -> Iterator[None]:
        """Capture the forward pass run inside the block, one sample per non-None rid.

        ``input_ids`` is ``[B, S]``; sequences may be right- or left-padded as described by
        ``attention_mask``. ``chunk_size`` publishes each sequence in chunks of that many
        tokens (as chunked prefill would). A rid of None is not captured.

        Row positions and token ids are read on the host when the block is entered (before
        the forward pass is queued), so nothing here waits for the GPU afterwards; pass host
        tensors to avoid even that one device-to-host read.

        ``fields`` (optional, one entry per row, None for none) are per-token side fields of
        each sample, e.g. ``{"loss_mask": [0, 0, 1, 1]}``: one uint8 value per real token of
        the row (padding excluded); each chunk carries its slice. A length that does not match
        the row's token count raises :class:`CaptureConfigError` before anything is captured.
        ``extra`` (optional, one entry per row, None for none): small per-sample metadata every
        chunk of that row carries (the sample's ``meta["extra"]``, e.g. ``{"meta": {...}}``
        as the SGLang hook attaches it).
        """
        if len(rids) != input_ids.shape[0]:
            raise CaptureConfigError(f"expected {input_ids.shape[0]} rids, found {len(rids)}")
        if fields is not None and len(fields) != len(rids):
            raise CaptureConfigError(f"fields: expected one entry per row ({len(rids)}), "
                                     f"found {len(fields)}")
        if extra is not None and len(extra) != len(rids):
            raise CaptureConfigError(f"extra: expected one entry per row ({len(rids)}), "
                                     f"found {len(extra)}")
        ids_host = input_ids.detach().to("cpu")
        mask_host = None if attention_mask is None else attention_mask.detach().to("cpu")
        rows = [self._row_index(b, ids_host.shape[1], mask_host) for b in range(len(rids))]
        row_fields = [_row_fields(rids[b], fields[b] if fields is not None else None,
                                  ids_host[b, rows[b]].numel()) for b in range(len(rids))]
        self._outputs.clear()
        self._active = True
        try:
            yield
        finally:
            self._active = False
        outputs, self._outputs = self._outputs, {}
        keys = self.layers + (["norm"] if "final_norm" in self.kinds else [])
        missing = [k for k in keys if k not in outputs]
        if missing:
            raise CaptureConfigError(f"no forward pass inside request() produced layers {missing}")
        live = [b for b, rid in enumerate(rids) if rid is not None and _tokens(rows[b]) > 0]
        # Rows whose real tokens are one span of their batch row (right or left padding):
        # one ring entry per chunk index for all of them (one reservation, one encode, one
        # copy submission a forward, as an engine adapter does), read straight from the
        # layer outputs. A batch holds a rid once: with two rows of one rid, each row goes
        # alone, as do rows with holes in their mask (gathered on the device first).
        spans = [b for b in live if isinstance(rows[b], slice)]
        if len({rids[b] for b in spans}) != len(spans):
            spans = []
        if spans:
            self._capture_spans(spans, rids, rows, outputs, keys, ids_host, row_fields, extra,
                                chunk_size)
        in_spans = set(spans)
        for b in live:
            if b in in_spans:
                continue
            rid = rids[b]
            index = rows[b]
            ids = ids_host[b, index]
            if isinstance(index, torch.Tensor):   # holes in the mask: gather on the device
                dev_index = index.to(outputs[keys[0]].device, non_blocking=True)
                states = [outputs[k][b].index_select(0, dev_index) for k in keys]
            else:
                states = [outputs[k][b, index] for k in keys]
            total = ids.numel()
            step = chunk_size or total
            for start in range(0, total, step):
                end = min(total, start + step)
                self.producer.capture(
                    rid, [s[start:end] for s in states], layers=self.layer_ids,
                    layer_kinds=self.kinds, token_start=start, is_last_chunk=end == total,
                    token_ids=ids[start:end],
                    fields={k: v[start:end] for k, v in row_fields[b].items()} or None,
                    extra=extra[b] if extra is not None else None)

    def _capture_spans(self, spans: list[int], rids: Sequence[str | None],
                       rows: list[slice | torch.Tensor], outputs: dict[int | str, torch.Tensor],
                       keys: list[int | str], ids_host: torch.Tensor,
                       row_fields: list[dict[str, np.ndarray]],
                       extra: Sequence[Mapping[str, Any] | None] | None,
                       chunk_size: int | None) -> None:
        """Capture batch rows ``spans`` (each a slice of its row) as one entry per chunk
        index: chunk ``k`` of every row long enough, from the layer outputs viewed as
        ``[B * S, H]`` blocks (no copy for contiguous outputs) and the host token ids."""
        first = outputs[keys[0]]
        if first.dim() != 3:
            raise CaptureConfigError(f"layer outputs: expected [batch, tokens, hidden], found "
                                     f"{tuple(first.shape)}")
        width = first.shape[1]
        blocks = [outputs[k].reshape(first.shape[0] * width, -1) for k in keys]
        flat_ids = ids_host.reshape(-1)
        bounds = [(b, rows[b].start, rows[b].stop - rows[b].start) for b in spans]
        longest = max(total for _, _, total in bounds)
        for start in range(0, longest, chunk_size or longest):
            batch = []
            for b, lo, total in bounds:
                if start >= total:
                    continue
                end = min(total, start + (chunk_size or longest))
                fields = {k: v[start:end].tobytes() for k, v in row_fields[b].items()}
                batch.append(Row(rids[b], b * width + lo + start, end - start, start,
                                 end == total, 0, extra[b] if extra is not None else None,
                                 fields or None))
            self.producer.capture_batch(batch, blocks, layers=self.layer_ids,
                                        layer_kinds=self.kinds, token_ids=flat_ids)

    @staticmethod
    def _row_index(b: int, width: int, mask: torch.Tensor | None) -> slice | torch.Tensor:
        """Positions of row ``b``'s real tokens: a slice for right/left padding, else indices."""
        if mask is None:
            return slice(0, width)
        pos = mask[b].nonzero().flatten()
        if pos.numel() == 0:
            return slice(0, 0)
        first, last = int(pos[0]), int(pos[-1])
        if last - first + 1 == pos.numel():
            return slice(first, last + 1)
        return pos

    def close(self) -> None:
        """Remove the hooks."""
        for h in self._handles:
            h.remove()
        self._handles.clear()


def _tokens(index: slice | torch.Tensor) -> int:
    """How many real tokens a row index (:meth:`HiddenStateCapture._row_index`) selects."""
    return index.stop - index.start if isinstance(index, slice) else int(index.numel())


def _row_fields(rid: str | None, fields: Mapping[str, Any] | None, count: int
                ) -> dict[str, np.ndarray]:
    """One row's per-token fields as flat uint8 arrays of ``count`` values each."""
    out: dict[str, np.ndarray] = {}
    for name, value in (fields or {}).items():
        arr = field_values(name, value, count)
        if arr.shape[0] != count:
            raise CaptureConfigError(f"field {name!r} of rid {rid!r}: expected one value per "
                                     f"token ({count}), found {arr.shape[0]}")
        out[name] = arr
    return out
