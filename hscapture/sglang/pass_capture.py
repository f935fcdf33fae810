"""One recorded prefill pass turned into rows and captured: the SGLang hook's capture half.

:class:`PassCapture` takes a :class:`~.passes.Pass` (recorded at the pass, processed now or
from the pass log), checks its outputs once per layout, builds each wanted request's wire-form
row through the :class:`~.samples.SampleTracker` (which owns the in-flight bookkeeping and the
reports by rid), and hands the rows to :meth:`hscapture.producer.Producer.capture_rows`: at
once, or, for a drain of the pass log, joined into one :class:`~.log_batch.RowBatch` captured
in one call (:meth:`PassCapture.process_log`).

Guarantees: the rows reach the producer in the passes' order; a row batch is captured before
another capture, a publish, or a report of a rid it holds (:meth:`PassCapture.flush_batch`);
every opted-in request of a pass whose checks or capture fail is reported by rid, and nothing
here raises into the server for one pass's failure (:meth:`PassCapture.process_log`).
"""

from __future__ import annotations

import collections
import logging
from array import array
from typing import Any, Callable, Iterable

import numpy as np

from .._copies import HostRowIds
from ..errors import CaptureConfigError
from .config import CaptureConfig
from .log_batch import RowBatch
from .passes import ROW_FIELDS, Pass
from .samples import SampleTracker
from .timing import HookTiming

log = logging.getLogger("hscapture.sglang")

__all__ = ["PassCapture"]


class PassCapture:
    """Rows of recorded passes, captured by the producer; one per hook.

    ``producer`` is set by the hook once it exists (None: nothing is captured yet). ``report``
    is the hook's report of a rid to the producer (:class:`SampleTracker`'s ``abort``);
    ``log_once(key, level, msg, *args, exc_info=False)`` logs once per key.
    """

    def __init__(self, config: CaptureConfig, counters: "collections.Counter[str]",
                 timing: HookTiming, log_once: Callable[..., None],
                 report: Callable[[str, str, bool, int], None]) -> None:
        self.config = config
        self.counters = counters
        self._timing = timing
        self._log_once = log_once
        self.producer: Any = None
        #: the samples in flight and the done ones (samples.py): each chunk's row, restarts,
        #: reports by rid (a report first captures the batched rows of its rid)
        self._samples = SampleTracker(config, counters, log_once, self.flush_batch, report)
        self._layers: tuple[int, ...] | None = None
        #: while the pass log is processed, the rows of its passes waiting to be captured in
        #: one call (log_batch)
        self.batch: RowBatch | None = None
        #: the arena whose layout :meth:`_layout` last checked, and what it found:
        #: (arena, aux layer ids, hidden size, whether the final block is captured, layout)
        self._arena_layout: tuple[Any, ...] | None = None
        self._shapes: dict[tuple[Any, ...], tuple[list[int], list[str], list[list[int]]]] = {}

    @property
    def samples(self) -> SampleTracker:
        return self._samples

    @property
    def layers(self) -> tuple[int, ...] | None:
        """The aux layer ids, once a pass resolved them."""
        return self._layers

    def process_log(self, passes: Iterable[Pass]) -> None:
        """Process logged passes, oldest first, their rows joined into row batches (each
        captured in one call). A pass whose processing fails has its opted-in requests
        reported, the others go on."""
        self.batch = RowBatch()
        try:
            for rec in passes:
                try:
                    self.process(rec)
                except Exception as exc:  # never let capture break the server
                    self.abort_rows(rec.wanted, self.failed(
                        exc, "hscapture: capture of a logged pass failed (%s: %s); its "
                        "opted-in requests are reported"))
            self.flush_batch()
        finally:
            self.batch = None

    def process(self, rec: Pass) -> None:
        """Turn one recorded pass into rows and capture them (deferred by the producer's
        stage); then the in-flight bookkeeping. What :func:`.passes.record_pass` read is used
        as it was at the pass."""
        wanted = rec.wanted
        prefix_lens, extend_lens, offsets = rec.prefix_lens, rec.extend_lens, rec.offsets
        arena = rec.arena
        known = self._arena_layout
        if arena is not None and known is not None and known[0] is arena and \
                not rec.token_indices:
            # a pass in the arena whose layout an earlier pass's checks passed: the same
            # blocks (which cover every pass put in them), the same layers
            _, layers, h, has_last, shape = known
            hidden, last = rec.hidden, rec.last if has_last else None
        else:
            got = self._layout(rec)
            if got is None:
                return
            layers, h, hidden, last, shape = got
            if arena is not None:
                self._arena_layout = (arena, layers, h, last is not None, shape)
        # Graph replays hand out views of reused buffers: ask the producer to snapshot them
        # (a logged pass's rows were copied at the pass already).
        snapshot = rec.snapshot
        # The rows, already in their wire form (record.ROW_KEYS order): no per-row object.
        maps: list[dict[str, Any]] = []
        starts: list[int] = []
        accepted: list[tuple[str, int, Any, bool]] = []
        seen: set[str] = set()
        row = self._samples.row
        mode = rec.mode
        shift = rec.shift
        # Token ids from each request's own host array (SGLang builds the batch's input_ids
        # from exactly these: ScheduleBatch.prepare_for_extend takes fill_ids[prefix_len:
        # extend_end]); written into the entry by the CPU in one native call, no torch op.
        # A request whose ids are not an array('q') sends the batch to the device ids. A
        # logged pass copied its rows' ids at the pass.
        held = rec.ids
        held_at = 0               # where the row's ids start in ``held``
        host_ids = mode != "devids"
        id_parts: list[tuple[Any, int, int]] = []
        rows = rec.rows
        for r, (i, req) in enumerate(wanted):
            attempt, stopping, total, fill = rows[r * ROW_FIELDS:(r + 1) * ROW_FIELDS]
            e = extend_lens[i]
            got = row(req, prefix_lens[i], e, seen, attempt, stopping, total)
            if got is not None:
                maps.append(got[0])
                starts.append(offsets[i] - shift)
                accepted.append(got[1])
                if held is not None:
                    id_parts.append((held, held_at, e))
                elif host_ids:
                    if type(fill) is array and fill.typecode == "q":
                        id_parts.append((fill, prefix_lens[i], extend_lens[i]))
                    else:
                        host_ids = False
            if e > 0:
                held_at += e
        if not maps:
            return
        timing = self._timing
        timing.mark("rows")
        batch, arena = self.batch, rec.arena
        if batch is not None and arena is not None and held is not None and \
                mode != "nocapture" and (last is not None) == (len(arena.blocks) == 2):
            # a logged pass in the log's arena: its rows join the drain's one capture call
            # (log_batch); the bookkeeping below is done now, as for a capture that staged
            # them, and undone for the rows of a batch whose capture fails (_flush_batch)
            if not batch.accepts(arena, shape, h, maps, starts, id_parts):
                self.flush_batch()
            batch.add(arena, shape, h, maps, starts, id_parts, accepted, rec.since, mode)
            self._samples.settle(accepted, True)
            return
        self.flush_batch()     # (captured at once: after the batch's rows, the calls' order)
        # (a slice is one torch dispatch, and it releases the GIL: only where rows are padded)
        real_tokens = rec.real_tokens
        blocks = [hidden if hidden.shape[0] == real_tokens else hidden[:real_tokens]]
        if last is not None:
            blocks.append(last if last.shape[0] == real_tokens else last[:real_tokens])
        cap_layers, kinds, layer_map = shape
        if held is not None or host_ids:
            ids = HostRowIds(id_parts)
        else:
            ids = _batch_token_ids(rec.batch, real_tokens, wanted, prefix_lens, extend_lens,
                                   offsets)
        if mode == "nocapture":
            ok = True
        else:
            t = timing.mark("ids")
            ok = self.producer.capture_rows(maps, starts, blocks, layers=cap_layers,
                                            layer_kinds=kinds, token_ids=ids,
                                            layer_map=layer_map, hidden=h, snapshot=snapshot,
                                            defer=mode != "nostage" and not (
                                                snapshot and mode == "nosnapstage"),
                                            held_since=rec.since)
            timing.add_producer(timing.mark("capture") - t, mode)
        self.counters["chunks" if ok else "dropped_chunks"] += len(maps)
        completed = self._samples.settle(accepted, ok)
        if completed:
            self.counters["samples"] += completed

    def _layout(self, rec: Pass) -> tuple[tuple[int, ...], int, Any, Any, Any] | None:
        """The checks of one pass's outputs: ``(aux layer ids, hidden size, aux block, final
        block or None, the hook's layout tuple (:meth:`_shape_of`))``, or None after its
        wanted rows were reported (outputs missing, of a subset of rows, too short, not a
        multiple of the aux layers, layer ids unknown)."""
        wanted = rec.wanted
        real_tokens = rec.real_tokens
        hidden = rec.hidden
        if hidden is None:
            self._fail_rows(wanted, "no_hidden_states",
                            "the forward returned no hidden states: start SGLang with "
                            "--enable-return-aux-hidden-states --speculative-algorithm EAGLE3 "
                            "--return-aux-hidden-state-layer-ids L1 L2 L3")
            return None
        if rec.token_indices:
            self._fail_rows(wanted, "token_indices",
                            "the forward returned hidden states for a subset of rows "
                            "(hidden_states_token_indices); this model/feature is not supported")
            return None
        # (each tensor's shape read once: a torch attribute read costs ~1 us on this thread)
        hs = hidden.shape
        if len(hs) != 2 or hs[0] < real_tokens:
            self._fail_rows(wanted, "shape",
                            f"hidden states {tuple(hs)} do not cover the batch's "
                            f"{real_tokens} tokens")
            return None
        layers = self._resolve_layers()
        if layers is None:
            self._fail_rows(wanted, "layers",
                            "aux layer ids unknown: pass --return-aux-hidden-state-layer-ids "
                            "to SGLang (or set HSCAPTURE_LAYERS)")
            return None
        k = len(layers)
        last = rec.last
        width = hs[1]
        if width % k:
            self._fail_rows(wanted, "width",
                            f"hidden states are {width} wide, not a multiple of {k} aux layers "
                            f"{list(layers)} (is --enable-return-aux-hidden-states on?)")
            return None
        h = width // k
        ls = last.shape if last is not None else None
        if last is not None and (len(ls) != 2 or ls[1] != h or ls[0] < real_tokens
                                 or last.dtype != hidden.dtype):
            self._log_once("last_shape", logging.WARNING,
                           "hscapture: last_hidden_states %s does not match the aux states "
                           "(%d x %d); final_norm is not captured", tuple(ls), k, h)
            last = None
        if self.config.final_norm and last is None:
            self._log_once("no_last", logging.WARNING,
                           "hscapture: no last_hidden_states in this forward; final_norm is "
                           "not captured (only the aux layers)")
        return layers, h, hidden, last, self._shape_of(layers, h, last is not None, rec.worker)

    def flush_batch(self, rid: str | None = None) -> None:
        """Capture the drain's batched rows (:class:`RowBatch`) in one call, before another
        capture or a publish reaches the producer (the passes' order), and before a report
        of a rid they hold (``rid``: only then; a report of another sample may come first,
        a subscriber orders a sample's chunks and reports by rid). Their bookkeeping was done
        when they were batched; a capture that drops them moves their samples to the done
        ones, one that raises reports each of their rids (the server goes on)."""
        batch = self.batch
        if not batch or (rid is not None and not batch.holds(rid)):
            return
        b = batch.take()
        self.counters["log_captures"] += 1
        arena, (cap_layers, kinds, layer_map) = b.arena, b.shape
        lo = min(b.starts)
        hi = max(s + m["token_count"] for s, m in zip(b.starts, b.maps))
        starts = [s - lo for s in b.starts] if lo else b.starts
        timing = self._timing
        t = timing.mark("ids")
        try:
            ok = self.producer.capture_rows(
                b.maps, starts, [x[lo:hi] for x in arena.blocks], layers=cap_layers,
                layer_kinds=kinds, token_ids=HostRowIds(b.ids), layer_map=layer_map,
                hidden=b.hidden, snapshot=False, defer=True, held_since=b.since)
        except Exception as exc:  # never let capture break the server
            self._report_batch(b, self.failed(
                exc, "hscapture: capture of logged passes failed (%s: %s); their opted-in "
                "requests are reported"))
            return
        timing.add_producer(timing.mark("capture") - t, b.mode)
        self.counters["chunks" if ok else "dropped_chunks"] += len(b.accepted)
        if ok:
            completed = sum(1 for a in b.accepted if a[3])
            if completed:
                self.counters["samples"] += completed
        else:   # dropped (reported by the producer): nothing more of these samples
            self._samples.settle([a for a in b.accepted if not a[3]], False)

    def _report_batch(self, b: RowBatch, reason: str) -> None:
        """Report every sample with a chunk in ``b`` (whose capture failed) by rid, once,
        whatever its bookkeeping said (a last chunk's sample was counted done)."""
        seen: set[str] = set()
        try:
            for rid, attempt, req, _ in b.accepted:
                if rid not in seen:
                    seen.add(rid)
                    self._samples.fail(rid, attempt, reason, req, counted_done=True)
        except Exception:  # reporting failed too: nothing more can be done safely
            self.counters["errors"] += 1

    def failed(self, exc: Exception, message: str, *args: Any) -> str:
        """Count and log (once per exception type) a capture that raised; ``message`` takes
        the exception's type and text first, then ``args``. Returns the reason its opted-in
        requests are reported with."""
        self.counters["errors"] += 1
        self._log_once(f"exc:{type(exc).__name__}", logging.ERROR, message, type(exc).__name__,
                       exc, *args, exc_info=True)
        return f"capture hook error: {type(exc).__name__}: {exc}"

    def _shape_of(self, layers: tuple[int, ...], h: int, final: bool, worker: Any
                  ) -> tuple[list[int], list[str], list[list[int]]]:
        """(captured layer ids, kinds, layer map) of a forward: the same for every forward of
        one server, so built once per (layers, hidden, final_norm) and reused (never changed:
        the producer copies what it keeps)."""
        key = (layers, h, final)
        got = self._shapes.get(key)
        if got is None:
            k = len(layers)
            cap = list(layers) + ([_final_layer_id(worker)] if final else [])
            kinds = ["residual"] * k + (["final_norm"] if final else [])
            lmap = [[0, j * h] for j in range(k)] + ([[1, 0]] if final else [])
            got = self._shapes[key] = (cap, kinds, lmap)
        return got

    def _fail_rows(self, wanted: Iterable[tuple[int, Any]], key: str, reason: str) -> None:
        self._log_once(key, logging.ERROR, "hscapture: %s", reason)
        self._samples.fail_requests(wanted, reason)

    def abort_rows(self, wanted: Iterable[tuple[int, Any]], reason: str) -> None:
        try:
            self._samples.fail_requests(wanted, reason)
        except Exception:  # reporting failed too: nothing more can be done safely
            self.counters["errors"] += 1

    def _resolve_layers(self) -> tuple[int, ...] | None:
        if self._layers is not None:
            return self._layers
        ours, theirs = self.config.layers, _sglang_aux_layers()
        if ours is not None and theirs is not None and ours != theirs:
            raise CaptureConfigError(
                f"HSCAPTURE_LAYERS {list(ours)} differs from SGLang's "
                f"--return-aux-hidden-state-layer-ids {list(theirs)}")
        self._layers = ours if ours is not None else theirs
        return self._layers


def _sglang_aux_layers() -> tuple[int, ...] | None:
    """``--return-aux-hidden-state-layer-ids`` as the running server resolved it, if readable."""
    try:
        from sglang.srt.runtime_context import get_exec

        ids = get_exec().features.return_aux_hidden_state_layer_ids
    except Exception:
        return None
    return None if ids is None else tuple(sorted(int(x) for x in ids))



def _batch_token_ids(batch: Any, real_tokens: int, wanted: Any, prefix_lens: list[int],
                     extend_lens: list[int], offsets: Any) -> Any:
    """The batch's input token ids, one per hidden-state row: SGLang's own ``input_ids``
    (materialized on the device at forward entry, extend rows first), else its pinned
    ``prefill_input_ids_cpu`` staging, else (slow path) each wanted row's fill ids."""
    import torch

    ids = getattr(batch, "input_ids", None)
    if isinstance(ids, torch.Tensor) and ids.dim() == 1:
        n = ids.shape[0]
        if n == real_tokens:
            return ids          # (a slice is a torch dispatch: only where rows are padded)
        if n > real_tokens:
            return ids[:real_tokens]
    staged = getattr(batch, "prefill_input_ids_cpu", None)
    if isinstance(staged, torch.Tensor) and staged.dim() == 1 and staged.numel() >= real_tokens:
        return staged[:real_tokens]
    out = np.zeros(real_tokens, dtype=np.int64)
    for i, req in wanted:
        p, e, o = prefix_lens[i], extend_lens[i], int(offsets[i])
        fill = req.full_untruncated_fill_ids
        out[o:o + e] = np.frombuffer(fill, dtype=np.int64)[p:p + e] \
            if getattr(fill, "typecode", None) == "q" else np.asarray(fill[p:p + e])
    return out


def _final_layer_id(worker: Any) -> int:
    """Index of the last decoder layer (names the ``final_norm`` tensor's source), or -1."""
    for path in (("model_config", "num_hidden_layers"),
                 ("model_runner", "model_config", "num_hidden_layers")):
        obj = worker
        try:
            for name in path:
                obj = getattr(obj, name)
            return int(obj) - 1
        except Exception:
            continue
    return -1
