"""A CPU stand-in for SGLang's forward pass, driving the real hook through real objects.

What is real: ``Req`` (built, re-rounded, retracted and aborted with its own methods),
``ScheduleBatch`` (``init_new``), ``ForwardMode``, ``SamplingParams``,
``LogitsProcessorOutput``, ``GenerationBatchResult``, SGLang's runtime context (published by
the ``published`` fixture) and SGLang's own AFTER-hook wrapper (``hook_registry._wrap_fn``).

What is fabricated: the model. ``prepare_for_extend`` / ``mix_with_running`` need KV pools,
so the batch fields they set (``forward_mode``, ``prefix_lens``, ``extend_lens``,
``decoding_reqs``, ``req.prefix_len``, ``req.extend_end``) are set here exactly as those
methods set them (schedule_batch.py, 0.5.23). The "model output" is, for every request,
a ground-truth tensor ``truth[rid][position] -> [K+1, H]`` (K aux layers, then the final
norm), sliced per row and packed the way SGLang packs capture-only output:
``hidden_states = [T, K*H]`` in ascending layer order, ``last_hidden_states = [T, H]``.
"""

from __future__ import annotations

from array import array
from types import SimpleNamespace
from typing import Any, Iterable, Sequence

import numpy as np
import torch

VOCAB = 32000
LAYERS = (2, 16, 29)          # as --return-aux-hidden-state-layer-ids 29 2 16 resolves: sorted
NUM_LAYERS = 32
K = len(LAYERS)
H = 16


class FakeModelServer:
    """Runs "forward passes" over real SGLang batches through the real AFTER wrapper."""

    def __init__(self, hook: Any, *, dtype: torch.dtype = torch.bfloat16, seed: int = 0):
        from sglang.srt.plugins.hook_registry import HookType, _wrap_fn

        self.hook = hook
        self.dtype = dtype
        self.gen = np.random.default_rng(seed)
        self.tgen = torch.Generator().manual_seed(seed)
        self.truth: dict[str, torch.Tensor] = {}
        self.worker = SimpleNamespace(model_config=SimpleNamespace(num_hidden_layers=NUM_LAYERS))
        self._result: Any = None
        self.calls = 0
        #: what ``extend`` hands out when its call does not say: CUDA-graph outputs or not
        self.graph = False

        def forward_batch_generation(worker, batch, forward_batch=None, pp_proxy_tensors=None,
                                     is_verify=False, skip_attn_backend_init=None, *,
                                     capture_hidden_mode=None, return_kv_loc_plan=False):
            self.calls += 1
            return self._result

        self.forward_batch_generation = _wrap_fn(forward_batch_generation, hook,
                                                 HookType.AFTER)

    # -- requests ------------------------------------------------------------------------

    def new_req(self, rid: str, n: int, *, custom_params: dict | None = None,
                max_new_tokens: int = 1) -> Any:
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        ids = array("q", self.gen.integers(0, VOCAB, n).tolist())
        req = Req(rid, "", ids, SamplingParams(max_new_tokens=max_new_tokens,
                                                custom_params=custom_params))
        req.init_next_round_input(None)  # what the scheduler does before admission
        self.truth[rid] = torch.randn(n + 64, K + 1, H, generator=self.tgen)
        return req

    def expected(self, req: Any, n: int | None = None) -> dict[str, torch.Tensor]:
        """What a complete sample of ``req`` must hold (first ``n`` positions)."""
        from hscapture import layer_name

        n = len(req.origin_input_ids) if n is None else n
        t = self.truth[req.rid][:n].to(self.dtype)
        out = {layer_name(L, "residual"): t[:, j] for j, L in enumerate(LAYERS)}
        out["final_norm"] = t[:, K]
        return out

    # -- forward passes --------------------------------------------------------------------

    def extend(self, rows: Sequence[tuple[Any, int, int]], decode: Iterable[Any] = (), *,
               pad: int = 0, graph: bool | None = None, mode: str | None = None,
               last_hidden: bool = True, hidden_override: Any = "unset",
               last_override: Any = "unset") -> Any:
        """One EXTEND (or MIXED, with ``decode`` rows) forward over ``rows``:
        ``(req, prefix_len, extend_len)`` each, as PrefillAdder + prepare_for_extend set them.
        ``hidden_override`` / ``last_override`` replace the forward's aux / last hidden
        states (a malformed model output).
        """
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        graph = self.graph if graph is None else graph
        reqs = [r for r, _, _ in rows]
        for req, prefix, ext in rows:
            req.prefix_len = prefix          # PrefillAdder / init_next_round_input
            req.extend_end = prefix + ext
        batch = ScheduleBatch.init_new(reqs, SimpleNamespace(device="cpu"), None, None,
                                       SimpleNamespace(vocab_size=VOCAB), False,
                                       SpeculativeAlgorithm.NONE)
        # prepare_for_extend (schedule_batch.py): forward_mode, prefix_lens, extend_lens
        batch.forward_mode = ForwardMode.EXTEND
        batch.prefix_lens = [r.prefix_len for r in reqs]
        batch.extend_lens = [r.extend_len for r in reqs]
        batch.extend_num_tokens = sum(batch.extend_lens)
        parts = [self.truth[r.rid][p:p + e] for r, p, e in rows]
        decode = list(decode)
        if decode:
            # mix_with_running: decode rows are 1-token extends at seq_len - 1, listed in
            # decoding_reqs; req.prefix_len is left at the last prefill.
            seq_lens = [len(r.full_untruncated_fill_ids) for r in decode]
            for r, s in zip(decode, seq_lens):
                r.extend_end = s
            batch.forward_mode = ForwardMode.MIXED
            batch.reqs = reqs + decode
            batch.prefix_lens = batch.prefix_lens + [s - 1 for s in seq_lens]
            batch.extend_lens = batch.extend_lens + [1] * len(decode)
            batch.decoding_reqs = decode
            batch.extend_num_tokens += len(decode)      # mix_with_running: + running_bs
            parts += [self.truth[r.rid][s - 1:s] for r, s in zip(decode, seq_lens)]
        if mode is not None:
            batch.forward_mode = getattr(ForwardMode, mode)
        # resolve_forward_inputs (overlap_utils.py): the extend rows' ids, then decode rows'
        ids = [int(t) for r, p, e in rows for t in list(r.full_untruncated_fill_ids)[p:p + e]]
        ids += [int(list(r.full_untruncated_fill_ids)[s - 1]) for r, s in
                zip(decode, [len(r.full_untruncated_fill_ids) for r in decode])]
        batch.input_ids = torch.tensor(ids, dtype=torch.int64)
        full = torch.cat(parts)
        if pad:  # DP-attention / MLP-sync padding rows follow the real rows
            full = torch.cat([full, torch.full((pad, K + 1, H), 9999.0)])
        self._result = self._result_for(full, len(batch.reqs), graph, last_hidden,
                                        hidden_override, last_override)
        out = self.forward_batch_generation(self.worker, batch)
        assert out is self._result, "the AFTER hook must not replace SGLang's result"
        return batch

    def decode(self, reqs: Sequence[Any]) -> Any:
        """A DECODE forward (stale prefix_lens/extend_lens left from the last extend)."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        batch = ScheduleBatch.init_new(list(reqs), SimpleNamespace(device="cpu"), None, None,
                                       SimpleNamespace(vocab_size=VOCAB), False,
                                       SpeculativeAlgorithm.NONE)
        batch.forward_mode = ForwardMode.DECODE
        batch.prefix_lens = [0] * len(reqs)      # stale garbage that must not be read
        batch.extend_lens = [5] * len(reqs)
        full = torch.randn(len(reqs), K + 1, H, generator=self.tgen)
        self._result = self._result_for(full, len(reqs), True, True, "unset")
        out = self.forward_batch_generation(self.worker, batch)
        assert out is self._result
        return batch

    def _result_for(self, full: torch.Tensor, bs: int, graph: bool, last_hidden: bool,
                    hidden_override: Any, last_override: Any = "unset") -> Any:
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult

        t = full.shape[0]
        aux = full[:, :K].reshape(t, K * H).to(self.dtype).contiguous()
        last = full[:, K].to(self.dtype).contiguous() if last_hidden else None
        if last_override != "unset":
            last = last_override
        lo = LogitsProcessorOutput(next_token_logits=torch.zeros(bs, 8),
                                   hidden_states=aux if hidden_override == "unset"
                                   else hidden_override,
                                   last_hidden_states=last)
        return GenerationBatchResult(logits_output=lo, can_run_cuda_graph=graph)


def chunks(n: int, size: int) -> list[tuple[int, int]]:
    return [(s, min(size, n - s)) for s in range(0, n, size)]
