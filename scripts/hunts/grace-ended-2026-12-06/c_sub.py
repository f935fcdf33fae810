"""c_sub.py EP NAME ACK GRACE SLOW: a durable Subscriber that reads and releases every sample; ACK=1
acknowledges failures at once, 0 never; GRACE overrides FAILURE_GRACE_S ('' keeps 2.0); SLOW: seconds
of sleep per sample. Prints one JSON line per 0.25 s: samples, failures, holds, held fraction, rss."""
import os, sys, json, time, resource
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h15/subs"
sys.path.insert(0, "/work/main")
import hscapture, hscapture._delivery as D
ep, name, ack, grace, slow = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4], float(sys.argv[5])
if grace != "": D.FAILURE_GRACE_S = float(grace)
sub = hscapture.Subscriber(ep, name=name, zero_copy=True)
t0 = time.monotonic(); last = t0; n = 0; maxholds = 0
while True:
    s = sub.poll(timeout=0.05)
    if s is not None:
        n += 1; s.release()
        if slow: time.sleep(slow)
    if ack:
        f = len(sub.failures())
        if f: sub.acknowledge_failures(f)
    holds = len(sub._delivery._failure_holds); maxholds = max(maxholds, holds)
    now = time.monotonic()
    if now - last >= 0.25:
        last = now
        st = sub.stats()
        print(json.dumps({"t": round(now - t0, 3), "n": n, "fail": len(sub.failures()), "holds": holds, "maxholds": maxholds,
                          "held": round(sub.held_fraction(), 3), "late": sub._delivery._unacked_since, "oldest": round(now - sub._delivery._failure_holds[0].since, 2) if sub._delivery._failure_holds else None, "unpinned": st.get("failures_unpinned", 0),
                          "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}), flush=True)
