"""The plugin's producer is closed when its scheduler process ends: SIGTERM to the process
itself (default action: no ``atexit``), SIGINT (``KeyboardInterrupt``), a normal exit (what
a ``ShutdownReq`` leads to). Its segment, ipc socket and claim are gone afterwards, except
that a segment a durable subscriber has not finished reading stays for it. SIGKILL cannot be
handled: the next producer with the same id (or ``hscapture cleanup``) removes it.

Each test runs the real plugin, loaded by SGLang's own ``load_plugins()``, in a real child
process that captures one sample and then waits; the test signals it and checks
``/dev/shm`` and the socket directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("sglang")  # local convenience only: CI installs sglang

from test_sglang_plugin import HERE, _entry_point_path  # noqa: E402

CHILD = textwrap.dedent(r"""
    import json, os, sys, time, warnings
    import torch
    warnings.filterwarnings("ignore")
    sys.path.insert(0, os.environ["SUPPORT_DIR"])
    import sglang.srt.managers.tp_worker as tpw
    holder = {}
    def fake(self, batch, forward_batch=None, **kw):
        return holder["result"]
    tpw.TpModelWorker.forward_batch_generation = fake
    from sglang.srt.plugins import load_plugins
    load_plugins()                                   # what run_scheduler_process does first
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs
    publish(ServerArgs(model_path="dummy", enable_return_aux_hidden_states=True,
                       speculative_algorithm="EAGLE3",
                       return_aux_hidden_state_layer_ids=[29, 2, 16]),
            role="scheduler", ranks=SpawnRanks(world_rank=0))
    from hscapture import Subscriber
    from hscapture.sglang.plugin import installed_hook
    from sglang_support import FakeModelServer
    hook = installed_hook()
    hook.start()                                     # Scheduler.__init__ AFTER hook
    p = hook.producer
    durable = os.environ.get("DURABLE")
    sub = Subscriber(p.endpoint, name=durable or "")
    sub.wait_ready(timeout=10)
    srv = FakeModelServer(lambda *a, **k: None)
    req = srv.new_req("hscap-exit", 9)
    srv.extend([(req, 0, 9)])
    holder["result"] = srv._result
    from types import SimpleNamespace
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    b = ScheduleBatch.init_new([req], SimpleNamespace(device="cpu"), None, None,
                               SimpleNamespace(vocab_size=32000), False,
                               SpeculativeAlgorithm.NONE)
    b.forward_mode = ForwardMode.EXTEND
    b.prefix_lens, b.extend_lens = [0], [9]
    tpw.TpModelWorker.forward_batch_generation(srv.worker, b)
    p.flush()
    if not durable:
        s = sub.get("hscap-exit", timeout=10)
        s.release()
    sub.close()                                      # durable: detached with 1 unread entry
    expect = {}
    if os.environ.get("STAGED"):
        # rows the hook deferred (the stage) when the process ends: a sample whole in the
        # stage, and one whose first chunk was committed and whose last chunk is staged
        import hashlib
        p.stage_interval_s = 3600.0                  # written by close() only, not by time
        hook.pass_log_interval_s = 3600.0            # (the hook's pass log likewise)
        def held():                                  # rows deferred: logged or staged
            return p.stats()["staged_rows"] + hook.stats()["logged_rows"]
        def forward(rows):
            batch = srv.extend(rows)                 # SGLang's batch and the model's result
            holder["result"] = srv._result
            tpw.TpModelWorker.forward_batch_generation(srv.worker, batch)
        whole, split = srv.new_req("hscap-staged", 7), srv.new_req("hscap-split", 12)
        forward([(split, 0, 6)])
        p.flush()                                    # the split sample's first chunk: committed
        staged0 = held()
        forward([(whole, 0, 7), (split, 6, 6)])
        assert held() == staged0 + 2, (p.stats(), hook.stats())
        for req in (whole, split):
            expect[req.rid] = {
                "ids": list(req.origin_input_ids),
                "sha": {k: hashlib.sha256(v.contiguous().view(torch.uint8).numpy().tobytes())
                        .hexdigest() for k, v in srv.expected(req).items()}}
    print("READY " + json.dumps({"segment": p.segment, "endpoint": p.endpoint,
                                 "pid": os.getpid(), "expect": expect}), flush=True)
    import faulthandler                               # a hang in the ending shows its stacks
    faulthandler.dump_traceback_later(45, exit=False)  # (before the parent's 60 s give up)
    how = os.environ["END"]
    if how == "exit":
        sys.stdin.readline()                         # the parent has looked: exit now
        sys.exit(0)                                  # a normal exit (after ShutdownReq)
    while True:                                      # the scheduler's event loop
        time.sleep(0.01)
""")


def _start(tmp_path: Path, sock_dir: Path, unique_id: str, end: str, durable: str = "",
           staged: bool = False) -> tuple[subprocess.Popen, dict]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("HSCAPTURE_") and k != "SGLANG_PLUGINS"}
    extra = _entry_point_path(tmp_path)
    if any(getattr(sys.modules.get(m), "HSCAPTURE_TEST_STUB", False)
           for m in ("triton", "torchvision")):
        extra.append(str(HERE / "_stubs"))
    env["PYTHONPATH"] = os.pathsep.join(extra + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    env.update(SUPPORT_DIR=str(HERE), END=end, DURABLE=durable, STAGED="1" if staged else "",
               HSCAPTURE_ENDPOINT=f"ipc://{sock_dir}/cap.sock",
               HSCAPTURE_PRODUCER_ID=unique_id, HSCAPTURE_RING_BYTES="16M")
    proc = subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    for line in proc.stdout:
        if line.startswith("READY "):
            return proc, json.loads(line[len("READY "):])
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise AssertionError(f"child did not get ready: rc={proc.wait()} {proc.stderr.read()[-4000:]}")


def _gone(info: dict, sock_dir: Path) -> dict[str, bool]:
    return {"segment": not Path(f"/dev/shm/{info['segment']}").exists(),
            "socket": not (sock_dir / "cap.sock").exists(),
            "claim": not (sock_dir / "cap.sock.lock").exists()}


def _end(proc: subprocess.Popen, sig: int | None) -> int:
    if sig is not None:
        proc.send_signal(sig)
    else:
        proc.stdin.write("go\n")                     # END=exit: the child exits on its own
        proc.stdin.flush()
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"the child did not end within 60 s of {sig!r}; its stderr "
                             f"(every thread's stack dumped at 45 s):\n"
                             f"{proc.stderr.read()[-8000:]}") from None
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("end,sig", [("wait", signal.SIGTERM), ("wait", signal.SIGINT),
                                     ("exit", None)])
def test_scheduler_end_removes_segment_socket_and_claim(tmp_path, sock_dir, unique_id, end,
                                                        sig):
    proc, info = _start(tmp_path, sock_dir, unique_id, end)
    assert Path(f"/dev/shm/{info['segment']}").exists() and (sock_dir / "cap.sock").exists()
    rc = _end(proc, sig)
    if sig == signal.SIGTERM:
        assert rc == -signal.SIGTERM, proc.stderr.read()[-3000:]  # still ends by SIGTERM
    elif sig == signal.SIGINT:
        assert rc != 0                                            # KeyboardInterrupt
    else:
        assert rc == 0, proc.stderr.read()[-3000:]
    assert _gone(info, sock_dir) == {"segment": True, "socket": True, "claim": True}


def test_sigterm_keeps_a_segment_a_durable_subscriber_has_not_read(tmp_path, sock_dir,
                                                                   unique_id):
    from hscapture import Subscriber

    name = f"drain-{unique_id}"
    proc, info = _start(tmp_path, sock_dir, unique_id, "wait", durable=name)
    assert _end(proc, signal.SIGTERM) == -signal.SIGTERM
    assert _gone(info, sock_dir) == {"segment": False, "socket": True, "claim": True}
    # the returning durable subscriber gets the sample the producer committed before it died
    with Subscriber(info["endpoint"], name=name) as sub:
        s = sub.get("hscap-exit", timeout=20)
        assert s.num_tokens == 9
        s.release()
        sub.unsubscribe()
    from hscapture.ring import cleanup_stale

    cleanup_stale(info["segment"])
    assert not Path(f"/dev/shm/{info['segment']}").exists()


def test_sigkill_leaves_the_segment_for_the_next_start_to_remove(tmp_path, sock_dir,
                                                                 unique_id):
    proc, info = _start(tmp_path, sock_dir, unique_id, "wait")
    assert _end(proc, signal.SIGKILL) == -signal.SIGKILL
    assert Path(f"/dev/shm/{info['segment']}").exists()      # nothing could run
    proc2, info2 = _start(tmp_path, sock_dir, unique_id, "exit")   # the next start
    assert _end(proc2, None) == 0
    assert not Path(f"/dev/shm/{info['segment']}").exists()
    assert _gone(info2, sock_dir) == {"segment": True, "socket": True, "claim": True}


def _sha(t) -> str:
    import hashlib

    import torch

    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def test_sigterm_writes_the_staged_rows_and_a_returning_durable_subscriber_gets_them_exact(
        tmp_path, sock_dir, unique_id):
    """Rows the hook staged (deferred captures, not yet in the ring) when SIGTERM comes are
    written by the plugin's close: the whole staged sample and the one whose last chunk was
    staged arrive exact, after the sample committed before them."""
    from hscapture import Subscriber

    name = f"drain-{unique_id}"
    proc, info = _start(tmp_path, sock_dir, unique_id, "wait", durable=name, staged=True)
    assert _end(proc, signal.SIGTERM) == -signal.SIGTERM
    with Subscriber(info["endpoint"], name=name) as sub:
        assert sub.get("hscap-exit", timeout=20).num_tokens == 9
        for rid, want in info["expect"].items():
            s = sub.get(rid, timeout=20)
            assert s.token_ids.tolist() == want["ids"], rid
            assert {k: _sha(v) for k, v in s.tensors.items()} == want["sha"], rid
        st = sub.stats()
        assert not st["incomplete"] and not st["dropped"] and not st["lost"], st
        sub.unsubscribe()
    from hscapture.ring import cleanup_stale

    cleanup_stale(info["segment"])


def test_sigkill_with_rows_staged_reports_the_sample_whose_first_chunk_was_committed(
        tmp_path, sock_dir, unique_id):
    """SIGKILL cannot be handled: staged rows were never committed and are gone with the
    process (as copies in flight are). A sample with a committed chunk is still reported
    incomplete by rid to the returning durable subscriber, never delivered short."""
    from hscapture import Subscriber

    name = f"drain-{unique_id}"
    proc, info = _start(tmp_path, sock_dir, unique_id, "wait", durable=name, staged=True)
    assert _end(proc, signal.SIGKILL) == -signal.SIGKILL
    with Subscriber(info["endpoint"], name=name, producer_timeout_s=1.0) as sub:
        assert sub.get("hscap-exit", timeout=20).num_tokens == 9
        deadline = time.monotonic() + 30
        while "hscap-split" not in sub.stats()["incomplete"] and time.monotonic() < deadline:
            assert sub.poll(0.05) is None, "a sample of the killed producer was delivered"
        st = sub.stats()
        assert "hscap-split" in st["incomplete"], st
        sub.unsubscribe()
    from hscapture.ring import cleanup_stale

    cleanup_stale(info["segment"])
