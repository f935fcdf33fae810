"""Area 4: a second `hscapture drain` into the directory a running drain writes (a user who
runs the command twice). The second must be refused (SubscriptionInUseError) without touching
the first's shards; at the end every committed rid is in the shards exactly once, bit-exact,
or named by a report.

usage: python s4_two_drains_same_dir.py RUNS
"""
import sys, signal, time, shutil, json
from pathlib import Path
from hd7 import *
RUNS = int(sys.argv[1])

def one(i):
    ep, epd = new_ep()
    tmp = Path("/tmp/hunt-d7-work") / f"s4-{i}-{uuid.uuid4().hex[:6]}"; tmp.mkdir(parents=True)
    out = tmp / "out"
    reqs = requests(600, seed=i, tokens=(1, 6, 20), chunks=(4, 64))
    sizes = {r: t for r, t, _ in reqs}
    p = ProducerProc({"endpoint": ep, "requests": reqs, "producer_id": f"hd7-s4-{i}",
                      "consumers": 1, "rate": 200, "interleave": 4, "capacity": 4 << 20,
                      "policy": "wait", "wait_timeout_s": 10.0, "close_on_stdin": True}, tmp)
    try:
        p.wait_event("ready")
        a = start_drain(ep, out, "--flush-every", "16K", "--idle-timeout", "3")
        wait_until(lambda: len(set(durable_rids(out))) >= 100, 30, "A wrote 100")
        bs = []
        for k in range(3):
            b = start_drain(ep, out, "--flush-every", "16K", "--idle-timeout", "2")
            rcb, repb, errb = drain_report(b, timeout=60)
            bs.append((rcb, (errb.strip().splitlines() or [""])[-1][:160], repb.get("samples")))
            time.sleep(0.3)
        p.wait_event("captured", timeout=60)
        rca, repa, erra = drain_report(a, timeout=60)
        reported = reported_rids(repa) | set().union(*(set() for _ in bs))
        rids = durable_rids(out)
        dups = sorted({r for r in rids if rids.count(r) > 1})
        missing = sorted(set(sizes) - set(rids) - reported)
        try:
            n = verify_shards(out, sizes); bad = None
        except Exception as e:
            n = -1; bad = repr(e)[:300]
        res = {"run": i, "A_rc": rca, "A_samples": repa.get("samples"), "B": bs, "written": len(set(rids)),
               "dups": dups[:10], "silent": missing[:10], "n_silent": len(missing), "verify": n, "bad": bad}
        print(json.dumps(res), flush=True)
        return bool(dups or missing or bad)
    finally:
        p.send(); p.stop(); shutil.rmtree(epd, ignore_errors=True)

bad = sum(one(i) for i in range(RUNS))
print(f"RESULT {bad}/{RUNS} runs with problems")
