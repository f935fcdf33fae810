"""Retries (same rid re-sent after an abort) under a small drop ring while a drain is SIGKILLed /
SIGTERMed and restarted. A retry whose every chunk was captured must be WRITTEN.
usage: python d1_drain_kill.py RUNS [STOPS] [CAP_KIB] [RATE]   (env N requests, SEED0)
d1: r1_retry.py plus mid-way aborts without retry (mid_aborts) and headless decisions logged (drainwrap.py)."""
import sys, signal, random, time, shutil, json, subprocess
from hd10 import *
RUNS = int(sys.argv[1]); STOPS = int(sys.argv[2]) if len(sys.argv) > 2 else 6
CAP = int(sys.argv[3]) if len(sys.argv) > 3 else 192; RATE = float(sys.argv[4]) if len(sys.argv) > 4 else 150
CP = int(sys.argv[5]) if len(sys.argv) > 5 else 0

def one(seed):
    rng = random.Random(seed)
    ep, epd = new_ep()
    tmp = Path("/tmp/hunt-h14/work") / f"d1-{seed}-{uuid.uuid4().hex[:6]}"; tmp.mkdir(parents=True)
    out = tmp / "out"
    reqs = requests(int(os.environ.get("N", 400)), seed=seed, tokens=(6, 20, 48), chunks=(4, 16))
    sizes = {r: t for r, t, _ in reqs}
    retr = {r: rng.choice([1, 1, 2]) for r, t, c in reqs if t > c and rng.random() < 0.3}
    cp = {}
    mid = {r: rng.randint(2, -(-t // c) - 1) for r, t, c in reqs if r not in retr and -(-t // c) >= 3 and rng.random() < 0.25}
    p = RetryProc({"endpoint": ep, "requests": reqs, "producer_id": f"h14d1-{seed}-{uuid.uuid4().hex[:4]}", "mid_aborts": mid, "consumers": 1,
                   "rate": RATE, "interleave": 6, "capacity": CAP << 10, "retries": retr, "cp": cp,
                   "retry_after": rng.choice([0, 2, 6]), "close_on_stdin": True, "seed": seed}, tmp)
    per = []; codes = []
    def sd(ep, out, *extra):
        args = [sys.executable, str(HERE / "drainwrap.py"), str(tmp / "hl.log"), "drain", "--json", "-q", "-o", str(out), "-e", ep]
        env = dict(os.environ); env["PYTHONPATH"] = "/work/main"
        return subprocess.Popen(args + list(extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        p.wait_event("ready")
        for i in range(STOPS):
            if p.poll_event("captured") is not None: break
            d = sd(ep, out, "--flush-every", f"{rng.choice([8, 64])}K")
            at = len(set(durable_rids(out)))
            try:
                wait_until(lambda: len(set(durable_rids(out))) >= at + rng.randint(3, 30) or
                           p.poll_event("captured") is not None, 10, "progress")
            except AssertionError: pass
            if rng.random() < 0.4:
                d.send_signal(signal.SIGSTOP); time.sleep(0.3 * rng.random() + 0.05); d.send_signal(signal.SIGCONT)
            m = rng.choice(["kill", "kill", "term"])
            d.send_signal(signal.SIGKILL if m == "kill" else signal.SIGTERM)
            rc, rep, err = drain_report(d)
            (tmp / f"drain{i}.json").write_text(json.dumps({"m": m, "rc": rc, "rep": rep, "err": err[-3000:]}, default=str))
            codes.append((m, rc)); per.append(rep)
        final = sd(ep, out, "--idle-timeout", "2")
        cap = p.wait_event("captured", timeout=120)
        rc, rep, err = drain_report(final, timeout=120); codes.append(("final", rc)); per.append(rep)
        (tmp / "final.json").write_text(json.dumps({"rc": rc, "rep": rep, "err": err[-3000:]}, default=str))
        att = cap["attempts"]
        (tmp / "producer_events.json").write_text(json.dumps(p.events)); (tmp / "spec_mid.json").write_text(json.dumps({"mid": mid, "retr": retr}))
        rids = durable_rids(out); ws = set(rids)
        dups = sorted({r for r in rids if rids.count(r) > 1})
        named = set().union(*[reported_rids(r) for r in per]) | {d["rid"] for d in report_lines(out)}
        lines = report_lines(out); cnt = {}
        for d in lines: cnt[d["rid"]] = cnt.get(d["rid"], 0) + 1
        silent = sorted(r for r in sizes if r not in ws and r not in named)
        # final attempt fully captured & not aborted -> must be written
        retry_lost = sorted(r for r, a in att.items() if a[-1] == [True, False] and r not in ws)
        retry_lost_r = sorted(r for r in retry_lost if r in retr)
        failed_attempts = {r: sum(1 for x in a if x != [True, False]) for r, a in att.items()}
        over_named = sorted(r for r, c in cnt.items() if c > failed_attempts.get(r, 0))
        losts = [l for r in per for l in (r.get("lost") or [])]
        bad = None
        try: verify_shards(out, sizes)
        except Exception as e: bad = repr(e)[:300]
        reasons = {}
        for r in per:
            for k in ("dropped", "incomplete", "rejected", "in_flight"):
                for rid, why in (r.get(k) or {}).items(): reasons.setdefault(rid, []).append(str(why))
        for d in lines: reasons.setdefault(d["rid"], []).append(str(d.get("reason")))
        gap1 = sorted(r for r in retry_lost if any("read by an earlier subscriber" in w for w in reasons.get(r, [])))
        retry_lost = [r for r in retry_lost if r not in gap1]
        over_named = [r for r in over_named if r not in gap1]
        aborted_written = sorted(r for r, a in att.items() if all(x[1] for x in a) and r in ws)
        hl = (tmp / "hl.log").read_text().splitlines() if (tmp / "hl.log").exists() else []
        hl_skip = sorted({l.split()[1] for l in hl if l.startswith("HL ") and "last=1" in l and "->True" in l and "held_before=1" in l})
        unp = [l for l in hl if l.startswith("UNPIN")]
        silent_all = silent
        prob = bool(dups or silent or retry_lost or over_named or bad or losts or aborted_written)
        print(json.dumps({"seed": seed, "problem": prob, "written": len(ws), "retried": len(retr),
                          "retried_written": sum(1 for r in retr if r in ws), "silent": silent[:10],
                          "retry_lost": retry_lost[:10], "n_retry_lost": len(retry_lost),
                          "retry_lost_named": [r for r in retry_lost if r in named][:10],
                          "retry_lost_of_retried": len(retry_lost_r),
                          "over_named": [(r, cnt[r], failed_attempts.get(r)) for r in over_named][:10],
                          "dups": dups[:10], "lost": losts[:3], "gap1": gap1[:10], "aborted_written": aborted_written[:10], "mid": len(mid), "n_silent": len(silent), "unpins": len(unp), "unpinned": sum(int(l.split()[2][2:]) for l in unp),
                          "hl_rows": len([l for l in hl if l.startswith("HL")]), "hl_skipped": hl_skip[:10], "hl_skipped_failed": [r for r in hl_skip if failed_attempts.get(r)][:10], "bad": bad, "codes": codes,
                          "dropped": cap["stats"].get("dropped"), "dir": str(tmp)}), flush=True)
        return prob
    finally:
        p.send(); p.stop(); shutil.rmtree(epd, ignore_errors=True)

bad = sum(one(int(os.environ.get("SEED0", 3000)) + s) for s in range(RUNS))
print(f"RESULT {bad}/{RUNS} runs with problems")
