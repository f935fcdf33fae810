"""c_huge.py: pending file with a valid line whose rid is 50 MB (+ a normal line): reported? (debug of c_corrupt huge)"""
import os, json
os.environ["HSCAPTURE_SUBS_DIR"] = "/tmp/hunt-h19/subs"
import hscapture
from hscapture import _subscriptions as S
name = f"h19-huge-{os.getpid()}"
S._pending_path(name).write_bytes(b'{"kind":"dropped","rid":"r1","reason":"x","event":"1:5"}\n{"kind":"dropped","rid":"' + b"A" * (50 << 20) + b'","reason":"x","event":"1:10"}\n')
print("pending() parses:", [(k, r[:5], len(r), e) for k, r, _, e in S.pending(name)])
sub = hscapture.Subscriber("ipc:///tmp/hunt-h19/ep/huge.sock", name=name); sub.poll(timeout=0.1)
print("failures:", [(k, r[:5], len(r), e) for k, r, _, e in sub.failures()], "counts:", {k: v for k, v in sub.stats().items() if "pending" in k or "known" in k})
