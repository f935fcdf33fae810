"""b_run.py: durable b_sub.py (MODE env periodic|never|get) SIGSTOPped 2-4 s while b_prod.py captures into a
small drop ring, resumed, SIGKILLed at the first give-back (KILL_ON_UNPIN=1) or after U(0,RK) s, restarted, KILLS
times; final run until idle. Checks silent / dup deliveries / events reported twice / delivered+named / corrupt."""
import os, sys, json, time, signal, subprocess, uuid, random, threading, collections
from pathlib import Path
E = os.environ.get; seed = int(E("SEED", 1)); rng = random.Random(seed)
env = dict(os.environ); env.pop("PYTHONPATH", None); env["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h19/subs"
py = "/work/main/.venv/bin/python"; here = Path(__file__).parent
tag = uuid.uuid4().hex[:6]; mode = E("MODE", "periodic")
d = Path("/tmp/hunt-h19/ep") / tag; d.mkdir(parents=True, mode=0o700); ep = f"ipc://{d}/p.sock"
w = Path("/tmp/hunt-h19/work") / f"b-{mode}-{seed}-{tag}"; w.mkdir(parents=True)
spec = {"ep": ep, "pid": f"h19-b-{tag}", "cap": int(E("CAP_KIB", 256)) << 10, "rate": float(E("RATE", 1500)),
        "dur": float(E("DUR", 10)), "hidden": int(E("HIDDEN", 96))}
prod = subprocess.Popen([py, str(here / "b_prod.py"), json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(w / "prod.err", "w"), text=True, env=env)
assert json.loads(prod.stdout.readline())["event"] == "ready"
name = f"h19-b{tag}"
(w / "got.txt").touch()
def start(*extra):
    return subprocess.Popen([py, str(here / "b_sub.py"), ep, name, str(w), mode, *extra], stdout=open(w / "sub.out", "a"), stderr=open(w / "sub.err", "a"), env=env)
def unpins(): p = w / "unpin.log"; return p.read_text().count("UNPIN") if p.exists() else 0
done = {}; threading.Thread(target=lambda: done.update(json.loads(prod.stdout.readline())), daemon=True).start()
kl = open(w / "kills.txt", "a"); t_start = time.monotonic()
for k in range(int(E("KILLS", 3))):
    s = start(); time.sleep(rng.uniform(0.8, 1.5))
    if done: s.kill(); s.wait(); break
    s.send_signal(signal.SIGSTOP); st = rng.uniform(2.0, 4.0); time.sleep(st); s.send_signal(signal.SIGCONT)
    n0 = unpins(); t0 = time.monotonic()
    lim = 2.5 if E("KILL_ON_UNPIN") else rng.uniform(0, float(E("RK", 2.0)))
    while time.monotonic() - t0 < lim and unpins() <= n0: time.sleep(0.002)
    if E("KILL_ON_UNPIN") and unpins() > n0: time.sleep(rng.uniform(0, 0.05))
    s.send_signal(signal.SIGKILL); s.wait()
    kl.write("kill %d pid=%d at %.3f stop=%.2f after_resume=%.3f unpins %d->%d\n" % (k, s.pid, time.monotonic() - t_start, st, time.monotonic() - t0, n0, unpins())); kl.flush()
while not done: time.sleep(0.1)
final = start("4"); final.wait(120)
prod.stdin.write("\n"); prod.stdin.flush(); prod.wait(30)
res = done["res"]; n = done["n"]
got = [l.split() for l in (w / "got.txt").read_text().split("\n") if l]
gotc = collections.Counter(); bad = []
for rid, ok, pid in got:
    gotc[rid] += 1
    if ok != "1": bad.append(rid)
fails = [json.loads(l) for l in (w / "fails.jsonl").read_text().split("\n") if l] if (w / "fails.jsonl").exists() else []
named = {f["rid"] for f in fails if f["kind"] != "ended"}
evc = collections.Counter(f["event"] for f in fails if f["event"]); twice = sorted(e for e, c in evc.items() if c > 1)
ridc = collections.Counter(f["rid"] for f in fails if f["kind"] != "ended"); rid_twice = sorted(r for r, c in ridc.items() if c > 1)
silent = sorted((r for r in res if r not in gotc and r not in named), key=lambda r: int(r[2:]))
dups = sorted(r for r, c in gotc.items() if c > 1)
both = sorted(r for r in gotc if r in named)
pend = list(Path("/tmp/hunt-h19/subs").glob("hscapture.pending-*"))
import hashlib
pp = Path("/tmp/hunt-h19/subs") / f"hscapture.pending-{os.geteuid()}-{hashlib.sha1(name.encode()).hexdigest()[:16]}"
errs = (w / "sub.err").read_text()
out = {"seed": seed, "mode": mode, "n": n, "captured_true": done["ok"], "delivered": len(gotc), "named": len(named), "silent": len(silent), "silent_rids": silent[:20],
       "dups": len(dups), "dup_rids": dups[:10], "events_twice": len(twice), "ev_twice": twice[:10], "rids_named_twice": rid_twice[:10], "corrupt": bad[:10], "delivered_and_named": both[:10],
       "unpins_total": unpins(), "pending_lines_left": len(pp.read_text().splitlines()) if pp.exists() else None,
       "tracebacks": errs.count("Traceback"), "pstats": {k: done["stats"].get(k) for k in ("dropped", "unrecorded")}, "dir": str(w)}
print(json.dumps(out), flush=True)
import shutil; shutil.rmtree(d, ignore_errors=True)
