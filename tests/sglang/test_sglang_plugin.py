"""Entry point, configuration, version gate and fallback launcher of the SGLang adapter."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("sglang")  # local convenience only: CI installs sglang

from hscapture.errors import CaptureConfigError, UnsupportedEngineError  # noqa: E402
from hscapture.sglang import HOOK_TARGET  # noqa: E402
from hscapture.sglang.config import endpoint_for_dp_rank, load_config  # noqa: E402
from hscapture.sglang.plugin import check_sglang_version  # noqa: E402

HERE = Path(__file__).parent


# -- config ------------------------------------------------------------------------------

def test_inert_unless_configured():
    assert not load_config({}).enabled
    assert load_config({"HSCAPTURE_ENABLE": "1"}).enabled
    assert load_config({"HSCAPTURE_ENDPOINT": "ipc:///tmp/x.sock"}).enabled
    assert not load_config({"HSCAPTURE_ENDPOINT": "ipc:///tmp/x.sock",
                            "HSCAPTURE_ENABLE": "0"}).enabled


def test_config_values_and_errors():
    c = load_config({"HSCAPTURE_ENABLE": "1", "HSCAPTURE_LAYERS": "29, 2 16",
                     "HSCAPTURE_RING_BYTES": "2G", "HSCAPTURE_RID_PREFIX": "cap/"})
    assert c.layers == (2, 16, 29) and c.ring_bytes == 2 << 30 and c.rid_prefix == "cap/"
    assert c.publish_interval_s == 0.02
    for raw, want in (("0", 0.0), ("5", 0.005), (" 12.5 ", 0.0125), ("", 0.02)):
        got = load_config({"HSCAPTURE_PUBLISH_INTERVAL_MS": raw}).publish_interval_s
        assert got == pytest.approx(want), raw
    for bad in ({"HSCAPTURE_LAYERS": "1,1"}, {"HSCAPTURE_LAYERS": "a"},
                {"HSCAPTURE_RING_BYTES": "lots"}, {"HSCAPTURE_FULL_POLICY": "block"},
                {"HSCAPTURE_ENABLE": "maybe"}, {"HSCAPTURE_PRODUCER_ID": "a/b"}):
        with pytest.raises(CaptureConfigError):
            load_config(bad)
    for raw in ("-1", "soon", "nan", "inf", "10001"):
        with pytest.raises(CaptureConfigError, match=r"HSCAPTURE_PUBLISH_INTERVAL_MS: expected "
                                                     r"milliseconds from 0 to 10000, found"):
            load_config({"HSCAPTURE_PUBLISH_INTERVAL_MS": raw})
    # the pass log: on, 50 ms, unless turned off (0)
    assert c.pass_log_interval_s == 0.05
    assert load_config({"HSCAPTURE_PASS_LOG_MS": "0"}).pass_log_interval_s == 0.0
    for raw in ("-1", "later", "10001"):
        with pytest.raises(CaptureConfigError, match=r"HSCAPTURE_PASS_LOG_MS: expected "
                                                     r"milliseconds from 0 to 10000, found"):
            load_config({"HSCAPTURE_PASS_LOG_MS": raw})


@pytest.mark.parametrize("env, says", [
    # fault hunt 5 (2026-12-05): each was accepted, then hung the scheduler (inf), behaved
    # as no wait (nan, -3), lost every sample unnamed (a layer id past int32), failed every
    # capture (an undecodable byte), or failed untyped in the ring's constructor (a size)
    ({"HSCAPTURE_WAIT_TIMEOUT_S": "inf"}, "HSCAPTURE_WAIT_TIMEOUT_S: expected seconds from 0 to 60"),
    ({"HSCAPTURE_WAIT_TIMEOUT_S": "nan"}, "HSCAPTURE_WAIT_TIMEOUT_S"),
    ({"HSCAPTURE_WAIT_TIMEOUT_S": "-3"}, "HSCAPTURE_WAIT_TIMEOUT_S"),
    ({"HSCAPTURE_LAYERS": "2,16,2147483648"}, "HSCAPTURE_LAYERS: expected distinct layer ids from 0 to 2147483647"),
    ({"HSCAPTURE_MODEL": "/models/caf\udce9-llama"}, "HSCAPTURE_MODEL: expected UTF-8 text"),
    ({"HSCAPTURE_CONVENTION": "x\udcff"}, "HSCAPTURE_CONVENTION: expected UTF-8 text"),
    ({"HSCAPTURE_RING_BYTES": "99999999999999999999999"}, "HSCAPTURE_RING_BYTES: expected 1 byte to 1024 GiB"),
])
def test_a_setting_out_of_range_is_refused_at_start_naming_its_variable(env, says):
    with pytest.raises(CaptureConfigError, match=re.escape(says)):
        load_config(env)


def test_a_producer_refuses_what_no_ring_entry_can_carry(tmp_path):
    import torch

    from hscapture import Producer

    ep = f"ipc://{tmp_path}/p.sock"
    for kw, says in (({"wait_timeout_s": float("inf")}, "wait_timeout_s: expected seconds"),
                     ({"model": "caf\udce9"}, "model 'caf"),
                     ({"convention": "\udcff"}, "convention")):
        with pytest.raises(CaptureConfigError, match=says):
            Producer(ep, producer_id="bad-settings", capacity=1 << 20, **kw)
    with Producer(ep, producer_id="bad-layers", capacity=1 << 20) as p:
        with pytest.raises(CaptureConfigError, match="layers: expected ids in"):
            p.capture("hscap-x", [torch.zeros(2, 8)], layers=[1 << 31],
                      token_ids=torch.arange(2))


def test_endpoint_per_dp_rank():
    assert endpoint_for_dp_rank(None, 3) is None
    assert endpoint_for_dp_rank("ipc:///r/cap-{dp_rank}.sock", 2) == "ipc:///r/cap-2.sock"
    assert endpoint_for_dp_rank("ipc:///r/cap.sock", 0) == "ipc:///r/cap.sock"
    assert endpoint_for_dp_rank("ipc:///r/cap.sock", 2) == "ipc:///r/cap-dp2.sock"
    assert endpoint_for_dp_rank("tcp://127.0.0.1:5600", 3) == "tcp://127.0.0.1:5603"


def test_opt_in_rules():
    from types import SimpleNamespace as NS

    c = load_config({"HSCAPTURE_ENABLE": "1"})
    assert c.wants(NS(rid="hscap-1", sampling_params=NS(custom_params=None)))
    assert c.wants(NS(rid="x", sampling_params=NS(custom_params={"hscapture": True})))
    assert not c.wants(NS(rid="x", sampling_params=NS(custom_params={"hscapture": False})))
    assert not c.wants(NS(rid="HEALTH_CHECK_1", sampling_params=NS(custom_params=None)))
    off = load_config({"HSCAPTURE_ENABLE": "1", "HSCAPTURE_RID_PREFIX": "",
                       "HSCAPTURE_PARAM": ""})
    assert not off.wants(NS(rid="hscap-1", sampling_params=NS(custom_params={"hscapture": 1})))


# -- version gate ------------------------------------------------------------------------

def test_version_gate():
    assert check_sglang_version() == "0.5.23"  # the installed one (CI pins it)
    for ok in ("0.5.23", "0.5.23.post1", "0.5.30", "0.5.99rc1"):
        assert check_sglang_version(ok) == ok
    for bad in ("0.5.22", "0.6.0", "0.6.0rc1", "1.0", "garbage"):
        with pytest.raises(UnsupportedEngineError):
            check_sglang_version(bad)


def test_unsupported_version_logs_and_stays_inert(monkeypatch, caplog):
    from hscapture.sglang import plugin

    def refuse(version=None):
        raise UnsupportedEngineError("sglang 0.6.1 is not supported")

    monkeypatch.setenv("HSCAPTURE_ENABLE", "1")
    monkeypatch.setattr(plugin, "check_sglang_version", refuse)
    monkeypatch.setattr(plugin, "_HOOK", None)
    plugin.register()  # must not raise
    assert plugin.installed_hook() is None
    assert "not supported" in caplog.text


def test_bad_config_logs_and_stays_inert(monkeypatch, caplog):
    from hscapture.sglang import plugin

    monkeypatch.setenv("HSCAPTURE_ENABLE", "1")
    monkeypatch.setenv("HSCAPTURE_RING_BYTES", "plenty")
    monkeypatch.setattr(plugin, "_HOOK", None)
    plugin.register()
    assert plugin.installed_hook() is None
    assert "HSCAPTURE_RING_BYTES" in caplog.text


# -- the entry point, loaded by SGLang's own machinery in a spawned process ----------------

def _entry_point_path(tmp_path: Path) -> list[str]:
    """Extra sys.path entries so ``hscapture`` is a ``sglang.srt.plugins`` entry point.

    When hscapture is installed (``pip install .``, CI) its own metadata declares it and
    nothing is added. Otherwise (a bare checkout) a minimal dist-info declaring the same
    entry point is written, and the checkout itself is put on the path.
    """
    from importlib.metadata import entry_points

    if any(ep.name == "hscapture" and ep.value == "hscapture.sglang.plugin:register"
           for ep in entry_points(group="sglang.srt.plugins")):
        return []
    site = tmp_path / "site"
    dist = site / "hscapture_testep-0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hscapture-testep\n"
                                   "Version: 0.0\n")
    (dist / "entry_points.txt").write_text(
        "[sglang.srt.plugins]\nhscapture = hscapture.sglang.plugin:register\n")
    return [str(site), str(HERE.parent.parent)]


CHILD = textwrap.dedent(r"""
    import json, os, sys, warnings
    warnings.filterwarnings("ignore")
    sys.path.insert(0, os.environ["SUPPORT_DIR"])
    out = {}
    import sglang.srt.managers.tp_worker as tpw
    real = tpw.TpModelWorker.forward_batch_generation
    if os.environ.get("FAKE_MODEL"):
        # Stand in for the model before plugins load, so the hook SGLang installs wraps it.
        from sglang_support import FakeModelServer
        holder = {}
        def fake(self, batch, forward_batch=None, **kw):
            return holder["result"]
        tpw.TpModelWorker.forward_batch_generation = fake
    from sglang.srt.plugins import load_plugins
    load_plugins()   # what run_scheduler_process does first
    from hscapture.sglang.plugin import installed_hook
    wrapped = tpw.TpModelWorker.forward_batch_generation
    out["wrapped"] = getattr(wrapped, "__wrapped__", None) is not None
    out["hook"] = installed_hook() is not None
    if os.environ.get("FAKE_MODEL"):
        from sglang.srt.runtime_context import SpawnRanks, publish
        from sglang.srt.server_args import ServerArgs
        from hscapture import Subscriber
        publish(ServerArgs(model_path="dummy", enable_return_aux_hidden_states=True,
                           speculative_algorithm="EAGLE3",
                           return_aux_hidden_state_layer_ids=[29, 2, 16]),
                role="scheduler", ranks=SpawnRanks(world_rank=0))
        hook = installed_hook()
        hook.start()                                  # Scheduler.__init__ AFTER hook
        sub = Subscriber(hook.producer.endpoint)
        sub.wait_ready(timeout=10)
        srv = FakeModelServer(lambda *a, **k: None)   # only for requests/results
        req = srv.new_req("hscap-ep", 11)
        srv.extend([(req, 0, 11)])                    # builds the result (no-op hook)
        holder["result"] = srv._result
        batch = srv.extend([(req, 0, 11)]) if False else None
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        from types import SimpleNamespace
        b = ScheduleBatch.init_new([req], SimpleNamespace(device="cpu"), None, None,
                                   SimpleNamespace(vocab_size=32000), False,
                                   SpeculativeAlgorithm.NONE)
        b.forward_mode = ForwardMode.EXTEND
        b.prefix_lens, b.extend_lens = [0], [11]
        res = tpw.TpModelWorker.forward_batch_generation(srv.worker, b)
        assert res is holder["result"]
        s = sub.get("hscap-ep", timeout=10)
        import torch
        want = srv.expected(req)
        out["sample_ok"] = all(torch.equal(s.tensors[k], v) for k, v in want.items()) \
            and s.token_ids.tolist() == list(req.origin_input_ids)
        s.release(); sub.close(); hook.close()
    print("RESULT " + json.dumps(out))
""")


def _run_child(tmp_path: Path, env_extra: dict[str, str]) -> dict:
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("HSCAPTURE_") or k == "SGLANG_PLUGINS":
            del env[k]
    extra = _entry_point_path(tmp_path)
    if "triton" in sys.modules and getattr(sys.modules["triton"], "HSCAPTURE_TEST_STUB", False) \
            or "torchvision" in sys.modules and getattr(sys.modules["torchvision"],
                                                        "HSCAPTURE_TEST_STUB", False):
        extra.append(str(HERE / "_stubs"))
    env["PYTHONPATH"] = os.pathsep.join(extra + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    env["SUPPORT_DIR"] = str(HERE)
    env.update(env_extra)
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                          text=True, timeout=240)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and line, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(line[-1][len("RESULT "):])


def test_entry_point_is_inert_without_configuration(tmp_path):
    out = _run_child(tmp_path, {})
    assert out == {"wrapped": False, "hook": False}


def test_entry_point_filtered_by_sglang_plugins_whitelist(tmp_path):
    out = _run_child(tmp_path, {"HSCAPTURE_ENABLE": "1", "SGLANG_PLUGINS": "someone_else"})
    assert out == {"wrapped": False, "hook": False}


def test_entry_point_installs_hook_and_captures(tmp_path, sock_dir, unique_id):
    out = _run_child(tmp_path, {"HSCAPTURE_ENDPOINT": f"ipc://{sock_dir}/ep.sock",
                                "HSCAPTURE_PRODUCER_ID": unique_id, "FAKE_MODEL": "1",
                                "HSCAPTURE_RING_BYTES": "16M"})
    assert out == {"wrapped": True, "hook": True, "sample_ok": True}


# -- the fallback launcher ---------------------------------------------------------------

def test_launcher_passes_its_scheduler_entry_to_sglang(monkeypatch):
    import inspect

    import sglang.srt.entrypoints.http_server as http_server
    from hscapture.sglang import launcher

    assert "run_scheduler_process_func" in inspect.signature(http_server.launch_server).parameters
    seen = {}

    def fake_launch_server(server_args, run_scheduler_process_func=None, **kw):
        seen["func"] = run_scheduler_process_func
        seen["model"] = server_args.model_path

    monkeypatch.setattr(http_server, "launch_server", fake_launch_server)
    monkeypatch.setattr("sglang.srt.utils.kill_process_tree", lambda *a, **k: None)
    monkeypatch.delenv("HSCAPTURE_ENABLE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    launcher.main(["--model-path", "dummy"])
    assert seen == {"func": launcher.run_scheduler_process, "model": "dummy"}
    assert os.environ["HSCAPTURE_ENABLE"] == "1"
    # spawn pickles the entry by qualified name: it must be importable as such
    import pickle

    assert pickle.loads(pickle.dumps(launcher.run_scheduler_process)) is \
        launcher.run_scheduler_process


def test_hook_target_resolves():
    import pkgutil

    obj = pkgutil.resolve_name(HOOK_TARGET.rpartition(".")[0])
    assert callable(getattr(obj, HOOK_TARGET.rpartition(".")[2]))
