"""A late subscriber B (attached after A read everything so far) reads nothing before the
producer's next capture returns True and the producer is SIGKILLed before committing it
(publish_interval_s/commit_grace_s keep the entry queued). Expect: x delivered or reported
(lost range covering its number) to A and to B."""
import sys, time
from common import *
import hscapture

def run(i):
    setup_env()
    ep = new_endpoint()
    A = hscapture.Subscriber(ep, producer_timeout_s=1.0)
    P = Prod({"endpoint": ep, "kw": {"publish_interval_s": 5.0, "commit_grace_s": 5.0},
              "plan": [["consumers", 1], ["cap", "w0", 8, 8], ["flush"], ["emit", "w"],
                       ["consumers", 2], ["chunk", "x", 8, 0, 8], ["flush_no"], ["kill"]]})
    P.wait_event("ready")
    gotA = {}; gotB = {}
    take(A, gotA, lambda: "w0" in gotA, "w0 at A", timeout=20)
    B = hscapture.Subscriber(ep, producer_timeout_s=1.0)
    t0 = time.monotonic()
    take_many([(A, gotA), (B, gotB)], lambda: P.proc.poll() is not None, "kill", timeout=20)
    time.sleep(0.1)
    take_many([(A, gotA), (B, gotB)], lambda: time.monotonic() - t0 > 4, "retire", timeout=20)
    print("x capture:", P.wait_event("capd")["caps"])
    out = []
    for nm, S, got in (("A", A, gotA), ("B", B, gotB)):
        st = S.stats()
        named = set(st["dropped"]) | set(st["incomplete"]) | set(st["rejected"]) | set(st["undelivered"]) | set(st["in_flight"])
        lost = [(x["first"], x["count"]) for x in st["lost"]]
        xs = "delivered" if "x" in got else "named" if "x" in named else \
            "lost" if any(f <= 1 < f + c for f, c in lost) else "SILENT"
        out.append((nm, xs, lost))
        S.close()
    cleanup_shm([P])
    print(i, out, flush=True)
    return any(o[1] == "SILENT" for o in out)

n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
bad = sum(run(i) for i in range(n))
print(f"RESULT {bad}/{n} runs with problems")
