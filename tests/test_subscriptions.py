"""The durable names recorded per producer id and per endpoint (hscapture._subscriptions):
what a new producer incarnation reserves places for."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest

from hscapture import Producer, _ring
from hscapture import _subscriptions as subs
from hscapture.ring import segment_name


def test_a_segments_file_is_keyed_by_its_producer_id_not_its_incarnation():
    a, b = segment_name("sglang-dp0"), segment_name("sglang-dp0")
    assert a != b and subs.registry_path(a) == subs.registry_path(b)
    assert subs.registry_path(a) != subs.registry_path(segment_name("sglang-dp1"))
    with pytest.raises(ValueError):
        subs.registry_path("not-a-segment")


def test_an_endpoints_file_matches_a_tcp_bind_address_with_the_address_connected_to():
    assert subs.endpoint_registry_path("tcp://0.0.0.0:5557") == \
        subs.endpoint_registry_path("tcp://127.0.0.1:5557")
    assert subs.endpoint_registry_path("tcp://127.0.0.1:5557") != \
        subs.endpoint_registry_path("tcp://127.0.0.1:5558")
    assert subs.endpoint_registry_path("ipc:///tmp/a/x.sock") != \
        subs.endpoint_registry_path("ipc:///tmp/b/x.sock")


def _add(args: tuple[str, str, str]) -> None:
    os.environ["HSCAPTURE_SUBS_DIR"] = args[0]
    subs.remember(args[2], segment=args[1])


def test_names_recorded_by_concurrent_processes_are_all_kept_and_forgotten_one_by_one():
    seg = segment_name("concurrent")
    names = [f"drain-{i}" for i in range(12)]
    with mp.get_context("spawn").Pool(4) as pool:
        pool.map(_add, [(os.environ["HSCAPTURE_SUBS_DIR"], seg, n) for n in names])
    assert sorted(subs.entries(seg)) == sorted(names)
    subs.forget_everywhere("drain-3")
    assert sorted(subs.entries(seg)) == sorted(n for n in names if n != "drain-3")


def test_a_name_whose_subscriber_is_gone_and_stale_is_forgotten_a_live_ones_kept(
        monkeypatch, endpoint):
    seg = segment_name("stale")
    path = subs.registry_path(seg)
    gone = 2 ** 22 + 12345            # no such pid
    old = time.time() - 10 * 24 * 3600
    path.write_text(f"away\t{gone}\t{old:.0f}\nlive\t{os.getpid()}\t{old:.0f}\n"
                    f"recent\t{gone}\t{time.time():.0f}\n")
    with Producer(endpoint, producer_id="stale", capacity=1 << 20) as p:
        held = sorted(c["name"] for c in _ring.segment_info(p.segment)["consumers"]
                      if c["durable"] and c["state"] != "free")
    assert held == ["live", "recent"]
    assert sorted(subs.entries(seg)) == ["live", "recent"]
    # a shorter keep: a name last seen 5 s ago, its subscriber gone, is forgotten too
    path.write_text(f"recent\t{gone}\t{time.time() - 5:.0f}\nlive\t{os.getpid()}\t{old:.0f}\n")
    monkeypatch.setenv("HSCAPTURE_DURABLE_KEEP_S", "1")
    with Producer(endpoint, producer_id="stale", capacity=1 << 20) as p:
        held = [c["name"] for c in _ring.segment_info(p.segment)["consumers"]
                if c["durable"] and c["state"] != "free"]
    assert held == ["live"] and list(subs.entries(seg)) == ["live"]


def test_places_for_away_subscribers_never_take_the_slots_a_new_subscriber_needs(endpoint):
    # a user whose drains went into many directories has as many durable names for one
    # producer id; a new incarnation that kept a place for each took every consumer slot,
    # and no subscriber could attach (CI, 2026-12-05: 8 names, 8 slots). The newest keep
    # theirs; two slots stay free; a subscriber attaches.
    import hscapture

    seg = segment_name("crowded")
    gone = 2 ** 22 + 12345            # no such pid
    now = time.time()
    subs.registry_path(seg).write_text(
        "".join(f"drain-{i}\t{gone}\t{now - 100 + i:.0f}\n" for i in range(10)))
    with Producer(endpoint, producer_id="crowded", capacity=1 << 20) as p:
        held = sorted(c["name"] for c in _ring.segment_info(p.segment)["consumers"]
                      if c["durable"] and c["state"] != "free")
        assert held == sorted(f"drain-{i}" for i in range(4, 10)), held   # the 6 newest
        with hscapture.Subscriber(endpoint) as sub:
            sub.wait_ready(timeout=20)
            import torch
            assert p.capture("x", [torch.zeros(2, 8, dtype=torch.bfloat16)], layers=[0],
                             token_ids=torch.arange(2))
            p.flush()
            assert sub.get("x", timeout=20).rid == "x"
