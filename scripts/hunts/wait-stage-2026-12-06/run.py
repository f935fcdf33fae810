"""h16 driver: python run.py SCEN SEED [key=value ...]  (keys override the spec / schedule)
sub modes: anon (sub.py), drain (hscapture drain, SIGKILL/restart per 'dkills')."""
import json, os, sys, time, uuid, signal, shutil, random, subprocess as sp, threading
from pathlib import Path
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h16/subs"; os.environ["PYTHONUNBUFFERED"] = "1"
sys.path.insert(0, "/work/main/tests"); sys.path.insert(0, "/work/main")
from fault_support import start_drain, drain_report, durable_rids, verify_shards, index_rids
HERE = Path("/tmp/hunt-h16"); PY = sys.executable
ENV = dict(os.environ, PYTHONPATH="/work/main")
SCEN, SEED = sys.argv[1], int(sys.argv[2])
kv = {}
for a in sys.argv[3:]:
    k, v = a.split("=", 1)
    try: v = json.loads(v)
    except ValueError: pass
    kv[k] = v
def reader(proc, evs):
    for line in proc.stdout:
        try: evs.append(json.loads(line))
        except ValueError: evs.append({"raw": line})
def ev(evs, name, timeout=60):
    t = time.monotonic() + timeout
    while time.monotonic() < t:
        for e in evs:
            if e.get("event") == name: return e
        time.sleep(0.02)
    return None
tag = f"{SCEN}-{SEED}-{uuid.uuid4().hex[:5]}"
work = HERE / "work" / tag; work.mkdir(parents=True)
epd = HERE / "ep" / uuid.uuid4().hex[:8]; epd.mkdir(mode=0o700)
ep = f"ipc://{epd}/p.sock"
spec = {"endpoint": ep, "pid": f"h16-{uuid.uuid4().hex[:6]}", "cap": 64 << 10, "policy": "wait", "wait": 0.2,
        "hb": 0.1, "n": 300, "seed": SEED, "interleave": 4, "mode": "single", "ledger": str(work / "ledger.jsonl"),
        "abort_p": 0.05, "restart_p": 0.05, "pace": 0.0}
sched = {"sub_delay": 0.0, "sub": "anon", "stops": [[0.5, 1.5]], "slow": 0.0, "dkills": [], "idle": 4.0}
for k, v in kv.items():
    (sched if k in sched else spec)[k] = v
(work / "spec.json").write_text(json.dumps(spec))
out = work / "out"
subs = []; drains = []
def start_sub():
    if sched["sub"] == "anon":
        s = sp.Popen([PY, str(HERE / "sub.py"), ep, str(work / "sub.jsonl"), str(sched["idle"]), "-", str(sched["slow"])],
                     env=ENV, stderr=open(work / "sub.err", "a"))
    else:
        s = start_drain(ep, out, "--flush-every", "1K")
    subs.append(s); return s
sub = start_sub() if not sched["sub_delay"] else None
pe = []
pp = sp.Popen([PY, str(HERE / "prod.py"), str(work / "spec.json")], stdin=sp.PIPE, stdout=sp.PIPE,
              stderr=open(work / "prod.err", "w"), text=True, env=ENV)
threading.Thread(target=reader, args=(pp, pe), daemon=True).start()
if sub is None:
    assert ev(pe, "ready", 60); time.sleep(sched["sub_delay"]); sub = start_sub()
assert ev(pe, "attached", 60), "no attach"
t0 = time.monotonic()
actions = [(a, "stop", b) for a, b in sched["stops"]] + [(a, "dkill", None) for a in sched["dkills"]]
actions.sort()
for at, what, dur in actions:
    while time.monotonic() - t0 < at: time.sleep(0.01)
    if pp.poll() is not None and what == "stop": break
    if what == "stop":
        sub.send_signal(signal.SIGSTOP); time.sleep(dur); sub.send_signal(signal.SIGCONT)
    else:
        sub.send_signal(signal.SIGKILL); drains.append(("killed",) + drain_report(sub)); sub = start_sub()
try:
    pp.wait(120)
except sp.TimeoutExpired:
    print("PRODUCER TIMEOUT (deadlock?)", pe[-3:]); pp.kill()
prod_rc = pp.returncode
if sched["sub"] == "anon":
    try: sub.wait(60)
    except sp.TimeoutExpired: print("SUB TIMEOUT"); sub.kill()
else:
    if prod_rc != 0:  # killed producer: give the drain time then stop
        time.sleep(2)
    else:
        time.sleep(1.5)
    sub.send_signal(signal.SIGINT); drains.append(("final",) + drain_report(sub))
    # one more drain to pick up anything left
    d2 = start_drain(ep, out, "--idle-timeout", "2"); drains.append(("after",) + drain_report(d2))
# ---- accounting
attempts = {}  # (rid, att) -> dict
order = []
kill = False
for line in open(work / "ledger.jsonl"):
    d = json.loads(line)
    if "kill" in d: kill = True; continue
    if "c" in d:
        a = attempts.setdefault((d["c"], d["att"]), {"chunks": [], "abort": None, "complete": False})
        a["chunks"].append((d["s"], d["e"], d["ok"], d["dt"]))
        if d["last"]: a["complete"] = True
    elif "a" in d:
        attempts[(d["a"], d["att"])]["abort"] = "restart" if d["restart"] else "abort"
dts = sorted(c[3] for a in attempts.values() for c in a["chunks"])
problems = []
delivered = {}; inexact = []; reported = {}; lost = []
if sched["sub"] == "anon":
    st = {}
    for line in open(work / "sub.jsonl"):
        d = json.loads(line)
        if d["event"] == "sample":
            delivered[d["rid"]] = delivered.get(d["rid"], 0) + 1
            if d["exact"] is not True: inexact.append((d["rid"], d["exact"]))
        elif d["event"] == "stats": st = d["stats"]
        elif d["event"] == "raise": problems.append(("get raised", d["err"]))
    for k in ("dropped", "incomplete", "rejected", "in_flight", "undelivered"):
        v = st.get(k) or {}
        for rid in (v if isinstance(v, (dict, list)) else []):
            reported.setdefault(rid, []).append(k)
    lost = st.get("lost") or []
    if not st: problems.append(("no stats", None))
    extra = {"restarted": st.get("restarted"), "conflicts": st.get("conflicts")}
else:
    for r in durable_rids(out): delivered[r] = delivered.get(r, 0) + 1
    for name, rc, rep, err in drains:
        for k in ("dropped", "incomplete", "rejected", "in_flight"):
            for rid in (rep.get(k) or {}): reported.setdefault(rid, []).append(f"{name}:{k}")
        lost += rep.get("lost") or []
    rj = out / "reports.jsonl"
    if rj.exists():
        for line in rj.read_text().splitlines():
            try: d = json.loads(line)
            except ValueError: continue
            if "rid" in d: reported.setdefault(d["rid"], []).append("jsonl:" + str(d.get("kind")))
    try:
        from hscapture.reader import ShardSet
        from fault_support import check_exact
        rs = ShardSet(str(out))
        for rid in rs.rids:
            s = rs.get(rid)
            try: check_exact({f"layer_{L}": s.layer(L) for L in (0, 1)}, s.token_ids, rid, int(s.token_ids.shape[0]))
            except AssertionError as e: inexact.append((rid, repr(e)[:150]))
    except Exception as e: problems.append(("shards", repr(e)[:200]))
    extra = {"drains": [(n, rc, {k: (len(v) if isinstance(v, (dict, list)) else v) for k, v in rep.items() if k in ("written", "dropped", "incomplete", "rejected", "in_flight", "lost", "duplicates_skipped", "unresolved")}) for n, rc, rep, err in drains]}
# expectations per rid
by_rid = {}
for (rid, att), a in sorted(attempts.items()):
    by_rid.setdefault(rid, []).append(a)
defer = spec.get("defer")
silent = []; dup = []; both = []; spurious = []
for rid, atts in by_rid.items():
    must_deliver = 0; may_deliver = 0; must_report = False; may_report = False
    for a in atts:
        oks = [c[2] for c in a["chunks"]]
        if a["abort"] == "restart":
            if not all(oks): must_report = True    # the drop was reported before the restart
            continue
        if a["abort"] == "abort":
            if oks: must_report = True
            continue
        if not a["complete"]:   # cut by a kill
            if any(oks): may_report = True
            continue
        if all(oks) and not defer: must_deliver += 1
        elif defer and all(oks): may_deliver += 1
        else: must_report = True
    got = delivered.get(rid, 0); rep = reported.get(rid)
    if got > must_deliver + may_deliver: dup.append((rid, got, must_deliver + may_deliver))
    if got < must_deliver and not rep: silent.append((rid, got, must_deliver, [a["abort"] for a in atts]))
    if got < must_deliver + may_deliver and not rep and defer and not kill: silent.append((rid, got, must_deliver + may_deliver, "defer"))
    if must_report and not rep and not kill: silent.append((rid, "unreported", [(a["abort"], [c[2] for c in a["chunks"]]) for a in atts]))
    if rep and got and len(atts) == 1: both.append((rid, got, rep))
    if rep and not (must_report or may_report or got < must_deliver + may_deliver) and len(atts) == 1: spurious.append((rid, rep))
wt = spec.get("wait", 0) if spec["policy"] == "wait" else 0
over = [d for d in dts if d > wt + 0.1]
res = {"tag": tag, "prod_rc": prod_rc, "attempts": len(attempts), "rids": len(by_rid), "delivered": sum(delivered.values()),
       "reported_rids": len(reported), "lost": lost[:5], "silent": silent[:10], "n_silent": len(silent), "dup": dup[:10],
       "both": both[:10], "spurious": spurious[:10], "inexact": inexact[:5], "problems": problems,
       "dt_max": dts[-1] if dts else None, "dt_p99": dts[int(len(dts) * .99)] if dts else None, "n_over_wait+0.1": len(over),
       "prod_events": [e for e in pe if e.get("event") in ("captured", "flushed", "done", "flush_error", "killing")], **extra}
bad = bool(silent or dup or both or inexact or problems or over or prod_rc not in (0, -9) and not kill)
res["BAD"] = bad
print(json.dumps(res, default=str))
shutil.rmtree(epd, ignore_errors=True)
