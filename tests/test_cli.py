"""The ``hscapture`` command line as a user meets it: usage errors, exit codes, messages,
rendering, and the commands beyond drain's core (drain's data path is in test_capture.py)."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from hscapture import endpoint as ep
from hscapture.cli import main, parse_size
from hscapture.progress import Progress, format_size
from hscapture.sample import Sample
from hscapture.shards import ShardWriter

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str, cwd, env: dict | None = None, timeout: float = 120
         ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hscapture", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def _sample(rid: str) -> Sample:
    t = torch.randn(4, 8).to(torch.bfloat16)
    return Sample(rid=rid, producer_id="p", epoch=1, num_tokens=4,
                  token_ids=torch.arange(4, dtype=torch.int32), tensors={"layer_1": t},
                  layers=[1], layer_kinds=["residual"], dtype="bfloat16", hidden=8)


@pytest.fixture
def sock_dir(monkeypatch):
    """A private, short socket directory (AF_UNIX paths are limited to 107 bytes)."""
    d = Path("/tmp") / f"hsc-cli-{uuid.uuid4().hex[:8]}"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("HSCAPTURE_SOCKET_DIR", str(d))
    yield d
    shutil.rmtree(d, ignore_errors=True)


# --- start-up ------------------------------------------------------------------------------


def test_help_imports_neither_torch_nor_zmq_and_answers_well_under_a_second(tmp_path):
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, hscapture.cli; "
         "print(sorted(m for m in ('torch', 'zmq', 'numpy', 'tqdm') if m in sys.modules))"],
        capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "[]", f"imported at start-up: {probe.stdout}"
    best = min(_timed_help(tmp_path) for _ in range(3))
    assert best < 1.0, f"`hscapture --help` took {best:.2f} s"


def _timed_help(cwd) -> float:
    t0 = time.monotonic()
    res = _run("--help", cwd=cwd)
    took = time.monotonic() - t0
    assert res.returncode == 0 and "Exit codes" in res.stdout and "130" in res.stdout
    return took


# --- usage errors --------------------------------------------------------------------------


@pytest.mark.parametrize("args, expected", [
    (["-e", "tcp://1.2.3.4"], "the port is required"),
    (["-e", "tcp://1.2.3.4:70000"], "port in 1-65535"),
    (["-e", "inproc://foo"], "inproc:// works only inside one process"),
    (["-e", "nonsense"], "expected 'ipc://PATH' or 'tcp://HOST:PORT'"),
    (["-e", "ipc:///x.sock", "--shard-size", "0"], "positive size"),
    (["-e", "ipc:///x.sock", "--shard-size", "-1G"], "size like 512M"),
    (["-e", "ipc:///x.sock", "--flush-every", "lots"], "size like 512M"),
    (["-e", "ipc:///x.sock", "--meta", "format=x"], "'format' is reserved"),
    (["-e", "ipc:///x.sock", "--meta", "novalue"], "expected KEY=VALUE"),
    (["-e", "ipc:///x.sock", "--samples", "-3"], "x>=1"),
    (["-e", "ipc:///x.sock", "--samples", "0"], "x>=1"),
    (["-e", "ipc:///x.sock", "--connect-timeout", "-1"], "x>0"),
    (["-e", "ipc:///x.sock", "--idle-timeout", "0"], "x>0"),
])
def test_bad_drain_options_are_usage_errors_that_exit_2_before_anything_runs(
        tmp_path, args, expected):
    out = tmp_path / "never"
    res = CliRunner().invoke(main, ["drain", *args, "-o", str(out)])
    assert res.exit_code == 2, res.output
    assert expected in res.output and "Traceback" not in res.output
    assert not out.exists(), "a usage error must not create the output directory"


def test_sizes_take_units_and_refuse_zero_negatives_and_garbage():
    assert parse_size("512M") == 512 << 20
    assert parse_size("2G") == parse_size("2GB") == parse_size("2GiB") == 2 << 30
    assert parse_size("1.5k") == 1536 and parse_size("4096") == 4096
    for bad in ("0", "-1", "-2G", "G", "2X", "", "nan", "0.1"):
        with pytest.raises(ValueError):
            parse_size(bad)
    assert format_size(1536) == "1.5 KiB" and format_size(3 << 30) == "3.0 GiB"
    assert format_size(12) == "12 B"


# --- drain: what it says, and its exit codes ------------------------------------------------


def test_a_waiting_drain_says_at_once_what_it_waits_for_and_ctrl_c_exits_130(tmp_path, sock_dir):
    endpoint = f"ipc://{sock_dir}/nobody.sock"
    proc = subprocess.Popen([sys.executable, "-m", "hscapture", "drain", "-e", endpoint,
                             "-o", str(tmp_path / "out"), "--connect-timeout", "30"],
                            cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.monotonic()
        first = proc.stderr.readline()
        # at once: long before the 30 s wait it announces ends (a busy host takes seconds to
        # import torch)
        assert time.monotonic() - t0 < 20.0, "the drain did not say at once what it waits for"
        assert first.startswith("hscapture: waiting up to 30 s for the producer at " + endpoint)
        assert "no socket file" in first
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, rest
    assert "Traceback" not in rest and "hscapture: hscapture" not in first + rest


def test_the_drain_says_it_waits_only_once_ctrl_c_is_its_clean_stop(tmp_path, sock_dir):
    """What the user is told ("Ctrl-C to stop") is true when it is said: ``on_waiting`` runs
    with the drain's own SIGINT/SIGTERM handlers installed, and a SIGINT then is the clean stop
    (stopped_by "signal"), not an exception and not a wait to the connect timeout."""
    from hscapture import drain as drain_mod

    seen = {}
    original = signal.getsignal(signal.SIGINT)
    # the handler before the drain: records a SIGINT it gets instead of raising (so a drain
    # that speaks before its handlers fails this test, not the whole pytest session)
    signal.signal(signal.SIGINT, lambda *a: seen.setdefault("lost", True))
    before = signal.getsignal(signal.SIGINT)

    def on_waiting() -> None:
        seen["int"] = signal.getsignal(signal.SIGINT)
        seen["term"] = signal.getsignal(signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)        # Ctrl-C right after the line

    t0 = time.monotonic()
    try:
        res = drain_mod.drain([f"ipc://{sock_dir}/nobody.sock"], str(tmp_path / "out"),
                              connect_timeout_s=5, progress=False, on_waiting=on_waiting)
        assert "lost" not in seen and seen["int"] is not before and \
            seen["int"] is seen["term"], "the drain's handlers were not installed when it " \
                                         "said it waits"
        assert res.stopped_by == "signal" and res.samples == 0
        assert not (tmp_path / "out").exists(), "it made a directory it wrote nothing into"
        assert time.monotonic() - t0 < 4, "a Ctrl-C during the wait must stop it at once"
        assert signal.getsignal(signal.SIGINT) is before, "the drain restores the handlers"
    finally:
        signal.signal(signal.SIGINT, original)


def test_a_drain_with_no_producer_fails_with_one_clear_line_and_debug_shows_the_traceback(
        tmp_path, sock_dir):
    args = ["drain", "-e", f"ipc://{sock_dir}/nobody.sock", "-o", str(tmp_path / "o"),
            "--connect-timeout", "0.3", "--quiet"]
    res = _run(*args, cwd=tmp_path)
    assert res.returncode == 1
    errors = [line for line in res.stderr.splitlines() if line.startswith("hscapture: error:")]
    assert len(errors) == 1 and "no hscapture producer" in errors[0], res.stderr
    assert "Traceback" not in res.stderr
    # the directory it made for nothing is gone; one that was there before stays
    assert not (tmp_path / "o").exists()
    (tmp_path / "mine").mkdir()
    mine = _run("drain", "-e", f"ipc://{sock_dir}/nobody.sock", "-o", str(tmp_path / "mine"),
                "--connect-timeout", "0.3", "--quiet", cwd=tmp_path)
    assert mine.returncode == 1 and (tmp_path / "mine").is_dir()
    debug = _run("--debug", *args, cwd=tmp_path)
    assert debug.returncode == 1 and "Traceback" in debug.stderr


def test_an_endpoint_given_twice_is_read_once(tmp_path, sock_dir):
    ep = f"ipc://{sock_dir}/nobody.sock"
    res = _run("drain", "-e", ep, "-e", ep, "-o", str(tmp_path / "o"), "--connect-timeout",
               "0.3", cwd=tmp_path)
    assert res.returncode == 1
    assert res.stderr.count("waiting up to") == 1 and f"on ['{ep}'] within" in res.stderr, \
        res.stderr
    from hscapture import Subscriber
    with Subscriber([ep, ep]) as sub:
        assert sub.endpoints == [ep]


def test_a_failing_drain_with_json_prints_the_error_as_json_on_stdout(tmp_path, sock_dir):
    res = _run("drain", "-e", f"ipc://{sock_dir}/nobody.sock", "-o", str(tmp_path / "o"),
               "--connect-timeout", "0.3", "--quiet", "--json", cwd=tmp_path)
    assert res.returncode == 1
    report = json.loads(res.stdout)
    assert report["error_type"] == "SampleTimeoutError", report
    assert "no hscapture producer" in report["error"], report
    assert "hscapture: error:" in res.stderr


def test_unsubscribe_calls_the_drains_unsubscribe_with_the_endpoints_and_directory(
        tmp_path, monkeypatch):
    import hscapture.drain as drain_mod

    calls = []
    monkeypatch.setattr(drain_mod, "unsubscribe",
                        lambda eps, out: (calls.append((eps, out)), (len(eps), [], []))[1],
                        raising=False)
    res = CliRunner().invoke(main, ["drain", "-e", "ipc:///a.sock", "-e", "tcp://h:5557",
                                    "-o", str(tmp_path), "--unsubscribe"])
    assert res.exit_code == 0, res.output
    assert calls == [(["ipc:///a.sock", "tcp://h:5557"], str(tmp_path))]


def test_unsubscribing_a_drain_that_holds_no_place_says_there_was_nothing_to_end(
        tmp_path, sock_dir):
    # it said "ended the subscription of DIR" for a subscription that never existed
    # (newcomer walk, 2026-12-05)
    res = _run("drain", "--unsubscribe", "-e", f"ipc://{sock_dir}/nobody.sock", "-o",
               str(tmp_path / "never"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "no ring holds a place for the drain into" in res.stderr, res.stderr
    assert "ended the subscription" not in res.stderr and not (tmp_path / "never").exists()


def test_library_log_lines_are_rendered_once_with_one_prefix(capsys):
    import logging

    from hscapture.cli import _setup_logging

    _setup_logging(debug=False)
    logging.getLogger("hscapture.subscriber").warning("hscapture subscriber: %s lost", 3)
    logging.getLogger("hscapture").info("hscapture: plain")
    logging.getLogger("hscapture").debug("hidden without --debug")
    assert capsys.readouterr().err == "hscapture: warning: subscriber: 3 lost\nhscapture: plain\n"


# --- progress ------------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_progress_off_a_terminal_prints_a_plain_line_every_interval_with_percent_and_eta():
    clock, out = _Clock(), io.StringIO()
    bar = Progress(total=100, enabled=True, stream=out, interval_s=10, clock=clock)
    for i in range(1, 40):
        clock.t += 0.5
        bar.update(i, i * 10**8, dropped=1, incomplete=2)
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1, lines           # 19.5 s elapsed: one line at 10 s, not before
    assert lines[0].startswith("hscapture: 20/100 samples (20.0%), 2.0/s, 2.00 GB, 0.20 GB/s")
    assert "dropped 1" in lines[0] and "incomplete 2" in lines[0] and "ETA 0:40" in lines[0]


def test_progress_without_a_total_has_no_percent_and_disabled_progress_writes_nothing():
    clock, out = _Clock(), io.StringIO()
    bar = Progress(total=None, enabled=True, stream=out, interval_s=1, clock=clock)
    clock.t += 2
    bar.update(5, 0)
    assert "%" not in out.getvalue() and "ETA" not in out.getvalue() and "5 samples" in out.getvalue()
    quiet = io.StringIO()
    off = Progress(total=10, enabled=False, stream=quiet, interval_s=0, clock=clock)
    off.update(3, 3)
    off.close()
    assert quiet.getvalue() == ""


def test_progress_on_a_terminal_draws_a_tqdm_bar_with_rate_bytes_drops_and_percent():
    out = io.StringIO()
    bar = Progress(total=50, enabled=True, stream=out, tty=True)
    bar.update(25, 5 * 10**9, dropped=4)
    bar.close()
    text = out.getvalue()
    assert "50%" in text and "25/50" in text and "GB/s" in text and "dropped 4" in text


# --- inspect -------------------------------------------------------------------------------


def test_inspect_shows_the_schema_and_sizes_of_a_good_directory_and_fails_a_damaged_one(tmp_path):
    out = tmp_path / "shards"
    with ShardWriter(out, metadata={"model": "m-1", "convention": "conv-x"}) as w:
        for i in range(3):
            w.add(_sample(f"r{i}"))
    good = _run("inspect", str(out), cwd=tmp_path)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "3 samples, 12 tokens, 1 shard(s), 2.0 MiB" in good.stdout
    for part in ("model: m-1", "convention: conv-x", "dtype: bfloat16, hidden size: 8",
                 "layers: layer_1 (residual)"):
        assert part in good.stdout, good.stdout
    report = json.loads(_run("inspect", str(out), "--json", cwd=tmp_path).stdout)
    assert report["ok"] and report["samples"] == 3
    assert report["schemas"][0]["layers"] == [1] and report["schemas"][0]["hidden"] == 8
    shard = next(out.glob("*.safetensors"))
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) - 10)
    bad = _run("inspect", str(out), cwd=tmp_path)
    assert bad.returncode == 1 and "PROBLEM" in bad.stdout and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("hscapture: error:")


def test_inspect_fails_on_an_empty_directory_and_on_one_holding_only_an_unrelated_model(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    res = _run("inspect", str(empty), cwd=tmp_path)
    assert res.returncode == 1 and "no hscapture shards" in res.stderr, res.stderr
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(model_dir / "model.safetensors"))
    res = _run("inspect", str(model_dir), cwd=tmp_path)
    assert res.returncode == 1 and "model.safetensors" in res.stderr, res.stderr
    assert "not an hscapture shard: model.safetensors" in res.stdout


def test_inspecting_an_export_says_it_is_one_and_where_its_shards_are(tmp_path):
    # it printed "0 samples", PROBLEM, FAILED and the error again (newcomer walk, 2026-12-05)
    from hscapture.export import MANIFEST_NAME

    out = tmp_path / "sf"
    out.mkdir()
    (out / MANIFEST_NAME).write_text("{}")
    res = _run("inspect", str(out), cwd=tmp_path)
    assert res.returncode == 2 and res.stdout == "", (res.stdout, res.stderr)
    assert res.stderr.startswith("hscapture: error:") and "is an export" in res.stderr, \
        res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


# --- demo ----------------------------------------------------------------------------------


def test_demo_refuses_a_non_empty_directory_and_touches_nothing_in_it(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    for extra in ([], ["--overwrite"]):
        res = CliRunner().invoke(main, ["demo", "-o", str(out), *extra])
        assert res.exit_code == 2, res.output
        assert "not empty" in res.output or "not written by `hscapture demo`" in res.output
    assert [p.name for p in out.iterdir()] == ["thesis.tex"]
    assert (out / "thesis.tex").read_text() == "precious"


def test_demo_names_an_interrupted_demos_output_and_how_to_replace_it(tmp_path):
    # an interrupted demo leaves only its hidden marker: "is not empty" over an empty-
    # looking directory puzzled a newcomer (2026-12-05)
    from hscapture.shard_format import DEMO_MARKER

    out = tmp_path / "demo-int"
    out.mkdir()
    (out / DEMO_MARKER).write_text("written by `hscapture demo`")
    res = _run("demo", "-o", str(out), cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("hscapture: error:") and "earlier demo's output" in res.stderr \
        and "--overwrite" in res.stderr, res.stderr


def test_the_demo_command_verifies_a_real_model_and_overwrite_replaces_only_its_own_files(
        tmp_path):
    out = tmp_path / "demo"
    args = ("demo", "--out", str(out), "--requests", "6", "--chunk-size", "32")
    res = _run(*args, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "hscapture: OK: every sample" in res.stderr and "[demo]" not in res.stderr + res.stdout
    assert all(line.startswith("hscapture: ") for line in res.stderr.splitlines()), res.stderr
    assert "waiting up to" not in res.stderr, "the demo's --quiet drain still talked"
    (out / "notes.txt").write_text("mine")
    again = _run(*args, "--overwrite", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert (out / "notes.txt").read_text() == "mine"
    assert json.loads(_run("inspect", str(out), "--json", cwd=tmp_path).stdout)["samples"] == 6


# --- endpoints and cleanup -----------------------------------------------------------------


def test_endpoints_prints_the_default_scheme_the_sglang_plugin_binds(tmp_path, sock_dir):
    env = {"HSCAPTURE_ENDPOINT": "", "HSCAPTURE_PRODUCER_ID": ""}
    res = _run("endpoints", "--dp-size", "2", cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [f"ipc://{sock_dir}/sglang-dp0.sock",
                                  f"ipc://{sock_dir}/sglang-dp1.sock"]
    res = _run("endpoints", cwd=tmp_path, env={"HSCAPTURE_ENDPOINT": "tcp://10.0.0.1:6000"})
    assert res.stdout.strip() == "tcp://10.0.0.1:6000"
    res = _run("endpoints", "offline", cwd=tmp_path)
    assert res.stdout.strip() == f"ipc://{sock_dir}/offline.sock"
    assert _run("endpoints", "bad/id", cwd=tmp_path).returncode == 2


def test_the_default_socket_dir_needs_no_runtime_dir(monkeypatch):
    monkeypatch.delenv("HSCAPTURE_SOCKET_DIR", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    assert ep.default_endpoint("x") == f"ipc:///tmp/hscapture-{os.getuid()}/x.sock"


_HOLDER = """
import socket, sys, time
from hscapture.endpoint import claim_endpoint, ipc_path
endpoint = sys.argv[1]
fd = claim_endpoint(endpoint)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(str(ipc_path(endpoint)))
s.listen(1)
print("up", flush=True)
time.sleep(120)
"""


def test_cleanup_keeps_a_segment_a_drain_has_not_read_and_says_how_to_let_it_go(tmp_path):
    # the reason spoke Python ("pass force=True") and named the drain only by its id
    # (newcomer walk, 2026-12-05)
    from hscapture import _ring

    name = f"hscapture-{os.geteuid()}-clikeep{uuid.uuid4().hex[:6]}-01"
    p = _ring.Producer(name, 1 << 16, 2)
    c = _ring.Consumer(name, 0, "drain-0123abcd")
    pos = p.reserve(64)
    p.commit(pos)
    c.close()                  # detached: its place keeps the record unread
    p.close(False)             # the producer ended; the segment stays
    try:
        res = _run("cleanup", "--prefix", name, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        assert f"kept stale segment {name}" in res.stdout and "force=True" not in res.stdout
        assert "`hscapture cleanup --force` removes it anyway" in res.stdout, res.stdout
        assert "hscapture drain --unsubscribe -e ENDPOINT -o DIR" in res.stdout, res.stdout
        forced = _run("cleanup", "--prefix", name, "--force", cwd=tmp_path)
        assert f"removed stale segment {name}" in forced.stdout, forced.stdout
        assert not os.path.exists(f"/dev/shm/{name}")
    finally:
        if os.path.exists(f"/dev/shm/{name}"):
            os.unlink(f"/dev/shm/{name}")


def test_cleanup_names_the_directory_and_endpoints_of_the_drain_it_keeps_a_segment_for(
        tmp_path, endpoint):
    # "drain-<hash>" alone told a newcomer nothing: which drain, which endpoint? (newcomer
    # walk 2, 2026-12-05). A drain records what it is; cleanup prints the command that ends it.
    import torch

    from hscapture import Producer

    out = tmp_path / "my shards"
    p = Producer(endpoint, producer_id=f"clidrain{uuid.uuid4().hex[:6]}", capacity=1 << 20,
                 heartbeat_interval_s=0.05)
    try:
        d = subprocess.Popen([sys.executable, "-m", "hscapture", "drain", "-e", endpoint,
                              "-o", str(out), "-n", "1", "-q"], cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert p.wait_for_consumers(1, timeout_s=60), d.communicate(timeout=10)
        for rid in ("hscap-a", "hscap-b"):      # the drain takes one, leaves one unread
            assert p.capture(rid, [torch.zeros(2, 8, dtype=torch.bfloat16)], layers=[0],
                             token_ids=torch.arange(2))
        p.flush()
        assert d.wait(timeout=60) == 0, d.communicate()
        segment = p.segment
    finally:
        p.close()
    try:
        res = _run("cleanup", "--prefix", segment, cwd=tmp_path)
        assert f"kept stale segment {segment}" in res.stdout, res.stdout
        assert f"is the drain into {out}" in res.stdout, res.stdout
        assert f"hscapture drain --unsubscribe -e {endpoint} -o '{out}'" in res.stdout, \
            res.stdout
    finally:
        _run("drain", "--unsubscribe", "-e", endpoint, "-o", str(out), cwd=tmp_path)
        _run("cleanup", "--prefix", segment, "--force", cwd=tmp_path)


def test_cleanup_removes_dead_producers_segments_and_sockets_only(tmp_path, sock_dir):
    prefix = f"hscapture-clitest-{uuid.uuid4().hex[:8]}-"
    code = ("import sys, time; from hscapture import _ring; "
            "p = _ring.Producer(sys.argv[1], 4096, 2); print('up', flush=True); time.sleep(60)")
    procs = {name: subprocess.Popen([sys.executable, "-c", code, prefix + name],
                                    stdout=subprocess.PIPE, text=True) for name in ("dead", "live")}
    socks = {name: subprocess.Popen([sys.executable, "-c", _HOLDER,
                                     f"ipc://{sock_dir}/{name}.sock"],
                                    stdout=subprocess.PIPE, text=True) for name in ("dead", "live")}
    try:
        for p in (*procs.values(), *socks.values()):
            assert p.stdout.readline().strip() == "up"
        for p in (procs["dead"], socks["dead"]):
            p.send_signal(signal.SIGKILL)
            p.wait()
        assert (sock_dir / "dead.sock").exists() and (sock_dir / "dead.sock.lock").exists()
        assert ep.live_endpoints() == [f"ipc://{sock_dir}/live.sock"]
        res = _run("cleanup", "--prefix", prefix, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        assert f"removed stale segment {prefix}dead" in res.stdout
        assert f"removed stale socket file {sock_dir}/dead.sock" in res.stdout
        assert os.path.exists(f"/dev/shm/{prefix}live")
        assert not os.path.exists(f"/dev/shm/{prefix}dead")
        assert sorted(p.name for p in sock_dir.iterdir()) == ["live.sock", "live.sock.lock"]
        assert ep.probe_endpoint(f"ipc://{sock_dir}/live.sock") is None
        assert "no socket file" in ep.probe_endpoint(f"ipc://{sock_dir}/dead.sock")
    finally:
        for p in (*procs.values(), *socks.values()):
            p.kill()
            p.wait()
        for name in ("dead", "live"):
            if os.path.exists(f"/dev/shm/{prefix}{name}"):
                os.unlink(f"/dev/shm/{prefix}{name}")


def test_a_released_claim_leaves_no_files_and_the_endpoint_can_be_claimed_again(sock_dir):
    endpoint = f"ipc://{sock_dir}/p.sock"
    fd = ep.claim_endpoint(endpoint)
    (sock_dir / "p.sock").write_text("")          # stands in for the bound socket file
    with pytest.raises(ep.EndpointError, match="in use by another producer"):
        ep.claim_endpoint(endpoint)
    ep.release_endpoint(endpoint, fd)
    assert list(sock_dir.iterdir()) == []
    ep.release_endpoint(endpoint, ep.claim_endpoint(endpoint))
    assert ep.cleanup_sockets() == []


def test_probe_endpoint_reports_a_refused_tcp_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                         # nobody listens there now
    assert "cannot connect" in ep.probe_endpoint(f"tcp://127.0.0.1:{port}")


# --- bench ---------------------------------------------------------------------------------


def test_bench_from_an_installed_package_says_it_needs_a_source_checkout(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(ROOT / "hscapture", site / "hscapture",
                    ignore=shutil.ignore_patterns("__pycache__"))
    # an installed copy: no benchmarks/ beside it (the editable install's finder is bypassed)
    code = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path "
            "if 'ScikitBuild' not in type(f).__name__]; sys.path.insert(0, sys.argv.pop(1)); "
            "import hscapture.cli as c; assert c.__file__.startswith(sys.path[0]), c.__file__; "
            "sys.argv = ['hscapture', 'bench', 'ring']; c.main()")
    res = subprocess.run([sys.executable, "-c", code, str(site)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "source checkout" in res.stderr and "Traceback" not in res.stderr


# --- examples/extract_eagle3.py: help and preflight ----------------------------------------

EXTRACT = ROOT / "examples" / "extract_eagle3.py"


def _extract(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXTRACT), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def test_the_extraction_help_shows_the_dataset_format_and_every_positional_argument(tmp_path):
    res = _extract("--help", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert '{"id": "q17", "input_ids": [' in res.stdout
    assert "dataset  " in res.stdout and "JSONL file of tokenized prompts" in res.stdout
    assert "shard directory to write" in res.stdout and "512M or 2G" in res.stdout
    bad = _extract("d.jsonl", "out", "--shard-size", "0", cwd=tmp_path)
    assert bad.returncode == 2 and "positive size" in bad.stderr


def test_the_extraction_without_a_server_fails_at_once_with_one_line_and_writes_nothing(
        tmp_path, sock_dir):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(f'{{"id": "q{i}", "input_ids": [1, 2, 3]}}\n' for i in range(600)))
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    t0 = time.monotonic()
    res = _extract(str(data), str(tmp_path / "out"), "--server", f"http://127.0.0.1:{port}",
                   cwd=tmp_path)
    assert time.monotonic() - t0 < 20
    assert res.returncode == 1
    assert res.stderr.count("\n") == 1 and "no server at" in res.stderr, res.stderr
    assert "generate_standin.py" in res.stderr and not (tmp_path / "out").exists()


def test_the_extraction_with_a_server_but_no_producer_names_the_endpoint_it_checked(
        tmp_path, sock_dir):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        data = tmp_path / "data.jsonl"
        data.write_text("[1, 2, 3]\n")
        res = _extract(str(data), str(tmp_path / "out"),
                       "--server", f"http://127.0.0.1:{server.server_address[1]}", cwd=tmp_path)
    finally:
        server.shutdown()
    assert res.returncode == 1
    assert res.stderr.count("\n") == 1, res.stderr
    assert f"ipc://{sock_dir}/sglang-dp0.sock" in res.stderr and "HSCAPTURE_ENABLE=1" in res.stderr


# --- a newcomer's mistakes -------------------------------------------------------------------


def test_a_drain_into_a_directory_of_other_files_is_refused_before_it_waits(tmp_path):
    # until 2026-12-05 the shards landed beside the directory's own files (or a drain of
    # `-o docs` waited for a producer to write there)
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("mine")
    res = _run("drain", "-e", f"ipc://{tmp_path}/none.sock", "-o", str(junk), "-n", "1",
               "--connect-timeout", "30", cwd=tmp_path, timeout=20)
    assert res.returncode == 2 and "not empty and holds no shards" in res.stderr, res.stderr
    assert sorted(p.name for p in junk.iterdir()) == ["notes.txt"]


def test_a_closed_stdout_ends_a_command_quietly_as_sigpipe_would(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "hscapture", "endpoints", "--dp-size",
                             "100000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=tmp_path)
    proc.stdout.readline()
    proc.stdout.close()                  # what `| head -1` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and err == "", err


def test_endpoints_live_with_no_producer_says_so_on_stderr_and_prints_nothing(tmp_path,
                                                                              sock_dir):
    res = _run("endpoints", "--live", cwd=tmp_path)
    assert res.returncode == 0 and res.stdout == ""
    assert "no live producer" in res.stderr and str(sock_dir) in res.stderr


def test_inspect_of_a_shard_file_names_the_directory_to_inspect(tmp_path):
    out = tmp_path / "shards"
    with ShardWriter(out) as w:
        w.add(_sample("r0"))
    shard = next(out.glob("*.safetensors"))
    res = _run("inspect", str(shard), cwd=tmp_path)
    assert res.returncode == 2 and f"hscapture inspect {out}" in res.stderr, res.stderr


def test_inspect_warns_when_a_directory_holds_samples_of_two_schemas(tmp_path):
    out = tmp_path / "shards"
    with ShardWriter(out, metadata={"model": "a"}) as w:
        w.add(_sample("r0"))
    other = _sample("r1")
    other.tensors = {"layer_1": torch.randn(4, 16).to(torch.bfloat16)}
    other.hidden = 16
    with ShardWriter(out, metadata={"model": "b"}) as w:
        w.add(other)
    res = _run("inspect", str(out), cwd=tmp_path)
    assert "2 schemas" in res.stderr and "its own directory" in res.stderr, res.stderr


def test_the_demo_without_transformers_says_what_to_install_and_writes_nothing(tmp_path):
    out = tmp_path / "d"
    code = ("import sys; sys.modules['transformers'] = None\n"
            "from hscapture.cli import main\n"
            f"main(['demo', '--out', {str(out)!r}])")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert res.returncode == 1 and "pip install 'hscapture[demo]'" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and not out.exists()


def test_the_sglang_launchers_help_is_its_own_even_where_sglang_does_not_import(tmp_path):
    # on a machine where SGLang does not import (no triton: this CPU test environment), the
    # help was followed by SGLang's import traceback (newcomer walk, 2026-12-05)
    res = subprocess.run([sys.executable, "-m", "hscapture.sglang", "--help"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "usage: python -m hscapture.sglang" in res.stdout
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
