import os, sys, time, shutil, io, statistics, threading
sys.path.insert(0, "benchmarks")
import torch
from concurrent.futures import ThreadPoolExecutor
from bench_export import build
from hscapture import export as E
from hscapture.reader import open_shards
from safetensors import safe_open
root = "/dev/shm/esp/fx"
src = os.path.join(root, "shards")
if not os.path.exists(src): build(src, 100, 512, 2048)
out = os.path.join(root, "v")
NW = int(os.environ.get("NW", 4))
def fresh():
    return open_shards(src)
sfn = ["layer_1", "layer_3", "layer_5", "final_norm"]
spn = ["layer_1", "layer_3", "layer_5", "layer_7"]
def run(per_sample):
    shutil.rmtree(out, ignore_errors=True); os.makedirs(out)
    ss = fresh()   # fresh mmaps: every variant pays its source faults
    n = len(ss)
    ct = [0.0]
    lock = threading.Lock()
    def one(i):
        c0 = time.thread_time()
        per_sample(ss, i, os.path.join(out, str(i)))
        with lock: ct[0] += time.thread_time() - c0
    t = time.perf_counter()
    with ThreadPoolExecutor(NW) as p: list(p.map(one, range(n)))
    return time.perf_counter() - t, ct[0]
def raw(names):
    def f(ss, i, path):
        s = ss.load(i, names=names)
        views = [E._bytes_of(s.tensors[k]) for k in names] + [E._bytes_of(s.token_ids)]
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.writev(fd, views); os.close(fd)
    return f
ssp = fresh()
plan_sf = E._make_plan(ssp, "specforge", None, "require", None)
plan_sp = E._make_plan(ssp, "speculators", None, "require", None)
def sf_old(ss, i, path):
    s = ss.load(i, names=sfn)
    T, H = s.num_tokens, 2048
    aux = torch.empty(1, T, 3 * H, dtype=torch.bfloat16)
    for k, nm in enumerate(sfn[:3]): aux[0, :, k*H:(k+1)*H].copy_(s.tensors[nm])
    d = {"input_ids": s.token_ids.to(torch.int64), "loss_mask": E._mask(s)[0], "hidden_state": E._own(s.tensors["final_norm"]).unsqueeze(0), "aux_hidden_state": aux}
    E._write_atomic(path, lambda f: torch.save(d, f), False)
def sf_new(ss, i, path):
    s = ss.load(i, names=sfn)
    d = E._build_specforge(s, plan_sf)
    E._write_atomic(path, lambda f: E._save_specforge(d, f, False), False)
def sf_newcopy(ss, i, path):   # new zip writer, aux assembled (one copy)
    s = ss.load(i, names=sfn)
    d = E._build_specforge(s, plan_sf)
    d["aux_hidden_state"] = d["aux_hidden_state"].materialize()
    E._write_atomic(path, lambda f: E._save_specforge(d, f, False), False)
def sp_old(ss, i, path):
    s = ss.load(i, names=spn)
    T, H = s.num_tokens, 2048
    hs = torch.empty(T, 4, H, dtype=torch.bfloat16)
    for k, nm in enumerate(spn): hs[:, k].copy_(s.tensors[nm])
    items = [("hidden_states", hs), ("token_ids", s.token_ids.to(torch.int64))]
    E._write_atomic(path, lambda f: E._write_safetensors(f, items), False)
def sp_new(ss, i, path):
    s = ss.load(i, names=spn)
    items = E._build_speculators(s, plan_sp)
    E._write_atomic(path, lambda f: E._write_safetensors(f, items), False)
V = {"raw_sf": raw(sfn), "sf_old": sf_old, "sf_new": sf_new, "sf_newcopy": sf_newcopy,
     "raw_sp": raw(spn), "sp_old": sp_old, "sp_new": sp_new}
sel = sys.argv[1].split(",") if len(sys.argv) > 1 else list(V)
res = {k: [] for k in sel}
for k in sel: run(V[k])   # warm
for rep in range(int(os.environ.get("REPS", 7))):
    for k in (sel if rep % 2 == 0 else sel[::-1]):
        res[k].append(run(V[k]))
for k, v in (res.items() if all(res.values()) else []):
    w = [a for a, _ in v]; c = [b for _, b in v]
    print(f"{k:12s} wall med {statistics.median(w)*1e3:7.1f} ms min {min(w)*1e3:7.1f}  thread-cpu med {statistics.median(c)*1e3:7.1f} ms")
