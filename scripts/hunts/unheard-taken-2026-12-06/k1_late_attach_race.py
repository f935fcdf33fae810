"""Late subscribers attaching at random moments while 3 capture threads write chunked samples
(12 tokens, 3 chunks) and a CPU spinner thread contends for the producer's GIL. Each
subscriber: false `lost` ranges (a number of a rid delivered or named to it), delivered AND
reported, duplicates, silent samples whose numbers are all >= its floor (taken at attach)."""
import sys, time, random, threading, json
from common import *
import hscapture

def sub_thread(ep, P, delay, out):
    time.sleep(delay)
    S = hscapture.Subscriber(ep, producer_timeout_s=1.0, incomplete_timeout_s=30)
    got, floor = {}, [None]
    def until():
        if floor[0] is None:
            for src in list(S._registry.sources.values()):
                floor[0] = src.seqs.floor
        return P.has("closed")
    try:
        take(S, got, until, "close", timeout=120)
        t0 = time.monotonic()
        take(S, got, lambda: time.monotonic() - t0 > 2.0, "retire", timeout=20)
        out.append((delay, floor[0], got, S.stats()))
    finally:
        S.close()

def check(P, res):
    ev = P.wait_event("closed")
    seqs = ev["seqs"]
    rid_of = {s: r for s, r, ts, tc in seqs}
    by_rid = {}
    for s, r, ts, tc in seqs:
        by_rid.setdefault(r, []).append((s, ts, tc))
    bad = 0
    for delay, floor, got, st in res:
        named = set(st["dropped"]) | set(st["incomplete"]) | set(st["rejected"]) | set(st["undelivered"]) | set(st["in_flight"])
        probs = {}
        false_lost = []
        for x in st["lost"]:
            if x["first"] < 0:
                continue
            for q in range(x["first"], x["first"] + x["count"]):
                r = rid_of.get(q)
                if r is not None and (r in got or r in named):
                    false_lost.append((q, r, "delivered" if r in got else "named", x["reason"][:70]))
        if false_lost:
            probs["false_lost"] = false_lost[:5]
        both = sorted(set(got) & (set(st["dropped"]) | set(st["incomplete"]) | set(st["rejected"])))
        if both:
            probs["both"] = both[:5]
        dups = [r for r, l in got.items() if len(l) > 1]
        if dups:
            probs["dups"] = dups[:5]
        badbytes = [r for r, l in got.items() if any(s._exact is not True for s in l)]
        if badbytes:
            probs["wrong_bytes"] = badbytes[:5]
        lost = [(x["first"], x["count"]) for x in st["lost"] if x["first"] >= 0]
        silent = []
        if floor is not None:
            for r, rows in by_rid.items():
                if max(s for s, _, _ in rows) >= floor and r not in got and r not in named and \
                        not any(f <= s < f + c for s, _, _ in rows for f, c in lost):
                    silent.append(r)
        if silent:
            probs["silent"] = silent[:5]
        if probs:
            bad += 1
            print(f"  sub@{delay:.2f} floor={floor} got={len(got)} named={len(named)} lost={st['lost'][:3]} {probs}", flush=True)
    return bad

def run(seed, nsubs, dur, spec_extra):
    rng = random.Random(seed)
    setup_env()
    ep = new_endpoint()
    spec = {"endpoint": ep, "hb": 0.05, "dur": dur, "threads": 3, "spin": 1, "tokens": 12, "ch": 4}
    spec.update(spec_extra)
    P = Prod.__new__(Prod)
    import uuid, subprocess
    f = HERE / f"spec-{uuid.uuid4().hex[:8]}.json"; f.write_text(json.dumps(spec))
    P.proc = subprocess.Popen([PY, str(HERE / "prod2.py"), str(f)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    P.events = []; P.cond = threading.Condition(); P.eof = False; P.errbuf = []
    threading.Thread(target=P._read, daemon=True).start()
    threading.Thread(target=P._readerr, daemon=True).start()
    P.wait_event("ready")
    res = []
    ths = [threading.Thread(target=sub_thread, args=(ep, P, rng.uniform(0.2, dur - 0.5), res)) for _ in range(nsubs)]
    for t in ths: t.start()
    for t in ths: t.join()
    P.wait(20)
    b = check(P, res)
    print(f"seed {seed}: {b}/{len(res)} subscribers with problems; producer {P.wait_event('closed')['stats'].get('dropped')} dropped, {len(P.wait_event('closed')['seqs'])} rows", flush=True)
    cleanup_shm([P])
    return b

if __name__ == "__main__":
    a, b = int(sys.argv[1]), int(sys.argv[2])
    extra = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    nsubs = extra.pop("nsubs", 8); dur = extra.pop("dur", 4)
    tot = 0; n = 0
    for s in range(a, b):
        tot += run(s, nsubs, dur, extra); n += nsubs
    print(f"RESULT {tot}/{n} subscribers with problems")
