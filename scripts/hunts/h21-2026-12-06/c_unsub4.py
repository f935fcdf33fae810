"""c_unsub.py [RUNS]: drop-policy small ring, chunked interleaved producer with aborts; `hscapture drain` killed
(SIGKILL) at random moments 3 times, then `hscapture drain --unsubscribe`. Checks: every failed rid and every committed
rid not in shards is named (reports.jsonl or the given-up warning); no rid named twice; none both written and reported."""
import os, sys, json, time, random, signal, subprocess, uuid, collections, re
from pathlib import Path
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h21/subs"
env = dict(os.environ); env.pop("PYTHONPATH", None)
py = "/work/main/.venv/bin/python"; here = Path(__file__).parent
for run in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
    tag = uuid.uuid4().hex[:6]; dd = Path("/tmp/hunt-h21/ep") / tag; dd.mkdir(parents=True, mode=0o700); ep = f"ipc://{dd}/p.sock"
    out = f"/tmp/hunt-h21/work/c-{tag}"
    from hscapture.drain import resume_name
    spec = {"durable_name": resume_name(out), "ep": ep, "pid": f"h20-c-{tag}", "cap": 256 << 10, "n": int(os.environ.get("NRID", 600)), "rate": 300, "K": 6, "CH": 3, "abort": 0.05, "seed": run, "H": 64}
    prod = subprocess.Popen([py, str(here / "a_prod_acct.py"), json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    prod.stdout.readline(); rcs = []; tl = []; T0 = time.monotonic()
    for k in range(3):
        d = subprocess.Popen([py, "-m", "hscapture", "drain", "-e", ep, "-o", out, "-q", "--flush-every", "64K"], env=env,
                             stdout=subprocess.DEVNULL, stderr=open(f"{out}.drain{k}.err", "w"))
        tl.append(("start", k, time.monotonic()))
        try: d.wait(random.uniform(2.5, 4.0) if k == 0 else random.uniform(float(os.environ.get("LO", 0.5)), float(os.environ.get("HI", 2.0))))
        except subprocess.TimeoutExpired: d.send_signal(signal.SIGKILL); d.wait()
        tl.append(("end", k, time.monotonic(), d.returncode))
        rcs.append(d.returncode)
    done = json.loads(prod.stdout.readline()); st = done["status"]; at = done["at"]
    open(f"{out}.prod_done.json", "w").write(json.dumps(done, default=str))
    code = "import sys,json; from hscapture.drain import unsubscribe; h,g,f = unsubscribe([sys.argv[1]], sys.argv[2]); print(json.dumps({'held': h, 'given_up': g, 'failures': f}))"
    u = subprocess.run([py, "-c", code, ep, out], env=env, capture_output=True, text=True, timeout=120)
    uj = json.loads(u.stdout.strip().splitlines()[-1]) if u.returncode == 0 else {"held": None, "given_up": [], "failures": []}
    open(f"{out}.unsub.err", "w").write(u.stderr); open(f"{out}.unsub.out", "w").write(u.stdout)
    prod.stdin.write("\n"); prod.stdin.flush(); pafter = json.loads(prod.stdout.readline()); prod.wait(20)
    import glob as _g
    jr = set(re.findall(r'"rid":\s*"(r-\d+)"', "".join(open(f, errors="replace").read() for f in _g.glob(out + "/*.journal"))))
    written = collections.Counter(json.loads(l)["rid"] for l in open(f"{out}/index.jsonl").read().split("\n") if l) if os.path.exists(f"{out}/index.jsonl") else {}
    rep = [json.loads(l) for l in open(f"{out}/reports.jsonl").read().split("\n") if l] if os.path.exists(f"{out}/reports.jsonl") else []
    named = collections.Counter(r["rid"] for r in rep if "rid" in r and r.get("kind") != "ended")
    given_up = set(uj["given_up"]); unsub_named = {f[1] for f in uj["failures"]}
    failed = [r for r, s in st.items() if s != "ok"]
    ok_unwritten = [r for r, s in st.items() if s == "ok" and r not in written]
    unnamed = [r for r in failed + ok_unwritten if r not in named and r not in given_up and r not in written and r not in unsub_named and r not in jr]
    twice = [r for r, c in named.items() if c > 1]
    dupw = [r for r, c in written.items() if c > 1]
    both = [r for r in named if r in written]
    last_rep = max((i for i, r in enumerate(rep) if r.get("reported")), default=-1)
    after = [r for r in rep[last_rep + 1:] if "rid" in r]
    def cls(r):
        sts = at.get(r, [])
        pres = [not x.split(":")[-1].startswith("none") for x in sts]
        return "all" if pres and all(pres) else "none" if not any(pres) else "mixed"
    byclass = collections.Counter(cls(r) for r in st)
    unnamed_cls = collections.Counter(cls(r) for r in unnamed)
    unnamed_in_place = [r for r in unnamed if cls(r) != "none"]
    print(json.dumps({"prod_at_done": {k: done["stats"].get(k) for k in ("backlog", "unrecorded", "dropped", "aborted")},
                      "prod_after_unsub": {k: pafter["stats"].get(k) for k in ("backlog", "unrecorded", "dropped", "aborted")}, "slot_after": pafter["slot"], "held": uj["held"],
                      "journaled": len(jr), "unnamed_by_status": collections.Counter(st[r] for r in unnamed), "waited": done["waited"], "trans": [(t[0], round(t[1] - T0, 3), t[2]) for t in done["trans"]][:12],
                      "drains": [(x[0], x[1], round(x[2] - T0, 3)) + tuple(x[3:]) for x in tl], "rid_classes": byclass, "unnamed_by_class": unnamed_cls,
                      "n_unnamed_while_place": len(unnamed_in_place), "unnamed_while_place": unnamed_in_place[:20], "out": out, "drain_rcs": rcs, "unsub_rc": u.returncode, "statuses": collections.Counter(st.values()), "written": len(written),
                      "named": len(named), "given_up": len(given_up), "unsub_named": len(unsub_named), "unnamed": unnamed[:10], "n_unnamed": len(unnamed),
                      "named_twice": twice[:10], "written_twice": dupw[:10], "written_and_named": both[:10], "lines_after_last_reported": len(after),
                      "unsub_err_tail": u.stderr[-300:] if u.returncode else ""}), flush=True)
