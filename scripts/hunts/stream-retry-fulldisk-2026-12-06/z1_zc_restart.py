"""A zero-copy Subscriber holds samples (unreleased) of producer incarnation A while A is SIGKILLed
(or exits hard / closes) and incarnation B (same producer_id, same endpoint) captures. Held bytes
must never change; every committed rid of A (its first PAUSE requests, flushed) and all of B
delivered once or named.  usage: python z1_zc_restart.py MODE(kill|hard|close) RUNS [durable]"""
import sys, signal, random, time, shutil, json, gc
from hd10 import *
from hscapture import Subscriber
MODE = sys.argv[1]; RUNS = int(sys.argv[2]); DUR = len(sys.argv) > 3 and sys.argv[3] == "durable"

def one(seed):
    rng = random.Random(seed)
    ep, epd = new_ep()
    tmp = Path("/tmp/hunt-h10/work") / f"z1-{seed}-{uuid.uuid4().hex[:6]}"; tmp.mkdir(parents=True)
    pid = f"h10z1-{seed}-{uuid.uuid4().hex[:4]}"
    ra = requests(120, prefix="a", seed=seed, tokens=(1, 6, 20), chunks=(4, 64))
    rb = requests(120, prefix="b", seed=seed + 1, tokens=(1, 6, 20), chunks=(4, 64))
    sizes = {r: t for r, t, _ in ra + rb}
    PAUSE = 80
    cap = rng.choice([96, 256]) << 10
    A = ProducerProc({"endpoint": ep, "requests": ra, "producer_id": pid, "consumers": 1, "rate": 300,
                      "interleave": 4, "capacity": cap, "pause_after": PAUSE,
                      "hard_exit": MODE == "hard", "close_on_stdin": MODE != "kill"}, tmp)
    sub = Subscriber(ep, zero_copy=True, name=(f"z{seed}" if DUR else ""), notice_grace_s=0.5)
    held = []; got = []; probs = []
    B = None
    try:
        A.wait_event("ready")
        def pump(t):
            end = time.monotonic() + t
            while time.monotonic() < end:
                s = sub.poll(0.05)
                if s is None: continue
                got.append(s.rid)
                if rng.random() < 0.35 and len(held) < 40: held.append(s)
                else:
                    try: check_exact(s.tensors, s.token_ids, s.rid, sizes[s.rid])
                    except AssertionError as e: probs.append(("bytes", str(e)[:120]))
                    s.release()
        t0 = time.monotonic()
        while A.poll_event("paused") is None and time.monotonic() - t0 < 60:
            pump(0.1)
        pump(0.3)
        if MODE == "kill":
            A.kill(signal.SIGKILL)
        else:
            # resume A: it captures the rest then closes / hard-exits
            A.send("go"); A.wait_event("captured", 60); A.send("go")
        A.wait(30)
        pump(0.2)
        B = ProducerProc({"endpoint": ep, "requests": rb, "producer_id": pid, "consumers": 0,
                          "rate": 300, "interleave": 4, "capacity": cap, "close_on_stdin": True}, tmp)
        B.wait_event("ready")
        t0 = time.monotonic()
        while B.poll_event("captured") is None and time.monotonic() - t0 < 60:
            pump(0.1)
        pump(1.5)
        # held bytes intact?
        for s in held:
            try: check_exact(s.tensors, s.token_ids, s.rid, sizes[s.rid])
            except AssertionError as e: probs.append(("held_bytes_changed", s.rid, str(e)[:120]))
        B.send("go"); B.wait_event("done", 30)
        pump(1.0)
        for s in held:
            try: check_exact(s.tensors, s.token_ids, s.rid, sizes[s.rid])
            except AssertionError as e: probs.append(("held_bytes_changed_after_B_close", s.rid, str(e)[:120]))
        for s in held: s.release()
        sub.close()
        st = sub.stats()
        named = set().union(*[set(st[k]) for k in ("dropped", "incomplete", "rejected", "in_flight")]) | set(st["undelivered"])
        committed = {r for r, _, _ in (ra if MODE == "kill" else ra)[: (PAUSE if MODE == "kill" else len(ra))]} | {r for r, _, _ in rb}
        dups = sorted({r for r in got if got.count(r) > 1})
        silent = sorted(r for r in committed if r not in got and r not in named)
        false = sorted(r for r in got if r in named)
        lost = st["lost"]
        lost_n = sum(l["count"] for l in lost)
        prob = bool(probs or dups or false or (silent and lost_n < len(silent)) or (lost and MODE != "kill"))
        print(json.dumps({"seed": seed, "mode": MODE, "durable": DUR, "problem": prob, "got": len(set(got)),
                          "held": len(held), "probs": probs[:5], "dups": dups[:5], "silent": silent[:10],
                          "n_silent": len(silent), "false": false[:5], "lost": lost[:3],
                          "named": len(named), "unresolved": st["unresolved"][:3]}), flush=True)
        return prob
    finally:
        for P in (A, B):
            if P: P.send(); P.stop()
        try: sub.close()
        except Exception: pass
        if DUR:
            try: Subscriber(ep, name=f"z{seed}").unsubscribe()
            except Exception as e: pass
        shutil.rmtree(epd, ignore_errors=True)

bad = sum(one(5000 + s) for s in range(RUNS))
print(f"RESULT {bad}/{RUNS} runs with problems")
