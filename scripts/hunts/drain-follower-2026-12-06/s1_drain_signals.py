"""Area 1: `hscapture drain` under load with a small drop-policy ring, stopped repeatedly by
signal patterns, and each time optionally SIGSTOPped first so its durable place pins the ring
full (drops happen). Then a final drain to idle. Check: every requested rid is in the shards
exactly once (bit-exact) or named by some drain's --json report.

usage: python s1_drain_signals.py MODE RUNS [STOP_S]
MODE: int (one SIGINT), int2 (SIGINT twice, 0-80 ms apart), int3 (three), term, kill,
      mix (random of the above)
"""
import sys, signal, random, time, shutil, subprocess, json
from pathlib import Path
from hd7 import *

MODE = sys.argv[1]; RUNS = int(sys.argv[2]); STOP_S = float(sys.argv[3]) if len(sys.argv) > 3 else 0.4

def one(seed):
    rng = random.Random(seed)
    ep, epd = new_ep()
    tmp = Path("/tmp/hunt-d7-work") / f"s1-{MODE}-{seed}-{uuid.uuid4().hex[:6]}"
    tmp.mkdir(parents=True)
    out = tmp / "out"
    reqs = requests(500, seed=seed, tokens=(1, 6, 20, 48), chunks=(4, 16, 64))
    sizes = {r: t for r, t, _ in reqs}
    aborts = [r for i, (r, t, c) in enumerate(reqs) if t > c and i % 7 == 0]
    p = ProducerProc({"endpoint": ep, "requests": reqs, "producer_id": f"hd7-s1-{seed}",
                      "consumers": 1, "rate": 150, "interleave": 6, "capacity": 256 << 10,
                      "policy": "drop", "wait_timeout_s": 0.0, "close_on_stdin": True,
                      "aborts": aborts}, tmp)
    reported = set(); codes = []; notes = []
    try:
        p.wait_event("ready")
        for i in range(8):
            d = start_drain(ep, out, "--flush-every", f"{rng.choice([8, 64, 512])}K")
            at = len(set(durable_rids(out)))
            target = at + rng.randint(5, 40)
            try:
                wait_until(lambda: len(set(durable_rids(out))) >= target or
                           (p.poll_event("captured") is not None and len(set(durable_rids(out))) > at),
                           10, "progress")
            except AssertionError:
                d.kill(); d.wait(); break
            if STOP_S and rng.random() < 0.7:
                d.send_signal(signal.SIGSTOP); time.sleep(STOP_S * rng.random() + 0.1)
                d.send_signal(signal.SIGCONT)
                time.sleep(rng.random() * 0.05)
            m = MODE if MODE != "mix" else rng.choice(["int", "int2", "int3", "term", "kill"])
            if m == "kill":
                d.send_signal(signal.SIGKILL)
            elif m == "term":
                d.send_signal(signal.SIGTERM)
            else:
                n = {"int": 1, "int2": 2, "int3": 3}[m]
                for k in range(n):
                    if k: time.sleep(rng.random() * 0.08)
                    if d.poll() is None: d.send_signal(signal.SIGINT)
            rc, rep, err = drain_report(d)
            (tmp / f"drain{i}.txt").write_text(json.dumps({"mode": m, "rc": rc, "report_keys": sorted(rep), "report": rep, "stderr": err}, indent=1, default=str))
            codes.append((m, rc, bool(rep)))
            reported |= reported_rids(rep)
            if rc not in (130, -9, 1, 3, 0):
                notes.append((m, rc, err[-400:]))
            if rc == 1:
                notes.append((m, rc, err[-400:]))
        final = start_drain(ep, out, "--idle-timeout", "2")
        p.wait_event("captured", timeout=120)
        rc, rep, err = drain_report(final, timeout=120)
        codes.append(("final", rc)); reported |= reported_rids(rep)
        rids = durable_rids(out)
        idx = index_rids(out)
        dups = sorted({r for r in rids if rids.count(r) > 1})
        missing = set(sizes) - set(rids)
        silent = sorted(missing - reported)
        written_aborted = sorted(set(aborts) & set(rids))
        bad = None
        try:
            nver = verify_shards(out, sizes)
        except Exception as e:
            bad = repr(e)[:300]; nver = -1
        in_rep_file_only = sorted((missing - reported) & reports_jsonl(out))
        prob = bool(dups or silent or written_aborted or bad)
        print(json.dumps({"seed": seed, "mode": MODE, "problem": prob, "written": len(set(rids)),
                          "missing": len(missing), "reported": len(reported & missing),
                          "silent": silent[:20], "n_silent": len(silent),
                          "silent_but_in_reports_jsonl": in_rep_file_only[:10],
                          "dups": dups[:10], "written_aborted": written_aborted[:10],
                          "bad": bad, "codes": codes, "notes": notes[:3],
                          "dropped_at_capture": len(p.poll_event('captured')['dropped'])}), flush=True)
        if prob:
            (tmp / "KEEP").write_text("problem")
        return prob
    finally:
        p.send(); p.stop()
        shutil.rmtree(epd, ignore_errors=True)

bad = 0
for s in range(RUNS):
    bad += one(1000 + s + (hash(MODE) % 100) * 0)
print(f"RESULT {bad}/{RUNS} runs with problems")
