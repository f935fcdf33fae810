"""Area 3: an anonymous follower process F is SIGSTOPped briefly (0.1-0.9 s) several times
while a durable subscriber D (attached once, then idle in this process) pins the producer's
small drop-policy ring full; optionally the producer restarts once while F is stopped.
Every rid the producer committed must reach F once or be named by rid (or range).

usage: python s3_sigstop_follower_full_ring.py RUNS [restart]
"""
import sys, json, signal, random, subprocess
from common import *
from hscapture import Subscriber
RUNS = int(sys.argv[1]); RESTART = len(sys.argv) > 2 and sys.argv[2] == "restart"
setup_env()

def one(run):
    rng = random.Random(run)
    ep = new_endpoint()
    pid = f"hd7-s3-{run}-{uuid.uuid4().hex[:4]}"
    n1 = 400
    reqs1 = [[f"e{i}", rng.choice([4, 12, 30]), rng.choice([4, 16])] for i in range(n1)]
    reqs2 = [[f"g{i}", rng.choice([4, 12, 30]), rng.choice([4, 16])] for i in range(200)]
    sizes = {r: t for r, t, _ in reqs1 + reqs2}
    sf = HERE / "specs" / f"sizes-{uuid.uuid4().hex[:6]}.json"; sf.write_text(json.dumps(sizes))
    stopfile = HERE / "specs" / f"stop-{uuid.uuid4().hex[:6]}"
    def plan(reqs, wait):
        pl = [["consumers", 2]] if wait else []
        for i, (r, t, c) in enumerate(reqs):
            pl.append(["cap", r, t, c])
            if i % 10 == 9:
                pl += [["flush"], ["sleep", 0.06]]
        return pl + [["flush"], ["emit", "captured"]]
    D = Subscriber(ep, name=f"hd7-pin-{uuid.uuid4().hex[:6]}")
    F = subprocess.Popen([PY, str(HERE / "s3_follower.py"), ep, str(stopfile), str(sf)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    prods = []
    try:
        p1 = Prod({"endpoint": ep, "producer_id": pid, "plan": plan(reqs1, True),
                   "capacity": 256 << 10, "hb": 0.05})
        prods.append(p1)
        # D attaches once (reads a little), then stays idle: its place pins the ring
        wait_until(lambda: (D.poll(0.02), D.stats().get("counts", D.stats()).get("attached", 0) >= 1 or bool(D.stats()["producers"]))[1] and p1.has("ready"), 30, "D attached", step=0)
        for _ in range(20): D.poll(0.01)
        stops = 0
        while not p1.has("captured"):
            time.sleep(rng.uniform(0.05, 0.3))
            F.send_signal(signal.SIGSTOP); time.sleep(rng.uniform(0.1, 0.9)); F.send_signal(signal.SIGCONT)
            stops += 1
        p1.wait()
        if RESTART:
            F.send_signal(signal.SIGSTOP)
            p2 = Prod({"endpoint": ep, "producer_id": pid, "plan": plan(reqs2, False),
                       "capacity": 256 << 10, "hb": 0.05})
            prods.append(p2)
            p2.wait_event("ready"); time.sleep(0.3)
            F.send_signal(signal.SIGCONT)
            p2.wait_event("captured"); p2.wait()
        stopfile.write_text("x")
        out, err = F.communicate(timeout=60)
        res = json.loads(out.strip().splitlines()[-1])
        class S: pass
        got = {}
        for rid, oks in res["got"].items():
            got[rid] = []
            for ok in oks:
                s = S(); s._exact = ok; s.num_tokens = sizes[rid]; got[rid].append(s)
        probs, summ = verdict(f"run{run} stops={stops} restart={RESTART}", prods, got, res["stats"])
        print("   F counts:", {k: v for k, v in res["counts"].items() if k in ("dropped_samples", "lost_notices", "stale_notices", "before_attach", "attached", "samples")})
        return bool(probs)
    finally:
        if F.poll() is None: F.kill()
        D.close()
        for p in prods: p.kill()
        cleanup_shm(prods)

bad = sum(one(r) for r in range(RUNS))
print(f"RESULT {bad}/{RUNS} runs with problems")
