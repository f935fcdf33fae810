"""a_run.py MODE ZC [KILLS] [SEED]: chunked interleaved producer; a durable a_sub.py of MODE killed (SIGKILL) at random
moments KILLS times and resumed; a final poll-until-idle one. Checks exactly-once-or-reported."""
import os, sys, json, time, random, signal, subprocess, uuid, collections
from pathlib import Path
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h20/subs"
env = dict(os.environ); env.pop("PYTHONPATH", None)
py = "/work/main/.venv/bin/python"; here = Path(__file__).parent
mode, zc = sys.argv[1], sys.argv[2]; kills = int(sys.argv[3]) if len(sys.argv) > 3 else 5
seed = int(sys.argv[4]) if len(sys.argv) > 4 else random.randrange(1 << 30); rnd = random.Random(seed)
tag = uuid.uuid4().hex[:6]; d = Path("/tmp/hunt-h20/work") / f"a-{mode}-{zc}-{tag}"; d.mkdir(parents=True)
ed = Path("/tmp/hunt-h20/ep") / tag; ed.mkdir(parents=True, mode=0o700); ep = f"ipc://{ed}/p.sock"
name = f"h20-a{tag}"
spec = {"ep": ep, "pid": f"h20-a-{tag}", "cap": 32 << 20, "n": int(os.environ.get("NRID", 400)), "rate": float(os.environ.get("RATE", 150)),
        "K": 5, "CH": 3, "abort": float(os.environ.get("ABORT", 0.03)), "seed": seed}
prod = subprocess.Popen([py, str(here / "a_prod.py"), json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                        stderr=open(d / "prod.err", "w"), text=True, env=env)
assert json.loads(prod.stdout.readline())["event"] == "ready"
senv = dict(env, KILLP=os.environ.get("KILLP", "0.01"))
for i in range(kills):
    s = subprocess.Popen([py, str(here / "a_sub.py"), ep, name, str(d), mode, zc], env=senv, stdout=open(d / f"sub{i}.out", "w"), stderr=subprocess.STDOUT)
    t = rnd.uniform(0.8, 3.0); 
    try: s.wait(t)
    except subprocess.TimeoutExpired: s.send_signal(signal.SIGKILL); s.wait()
done = json.loads(prod.stdout.readline())
f = subprocess.run([py, str(here / "a_sub.py"), ep, name, str(d), "final", zc, "3"], env=env, capture_output=True, text=True, timeout=300)
(d / "final.out").write_text(f.stdout + f.stderr)
prod.stdin.write("\n"); prod.stdin.flush(); prod.wait(30)
# analysis
status = done["status"]
ev = []; inc = None
for l in (d / "got.log").read_text().split("\n"):
    if not l: continue
    p = l.split()
    if p[0] == "S": inc = int(p[1])
    ev.append(p)
gots = collections.defaultdict(list); rels = collections.defaultdict(list); bad = []
viol = []
for p in ev:
    if p[0] == "G":
        rid, pid, ok = p[1], int(p[2]), p[3] == "1"
        if not ok: bad.append(rid)
        for rp in rels[rid]:
            viol.append(f"{rid}: handed out to {pid} after released by {rp}")
        for gp in gots[rid]:
            if gp == pid: viol.append(f"{rid}: twice in one incarnation {pid}")
        gots[rid].append(pid)
    elif p[0] == "R":
        rels[p[1]].append(int(p[2]))
fails = collections.defaultdict(list)
for l in (d / "fails.jsonl").read_text().split("\n") if (d / "fails.jsonl").exists() else []:
    if l: j = json.loads(l); fails[j["rid"]].append(j)
redeliv_window = sum(1 for r, g in gots.items() if len(g) > 1)
missing = [r for r, s in status.items() if s == "ok" and r not in gots and r not in fails]
both = [r for r in gots if r in fails]
delivered_aborted = [r for r, s in status.items() if s != "ok" and r in gots]
unreported_failed = [r for r, s in status.items() if s != "ok" and r not in gots and r not in fails]
never_released = [r for r in gots if not rels[r]]
acked = Path("/tmp/hunt-h20/subs").glob("hscapture.acked-*")
res = {"seed": seed, "dir": str(d), "mode": mode, "zc": zc, "committed": sum(1 for s in status.values() if s == "ok"),
       "statuses": collections.Counter(status.values()), "delivered": len(gots), "fails": len(fails), "redelivered_in_window": redeliv_window,
       "violations": viol[:10], "n_viol": len(viol), "missing": missing[:10], "n_missing": len(missing), "both": both[:10],
       "delivered_failed": delivered_aborted[:10], "unreported_failed": unreported_failed[:10], "bad_data": bad[:10], "never_released": never_released[:10],
       "final_rc": f.returncode}
print(json.dumps(res, default=str), flush=True)
