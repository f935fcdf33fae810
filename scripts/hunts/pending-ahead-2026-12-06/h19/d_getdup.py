"""d_getdup.py: a durable Subscriber takes s-10..s-19 with get(rid) (each released) while s-0..s-9 wait queued
(never taken), then SIGKILLs itself. A resumer of the name polls until idle: are s-10..s-19 delivered again?"""
import os, sys, json, time, signal, subprocess, uuid
from pathlib import Path
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h19/subs"
env = dict(os.environ); env.pop("PYTHONPATH", None)
py = "/work/main/.venv/bin/python"; here = Path(__file__).parent
tag = uuid.uuid4().hex[:6]; dd = Path("/tmp/hunt-h19/ep") / tag; dd.mkdir(parents=True, mode=0o700); ep = f"ipc://{dd}/p.sock"
name = f"h19-getdup{tag}"
if len(sys.argv) > 1:
    import hscapture
    sub = hscapture.Subscriber(sys.argv[2], name=sys.argv[3])
    if sys.argv[1] == "first":
        for i in range(10, 20):
            s = sub.get(f"s-{i}", timeout=20); print("took", s.rid, flush=True); s.release()
        print("ready queue:", [s.rid for s in sub._delivery.ready], flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    got = []; last = time.monotonic()
    while time.monotonic() - last < 2:
        s = sub.poll(timeout=0.2)
        if s is not None: got.append(s.rid); s.release(); last = time.monotonic()
    print("resumer got:", got, "failures:", sub.failures(), flush=True); sub.close(); sys.exit()
prod = subprocess.Popen([py, str(here / "c_prod.py"), json.dumps({"ep": ep, "pid": f"h19-g-{tag}", "cap": 1 << 20, "rate": 50, "dur": 0.4})],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
assert json.loads(prod.stdout.readline())["event"] == "ready"
a = subprocess.run([py, __file__, "first", ep, name], env=env, capture_output=True, text=True, timeout=60)
print(a.stdout[-800:], "rc", a.returncode)
print("producer:", json.loads(prod.stdout.readline())["n"])
b = subprocess.run([py, __file__, "second", ep, name], env=env, capture_output=True, text=True, timeout=60)
print(b.stdout[-1500:], b.stderr[-500:])
prod.stdin.write("\n"); prod.stdin.flush(); prod.wait(20)
