"""The subscriber's notice socket (hscapture/_wire.py): what it promises about ZeroMQ."""

from __future__ import annotations

import uuid

import zmq

from fault_support import wait_until
from hscapture import notice as nt
from hscapture._ledger import Ledger
from hscapture._wire import NoticeSocket


def test_a_socket_whose_owner_makes_no_call_is_subscribed_to_a_publisher_that_binds_later(
        tmp_path):
    # ZeroMQ sends a SUB socket's subscription to a publisher that binds its endpoint anew
    # (a restarted producer) only when a thread calls into the socket. A subscriber idle in a
    # training step heard nothing of a producer that restarted meanwhile: that publisher had
    # no subscriber and dropped every notice (fault hunt of 2026-12-06: a whole incarnation
    # named nowhere, 5 of 5 runs). The socket's keeper thread touches it while its owner
    # makes no call. Here the owner reads from a first publisher, then makes no call until
    # a second one, bound after the first closed, has seen the subscription.
    endpoint = f"ipc://{tmp_path}/n-{uuid.uuid4().hex[:8]}.sock"
    ns = NoticeSocket([endpoint], Ledger())
    ctx = zmq.Context()
    got: list = []
    pubs: list = []
    try:
        for epoch in (1, 2):
            pub = ctx.socket(zmq.XPUB)   # a PUB that shows the subscriptions it receives
            pubs.append(pub)
            pub.setsockopt(zmq.LINGER, 0)
            pub.bind(endpoint)
            wait_until(lambda: pub.poll(20), 20,
                       f"the subscription to reach publisher {epoch}")
            assert pub.recv() == b"\x01"   # subscribed to everything
            # what the publisher sends from now on reaches the owner's next call
            pub.send(nt.entry_frame("p", epoch, 0, 1, "batch", "hscap-x", 0, 64, 0, b"\x80"))
            wait_until(lambda: (ns.receive(0.02, got.append), got)[1], 10,
                       "the owner to read the notice")
            assert got.pop()["epoch"] == epoch
            pub.close(0)
    finally:
        for pub in pubs:
            pub.close(0)
        ctx.term()
        ns.close()


def test_the_locked_socket_and_the_keeper_share_it_and_close_stops_the_keeper(tmp_path):
    endpoint = f"ipc://{tmp_path}/n-{uuid.uuid4().hex[:8]}.sock"
    ns = NoticeSocket([endpoint], Ledger())
    s = ns.locked()
    for _ in range(200):          # calls from this thread while the keeper runs
        s.disconnect(endpoint)
        s.connect(endpoint)
        assert s.poll(0) == 0
    assert ns._keeper.is_alive()
    ns.close()
    assert not ns._keeper.is_alive()
