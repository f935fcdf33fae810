"""A shard directory's index and journals: ``index.jsonl`` (read, appended, its torn tail
repaired) and ``shard-{n}.journal`` (the open shard's durable samples), as
:mod:`hscapture.shard_format` specifies them, plus the probe for a live writer's ``.lock``.

The writer (:mod:`hscapture.shards`) appends and journals; the checker, the reader and the
exports read. Nothing here decides what is durable: it keeps the files in the format.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ._flock import lock_held
from .errors import ShardError
from .shard_format import INDEX_NAME, LOCK_NAME, jdump

__all__ = ["read_index"]


def fsync_dir(path: str) -> None:
    """fsync a directory (its entries: a rename, a new or removed file, are durable)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class JournalEntry:
    """One sample of a shard: its journal line and its index entry (``shard`` set when it is
    appended)."""

    rid: str
    tensors: list  # [name, st_dtype, shape, [begin, end]] (offsets relative to data start)
    end: int
    index: dict
    codecs: dict | None = None   # stored name -> codec record (compressed shards only)

    def journal_line(self) -> str:
        """Its ``{"kind": "sample", ...}`` journal line, newline-terminated."""
        d = {"kind": "sample", **self.index, "tensors": self.tensors, "end": self.end}
        if self.codecs:
            d["codecs"] = self.codecs
        return jdump(d) + "\n"


def read_journal(path: str) -> tuple[dict | None, list[JournalEntry]]:
    """A journal's shard line (None if it has none) and its sample lines, up to the first
    line that is torn or does not parse."""
    with open(path, "rb") as f:
        raw = f.read()
    header, entries = None, []
    for line in raw.split(b"\n")[:-1]:  # the part after the last newline is torn
        try:
            d = json.loads(line)
        except ValueError:
            break
        if d.get("kind") == "shard":
            header = d
        elif d.get("kind") == "sample":
            tensors, end, codecs = d.pop("tensors"), d.pop("end"), d.pop("codecs", None)
            d.pop("kind")
            entries.append(JournalEntry(d["rid"], tensors, int(end), d, codecs))
    return header, entries


def repair_index_tail(d: str, fsync: bool) -> None:
    """Cut a torn last line (no terminating newline) off ``d``'s ``index.jsonl``."""
    repair_tail(os.path.join(d, INDEX_NAME), fsync)


def append_lines(path: str, text: str, *, fsync: bool, mode: int = 0o644) -> None:
    """Append whole ``\n``-terminated lines to a JSON-lines file: a torn tail (an append a
    full disk or a crash cut short) is cut off first, a short write is completed, and an
    append that fails is cut off again before the error is raised, so a later line never
    runs into a fragment (which would make both unreadable)."""
    kept = repair_tail(path, fsync=fsync)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, mode)
    try:
        try:
            data = memoryview(text.encode("utf-8"))
            while len(data):
                data = data[os.write(fd, data):]
            if fsync:
                os.fsync(fd)
        except OSError:
            try:
                os.ftruncate(fd, kept)
            except OSError:
                pass            # the next append cuts it (repair_tail)
            raise
    finally:
        os.close(fd)


def repair_tail(path: str, fsync: bool) -> int:
    """Cut a JSON-lines file back to its last newline (a torn last line: a write cut short
    by a crash or a full disk), so the next append starts a line of its own; returns the
    size kept (0 when the file does not exist)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    try:
        size = os.fstat(fd).st_size
        pos = size
        while pos > 0:
            chunk = min(65536, pos)
            buf = os.pread(fd, chunk, pos - chunk)
            k = buf.rfind(b"\n")
            if k >= 0:
                pos = pos - chunk + k + 1
                break
            pos -= chunk
        if pos != size:
            os.ftruncate(fd, pos)
            if fsync:
                os.fsync(fd)
        return pos
    finally:
        os.close(fd)


def append_index(d: str, shard: str, entries: list[JournalEntry], index: dict,
                 fsync: bool) -> None:
    """Append the index lines of ``entries`` (now in ``shard``) that ``index`` (rid -> entry,
    updated) does not hold yet: one ``O_APPEND`` write, fsync'd when ``fsync``."""
    lines = []
    for e in entries:
        if e.rid in index:
            continue  # already appended before a crash
        entry = dict(e.index)
        entry["shard"] = shard
        lines.append(jdump(entry) + "\n")
        index[e.rid] = entry
    if not lines:
        return
    path = os.path.join(d, INDEX_NAME)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        data = memoryview("".join(lines).encode("utf-8"))
        while len(data):
            n = os.write(fd, data)
            data = data[n:]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_index_lines(out_dir: str) -> list[dict]:
    """Every complete line of ``index.jsonl`` in file order (``[]`` without one); a malformed
    line is a :class:`~hscapture.errors.ShardError` naming it."""
    path = os.path.join(os.fspath(out_dir), INDEX_NAME)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return []
    except OSError as e:
        raise ShardError(f"cannot read {path}: {e.strerror}") from e
    out = []
    for i, line in enumerate(raw.split(b"\n")[:-1], 1):  # torn last line ignored
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            if not isinstance(d, dict) or not isinstance(d.get("rid"), str):
                raise ValueError("not an object with a string rid")
        except ValueError as e:
            raise ShardError(f"{path}:{i}: malformed index line: {e}") from None
        out.append(d)
    return out


def read_index(out_dir: str | os.PathLike) -> dict[str, dict]:
    """rid → index entry of a shard directory (first occurrence wins; see
    :func:`hscapture.shard_check.verify_dir`)."""
    idx: dict[str, dict] = {}
    for d in read_index_lines(os.fspath(out_dir)):
        idx.setdefault(d["rid"], d)
    return idx


def dir_locked(d: str) -> bool:
    """True while a live :class:`~hscapture.shards.ShardWriter` holds ``d``'s ``.lock``."""
    return lock_held(os.path.join(d, LOCK_NAME))
