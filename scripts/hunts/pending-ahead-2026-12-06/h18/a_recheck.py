"""a_recheck.py DIR N: resume the durable name of an a_run.py dir (kept ring of the closed producer),
read until idle with a_sub.py poll mode, then recount rids s-0..s-(N-1) delivered/named/silent."""
import os, sys, json, subprocess, time
from pathlib import Path
w = Path(sys.argv[1]); n = int(sys.argv[2]); tag = w.name.split("-")[-1]
d = Path("/tmp/hunt-h18/ep") / tag; d.mkdir(parents=True, mode=0o700, exist_ok=True); ep = f"ipc://{d}/p.sock"
env = dict(os.environ); env.pop("PYTHONPATH", None); env["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h18/subs"
r = subprocess.run(["/work/main/.venv/bin/python", "a_sub.py", ep, f"h18-a{tag}", str(w), "poll", "6"], env=env, capture_output=True, text=True, timeout=300)
print(r.stdout[-500:], r.stderr[-800:])
got = {l.split()[0] for l in (w / "got.txt").read_text().split("\n") if l}
named = {json.loads(l)["rid"] for l in (w / "fails.jsonl").read_text().split("\n") if l and json.loads(l)["kind"] != "ended"}
silent = [f"s-{i}" for i in range(n) if f"s-{i}" not in got and f"s-{i}" not in named]
print(json.dumps({"dir": str(w), "delivered": len(got), "named": len(named), "silent": len(silent), "silent_rids": silent[:30]}))
