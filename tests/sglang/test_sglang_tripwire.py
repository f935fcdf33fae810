"""Tripwire: every SGLang name, field and behaviour the adapter relies on, checked against
the installed SGLang. An upgrade that moves one fails here instead of corrupting data."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

pytest.importorskip("sglang")  # local convenience only: CI installs sglang


def test_plugin_machinery():
    import sglang.srt.plugins as plugins
    from sglang.srt.managers import scheduler
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType, _wrap_fn

    assert plugins.GENERAL_PLUGINS_GROUP == "sglang.srt.plugins"
    assert "SGLANG_PLUGINS" in inspect.getsource(plugins.load_plugins_by_group)
    assert "HookRegistry.apply_hooks()" in inspect.getsource(plugins.load_plugins)
    assert callable(HookRegistry.register) and HookType.AFTER.value == "after"
    # AFTER wrapper: hook(result, *args, **kwargs); a None return keeps the result
    calls = []
    wrapped = _wrap_fn(lambda *a, **k: "r", lambda res, *a, **k: calls.append((res, a, k)),
                       HookType.AFTER)
    assert wrapped("w", "b", x=1) == "r" and calls == [("r", ("w", "b"), {"x": 1})]
    # plugins load first thing in every scheduler process
    src = inspect.getsource(scheduler.run_scheduler_process)
    assert src.index("load_plugins()") < src.index("Scheduler(")
    assert callable(getattr(scheduler.Scheduler, "process_pending_chunked_abort", None))


def test_hook_target_signature():
    from sglang.srt.managers.tp_worker import TpModelWorker

    params = list(inspect.signature(TpModelWorker.forward_batch_generation).parameters)
    assert params[:3] == ["self", "batch", "forward_batch"]


def test_launcher_hooks():
    from sglang.srt.entrypoints import http_server
    from sglang.srt.managers import scheduler

    assert "run_scheduler_process_func" in inspect.signature(http_server.launch_server).parameters
    assert callable(scheduler.run_scheduler_process)


def test_batch_and_request_fields():
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    fields = {f.name for f in dataclasses.fields(ScheduleBatch)}
    assert {"reqs", "forward_mode", "prefix_lens", "extend_lens", "decoding_reqs"} <= fields
    for name in ("EXTEND", "MIXED", "DECODE", "IDLE"):
        assert hasattr(ForwardMode, name)
    init = inspect.getsource(Req.__init__)
    for attr in ("self.rid =", "self.origin_input_ids =", "self.full_untruncated_fill_ids =",
                 "self.extend_end", "self.retraction_count = 0", "self.sampling_params ="):
        assert attr in init, attr
    assert "self.retraction_count += 1" in inspect.getsource(Req.reset_for_retract)
    assert "self.to_finish = FINISH_ABORT" in inspect.getsource(Req.set_finish_with_abort)
    assert "extend_end - self.prefix_len" in inspect.getsource(Req.extend_len.fget)
    # prepare_for_extend / mix_with_running set the lists the hook slices by
    ext = inspect.getsource(ScheduleBatch.prepare_for_extend)
    assert "prefix_lens = [r.prefix_len for r in reqs]" in ext
    assert "extend_lens = [r.extend_len for r in reqs]" in ext
    mix = inspect.getsource(ScheduleBatch.mix_with_running)
    assert "self.extend_lens = self.extend_lens + [1] * running_bs" in mix
    # the forward log's token count (benchmarks only; hscapture.sglang.timing.ForwardLog)
    assert "extend_num_tokens" in fields
    assert "self.extend_num_tokens = extend_num_tokens" in ext
    assert "self.extend_num_tokens = self.extend_num_tokens + running_bs" in mix
    assert "self.decoding_reqs = self.reqs" in inspect.getsource(
        ScheduleBatch.convert_decode_to_extend)
    from sglang.srt.sampling.sampling_params import SamplingParams

    assert "custom_params" in inspect.signature(SamplingParams).parameters


def test_output_fields():
    from sglang.srt.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
    from sglang.srt.managers.utils import GenerationBatchResult

    out = {f.name for f in dataclasses.fields(LogitsProcessorOutput)}
    assert {"hidden_states", "last_hidden_states", "hidden_states_token_indices"} <= out
    res = {f.name for f in dataclasses.fields(GenerationBatchResult)}
    assert {"logits_output", "can_run_cuda_graph"} <= res
    # capture-only mode packs aux states and keeps the post-norm last layer
    src = inspect.getsource(LogitsProcessor._get_hidden_states_to_store)
    assert "pack_aux_hidden_states(aux_hidden_states)" in src
    assert "keep_last_hidden_states" in inspect.getsource(
        LogitsProcessor._get_last_hidden_states_to_store)


def test_layer_convention_and_ascending_packing():
    from sglang.srt.models import llama

    src = inspect.getsource(llama.LlamaForCausalLM.set_eagle3_layers_to_capture)
    # explicit id L captures the input of layer L+1 == output of layer L (HF hidden_states[L+1])
    assert "[val + 1 for val in layer_ids]" in src
    loop = inspect.getsource(llama.LlamaModel.forward)
    assert "layers_to_capture" in loop  # captured inside the layer loop: ascending order


def test_runtime_context_names(published):
    from sglang.srt.runtime_context import get_exec, get_parallel

    published(layers=[16, 2], tp_size=2, world_rank=1)
    p = get_parallel()
    assert (p.attn_tp_rank, p.attn_cp_rank, p.dp_rank) == (1, 0, None)
    assert get_exec().features.return_aux_hidden_state_layer_ids == [16, 2]
    assert get_exec().features.return_hidden_states_mode == "full"
