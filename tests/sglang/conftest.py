"""Fixtures for the SGLang adapter tests: real SGLang objects on a CPU-only machine.

CI installs sglang 0.5.23 (``pip install --no-deps -r requirements-sglang-test.txt``).
Two of its import-time dependencies cannot be installed usefully on a CPU machine:
``triton`` (unconditional import, ~290 MB wheel) and ``torchvision`` (PyPI's CUDA build
fails to import beside CPU torch). When either is not importable, the permissive stubs in
``_stubs/`` are put first on ``sys.path`` (and on ``PYTHONPATH`` for spawned processes).
No kernel or image transform runs in these tests.
"""

from __future__ import annotations

import importlib
import os
import sys
import uuid
from pathlib import Path

import pytest

STUBS = Path(__file__).parent / "_stubs"
STUBBED: list[str] = []


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
        return True
    except Exception:
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[mod]
        return False


def _install_stubs() -> None:
    need = [name for name in ("triton", "torchvision") if not _importable(name)]
    if not need:
        return
    sys.path.insert(0, str(STUBS))
    STUBBED.extend(need)  # child processes get STUBS on PYTHONPATH from the tests that spawn
    for name in need:
        importlib.import_module(name)


_install_stubs()
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def sock_dir(tmp_path: Path) -> Path:
    d = tmp_path / "sock"
    d.mkdir(mode=0o700)
    return d


@pytest.fixture
def unique_id() -> str:
    return f"t{os.getpid()}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def published():
    """Publish a real SGLang runtime context (capture-only mode) for one process rank.

    ``published(tp_size=2, world_rank=1, dp_rank=None, layers=[2, 16, 29], **fields)``.
    Reset on exit, like sglang's own ``test_utils.published_topology``.
    """
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    def _publish(*, world_rank: int = 0, dp_rank: int | None = None,
                 layers: list[int] | None = None, **fields):
        reset_context()
        args = ServerArgs(model_path="dummy", enable_return_aux_hidden_states=True,
                          speculative_algorithm="EAGLE3",
                          return_aux_hidden_state_layer_ids=layers, **fields)
        publish(args, role="scheduler", ranks=SpawnRanks(world_rank=world_rank,
                                                          dp_rank=dp_rank))
        return args

    yield _publish
    reset_context()


@pytest.fixture
def rig(published, sock_dir, unique_id):
    """``rig(...) -> (hook, subscriber, FakeModelServer)``: a published rank-0 context, the hook
    with a real producer (started as at server start-up) and, unless ``subscribe=False``, a
    subscriber attached before any request. Everything is closed at the end of the test."""
    from hscapture import Subscriber
    from hscapture.sglang.config import load_config
    from hscapture.sglang.hook import SGLangCaptureHook
    from sglang_support import FakeModelServer

    made = []

    def _rig(*, publish_kwargs=None, env=None, subscribe=True):
        published(layers=[29, 2, 16], **(publish_kwargs or {}))
        # each forward processed at once (HSCAPTURE_PASS_LOG_MS=0), so a test reads the
        # hook's state right after a forward; the pass log's own tests turn it on
        cfg_env = {"HSCAPTURE_ENDPOINT": f"ipc://{sock_dir}/cap-{{dp_rank}}.sock",
                   "HSCAPTURE_PRODUCER_ID": unique_id, "HSCAPTURE_RING_BYTES": "64M",
                   "HSCAPTURE_PASS_LOG_MS": "0"}
        cfg_env.update(env or {})
        hook = SGLangCaptureHook(load_config(cfg_env))
        hook.start()  # what the Scheduler.__init__ AFTER hook does
        sub = None
        if subscribe and hook.producer is not None:
            sub = Subscriber(hook.producer.endpoint, incomplete_timeout_s=30)
            sub.wait_ready(timeout=10)
        made.append((hook, sub))
        return hook, sub, FakeModelServer(hook)

    yield _rig
    for hook, sub in made:
        if sub is not None:
            sub.close()
        hook.close()
