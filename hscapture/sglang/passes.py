"""One prefill pass as the SGLang hook reads it (:func:`record_pass`), and made safe to process
later (:func:`hold`): the pass log's recording half.

A forward hook sees a batch whose lists and outputs SGLang changes after the pass: the prefix
and extend lengths are its own lists, the requests' fill ids grow, a retraction or abort
changes their state, and CUDA-graph outputs are overwritten by the next replay. What
processing the pass needs is read here, at the pass; :func:`hold` copies what would change
(the token ids, the rows of graph outputs), so that the hook's processing of the pass, now or
from the log, sees the pass as it was.
"""

from __future__ import annotations

import itertools
from array import array
from dataclasses import dataclass, field
from typing import Any

from ..errors import CaptureConfigError
from .log_batch import Arenas, LogArena

__all__ = ["Pass", "ROW_FIELDS", "hold", "record_pass"]

#: values per wanted request in :attr:`Pass.rows`
ROW_FIELDS = 4


@dataclass(slots=True)
class Pass:
    """One prefill pass as :func:`record_pass` read it, to be processed now or from the pass
    log."""

    prefix_lens: list[int]
    extend_lens: list[int]
    offsets: list[int]
    hidden: Any
    last: Any
    token_indices: bool
    snapshot: bool             # the producer must copy the rows during the capture
    worker: Any
    batch: Any
    mode: str                  # the benchmark mode of the pass
    wanted: list[tuple[int, Any]]
    #: per wanted request, flat, ``ROW_FIELDS`` values each: its attempt, whether it is
    #: stopping, its prompt length, its fill ids array (one list, no tuple per row: what a
    #: logged pass keeps between turns counts toward the cyclic GC's next collection)
    rows: list[Any] = field(default_factory=list)
    logged: bool = False
    shift: int = 0             # the batch's row r is hidden's row r - shift (a pass's copy)
    real_tokens: int = 0       # the source rows the rows lie in (the batch's, or the copy's)
    nbytes: int = 0            # the memory a logged pass keeps referenced
    #: the wanted rows' token ids end to end, copied at the pass (logged): row k's are
    #: ``extend_lens[i]`` ids after those of the rows before it
    ids: array | None = None
    since: float | None = None     # time.monotonic() of a logged pass
    arena: LogArena | None = None  # where a logged pass's copy lies (hidden, last: its blocks)


def record_pass(result: Any, worker: Any, batch: Any, wanted: list[tuple[int, Any]],
                mode: str, final_norm: bool) -> Pass:
    """What processing this pass needs, read now: the batch's row layout, the forward's
    outputs, and per wanted request the values that change after the pass (its attempt,
    whether it is stopping, its prompt length so far). ``mode``: the hook's benchmark mode
    of the pass; ``final_norm``: whether the final block is read. To process the pass later
    (the pass log), :func:`hold` it."""
    n = len(batch.reqs)
    prefix_lens, extend_lens = batch.prefix_lens, batch.extend_lens
    if type(prefix_lens) is not list:
        prefix_lens = [int(x) for x in prefix_lens]
    if type(extend_lens) is not list:
        extend_lens = [int(x) for x in extend_lens]
    if len(prefix_lens) < n or len(extend_lens) < n:
        raise CaptureConfigError(
            f"batch has {n} requests but {len(prefix_lens)} prefix_lens and "
            f"{len(extend_lens)} extend_lens")
    offsets = list(itertools.accumulate(extend_lens[:n], initial=0))
    lo = getattr(result, "logits_output", None)
    hidden = getattr(lo, "hidden_states", None)
    last = getattr(lo, "last_hidden_states", None) if final_norm else None
    rec = Pass(prefix_lens, extend_lens, offsets, hidden, last,
               getattr(lo, "hidden_states_token_indices", None) is not None,
               bool(getattr(result, "can_run_cuda_graph", True)), worker, batch, mode, wanted)
    rec.real_tokens = offsets[-1]
    rows = rec.rows
    for i, req in wanted:
        fill = req.full_untruncated_fill_ids
        rows += (getattr(req, "retraction_count", 0) or 0,
                 getattr(req, "to_finish", None) or getattr(req, "finished_reason", None),
                 len(fill), fill)
    return rec


def hold(rec: Pass, arenas: Arenas, max_bytes: int) -> bool:
    """Make ``rec`` safe to process later (the pass log): its token ids are copied out now
    (the batch's lists are SGLang's, reused after the pass) and, when the outputs are
    CUDA-graph buffers the next replay overwrites, the rows covering every wanted row are
    copied now on the forward's stream into ``arenas``' arena (of at most ``max_bytes``;
    ``Pass.shift``: batch row r is arena row r - shift). False when it cannot be (ids that
    are not a host ``array('q')``, outputs that do not cover the batch): the pass is then
    processed at once, as without a log. Sets ``rec.logged`` to the result."""
    ids = array("q")
    # (copies: the batch's lists are SGLang's, which may reuse them after the pass)
    pl = rec.prefix_lens = list(rec.prefix_lens)
    el = rec.extend_lens = list(rec.extend_lens)
    offs = rec.offsets
    rows = rec.rows
    first, end = offs[-1], 0      # the batch rows covering every wanted row
    for k, (i, _) in enumerate(rec.wanted):
        fill = rows[k * ROW_FIELDS + 3]
        if type(fill) is not array or fill.typecode != "q":
            rec.logged = False
            return False
        p, e = pl[i], el[i]
        if e > 0:
            ids += fill[p:p + e]
        o = offs[i]
        if o < first:
            first = o
        if o + e > end:
            end = o + e
    rec.ids = ids
    if rec.snapshot and rec.hidden is not None:
        hidden, last = rec.hidden, rec.last
        hs, ls = hidden.shape, last.shape if last is not None else None
        if len(hs) != 2 or hs[0] < end or (ls is not None and (len(ls) != 2
                                                              or ls[0] < end)):
            rec.logged = False
            return False
        # into the log's arena (one copy per block, as a clone, without an allocation;
        # the drain captures the arena's passes in one call: log_batch says why). The
        # pass then reads the arena's blocks whole: its rows are arena rows
        # [pos, pos + n), batch row r at arena row r - shift.
        srcs = [hidden] if last is None else [hidden, last]
        n = end - first
        arena = arenas.for_rows(srcs, n, max_bytes)
        pos = arena.put(srcs, first, end, hs[0])
        rec.arena = arena
        rec.hidden = arena.blocks[0]
        rec.last = arena.blocks[1] if last is not None else None
        rec.shift, rec.snapshot, rec.real_tokens = first - pos, False, pos + n
        rec.nbytes = n * arena.row_bytes
    rec.batch = None            # (its ids are not needed: the rows' own were copied)
    # the device (or host) memory the log keeps: the copy, else the forward's outputs
    h = rec.hidden
    if h is not None and rec.arena is None:
        size = h.element_size()
        rec.nbytes = h.shape[0] * h.shape[1] * size if len(h.shape) == 2 else 0
        if rec.last is not None and len(rec.last.shape) == 2:
            rec.nbytes += rec.last.shape[0] * rec.last.shape[1] * size
    rec.logged = True
    return True
