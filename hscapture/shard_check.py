"""Checking a shard directory against its format (:mod:`hscapture.shards`, "Shard directory
format"): what ``hscapture inspect`` and the demo report.

:func:`verify_dir` reads every finished shard's header and ``__metadata__`` (never its tensor
data), the index, and the files a live or dead writer left, and reports each problem in words;
it never raises for what it finds. Compressed tensors are checked against their codec records
(stored dtype and shape, logical dtype and shape, fp8 scales present), not decompressed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from .codec import CODECS, SCALE_PREFIX, describe
from .errors import ShardError
from .shard_format import (
    FIELD_PREFIX,
    FORMAT,
    INDEX_NAME,
    JOURNAL_SUFFIX,
    SHARD_RE,
    SHARD_SUFFIX,
    ST_TO_TORCH_NAME,
    TMP_SUFFIX,
    codec_records,
    final_norm_after,
    jdump,
    meta_list,
)
from .shard_index import dir_locked, read_index_lines

__all__ = ["verify_dir"]

_ST_SIZE = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I8": 1, "U8": 1, "I16": 2, "I32": 4,
            "I64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}

#: a shard's tensors as its header declares them: rid -> tensor name -> (dtype, shape)
Tensors = dict[str, dict[str, tuple]]


def verify_dir(out_dir: str | os.PathLike) -> dict:
    """Check a shard directory; never raises for what it finds (it reports it).

    Returns ``{"ok", "dir", "shards", "samples", "tokens", "bytes", "stored_bytes",
    "logical_bytes", "schemas", "per_sample", "problems", "in_progress", "unrelated"}``:
    ``per_sample`` counts the samples carrying each per-token field (``fields``: name →
    samples) and each key of the client's metadata (``meta_keys``: key → samples, from
    ``meta["extra"]["meta"]``; ``meta_errors``: samples whose metadata was refused). ``bytes`` is the
    total size of the finished shard files; ``stored_bytes`` the tensor data they hold as
    stored, ``logical_bytes`` the same tensors decoded (equal unless compressed; fp8 scales
    count as stored only); ``schemas`` lists each distinct schema (``layers`` (the final
    norm's entry null), ``layer_kinds``, ``layer_names``, ``dtype``, ``hidden``, ``model``,
    ``convention``, ``final_norm_after_layer``, ``num_layers``, ``codec``) with the ``shards``
    and ``samples`` that use it; ``unrelated`` names ``*.safetensors`` files that are not
    hscapture shards. ``ok`` is False when there is any problem, including a directory holding
    no hscapture shard at all (empty, or only unrelated files) and no live writer. Compressed
    tensors are checked against their codec records (stored dtype and shape, logical dtype and
    shape, fp8 scales present), not decompressed.
    """
    d = os.fspath(out_dir)
    scan = _Scan(d)
    report: dict[str, Any] = {"ok": False, "dir": d, "shards": 0, "samples": 0, "tokens": 0,
                              "bytes": 0, "stored_bytes": 0, "logical_bytes": 0, "schemas": [],
                              "problems": scan.problems, "in_progress": scan.in_progress,
                              "unrelated": scan.unrelated}
    try:
        files = sorted(os.listdir(d))
    except OSError as e:
        scan.problems.append(f"cannot list {d}: {e.strerror}")
        return report
    scan.files(files)
    problems = scan.problems
    try:
        lines = read_index_lines(d)
    except ShardError as e:
        problems.append(str(e))
        lines = []
    seen: dict[str, str] = {}
    tokens = 0
    per_sample: dict[str, Any] = {"fields": {}, "meta_keys": {}, "meta_errors": 0}
    for ent in lines:
        rid, shard = ent["rid"], ent.get("shard")
        _count_per_sample(per_sample, ent)
        if rid in seen:
            problems.append(f"rid {rid!r}: duplicated in {INDEX_NAME} ({seen[rid]} and {shard})")
            continue
        seen[rid] = shard
        if shard not in scan.shards:
            problems.append(f"rid {rid!r}: shard {shard!r} missing or unreadable")
            continue
        tens = scan.shards[shard].get(rid)
        if tens is None:
            problems.append(f"rid {rid!r}: no tensors in {shard}")
            continue
        tokens += int(ent.get("num_tokens") or 0)
        _check_sample(ent, shard, tens, scan.metas[shard], problems)
    _check_shards_listed(scan.shards, seen, problems)
    report.update(ok=not problems, shards=len(scan.shards), samples=len(seen), tokens=tokens,
                  bytes=scan.total_bytes, stored_bytes=scan.stored_bytes,
                  logical_bytes=scan.logical_bytes, schemas=list(scan.schemas.values()),
                  per_sample=per_sample)
    return report


@dataclass
class _Scan:
    """The directory's files as found: its finished shards' headers (what each holds), the
    files of a writer, unrelated ones, and the problems each showed."""

    dir: str
    problems: list[str] = field(default_factory=list)
    in_progress: list[str] = field(default_factory=list)
    unrelated: list[str] = field(default_factory=list)
    shards: dict[str, Tensors] = field(default_factory=dict)     # shard -> its tensors
    metas: dict[str, dict[str, str]] = field(default_factory=dict)
    schemas: dict[str, dict[str, Any]] = field(default_factory=dict)  # JSON -> schema, counts
    total_bytes: int = 0
    stored_bytes: int = 0
    logical_bytes: int = 0

    def files(self, files: list[str]) -> None:
        """Look at each of ``files`` (the directory's listing)."""
        live = dir_locked(self.dir)
        for f in files:
            if f.endswith(TMP_SUFFIX) or f.endswith(JOURNAL_SUFFIX):
                (self.in_progress if live else self.problems).append(
                    f if live else f"{f}: left by a writer that did not close (a new "
                                   f"ShardWriter on the directory recovers it)")
            elif SHARD_RE.match(f):
                self._shard(f)
            elif f.endswith(SHARD_SUFFIX):
                self.unrelated.append(f)
        if not self.shards and not self.in_progress and not self.problems:
            found = (f"only unrelated safetensors files ({', '.join(self.unrelated)})"
                     if self.unrelated else "no files" if not files
                     else f"{len(files)} other file(s)")
            self.problems.append(f"{self.dir}: no hscapture shards: expected "
                                 f"shard-NNNNN.safetensors files and {INDEX_NAME}, found {found}")

    def _shard(self, f: str) -> None:
        from safetensors import safe_open

        path = os.path.join(self.dir, f)
        self.total_bytes += os.path.getsize(path)
        try:
            with safe_open(path, "pt") as sf:
                meta = sf.metadata() or {}
                rids: Tensors = {}
                for k in sf.keys():
                    rid, _, name = k.rpartition("/")
                    sl = sf.get_slice(k)
                    rids.setdefault(rid, {})[name] = (sl.get_dtype(), tuple(sl.get_shape()))
        except Exception as e:
            self.problems.append(f"{f}: does not open with safetensors: {e}")
            return
        problems = self.problems
        if meta.get("format") != FORMAT:
            problems.append(f"{f}: __metadata__ format is {meta.get('format')!r}, expected "
                            f"{FORMAT!r}")
        if meta.get("num_samples") not in (None, str(len(rids))):
            problems.append(f"{f}: metadata says {meta.get('num_samples')} samples, found "
                            f"{len(rids)}")
        if meta.get("codec") and meta["codec"] not in CODECS:
            problems.append(f"{f}: codec {meta['codec']!r} is not supported by this version of "
                            f"hscapture (known: {', '.join(CODECS)})")
        for rid, tens in rids.items():
            recs, _ = codec_records(meta, rid)
            for name, (dt, shape) in tens.items():
                nb = _nbytes(dt, shape)
                self.stored_bytes += nb
                rec = recs.get(name)
                if rec is not None:
                    self.logical_bytes += _nbytes(str(rec.get("dtype")), rec.get("shape") or ())
                elif not name.startswith(SCALE_PREFIX) or not any(
                        r.get("scale") == name for r in recs.values()):
                    self.logical_bytes += nb
        self.shards[f] = rids
        self.metas[f] = meta
        schema = _schema_of(meta)
        entry = self.schemas.setdefault(jdump(schema), {**schema, "shards": 0, "samples": 0})
        entry["shards"] += 1
        entry["samples"] += len(rids)


def _check_sample(ent: Mapping[str, Any], shard: str, tens: dict[str, tuple],
                  meta: dict[str, str], problems: list[str]) -> None:
    """One index entry against the tensors its shard holds for its rid."""
    rid = ent["rid"]
    T = ent.get("num_tokens")
    tid = tens.get("token_ids")
    if tid is None or tid[1] != (T,):
        problems.append(f"rid {rid!r}: token_ids shape {tid and list(tid[1])} != [{T}]")
    hidden = ent.get("hidden")
    want_fields = ent.get("fields")
    if want_fields is not None:
        have = sorted(n[len(FIELD_PREFIX):] for n in tens if n.startswith(FIELD_PREFIX))
        if have != sorted(want_fields):
            problems.append(f"rid {rid!r}: fields {have} in {shard} != index {want_fields}")
    recs, bad = codec_records(meta, rid)
    if bad:
        problems.append(bad)
    scales = {str(r.get("scale")) for r in recs.values() if r.get("codec") == "fp8"}
    want_dt = ent.get("dtype")
    for name, (dt, shape) in tens.items():
        if name == "token_ids":
            continue
        if name.startswith(FIELD_PREFIX):
            if shape != (T,) or dt != "U8":
                problems.append(f"rid {rid!r}: {name} is {dt} {list(shape)}, expected U8 [{T}]")
            continue
        if name in scales:
            if shape != (T,) or dt != "F32":
                problems.append(f"rid {rid!r}: fp8 scales {name} are {dt} {list(shape)}, "
                                f"expected F32 [{T}]")
            continue
        rec = recs.get(name)
        if rec is not None:
            logical = _check_codec(rid, name, rec, dt, shape, T, hidden, tens, problems)
            if logical is None:
                continue
            dt, shape = logical
        if shape != (T, hidden):
            problems.append(f"rid {rid!r}: {name} shape {list(shape)} != [{T}, {hidden}]")
        if want_dt and ST_TO_TORCH_NAME.get(dt, dt) != want_dt and dt != want_dt:
            problems.append(f"rid {rid!r}: {name} dtype {dt} != index dtype {want_dt}")
    for name in recs:
        if name not in tens:
            problems.append(f"rid {rid!r}: codec record names {name!r}, which is not in {shard}")


def _check_codec(rid: str, name: str, rec: Mapping[str, Any], dt: str, shape: tuple, T: Any,
                 hidden: Any, tens: dict[str, tuple], problems: list[str]
                 ) -> tuple[str, tuple] | None:
    """A compressed tensor's stored form against its codec record; returns its logical
    ``(dtype, shape)`` to check as an uncompressed one's, or None (a codec unknown here)."""
    codec = rec.get("codec")
    stored_ok = {"zstd": dt == "U8" and len(shape) == 1,
                 "fp8": dt == "F8_E4M3" and shape == (T, hidden)}.get(codec)
    if stored_ok is None:
        problems.append(f"rid {rid!r}: {name} has codec {codec!r}, which this version of "
                        f"hscapture cannot read (known: {', '.join(CODECS)})")
        return None
    if not stored_ok:
        problems.append(f"rid {rid!r}: {name} is stored as {dt} {list(shape)}, which codec "
                        f"{codec} does not write")
    if codec == "fp8" and rec.get("scale") not in tens:
        problems.append(f"rid {rid!r}: {name}'s fp8 scales {rec.get('scale')!r} are missing")
    return str(rec.get("dtype")), tuple(rec.get("shape") or ())


def _check_shards_listed(shards: dict[str, Tensors], seen: dict[str, str],
                         problems: list[str]) -> None:
    """Every rid of every shard is in one shard only and listed in the index."""
    where: dict[str, str] = {}
    for f, rids in shards.items():
        for rid in rids:
            if rid in where:
                problems.append(f"rid {rid!r}: in two shards ({where[rid]} and {f})")
            where[rid] = f
            if seen.get(rid) != f and rid not in seen:
                problems.append(f"rid {rid!r}: in {f} but not in {INDEX_NAME}")


def _schema_of(meta: dict[str, str]) -> dict[str, Any]:
    """The schema a shard's ``__metadata__`` declares (what :func:`verify_dir` reports)."""
    def lst(key: str) -> list:
        return meta_list(meta, key)
    try:
        hidden: int | None = int(meta["hidden"])
    except (KeyError, ValueError):
        hidden = None
    layers, kinds = lst("layers"), lst("layer_kinds")
    after = final_norm_after(meta, layers, kinds)
    # old shards recorded the final norm with the id of the layer it follows: show it as null
    layers = [None if k == "final_norm" else l for l, k in zip(layers, kinds)] + layers[len(kinds):]
    return {"layers": layers, "layer_kinds": kinds,
            "layer_names": lst("layer_names"), "dtype": meta.get("dtype", ""),
            "hidden": hidden, "model": meta.get("model", ""),
            "convention": meta.get("convention", ""),
            "final_norm_after_layer": after, "num_layers": None if after is None else after + 1,
            "codec": describe(meta)}


def _nbytes(st: str, shape: Any) -> int:
    n = _ST_SIZE.get(st, 0)
    for x in shape:
        n *= int(x)
    return n


def _count_per_sample(acc: dict[str, Any], ent: Mapping[str, Any]) -> None:
    """Add one index entry's per-token fields and client-metadata keys to ``acc``."""
    for name in ent.get("fields") or ():
        acc["fields"][name] = acc["fields"].get(name, 0) + 1
    meta = ent.get("meta")
    extra = meta.get("extra") if isinstance(meta, Mapping) else None
    if not isinstance(extra, Mapping):
        return
    client = extra.get("meta")
    if isinstance(client, Mapping):
        for key in client:
            acc["meta_keys"][key] = acc["meta_keys"].get(key, 0) + 1
    if extra.get("meta_error"):
        acc["meta_errors"] += 1
