"""c_corrupt.py CASE: write a corrupt pending file for durable name h19-c-CASE, then Subscriber(name).poll()
(no producer) and print failures()/stats; then acknowledge all and show the file."""
import os, sys, json, hashlib, traceback
os.environ.setdefault("HSCAPTURE_SUBS_DIR", "/tmp/hunt-h19/subs")
import hscapture
from hscapture import _subscriptions as S
case = sys.argv[1]; name = f"h19-c-{case}-{os.getpid()}"
good = lambda rid, ev, kind="dropped": (json.dumps({"kind": kind, "rid": rid, "reason": "ring full (drop)", "event": ev}) + "\n").encode()
cases = {
 "garbage": good("r1", "1:5") + b"not json\n{]\n[1,2]\n\"str\"\n" + good("r2", "1:6"),
 "types": good("r1", "1:5") + b'{"kind":1,"rid":"x","reason":"y","event":"1:7"}\n{"kind":"dropped","rid":["a"],"reason":"y","event":"1:8"}\n{"kind":"dropped","rid":"r3","reason":null,"event":"1:9"}\n',
 "huge": good("r1", "1:5") + b'{"kind":"dropped","rid":"' + b"A" * (50 << 20) + b'","reason":"x","event":"1:10"}\n',
 "nonutf8": good("r1", "1:5") + b'\xff\xfe\x80garbage\n' + good("r2", "1:6"),
 "nonutf8_rid": good("r1", "1:5") + b'{"kind":"dropped","rid":"\xc3\x28","reason":"x","event":"1:11"}\n',
 "events": good("r1", "x:y") + good("r2", "-1:5") + good("r3", "99999999999999999999:1") + good("r4", "1:-3") + good("r5", "") + good("r6", "1:2:3") + good("r7", "1:99999999999999999999999"),
 "superscript": good("r1", "\u00b2:1") + good("r2", "1:\u00b3"),
 "arabic": good("r1", "\u0661:\u0662"),
 "kinds": good("r1", "1:5", "bogus") + good("r2", "1:6", "ended") + good("r3", "1:7", "rejected") + good("r4", "1:8", "incomplete"),
 "dupev": good("r1", "1:5") + good("r2", "1:5") + good("r1", "1:5"),
 "torn": good("r1", "1:5") + b'{"kind":"dropped","rid":"r2"',
 "surrogate": good("r1", "1:5") + b'{"kind":"dropped","rid":"\\ud800","reason":"x","event":"1:12"}\n',
 "nul": good("r1", "1:5") + b'{"kind":"dropped","rid":"a\\u0000b","reason":"x","event":"1:13"}\n',
 "dir": None,
 "acked_nonutf8": good("r1", "1:5"),
}
path = S._pending_path(name)
if case == "dir":
    os.makedirs(path)
else:
    path.write_bytes(cases[case])
if case == "acked_nonutf8":
    S._acked_path(name).write_bytes(b'\xff\xfe\n')
ep = f"ipc:///tmp/hunt-h19/ep/c-{case}.sock"
try:
    sub = hscapture.Subscriber(ep, name=name)
    r = sub.poll(timeout=0.2)
    f = sub.failures()
    print("failures:", [(k, r[:30], e) for k, r, _, e in f])
    print("dropped:", {k[:30]: v for k, v in sub.dropped.items()}, "incomplete:", {k[:30]: v for k, v in sub.incomplete.items()})
    st = sub.stats(); print("counts:", {k: v for k, v in st.items() if "pending" in k})
    sub.acknowledge_failures(len(f))
    print("after ack exists:", path.exists(), (path.read_bytes()[:300] if path.is_file() else None))
    print("unsubscribe:", sub.unsubscribe()); print("after unsub exists:", path.exists())
except BaseException as e:
    print("EXC", type(e).__module__, type(e).__name__, str(e)[:300]); traceback.print_exc(limit=4)
