"""d_giveback_exit.py: deterministic A/D: a durable Subscriber stalls (ring full, drops), then polls like
samples()'s inner loop (never recording) until a failure hold is given back, then dies (os._exit) at once;
the producer keeps capturing; a resumer (a_sub.py poll mode, recording) reads until idle. Are the dead
one's unrecorded failures named by the resumer? env SEED WAITX (s to wait after the give-back before dying)"""
import os, sys, json, time, subprocess, uuid
from pathlib import Path
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h18/subs"
E = os.environ.get
py = "/work/main/.venv/bin/python"; env = dict(os.environ); env.pop("PYTHONPATH", None)
tag = uuid.uuid4().hex[:6]; d = Path("/tmp/hunt-h18/ep") / tag; d.mkdir(parents=True, mode=0o700); ep = f"ipc://{d}/p.sock"
w = Path("/tmp/hunt-h18/work") / f"gb-{tag}"; w.mkdir(parents=True); name = f"h18-a{tag}"
spec = {"ep": ep, "pid": f"h18-gb-{tag}", "cap": 256 << 10, "rate": 1500, "dur": 8, "hidden": 96}
prod = subprocess.Popen([py, "a_prod.py", json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
assert json.loads(prod.stdout.readline())["event"] == "ready"
DEAD = r'''
import os, sys, json, time
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h18/subs"
import hscapture
ep, name, out, waitx = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
sub = hscapture.Subscriber(ep, name=name); sub.wait_ready(20)
time.sleep(2.0)       # stalled: the ring fills, the producer drops
t0 = time.monotonic(); nones = 0; got = []
while time.monotonic() - t0 < 10:
    s = sub.poll(timeout=0.5)
    if s is None: nones += 1
    else:
        got.append(s.rid); g = open(os.path.join(os.path.dirname(out), "got.txt"), "a"); g.write(s.rid + " 1\n"); g.close(); s.release()
    if sub._ledger.counts.get("failures_unpinned", 0): break
time.sleep(waitx)
log = [f[1] for f in sub.failures() if f[0] != "ended"]
json.dump({"unpinned": sub._ledger.counts.get("failures_unpinned", 0), "nones": nones, "log": log, "got": got,
           "t": time.monotonic() - t0}, open(out, "w"))
os._exit(0)
'''
dead = subprocess.run([py, "-c", DEAD, ep, name, str(w / "dead.json"), E("WAITX", "0")], env=env, timeout=60)
time.sleep(1.5)   # the producer keeps capturing
res_line = json.loads(prod.stdout.readline())
r = subprocess.run([py, "a_sub.py", ep, name, str(w), "poll", "4"], env=env, timeout=200, capture_output=True, text=True)
prod.stdin.write("\n"); prod.stdin.flush(); prod.wait(30)
dj = json.load(open(w / "dead.json"))
got = {l.split()[0] for l in (w / "got.txt").read_text().split("\n") if l} if (w / "got.txt").exists() else set()
named = {json.loads(l)["rid"] for l in (w / "fails.jsonl").read_text().split("\n") if l and json.loads(l)["kind"] != "ended"} if (w / "fails.jsonl").exists() else set()
n = res_line["n"]
silent = [f"s-{i}" for i in range(n) if f"s-{i}" not in got and f"s-{i}" not in named]
dead_unnamed = [r_ for r_ in dj["log"] if r_ not in named and r_ not in got]
print(json.dumps({"tag": tag, "n": n, "captured_true": res_line["ok"], "dead_unpinned_holds": dj["unpinned"], "dead_log": len(dj["log"]), "dead_nones": dj["nones"],
                  "dead_first_last": [dj["log"][:1], dj["log"][-1:]], "resumer_delivered": len(got), "resumer_named": len(named),
                  "dead_failures_named_by_no_one": len(dead_unnamed), "rids": dead_unnamed[:20], "silent_total": len(silent), "silent_rids": silent[:20], "dir": str(w)}))
