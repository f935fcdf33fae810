"""Export a shard directory to the on-disk layout an EAGLE-3 trainer reads.

Two targets, each written exactly as its loader reads it (read from specforge 0.2.0 and
speculators 0.9.0; see docs/training.md):

``specforge``
    ``rows_{g}-{g+2000}/data_{i}.ckpt`` for sample position ``i`` (``g = 2000 * (i // 2000)``):
    a zip-format ``torch.save`` dict that ``OfflineEagle3Dataset`` / ``load_feature_file``
    load with ``mmap=True``: ``input_ids`` int64 ``[L]``, ``loss_mask`` int64 ``[L]``,
    ``hidden_state`` ``[1, L, H]`` = the final layer **after** the final norm (hscapture kind
    ``final_norm``), ``aux_hidden_state`` ``[1, L, K*H]`` = the aux layers concatenated in
    ascending layer order, in the captured dtype. With ``gzip=True`` the files are
    ``data_{i}.ckpt.gz``: the same ``torch.save`` bytes through gzip level 6 (what SpecForge's
    loaders ``gzip.open`` and ``torch.load`` for a ``.gz`` name).
``speculators``
    An Arrow dataset (``datasets``' ``save_to_disk``, torch format) with ``input_ids`` int64,
    ``loss_mask`` int64 and ``seq_len`` per row, ``token_freq.pt`` (token id -> count over
    loss-masked tokens, what ``speculators prepare-data`` writes for vocab mappings), and
    ``hidden_states/hs_{i}.safetensors`` for row ``i``: ``token_ids`` int64 ``[L]`` (equal to
    row ``i``'s ``input_ids``) and ``hidden_states`` ``[L, K+1, H]`` = aux layers ascending,
    last slot = the final decoder layer's output **before** the final norm (hscapture residual
    layer ``N-1``), which speculators normalizes itself.

Per-sample metadata (the sample's ``extra["meta"]``: a dataset row id, a split; see
``hscapture.sglang.config.check_meta``) travels inside each format, where the trainer's own
loader ignores it (read from specforge 0.2.0 and speculators 0.9.0: both read their inputs by
name, never by listing them): SpecForge: key ``hscapture_meta`` (a plain dict) of
``data_{i}.ckpt``, only in the files of samples that carry one; speculators: column
``hscapture_meta`` of the Arrow dataset (row ``i``: the meta as compact JSON text, null for a
sample without one), only when some sample carries one. The manifest counts them (``meta``).

Layer ids. hscapture names residual layer ``L`` = output of decoder layer ``L`` (0-based,
pre-norm, HF ``hidden_states[L+1]``). SGLang/SpecForge id ``j`` = output of decoder layer
``j`` (the same number); vLLM/speculators id ``j`` = output of decoder layer ``j-1`` (0 = the
embeddings), so hscapture layer ``L`` is speculators id ``L+1``. ``layers`` arguments are
hscapture ids; the manifest records both, and the convention, in every export.

Guarantees:

* A SpecForge ``.ckpt`` is byte for byte what ``torch.save`` writes for its dict (written by
  this module's own zip writer straight from the memory-mapped shards: no assembled aux
  tensor, its rows gathered by the kernel and its CRC-32 taken in the same native call, the GIL
  released; tests/test_export_torchzip.py and tests/test_files_native.py compare with
  torch.save); ``.ckpt.gz`` is torch.save itself through gzip.
* Every file is written under a temporary name and renamed into place once complete (and
  fsync'd unless ``fsync=False``); ``hscapture_export.json`` (the manifest) says
  ``"status": "complete"`` only after every file is in place.
* Resumable: a rerun with the same arguments on the same shard directory skips files that are
  complete and correct (checked: keys, shapes, dtypes and token ids), rewrites partial or
  wrong ones, and appends samples added to the shard directory since (the old sample order
  must be a prefix of the new one; anything else is refused unless ``overwrite=True``).
* ``loss_mask``: a sample's stored ``loss_mask`` field is always used when present. A sample
  without one makes the export fail (``loss_mask="require"``, the default) or gets an all-ones
  mask (``loss_mask="all"``); the manifest counts which samples got which.
* Refuses, before writing anything, when the captured layers cannot produce what the target
  needs (e.g. speculators needs the pre-norm final layer, SpecForge the post-norm one),
  saying what is missing and how to capture it.
* Compressed shards are read through :mod:`hscapture.reader`, which decodes them: an export of
  zstd shards is byte-identical to the export of the same samples stored uncompressed; an
  export of fp8 shards holds the dequantized values in the captured dtype, and its manifest
  says so (``source_compression``, ``conventions.values``).
"""

from __future__ import annotations

import gzip as _gzip
import io
import importlib.util
import json
import os
import shutil
import struct
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import torch

from ._tensor_files import _join, _Joined, _materialized, _Sink, _torch_save, _write_tensor
from .errors import ExportError, ExportWriteError, HSCaptureError, MissingExtraError
from .reader import ShardSet, StoredSample
from .sample import layer_name

__all__ = ["export", "ExportResult", "ExportError", "ExportWriteError", "FORMATS", "MANIFEST_NAME",
           "SPECFORGE_GROUP", "META_KEY"]

FORMATS = ("specforge", "speculators")
MANIFEST_NAME = "hscapture_export.json"
MANIFEST_VERSION = 1
SPECFORGE_GROUP = 2000
_TMP = ".hscapture-tmp"
_DATASET_FILES = ("data-00000-of-00001.arrow", "dataset_info.json", "state.json")

CONVENTIONS = {
    "hscapture": "residual L = output of decoder layer L (0-based), pre-norm, HF "
                 "hidden_states[L+1]; final_norm = final norm applied to the last layer's output",
    "specforge": "SGLang: aux id j = output of decoder layer j (= hscapture layer j); "
                 "hidden_state = last layer after the final norm",
    "speculators": "vLLM: id j = output of decoder layer j-1, 0 = embeddings (= hscapture layer "
                   "j-1); hidden_states[:, -1] = id num_layers = last layer before the final norm",
}


@dataclass
class ExportResult:
    """What :func:`export` did. ``written + skipped == samples``."""

    format: str
    out_dir: str
    samples: int
    written: int
    skipped: int
    rewritten: int          # partial or wrong files found and written again
    tokens: int
    bytes_written: int
    seconds: float
    loss_mask: dict[str, Any]
    manifest: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def gb_per_s(self) -> float:
        return self.bytes_written / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("manifest")
        d["gb_per_s"] = self.gb_per_s
        return d


@dataclass
class _Plan:
    fmt: str
    aux: list[int]              # hscapture residual layer ids, ascending
    aux_names: list[str]
    target_name: str            # "final_norm" or "layer_{N-1}"
    num_layers: int | None
    hidden: int
    dtype: str
    loss_mask_mode: str
    rids: list[str]
    no_mask: list[int]          # positions without a stored loss_mask
    gzip: bool = False          # SpecForge data_{i}.ckpt.gz
    crc32: bool = True          # SpecForge .ckpt zip records carry their CRC-32 (else 0)
    with_meta: int = 0          # samples carrying per-sample metadata (extra["meta"])
    #: each sample's capture, aligned with rids: "producer:epoch:values" (values "fp8" when
    #: its shard stores it as FP8, else "exact"): the same rid of another capture or with
    #: other values is another sample, never "already exported"
    origins: list[str] = field(default_factory=list)

    def names(self) -> list[str]:
        return self.aux_names + [self.target_name]

    def key(self) -> dict[str, Any]:
        k = {"format": self.fmt, "aux_layers": self.aux, "target": self.target_name,
             "hidden": self.hidden, "dtype": self.dtype, "loss_mask_mode": self.loss_mask_mode}
        if self.gzip:   # only when set: manifests written before the option still resume
            k["gzip"] = True
        if not self.crc32:
            k["zip_crc32"] = False
        return k


# -- planning -------------------------------------------------------------------------------


def _num_layers(ss: ShardSet, given: int | None) -> int | None:
    """The model's decoder layer count: what the shards record (their ``num_layers``
    metadata; shards written before that key: one more than the final norm's recorded id),
    else a sample's ``meta.extra.num_hidden_layers``, else ``given``. A ``given`` count the
    shards contradict is refused: it would name another layer the model's last (until
    2026-12-05 it was taken as it came, and a speculators export shipped an intermediate
    layer as the final pre-norm one without a word)."""
    from .shard_format import shard_num_layers

    recorded = _recorded_num_layers(ss, shard_num_layers)
    if given is not None and recorded is not None and int(given) != recorded:
        raise ExportError(f"num_layers (--num-layers) {given} contradicts the shards: they "
                          f"record {recorded} decoder layers (the final norm follows layer "
                          f"{recorded - 1}); leave it out: it is for shards that do not "
                          f"record the count")
    return recorded if given is None else int(given)


def _recorded_num_layers(ss: ShardSet, shard_num_layers: Any) -> int | None:
    """What the shards and samples record of the decoder layer count (None: nothing)."""
    found: set[int] = set()
    per_shard: dict[str, int | None] = {}
    for i in range(len(ss)):
        e = ss.entry(i)
        sh = e["shard"]
        if sh not in per_shard:
            per_shard[sh] = shard_num_layers(ss.shard_metadata(sh))
        if per_shard[sh] is not None:
            found.add(int(per_shard[sh]))   # type: ignore[arg-type]
        ex = (e.get("meta") or {}).get("extra") if isinstance(e.get("meta"), dict) else None
        if isinstance(ex, dict) and isinstance(ex.get("num_hidden_layers"), int):
            found.add(int(ex["num_hidden_layers"]))
    if len(found) > 1:
        raise ExportError(f"samples disagree on the model's number of decoder layers: "
                          f"{sorted(found)}; pass num_layers (--num-layers)")
    return found.pop() if found else None


def _check_one_model(ss: ShardSet) -> None:
    """Refuse samples the shards record as captured from different models (shards that do
    not record one are not counted). Until 2026-12-05 such a directory exported without a
    word: only the manifest's ``model`` list showed it (fault hunt 4)."""
    per_shard: dict[str, str] = {}
    models: dict[str, list[Any]] = {}
    for i in range(len(ss)):
        sh = ss.entry(i)["shard"]
        if sh not in per_shard:
            per_shard[sh] = str(ss.shard_metadata(sh).get("model") or "")
        m = per_shard[sh]
        if m:
            got = models.setdefault(m, [0, ss.rids[i]])
            got[0] += 1
    if len(models) > 1:
        said = "; ".join(f"{m!r}: {n} sample(s), e.g. {rid!r}"
                         for m, (n, rid) in sorted(models.items()))
        raise ExportError(f"{ss.directory} holds samples of {len(models)} models ({said}): a "
                          f"trainer would take them as one verifier's; export each model's "
                          f"samples from a directory of their own, or pass mixed_models=True "
                          f"(--allow-mixed-models) if these are the same weights under two "
                          f"names")


def _make_plan(ss: ShardSet, fmt: str, layers: Sequence[int] | None, loss_mask: str,
               num_layers: int | None, gzip: bool = False, crc32: bool = True) -> _Plan:
    if fmt not in FORMATS:
        raise ExportError(f"format must be one of {FORMATS}, got {fmt!r}")
    if gzip and fmt != "specforge":
        raise ExportError(f"gzip applies to SpecForge's .ckpt files only; {fmt} reads "
                          f"uncompressed safetensors")
    if not crc32 and (fmt != "specforge" or gzip):
        raise ExportError(
            "crc32=False (--no-crc) applies to SpecForge's .ckpt zip files only; "
            + ("the .ckpt.gz files carry gzip's own CRC and go through torch.save" if gzip
               else f"{fmt} writes safetensors, which have no CRC"))
    if loss_mask not in ("require", "all"):
        raise ExportError(f"loss_mask must be 'require' or 'all', got {loss_mask!r}")
    n = len(ss)
    if n == 0:
        raise ExportError(f"{ss.directory} holds no samples")
    hiddens, dtypes = set(), set()
    common: set[tuple[int, str]] | None = None
    no_mask: list[int] = []
    incomplete: list[str] = []
    origins: list[str] = []
    with_meta = 0
    for i in range(n):
        e = ss.entry(i)
        origins.append(f"{e.get('producer_id', '')}:{e.get('epoch', '')}:"
                       f"{'fp8' if e.get('codec') == 'fp8' else 'exact'}")
        hiddens.add(int(e.get("hidden", 0)))
        dtypes.add(str(e.get("dtype", "")))
        have = {(int(l), str(k)) for l, k in zip(e.get("layers", []), e.get("layer_kinds", []))}
        common = have if common is None else common & have
        fields = e.get("fields")
        if fields is None:  # index line from before fields existed
            fields = ss.load(i, names=[]).fields
        if "loss_mask" not in fields:
            no_mask.append(i)
        if e.get("complete") is False:
            incomplete.append(e["rid"])
        ex = (e.get("meta") or {}).get("extra") if isinstance(e.get("meta"), dict) else None
        if isinstance(ex, dict) and isinstance(ex.get("meta"), dict) and ex["meta"]:
            with_meta += 1
    if incomplete:
        raise ExportError(f"{len(incomplete)} sample(s) are marked incomplete (e.g. "
                          f"{incomplete[:3]}); a trainer must not see them")
    if len(hiddens) != 1 or len(dtypes) != 1:
        raise ExportError(f"samples differ in hidden size {sorted(hiddens)} or dtype "
                          f"{sorted(dtypes)}; a trainer needs one of each (export the parts "
                          f"separately)")
    assert common is not None
    N = _num_layers(ss, num_layers)
    residual = sorted(l for l, k in common if k == "residual")
    has_final_norm = any(k == "final_norm" for _, k in common)
    where = f"{ss.directory}: every sample has residual layers {residual}" + \
        (" and final_norm" if has_final_norm else " and no final_norm")

    if fmt == "specforge":
        if not has_final_norm:
            raise ExportError(
                f"SpecForge's hidden_state is the last layer AFTER the final norm (hscapture "
                f"kind final_norm), which is not captured in every sample ({where}). Capture it "
                f"with the SGLang hook's default HSCAPTURE_FINAL_NORM=1 (or final_norm=True in "
                f"the transformers adapter); a pre-norm layer cannot stand in for it")
        target = "final_norm"
    else:
        if N is None:
            raise ExportError(
                f"speculators needs the last decoder layer's pre-norm output (hscapture layer "
                f"num_layers-1), but the number of decoder layers is unknown ({where}; no "
                f"final_norm with a layer id). Pass num_layers (--num-layers)")
        if N - 1 not in residual:
            raise ExportError(
                f"speculators needs the last decoder layer's output BEFORE the final norm "
                f"(hscapture residual layer {N - 1} = vLLM id {N}), which is not captured "
                f"({where}). final_norm cannot stand in for it (the norm is not invertible). "
                f"SGLang 0.5.23 cannot capture it (aux id {N - 1} would be taken at the input "
                f"of layer {N}, which does not exist); capture with the transformers adapter "
                f"(HiddenStateCapture(layers=[..., {N - 1}])) or vLLM, or export to SpecForge")
        target = layer_name(N - 1, "residual")
    if layers is None:
        aux = [l for l in residual if N is None or l != N - 1]
    else:
        aux = sorted(int(l) for l in layers)
        if len(set(aux)) != len(aux):
            raise ExportError(f"layers repeats a layer: {list(layers)}")
        missing = [l for l in aux if l not in residual]
        if missing:
            raise ExportError(f"layers {missing} are not captured as residual layers ({where})")
        if fmt == "speculators" and N is not None and N - 1 in aux:
            raise ExportError(f"layer {N - 1} is speculators' final slot; it cannot also be an "
                              f"aux layer")
    if not aux:
        raise ExportError(f"no aux layers to export ({where})")
    if loss_mask == "require" and no_mask:
        raise ExportError(
            f"{len(no_mask)} of {n} samples have no loss_mask field (e.g. rids "
            f"{[ss.rids[i] for i in no_mask[:3]]}); attach one when capturing (Sample.fields / "
            f"the extraction client's loss_mask) or pass loss_mask='all' (--loss-mask all) to "
            f"train on every token of those samples")
    return _Plan(fmt, aux, [layer_name(l, "residual") for l in aux], target, N,
                 hiddens.pop(), dtypes.pop(), loss_mask, list(ss.rids), no_mask, bool(gzip),
                 bool(crc32), with_meta, origins)


# -- files ----------------------------------------------------------------------------------


def _specforge_rel(i: int, gz: bool = False) -> str:
    g = SPECFORGE_GROUP * (i // SPECFORGE_GROUP)
    return f"rows_{g}-{g + SPECFORGE_GROUP}/data_{i}.ckpt" + (".gz" if gz else "")


#: gzip level of SpecForge's .ckpt.gz files
GZIP_LEVEL = 6

def _save_specforge(d: dict[str, Any], f: Any, gz: bool, crc32: bool = True) -> None:
    """torch.save's bytes for ``d`` (zip format) into ``f``: by :func:`_torch_save` (the same
    bytes, faster; without ``crc32``, those torch.save writes under
    ``torch.serialization.set_crc32_options(False)``: every record's CRC-32 0); with ``gz``,
    torch.save itself through gzip level 6, with no name and mtime 0 in the gzip header
    (the same samples give the same bytes: deflate's output
    depends on how its input is split into writes, so the writes are torch.save's own; the
    compression, not the writer, sets the speed there)."""
    if not gz:
        _torch_save(d, f, crc32=crc32)
        return
    with _gzip.GzipFile(filename="", mode="wb", compresslevel=GZIP_LEVEL, fileobj=f,
                        mtime=0) as z:
        torch.save(_materialized(d), z)


def _load_specforge(path: str) -> dict[str, Any]:
    """What SpecForge's loaders read: ``.gz`` decompressed whole, else memory-mapped."""
    if path.endswith(".gz"):
        with _gzip.open(path, "rb") as f:
            return torch.load(io.BytesIO(f.read()), weights_only=True)
    return torch.load(path, mmap=True, weights_only=True)


def _speculators_rel(i: int) -> str:
    return f"hidden_states/hs_{i}.safetensors"


def _mask(s: StoredSample) -> tuple[torch.Tensor, bool]:
    m = s.fields.get("loss_mask")
    if m is None:
        return torch.ones(s.num_tokens, dtype=torch.int64), False
    return m.to(torch.int64), True


def _write_atomic(path: str, write, fsync: bool) -> int:
    tmp = path + _TMP
    with open(tmp, "wb") as f:
        try:
            write(f)
        except RuntimeError as e:
            # torch.save reports a failed write (a full disk) as a RuntimeError of its zip
            # writer, the OSError as its context: the OSError it is (typed, resumable; until
            # 2026-12-05 token_freq.pt on a full disk ended the export with a traceback)
            cause = e.__cause__ or e.__context__
            if isinstance(cause, OSError):
                raise OSError(cause.errno, f"{cause.strerror} (writing {path})") from e
            raise
        f.flush()
        if fsync:
            os.fsync(f.fileno())
        size = os.fstat(f.fileno()).st_size    # written past the buffer by os.writev
    os.replace(tmp, path)
    return size


_ST = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.int64: "I64"}


def _write_safetensors(f, tensors: list[tuple[str, torch.Tensor | _Joined]]) -> None:
    """A plain safetensors file (header padded to 8 bytes, data in the given order), written
    through a :class:`_Sink` (a :class:`_Joined` chunk by chunk)."""
    header: dict[str, Any] = {}
    off = 0
    for name, t in tensors:
        nb = t.nbytes if isinstance(t, _Joined) else t.numel() * t.element_size()
        header[name] = {"dtype": _ST[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + nb]}
        off += nb
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    sink = _Sink(f)
    sink.write(struct.pack("<Q", len(body)) + body)
    for _, t in tensors:
        _write_tensor(sink, t, crc32=False)
    sink.close()


#: the key (SpecForge ``.ckpt`` dict) and the column (speculators Arrow dataset) that carry a
#: sample's per-sample metadata (``extra["meta"]``)
META_KEY = "hscapture_meta"
_SPECFORGE_KEYS = frozenset({"input_ids", "loss_mask", "hidden_state", "aux_hidden_state"})


def _meta_of(s: StoredSample) -> dict[str, Any] | None:
    """The sample's per-sample metadata (``extra["meta"]``), None when it has none."""
    m = s.extra.get("meta")
    return m if isinstance(m, dict) and m else None


def _build_specforge(s: StoredSample, plan: _Plan) -> dict[str, Any]:
    T, H = s.num_tokens, plan.hidden
    aux = _join([s.tensors[n] for n in plan.aux_names], (1, T, len(plan.aux_names) * H))
    mask, _ = _mask(s)
    d: dict[str, Any] = {"input_ids": s.token_ids.to(torch.int64), "loss_mask": mask,
                         "hidden_state": s.tensors[plan.target_name].unsqueeze(0),
                         "aux_hidden_state": aux}
    meta = _meta_of(s)
    if meta is not None:   # a plain dict: every SpecForge loader reads its keys by name
        d[META_KEY] = dict(meta)
    return d


def _build_speculators(s: StoredSample, plan: _Plan) -> list[tuple[str, torch.Tensor | _Joined]]:
    T, H = s.num_tokens, plan.hidden
    names = plan.aux_names + [plan.target_name]
    hs = _join([s.tensors[n] for n in names], (T, len(names), H))
    return [("hidden_states", hs), ("token_ids", s.token_ids.to(torch.int64))]


def _check_specforge(path: str, s: StoredSample, plan: _Plan) -> bool:
    """True if ``path`` is a complete, matching SpecForge record of ``s``."""
    try:
        d = _load_specforge(path)
    except Exception:
        return False
    T, H, K = s.num_tokens, plan.hidden, len(plan.aux_names)
    dt = getattr(torch, plan.dtype)
    meta = _meta_of(s)
    keys = (_SPECFORGE_KEYS | {META_KEY}) if meta is not None else _SPECFORGE_KEYS
    try:
        return (set(d) == keys and (meta is None or d[META_KEY] == meta)
                and d["input_ids"].dtype == torch.int64 and d["loss_mask"].dtype == torch.int64
                and tuple(d["hidden_state"].shape) == (1, T, H)
                and tuple(d["aux_hidden_state"].shape) == (1, T, K * H)
                and d["hidden_state"].dtype == dt and d["aux_hidden_state"].dtype == dt
                and torch.equal(d["input_ids"], s.token_ids.to(torch.int64))
                and torch.equal(d["loss_mask"], _mask(s)[0]))
    except Exception:
        return False


def _check_speculators(path: str, s: StoredSample, plan: _Plan) -> bool:
    from safetensors import safe_open

    try:
        with safe_open(path, "pt") as f:
            if set(f.keys()) != {"token_ids", "hidden_states"}:
                return False
            sl = f.get_slice("hidden_states")
            if tuple(sl.get_shape()) != (s.num_tokens, len(plan.aux_names) + 1, plan.hidden) \
                    or sl.get_dtype() != _ST.get(getattr(torch, plan.dtype)):
                return False
            return torch.equal(f.get_tensor("token_ids"), s.token_ids.to(torch.int64))
    except Exception:
        return False


# -- manifest -------------------------------------------------------------------------------


def _read_manifest(out_dir: str) -> dict | None:
    p = os.path.join(out_dir, MANIFEST_NAME)
    try:
        with open(p, "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise ExportError(f"{p} is not valid JSON ({e}); remove it or pass overwrite=True "
                          f"(--overwrite)") \
            from None


def _write_manifest(out_dir: str, m: dict, fsync: bool) -> None:
    data = json.dumps(m, indent=1, ensure_ascii=False).encode()
    _write_atomic(os.path.join(out_dir, MANIFEST_NAME), lambda f: f.write(data), fsync)


def _ours(name: str) -> bool:
    return (name == MANIFEST_NAME or name.startswith("rows_") or name == "hidden_states"
            or name in _DATASET_FILES or name == "token_freq.pt" or name.endswith(_TMP))


def _clear(out_dir: str) -> None:
    """Remove what an earlier export wrote (only names an export writes)."""
    for name in os.listdir(out_dir):
        if _ours(name):
            p = os.path.join(out_dir, name)
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p)
            else:
                os.unlink(p)


def _manifest(plan: _Plan, ss: ShardSet, out: str, status: str, counts: dict) -> dict[str, Any]:
    conv = sorted({ss.shard_metadata(sh).get("convention", "")
                   for sh in {ss.entry(i)["shard"] for i in range(len(ss))}})
    models = sorted({ss.shard_metadata(sh).get("model", "")
                     for sh in {ss.entry(i)["shard"] for i in range(len(ss))}})
    codecs = sorted({ss.shard_metadata(sh).get("codec") or "none"
                     for sh in {ss.entry(i)["shard"] for i in range(len(ss))}})
    conventions = {"hscapture": CONVENTIONS["hscapture"], plan.fmt: CONVENTIONS[plan.fmt]}
    if "fp8" in codecs:
        conventions["values"] = (
            "dequantized FP8: some source shards were written with compression='fp8' (float8 "
            "e4m3, one float32 scale per token row = amax/448); their hidden states are q * "
            f"scale in {plan.dtype}, not the captured values (per element |error| <= 2^-4 |x| "
            "+ 2^-10 scale)")
    if plan.fmt == "specforge":
        trainer_aux = list(plan.aux)
        target = {"name": "hidden_state", "hscapture": plan.target_name,
                  "what": "last decoder layer after the final norm"}
        files = ("rows_{g}-{g+2000}/data_{i}.ckpt.gz (torch.save bytes through gzip level 6)"
                 if plan.gzip else "rows_{g}-{g+2000}/data_{i}.ckpt" + (
                     "" if plan.crc32 else " (zip records' CRC-32 written as 0, as torch.save "
                     "under set_crc32_options(False): torch.load reads them, zip tools do not)"))
        hint = {"model.aux_hidden_state_layer_ids": trainer_aux,
                "data.hidden_states_path": os.path.abspath(out)}
    else:
        trainer_aux = [l + 1 for l in plan.aux]
        target = {"name": "hidden_states[:, -1]", "hscapture": plan.target_name,
                  "speculators_id": plan.num_layers,
                  "what": "last decoder layer before the final norm"}
        files = "hidden_states/hs_{i}.safetensors + Arrow dataset (row i) + token_freq.pt"
        hint = {"--target-layer-ids": trainer_aux}
    return {
        "manifest_version": MANIFEST_VERSION,
        "status": status,
        "format": plan.fmt,
        "layout_read_from": {"specforge": "specforge 0.2.0",
                             "speculators": "speculators 0.9.0"}[plan.fmt],
        "files": files,
        "source": os.path.abspath(ss.directory),
        "model": models,
        "source_convention": conv,
        "source_compression": codecs,
        "values_exact": "fp8" not in codecs,
        "conventions": conventions,
        "layers": {"aux_hscapture": plan.aux, f"aux_{plan.fmt}_ids": trainer_aux,
                   "target": target, "num_layers": plan.num_layers},
        "trainer_settings": hint,
        "hidden": plan.hidden,
        "dtype": plan.dtype,
        "zip_crc32": plan.crc32 if plan.fmt == "specforge" and not plan.gzip else None,
        "loss_mask": counts,
        "meta": {"samples": plan.with_meta, "where": (
            f"'{META_KEY}' key of data_{{i}}.ckpt (a dict), only in samples that carry one"
            if plan.fmt == "specforge" else
            f"'{META_KEY}' column of the Arrow dataset (row i: JSON text, null for none)"
            + ("" if plan.with_meta else "; not written: no sample carries one"))},
        "samples": len(plan.rids),
        "plan": plan.key(),
        "rids": plan.rids,
        "origins": _pack_origins(plan.origins),
        "written_by": "hscapture.export/1",
        "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _pack_origins(origins: list[str]) -> dict[str, list]:
    """``origins`` as a table of the distinct ones and each sample's index into it."""
    table: dict[str, int] = {}
    of = [table.setdefault(o, len(table)) for o in origins]
    return {"table": list(table), "of": of}


def _check_origins(old: dict[str, Any], plan: _Plan, out: str, src: str) -> None:
    """The samples ``out`` holds are these captures of these rids, with these values: the
    same rids recaptured (another producer incarnation: another model, a new run) or stored
    otherwise (FP8 vs exact) are other samples, and resuming would keep the old files (their
    keys, shapes and token ids match; hidden states are not compared). Manifests written
    before origins were recorded are not checked."""
    packed = old.get("origins")
    if not isinstance(packed, dict):
        return
    try:
        had = [packed["table"][k] for k in packed["of"]]
    except (KeyError, IndexError, TypeError):
        raise ExportError(f"{out}: its {MANIFEST_NAME} has malformed 'origins'; pass "
                          f"overwrite=True (--overwrite) to replace the export") from None
    for i, (was, now) in enumerate(zip(had, plan.origins)):
        if was != now:
            raise ExportError(
                f"{out} holds an export of other captures of the same rids (rid "
                f"{plan.rids[i]!r}: producer:epoch:values {was} there, {now} in {src}): its "
                f"files would be kept as they are; pass overwrite=True (--overwrite) to "
                f"replace them")


# -- export ---------------------------------------------------------------------------------


def export(shard_dir: str | os.PathLike, out_dir: str | os.PathLike, fmt: str, *,
           layers: Sequence[int] | None = None, loss_mask: str = "require",
           num_layers: int | None = None, progress: bool = True, overwrite: bool = False,
           fsync: bool = True, workers: int | None = None, gzip: bool = False,
           mixed_models: bool = False, crc32: bool = True) -> ExportResult:
    """Export every sample of ``shard_dir`` to ``out_dir`` in trainer layout ``fmt``.

    Args:
        fmt: ``"specforge"`` or ``"speculators"`` (see the module docstring for the layouts).
        layers: aux layers as hscapture residual layer ids (output of decoder layer L);
            default: every captured residual layer except the last decoder layer. Written in
            ascending order whatever order is given.
        loss_mask: ``"require"`` (a sample without a stored ``loss_mask`` fails the export)
            or ``"all"`` (such samples train on every token; counted in the manifest).
        num_layers: the model's number of decoder layers; default: what the shards record
            (their ``num_layers`` metadata, from the decoder layer the captured ``final_norm``
            follows). Needed for speculators.
        progress: show a tqdm progress bar on stderr.
        overwrite: remove an earlier export's files from ``out_dir`` first (only the names
            an export writes) instead of resuming it.
        fsync: fsync each file before renaming it into place.
        workers: threads reading and writing samples (default ``min(4, cpus)``).
        gzip: SpecForge only: write ``data_{i}.ckpt.gz`` (the same bytes through gzip level
            6, as SpecForge reads them) instead of ``data_{i}.ckpt``.
        mixed_models: export samples the shards record as captured from different models
            (default: refused, naming each model: a drafter trained on two verifiers' hidden
            states is trained on neither; pass it when they are the same weights under two
            names, e.g. a hub id and a local path).
        crc32: SpecForge ``.ckpt`` only: ``False`` writes every zip record's CRC-32 as 0, as
            ``torch.save`` does under ``torch.serialization.set_crc32_options(False)``, saving
            a pass over every byte. ``torch.load`` (SpecForge's loader) reads such files;
            zip tools (``unzip -t``, Python's ``zipfile``) report CRC errors in them. Recorded
            in the manifest (``zip_crc32``); an export is resumed only in the mode it began.

    Returns an :class:`ExportResult`; raises :class:`ExportError` (nothing written) when the
    shards cannot produce the target, and :class:`ExportWriteError` (an ``ExportError``) for a
    failed write: every file already in place is complete, and a rerun resumes.
    """
    t0 = time.perf_counter()
    if workers is not None and (type(workers) is not int or workers < 1):
        raise ExportError(f"workers: expected a number of threads >= 1, found {workers!r}")
    src = os.fspath(shard_dir)
    out = os.fspath(out_dir)
    ss = ShardSet(src)
    plan = _make_plan(ss, fmt, layers, loss_mask, num_layers, gzip, crc32)
    if not mixed_models:
        _check_one_model(ss)
    if os.path.realpath(out) == os.path.realpath(src):
        raise ExportError(f"the output directory {out} is the shard directory itself")
    if fmt == "speculators" and importlib.util.find_spec("datasets") is None:
        raise MissingExtraError("the speculators layout is an Arrow dataset written with the "
                          "'datasets' package, which is not installed: pip install "
                          "'hscapture[export]' (or datasets)")
    os.makedirs(out, exist_ok=True)
    old = _read_manifest(out)
    if old is None:
        foreign = sorted(n for n in os.listdir(out) if not _ours(n))
        if foreign:
            raise ExportError(f"{out} is not empty and holds no export (it has "
                              f"{', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''})"
                              f": export into a new or empty directory")
    if overwrite:
        _clear(out)
        old = None
    elif old is None:
        stray = sorted(n for n in os.listdir(out) if _ours(n))
        if stray:
            raise ExportError(f"{out} holds {stray[:5]} but no {MANIFEST_NAME}: not an export "
                              f"this tool can resume; pass overwrite=True (--overwrite) to "
                              f"replace them")
    else:
        if old.get("plan") != plan.key():
            raise ExportError(f"{out} holds another export ({old.get('plan')}); this one is "
                              f"{plan.key()}; pass overwrite=True (--overwrite) to replace it")
        old_rids = old.get("rids") or []
        if plan.rids[:len(old_rids)] != old_rids:
            raise ExportError(f"{out} holds an export of {len(old_rids)} samples that is not a "
                              f"prefix of {src}'s {len(plan.rids)} samples; pass overwrite=True "
                              f"(--overwrite)")
        _check_origins(old, plan, out, src)
    counts = {"mode": loss_mask, "stored": len(plan.rids) - len(plan.no_mask),
              "all_ones": len(plan.no_mask),
              "all_ones_rids": [plan.rids[i] for i in plan.no_mask[:100]]}
    try:
        return _write_all(ss, plan, out, fmt, counts, fsync, workers, progress, t0)
    except HSCaptureError:
        raise
    except OSError as e:    # a full disk, a read-only or vanished directory: typed, resumable
        raise ExportWriteError(f"export to {out} failed: {e}; rerun to resume") from e


def _write_all(ss: ShardSet, plan: _Plan, out: str, fmt: str, counts: dict[str, Any],
               fsync: bool, workers: int | None, progress: bool, t0: float) -> ExportResult:
    """Every file of the export (the manifest first as in progress, then the samples, the
    speculators dataset, the manifest as complete); an OSError anywhere is the caller's to
    report."""
    manifest = _manifest(plan, ss, out, "in_progress", counts)
    _write_manifest(out, manifest, fsync)

    rel = (lambda i: _specforge_rel(i, plan.gzip)) if fmt == "specforge" else _speculators_rel
    check = _check_specforge if fmt == "specforge" else _check_speculators
    names = plan.names()
    dirs = {os.path.dirname(os.path.join(out, rel(i))) for i in range(len(plan.rids))}
    for d in sorted(dirs):
        os.makedirs(d, exist_ok=True)
        for name in os.listdir(d):
            if name.endswith(_TMP):
                os.unlink(os.path.join(d, name))

    def one(i: int) -> tuple[str, int, int]:
        path = os.path.join(out, rel(i))
        existed = os.path.exists(path)
        if existed and check(path, ss.load(i, names=[]), plan):
            return "skipped", int(ss.entry(i).get("num_tokens", 0)), 0
        s = ss.load(i, names=names)
        if fmt == "specforge":
            d = _build_specforge(s, plan)
            n = _write_atomic(path, lambda f: _save_specforge(d, f, plan.gzip, plan.crc32),
                              fsync)
        else:
            items = _build_speculators(s, plan)
            n = _write_atomic(path, lambda f: _write_safetensors(f, items), fsync)
        return ("rewritten" if existed else "written"), s.num_tokens, n

    from tqdm import tqdm

    stats = {"written": 0, "skipped": 0, "rewritten": 0}
    tokens = nbytes = 0
    nw = workers or min(4, os.cpu_count() or 1)
    bar = tqdm(total=len(plan.rids), unit="sample", disable=not progress,
               desc=f"export {fmt}", dynamic_ncols=True)
    try:
        with ThreadPoolExecutor(nw, thread_name_prefix="hsc-export") as pool:
            # at most 2*workers samples in flight (bounded memory), taken in completion order
            it = iter(range(len(plan.rids)))
            pending = {pool.submit(one, i) for _, i in zip(range(2 * nw), it)}
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    what, t, n = fut.result()
                    stats[what] += 1
                    tokens += t
                    nbytes += n
                    bar.update(1)
                    nxt = next(it, None)
                    if nxt is not None:
                        pending.add(pool.submit(one, nxt))
                if nbytes and bar.n % 64 == 0:
                    bar.set_postfix_str(f"{nbytes / max(time.perf_counter() - t0, 1e-9) / 1e9:.2f} GB/s")
    finally:
        bar.close()

    if fmt == "speculators":
        nbytes += _write_dataset(ss, plan, out, fsync)
    manifest["status"] = "complete"
    manifest["updated"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    _write_manifest(out, manifest, fsync)
    written = stats["written"] + stats["rewritten"]
    return ExportResult(fmt, out, len(plan.rids), written, stats["skipped"], stats["rewritten"],
                        tokens, nbytes, time.perf_counter() - t0, counts, manifest)


#: the most tokens in all an Arrow list column with int32 offsets can hold
_LIST_OFFSETS_MAX = 2**31 - 1


def _write_dataset(ss: ShardSet, plan: _Plan, out: str, fsync: bool) -> int:
    """The speculators Arrow dataset (row i = sample i) and token_freq.pt; returns bytes."""
    import numpy as np
    import pyarrow as pa
    from datasets import Dataset

    ids_parts, mask_parts, lens = [], [], []
    metas: list[str | None] = []
    for i in range(len(plan.rids)):
        s = ss.load(i, names=[])
        meta = _meta_of(s)
        metas.append(None if meta is None else
                     json.dumps(meta, separators=(",", ":"), ensure_ascii=False))
        ids = s.token_ids.to(torch.int64)
        mask, _ = _mask(s)
        ids_parts.append(ids.numpy())
        mask_parts.append(mask.numpy())
        lens.append(s.num_tokens)
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    # Arrow list offsets are int32 (what datasets writes for a Sequence): past 2**31 - 1
    # tokens in all they would wrap, so such a dataset's token columns are large_list
    # (int64 offsets; datasets' LargeList), never wrapped offsets
    if offsets[-1] <= _LIST_OFFSETS_MAX:
        lists, offsets = pa.ListArray, offsets.astype(np.int32)
    else:
        lists = pa.LargeListArray
    all_ids, all_mask = np.concatenate(ids_parts), np.concatenate(mask_parts)
    u, c = np.unique(all_ids[all_mask != 0], return_counts=True)   # one pass, not per sample
    freq = dict(zip(u.tolist(), c.tolist()))
    columns = {
        "input_ids": lists.from_arrays(pa.array(offsets), pa.array(all_ids)),
        "loss_mask": lists.from_arrays(pa.array(offsets), pa.array(all_mask)),
        "seq_len": pa.array(np.asarray(lens, dtype=np.int64)),
    }
    if any(m is not None for m in metas):
        # one JSON string per row (null: no meta): values differ in type between rows, which
        # a struct column could not hold; speculators reads only the columns it names
        columns[META_KEY] = pa.array(metas, type=pa.string())
    table = pa.table(columns)
    ds = Dataset(table)
    ds.set_format(type="torch")
    tmp = os.path.join(out, "dataset" + _TMP)
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    from datasets.utils import logging as ds_logging

    was_on = ds_logging.is_progress_bar_enabled()
    ds_logging.disable_progress_bar()   # ours is the one bar; datasets' would interleave
    try:
        ds.save_to_disk(tmp)
    finally:
        if was_on:
            ds_logging.enable_progress_bar()
    nbytes = 0
    names = sorted(os.listdir(tmp), key=lambda n: n == "state.json")  # state.json last
    for name in names:
        p = os.path.join(tmp, name)
        nbytes += os.path.getsize(p)
        if fsync:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(p, os.path.join(out, name))
    os.rmdir(tmp)
    nbytes += _write_atomic(os.path.join(out, "token_freq.pt"), lambda f: torch.save(freq, f), fsync)
    return nbytes
