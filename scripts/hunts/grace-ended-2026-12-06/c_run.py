"""c_run.py: scenario C. env POLICY(drop|wait) WAIT(s) ACK(0|1) GRACE(''=2.0|0) RATE CAP_KIB DUR STALL(s, SIGSTOP of the
subscriber at t=2) SLOW(s per sample). Prints a summary JSON line."""
import os, sys, json, time, signal, subprocess, uuid, threading
from pathlib import Path
E = os.environ.get
env = dict(os.environ); env["PYTHONPATH"] = "/work/main"; env["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h15/subs"
py = "/work/main/.venv/bin/python"; here = Path(__file__).parent
d = Path("/tmp/hunt-h15/ep") / uuid.uuid4().hex[:8]; d.mkdir(parents=True, mode=0o700); ep = f"ipc://{d}/p.sock"
tag = uuid.uuid4().hex[:6]
spec = {"ep": ep, "pid": f"h15c-{tag}", "cap": int(E("CAP_KIB", 256)) << 10, "policy": E("POLICY", "drop"),
        "wait": float(E("WAIT", 0)), "rate": float(E("RATE", 2000)), "dur": float(E("DUR", 12))}
prod = subprocess.Popen([py, str(here / "c_prod.py"), json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
assert json.loads(prod.stdout.readline())["event"] == "ready"
sub = subprocess.Popen([py, str(here / "c_sub.py"), ep, f"h15c{tag}", E("ACK", "0"), E("GRACE", ""), E("SLOW", "0")],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
slines = []; threading.Thread(target=lambda: [slines.append(json.loads(l)) for l in sub.stdout if l.startswith("{")], daemon=True).start()
plines = []
stall = float(E("STALL", 0)); stall_at = None
t_start = time.monotonic()
def stall_thread():
    global stall_at
    time.sleep(2.0 + 0.5)
    if stall:
        sub.send_signal(signal.SIGSTOP); stall_at = time.monotonic() - t_start; time.sleep(stall); sub.send_signal(signal.SIGCONT)
threading.Thread(target=stall_thread, daemon=True).start()
for l in prod.stdout:
    j = json.loads(l); plines.append(j)
    if j.get("event") == "done": break
time.sleep(0.5)
prod.stdin.write("\n"); prod.stdin.flush(); prod.wait(30)
sub.send_signal(signal.SIGTERM); sub.wait(10)
err = sub.stderr.read()[-800:]
W = [x for x in plines if "t" in x]
done = [x for x in plines if x.get("event") == "done"][0]
# the windows with drops; the stall ends at ~2.5+STALL (producer clock starts a bit later)
drop_ws = [x["t"] for x in W if x["drop"]]
zero_ok = [x["t"] for x in W if x["ok"] == 0]
after = [x for x in W if x["t"] > 2.5 + stall + 0.5]
last_drop = max(drop_ws) if drop_ws else None
res = {"cfg": {k: E(k, "") for k in ("POLICY", "WAIT", "ACK", "GRACE", "RATE", "CAP_KIB", "DUR", "STALL", "SLOW")},
       "n": done["n"], "ok": sum(x["ok"] for x in W), "drop": sum(x["drop"] for x in W),
       "drop_windows": len(drop_ws), "first_drop_t": min(drop_ws) if drop_ws else None, "last_drop_t": last_drop,
       "zero_ok_windows": len(zero_ok), "max_capture_s": max((x["max"] for x in W), default=0),
       "drops_after_stall+0.5s": sum(x["drop"] for x in after),
       "sub_max_holds": max((x["maxholds"] for x in slines), default=None), "sub_max_held": max((x["held"] for x in slines), default=None),
       "sub_fail": slines[-1]["fail"] if slines else None, "sub_n": slines[-1]["n"] if slines else None, "unpinned": slines[-1]["unpinned"] if slines else None,
       "rss_mb": slines[-1]["rss_mb"] if slines else None, "pstats": {k: done["stats"].get(k) for k in ("dropped", "backlog_max", "unrecorded", "drop_entries", "committed")},
       "sub_err": err[-300:] if "Traceback" in err else ""}
print(json.dumps(res), flush=True)
if E("TIMELINE"):
    for x in W: print("P", json.dumps(x))
    for x in slines: print("S", json.dumps(x))
import shutil; shutil.rmtree(d, ignore_errors=True)
