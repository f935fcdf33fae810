import os, sys, tempfile, time, json
os.environ.setdefault("HSCAPTURE_SUBS_DIR", tempfile.mkdtemp(prefix="hunt-subs-", dir="/tmp"))
_ROOT = __import__("pathlib").Path(__file__).resolve().parents[3]; sys.path.insert(0, str(_ROOT / "tests")); sys.path.insert(0, str(_ROOT))
import test_guarantees as tg
from hscapture import Subscriber
from fault_support import wait_until

def pump_for(b, got, secs):
    end = time.monotonic() + secs
    while time.monotonic() < end:
        s = b.poll(timeout=0.02)
        if s is not None: got[s.rid] = s

def run(case, T=1.0):
    d = tempfile.mkdtemp(prefix="hsc-hunt-", dir="/tmp"); ep = f"ipc://{d}/p.sock"
    got = {}
    b = Subscriber(ep, incomplete_timeout_s=T)
    notes = []
    try:
        with tg._b_follows_into_a_second_incarnation(ep, "hx" + case[:3], b, got) as p:
            tg._chunk(p, "x", 4, 0, 1); p.flush()
            tg._take(b, got, lambda: p.stats()["ring"]["live_consumers"] >= 1, "attach")
            tg._capture(p, "m1", 3); p.flush()
            tg._take(b, got, lambda: "m1" in got, "m1")
            if case == "slow":
                for s, e in ((1, 2), (2, 3), (3, 4)):
                    pump_for(b, got, 0.6 * T)
                    notes.append(("before chunk", s, [f for f in b.failures() if f[1] == "x"]))
                    tg._chunk(p, "x", 4, s, e); p.flush()
            else:
                wait_until(lambda: (b.pump(0.05), [f for f in b.failures() if f[1] == "x"])[1], 10, "timeout report")
                notes.append(("in_flight after timeout", "x" in b.in_flight()))
                if case == "late_last":
                    tg._chunk(p, "x", 4, 1, 4); p.flush()
                elif case == "restart":
                    p.abort("x", "retracted", restart=True)
                    tg._capture(p, "x", 4, chunk=2); p.flush()
                elif case == "restart_partial":   # restart abort after timeout, with a later row first
                    tg._chunk(p, "x", 4, 1, 2)
                    p.abort("x", "retracted", restart=True)
                    tg._capture(p, "x", 4, chunk=2); p.flush()
            tg._capture(p, "m2", 3); p.flush()
            tg._take(b, got, lambda: "m2" in got, "m2")
        tg._take(b, got, lambda: not b._sources, "retire")
        reps = [f for f in b.failures() if f[1] == "x"]
        st = b.stats()
        return dict(case=case, delivered="x" in got, reports=[(f[0], str(f[2])[-110:]) for f in reps] if reps else [],
                    in_flight=b.in_flight(), notes=notes, lost=st["lost"])
    finally:
        b.close()

if __name__ == "__main__":
    for case in sys.argv[1:]:
        print(json.dumps(run(case), default=str, indent=1))
