"""Area 4: fork of a process holding a Subscriber; the child makes its own Subscriber, reads,
and exits (CHILD_EXIT: sys = normal interpreter exit, _exit = os._exit, close = child closes
the inherited subscriber explicitly first). The parent keeps reading a small ring (wait policy).
usage: python a4_fork.py RUNS sys|_exit|close [anon|durable]"""
import sys, gc
from he8 import *
from hscapture import Subscriber

RUNS = int(sys.argv[1]); CHILD_EXIT = sys.argv[2]; KIND = sys.argv[3] if len(sys.argv) > 3 else "anon"

def one(seed):
    ep, epd = new_ep()
    tmp = Path("/tmp/hunt-e8-work") / f"a4f-{seed}-{uuid.uuid4().hex[:6]}"; tmp.mkdir(parents=True)
    reqs = requests(600, seed=seed, tokens=(8, 32, 64), chunks=(16, 64))
    sizes = {r: t for r, t, _ in reqs}
    name = f"he8-a4-{uuid.uuid4().hex[:6]}" if KIND == "durable" else ""
    p = ProducerProc({"endpoint": ep, "requests": reqs, "producer_id": f"he8-a4-{seed}",
                      "consumers": 1, "rate": 300, "interleave": 3, "capacity": 256 << 10,
                      "policy": "wait", "wait_timeout_s": 20.0, "close_on_stdin": True,
                      "seed": seed}, tmp)
    got = []; bad = []; errs = []; parent = os.getpid()
    sub = None
    try:
        p.wait_event("ready")
        sub = Subscriber(ep, name=name)
        sub.wait_ready(10)
        t0 = time.monotonic()
        while len(got) < 50 and time.monotonic() - t0 < 20:
            s = sub.poll(timeout=0.1)
            if s: got.append(s.rid); check_exact(s.tensors, s.token_ids, s.rid, sizes[s.rid])
        pid = os.fork()
        if pid == 0:
            rc = 0
            import ctypes   # the harness's pipe to the producer is locked by a parent thread: never close it here
            for f in (p.proc.stdout, p.proc.stderr, p.proc.stdin, p): ctypes.pythonapi.Py_IncRef(ctypes.py_object(f))
            try:
                c = Subscriber(ep)
                c.wait_ready(10)
                n = 0; t1 = time.monotonic()
                while n < 30 and time.monotonic() - t1 < 10:
                    x = c.poll(timeout=0.1)
                    if x: n += 1
                c.close()
                if CHILD_EXIT == "close":
                    sub.close()
                with open(tmp / "child.txt", "w") as f: f.write(f"child read {n}\n")
            except BaseException as e:
                with open(tmp / "child.txt", "w") as f: f.write(f"child error {e!r}\n")
                rc = 1
            if CHILD_EXIT == "_exit":
                os._exit(rc)
            sys.exit(rc)
        # parent keeps reading
        last = time.monotonic(); hung = False
        while time.monotonic() - last < 3.0 or p.poll_event("captured") is None:
            try:
                s = sub.poll(timeout=0.1)
            except Exception as e:
                errs.append(f"{type(e).__name__}: {str(e)[:160]}"); time.sleep(0.1)
                if len(errs) > 50: break
                continue
            if s:
                last = time.monotonic(); got.append(s.rid)
                try: check_exact(s.tensors, s.token_ids, s.rid, sizes[s.rid])
                except AssertionError as e: bad.append(str(e)[:120])
            if time.monotonic() - last > 40: hung = True; break
        deadline = time.monotonic() + 20
        crc = None
        while time.monotonic() < deadline:
            wp, st_ = os.waitpid(pid, os.WNOHANG)
            if wp: crc = st_; break
            time.sleep(0.1)
        if crc is None:
            os.kill(pid, 9); os.waitpid(pid, 0); crc = "HUNG(killed)"
        try:
            sub.close()
        except Exception as e:
            errs.append('close: ' + repr(e)[:160])
        st = sub.stats()
        undel = set(st.get('undelivered') or {}) | set(st.get('in_flight') or {})
        rep = set(st["dropped"]) | set(st["incomplete"]) | set(st["rejected"])
        dups = sorted({r for r in got if got.count(r) > 1})
        missing = set(sizes) - set(got) - rep - undel
        prob = bool(bad or dups or missing or errs or crc not in (0,) or hung)
        print(json.dumps({"seed": seed, "exit": CHILD_EXIT, "kind": KIND, "problem": prob, "got": len(set(got)),
                          "reported": len(rep), "lost": st.get("lost"), "silent": sorted(missing)[:10],
                          "n_silent": len(missing), "undelivered": len(undel), "n_errs": len(errs), "errs": sorted(set(errs))[:3], "dups": dups[:5], "bad": bad[:3], "child_rc": crc,
                          "child": (tmp / "child.txt").read_text().strip() if (tmp / "child.txt").exists() else None,
                          "captured": p.poll_event("captured") is not None}), flush=True)
        return prob
    finally:
      if os.getpid() == parent:
        if sub is not None: sub.close()
        if name:
            try: Subscriber(ep, name=name).unsubscribe()
            except Exception as e: print("unsub", e)
        p.send(); p.stop()
        shutil.rmtree(epd, ignore_errors=True)

bad = 0
for s in range(RUNS):
    bad += one(4000 + s)
print(f"RESULT {bad}/{RUNS} runs with problems")
