"""c_unsub.py [RUNS]: drop-policy small ring, chunked interleaved producer with aborts; `hscapture drain` killed
(SIGKILL) at random moments 3 times, then `hscapture drain --unsubscribe`. Checks: every failed rid and every committed
rid not in shards is named (reports.jsonl or the given-up warning); no rid named twice; none both written and reported."""
import os, sys, json, time, random, signal, subprocess, uuid, collections, re
from pathlib import Path
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h20/subs"
env = dict(os.environ); env.pop("PYTHONPATH", None)
py = "/work/main/.venv/bin/python"; here = Path(__file__).parent
for run in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
    tag = uuid.uuid4().hex[:6]; dd = Path("/tmp/hunt-h20/ep") / tag; dd.mkdir(parents=True, mode=0o700); ep = f"ipc://{dd}/p.sock"
    out = f"/tmp/hunt-h20/work/c-{tag}"
    spec = {"ep": ep, "pid": f"h20-c-{tag}", "cap": 256 << 10, "n": 600, "rate": 300, "K": 6, "CH": 3, "abort": 0.05, "seed": run, "H": 64}
    prod = subprocess.Popen([py, str(here / "a_prod.py"), json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    prod.stdout.readline(); rcs = []
    for k in range(3):
        d = subprocess.Popen([py, "-m", "hscapture", "drain", "-e", ep, "-o", out, "-q", "--flush-every", "64K"], env=env,
                             stdout=subprocess.DEVNULL, stderr=open(f"{out}.drain{k}.err", "w"))
        try: d.wait(random.uniform(0.5, 2.0))
        except subprocess.TimeoutExpired: d.send_signal(signal.SIGKILL); d.wait()
        rcs.append(d.returncode)
    st = json.loads(prod.stdout.readline())["status"]
    u = subprocess.run([py, "-m", "hscapture", "drain", "--unsubscribe", "-e", ep, "-o", out], env=env, capture_output=True, text=True, timeout=120)
    prod.stdin.write("\n"); prod.stdin.flush(); prod.wait(20)
    written = collections.Counter(json.loads(l)["rid"] for l in open(f"{out}/index.jsonl").read().split("\n") if l) if os.path.exists(f"{out}/index.jsonl") else {}
    rep = [json.loads(l) for l in open(f"{out}/reports.jsonl").read().split("\n") if l] if os.path.exists(f"{out}/reports.jsonl") else []
    named = collections.Counter(r["rid"] for r in rep if "rid" in r and r.get("kind") != "ended")
    given_up = set(re.findall(r"given up with it: (.*)", u.stderr)[0].split(", ")) if "given up with it:" in u.stderr else set()
    unsub_named = set(re.findall(r"(?:dropped|incomplete|rejected) (\S+):", u.stderr))
    failed = [r for r, s in st.items() if s != "ok"]
    ok_unwritten = [r for r, s in st.items() if s == "ok" and r not in written]
    unnamed = [r for r in failed + ok_unwritten if r not in named and r not in given_up and r not in written]
    twice = [r for r, c in named.items() if c > 1]
    dupw = [r for r, c in written.items() if c > 1]
    both = [r for r in named if r in written]
    last_rep = max((i for i, r in enumerate(rep) if r.get("reported")), default=-1)
    after = [r for r in rep[last_rep + 1:] if "rid" in r]
    print(json.dumps({"out": out, "drain_rcs": rcs, "unsub_rc": u.returncode, "statuses": collections.Counter(st.values()), "written": len(written),
                      "named": len(named), "given_up": len(given_up), "unsub_named": len(unsub_named), "unnamed": unnamed[:10], "n_unnamed": len(unnamed),
                      "named_twice": twice[:10], "written_twice": dupw[:10], "written_and_named": both[:10], "lines_after_last_reported": len(after),
                      "unsub_err_tail": u.stderr[-300:] if u.returncode else ""}), flush=True)
