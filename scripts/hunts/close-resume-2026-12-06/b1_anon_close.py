"""Anonymous Subscriber closes while its producer(s) live (hscapture/_closing.py).
NPROD producers, small drop ring (drops in the backlog), chunked interleaved samples with aborts.
MODE paused: producers pause after K requests (flushed); subscriber closes while they wait:
  every rid of the first K must be delivered or named exactly once; no lost range.
MODE fast: close while producers capture at full speed: no lost range, no rid delivered AND
  named, no rid named twice; close time printed.
ZC=1: zero_copy, hold up to 40 samples unreleased; FILTER=1: rid_filter keeps even-numbered rids.
usage: python b1_anon_close.py MODE RUNS [NPROD] [CAP_KIB]"""
import sys, os, random, time, json, shutil
from pathlib import Path
from hd9 import *
from hscapture import Subscriber

MODE = sys.argv[1]; RUNS = int(sys.argv[2]); NPROD = int(sys.argv[3]) if len(sys.argv) > 3 else 1
CAP = int(sys.argv[4]) if len(sys.argv) > 4 else 256
ZC = bool(os.environ.get("ZC")); FILTER = bool(os.environ.get("FILTER"))

def one(seed):
    rng = random.Random(seed)
    tmp = Path("/tmp/hunt-h9/work") / f"b1-{MODE}-{seed}-{uuid.uuid4().hex[:6]}"; tmp.mkdir(parents=True)
    prods = []; eps = []; sizes = {}; K = 150
    for j in range(NPROD):
        ep, epd = new_ep(); eps.append((ep, epd))
        reqs = requests(400, prefix=f"p{j}", seed=seed * 10 + j, tokens=(1, 6, 20, 48), chunks=(4, 16, 64))
        sizes.update({r: t for r, t, _ in reqs})
        aborts = [r for i, (r, t, c) in enumerate(reqs) if t > c and i % 9 == 0]
        spec = {"endpoint": ep, "requests": reqs, "producer_id": f"h9b1-{seed}-{j}", "consumers": 1,
                "rate": 0 if MODE == "fast" else 400, "interleave": 5, "capacity": CAP << 10,
                "policy": "drop", "aborts": aborts, "close_on_stdin": True}
        if MODE == "paused": spec["pause_after"] = K
        prods.append(ProducerProc(spec, tmp))
    filt = (lambda r: int(r.split("-")[1]) % 2 == 0) if FILTER else None
    try:
        for p in prods: p.wait_event("ready")
        sub = Subscriber([e for e, _ in eps], zero_copy=ZC, rid_filter=filt)
        got = []; held = []
        t_end = time.monotonic() + (30 if MODE == "paused" else rng.uniform(0.2, 1.5))
        while time.monotonic() < t_end:
            if MODE == "paused" and all(p.poll_event("paused") for p in prods):
                if rng.random() < 0.5: break
                t_end = min(t_end, time.monotonic() + rng.uniform(0, 0.3))
            s = sub.poll(timeout=0.01)
            if s is not None:
                got.append(s.rid)
                if ZC and len(held) < 40 and rng.random() < 0.5: held.append(s)
                elif ZC: s.release()
        if MODE == "paused":
            for p in prods: p.wait_event("paused", timeout=60)
        t0 = time.monotonic(); sub.close(); dt = time.monotonic() - t0
        st = sub.stats()
        und = list(st.get("undelivered") or [])
        dropped = set(st["dropped"]); inc = set(st["incomplete"]); rej = set(st["rejected"])
        named = [*und, *dropped, *inc, *rej]
        twice = sorted({r for r in named if named.count(r) > 1})
        deliv_and_named = sorted(set(got) & set(named))
        dup_deliv = sorted({r for r in got if got.count(r) > 1})
        lost = [(l["first"], l["count"], l["reason"][:90]) for l in st["lost"]]
        silent = []
        if MODE == "paused":
            want = {r for j in range(NPROD) for r, _, _ in requests(400, prefix=f"p{j}", seed=seed * 10 + j, tokens=(1, 6, 20, 48), chunks=(4, 16, 64))[:K]}
            if filt: want = {r for r in want if filt(r)}
            silent = sorted(want - set(got) - set(named) - set(st.get("in_flight") or {}))
        prob = bool(lost or deliv_and_named or dup_deliv or silent or (twice and os.environ.get("STRICT")) or dt > 2.0)
        print(json.dumps({"seed": seed, "prob": prob, "close_s": round(dt, 3), "got": len(got), "undelivered": len(und),
                          "dropped": len(dropped), "incomplete": len(inc), "rejected": len(rej), "in_flight": len(st.get("in_flight") or {}), "lost": lost[:4],
                          "named_twice": twice[:8], "n_named_twice": len(twice), "delivered_and_named": deliv_and_named[:8],
                          "dup_deliv": dup_deliv[:5], "silent": silent[:8], "n_silent": len(silent)}), flush=True)
        return prob
    finally:
        for p in prods:
            p.send(); p.send()
        for p in prods:
            try: p.wait(30)
            except Exception: pass
            p.stop()
        for _, d in eps: shutil.rmtree(d, ignore_errors=True)

bad = sum(one(3000 + s) for s in range(RUNS))
print(f"RESULT {bad}/{RUNS} runs with problems")
