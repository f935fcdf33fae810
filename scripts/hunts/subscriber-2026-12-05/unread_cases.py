import os, sys, tempfile, time, json
os.environ.setdefault("HSCAPTURE_SUBS_DIR", tempfile.mkdtemp(prefix="hunt-subs-", dir="/tmp"))
_ROOT = __import__("pathlib").Path(__file__).resolve().parents[3]; sys.path.insert(0, str(_ROOT / "tests")); sys.path.insert(0, str(_ROOT))
import torch
import test_guarantees as tg
from hscapture import Producer, Subscriber
from fault_support import wait_until

block = torch.zeros(8, 8, dtype=torch.bfloat16); ids = torch.arange(8, dtype=torch.int32)
def row(rid, ts=0, tc=1, last=True, cp=0):
    return {"rid": rid, "token_start": ts, "token_count": tc, "last": last, "cached_prefix": cp, "extra": {}, "fields": {}}
def bad(p, rid="dup"):   # an entry no reader can read: 2 numbers
    assert p.capture_rows([row(rid), row(rid)], [0, 1], [block], layers=[0], token_ids=ids)
def badcp(p):
    assert p.capture_rows([row("g1"), row("bcp", 0, 1, True, 5), row("g2")], [0, 1, 2], [block], layers=[0], token_ids=ids)
def good(p, rid):
    assert p.capture_rows([row(rid)], [3], [block], layers=[0], token_ids=ids)

def hold_notices(sub):
    """simulate notices delayed on the wire: receive() does nothing while held"""
    orig = sub._wire.receive; state = {"held": False}
    def recv(timeout, route):
        if state["held"]:
            time.sleep(min(timeout, 0.01)); return
        return orig(timeout, route)
    sub._wire.receive = recv
    return state

def drain(sub, got, until, what):
    def step():
        s = sub.poll(timeout=0.02)
        if s is not None: got.setdefault(s.rid, 0); got[s.rid] += 1; s.release()
        return until()
    wait_until(step, 20, what, step=0)

def unread_pending(sub):
    return any(s.unreadable_at for s in sub._sources.values())

def lost_of(st):
    return [(x["first"], x["count"], x["reason"][:60]) for x in st["lost"]]

def case_anon_close_before_notice(ep):
    got = {}
    with Producer(ep, producer_id="u1", capacity=4 << 20, heartbeat_interval_s=0.05) as p:
        sub = Subscriber(ep); sub.wait_ready(10)
        good(p, "a"); p.flush(); drain(sub, got, lambda: "a" in got, "a")
        st = hold_notices(sub); st["held"] = True
        bad(p); p.flush()
        wait_until(lambda: (sub.pump(0.01), unread_pending(sub))[1], 10, "C read before notice")
        sub.close()
        s = sub.stats()
        return dict(lost=lost_of(s), undelivered=s["undelivered"], got=got)

def case_durable_close_before_notice(ep, name="dn1"):
    got = {}
    with Producer(ep, producer_id="u2", capacity=4 << 20, heartbeat_interval_s=0.05) as p:
        sub = Subscriber(ep, name=name); sub.wait_ready(10)
        good(p, "a"); p.flush(); drain(sub, got, lambda: "a" in got, "a")
        st = hold_notices(sub); st["held"] = True
        bad(p); p.flush()
        wait_until(lambda: (sub.pump(0.01), unread_pending(sub))[1], 10, "C read before notice")
        sub.close(); s1 = sub.stats()
        good(p, "b"); p.flush()
        sub2 = Subscriber(ep, name=name)
        drain(sub2, got, lambda: "b" in got, "b")
        t = time.monotonic()
        while time.monotonic() - t < 1.5: sub2.pump(0.05)
        s2 = sub2.stats(); sub2.unsubscribe()
        return dict(first_lost=lost_of(s1), resumer_lost=lost_of(s2), got=got)

def case_durable_reread(ep, name="dn2", notice_first=True):
    """an open partial before C holds the ring: the resumer reads C again"""
    got = {}
    with Producer(ep, producer_id="u3", capacity=4 << 20, heartbeat_interval_s=0.05) as p:
        sub = Subscriber(ep, name=name); sub.wait_ready(10)
        assert p.capture_rows([row("open", 0, 1, False)], [0], [block], layers=[0], token_ids=ids)
        good(p, "a"); p.flush(); drain(sub, got, lambda: "a" in got, "a")
        if not notice_first:
            st = hold_notices(sub); st["held"] = True
        bad(p); good(p, "b"); p.flush()
        if notice_first:
            drain(sub, got, lambda: "b" in got and sub.stats()["lost"], "b and C's report")
        else:
            wait_until(lambda: (sub.pump(0.01), unread_pending(sub))[1], 10, "C read before notice")
            st["held"] = False
            drain(sub, got, lambda: "b" in got and sub.stats()["lost"], "b and C's report")
        sub.acknowledge_failures(len(sub.failures()))
        s1 = sub.stats(); sub.close()
        sub2 = Subscriber(ep, name=name)
        assert p.capture_rows([row("open", 1, 1, True)], [1], [block], layers=[0], token_ids=ids)
        good(p, "c"); p.flush()
        drain(sub2, got, lambda: "c" in got and "open" in got, "c, open")
        t = time.monotonic()
        while time.monotonic() - t < 1.5: sub2.pump(0.05)
        s2 = sub2.stats(); sub2.unsubscribe()
        return dict(first_lost=lost_of(s1), resumer_lost=lost_of(s2), got=got, unresolved=s2["unresolved"])

def case_multi(ep):
    got = [{}, {}]
    with Producer(ep, producer_id="u4", capacity=4 << 20, heartbeat_interval_s=0.05) as p:
        subs = [Subscriber(ep), Subscriber(ep, name="dn4")]
        for s in subs: s.wait_ready(10)
        badcp(p); good(p, "a"); bad(p, "d2"); good(p, "b"); p.flush()
        out = []
        for s, g in zip(subs, got):
            drain(s, g, lambda: "b" in g and len(s.stats()["lost"]) >= 2, "b and reports")
            t = time.monotonic()
            while time.monotonic() - t < 1.0: s.pump(0.05)
            out.append(dict(lost=lost_of(s.stats()), got=g, unresolved=s.stats()["unresolved"]))
        subs[0].close(); subs[1].unsubscribe()
        return out

if __name__ == "__main__":
    for c in sys.argv[1:]:
        d = tempfile.mkdtemp(prefix="hsc-hunt-", dir="/tmp")
        try:
            r = globals()["case_" + c](f"ipc://{d}/p.sock")
        except Exception as exc:
            import traceback; traceback.print_exc(); r = repr(exc)
        print(c, json.dumps(r, default=str))
