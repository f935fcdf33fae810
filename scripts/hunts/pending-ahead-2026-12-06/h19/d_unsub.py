"""d_unsub.py: a drain's pending file (crafted: 3 failures a killed drain into OUT read and left unacknowledged,
their ring records given back) and `hscapture drain --unsubscribe -e EP -o OUT`: are the 3 rids named anywhere
(stdout/stderr, OUT/reports.jsonl)? Is the file removed?"""
import os, json, subprocess, uuid
from pathlib import Path
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h19/subs"
from hscapture.drain import resume_name
from hscapture import _subscriptions as S
tag = uuid.uuid4().hex[:6]; out = Path(f"/tmp/hunt-h19/work/unsub-{tag}/out"); out.mkdir(parents=True)
ep = f"ipc:///tmp/hunt-h19/ep/unsub-{tag}.sock"; name = resume_name(str(out))
S.record_pending(name, [("dropped", f"u-{i}", "dropped by producer: ring_full", f"7:{i}") for i in range(3)])
print("pending before:", S.pending(name))
env = dict(os.environ); env.pop("PYTHONPATH", None)
r = subprocess.run(["/work/main/.venv/bin/hscapture", "drain", "--unsubscribe", "-e", ep, "-o", str(out)], env=env, capture_output=True, text=True, timeout=60)
print("rc", r.returncode, "stdout:", r.stdout[-600:], "stderr:", r.stderr[-1200:])
print("rids named in output:", [f"u-{i}" for i in range(3) if f"u-{i}" in r.stdout + r.stderr])
print("reports.jsonl:", (out / "reports.jsonl").read_text() if (out / "reports.jsonl").exists() else None)
print("pending file exists after:", S._pending_path(name).exists())
