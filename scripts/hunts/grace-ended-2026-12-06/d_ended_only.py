"""Scenario D (hunt h15): a drain started on a directory whose reports.jsonl ends with 'ended' lines
(after / before a 'reported' line) must not print them, count them, or exit 3 for them."""
import os, sys, json, subprocess, uuid, time, shutil
from pathlib import Path
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h15/subs"
env = dict(os.environ); env["PYTHONPATH"] = "/work/main"
py = "/work/main/.venv/bin/python"
d = Path("/tmp/hunt-h15/ep") / uuid.uuid4().hex[:8]; d.mkdir(parents=True, mode=0o700); ep = f"ipc://{d}/p.sock"
prod = subprocess.Popen([py, "-c", f"""
import sys, time; sys.path.insert(0, '/work/main'); import hscapture
p = hscapture.Producer({ep!r}, producer_id='h15d-{uuid.uuid4().hex[:4]}', capacity=1<<20)
print('ready', flush=True); time.sleep(40); p.close()"""], stdout=subprocess.PIPE, text=True, env=env)
assert prod.stdout.readline().strip() == "ready"
E = lambda k, r, why, ev: json.dumps({"kind": k, "rid": r, "reason": why, "event": ev})
cases = {
  "ended_after_reported": [E("dropped", "x-1", "dropped by producer: ring_full", "77:10"), '{"reported": true, "at": "2026-12-06T00:00:00Z"}',
                           E("ended", "x-1", "aborted by producer: client abort", "77:12")],
  "drop_and_ended_unreported": [E("dropped", "x-2", "dropped by producer: ring_full", "77:20"), E("ended", "x-2", "aborted by producer: client abort", "77:22")],
  "ended_only": [E("ended", "x-3", "aborted by producer: client abort", "77:32")],
}
ok = True
for name, lines in cases.items():
    out = Path("/tmp/hunt-h15/work") / f"dended-{name}-{uuid.uuid4().hex[:4]}"; out.mkdir(parents=True)
    (out / "reports.jsonl").write_text("".join(l + "\n" for l in lines))
    r = subprocess.run([py, "-m", "hscapture", "drain", "--json", "-o", str(out), "-e", ep, "--idle-timeout", "1"],
                       capture_output=True, text=True, env=env, timeout=60)
    try: rep = json.loads(r.stdout)
    except ValueError: rep = {"_raw": r.stdout[-300:]}
    named = {k: rep.get(k) for k in ("dropped", "incomplete", "rejected") if rep.get(k)}
    errl = [l for l in r.stderr.splitlines() if "x-" in l]
    exp_rc = 3 if name == "drop_and_ended_unreported" else 0
    exp_named = {"dropped": ["x-2"]} if name == "drop_and_ended_unreported" else {}
    good = r.returncode == exp_rc and {k: sorted(v) for k, v in named.items()} == exp_named
    ok &= good
    print(json.dumps({"case": name, "rc": r.returncode, "named": named, "reported_from_earlier": rep.get("reported_from_earlier_drain"),
                      "stderr_lines_naming_x": errl[:4], "ok": good}))
    print("  reports.jsonl after:", (out / "reports.jsonl").read_text().replace("\n", " | ")[:400])
prod.kill(); prod.wait(); shutil.rmtree(d, ignore_errors=True)
print("RESULT", "ok" if ok else "PROBLEM")
