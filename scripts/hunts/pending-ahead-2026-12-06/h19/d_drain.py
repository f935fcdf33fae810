"""d_drain.py: b_prod.py (one-chunk s-i, drop ring, 1500/s) drained by `hscapture drain` (d_drainwrap.py),
SIGSTOPped 2-4 s, SIGCONT, SIGKILLed at the first give-back or after U(0,0.5) s; restarted STOPS times; final
drain --idle-timeout 3. Checks: rids written twice, silent rids, events/rids twice in reports.jsonl, rids named
in reports.jsonl and written."""
import os, sys, json, time, signal, subprocess, uuid, random, threading, collections
from pathlib import Path
seed = int(os.environ.get("SEED", 1)); rng = random.Random(seed); STOPS = int(os.environ.get("STOPS", 4))
env = dict(os.environ); env.pop("PYTHONPATH", None); env["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h19/subs"
py = "/work/main/.venv/bin/python"; here = Path(__file__).parent
tag = uuid.uuid4().hex[:6]
d = Path("/tmp/hunt-h19/ep") / tag; d.mkdir(parents=True, mode=0o700); ep = f"ipc://{d}/p.sock"
w = Path("/tmp/hunt-h19/work") / f"d-{seed}-{tag}"; w.mkdir(parents=True); out = w / "out"
spec = {"ep": ep, "pid": f"h19-d-{tag}", "cap": 256 << 10, "rate": 1500.0, "dur": float(os.environ.get("DUR", 12))}
prod = subprocess.Popen([py, str(here / "b_prod.py"), json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(w / "prod.err", "w"), text=True, env=env)
assert json.loads(prod.stdout.readline())["event"] == "ready"
lg = w / "drain.log"
def unpins(): return lg.read_text().count("UNPIN") if lg.exists() else 0
def drain(*extra):
    return subprocess.Popen([py, str(here / "d_drainwrap.py"), str(lg), "drain", "--json", "-q", "-o", str(out), "-e", ep, "--flush-every", rng.choice(["8K", "64K", "1M"]), *extra],
                            stdout=open(w / "drain.out", "a"), stderr=open(w / "drain.err", "a"), env=env)
done = {}; threading.Thread(target=lambda: done.update(json.loads(prod.stdout.readline())), daemon=True).start()
kl = open(w / "kills.txt", "a")
for k in range(STOPS):
    s = drain(); time.sleep(rng.uniform(0.8, 1.5))
    if done: s.send_signal(signal.SIGKILL); s.wait(); break
    s.send_signal(signal.SIGSTOP); st = rng.uniform(2.0, 4.0); time.sleep(st); s.send_signal(signal.SIGCONT)
    n0 = unpins(); t0 = time.monotonic(); lim = rng.choice([2.0, rng.uniform(0, 0.5)])
    while time.monotonic() - t0 < lim and unpins() <= n0: time.sleep(0.002)
    s.send_signal(signal.SIGKILL); s.wait()
    kl.write("kill %d pid=%d after_resume=%.3f unpins %d->%d\n" % (k, s.pid, time.monotonic() - t0, n0, unpins())); kl.flush()
while not done: time.sleep(0.1)
f = drain("--idle-timeout", "3"); rc = f.wait(120)
prod.stdin.write("\n"); prod.stdin.flush(); prod.wait(30)
res = done["res"]
idx = [json.loads(l) for l in (out / "index.jsonl").read_text().splitlines() if l.strip()] if (out / "index.jsonl").exists() else []
written = collections.Counter(x.get("rid") for x in idx if "rid" in x)
rep = [json.loads(l) for l in (out / "reports.jsonl").read_text().splitlines() if l.strip()] if (out / "reports.jsonl").exists() else []
rep = [x for x in rep if "rid" in x]
evc = collections.Counter(x["event"] for x in rep if x.get("event")); ridc = collections.Counter(x["rid"] for x in rep if x["kind"] != "ended")
txt = (w / "drain.out").read_text(); i = txt.rfind("\n{\n") + 1 if "\n{\n" in txt else (0 if txt.startswith("{") else -1)
final = json.loads(txt[i:]) if i >= 0 else {}
fnamed = set()
for k in ("dropped", "incomplete", "rejected"): fnamed |= set((final.get(k) or {}))
named = set(ridc) | fnamed
silent = sorted((r for r in res if not written[r] and r not in named), key=lambda r: int(r[2:]))
pl = lg.read_text().splitlines() if lg.exists() else []
print(json.dumps({"seed": seed, "n": done["n"], "written": len(written), "named": len(named), "silent": len(silent), "silent_rids": silent[:8],
                  "written_twice": [r for r, c in written.items() if c > 1][:8], "events_twice": [e for e, c in evc.items() if c > 1][:8],
                  "rids_twice_jsonl": [r for r, c in ridc.items() if c > 1][:8], "named_and_written": sorted(r for r in named if written[r])[:8],
                  "final_rc": rc, "final_keys": sorted(k for k, v in final.items() if v)[:12], "unpins": unpins(), "pendreads": [l[:120] for l in pl if l.startswith("PENDREAD") and "n=0" not in l][:4],
                  "tracebacks": (w / "drain.err").read_text().count("Traceback"), "dir": str(w)}), flush=True)
import shutil; shutil.rmtree(d, ignore_errors=True)
