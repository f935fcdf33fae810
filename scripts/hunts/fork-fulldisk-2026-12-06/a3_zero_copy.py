"""Area 3: borrowed (zero-copy) samples held while a producer process keeps writing.
usage: python a3_zero_copy.py RUNS anon|durable [POLICY drop|wait] [HOLD_EVERY] [PARTIAL_HOLD_S]
Holds every HOLD_EVERY-th sample (a clone taken at receipt), releases the rest at once, reads
until the producer is done; then compares each held sample with its clone (and the source);
closes the subscriber and checks held tensors are empty or unchanged; keeps capturing after
the close (a second producer phase) and checks again."""
import sys, gc
from he8 import *
from hscapture import Subscriber

RUNS = int(sys.argv[1]); KIND = sys.argv[2]
POLICY = sys.argv[3] if len(sys.argv) > 3 else "drop"
HOLD_EVERY = int(sys.argv[4]) if len(sys.argv) > 4 else 25
PHS = float(sys.argv[5]) if len(sys.argv) > 5 else 1.0
RELEASE_AT_END = int(sys.argv[6]) if len(sys.argv) > 6 else 1

def snap(s):
    return {k: v.clone() for k, v in s.tensors.items()}, s.token_ids.clone()

def same(s, c):
    t, ids = c
    if not s.borrowed and all(x.numel() == 0 for x in (*s.tensors.values(), s.token_ids)):
        return "empty"
    ok = torch.equal(s.token_ids, ids) and all(torch.equal(s.tensors[k], t[k]) for k in t)
    return "same" if ok else "CHANGED"

import torch
def one(seed):
    ep, epd = new_ep()
    tmp = Path("/tmp/hunt-e8-work") / f"a3-{KIND}-{seed}-{uuid.uuid4().hex[:6]}"; tmp.mkdir(parents=True)
    reqs = requests(800, seed=seed, tokens=(8, 32, 64, 100), chunks=(16, 64, 128))
    sizes = {r: t for r, t, _ in reqs}
    name = f"he8-a3-{seed}-{uuid.uuid4().hex[:4]}" if KIND == "durable" else ""
    p = ProducerProc({"endpoint": ep, "requests": reqs, "producer_id": f"he8-a3-{seed}",
                      "consumers": 1, "rate": 400, "interleave": 3, "capacity": 256 << 10,
                      "policy": POLICY, "wait_timeout_s": 0.2 if POLICY == "wait" else 0.0,
                      "close_on_stdin": True, "seed": seed}, tmp)
    held = []; got = 0; bad_src = []; dup = set(); seen = set()
    sub = None
    try:
        p.wait_event("ready")
        sub = Subscriber(ep, zero_copy=True, name=name, partial_hold_s=PHS)
        sub.wait_ready(10)
        last = time.monotonic()
        while time.monotonic() - last < 2.0 or p.poll_event("captured") is None:
            s = sub.poll(timeout=0.1)
            if s is None:
                continue
            last = time.monotonic(); got += 1
            if s.rid in seen: dup.add(s.rid)
            seen.add(s.rid)
            try:
                check_exact(s.tensors, s.token_ids, s.rid, sizes[s.rid])
            except AssertionError as e:
                bad_src.append(str(e)[:100])
            if got % HOLD_EVERY == 1:
                held.append((s, snap(s)))
            else:
                s.release()
            # check the held ones as we go
            for hs, c in held:
                if same(hs, c) == "CHANGED":
                    bad_src.append(f"held {hs.rid} changed while subscriber open (after {got} samples)")
        st0 = sub.stats()
        time.sleep(3.0)          # held samples still pinning; a further pump
        for _ in range(30):
            x = sub.poll(timeout=0.1)
            if x is not None:
                got += 1; seen.add(x.rid); x.release()
        open_res = [same(hs, c) for hs, c in held]
        n_pinned_report = len(set(sub.stats()["dropped"]))
        if RELEASE_AT_END:
            for hs, c in held: hs.release()
            t0 = time.monotonic()
            while time.monotonic() - t0 < 4:
                x = sub.poll(timeout=0.1)
                if x is not None:
                    got += 1
                    if x.rid in seen: dup.add(x.rid)
                    seen.add(x.rid); x.release()
        st = sub.stats()
        sub.close()
        st = sub.stats() if not RELEASE_AT_END else st
        closed_res = [same(hs, c) for hs, c in held]
        sub = None; gc.collect()
        gc_res = [same(hs, c) for hs, c in held]
        dropped = set(st.get("dropped", {})); inc = set(st.get("incomplete", {}))
        missing = set(sizes) - seen - dropped - inc - set(st.get("rejected", {})) - set(st.get("undelivered") or {}) - set(st.get("in_flight") or {})
        prob = bool(bad_src or dup or "CHANGED" in open_res + closed_res + gc_res or missing)
        print(json.dumps({"seed": seed, "kind": KIND, "problem": prob, "got": got, "held": len(held),
                          "dropped": len(dropped), "dropped_while_pinned": n_pinned_report, "undelivered": len(st.get("undelivered") or {}), "incomplete": len(inc), "lost": st.get("lost"),
                          "silent": sorted(missing)[:10], "n_silent": len(missing),
                          "open": {x: open_res.count(x) for x in set(open_res)},
                          "closed": {x: closed_res.count(x) for x in set(closed_res)},
                          "after_gc": {x: gc_res.count(x) for x in set(gc_res)},
                          "bad": bad_src[:5], "dups": sorted(dup)[:5]}), flush=True)
        return prob
    finally:
        if sub is not None: sub.close()
        if name:
            try: Subscriber(ep, name=name).unsubscribe()
            except Exception as e: print("unsub", e)
        p.send(); p.stop()
        shutil.rmtree(epd, ignore_errors=True)

bad = 0
for s in range(RUNS):
    bad += one(3000 + s)
print(f"RESULT {bad}/{RUNS} runs with problems")
