"""A durable hscapture.stream(name=...) trainer SIGKILLed (some after SIGSTOP) and resumed while a
producer captures chunked samples with drops and aborts. Exactly once; failures logged by rid once.
usage: python s1_stream_kill.py RUNS [KILLS]"""
import sys, signal, random, time, shutil, json, re, subprocess
from hd10 import *
RUNS = int(sys.argv[1]); KILLS = int(sys.argv[2]) if len(sys.argv) > 2 else 5
def one(seed):
    rng = random.Random(seed); ep, epd = new_ep()
    tmp = Path("/tmp/hunt-h10/work") / f"s1-{seed}-{uuid.uuid4().hex[:6]}"; tmp.mkdir(parents=True)
    reqs = requests(400, seed=seed, tokens=(1, 6, 20, 48), chunks=(4, 16, 64))
    sizes = {r: t for r, t, _ in reqs}; (tmp / "sizes.json").write_text(json.dumps(sizes))
    aborts = [r for i, (r, t, c) in enumerate(reqs) if t > c and i % 7 == 0]
    p = ProducerProc({"endpoint": ep, "requests": reqs, "producer_id": f"h10s1-{seed}", "consumers": 1,
                      "rate": 120, "interleave": 5, "capacity": 192 << 10, "policy": "drop",
                      "close_on_stdin": True, "aborts": aborts}, tmp)
    log = tmp / "got.log"; name = f"h10s1{seed}"; errs = []
    def trainer(idle):
        e = open(tmp / f"err{len(errs)}.txt", "w"); errs.append(e.name)
        env = dict(os.environ); env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3])
        return subprocess.Popen([sys.executable, str(HERE / "trainer.py"), ep, name, str(log), str(idle), str(tmp / "sizes.json")],
                                stdout=e, stderr=e, env=env)
    try:
        p.wait_event("ready")
        for i in range(KILLS):
            if p.poll_event("captured") is not None: break
            t = trainer(60)
            time.sleep(rng.uniform(1.5, 4.0))
            if rng.random() < 0.4:
                t.send_signal(signal.SIGSTOP); time.sleep(rng.uniform(0.1, 0.5)); t.send_signal(signal.SIGCONT)
            t.send_signal(signal.SIGKILL); t.wait(); open(tmp / "kills.txt", "a").write("%.3f\n" % time.time())
        p.wait_event("captured", 120)
        t = trainer(3); t.wait(120)
        got = [l[4:].split()[0] for l in log.read_text().splitlines() if l.startswith("GOT ")]
        badb = [l for l in log.read_text().splitlines() if l.startswith("BAD ")]
        reps = [json.loads(l[7:]) for l in log.read_text().splitlines() if l.startswith("REPORT ")]
        rep = reps[-1] if reps else {}
        named_cnt = {}
        for e in errs:
            for line in open(e):
                if "sample(s)" in line and "): " in line:
                    for r in re.findall(r"\b(r-\d+)\b", line.split("): ", 1)[1]): named_cnt[r] = named_cnt.get(r, 0) + 1
        named = set(named_cnt)
        for k in ("dropped", "incomplete", "rejected", "in_flight", "undelivered"):
            named |= set(rep.get(k) or [])
        dups = sorted({r for r in got if got.count(r) > 1})
        silent = sorted(r for r in sizes if r not in got and r not in named)
        false = sorted(set(got) & {r for r, c in named_cnt.items()})
        twice = sorted(r for r, c in named_cnt.items() if c > 1)
        prob = bool(dups or silent or false or twice or badb or rep.get("lost") or not reps)
        (tmp / "producer_events.json").write_text(json.dumps(p.events))
        print(json.dumps({"seed": seed, "problem": prob, "got": len(set(got)), "named": len(named),
                          "dups": dups[:10], "n_dups": len(dups), "silent": silent[:10], "n_silent": len(silent),
                          "got_and_named": false[:10], "named_twice": twice[:10], "bad": badb[:3],
                          "lost": (rep.get("lost") or [])[:3], "dir": str(tmp)}), flush=True)
        return prob
    finally:
        p.send(); p.stop(); shutil.rmtree(epd, ignore_errors=True)
BASE = int(os.environ.get("BASE", 7000))
bad = sum(one(BASE + s) for s in range(RUNS))
print(f"RESULT {bad}/{RUNS} runs with problems")
