"""Randomized: K incarnations of one producer id; subscribers A (anon, always polls),
D (durable, always polls), B (anon, polls only at chosen moments: late / across restarts).
Incarnations end by close or SIGKILL (right after a flush, often between chunks)."""
import random, sys, os, signal
from common import *
setup_env()
from hscapture import Subscriber

def make_plan(rng, k, n, first):
    plan = [["consumers", 3]] if first else [["emit", "started"], ["stdin"]]
    open_ = {}     # rid -> [tokens, chunk, next_start]
    i = 0
    ops = []
    while i < n or open_:
        if i < n and (len(open_) < rng.choice([1, 2, 3]) or not open_):
            rid = f"i{k}-{i}"; i += 1
            tokens = rng.choice([1, 2, 3, 5, 8])
            ch = rng.choice([1, 2, 4, 8])
            open_[rid] = [tokens, ch, 0, rng.random()]
        rid = rng.choice(list(open_))
        tokens, ch, s, fate = open_[rid]
        e = min(tokens, s + ch)
        plan.append(["chunk", rid, tokens, s, e])
        if e == tokens:
            del open_[rid]
        else:
            open_[rid][2] = e
            if fate < 0.12 and s == 0:
                plan.append(["abort", rid, True])      # restart: capture again from 0
                open_[rid][2] = 0
                open_[rid][3] = 1.0
            elif fate < 0.2 and s == 0:
                plan.append(["abort", rid, False])
                del open_[rid]
        if rng.random() < 0.3:
            plan.append(["flush"])
    plan.append(["flush"])
    return plan

def run(seed, K=3, n=12, verbose=False):
    rng = random.Random(seed)
    ep = new_endpoint()
    prods = []
    ga, gb, gd = {}, {}, {}
    A = Subscriber(ep); B = Subscriber(ep); D = Subscriber(ep, name=f"d{seed}")
    subs = [(A, ga), (D, gd)]
    def poll_ad(until, what, timeout=60):
        def step():
            for s, g in subs:
                x = s.poll(timeout=0.005)
                if x is not None:
                    x._exact = None
                    try:
                        check_exact(x.tensors, x.token_ids, x.rid, x.num_tokens); x._exact = True
                    except Exception as e:
                        x._exact = str(e)
                    g.setdefault(x.rid, []).append(x); x.release()
            return until()
        wait_until(step, timeout, what, step=0)
    b_mode = []
    try:
        for k in range(1, K + 1):
            plan = make_plan(rng, k, n, k == 1)
            end = rng.choice(["close", "kill", "kill_mid"]) if k > 1 else "close"
            if end == "kill_mid":
                # kill right after a flush in the middle of the plan
                flushes = [j for j, op in enumerate(plan) if op[0] == "flush"]
                cut = rng.choice(flushes[:-1]) if len(flushes) > 1 else flushes[-1]
                plan = plan[:cut + 1] + [["sleep", 0.3], ["kill"]]
            elif end == "kill":
                plan = plan + [["sleep", 0.3], ["kill"]]
            else:
                plan = plan + [["emit", "done"], ["stdin"]]
            bm = rng.choice(["b_polls", "b_late", "b_after_end"]) if k > 1 else "b_polls"
            b_mode.append((k, end, bm))
            p = Prod(dict(endpoint=ep, plan=plan, capacity=rng.choice([1 << 16, 1 << 20])))
            prods.append(p)
            p.wait_event("ready")
            # A and D read along; B per its mode
            def step_done():
                return p.has("done") or p.proc.poll() is not None
            if bm == "b_polls":
                subs.append((B, gb))
            if k > 1:
                poll_ad(lambda: p.has("started") and p.epoch() in A._sources, "A to attach")
                wait_until(lambda: B._sock.poll(0), 30, "B's socket to hear the new incarnation")
                p.send()
            poll_ad(step_done, "inc to finish")
            if bm == "b_late" :
                subs.append((B, gb))
                poll_ad(lambda: True, "x")
            if end == "close":
                p.send(); p.wait()
            else:
                p.wait()
            # A and D retire it
            poll_ad(lambda: p.epoch() not in A._sources and p.epoch() not in D._sources,
                    "A and D to retire")
            if bm == "b_after_end" or bm == "b_late":
                if (B, gb) not in subs:
                    subs.append((B, gb))
            poll_ad(lambda: p.epoch() not in B._sources, "B to retire", timeout=60)
            poll_ad(lambda: not B._sock.poll(0), "B's socket drained", timeout=60)
            if (B, gb) in subs:
                subs.remove((B, gb))
        segs = [pp.wait_event("ready")["segment"] for pp in prods]
        poll_ad(lambda: not any(os.path.exists("/dev/shm/" + sg) for sg in segs) and not D._sources,
                "D to read every ring", timeout=60)
        out = {}
        for name, s, g in (("A", A, ga), ("B", B, gb), ("D", D, gd)):
            st = s.stats()
            pr, summ = verdict(f"seed{seed} {name}", prods, g, st, quiet=True)
            logs = [f[1] for f in s.failures()]
            twice = sorted({r for r in logs if logs.count(r) > 1})
            if twice:
                pr["reported_twice"] = twice
            out[name] = (pr, summ)
            if pr or verbose:
                print(f"seed {seed} {name} modes={b_mode} {summ} PROBLEMS={pr}")
            if pr and os.environ.get("DBG"):
                print("  counts:", {k: v for k, v in st.items() if isinstance(v, int) and v})
                print("  dropped:", sorted(st["dropped"]), "incomplete:", sorted(st["incomplete"]))
                print("  errors:", list(st["errors"])[:6])
                for pp in prods:
                    print("  prod", hex(pp.epoch()), [(e["event"]) for e in pp.events], "rc", pp.proc.returncode)
        return out
    finally:
        for s in (A, B):
            s.close()
        D.unsubscribe()
        for p in prods:
            p.kill(); p.wait()
        cleanup_shm(prods)

if __name__ == "__main__":
    a, b = int(sys.argv[1]), int(sys.argv[2])
    bad = 0
    for seed in range(a, b):
        out = run(seed, verbose=len(sys.argv) > 3)
        bad += any(v[0] for v in out.values())
    print(f"RESULT {bad}/{b - a} seeds with problems")
