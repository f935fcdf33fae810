"""Drain under load, small drop ring, chunked + interleaved + aborts, stopped many times by MODE
(kill/int/term/mix), optionally SIGSTOP'd first. Producer is never killed and closes cleanly,
so ANY 'lost' range in any drain's report is suspect (false lost). Also checks silent losses,
duplicates, rids both written and reported, rids reported twice in reports.jsonl.
usage: python a1_drain_kill_lost.py MODE RUNS [STOPS] [CAP_KIB] [RATE]"""
import sys, signal, random, time, shutil, subprocess, json
from pathlib import Path
from hd9 import *

MODE = sys.argv[1]; RUNS = int(sys.argv[2]); STOPS = int(sys.argv[3]) if len(sys.argv) > 3 else 10
CAP = int(sys.argv[4]) if len(sys.argv) > 4 else 256; RATE = float(sys.argv[5]) if len(sys.argv) > 5 else 150
import os; STRICT = bool(os.environ.get("STRICT"))

def failed(rep):
    return {r for k in ("dropped", "incomplete", "rejected") for r in (rep.get(k) or {})}

def one(seed):
    rng = random.Random(seed)
    ep, epd = new_ep()
    tmp = Path("/tmp/hunt-h9/work") / f"a1-{MODE}-{seed}-{uuid.uuid4().hex[:6]}"
    tmp.mkdir(parents=True)
    out = tmp / "out"
    reqs = requests(600, seed=seed, tokens=(1, 6, 20, 48), chunks=(4, 16, 64))
    sizes = {r: t for r, t, _ in reqs}
    aborts = [r for i, (r, t, c) in enumerate(reqs) if t > c and i % 7 == 0]
    p = ProducerProc({"endpoint": ep, "requests": reqs, "producer_id": f"h9a1-{seed}",
                      "consumers": 1, "rate": RATE, "interleave": 6, "capacity": CAP << 10,
                      "policy": "drop", "wait_timeout_s": 0.0, "close_on_stdin": True,
                      "aborts": aborts}, tmp)
    reported = set(); codes = []; notes = []; losts = []; per_drain = []
    try:
        p.wait_event("ready")
        for i in range(STOPS):
            if p.poll_event("captured") is not None: break
            d = start_drain(ep, out, "--flush-every", f"{rng.choice([8, 64, 512])}K")
            at = len(set(durable_rids(out)))
            target = at + rng.randint(3, 40)
            try:
                wait_until(lambda: len(set(durable_rids(out))) >= target or
                           (p.poll_event("captured") is not None), 10, "progress")
            except AssertionError:
                pass
            if rng.random() < 0.5:
                d.send_signal(signal.SIGSTOP); time.sleep(0.4 * rng.random() + 0.1)
                d.send_signal(signal.SIGCONT)
                time.sleep(rng.random() * 0.05)
            m = MODE if MODE != "mix" else rng.choice(["int", "term", "kill", "kill"])
            d.send_signal({"kill": signal.SIGKILL, "term": signal.SIGTERM, "int": signal.SIGINT}[m])
            rc, rep, err = drain_report(d)
            (tmp / f"drain{i}.txt").write_text(json.dumps({"mode": m, "rc": rc, "report": rep, "stderr": err}, indent=1, default=str))
            codes.append((m, rc))
            reported |= reported_rids(rep)
            per_drain.append(failed(rep))
            for l in rep.get("lost") or []:
                losts.append((i, m, l))
        final = start_drain(ep, out, "--idle-timeout", "2")
        p.wait_event("captured", timeout=120)
        rc, rep, err = drain_report(final, timeout=120)
        (tmp / "final.txt").write_text(json.dumps({"rc": rc, "report": rep, "stderr": err}, indent=1, default=str))
        codes.append(("final", rc)); reported |= reported_rids(rep); per_drain.append(failed(rep))
        for l in rep.get("lost") or []:
            losts.append(("final", "-", l))
        rids = durable_rids(out)
        dups = sorted({r for r in rids if rids.count(r) > 1})
        missing = set(sizes) - set(rids)
        silent = sorted(missing - reported)
        reported_failed = set().union(*per_drain) if per_drain else set()
        written_and_reported = sorted(set(rids) & reported_failed)
        written_aborted = sorted(set(aborts) & set(rids))
        rj, _ = reports_jsonl(out)
        twice_in_file = sorted(r for r, c in rj.items() if c > 1)
        # reported by two different drains
        seen = {}; twice_reported = set()
        for k, s in enumerate(per_drain):
            for r in s:
                if r in seen: twice_reported.add(r)
                seen[r] = k
        bad = None
        try:
            verify_shards(out, sizes)
        except Exception as e:
            bad = repr(e)[:300]
        hard_lost = [x for x in losts if x[2].get("reason") != "unresolved at stop"]
        prob = bool(dups or silent or written_aborted or bad or hard_lost or written_and_reported or (STRICT and (twice_in_file or twice_reported or losts)))
        print(json.dumps({"seed": seed, "mode": MODE, "problem": prob, "written": len(set(rids)),
                          "missing": len(missing), "silent": silent[:10], "n_silent": len(silent),
                          "dups": dups[:10], "written_aborted": written_aborted[:5],
                          "written_and_reported": written_and_reported[:10],
                          "twice_in_reports_jsonl": twice_in_file[:10], "twice_reported": sorted(twice_reported)[:10],
                          "lost": [(a, b, {k: l[k] for k in ("first", "count", "reason") if k in l}) for a, b, l in losts][:6],
                          "n_lost": sum(l.get("count", 0) for _, _, l in losts),
                          "bad": bad, "codes": codes,
                          "dropped_at_capture": len(p.poll_event('captured')['dropped']), "dir": str(tmp)}), flush=True)
        return prob
    finally:
        p.send(); p.stop()
        shutil.rmtree(epd, ignore_errors=True)

bad = 0
for s in range(RUNS):
    bad += one(2000 + s)
print(f"RESULT {bad}/{RUNS} runs with problems")
