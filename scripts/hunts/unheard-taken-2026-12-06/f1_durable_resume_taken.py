"""A durable subscriber 'd' reads and releases w0, then closes (keeps its place). The
producer's next capture x returns True and it is SIGKILLed before committing it. 'd' comes
back (resumes the kept ring of the dead producer: nothing new in it). The segment header's
'taken' says 2. Expect x (seq 1) reported lost to the resumer (GUARANTEES gap 5: 'a durable
one coming back while the segment is kept reports their numbers as a lost range')."""
import sys, time
from common import *
import hscapture

def run(i, extra):
    setup_env()
    ep = new_endpoint()
    D = hscapture.Subscriber(ep, name="d", producer_timeout_s=1.0)
    plan = [["consumers", 1], ["cap", "w0", 8, 8]] + [["cap", f"e{k}", 8, 8] for k in range(extra)] + [
            ["flush"], ["emit", "w"], ["stdin"], ["chunk", "x", 8, 0, 8], ["flush_no"], ["kill"]]
    P = Prod({"endpoint": ep, "kw": {"publish_interval_s": 5.0, "commit_grace_s": 5.0}, "plan": plan})
    got = {}
    take(D, got, lambda: len(got) == 1 + extra, "w0 at D", timeout=20)
    D.close()
    P.send()
    P.wait_event("capd"); P.wait(10)
    D2 = hscapture.Subscriber(ep, name="d", producer_timeout_s=1.0)
    got2 = {}
    t0 = time.monotonic()
    take(D2, got2, lambda: time.monotonic() - t0 > 3, "retire", timeout=20)
    st = D2.stats()
    named = set(st["dropped"]) | set(st["incomplete"]) | set(st["rejected"])
    lost = [(x["first"], x["count"]) for x in st["lost"]]
    xseq = P.wait_event("capd")["caps"][0]["seq"]
    xs = "delivered" if "x" in got2 else "named" if "x" in named else \
        "lost" if any(f <= xseq < f + c for f, c in lost) else "SILENT"
    print(i, "resumer got", sorted(got2), "x:", xs, "lost", lost, "resumed", st.get("resumed"), flush=True)
    D2.unsubscribe() if hasattr(D2, "unsubscribe") else None
    D2.close(); cleanup_shm([P])
    return xs == "SILENT"

n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
extra = int(sys.argv[2]) if len(sys.argv) > 2 else 0
bad = sum(run(i, extra) for i in range(n))
print(f"RESULT {bad}/{n} runs with problems")
