"""Cut hold (Delivery._hold_cut): sample 'a' first chunk before the durable drain's attach,
its last chunk after: D1 reports 'a' incomplete (cut) and is SIGKILLed DELAY s later; the
producer closes; D2 into the same dir runs to idle. Problem: 'a' named twice in reports.jsonl
(double report across restarts), or named by both D1's file entries and D2's report, or
VARIANT=restart: 'a' is aborted with restart and captured whole again (delivered), then any
report of 'a' after the restarted capture is delivered is a false report.
usage: python c1_cut_double.py RUNS DELAY [plain|restart]"""
import sys, time, json, subprocess, os, signal, tempfile
from common import *
HS = str(Path(__file__).resolve().parents[3] / ".venv" / "bin" / "hscapture")
N = int(sys.argv[1]); DELAY = float(sys.argv[2]); VAR = sys.argv[3] if len(sys.argv) > 3 else "plain"

def drain(ep, out, extra=()):
    return subprocess.Popen([HS, "drain", "-e", ep, "-o", out, "--json", "--flush-every", "1K", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

def names(rep, rid):
    return [k for k in ("dropped", "incomplete", "rejected") if rid in (rep.get(k) or {})]

def run(i):
    setup_env()
    ep = new_endpoint()
    out = tempfile.mkdtemp(prefix="c1-", dir=os.environ.get("TMPDIR", "/tmp"))
    if VAR == "restart":
        tail = [["abort", "a", 1], ["cap", "a", 8, 8]]
    else:
        tail = [["chunk", "a", 8, 4, 8]]
    plan = [["chunk", "a", 8, 0, 4], ["flush"], ["emit", "pre"], ["consumers", 1], ["sleep", 0.5],
            ["cap", "w0", 8, 8], *tail, ["cap", "w0b", 8, 8], ["flush"], ["emit", "w0"], ["stdin"],
            ["cap", "w1", 8, 8], ["flush"], ["sleep", 0.3]]
    P = Prod({"endpoint": ep, "plan": plan})
    P.wait_event("pre")
    D1 = drain(ep, out)
    P.wait_event("w0")
    time.sleep(DELAY)
    D1.send_signal(signal.SIGKILL); D1.wait()
    rj1 = open(os.path.join(out, "reports.jsonl")).read() if os.path.exists(os.path.join(out, "reports.jsonl")) else ""
    P.send(); P.wait(20)
    D2 = drain(ep, out, ["--idle-timeout", "3"])
    o, e = D2.communicate(timeout=60)
    try:
        rep = json.loads(o.strip().splitlines()[-1])
    except Exception:
        rep = {"raw": o[-500:], "err": e[-800:]}
    rj = open(os.path.join(out, "reports.jsonl")).read() if os.path.exists(os.path.join(out, "reports.jsonl")) else ""
    a_lines = [l for l in rj.splitlines() if '"rid":"a"' in l.replace(" ", "")]
    a_before = [l for l in rj1.splitlines() if '"rid":"a"' in l.replace(" ", "")]
    idx = open(os.path.join(out, "index.jsonl")).read() if os.path.exists(os.path.join(out, "index.jsonl")) else ""
    import glob
    jr = "".join(open(j).read() for j in glob.glob(os.path.join(out, "*.journal")))
    a_written = ('"rid": "a"' in idx or '"rid":"a"' in idx.replace(" ", "") or '"rid":"a"' in jr.replace(" ", ""))
    d2names = names(rep, "a")
    prob = False
    if VAR == "plain":
        prob = len(a_lines) != 1 or a_written
    else:
        prob = (a_written and (a_lines or d2names)) or (not a_written and not a_lines)
    print(i, json.dumps({"prob": prob, "a_lines_total": len(a_lines), "a_lines_after_D1": len(a_before),
                         "d2_names_a": d2names, "a_written": a_written, "d2_lost": rep.get("lost"),
                         "d2_rc": D2.returncode, "a_lines": [l[:160] for l in a_lines]}), flush=True)
    cleanup_shm([P])
    return prob

bad = sum(run(i) for i in range(N))
print(f"RESULT {bad}/{N} runs with problems")
