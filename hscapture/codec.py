"""Compact storage codecs for shards: lossless byte-shuffled zstd and lossy FP8 e4m3.

Off by default. A :class:`~hscapture.shards.ShardWriter` (``compression="zstd"`` or ``"fp8"``)
encodes each sample's **hidden-state tensors** (never token ids or per-token fields, which stay
exact and directly readable) and records, per sample and per tensor, how each one was stored
(the ``codec:{rid}`` key of the shard's ``__metadata__``, see the format in
:mod:`hscapture.shards`). Every reader (:mod:`hscapture.reader`, ``load_sample``, the exports)
decodes through :func:`decode`, so a reader never guesses.

``zstd`` (lossless)
    The tensor's bytes are split into ``itemsize`` byte planes (plane ``b`` holds byte ``b`` of
    every element; this is what lets bf16 activations compress: their high bytes are
    repetitive, their low bytes are noise) and the planes are compressed as one zstd frame
    (python package ``zstandard``, the ``compress`` extra). Stored as a 1-D ``U8`` tensor.
    Decoding returns the original bytes exactly.
``fp8`` (lossy)
    Each token row ``x`` (``[hidden]``) gets one float32 scale ``s = amax(|x|) / 448`` (0 for an
    all-zero row) and is stored as ``float8_e4m3fn(x / s)`` (``F8_E4M3 [T, H]``) plus the scales
    (``F32 [T]``, tensor ``scale.{name}``). Decoding returns ``q * s`` in the original dtype.
    Per element, ``|decoded - x| <= 2**-4 * |x| + 2**-10 * s`` before the final rounding to
    the original dtype (e4m3's half-ulp; the second term covers e4m3's subnormal range). A
    tensor holding inf or NaN cannot be scaled and is stored uncompressed (exact), recorded as
    such.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from .errors import MissingExtraError, ShardError

__all__ = ["CODECS", "DEFAULT_ZSTD_LEVEL", "FP8_MAX", "Compression", "CodecError",
           "CodecUnavailableError", "resolve", "encode", "decode", "shuffle_compress",
           "shuffle_decompress", "fp8_quantize", "fp8_dequantize", "SCALE_PREFIX",
           "LOSSY", "describe"]

#: codec names a writer accepts (``None`` = no compression)
CODECS = ("zstd", "fp8")
#: lossy codecs (a reader's values differ from what was captured)
LOSSY = frozenset({"fp8"})
#: zstd level 1: on byte-shuffled bf16 activations it compressed as well as level 3 or better
#: and wrote about 1.4x faster (benchmarks/bench_compact.py, random-weight Llama, CPU)
DEFAULT_ZSTD_LEVEL = 1
#: the largest finite float8_e4m3fn value
FP8_MAX = 448.0
#: tensor-name prefix of the per-token fp8 scales of a layer (``scale.{layer name}``)
SCALE_PREFIX = "scale."

_ST_TORCH = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32,
             "F64": torch.float64, "I8": torch.int8, "U8": torch.uint8, "I16": torch.int16,
             "I32": torch.int32, "I64": torch.int64, "BOOL": torch.bool}
_FLOATS = {"BF16", "F16", "F32"}


class CodecError(ShardError):
    """A compressed tensor cannot be written or read (unknown codec, damaged payload)."""


class CodecUnavailableError(CodecError, MissingExtraError):
    """The codec's package is not installed (``pip install 'hscapture[compress]'``)."""


def _zstd() -> Any:
    try:
        import zstandard
    except ImportError as e:
        raise CodecUnavailableError(
            f"compression 'zstd' needs the python package zstandard, which is not installed "
            f"({e}); install hscapture's 'compress' extra: pip install 'hscapture[compress]' "
            f"(or pip install zstandard)") from None
    return zstandard


@dataclass(frozen=True)
class Compression:
    """A writer's compression choice: ``name`` in :data:`CODECS`, zstd ``level``."""

    name: str
    level: int | None = None

    @property
    def lossy(self) -> bool:
        return self.name in LOSSY

    def params(self) -> dict[str, Any]:
        """What the shard's ``codec_params`` metadata records."""
        if self.name == "zstd":
            return {"level": self.level, "shuffle": "byte planes", "lossless": True,
                    "applies_to": "hidden-state tensors"}
        return {"format": "float8_e4m3fn", "scale": "float32 per token row = amax/448",
                "lossless": False, "applies_to": "hidden-state tensors",
                "error_bound": "|x' - x| <= 2^-4 |x| + 2^-10 scale (before rounding to dtype)"}

    def shard_metadata(self) -> dict[str, str]:
        return {"codec": self.name,
                "codec_params": json.dumps(self.params(), separators=(",", ":"))}


def resolve(compression: str | Compression | None, level: int | None = None
            ) -> Compression | None:
    """Validate a compression choice (``None``, ``"zstd"``, ``"fp8"``); for zstd, check that
    the package imports (raises :class:`CodecUnavailableError` naming the extra) and that
    ``level`` is a zstd level (default :data:`DEFAULT_ZSTD_LEVEL`)."""
    if isinstance(compression, Compression):
        compression, level = compression.name, compression.level if level is None else level
    if compression is None or compression == "none":
        if level is not None:
            raise ValueError(f"compression_level {level} given without a compression")
        return None
    if compression not in CODECS:
        raise ValueError(f"compression must be None or one of {CODECS}, got {compression!r}")
    if compression == "fp8":
        if level is not None:
            raise ValueError("compression 'fp8' takes no level")
        return Compression("fp8")
    zstd = _zstd()
    lv = DEFAULT_ZSTD_LEVEL if level is None else int(level)
    lo, hi = -(1 << 17), zstd.MAX_COMPRESSION_LEVEL
    if not lo <= lv <= hi or lv == 0:
        raise ValueError(f"zstd level must be in {lo}..{hi} and not 0, got {level!r}")
    return Compression("zstd", lv)


def _bytes(t: torch.Tensor) -> np.ndarray:
    t = t.contiguous().reshape(-1)
    return t.view(torch.uint8).numpy() if t.numel() else np.empty(0, np.uint8)


def shuffle_compress(data: np.ndarray, itemsize: int, level: int) -> bytes:
    """Byte planes of ``data`` (uint8, a multiple of ``itemsize`` long) as one zstd frame."""
    if itemsize > 1 and data.size:
        data = np.ascontiguousarray(data.reshape(-1, itemsize).T)
    return _zstd().ZstdCompressor(level=level, write_content_size=True).compress(data)


def shuffle_decompress(frame: bytes | memoryview | np.ndarray, itemsize: int, nbytes: int
                       ) -> np.ndarray:
    """Inverse of :func:`shuffle_compress`: the original ``nbytes`` bytes (uint8 array)."""
    zstd = _zstd()
    try:
        raw = zstd.ZstdDecompressor().decompress(frame, max_output_size=max(nbytes, 1))
    except zstd.ZstdError as e:
        raise CodecError(f"zstd payload does not decompress: {e}") from None
    if len(raw) != nbytes:
        raise CodecError(f"zstd payload decompresses to {len(raw)} bytes, expected {nbytes}")
    out = np.frombuffer(raw, np.uint8)
    if itemsize > 1 and nbytes:
        out = np.ascontiguousarray(out.reshape(itemsize, -1).T).reshape(-1)
    return out


def fp8_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(q float8_e4m3fn [T, H], scale float32 [T])`` of a 2-D float tensor, or None when it
    holds inf/NaN (it cannot be scaled; store it as is)."""
    # abs and max are exact in the source dtype: no float32 copy is needed for the scales
    amax = x.abs().amax(dim=1).float() if x.shape[1] else torch.zeros(x.shape[0])
    if not bool(torch.isfinite(amax).all()):
        return None
    scale = amax / FP8_MAX
    div = torch.where(scale > 0, scale, torch.ones_like(scale))
    # one float32 temporary; |x / s| <= 448 up to rounding, which the clamp absorbs
    q = torch.div(x, div[:, None]).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


_FP8_LUT: np.ndarray | None = None


def fp8_dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``q * scale`` per row, in ``dtype`` (float8 → float32 through a 256-entry table: the
    same values as ``q.float()``, about 2x faster on CPU)."""
    global _FP8_LUT
    if _FP8_LUT is None:
        _FP8_LUT = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    vals = torch.from_numpy(_FP8_LUT[q.contiguous().view(torch.uint8).numpy()])
    return vals.mul_(scale.float()[:, None]).to(dtype)


def encode(comp: Compression, name: str, t: torch.Tensor, st_dtype: str
           ) -> tuple[list[tuple[str, str, list[int], torch.Tensor | bytes]], dict[str, Any]] | None:
    """Encode hidden-state tensor ``name`` (``[T, H]``, safetensors dtype ``st_dtype``).

    Returns ``([(stored name, stored safetensors dtype, stored shape, data), ...], entry)``
    (``data`` a CPU tensor or bytes) where ``entry`` is the per-tensor record of the
    ``codec:{rid}`` metadata, or None when the tensor is stored as is.
    """
    shape = [int(d) for d in t.shape]
    if comp.name == "zstd":
        frame = shuffle_compress(_bytes(t), t.element_size(), int(comp.level or DEFAULT_ZSTD_LEVEL))
        return [(name, "U8", [len(frame)], frame)], {"codec": "zstd", "dtype": st_dtype, "shape": shape,
                                   "shuffle": t.element_size()}
    if comp.name == "fp8":
        if st_dtype not in _FLOATS or t.dim() != 2:
            return None
        qs = fp8_quantize(t)
        if qs is None:
            return None
        q, scale = qs
        sname = SCALE_PREFIX + name
        return [(name, "F8_E4M3", shape, q), (sname, "F32", shape[:1], scale)], {"codec": "fp8", "dtype": st_dtype, "shape": shape,
                                             "scale": sname}
    raise CodecError(f"unknown compression {comp.name!r}")


def decode(entry: Any, stored_name: str, get: Callable[[str], torch.Tensor], where: str
           ) -> torch.Tensor:
    """The logical tensor of one encoded tensor: ``entry`` is its ``codec:{rid}`` record,
    ``get(stored name)`` reads a stored tensor of the same sample. ``where`` names it in
    errors. Raises :class:`CodecError` for an unknown codec or a damaged payload."""
    if not isinstance(entry, dict):
        raise CodecError(f"{where}: codec record {entry!r} is not an object")
    codec = entry.get("codec")
    try:
        dtype = _ST_TORCH[entry["dtype"]]
        shape = [int(d) for d in entry["shape"]]
    except (KeyError, TypeError, ValueError):
        raise CodecError(f"{where}: codec record {entry!r} lacks a known dtype/shape") from None
    n = 1
    for d in shape:
        n *= d
    if codec == "zstd":
        payload = get(stored_name)
        if payload.dtype != torch.uint8 or payload.dim() != 1:
            raise CodecError(f"{where}: zstd payload is {payload.dtype} {list(payload.shape)}, "
                             f"expected uint8 [n]")
        itemsize = torch.empty(0, dtype=dtype).element_size()
        if int(entry.get("shuffle", itemsize)) != itemsize:
            raise CodecError(f"{where}: shuffle {entry.get('shuffle')} != element size {itemsize}")
        try:
            raw = shuffle_decompress(payload.numpy(), itemsize, n * itemsize)
        except CodecError as e:   # the same type (e.g. CodecUnavailableError), placed
            raise type(e)(f"{where}: {e}") from None
        out = torch.from_numpy(raw) if raw.size else torch.empty(0, dtype=torch.uint8)
        return out.view(dtype).reshape(shape)
    if codec == "fp8":
        q = get(stored_name)
        scale = get(str(entry.get("scale", SCALE_PREFIX + stored_name)))
        if q.dtype != torch.float8_e4m3fn or list(q.shape) != shape or len(shape) != 2 \
                or scale.dtype != torch.float32 or list(scale.shape) != shape[:1]:
            raise CodecError(f"{where}: fp8 payload {q.dtype} {list(q.shape)} with scales "
                             f"{scale.dtype} {list(scale.shape)} does not match {shape}")
        return fp8_dequantize(q, scale, dtype)
    raise CodecError(f"{where}: codec {codec!r} is not supported by this version of hscapture "
                     f"(known: {CODECS})")


def describe(meta: dict[str, str]) -> dict[str, Any]:
    """``{"name", "lossless", "params"}`` of a shard's ``__metadata__`` (name ``"none"``
    when it is not compressed)."""
    name = meta.get("codec") or "none"
    try:
        params = json.loads(meta.get("codec_params") or "{}")
    except ValueError:
        params = {}
    return {"name": name, "lossless": name not in LOSSY, "params": params}
