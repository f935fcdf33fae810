"""s4 (hunt h15) = s3 with a long SIGSTOP (2.2-3.5 s, past FAILURE_GRACE_S) before the kill-on-unpin watch (1.5 s);
s3 = s2_abort_kill.py with KILL_ON_UNPIN=1 (kill right after a failure hold is unpinned); s1 with mid-way aborts: a durable hscapture.stream(name=...) trainer SIGKILLed (some after SIGSTOP)
and resumed while prod.py captures chunked samples into a full drop ring, aborting some rids after
their k-th chunk (k>=2, no retry: 'mid_aborts') and aborting+re-sending others ('retries').
usage: BASE=.. python s2_abort_kill.py RUNS [KILLS] ; env REASON_LEN adds long abort reasons"""
import sys, signal, random, time, shutil, json, re, subprocess, collections
from hd10 import *
RUNS = int(sys.argv[1]); KILLS = int(sys.argv[2]) if len(sys.argv) > 2 else 5
def one(seed):
    rng = random.Random(seed); ep, epd = new_ep()
    tmp = Path("/tmp/hunt-h15/work") / f"s4-{seed}-{uuid.uuid4().hex[:6]}"; tmp.mkdir(parents=True)
    reqs = requests(int(os.environ.get("N", 400)), seed=seed, tokens=(1, 6, 20, 48), chunks=(4, 16, 64))
    sizes = {r: t for r, t, _ in reqs}; (tmp / "sizes.json").write_text(json.dumps(sizes))
    multi = [(r, t, c) for (r, t, c) in reqs if -(-t // c) >= 3]
    mid = {r: rng.randint(2, -(-t // c) - 1) for i, (r, t, c) in enumerate(multi) if i % 4 == 0}
    retries = {r: 1 for i, (r, t, c) in enumerate(multi) if i % 4 == 2}
    p = RetryProc({"endpoint": ep, "requests": reqs, "producer_id": f"h14s2-{seed}", "consumers": 1, "seed": seed,
                   "rate": float(os.environ.get("RATE", 120)), "interleave": 5, "capacity": 192 << 10, "policy": "drop",
                   "close_on_stdin": True, "mid_aborts": mid, "retries": retries, "retry_after": 3,
                   "reason_len": int(os.environ.get("REASON_LEN", 0))}, tmp)
    log = tmp / "got.log"; name = f"h14s2{seed}{uuid.uuid4().hex[:4]}"; errs = []
    def trainer(idle):
        e = open(tmp / f"err{len(errs)}.txt", "w"); errs.append(e.name)
        env = dict(os.environ); env["PYTHONPATH"] = "/work/main"
        return subprocess.Popen([sys.executable, str(HERE / "trainer.py"), ep, name, str(log), str(idle), str(tmp / "sizes.json")],
                                stdout=e, stderr=e, env=env)
    try:
        p.wait_event("ready")
        for i in range(KILLS):
            if p.poll_event("captured") is not None: break
            t = trainer(60)
            if os.environ.get("KILL_ON_UNPIN"):
                # kill the trainer the moment it gave back a failure hold it had not logged yet
                time.sleep(rng.uniform(1.0, 3.0))
                n0 = log.read_text().count("UNPIN ") if log.exists() else 0
                t.send_signal(signal.SIGSTOP); time.sleep(rng.uniform(2.2, 3.5)); t.send_signal(signal.SIGCONT); t0 = time.time()
                while time.time() - t0 < 1.5 and (log.read_text().count("UNPIN ") if log.exists() else 0) <= n0 and p.poll_event("captured") is None:
                    time.sleep(0.003)
                t.send_signal(signal.SIGKILL); t.wait(); open(tmp / "kills.txt", "a").write("%.3f unpin\n" % time.time())
                continue
            time.sleep(rng.uniform(1.5, 4.0))
            if rng.random() < 0.4:
                t.send_signal(signal.SIGSTOP); time.sleep(rng.uniform(0.1, 0.5)); t.send_signal(signal.SIGCONT)
            t.send_signal(signal.SIGKILL); t.wait(); open(tmp / "kills.txt", "a").write("%.3f\n" % time.time())
        cap = p.wait_event("captured", 120)
        t = trainer(3); t.wait(120)
        att = cap["attempts"]
        lines = log.read_text().splitlines()
        got = [l[4:].split()[0] for l in lines if l.startswith("GOT ")]
        badb = [l for l in lines if l.startswith("BAD ")]
        reps = [json.loads(l[7:]) for l in lines if l.startswith("REPORT ")]
        rep = reps[-1] if reps else {}
        named_cnt = collections.Counter()
        for e in errs:
            for line in open(e):
                if "sample(s)" in line and "): " in line and "stream stopped" not in line:
                    for r in re.findall(r"\b(r-\d+)\b", line.split("): ", 1)[1]): named_cnt[r] += 1
        named = set(named_cnt)
        for k in ("dropped", "incomplete", "rejected", "in_flight", "undelivered"):
            named |= set(rep.get(k) or [])
        gotc = collections.Counter(got)
        fails = {r: sum(1 for ok, ab in a if ab or not ok) for r, a in att.items()}
        final_ok = {r for r, a in att.items() if a and a[-1][0] and not a[-1][1]}
        all_aborted = {r for r, a in att.items() if a and all(ab for ok, ab in a)}
        dups = sorted(r for r, c in gotc.items() if c > 1)
        silent = sorted(r for r in att if r not in gotc and r not in named)
        silent_failed = sorted(r for r in silent if fails[r])
        aborted_got = sorted(r for r in all_aborted if r in gotc)
        over = sorted(r for r, c in named_cnt.items() if c > fails.get(r, 0) + (0 if r in gotc else 1))
        false = sorted(r for r in gotc if named_cnt[r] and not fails.get(r))
        hl = [l for l in lines if l.startswith("HL")]
        hl_skip = sorted({l.split()[1] for l in hl if l.startswith("HL ") and "last=1" in l and "->True" in l and "held_before=1" in l})
        prob = bool(dups or silent or aborted_got or over or false or badb or rep.get("lost") or not reps)
        (tmp / "producer_events.json").write_text(json.dumps(p.events))
        print(json.dumps({"seed": seed, "problem": prob, "got": len(gotc), "named": len(named), "mid": len(mid), "retries": len(retries),
                          "dups": dups[:10], "silent": silent[:10], "n_silent": len(silent), "silent_failed": silent_failed[:10],
                          "aborted_got": aborted_got[:10], "named_over": over[:10], "got_and_named_unfailed": false[:10],
                          "bad": badb[:3], "lost": (rep.get("lost") or [])[:3], "hl_rows": len(hl), "hl_skipped": hl_skip[:10], "hl_skipped_failed": [r for r in hl_skip if fails.get(r)][:10], "hl_skipped_not_got": [r for r in hl_skip if r not in gotc][:10], "dir": str(tmp)}), flush=True)
        return prob
    finally:
        p.send(); p.stop(); shutil.rmtree(epd, ignore_errors=True)
BASE = int(os.environ.get("BASE", 7000))
bad = sum(one(BASE + s) for s in range(RUNS))
print(f"RESULT {bad}/{RUNS} runs with problems")
