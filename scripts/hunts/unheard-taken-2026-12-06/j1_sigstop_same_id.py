"""Producer P1 (id 'hr', endpoint 1) is SIGSTOPped for longer than the subscriber's
producer_timeout_s; meanwhile P2 with the same producer id starts at endpoint 2 (a replacement
server). The subscriber retires P1 as 'restarted' (silent too long). P1 is SIGCONTed and
captures 20 more samples, then closes. Expect each of P1's later samples delivered or
reported (a conflict, dropped, lost...)."""
import sys, time, signal
from common import *
import hscapture

def run(i):
    setup_env()
    ep1, ep2 = new_endpoint(), new_endpoint()
    S = hscapture.Subscriber([ep1, ep2], producer_timeout_s=1.0)
    P1 = Prod({"endpoint": ep1, "plan": [["consumers", 1], ["cap", "a0", 8, 8], ["flush"], ["emit", "a"], ["stdin"]] +
               [["cap", f"late{k}", 8, 8] for k in range(20)] + [["flush"], ["sleep", 0.5]]})
    got = {}
    take(S, got, lambda: "a0" in got, "a0", timeout=20)
    P1.wait_event("a")
    P1.kill(signal.SIGSTOP)
    t0 = time.monotonic()
    take(S, got, lambda: time.monotonic() - t0 > 1.5, "silence", timeout=20)
    P2 = Prod({"endpoint": ep2, "plan": [["consumers", 1], ["cap", "b0", 8, 8], ["flush"], ["sleep", 3.0]]})
    take(S, got, lambda: "b0" in got, "b0", timeout=20)
    P1.kill(signal.SIGCONT)
    P1.send()
    take(S, got, lambda: P1.has("closed") and P2.has("closed"), "close", timeout=30)
    t0 = time.monotonic()
    take(S, got, lambda: time.monotonic() - t0 > 2.5, "retire", timeout=20)
    st = S.stats()
    named = set(st["dropped"]) | set(st["incomplete"]) | set(st["rejected"]) | set(st["undelivered"]) | set(st["in_flight"])
    late = [f"late{k}" for k in range(20)]
    silent = [r for r in late if r not in got and r not in named]
    print(i, "got", len([r for r in late if r in got]), "named", len([r for r in late if r in named]),
          "silent", len(silent), "lost", [(x["epoch"] & 0xffff, x["first"], x["count"], x["reason"][:50]) for x in st["lost"]],
          "conflicts", list(st["conflicts"]), "stale", st.get("stale_notices"), flush=True)
    S.close(); P1.wait(10); P2.wait(10); cleanup_shm([P1, P2])
    return bool(silent) and not st["conflicts"] and not st["lost"]

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
bad = sum(run(i) for i in range(n))
print(f"RESULT {bad}/{n} runs with problems")
