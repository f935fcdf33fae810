"""d_samename.py: the same durable name at two endpoints (documented as two subscriptions). A = b_sub.py at ep1
(drop ring under load, records nothing and never acknowledges: ACK_S=1000) is SIGSTOPped 3 s then SIGKILLed
after a give-back (pending file written). Then B = Subscriber(ep2, name=same) in this process: does B report A's
failures? B.unsubscribe(): is A's pending file removed? Then A resumes at ep1 until idle: silent rids?"""
import os, sys, json, time, signal, subprocess, uuid, threading, collections, hashlib
from pathlib import Path
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h19/subs"
env = dict(os.environ); env.pop("PYTHONPATH", None)
py = "/work/main/.venv/bin/python"; here = Path(__file__).parent
tag = uuid.uuid4().hex[:6]
dd = Path("/tmp/hunt-h19/ep") / tag; dd.mkdir(parents=True, mode=0o700); ep1 = f"ipc://{dd}/p1.sock"; ep2 = f"ipc://{dd}/p2.sock"
w = Path("/tmp/hunt-h19/work") / f"samename-{tag}"; w.mkdir(parents=True); (w / "got.txt").touch()
name = f"h19-same{tag}"
def prod(ep, rate, dur, n):
    p = subprocess.Popen([py, str(here / "c_prod.py"), json.dumps({"ep": ep, "pid": f"h19-s{n}-{tag}", "cap": 256 << 10, "rate": rate, "dur": dur})],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(w / f"prod{n}.err", "w"), text=True, env=env)
    assert json.loads(p.stdout.readline())["event"] == "ready"; return p
p1 = prod(ep1, 1500, 8, 1); p2 = prod(ep2, 5, 60, 2)
done = {}; threading.Thread(target=lambda: done.update(json.loads(p1.stdout.readline())), daemon=True).start()
def start(*extra, ack="1000"):
    e = dict(env); e["ACK_S"] = ack
    return subprocess.Popen([py, str(here / "b_sub.py"), ep1, name, str(w), "periodic", *extra], stdout=open(w / "sub.out", "a"), stderr=open(w / "sub.err", "a"), env=e)
def unpins(): p = w / "unpin.log"; return p.read_text().count("UNPIN") if p.exists() else 0
pp = Path(os.environ["HSCAPTURE_SUBS_DIR"]) / f"hscapture.pending-{os.geteuid()}-{hashlib.sha1(name.encode()).hexdigest()[:16]}"
a = start(); time.sleep(1.0); a.send_signal(signal.SIGSTOP); time.sleep(3.0); a.send_signal(signal.SIGCONT)
t0 = time.monotonic()
while time.monotonic() - t0 < 15 and unpins() == 0: time.sleep(0.01)
time.sleep(0.3); a.send_signal(signal.SIGKILL); a.wait()
lines_a = pp.read_text().splitlines() if pp.exists() else []
print("A killed; unpins", unpins(), "pending lines", len(lines_a))
import hscapture
b = hscapture.Subscriber(ep2, name=name)
t0 = time.monotonic()
while time.monotonic() - t0 < 1.5:
    s = b.poll(timeout=0.1)
    if s is not None: s.release()
bf = b.failures(); pend_rids = {json.loads(l)["rid"] for l in lines_a}
print("B (ep2) failures:", len(bf), "of which A's pending rids:", len({f[1] for f in bf} & pend_rids), bf[:3])
if not os.environ.get("NOACK"): b.acknowledge_failures(len(bf))
print("after B acknowledged, pending file exists:", pp.exists(), "lines", len(pp.read_text().splitlines()) if pp.exists() else 0)
gu = b.close() if os.environ.get("CLOSE") else b.unsubscribe()
print("after B.unsubscribe(): pending file exists:", pp.exists())
while not done: time.sleep(0.1)
f = start("3", ack="0.1"); f.wait(120)
p1.stdin.write("\n"); p1.stdin.flush(); p1.wait(30); p2.kill(); p2.wait()
res = done["res"]
got = collections.Counter(l.split()[0] for l in (w / "got.txt").read_text().split("\n") if l)
fails = [json.loads(l) for l in (w / "fails.jsonl").read_text().split("\n") if l] if (w / "fails.jsonl").exists() else []
named = {x["rid"] for x in fails if x["kind"] != "ended"}
silent = sorted((r for r in res if r not in got and r not in named), key=lambda r: int(r[2:]))
print(json.dumps({"n": done["n"], "delivered": len(got), "named_by_A": len(named), "silent": len(silent), "silent_rids": silent[:10],
                  "silent_in_A_pending": len(set(silent) & pend_rids), "named_only_by_B": len(({f[1] for f in bf} - named) & set(res)), "dir": str(w)}))
