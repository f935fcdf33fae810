"""A durable drain is the first subscriber; a sample 'a' whose first chunk was committed
before it attached is held in memory as 'cut' (protocol v3: its fate unknown), and the
unheard entry's record is released (no failure in it). The drain is SIGKILLed; the producer
then closes without ever finishing 'a' (w1 after it as a marker). A second drain into the
same directory runs to idle. Expect 'a' named (incomplete) by some drain's report."""
import sys, time, json, subprocess, os, signal, tempfile
from common import *

HS = str(Path(__file__).resolve().parents[3] / ".venv" / "bin" / "hscapture")

def drain(ep, out, extra=()):
    return subprocess.Popen([HS, "drain", "-e", ep, "-o", out, "--json", "--flush-every", "1K", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

def run(i):
    setup_env()
    ep = new_endpoint()
    out = tempfile.mkdtemp(prefix="h1-", dir="/tmp")
    plan = [["chunk", "a", 8, 0, 4], ["flush"], ["emit", "pre"], ["consumers", 1], ["sleep", 0.5],
            ["cap", "w0", 8, 8], ["flush"], ["emit", "w0"], ["stdin"], ["cap", "w1", 8, 8], ["flush"], ["sleep", 0.3]]
    P = Prod({"endpoint": ep, "plan": plan})
    P.wait_event("pre")
    D1 = drain(ep, out)
    P.wait_event("w0")
    time.sleep(1.5)          # the drain writes w0 and flushes (acknowledges)
    if os.environ.get("CONTROL"):   # the drain lives through the producer's close
        P.send(); P.wait(20); time.sleep(3)
        D1.send_signal(signal.SIGINT); D2 = D1
        o, e = D1.communicate(timeout=60)
    else:
        D1.send_signal(signal.SIGKILL); D1.wait()
        P.send()
        P.wait(20)
        D2 = drain(ep, out, ["--idle-timeout", "3"])
        o, e = D2.communicate(timeout=60)
    try:
        rep = json.loads(o.strip().splitlines()[-1])
    except Exception:
        rep = {"raw": o[-500:], "err": e[-800:]}
    rj = ""
    if os.path.exists(os.path.join(out, "reports.jsonl")):
        rj = open(os.path.join(out, "reports.jsonl")).read()
    named = "\"a\"" in json.dumps(rep) or "\"a\"" in rj
    print(json.dumps(rep)[:1500])
    print(i, "rc", D2.returncode, "a named:", named, "report keys:",
          {k: v for k, v in rep.items() if k in ("dropped", "incomplete", "lost", "written", "samples", "error")},
          "reports.jsonl:", rj[:300].replace("\n", " | "), flush=True)
    cleanup_shm([P])
    return not named

n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
bad = sum(run(i) for i in range(n))
print(f"RESULT {bad}/{n} runs with problems")
