"""c_growth.py: durable b_sub.py periodic (ACK_S, default 1.0: records+acknowledges every ACK_S) under a drop ring
for DUR s, SIGSTOPped 2 s every 4 s (spills to the pending file); the pending file's line count is sampled
every 0.1 s. Reports max/last lines, pending-recorded spills, and whether the file is gone at the end."""
import os, sys, json, time, signal, subprocess, uuid, threading, hashlib
from pathlib import Path
env = dict(os.environ); env.pop("PYTHONPATH", None); env["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h19/subs"; env["ACK_S"] = os.environ.get("ACK_S", "1.0")
py = "/work/main/.venv/bin/python"; here = Path(__file__).parent
tag = uuid.uuid4().hex[:6]; dd = Path("/tmp/hunt-h19/ep") / tag; dd.mkdir(parents=True, mode=0o700); ep = f"ipc://{dd}/p.sock"
w = Path("/tmp/hunt-h19/work") / f"growth-{tag}"; w.mkdir(parents=True); (w / "got.txt").touch()
name = f"h19-grow{tag}"; DUR = float(os.environ.get("DUR", 20))
pp = Path("/tmp/hunt-h19/subs") / f"hscapture.pending-{os.geteuid()}-{hashlib.sha1(name.encode()).hexdigest()[:16]}"
prod = subprocess.Popen([py, str(here / "c_prod.py"), json.dumps({"ep": ep, "pid": f"h19-gr-{tag}", "cap": 256 << 10, "rate": 1500, "dur": DUR})],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(w / "prod.err", "w"), text=True, env=env)
assert json.loads(prod.stdout.readline())["event"] == "ready"
done = {}; threading.Thread(target=lambda: done.update(json.loads(prod.stdout.readline())), daemon=True).start()
s = subprocess.Popen([py, str(here / "b_sub.py"), ep, name, str(w), "periodic"], stdout=open(w / "sub.out", "a"), stderr=open(w / "sub.err", "a"), env=env)
samples = []; t0 = time.monotonic(); nxt = t0 + 2
while not done:
    if time.monotonic() > nxt:
        s.send_signal(signal.SIGSTOP); time.sleep(2); s.send_signal(signal.SIGCONT); nxt = time.monotonic() + 2
    samples.append(len(pp.read_text().splitlines()) if pp.exists() else 0); time.sleep(0.1)
time.sleep(3); last = len(pp.read_text().splitlines()) if pp.exists() else 0
s.send_signal(signal.SIGTERM); s.wait()
prod.stdin.write("\n"); prod.stdin.flush(); prod.wait(20)
un = (w / "unpin.log").read_text().splitlines() if (w / "unpin.log").exists() else []
print(json.dumps({"ack_s": env["ACK_S"], "n": done["n"], "max_lines": max(samples), "lines_by_second": samples[::10], "last_lines_3s_after": last,
                  "unpins": len(un), "pend_rec_total": un[-1].split("pend_rec=")[1] if un else 0, "dir": str(w)}))
