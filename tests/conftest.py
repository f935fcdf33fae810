"""Shared fixtures. Ring fixtures: a unique shared-memory segment name per test, cleaned up."""

from __future__ import annotations

import os
import uuid

import pytest


@pytest.fixture
def ring_name():
    """A segment name no other test (or run) uses; the segment is unlinked after the test."""
    name = f"hsctest-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    yield name
    try:
        os.unlink(os.path.join("/dev/shm", name))
    except FileNotFoundError:
        pass


@pytest.fixture(autouse=True, scope="session")
def _remove_segments_this_session_left_for_durable_subscribers():
    """Tests end durable subscriptions by killing drains, so segments of dead producers that a
    durable slot has not finished reading stay in /dev/shm by design (hscapture keeps them for
    the subscriber). Remove the ones this session created once it is over, unless another
    test session is still running beside it (two pytest processes of a developer: what is new
    in /dev/shm is then theirs too, and removing a kept segment or an ended record under a
    test that is about to resume it fails that test): every session holds a shared lock on
    one file while it runs, and cleans up only if it can turn it into an exclusive one."""
    import fcntl

    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    lock = os.open(_SESSIONS_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_SH)
    try:
        yield
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return     # another session runs: its segments are among the new ones
        _remove_new_segments(before)
    finally:
        os.close(lock)


#: a file every test session holds a shared lock on while it runs (per user: /tmp is shared)
_SESSIONS_LOCK = f"/tmp/hscapture-test-sessions-{os.getuid()}.lock"


def _remove_new_segments(before: set[str]) -> None:
    try:
        from hscapture.ring import cleanup_stale
    except Exception:
        return
    for name in set(os.listdir("/dev/shm")) - before:
        if name.startswith("hscapture-"):
            try:
                cleanup_stale(name, force=True)
            except Exception:
                pass
    # and the ended records those removals left (hscapture.ring.write_ended), and the durable
    # names per endpoint (in /dev/shm whatever HSCAPTURE_SUBS_DIR says) of drains that a
    # module-scoped fixture ran, before any test's own clean-up began
    for name in set(os.listdir("/dev/shm")) - before:
        if name.startswith(("hscapture.ended-", f"hscapture.subs-{os.geteuid()}-ep-")):
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass


@pytest.fixture(autouse=True)
def _durable_subscriptions_of_this_test_only(tmp_path_factory, monkeypatch):
    """Each test's durable subscriptions stay its own (hscapture._subscriptions): the files
    per durable name go into a folder of the test's own (``HSCAPTURE_SUBS_DIR``), and the
    names recorded per endpoint, which live in /dev/shm whatever that folder (GUARANTEES gap
    8), are removed after the test when it made them. Tests reuse endpoints (tcp ports above
    all), and a later test's producer would otherwise keep places in its ring for an earlier
    test's drains (which never come back)."""
    monkeypatch.setenv("HSCAPTURE_SUBS_DIR", str(tmp_path_factory.mktemp("subs")))
    prefix = f"hscapture.subs-{os.geteuid()}-ep-"
    before = {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}
    yield
    for name in {n for n in os.listdir("/dev/shm") if n.startswith(prefix)} - before:
        try:
            os.unlink(os.path.join("/dev/shm", name))
        except OSError:
            pass


@pytest.fixture
def endpoint():
    """An ipc endpoint in a private /tmp folder (short: ipc paths are limited to ~107 bytes),
    removed with everything in it after the test."""
    import shutil
    import tempfile

    d = tempfile.mkdtemp(prefix="hsc-test-", dir="/tmp")
    yield f"ipc://{d}/p.sock"
    shutil.rmtree(d, ignore_errors=True)
