"""Chunk assembly: turning rows of ring entries into whole samples, with a bounded memory.

Rows of one rid (one producer incarnation) arrive as chunks ``[token_start, +token_count)``.
A chunk that does not complete its sample is COPIED out of the ring at once (so a partial
sample never pins ring space); the bytes held that way are accounted and bounded. A sample
is complete when positions ``0..N-1`` are each present exactly once and the chunk with
``last`` ends at ``N``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Chunk", "Partial", "Assembler"]


@dataclass
class Chunk:
    start: int
    count: int
    tensors: list[np.ndarray]            # owned copies, [count, hidden] each (ring dtype)
    token_ids: np.ndarray
    fields: dict[str, bytes]
    seq: int


@dataclass
class Partial:
    """A sample still missing positions."""

    key: tuple[int, str]                 # (epoch, rid)
    schema: tuple                        # layers, kinds, dtype, hidden of the first chunk
    meta: dict[str, Any]
    chunks: list[Chunk] = field(default_factory=list)
    total: int | None = None             # N, known once the last chunk arrived
    nbytes: int = 0
    updated: float = field(default_factory=time.monotonic)
    #: ring records this partial keeps unreleased (see Subscriber: partial_hold_s)
    holds: list[tuple[Any, int]] = field(default_factory=list)

    def covered(self) -> tuple[int, list[tuple[int, int]]]:
        at, gaps = 0, []
        for c in sorted(self.chunks, key=lambda c: c.start):
            if c.start > at:
                gaps.append((at, c.start))
            at = max(at, c.start + c.count)
        return at, gaps

    def describe_gaps(self) -> str:
        at, gaps = self.covered()
        parts = [f"[{a}, {b})" for a, b in gaps]
        if self.total is None:
            parts.append(f"[{at}, ?) (the last chunk never arrived)")
        elif at < self.total:
            parts.append(f"[{at}, {self.total})")
        return ", ".join(parts) or "nothing"


class Assembler:
    """Partial samples by (epoch, rid), with the bytes they hold accounted."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.partials: dict[tuple[int, str], Partial] = {}
        self.nbytes = 0

    def get(self, key: tuple[int, str]) -> Partial | None:
        return self.partials.get(key)

    def open(self, key: tuple[int, str], schema: tuple, meta: dict[str, Any]) -> Partial:
        p = self.partials.get(key)
        if p is None:
            p = self.partials[key] = Partial(key, schema, meta)
        return p

    def add(self, p: Partial, chunk: Chunk) -> None:
        p.chunks.append(chunk)
        size = sum(t.nbytes for t in chunk.tensors)
        p.nbytes += size
        self.nbytes += size
        p.updated = time.monotonic()

    def pop(self, key: tuple[int, str]) -> Partial | None:
        p = self.partials.pop(key, None)
        if p is not None:
            self.nbytes -= p.nbytes
        return p

    def over_budget(self) -> list[Partial]:
        """The oldest partials to give up so that the held bytes fit the bound again."""
        if self.nbytes <= self.max_bytes:
            return []
        out, freed = [], 0
        for p in sorted(self.partials.values(), key=lambda p: p.updated):
            out.append(p)
            freed += p.nbytes
            if self.nbytes - freed <= self.max_bytes:
                break
        return out

    def stale(self, older_than: float) -> list[Partial]:
        return [p for p in self.partials.values() if p.updated < older_than]

    def of_epoch(self, epoch: int) -> list[Partial]:
        return [p for k, p in self.partials.items() if k[0] == epoch]
