"""Per-call CPU cost of the Python/torch operations on the hook's path (ns per call)."""
import time, sys, collections
import torch
def t(label, fn, n=20000):
    for _ in range(200): fn()
    best = None
    for rep in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(n): fn()
        d = (time.perf_counter_ns() - t0) / n
        best = d if best is None or d < best else best
    print(f"{label:40s} {best:8.0f} ns", flush=True)
devs = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
d = {"a": 1, "b": 2}
t("python: dict get", lambda: d.get("a"))
t("python: dict build 7 keys", lambda: {"rid": 1, "a": 2, "b": 3, "c": 4, "d": 5, "e": 6, "f": 7})
t("python: perf_counter_ns", time.perf_counter_ns)
t("python: monotonic", time.monotonic)
c = collections.Counter()
def inc(): c["x"] += 1
t("python: Counter +=1", inc)
for dev in devs:
    a = torch.empty(300, 3 * 2048, dtype=torch.bfloat16, device=dev)
    t(f"{dev}: .shape", lambda: a.shape)
    t(f"{dev}: .shape[0]", lambda: a.shape[0])
    t(f"{dev}: .dtype", lambda: a.dtype)
    t(f"{dev}: .device", lambda: a.device)
    t(f"{dev}: .get_device()", lambda: a.get_device())
    t(f"{dev}: .is_cuda", lambda: a.is_cuda)
    t(f"{dev}: .data_ptr()", lambda: a.data_ptr())
    t(f"{dev}: .stride()", lambda: a.stride())
    t(f"{dev}: .stride(0)", lambda: a.stride(0))
    t(f"{dev}: .element_size()", lambda: a.element_size())
    t(f"{dev}: .dtype.itemsize", lambda: a.dtype.itemsize)
    t(f"{dev}: a[:100]", lambda: a[:100])
    t(f"{dev}: dtype !=", lambda: a.dtype != a.dtype)
    t(f"{dev}: device !=", lambda: a.device != a.device)
    t(f"{dev}: torch.empty 1MB u8", lambda: torch.empty(1 << 20, dtype=torch.uint8, device=dev), n=5000)
if torch.cuda.is_available():
    rs = torch._C._cuda_getCurrentRawStream
    t("cuda: _cuda_getCurrentRawStream(0)", lambda: rs(0))
    s = torch.cuda.Stream()
    a = torch.empty(300, 3 * 2048, dtype=torch.bfloat16, device="cuda")
    b = torch.empty(300, 3 * 2048, dtype=torch.bfloat16, device="cuda")
    t("cuda: b.copy_(a) d2d 3.6MB", lambda: b.copy_(a), n=2000)
    try:
        from hscapture import _ring
        from array import array
        ev = _ring.CudaEvent(a.data_ptr())
        cur = rs(0)
        w = 3 * 2048 * 2
        pre1 = array("Q", (b.data_ptr(), w, a.data_ptr(), w, w, 300))
        pre2 = array("Q", list(pre1) * 2)
        t("cuda: cuda_submit 0 copies (same stream)", lambda: _ring.cuda_submit(cur, cur, ev.handle, ev.handle, ev.context, array("Q"), None), n=5000)
        t("cuda: cuda_submit 1 d2d (same stream)", lambda: _ring.cuda_submit(cur, cur, ev.handle, ev.handle, ev.context, pre1, None), n=2000)
        t("cuda: cuda_submit 2 d2d (same stream)", lambda: _ring.cuda_submit(cur, cur, ev.handle, ev.handle, ev.context, pre2, None), n=2000)
        torch.cuda.synchronize()
    except Exception as e:
        print("native:", type(e).__name__, e)
