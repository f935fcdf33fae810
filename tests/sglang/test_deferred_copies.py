"""The SGLang hook defers its captures' device-to-host copies to the scheduling step.

Why (``Producer.defer_device_copies``): a device-to-host copy waits in the copy engine behind
every one issued before it, so copies issued during a forward pass delay SGLang's own result
read-back of that pass. The hook turns deferral on where the plugin installed its step hook
(``SGLangCaptureHook.sweep`` on ``process_pending_chunked_abort``, which runs after SGLang
queued the read-back) and issues the copies there, at EVERY step. The copies themselves run
on the GPU only (tests/test_gpu.py); here the real producer's two methods are spied on.
"""
from __future__ import annotations

import pytest

pytest.importorskip("sglang")


@pytest.fixture
def spied(monkeypatch):
    """Producer.defer_device_copies answers True (as on the native CUDA path) and both
    methods record their calls."""
    from hscapture.producer import Producer

    calls = {"defer": [], "flush": 0, "after": [], "max_bytes": []}

    def defer(self, on=True):
        calls["defer"].append(on)
        return True

    def flush(self, after_event=0, max_bytes=0):
        calls["flush"] += 1
        calls["after"].append(after_event)
        calls["max_bytes"].append(max_bytes)
        return 0

    monkeypatch.setattr(Producer, "defer_device_copies", defer)
    monkeypatch.setattr(Producer, "flush_device_copies", flush)
    return calls


def _hook(published, sock_dir, unique_id, step_hook, **env):
    from hscapture.sglang.config import load_config
    from hscapture.sglang.hook import SGLangCaptureHook

    published(layers=[29, 2, 16])
    cfg = {"HSCAPTURE_ENDPOINT": f"ipc://{sock_dir}/cap-{{dp_rank}}.sock",
           "HSCAPTURE_PRODUCER_ID": unique_id, "HSCAPTURE_RING_BYTES": "64M", **env}
    hook = SGLangCaptureHook(load_config(cfg))
    hook.step_hook = step_hook
    hook.start()
    return hook


def test_with_the_step_hook_installed_copies_are_deferred_and_every_step_flushes_them(
        published, sock_dir, unique_id, spied):
    from sglang_support import FakeModelServer
    from test_sglang_hook import check
    from hscapture import Subscriber

    hook = _hook(published, sock_dir, unique_id, step_hook=True)
    sub = Subscriber(hook.producer.endpoint)
    try:
        sub.wait_ready(timeout=10)
        assert spied["defer"] == [True]
        hook.sweep()                      # nothing in flight: still a flush
        hook.sweep()
        assert spied["flush"] == 2
        srv = FakeModelServer(hook)
        r = srv.new_req("hscap-dfr-0", 9)
        srv.extend([(r, 0, 9)])
        hook.sweep()
        assert spied["flush"] == 3
        hook.producer.flush(timeout_s=10)
        check(sub.get(r.rid, timeout=10), srv, r)
    finally:
        sub.close()
        hook.close()


class _Event:
    """What the hook reads of SGLang's ``copy_done`` (a ``torch.cuda.Event``): its handle."""

    def __init__(self, handle):
        self.cuda_event = handle


@pytest.mark.parametrize("env, want", [({"HSCAPTURE_COPIES_AFTER_READBACK": "1"}, 0xBEEF),
                                       ({"HSCAPTURE_COPIES_AFTER_READBACK": "0"}, 0), ({}, 0)])
def test_each_step_flushes_the_copies_behind_the_latest_result_read_back(
        published, sock_dir, unique_id, spied, env, want):
    """The overlap scheduler's step: its ``result_queue`` ends with the batch whose read-back
    it queued last (``GenerationBatchResult.copy_done``, recorded behind that copy). The flush
    passes that event's handle (the copies start once the read-back completed); 0 where there
    is none to wait for: no queue (the normal loop), an event never recorded (handle 0),
    SGLang's async read-back (``HostCopyDone``: no CUDA event), or the switch off (its default
    until a GPU run has measured it)."""
    import collections
    import types

    from sglang.srt.managers.utils import GenerationBatchResult

    hook = _hook(published, sock_dir, unique_id, step_hook=True, **env)
    try:
        def step(*results):
            sched = types.SimpleNamespace(result_queue=collections.deque(
                (None, GenerationBatchResult(copy_done=r)) for r in results))
            hook.sweep(None, sched)       # an AFTER hook: (its target's result, self, ...)
            return spied["after"][-1]

        assert step(_Event(0xAAAA), _Event(0xBEEF)) == want
        assert step() == 0                                    # nothing queued
        assert step(_Event(0)) == 0                           # never recorded
        assert step(types.SimpleNamespace(done=True)) == 0    # no CUDA event
        hook.sweep(None, types.SimpleNamespace())             # the normal loop: no queue
        hook.sweep()
        assert spied["after"][-2:] == [0, 0]
    finally:
        hook.close()


@pytest.mark.parametrize("env, want", [({"HSCAPTURE_COPY_STEP_BYTES": "48M"}, 48 << 20),
                                       ({"HSCAPTURE_COPY_STEP_BYTES": "0"}, 0), ({}, 0)])
def test_each_step_issues_at_most_the_configured_bytes_of_the_deferred_copies(
        published, sock_dir, unique_id, spied, env, want):
    """``HSCAPTURE_COPY_STEP_BYTES`` is the budget every step's flush passes (0, the default:
    everything queued); the native flush's split of the copies is tests/test_gpu.py's."""
    hook = _hook(published, sock_dir, unique_id, step_hook=True, **env)
    try:
        hook.sweep()
        hook.sweep()
        assert spied["max_bytes"] == [want, want]
    finally:
        hook.close()


def test_the_benchmark_mode_alt_with_step_sets_the_budget_for_that_mode_alone(
        published, sock_dir, unique_id, spied, tmp_path, monkeypatch):
    """``alt=N,step=BYTES`` (bench_server --alt-step): every step's flush passes BYTES for as
    long as the mode lasts, so windows with and without a budget compare inside one server;
    ``alt=N`` alone, another mode, or a malformed BYTES keeps the configured one. Read at the
    forward hook, as every mode is."""
    from sglang_support import FakeModelServer
    from test_sglang_hook import set_mode

    mode = tmp_path / "mode"
    monkeypatch.setenv("HSCAPTURE_EXPERIMENT_FILE", str(mode))
    hook = _hook(published, sock_dir, unique_id, step_hook=True,
                 HSCAPTURE_COPY_STEP_BYTES="8M")
    try:
        srv = FakeModelServer(hook)
        for k, (name, want) in enumerate((("alt=1,log=0,step=48M", 48 << 20),
                                          ("alt=1,step=0", 0), ("alt=1,step=2K", 2048),
                                          ("alt=1", 8 << 20), ("alt=1,step=lots", 8 << 20),
                                          ("grace=1,step=48M", 8 << 20), ("", 8 << 20))):
            set_mode(hook, mode, name)
            r = srv.new_req(f"hscap-step-{k}", 4)
            srv.extend([(r, 0, 4)])
            hook.sweep()
            assert spied["max_bytes"][-1] == want, name
    finally:
        hook.close()


def test_a_malformed_copy_step_budget_is_refused_by_name():
    from hscapture.errors import CaptureConfigError
    from hscapture.sglang.config import load_config

    with pytest.raises(CaptureConfigError, match="HSCAPTURE_COPY_STEP_BYTES.*'lots'"):
        load_config({"HSCAPTURE_COPY_STEP_BYTES": "lots"})


@pytest.mark.parametrize("step_hook, env", [(False, {}), (True, {"HSCAPTURE_DEFER_COPIES": "0"})])
def test_without_the_step_hook_or_with_deferral_off_copies_are_issued_at_once(
        published, sock_dir, unique_id, spied, step_hook, env):
    hook = _hook(published, sock_dir, unique_id, step_hook=step_hook, **env)
    try:
        assert spied["defer"] == []
        hook.sweep()
        assert spied["flush"] == 0
    finally:
        hook.close()


def test_the_plugin_marks_the_hook_when_it_installs_the_step_hook():
    from hscapture.sglang import plugin

    class Registry:
        registered: list = []

        @classmethod
        def register(cls, target, fn, kind):
            cls.registered.append(target)

    class Hook:
        step_hook = False

        def start(self, *a, **k):
            pass

        def sweep(self, *a, **k):
            pass

    hook = Hook()
    plugin._register_sweep(hook, Registry, type("HT", (), {"AFTER": "after"}))
    assert plugin.SWEEP_TARGET in Registry.registered
    assert hook.step_hook is True
