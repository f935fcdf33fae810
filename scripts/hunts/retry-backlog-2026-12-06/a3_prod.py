import json, sys
sys.path.insert(0, "/work/main/tests"); sys.path.insert(0, "/work/main")
from fault_support import source
from hscapture import Producer
spec = json.loads(sys.argv[1])
p = Producer(spec["endpoint"], producer_id=spec["pid"], capacity=1 << 20, full_policy="drop", heartbeat_interval_s=0.05, max_consumers=8)
print(json.dumps({"event": "ready", "segment": p.ring.name if hasattr(p, "ring") else None}), flush=True)
sys.stdin.readline()
for i in range(10):
    t, ids = source(f"c-{i}", 8)
    p.capture(f"c-{i}", t, layers=[0, 1], token_start=0, is_last_chunk=True, token_ids=ids)
p.flush(); print(json.dumps({"event": "captured"}), flush=True)
sys.stdin.readline(); p.close(); print(json.dumps({"event": "done"}), flush=True)
