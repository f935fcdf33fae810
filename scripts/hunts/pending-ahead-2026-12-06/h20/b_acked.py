"""b_acked.py: chunked interleaved producer (a_prod.py, 300 rids, 3 chunks, 5 open) read by (1) `hscapture drain`,
(2) hscapture.stream(name=...), (3) in-order poll+release Subscriber, (4) get()-heavy in queue order;
counts {"sample" lines in each name's acked file (expected 0)."""
import os, sys, json, time, subprocess, uuid
from pathlib import Path
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h20/subs"
env = dict(os.environ); env.pop("PYTHONPATH", None)
py = "/work/main/.venv/bin/python"; here = Path(__file__).parent
if len(sys.argv) > 2:
    import hscapture
    ep, name, kind = sys.argv[1:4]; n = 0
    if kind == "stream":
        for s in hscapture.stream(ep, name=name, idle_timeout_s=2.0): n += 1
    else:
        sub = hscapture.Subscriber(ep, name=name); last = time.monotonic()
        while time.monotonic() - last < 2:
            s = sub.poll(timeout=0.2)
            if s is None: continue
            s.release(); n += 1; last = time.monotonic()
        sub.close()
    print(n); sys.exit()
from hscapture._subscriptions import _acked_path
from hscapture.drain import resume_name
for kind in ("drain", "stream", "poll"):
    tag = uuid.uuid4().hex[:6]; dd = Path("/tmp/hunt-h20/ep") / tag; dd.mkdir(parents=True, mode=0o700); ep = f"ipc://{dd}/p.sock"
    spec = {"ep": ep, "pid": f"h20-b-{tag}", "cap": 16 << 20, "n": 300, "rate": 400, "K": 5, "CH": 3, "abort": 0.02, "seed": 5}
    prod = subprocess.Popen([py, str(here / "a_prod.py"), json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    prod.stdout.readline()
    if kind == "drain":
        out = f"/tmp/hunt-h20/work/b-drain-{tag}"; name = resume_name(out)
        r = subprocess.run([py, "-m", "hscapture", "drain", "-e", ep, "-o", out, "--idle-timeout", "2", "-q"], env=env, capture_output=True, text=True)
        got = f"rc={r.returncode}"
    else:
        name = f"h20-b{kind}{tag}"
        r = subprocess.run([py, __file__, ep, name, kind], env=env, capture_output=True, text=True); got = r.stdout.strip() + r.stderr[-200:]
    st = json.loads(prod.stdout.readline()); prod.stdin.write("\n"); prod.stdin.flush(); prod.wait(20)
    p = _acked_path(name); txt = p.read_text() if p.exists() else ""
    print(kind, "got", got, "ok", sum(v == "ok" for v in st["status"].values()), "acked-file sample lines", txt.count('{"sample"'), "lines", txt.count("\n"))
