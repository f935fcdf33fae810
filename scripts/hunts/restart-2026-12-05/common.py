"""Shared harness: producer subprocess driven by a JSON plan, verdict checker."""
from __future__ import annotations
import json, os, signal, subprocess, sys, threading, time, uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
PY = sys.executable
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from fault_support import source, check_exact, HIDDEN, LAYERS  # noqa

def setup_env():
    d = Path("/tmp") / f"hr-subs-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    os.environ["HSCAPTURE_SUBS_DIR"] = str(d)
    os.environ["PYTHONUNBUFFERED"] = "1"

def new_endpoint():
    d = Path("/tmp") / f"hr-{uuid.uuid4().hex[:8]}"
    d.mkdir(mode=0o700)
    ep = f"ipc://{d}/p.sock"
    with open(HERE / "endpoints.log", "a") as f:
        f.write(ep + "\n")
    return ep

def wait_until(cond, timeout, what, step=0.01):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        if step:
            time.sleep(step)

class Prod:
    """A producer process running prod.py with a plan; events from stdout."""
    def __init__(self, spec):
        f = HERE / f"spec-{uuid.uuid4().hex[:8]}.json"
        f.write_text(json.dumps(spec))
        # spec["script"]: a producer script beside the calling reproducer (another hunt's
        # folder), else this folder's prod.py
        script = Path(sys.argv[0]).resolve().parent / spec.get("script", "prod.py")
        if not script.exists():
            script = HERE / "prod.py"
        self.proc = subprocess.Popen([PY, str(script), str(f)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.events = []
        self.cond = threading.Condition()
        self.eof = False
        threading.Thread(target=self._read, daemon=True).start()
        self.errbuf = []
        threading.Thread(target=self._readerr, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                ev = json.loads(line)
            except Exception:
                continue
            with self.cond:
                self.events.append(ev)
                self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def _readerr(self):
        for line in self.proc.stderr:
            self.errbuf.append(line)

    def wait_event(self, name, timeout=60):
        with self.cond:
            ok = self.cond.wait_for(lambda: self.eof or any(e["event"] == name for e in self.events), timeout)
            ev = next((e for e in self.events if e["event"] == name), None)
        if ev is None:
            raise AssertionError(f"no {name} event; stderr: {''.join(self.errbuf)[-3000:]}")
        return ev

    def has(self, name):
        with self.cond:
            return any(e["event"] == name for e in self.events)

    def send(self, line="go"):
        try:
            self.proc.stdin.write(line + "\n"); self.proc.stdin.flush()
        except BrokenPipeError:
            pass

    def kill(self, sig=signal.SIGKILL):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout=60):
        rc = self.proc.wait(timeout)
        with self.cond:
            self.cond.wait_for(lambda: self.eof, 10)
        return rc

    def caps(self):
        """Every capture event (rid, start, end, last, ok, seq, epoch) the producer flushed."""
        with self.cond:
            out = []
            for e in self.events:
                if e["event"] == "flushed":
                    out.extend(e["caps"])
            return out

    def epoch(self):
        return self.wait_event("ready")["epoch"]


def take(sub, got, until, what, timeout=60, dup=None):
    def step():
        s = sub.poll(timeout=0.02)
        if s is not None:
            if s.rid in got and dup is not None:
                dup.append(s.rid)
            s._exact = None
            try:
                check_exact(s.tensors, s.token_ids, s.rid, s.num_tokens)
                s._exact = True
            except Exception as e:
                s._exact = str(e)
            got.setdefault(s.rid, []).append(s)
            s.release()
        return until()
    wait_until(step, timeout, what, step=0)


def verdict(name, prods, got, st, *, wanted=lambda r: True, expect_delivered=None, quiet=False):
    """prods: list of Prod; got: rid -> [samples]; st: sub.stats().
    Committed sample = all chunks of (epoch,rid) attempt flushed with ok=True, last chunk included.
    Returns dict of problems."""
    problems = {}
    named = set(st["dropped"]) | set(st["incomplete"]) | set(st["rejected"]) | set(st["undelivered"]) | set(st["in_flight"])
    lost = [(x["epoch"], x["first"], x["count"]) for x in st["lost"]]
    def in_lost(epoch, seq):
        return any(e == epoch and f <= seq < f + c for e, f, c in lost)
    committed = {}   # rid -> (epoch, tokens, seqs)
    started = {}
    for p in prods:
        cur = {}
        for c in p.caps():
            rid = c["rid"]
            if not wanted(rid):
                continue
            if c.get("kind") == "abort":
                cur.pop(rid, None)
                if not c.get("restart"):
                    started[rid] = (c["epoch"], [c["seq"]])
                continue
            if c["start"] == 0:
                cur[rid] = {"seqs": [], "ok": True, "epoch": c["epoch"]}
            a = cur.setdefault(rid, {"seqs": [], "ok": True, "epoch": c["epoch"]})
            a["seqs"].append(c["seq"])
            a["ok"] = a["ok"] and c["ok"]
            if c["last"]:
                if a["ok"]:
                    committed[rid] = (c["epoch"], c["end"], a["seqs"])
                else:
                    started[rid] = (c["epoch"], a["seqs"])
                cur.pop(rid, None)
        for rid, a in cur.items():
            started[rid] = (a["epoch"], a["seqs"])
    dups = [r for r, l in got.items() if len(l) > 1]
    if dups:
        problems["duplicates"] = dups
    bad = []
    for rid, (ep, tokens, seqs) in committed.items():
        for s in got.get(rid, []):
            if s._exact is not True or s.num_tokens != tokens:
                bad.append(f"{rid}: {s._exact} tokens {s.num_tokens} vs {tokens}")
    if bad:
        problems["wrong_bytes"] = bad
    silent = []
    by_range = []
    for rid, (ep, tokens, seqs) in committed.items():
        if rid in got or rid in named:
            continue
        if all(in_lost(ep, s) for s in seqs) or any(in_lost(ep, s) for s in seqs):
            by_range.append(rid)
        else:
            silent.append(rid)
    if silent:
        problems["silent_committed"] = sorted(silent)
    silent_started = []
    for rid, (ep, seqs) in started.items():
        if rid in committed or rid in got or rid in named or any(in_lost(ep, s) for s in seqs):
            continue
        silent_started.append(rid)
    if silent_started:
        problems["silent_started(partial/aborted)"] = sorted(silent_started)
    both = sorted(set(got) & (set(st["dropped"]) | set(st["incomplete"]) | set(st["rejected"])))
    if both:
        problems["delivered_and_reported"] = both
    unknown = sorted(set(got) - set(committed))
    if unknown:
        problems["delivered_not_committed"] = unknown
    summary = dict(committed=len(committed), delivered=len(set(got) & set(committed)),
                   named=len(named & set(committed)), by_range=len(by_range),
                   started_uncommitted=len(started), lost=st["lost"] and [(x["epoch"] & 0xffff, x["first"], x["count"], x["reason"][:60]) for x in st["lost"]])
    if not quiet:
        print(f"[{name}] {summary} problems={problems}")
    return problems, summary


def cleanup_shm(prods):
    from hscapture.ring import cleanup_stale
    for p in prods:
        ev = next((e for e in p.events if e["event"] == "ready"), None)
        if ev:
            seg = ev["segment"]
            try:
                cleanup_stale(seg, force=True)
            except Exception:
                pass
            for path in (f"/dev/shm/{seg}", f"/dev/shm/hscapture.left-{seg}"):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass


def take_many(pairs, until, what, timeout=60):
    """pairs: [(sub, got)]: poll each in turn until until()."""
    def step():
        for sub, got in pairs:
            s = sub.poll(timeout=0.005)
            if s is not None:
                s._exact = None
                try:
                    check_exact(s.tensors, s.token_ids, s.rid, s.num_tokens); s._exact = True
                except Exception as e:
                    s._exact = str(e)
                got.setdefault(s.rid, []).append(s)
                s.release()
        return until()
    wait_until(step, timeout, what, step=0)
