"""a_run.py: durable a_sub.py (MODE env: poll|samples) SIGSTOPped 2-4 s while a_prod.py captures into a
small drop ring, resumed, then SIGKILLed at the first failure-hold give-back (KILL_ON_UNPIN=1, else
after U(0,RK) s), restarted; KILLS times; then a final run until idle. Checks silent / dup / corrupt.
env: SEED CAP_KIB RATE DUR KILLS MODE HIDDEN"""
import os, sys, json, time, signal, subprocess, uuid, random
from pathlib import Path
E = os.environ.get; seed = int(E("SEED", 1)); rng = random.Random(seed)
env = dict(os.environ); env.pop("PYTHONPATH", None); env["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h18/subs"
py = "/work/main/.venv/bin/python"; here = Path(__file__).parent
tag = uuid.uuid4().hex[:6]
d = Path("/tmp/hunt-h18/ep") / tag; d.mkdir(parents=True, mode=0o700); ep = f"ipc://{d}/p.sock"
w = Path("/tmp/hunt-h18/work") / f"a-{E('MODE','poll')}-{seed}-{tag}"; w.mkdir(parents=True)
spec = {"ep": ep, "pid": f"h18-a-{tag}", "cap": int(E("CAP_KIB", 256)) << 10, "rate": float(E("RATE", 1500)),
        "dur": float(E("DUR", 14)), "hidden": int(E("HIDDEN", 96))}
prod = subprocess.Popen([py, str(here / "a_prod.py"), json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(w / "prod.err", "w"), text=True, env=env)
assert json.loads(prod.stdout.readline())["event"] == "ready"
name = f"h18-a{tag}"; mode = E("MODE", "poll")
def start(*extra):
    return subprocess.Popen([py, str(here / "a_sub.py"), ep, name, str(w), "poll" if extra else mode, *extra], stdout=open(w / "sub.out", "a"), stderr=open(w / "sub.err", "a"), env=env)
def unpins(): p = w / "unpin.log"; return p.read_text().count("UNPIN") if p.exists() else 0
import threading
done = {}; threading.Thread(target=lambda: done.update(json.loads(prod.stdout.readline())), daemon=True).start()
kl = open(w / "kills.txt", "a"); t_start = time.monotonic()
for k in range(int(E("KILLS", 3))):
    s = start(); time.sleep(rng.uniform(0.8, 1.5))
    if done: s.kill(); s.wait(); break
    s.send_signal(signal.SIGSTOP); st = rng.uniform(2.0, 4.0); time.sleep(st); s.send_signal(signal.SIGCONT)
    n0 = unpins(); t0 = time.monotonic()
    lim = 1.5 if E("KILL_ON_UNPIN") else rng.uniform(0, float(E("RK", 1.0)))
    while time.monotonic() - t0 < lim and unpins() <= n0: time.sleep(0.002)
    s.send_signal(signal.SIGKILL); s.wait()
    kl.write("kill %d at %.3f stop=%.2f after_resume=%.3f unpins %d->%d\n" % (k, time.monotonic() - t_start, st, time.monotonic() - t0, n0, unpins())); kl.flush()
while not done: time.sleep(0.1)
final = start("4"); final.wait(120)
prod.stdin.write("\n"); prod.stdin.flush(); prod.wait(30)
res = done["res"]; n = done["n"]
got = [l.split() for l in (w / "got.txt").read_text().split("\n") if l] if (w / "got.txt").exists() else []
gotc = {}; bad = []
for rid, ok in got:
    gotc[rid] = gotc.get(rid, 0) + 1
    if ok != "1": bad.append(rid)
fails = [json.loads(l) for l in (w / "fails.jsonl").read_text().split("\n") if l] if (w / "fails.jsonl").exists() else []
named = {f["rid"] for f in fails if f["kind"] != "ended"}
silent = sorted((r for r in res if r not in gotc and r not in named), key=lambda r: int(r[2:]))
dups = sorted(r for r, c in gotc.items() if c > 1)
both = sorted(r for r in gotc if r in named)
okfalse_got = sorted(r for r, v in res.items() if not v and r in gotc)
fin = [json.loads(l) for l in (w / "sub.out").read_text().split("\n") if l.startswith("{")]
out = {"seed": seed, "mode": mode, "n": n, "captured_true": done["ok"], "delivered": len(gotc), "named": len(named), "silent": len(silent), "silent_rids": silent[:20],
       "dups": len(dups), "dup_rids": dups[:10], "corrupt": bad[:10], "delivered_and_named": both[:10], "dropped_at_capture_but_delivered": okfalse_got[:10],
       "unpins_total": unpins(), "final": fin[-1] if fin else None, "pstats": {k: done["stats"].get(k) for k in ("dropped", "unrecorded", "backlog_max")}, "dir": str(w)}
print(json.dumps(out), flush=True)
import shutil; shutil.rmtree(d, ignore_errors=True)
