"""Area 5: anonymous follower idle (no calls) past producer_timeout_s (10 s default) while its
producer lives and captures; or the producer SIGSTOPped for 2.5 s then resumed.
usage: python a5_idle.py RUNS idle|stop [IDLE_S]"""
import sys, signal
from he8 import *
from hscapture import Subscriber
RUNS = int(sys.argv[1]); MODE = sys.argv[2]; IDLE = float(sys.argv[3]) if len(sys.argv) > 3 else 12.0

def one(seed):
    ep, epd = new_ep()
    tmp = Path("/tmp/hunt-e8-work") / f"a5-{MODE}-{seed}-{uuid.uuid4().hex[:6]}"; tmp.mkdir(parents=True)
    n = int(60 * (IDLE + 4)) if MODE == "idle" else 400
    reqs = requests(n, seed=seed, tokens=(4, 16, 32), chunks=(8, 32))
    sizes = {r: t for r, t, _ in reqs}
    p = ProducerProc({"endpoint": ep, "requests": reqs, "producer_id": f"he8-a5-{seed}",
                      "consumers": 1, "rate": 60 if MODE == "idle" else 100, "interleave": 2,
                      "capacity": 16 << 20, "policy": "drop", "close_on_stdin": True, "seed": seed}, tmp)
    got = []; bad = []; sub = None
    try:
        p.wait_event("ready")
        sub = Subscriber(ep); sub.wait_ready(10)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.0:
            s = sub.poll(timeout=0.1)
            if s: got.append(s.rid)
        if MODE == "idle":
            time.sleep(IDLE)                     # no call into the subscriber
        else:
            pid = p.wait_event("ready")["pid"]
            for k in range(3):
                os.kill(pid, signal.SIGSTOP); time.sleep(2.5); os.kill(pid, signal.SIGCONT)
                t1 = time.monotonic()
                while time.monotonic() - t1 < 1.0:
                    s = sub.poll(timeout=0.05)
                    if s: got.append(s.rid)
        last = time.monotonic()
        while time.monotonic() - last < 2.0 or p.poll_event("captured") is None:
            s = sub.poll(timeout=0.1)
            if s:
                last = time.monotonic(); got.append(s.rid)
                try: check_exact(s.tensors, s.token_ids, s.rid, sizes[s.rid])
                except AssertionError as e: bad.append(str(e)[:100])
            if time.monotonic() - last > 30: break
        st = sub.stats()
        rep = set(st["dropped"]) | set(st["incomplete"]) | set(st["rejected"])
        dups = sorted({r for r in got if got.count(r) > 1})
        missing = set(sizes) - set(got) - rep
        prob = bool(bad or dups or missing or st.get("lost"))
        print(json.dumps({"seed": seed, "mode": MODE, "problem": prob, "requests": n, "got": len(set(got)),
                          "reported": len(rep), "lost": st.get("lost"), "n_silent": len(missing),
                          "silent": sorted(missing)[:10], "dups": dups[:5], "bad": bad[:3],
                          "incomplete": dict(list(st["incomplete"].items())[:3])}), flush=True)
        return prob
    finally:
        if sub is not None: sub.close()
        p.send(); p.stop(); shutil.rmtree(epd, ignore_errors=True)

bad = 0
for s in range(RUNS):
    bad += one(5000 + s)
print(f"RESULT {bad}/{RUNS} runs with problems")
