"""The only subscriber B attaches after one capture (w0, named to it by the unheard entry);
the next capture x returns True and the producer is SIGKILLed before committing it.
Expect x reported lost (seq 1) to B; w0 reported dropped."""
import sys, time
from common import *
import hscapture

def run(i):
    setup_env()
    ep = new_endpoint()
    P = Prod({"endpoint": ep, "kw": {"publish_interval_s": 5.0, "commit_grace_s": 5.0},
              "plan": [["cap", "w0", 8, 8], ["flush"], ["emit", "w"],
                       ["consumers", 1], ["sleep", 0.3], ["chunk", "x", 8, 0, 8], ["flush_no"], ["kill"]]})
    P.wait_event("w")
    B = hscapture.Subscriber(ep, producer_timeout_s=1.0)
    gotB = {}
    t0 = time.monotonic()
    take(B, gotB, lambda: time.monotonic() - t0 > 5, "retire", timeout=20)
    st = B.stats()
    named = set(st["dropped"]) | set(st["incomplete"]) | set(st["rejected"]) | set(st["undelivered"]) | set(st["in_flight"])
    lost = [(x["first"], x["count"]) for x in st["lost"]]
    xs = "delivered" if "x" in gotB else "named" if "x" in named else \
        "lost" if any(f <= 1 < f + c for f, c in lost) else "SILENT"
    print(i, "x capture:", P.wait_event("capd")["caps"][0]["ok"], "w0:", "dropped" if "w0" in st["dropped"] else "?", "x:", xs, lost, flush=True)
    B.close()
    cleanup_shm([P])
    return xs == "SILENT"

n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
bad = sum(run(i) for i in range(n))
print(f"RESULT {bad}/{n} runs with problems")
