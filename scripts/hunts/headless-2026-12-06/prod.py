"""hunt-h10 producer with RETRIES: like fault_support.produce, but rids in spec['retries'] are
aborted after their first chunk (or after a random chunk) and then re-sent whole (same rid)
after `retry_after` further requests; rids in spec['cp'] are captured with cached_prefix>0
(a radix-cache hit: positions from cached_prefix on). Prints JSON events; at the end
'captured' lists per rid every attempt: [ok_all_chunks, aborted].
Also spec['hard_kill_after']: SIGKILL itself after that many finished requests."""
import json, os, random, signal, sys, time
from pathlib import Path
sys.path.insert(0, str(Path("/work/main") / "tests")); sys.path.insert(0, str(Path("/work/main")))
from fault_support import source


def emit(ev, **kw):
    print(json.dumps({"event": ev, **kw}), flush=True)


def main(spec):
    from hscapture import Producer
    layers = [0, 1]
    p = Producer(spec["endpoint"], producer_id=spec["producer_id"], capacity=spec["capacity"],
                 full_policy="drop", wait_timeout_s=0.0, heartbeat_interval_s=0.05,
                 max_consumers=8)
    emit("ready", epoch=p.epoch, pid=os.getpid())
    if spec.get("consumers"):
        p.wait_for_consumers(spec["consumers"], timeout_s=60)
    if spec.get("start_on_stdin"):
        sys.stdin.readline()
    rng = random.Random(spec.get("seed", 0))
    retries = dict((r, n) for r, n in spec.get("retries", {}).items())   # rid -> times to abort
    todo = [list(r) for r in spec["requests"]]
    interleave = spec.get("interleave", 4)
    rate = spec.get("rate", 0)
    active = []
    attempts = {}
    done = 0
    started = time.monotonic()
    later = []   # (due_done_count, req)
    while todo or active or later:
        for item in list(later):
            if item[0] <= done or (not todo and not active):
                later.remove(item); todo.insert(0, item[1])
        while todo and len(active) < interleave:
            item = todo.pop(0); rid, tokens, chunk = item[:3]
            t, ids = source(rid, tokens)
            cp = spec.get("cp", {}).get(rid, 0)
            active.append({"rid": rid, "tokens": tokens, "chunk": chunk, "t": t, "ids": ids,
                           "starts": list(range(cp, tokens, chunk)), "cp": cp, "ok": True, "retry": len(item) > 3})
        if not active:
            continue
        r = active[rng.randrange(len(active))]
        s = r["starts"].pop(0)
        e = min(r["tokens"], s + r["chunk"])
        ok = p.capture(r["rid"], [x[s:e] for x in r["t"]], layers=layers, token_start=s,
                       is_last_chunk=e == r["tokens"], token_ids=r["ids"][s:e],
                       cached_prefix=r["cp"])
        r["ok"] &= bool(ok)
        finished = not r["starts"]
        aborted = False
        r["n"] = r.get("n", 0) + 1
        mid = spec.get("mid_aborts", {}).get(r["rid"])
        if not finished and mid is not None and r["n"] >= mid and not r.get("retry"):
            p.abort(r["rid"], "mid abort " + "x" * spec.get("reason_len", 0))
            aborted = finished = True
        elif not finished and retries.get(r["rid"], 0) > 0 and rng.random() < 0.6:
            p.abort(r["rid"], "client abort; will retry")
            retries[r["rid"]] -= 1
            aborted = finished = True
            later.append((done + spec.get("retry_after", 3), [r["rid"], r["tokens"], r["chunk"], 1]))
        if finished:
            active.remove(r)
            attempts.setdefault(r["rid"], []).append([r["ok"], aborted])
            done += 1
            if done == spec.get("hard_kill_after"):
                emit("killing", attempts=attempts)
                os.kill(os.getpid(), signal.SIGKILL)
            if rate:
                ahead = started + done / rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
    p.flush()
    emit("captured", attempts=attempts, stats={k: v for k, v in p.stats().items() if isinstance(v, int)})
    if spec.get("close_on_stdin"):
        sys.stdin.readline()
    p.close()
    emit("done")


if __name__ == "__main__":
    a = sys.argv[1]
    main(json.loads(open(a[1:]).read() if a.startswith("@") else a))
