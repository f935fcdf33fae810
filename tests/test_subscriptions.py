"""The durable names recorded per endpoint, and the rings made for each endpoint
(hscapture._subscriptions): what a new producer incarnation reserves places for, and which
rings a durable subscriber adopts."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hscapture import Producer, _ring
from hscapture import _subscriptions as subs


def test_an_endpoints_file_matches_a_tcp_bind_address_with_the_address_connected_to():
    # a producer binds a wildcard, an address, a name or an interface (lo); its subscriber
    # connects to an address or a name, spelled its own way (127.1 is 127.0.0.1): one key
    # per port (keyed by address too, the spellings they did not share lost samples without
    # a word: fault hunt 8, 2026-12-05; two servers on one port share it: gap 7)
    for bound in ("tcp://0.0.0.0:5557", "tcp://*:5557", "tcp://127.0.0.1:5557",
                  "tcp://lo:5557", "tcp://localhost:5557"):
        for connected in ("tcp://127.0.0.1:5557", "tcp://localhost:5557", "tcp://127.1:5557"):
            assert subs.endpoint_key(bound) == subs.endpoint_key(connected), (bound, connected)
    assert subs.endpoint_key("tcp://0.0.0.0:5558") != subs.endpoint_key("tcp://127.0.0.1:5557")
    assert subs.endpoint_key("ipc:///tmp/a/x.sock") != subs.endpoint_key("ipc:///tmp/b/x.sock")


def _add(args: tuple[str, str, str]) -> None:
    os.environ["HSCAPTURE_SUBS_DIR"] = args[0]
    subs.remember(args[2], endpoint=args[1])


def test_names_recorded_by_concurrent_processes_are_all_kept_and_forgotten_one_by_one():
    tag = uuid.uuid4().hex[:8]      # (the names per endpoint are in /dev/shm: a fresh one)
    ep, other = f"ipc:///tmp/hsc-concurrent-{tag}.sock", f"ipc:///tmp/hsc-other-{tag}.sock"
    names = [f"drain-{i}" for i in range(12)]
    with mp.get_context("spawn").Pool(4) as pool:
        pool.map(_add, [(os.environ["HSCAPTURE_SUBS_DIR"], ep, n) for n in names])
    subs.remember("drain-3", endpoint=other)
    assert sorted(subs.entries(ep)) == sorted(names)
    subs.forget("drain-3", [ep])
    assert sorted(subs.entries(ep)) == sorted(n for n in names if n != "drain-3")
    assert list(subs.entries(other)) == ["drain-3"]      # another endpoint's subscription


def test_a_name_whose_subscriber_is_gone_and_stale_is_forgotten_a_live_ones_kept(
        monkeypatch, endpoint):
    path = subs.endpoint_registry_path(endpoint)
    gone = 2 ** 22 + 12345            # no such pid
    old = time.time() - 10 * 24 * 3600
    path.write_text(f"away\t{gone}\t{old:.0f}\nlive\t{os.getpid()}\t{old:.0f}\n"
                    f"recent\t{gone}\t{time.time():.0f}\n")
    with Producer(endpoint, producer_id="stale", capacity=1 << 20) as p:
        held = sorted(c["name"] for c in _ring.segment_info(p.segment)["consumers"]
                      if c["durable"] and c["state"] != "free")
    assert held == ["live", "recent"]
    assert sorted(subs.entries(endpoint)) == ["live", "recent"]
    # a shorter keep: a name last seen 5 s ago, its subscriber gone, is forgotten too
    path.write_text(f"recent\t{gone}\t{time.time() - 5:.0f}\nlive\t{os.getpid()}\t{old:.0f}\n")
    monkeypatch.setenv("HSCAPTURE_DURABLE_KEEP_S", "1")
    with Producer(endpoint, producer_id="stale", capacity=1 << 20) as p:
        held = [c["name"] for c in _ring.segment_info(p.segment)["consumers"]
                if c["durable"] and c["state"] != "free"]
    assert held == ["live"] and list(subs.entries(endpoint)) == ["live"]


def test_places_for_away_subscribers_never_take_the_slots_a_new_subscriber_needs(endpoint):
    # a user whose drains went into many directories has as many durable names for one
    # producer id; a new incarnation that kept a place for each took every consumer slot,
    # and no subscriber could attach (CI, 2026-12-05: 8 names, 8 slots). The newest keep
    # theirs; two slots stay free; a subscriber attaches.
    import hscapture

    gone = 2 ** 22 + 12345            # no such pid
    now = time.time()
    subs.endpoint_registry_path(endpoint).write_text(
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


def _samples(endpoint: str, rids: list[str]) -> None:
    """A producer incarnation (id ``sglang-dp0``, as every SGLang server's first rank) that
    commits ``rids`` and stops, with no subscriber attached."""
    import torch

    with Producer(endpoint, producer_id="sglang-dp0", capacity=1 << 20) as p:
        for rid in rids:
            assert p.capture(rid, [torch.full((3, 8), len(rid), dtype=torch.bfloat16)],
                             layers=[0], token_ids=torch.arange(3))
        p.flush()


def _read_all(endpoint: str, name: str) -> list[str]:
    import hscapture

    got = []
    with hscapture.Subscriber(endpoint, name=name) as sub:
        while (s := sub.poll(timeout=1.0)) is not None:
            got.append(s.rid)
            s.release()
    return sorted(got)


def _free_ports(n: int) -> list[int]:
    import socket

    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:           # held together: n different ports
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.mark.parametrize("kind", ["ipc", "tcp"])
def test_a_durable_name_reads_only_the_rings_of_its_own_endpoints(tmp_path, kind):
    # Two servers (same producer id, as every SGLang server's first rank) each with a trainer
    # of the same durable name: each trainer resumes only its own server's kept ring. Until
    # 2026-12-05 the first to return took both rings' samples, and the other found nothing,
    # without a word (and each server reserved places for the other's trainer).
    a, b = ((f"ipc://{tmp_path}/a.sock", f"ipc://{tmp_path}/b.sock") if kind == "ipc" else
            tuple(f"tcp://127.0.0.1:{p}" for p in _free_ports(2)))
    for ep in (a, b):                    # both trainers registered, then away
        import hscapture
        hscapture.Subscriber(ep, name="trainer-1").close()
    _samples(a, ["a0", "a1"])
    _samples(b, ["b0", "b1", "b2"])
    assert _read_all(a, "trainer-1") == ["a0", "a1"]
    assert _read_all(b, "trainer-1") == ["b0", "b1", "b2"]



def test_a_server_keeps_no_place_for_a_name_registered_only_at_another_servers_endpoint(
        tmp_path):
    import hscapture
    import torch

    a, b = f"ipc://{tmp_path}/a.sock", f"ipc://{tmp_path}/b.sock"
    with Producer(a, producer_id="sglang-dp0", capacity=1 << 20,
                  heartbeat_interval_s=0.05) as pa:
        with hscapture.Subscriber(a, name="only-a") as sub:
            sub.wait_ready(timeout=20)                 # attached: recorded (at a)
        with Producer(b, producer_id="sglang-dp0", capacity=1 << 20) as pb:
            places = [c["name"] for c in _ring.segment_info(pb.segment)["consumers"]
                      if c["durable"] and c["state"] != "free"]
            assert places == []
            assert pb.capture("b0", [torch.zeros(2, 8, dtype=torch.bfloat16)], layers=[0],
                              token_ids=torch.arange(2))
        assert [c["name"] for c in _ring.segment_info(pa.segment)["consumers"]
                if c["durable"] and c["state"] != "free"] == ["only-a"]
    # unsubscribing at b leaves the subscription of the same name at a
    hscapture.Subscriber(b, name="only-a").unsubscribe()
    assert "only-a" in subs.entries(a) and "only-a" not in subs.entries(b)


@pytest.mark.parametrize("name, why", [
    ("a\nb", "U+000A"), ("a\tb", "U+0009"), ("a\x85b", "U+0085"), ("a\u2028b", "U+2028"),
    ("a\x1cb", "U+001C"), ("x" * 64, "found 64 bytes"), ("é" * 32, "found 64 bytes"),
    ("a\ud800", "lone surrogate"), (b"trainer", "expected str"),
])
def test_a_durable_name_that_the_files_or_a_ring_slot_cannot_hold_is_refused_before_anything(
        endpoint, name, why):
    # found by fault hunt 4 (2026-12-05): "a\nb" was recorded as two lines (a restarted
    # producer kept no place for it, and one for a phantom "b"); 64 bytes failed only at the
    # first attach, with a plain ValueError, after the name had been recorded
    import hscapture
    from hscapture.errors import CaptureConfigError

    import re

    with pytest.raises(CaptureConfigError, match=re.escape(why)):
        hscapture.Subscriber(endpoint, name=name)
    with pytest.raises(CaptureConfigError, match=re.escape(why)):
        hscapture.stream(endpoint, name=name)
    assert subs.entries(endpoint) == {}


#: an endpoint no other test or run uses (the names per endpoint are in /dev/shm)
_PROPERTY_EP = f"ipc:///tmp/hsc-names-property-{uuid.uuid4().hex[:8]}.sock"


@given(st.text(min_size=1, max_size=70))
def test_every_name_the_rule_accepts_is_recorded_and_read_back_as_itself(name):
    from hscapture.errors import CaptureConfigError

    try:
        subs.check_name(name)
    except CaptureConfigError:
        return
    ep = _PROPERTY_EP
    subs.remember(name, endpoint=ep)
    try:
        assert list(subs.entries(ep)) == [name]      # one name, itself: no phantom
    finally:
        subs.forget(name, [ep])
    assert name not in subs.entries(ep)


def test_a_subscriptions_folder_that_does_not_exist_yet_is_made(tmp_path, monkeypatch):
    # it only warned, on every write (newcomer walk 2, 2026-12-05)
    # (the per-name files live there; the names per endpoint in /dev/shm since 2026-12-07)
    monkeypatch.setenv("HSCAPTURE_SUBS_DIR", str(tmp_path / "not" / "yet"))
    subs.describe("trainer", out_dir="x", endpoints=["ipc:///tmp/hsc-made.sock"])
    assert subs.who("trainer") == {"name": "trainer", "out_dir": "x",
                                   "endpoints": ["ipc:///tmp/hsc-made.sock"]}
    assert (tmp_path / "not" / "yet").stat().st_mode & 0o777 == 0o700


def test_an_ipc_endpoint_reached_through_a_linked_folder_is_the_same_endpoint(tmp_path):
    # fault hunt 6 (2026-12-05): the name was kept under the link's key, the server's ring
    # and places under the real path's, and a restarted server kept no place for it
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert subs.endpoint_key(f"ipc://{tmp_path}/link/x.sock") == \
        subs.endpoint_key(f"ipc://{tmp_path}/real/x.sock")


def test_what_a_name_is_keeps_every_endpoint_a_drain_into_its_directory_used():
    # fault hunt 6: a drain with -e A -e B, then with -e A alone: cleanup advised ending
    # the subscription at A only, while B's ring held its place
    name = f"drain-test-{os.getpid()}"
    subs.describe(name, kind="drain", out_dir="/x", endpoints=["ipc:///a", "ipc:///b"])
    subs.describe(name, kind="drain", out_dir="/x", endpoints=["ipc:///a"])
    assert subs.who(name)["endpoints"] == ["ipc:///a", "ipc:///b"]


def test_a_subscriber_named_none_is_an_anonymous_one(endpoint):
    # its first attach raised a raw TypeError from the ring (final fault hunt, 2026-12-05)
    import torch

    import hscapture

    with Producer(endpoint, producer_id="nn", capacity=1 << 20,
                  heartbeat_interval_s=0.05) as p, \
            hscapture.Subscriber(endpoint, name=None) as sub:
        sub.wait_ready(timeout=20)
        assert p.capture("r0", [torch.ones(2, 4, dtype=torch.bfloat16)], layers=[0],
                         token_start=0, is_last_chunk=True,
                         token_ids=torch.arange(2, dtype=torch.int32))
        p.flush()
        s = sub.poll(timeout=20)
        assert s is not None and s.rid == "r0"
        s.release()
        assert sub.name == ""


pending_failure = st.tuples(st.sampled_from(["dropped", "incomplete", "rejected", "ended"]),
                            st.text(st.characters(min_codepoint=0x20, exclude_categories=("Cs",)),
                                    min_size=1, max_size=12), st.text(max_size=20),
                            st.builds("{}:{}".format, st.integers(0, 2**40),
                                      st.integers(0, 2**40)))


@given(st.lists(st.tuples(st.sampled_from(["ep-a", "ep-b"]), pending_failure), max_size=12),
       st.data())
def test_failures_recorded_pending_read_back_per_endpoint_in_order_until_settled(lines, data):
    # (the pending file: failures whose ring records a durable subscriber gave back before
    # acknowledging them, GUARANTEES gap 1; the same name at another endpoint is another
    # subscription, which neither reads nor settles them)
    name = f"pend-{os.getpid()}"
    subs.forget_pending(name, ["ep-a", "ep-b"])
    half = len(lines) // 2
    assert subs.record_pending(name, lines[:half])
    assert subs.record_pending(name, lines[half:])

    def of(ep: str, among: list) -> list:
        return list(dict.fromkeys(f for e, f in among if e == ep))

    assert subs.pending(name, ["ep-a"]) == of("ep-a", lines)
    assert subs.pending(name, ["ep-a", "ep-b"]) == list(dict.fromkeys(f for _e, f in lines))
    done = data.draw(st.lists(st.sampled_from([f for _e, f in lines]), unique=True) if lines
                     else st.just([]))
    subs.settle_pending(name, ["ep-a"], done)
    assert subs.pending(name, ["ep-a"]) == [f for f in of("ep-a", lines) if f not in done]
    assert subs.pending(name, ["ep-b"]) == of("ep-b", lines)
    subs.forget_pending(name, ["ep-b"])
    assert subs.pending(name, ["ep-b"]) == []
    assert subs.pending(name, ["ep-a"]) == [f for f in of("ep-a", lines) if f not in done]
    subs.forget_pending(name, ["ep-a"])
    assert not subs._pending_path(name).exists()


def test_lines_of_the_pending_file_it_did_not_write_are_skipped():
    # a torn last line (a kill mid-append), and lines no subscriber wrote: a kind that is not
    # a failure's, a rid that breaks the rid rules, fields of the wrong type, an event that
    # is not "epoch:seq" in ASCII digits ("²" passes str.isdigit), not JSON
    name = f"pend-torn-{os.getpid()}"
    subs.forget_pending(name, ["e"])
    whole = ("dropped", "r1", "ring_full", "3:7")
    assert subs.record_pending(name, [("e", whole)])
    with open(subs._pending_path(name), "ab") as f:
        for bad in ({"kind": "lost"}, {"rid": ""}, {"rid": "a\u0001"}, {"reason": 5},
                    {"event": "\u00b2:1"}, {"event": "1:2:3"}, {"event": "-1:5"},
                    {"endpoint": None}):
            line = {"endpoint": "e", "kind": "dropped", "rid": "r3", "reason": "",
                    "event": "3:9", **bad}
            f.write(json.dumps(line).encode() + b"\n")
        f.write(b'\xff\xfe not json\n[1, 2]\n{"endpoint": "e", "kind": "dropped", "rid": "r2"')
    assert subs.pending(name, ["e"]) == [whole]
    subs.forget_pending(name, ["e"])


def test_a_durable_subscriber_starts_over_files_of_its_name_damaged_by_bytes_not_utf8(endpoint):
    # Its acknowledged and pending files with bytes that are not UTF-8 (damaged, or not
    # ours): the lines around them are read, the damaged ones skipped. Until 2026-12-06 a
    # UnicodeDecodeError came out of Subscriber() (the acknowledged file) or its first pump
    # (the pending file)
    from hscapture import Subscriber
    name = f"damaged-{os.getpid()}"
    good = ("dropped", "r1", "ring_full", "7:3")
    assert subs.record_pending(name, [(subs.endpoint_key(endpoint), good)])
    for path in (subs._acked_path(name), subs._pending_path(name)):
        with open(path, "ab") as f:
            f.write(b'\xff\xfe{"event": "7:9", "rid": "r9"}\n')
    with Subscriber(endpoint, name=name) as sub:
        sub.pump(0.01)
        assert [f[:2] for f in sub.failures()] == [("dropped", "r1")]
        sub.unsubscribe()
    assert subs.pending(name, [subs.endpoint_key(endpoint)]) == []


def test_the_acknowledged_files_cut_keeps_the_newest_failures_and_samples_each(monkeypatch):
    # a get()-heavy consumer's sample lines no longer push the failures it acknowledged out
    # of what a resumer reads (fault hunt H20, at unit level); each kind keeps its newest
    monkeypatch.setattr(subs, "ACKED_KEEP", 3)
    lines = [json.dumps({"event": f"1:{i}", "rid": f"f{i}"}) if i % 4 == 0 else
             json.dumps({"sample": f"1:{i}", "rid": f"s{i}", "first": i}) for i in range(20)]
    subs._keep_newest_of_each_kind(lines)
    assert [json.loads(x).get("rid") for x in lines] == \
        ["f8", "f12", "f16", "s17", "s18", "s19"]


_PRODUCE_FIVE = """
import sys, torch
from hscapture import Producer
with Producer(sys.argv[1], producer_id="gap8", capacity=1 << 20) as p:
    for i in range(5):
        assert p.capture(f"s{i}", [torch.full((3, 8), float(i)).to(torch.bfloat16)],
                         layers=[0], token_ids=torch.arange(3))
    p.flush(timeout_s=10)
"""


def test_a_server_keeps_a_place_for_a_trainer_whose_subscriptions_folder_is_another(
        endpoint, tmp_path, monkeypatch):
    """GUARANTEES gap 8 (fault hunt 6, 2026-12-05; fixed 2026-12-07): ``HSCAPTURE_SUBS_DIR``
    set for the trainer and not for the server (or to another folder). The names a durable
    subscriber records at an endpoint are the one file a server reads from its trainers'
    side: it lives in ``/dev/shm`` beside the rings file, whatever either side's folder, so a
    server started after the trainer went away keeps a place for it from its first capture
    and the trainer, back, gets every sample. Until then the server read another folder,
    kept no place, and removed its ring at its close: all five samples were neither
    delivered nor reported. The producer runs in a process of its own, with its own folder."""
    import subprocess
    import sys

    import hscapture

    monkeypatch.setenv("HSCAPTURE_SUBS_DIR", str(tmp_path / "trainer"))
    hscapture.Subscriber(endpoint, name="trainer").close()   # records the name, then away
    env = {**os.environ, "HSCAPTURE_SUBS_DIR": str(tmp_path / "server")}
    subprocess.run([sys.executable, "-c", _PRODUCE_FIVE, endpoint], env=env, check=True,
                   timeout=120)
    with hscapture.Subscriber(endpoint, name="trainer") as sub:
        for i in range(5):
            s = sub.get(f"s{i}", timeout=20)
            assert s.num_tokens == 3 and s.token_ids.tolist() == [0, 1, 2]
            s.release()
    hscapture.Subscriber(endpoint, name="trainer").unsubscribe()
