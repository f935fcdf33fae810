"""A forked child's copies of a producer and a subscriber are its parent's (hscapture/_fork.py):
the child's exit, or its dropping of them, gives back nothing the parent still uses. Real
processes: the forking process runs a script of its own, the other side is this one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import torch

from fault_support import wait_until
from hscapture import Producer, Subscriber

HIDDEN, TOKENS = 64, 32
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _capture(p: Producer, i: int) -> bool:
    return p.capture(f"r{i}", [torch.full((TOKENS, HIDDEN), float(i % 251), dtype=torch.float16)],
                     layers=[0], token_ids=torch.arange(TOKENS) + i)


def _script(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_forked_child_dropping_its_copy_of_a_subscriber_leaves_the_parent_every_sample(
        endpoint):
    # Until 2026-12-06 the child's copy, finalized (dropped, or at a normal exit), freed the
    # parent's ring slot and dropped its lock: the producer reclaimed the slot and overwrote
    # records the parent had not read (fault hunt: 511 of 600 samples named nowhere, 2/2).
    n = 400   # 400 x 4 KiB through a 512 KiB ring: it wraps while the parent reads
    sub = _script(f"""
        import gc, json, os, sys
        from hscapture import Subscriber
        s = Subscriber({endpoint!r})
        s.wait_ready(timeout=30)
        print("ready", flush=True)
        got = []
        while len(got) < 20:
            x = s.poll(timeout=10)
            assert x is not None
            got.append(x.rid); x.release()
        pid = os.fork()
        if pid == 0:          # the child drops its copy, then exits normally
            del s
            gc.collect()
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        while len(got) < {n}:
            x = s.poll(timeout=10)
            if x is None:
                break
            assert float(x.tensors["layer_0"][0, 0]) == int(x.rid[1:]) % 251
            got.append(x.rid); x.release()
        st = s.stats()
        print(json.dumps({{"got": got, "child": status, "dropped": st["dropped"],
                          "lost": st["lost"], "incomplete": st["incomplete"]}}), flush=True)
        s.close()
    """)
    with Producer(endpoint, producer_id="fork-s", capacity=512 << 10, full_policy="wait",
                  wait_timeout_s=20, heartbeat_interval_s=0.05) as p:
        assert sub.stdout.readline().strip() == "ready", sub.stderr.read()
        assert p.wait_for_consumers(1, 30)
        captured = [_capture(p, i) for i in range(n)]
        p.flush()
        out, err = sub.communicate(timeout=120)
    assert all(captured)
    rep = json.loads(out.strip().splitlines()[-1])
    assert rep["child"] == 0, err
    assert rep["got"] == [f"r{i}" for i in range(n)], (len(rep["got"]), err[-2000:])
    assert not rep["dropped"] and not rep["lost"] and not rep["incomplete"], rep


def test_a_forked_child_exiting_normally_leaves_its_parents_producer_running(endpoint):
    # The child's atexit closed the producer it inherited until 2026-12-06: a bye for the
    # parent, the ipc socket file and the endpoint's claim removed under it.
    prod = _script(f"""
        import os, sys, torch
        from hscapture import Producer
        def cap(p, i):
            assert p.capture(f"r{{i}}", [torch.full(({TOKENS}, {HIDDEN}), float(i))],
                             layers=[0], token_ids=torch.arange({TOKENS}))
        p = Producer({endpoint!r}, producer_id="fork-p", heartbeat_interval_s=0.05,
                     wait_for_subscribers=1, wait_for_subscribers_s=30)
        for i in range(5):
            cap(p, i)
        p.flush()
        pid = os.fork()
        if pid == 0:
            sys.exit(0)       # a normal exit: atexit runs
        _, status = os.waitpid(pid, 0)
        print("child", status, flush=True)
        sys.stdin.readline()
        for i in range(5, 10):
            cap(p, i)
        p.flush()
        sys.stdin.readline()
        p.close()
    """)
    got: dict = {}

    def take(s: Subscriber, until) -> None:
        def step():
            x = s.poll(timeout=0.05)
            if x is not None:
                got[x.rid] = float(x.tensors["layer_0"][0, 0])
                x.release()
            return until()
        wait_until(step, 60, "the samples", step=0)

    with Subscriber(endpoint) as s:
        s.wait_ready(timeout=30)
        take(s, lambda: len(got) == 5)
        assert prod.stdout.readline().split() == ["child", "0"], prod.stderr.read()
        assert os.path.exists(endpoint[len("ipc://"):]), "the child removed the parent's socket"
        prod.stdin.write("\n")
        prod.stdin.flush()
        take(s, lambda: len(got) == 10)
        st = s.stats()
        prod.stdin.write("\n")
        prod.stdin.flush()
        out, err = prod.communicate(timeout=60)
    assert prod.returncode == 0, err
    assert got == {f"r{i}": float(i) for i in range(10)}
    assert not st["dropped"] and not st["lost"] and not st["incomplete"], st


def test_the_native_ring_handles_of_a_forked_child_give_nothing_back(ring_name):
    # The same one level down: a child's copies of the native producer and consumer, closed
    # or destroyed, neither free the slot nor drop the locks (one open file description with
    # the parent's) nor unlink the segment.
    from hscapture import _ring

    p = _ring.Producer(ring_name, 1 << 20, 2)
    c = _ring.Consumer(ring_name)
    pid = os.fork()
    if pid == 0:   # (os._exit: this is pytest's own process)
        try:
            c.close()
            del p
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert status == 0
    info = _ring.segment_info(ring_name)
    assert info["producer_alive"] is True     # its lock still held (by this process)
    slots = [s for s in info["consumers"] if s["active"]]
    assert len(slots) == 1 and slots[0]["alive"] is True, slots
    assert os.path.exists(f"/dev/shm/{ring_name}")
    c.close()
    del p
