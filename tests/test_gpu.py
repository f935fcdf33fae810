"""The capture path on a real GPU (issue #5). Every test is marked ``gpu`` and skipped without
CUDA. Whole file: well under 2 minutes on one H200.

    pytest tests/test_gpu.py -v            # or: pytest -m gpu
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid

import numpy as np
import pytest
import torch

from hscapture import Producer, Subscriber
from hscapture.sample import layer_name

pytestmark = [pytest.mark.gpu,   # registered in pyproject.toml
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """A bit-level view (NaN-safe equality): contiguous CPU copy as same-width integers."""
    t = t.detach().to("cpu", copy=True).contiguous()
    return t.view(_INT_VIEW[t.element_size()])


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {got.shape} != {want.shape}"
    a, b = bits(got), bits(want)
    if not torch.equal(a, b):
        bad = (a != b).nonzero()
        raise AssertionError(f"{what}: {bad.shape[0]} elements differ, first at "
                             f"{bad[0].tolist()}")


@pytest.fixture(params=["native", "torch"])
def copy_path(request, monkeypatch):
    """Every capture test runs through both CUDA copy paths: the native one (one driver call
    per capture, hscapture._cuda_copy) and the torch one (HSCAPTURE_COPY_PATH=torch)."""
    if request.param == "torch":
        monkeypatch.setenv("HSCAPTURE_COPY_PATH", "torch")
    else:
        monkeypatch.delenv("HSCAPTURE_COPY_PATH", raising=False)
    return request.param


@pytest.fixture
def pair(endpoint, copy_path):
    """A Producer (pinned ring) and an attached Subscriber, in this process; at the end, the
    copy path the test asked for is the one that ran (when it ran any CUDA copy)."""
    p = Producer(endpoint, producer_id=f"gpu-{uuid.uuid4().hex[:8]}", capacity=512 << 20,
                 full_policy="wait", wait_timeout_s=30.0)
    assert (p._copier.native is not None) == (copy_path == "native"), \
        f"copy path {copy_path!r} requested, native copier {p._copier.native!r}"
    sub = Subscriber(endpoint)
    try:
        sub.wait_ready(timeout=20)
        yield p, sub
        st = p.stats()
        if copy_path == "torch":
            assert not st.get("native_copies"), st
    finally:
        sub.close()
        p.close()


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 50_000, (n,), generator=torch.Generator().manual_seed(seed),
                         dtype=torch.int32)


# (i) ------------------------------------------------------------------------------------------

def test_ring_is_pinned(pair):
    p, _ = pair
    assert p.stats()["pinned"], "cudaHostRegister of the ring failed: copies would be unpinned"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_cuda_capture_bytes_identical(pair, dtype):
    """Odd sizes, non-contiguous sources, snapshot=True with the source overwritten at once."""
    p, sub = pair
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(7)
    cases = {}
    shapes = [(1, 1), (1, 4096), (3, 7), (17, 1023), (333, 4097), (1000, 96)]
    for i, (t, h) in enumerate(shapes):
        # contiguous
        cases[f"c{i}"] = ([torch.randn(t, h, generator=g, device=dev).to(dtype)
                           for _ in range(3)], False)
        # non-contiguous: transposed and column-strided views
        base = torch.randn(h, t, generator=g, device=dev).to(dtype)
        wide = torch.randn(t, 2 * h + 1, generator=g, device=dev).to(dtype)
        cases[f"n{i}"] = ([base.t(), wide[:, 1::2], wide[:, :h]], False)
        if t > 1 and h > 1:
            assert not base.t().is_contiguous() and not wide[:, 1::2].is_contiguous()
        # snapshot: the caller overwrites the sources right after capture() returns
        cases[f"s{i}"] = ([torch.randn(t, h, generator=g, device=dev).to(dtype)
                           for _ in range(3)], True)
    expected = {}
    for rid, (tensors, snap) in cases.items():
        expected[rid] = [bits(x) for x in tensors]        # (synchronizes: sources are final)
    for rid, (tensors, snap) in cases.items():
        n = tensors[0].shape[0]
        assert p.capture(rid, tensors, layers=[0, 5, 9], token_ids=_ids(n), snapshot=snap)
        if snap:
            for x in tensors:
                x.fill_(float("nan"))               # stream-ordered after the snapshot
    p.flush()
    for rid, (tensors, _) in cases.items():
        s = sub.get(rid, timeout=30)
        for L, want in zip([0, 5, 9], expected[rid]):
            got = s.tensors[layer_name(L, "residual")]
            assert got.dtype == dtype
            assert torch.equal(bits(got), want), f"{rid} layer {L} differs"
        assert torch.equal(s.token_ids.to(torch.int32), _ids(tensors[0].shape[0]))
        s.release()
    assert p.stats().get("dropped", 0) == 0


@pytest.mark.parametrize("snapshot", [False, True])
def test_a_batch_entry_gathers_scattered_rows_and_device_token_ids_exactly(pair, snapshot):
    """capture_batch as the SGLang hook calls it: packed aux [T, K*H] + last [T, H] on the
    GPU, wanted rows scattered through the batch (gather on the GPU), token ids on the GPU;
    with snapshot the sources are overwritten right after the call (graph buffers)."""
    from hscapture.producer import Row

    p, sub = pair
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(11)
    k, h, lens = 3, 256, [5, 300, 1, 77, 1024, 2, 64]
    T = sum(lens)
    aux = torch.randn(T, k * h, generator=g, device=dev).to(torch.bfloat16)
    last = torch.randn(T, h, generator=g, device=dev).to(torch.bfloat16)
    ids = torch.randint(0, 50_000, (T,), generator=g, device=dev)
    offs = [sum(lens[:i]) for i in range(len(lens))]
    wanted = [0, 1, 3, 4, 6]                     # rows 2 and 5 did not opt in
    rows = [Row(f"b{snapshot}-{i}", offs[i], lens[i]) for i in wanted]
    want = {r.rid: ([bits(aux[r.src_start:r.src_start + r.token_count, j * h:(j + 1) * h])
                     for j in range(k)] + [bits(last[r.src_start:r.src_start + r.token_count])],
                    ids[r.src_start:r.src_start + r.token_count].cpu()) for r in rows}
    assert p.capture_batch(rows, [aux, last], layers=[1, 2, 3, 15],
                           layer_kinds=["residual"] * 3 + ["final_norm"],
                           layer_map=[[0, 0], [0, h], [0, 2 * h], [1, 0]], hidden=h,
                           token_ids=ids, snapshot=snapshot)
    if snapshot:
        aux.fill_(float("nan"))
        last.fill_(float("nan"))
        ids.fill_(-1)
    p.flush()
    for rid, (layers, tok) in want.items():
        s = sub.get(rid, timeout=30)
        names = ["layer_1", "layer_2", "layer_3", "final_norm"]
        for name, w in zip(names, layers):
            assert torch.equal(bits(s.tensors[name]), w), f"{rid} {name} differs"
        assert torch.equal(s.token_ids.to(torch.int64), tok)
    assert p.stats().get("dropped", 0) == 0


# (ii) -----------------------------------------------------------------------------------------

def test_llama_forward_capture_bit_identical_to_output_hidden_states(pair):
    from transformers import LlamaConfig, LlamaForCausalLM

    from hscapture.adapters.transformers import HiddenStateCapture

    p, sub = pair
    cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                      num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                      max_position_embeddings=4096)
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(prev)
    model = model.to("cuda", torch.bfloat16).eval()
    aux = [1, 3, 6]
    cap = HiddenStateCapture(model, p, aux)
    g = torch.Generator().manual_seed(3)
    lens = [517, 1, 64, 300]
    width = max(lens)
    ids = torch.randint(0, 32000, (len(lens) + 1, width), generator=g)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lens):
        mask[i, :n] = 1
    mask[-1, :9] = 1                                   # an unrequested row (rid None)
    rids = [f"llama-{i}" for i in range(len(lens))] + [None]
    ids_d, mask_d = ids.cuda(), mask.cuda()
    with torch.no_grad():
        model(ids_d[:1, :16])                          # warm-up outside request(): no sample
        with cap.request(rids, ids_d, mask_d, chunk_size=128):
            out = model(ids_d, attention_mask=mask_d, output_hidden_states=True)
        hs = out.hidden_states
        refs = {}
        for i, rid in enumerate(rids[:-1]):
            idx = mask[i].nonzero().flatten().cuda()
            r = {layer_name(L, "residual"): bits(hs[L + 1][i, idx]) for L in aux}
            r["final_norm"] = bits(hs[len(model.model.layers)][i, idx])
            refs[rid] = (r, ids[i, : lens[i]].to(torch.int32))
    cap.close()
    p.flush()
    for rid, (ref, tok) in refs.items():
        s = sub.get(rid, timeout=60)
        assert s.num_tokens == lens[int(rid.split("-")[1])]
        assert set(s.tensors) == set(ref)
        for name, want in ref.items():
            assert torch.equal(bits(s.tensors[name]), want), f"{rid} {name} differs"
        assert torch.equal(s.token_ids.to(torch.int32), tok)
        s.release()
    sub.pump(0.3)
    assert sub.poll(0.2) is None, "an unrequested row or the warm-up pass produced a sample"
    st = sub.stats()
    assert not st["dropped"] and not st["incomplete"] and not st["rejected"]


# (iii) ----------------------------------------------------------------------------------------

def _stream_source(rid_num: int, tokens: int, hidden: int, layers: int) -> list[torch.Tensor]:
    """Deterministic CUDA tensors of one request, computed on the current stream."""
    g = torch.Generator(device="cuda").manual_seed(1000 + rid_num)
    x = torch.randn(tokens, hidden, generator=g, device="cuda")
    outs = []
    for k in range(layers):
        # real (deterministic, elementwise/gather) kernels on this stream, not just a fill
        x = torch.sin(x * (k + 1.5)) + x.roll(1, 0)
        outs.append(x.to(torch.bfloat16))
    return outs


def test_two_streams_two_threads_interleaved_exact(pair):
    p, sub = pair
    hidden, layers, per_thread = 1024, 4, 40
    rng = np.random.default_rng(5)
    plan = {t: [(t * 1000 + i, int(rng.integers(1, 300))) for i in range(per_thread)]
            for t in range(2)}
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def worker(t: int) -> None:
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                barrier.wait()
                for num, tokens in plan[t]:
                    src = _stream_source(num, tokens, hidden, layers)
                    ok = p.capture(f"s{num}", src, layers=[0, 1, 2, 3],
                                   token_ids=_ids(tokens, num))
                    assert ok, f"s{num} dropped"
                    del src                  # freed at once: the producer must keep it alive
                    # churn the allocator on this stream so freed blocks get reused
                    junk = torch.empty(tokens * hidden * 3, device="cuda").fill_(float("nan"))
                    del junk
            stream.synchronize()
        except BaseException as exc:  # surfaced in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(2)]
    for th in threads:
        th.start()
    got = {}
    deadline = time.monotonic() + 90
    total = 2 * per_thread
    while len(got) < total and time.monotonic() < deadline:
        s = sub.poll(timeout=0.1)
        if s is not None:
            got[s.rid] = ({k: bits(v) for k, v in s.tensors.items()}, s.token_ids.clone())
            s.release()
        if errors:
            break
    for th in threads:
        th.join(timeout=60)
    assert not errors, errors
    assert len(got) == total, f"received {len(got)}/{total}: {sub.stats()}"
    for t in range(2):
        for num, tokens in plan[t]:
            want = _stream_source(num, tokens, hidden, layers)
            tensors, tok = got[f"s{num}"]
            for L in range(layers):
                assert torch.equal(tensors[f"layer_{L}"], bits(want[L])), f"s{num} layer {L}"
            assert torch.equal(tok.to(torch.int32), _ids(tokens, num))


# (iv) -----------------------------------------------------------------------------------------

def _cycles_per_second() -> float:
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 50_000_000
    a.record()
    torch.cuda._sleep(cycles)
    b.record()
    b.synchronize()
    return cycles / (a.elapsed_time(b) / 1e3)


def test_notice_never_before_copy_finished(pair):
    """The caller's stream sleeps ~0.5 s right before capture(); the source's final values are
    written after the sleep. capture() must return at once, the notice must arrive only after
    the sleep ended, and the bytes must be the final values."""
    p, sub = pair
    sleep_s = 0.5
    cycles = int(_cycles_per_second() * sleep_s)
    tokens, hidden = 8192, 4096                       # 64 MiB bf16 per layer, 4 layers
    g = torch.Generator(device="cuda").manual_seed(11)
    final = [torch.randn(tokens, hidden, generator=g, device="cuda").to(torch.bfloat16)
             for _ in range(4)]
    want = [bits(x) for x in final]
    bufs = [torch.zeros(tokens, hidden, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    ids = _ids(tokens, 11)                            # CPU ids: no device sync in capture()
    sleep_done = torch.cuda.Event()
    torch.cuda.synchronize()

    stream = torch.cuda.current_stream()
    t0 = time.time_ns()
    torch.cuda._sleep(cycles)
    sleep_done.record(stream)
    for b, f in zip(bufs, final):
        b.copy_(f)                                    # final values land after the sleep
    c0 = time.perf_counter()
    assert p.capture("slow", bufs, layers=[0, 1, 2, 3], token_ids=ids)
    c1 = time.perf_counter()
    still_sleeping = not sleep_done.query()

    ended = {}

    def watch() -> None:
        sleep_done.synchronize()
        ended["t"] = time.time_ns()
    w = threading.Thread(target=watch)
    w.start()
    s = sub.get("slow", timeout=30)
    t_recv = time.time_ns()
    w.join()
    assert c1 - c0 < 0.1 * sleep_s, f"capture() blocked for {c1 - c0:.3f}s"
    assert still_sleeping, "the GPU finished the sleep before capture() returned: test is void"
    # (the GPU clock makes the calibrated sleep shorter or longer; what matters is that it was
    # long enough to matter and that the notice came after it ended)
    assert ended["t"] - t0 >= 0.1e9, "the sleep was too short for the test to mean anything"
    assert t_recv >= ended["t"] - 2_000_000, "notice arrived before the sleep ended"
    for L in range(4):
        assert torch.equal(bits(s.tensors[f"layer_{L}"]), want[L]), f"layer {L} differs"
    s.release()


# (v) the unpinned fallback -------------------------------------------------------------------

def test_a_failed_host_registration_is_reported_once_and_falls_back(recwarn):
    """cudaHostRegister is checked: an address CUDA cannot pin gives a warning and None."""
    from hscapture.pinning import register_host_memory

    assert register_host_memory(4096, 4096) is None
    msgs = [str(w.message) for w in recwarn.list if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 1 and "falling back to unpinned copies" in msgs[0]
    # the failure must not surface later as the error of an unrelated kernel launch
    x = torch.ones(1024, device="cuda") * 2
    torch.cuda.synchronize()
    assert float(x.sum()) == 2048.0


def test_unpinned_copies_are_exact_too(endpoint):
    p = Producer(endpoint, producer_id=f"gpu-unpinned-{uuid.uuid4().hex[:6]}",
                 capacity=64 << 20, pin=False)
    sub = Subscriber(endpoint)
    try:
        sub.wait_ready(timeout=20)
        assert p.stats()["pinned"] is False
        g = torch.Generator(device="cuda").manual_seed(3)
        src = [torch.randn(777, 1024, generator=g, device="cuda").to(torch.bfloat16)
               for _ in range(3)]
        assert p.capture("unpinned", src, layers=[1, 2, 3], token_ids=_ids(777))
        s = sub.get("unpinned", timeout=20)
        for L, t in zip([1, 2, 3], src):
            assert_bits_equal(s.tensors[f"layer_{L}"], t, f"layer {L}")
    finally:
        sub.close()
        p.close()


def _capture_packed(p: Producer, maps: list, starts: list, aux: torch.Tensor,
                    last: torch.Tensor, h: int, ids, snapshot: bool, defer: bool = False
                    ) -> bool:
    """``capture_rows`` as the SGLang hook calls it: 3 aux layers packed ``[T, 3h]`` (ids 1, 2,
    3) and the final norm ``[T, h]`` (id 15)."""
    return p.capture_rows(maps, starts, [aux, last], layers=[1, 2, 3, 15],
                          layer_kinds=["residual"] * 3 + ["final_norm"],
                          layer_map=[[0, 0], [0, h], [0, 2 * h], [1, 0]], hidden=h,
                          token_ids=ids, snapshot=snapshot, defer=defer)


def _assert_packed_samples(sub: Subscriber, want: dict) -> None:
    """Every rid of ``want`` (rid -> ([layer_1, layer_2, layer_3, final_norm] bits, int64
    ids)) arrives with exactly those bits and ids."""
    for rid, (layers, tok) in want.items():
        s = sub.get(rid, timeout=30)
        for name, w in zip(["layer_1", "layer_2", "layer_3", "final_norm"], layers):
            assert torch.equal(bits(s.tensors[name]), w), f"{rid} {name} differs"
        assert torch.equal(s.token_ids.to(torch.int64), tok), rid
        s.release()


@pytest.mark.parametrize("pattern", ["one_span", "two_spans", "many_spans", "scattered"])
def test_capture_rows_every_gather_branch_is_exact_over_many_forwards(pair, pattern):
    """capture_rows as the SGLang hook calls it, through each CUDA gather branch: one
    contiguous span (views, ids in one int32 kernel), two spans (slices + cat), many spans
    (one index_select per tensor, index from pinned memory; native: ids from their covering
    slice), more spans than ``_cuda_copy._ID_SPANS`` (native: ids gathered by a device
    index), with and without snapshot; 40 forwards in a row reuse the ready event and the
    pooled done events. The int64 ids are overwritten right after every call (they are
    always taken on the caller's stream), the sources too when snapshotting."""
    p, sub = pair
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(3)
    k, h = 3, 128
    lens = [7, 1, 64, 3, 200, 5, 33, 2, 90, 11] * 3
    offs = [sum(lens[:i]) for i in range(len(lens))]
    wanted = {"one_span": range(30), "two_spans": [0, 1, 2, 5, 6, 7],
              "many_spans": [0, 2, 4, 6, 8, 9], "scattered": range(0, 30, 2)}[pattern]
    want = {}
    for f in range(40):
        snapshot = bool(f % 2)
        T = sum(lens)
        aux = torch.randn(T, k * h, generator=g, device=dev).to(torch.bfloat16)
        last = torch.randn(T, h, generator=g, device=dev).to(torch.bfloat16)
        ids = torch.randint(0, 50_000, (T,), generator=g, device=dev)     # int64, as SGLang
        maps = [{"rid": f"{pattern}-{f}-{i}", "token_start": 0, "token_count": lens[i],
                 "last": True, "cached_prefix": 0, "extra": {"attempt": 0}, "fields": {}}
                for i in wanted]
        for m, i in zip(maps, wanted):
            s, n = offs[i], lens[i]
            want[m["rid"]] = ([bits(aux[s:s + n, j * h:(j + 1) * h]) for j in range(k)]
                              + [bits(last[s:s + n])], ids[s:s + n].cpu())
        assert _capture_packed(p, maps, [offs[i] for i in wanted], aux, last, h, ids,
                               snapshot)
        ids.fill_(-1)
        if snapshot:
            aux.fill_(float("nan"))
            last.fill_(float("nan"))
    p.flush()
    _assert_packed_samples(sub, want)
    assert p.stats().get("dropped", 0) == 0


def test_host_row_ids_with_cuda_blocks_are_exact_on_both_copy_paths(pair, copy_path):
    """The SGLang hook's default: CUDA blocks, token ids given per row from host arrays
    (``HostRowIds`` over SGLang's ``array('q')``), written by the CPU before any copy is
    issued. Scattered rows, with and without snapshot, 20 forwards; the arrays are overwritten
    right after every call (they are read during it only), the sources too when snapshotting."""
    from array import array

    from hscapture._copies import HostRowIds

    p, sub = pair
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(11)
    rng = np.random.default_rng(11)
    k, h = 3, 128
    lens = [9, 1, 130, 4, 47, 2, 300, 8]
    offs = [sum(lens[:i]) for i in range(len(lens))]
    wanted = [0, 2, 3, 5, 6]
    want = {}
    for f in range(20):
        snapshot = bool(f % 2)
        T = sum(lens)
        aux = torch.randn(T, k * h, generator=g, device=dev).to(torch.bfloat16)
        last = torch.randn(T, h, generator=g, device=dev).to(torch.bfloat16)
        # each request's host ids; this forward's row holds [prefix, prefix + len) of them
        prompts = {i: array("q", rng.integers(0, 150_000, 400 + lens[i]).tolist())
                   for i in wanted}
        prefix = {i: int(rng.integers(0, 400)) for i in wanted}
        maps = [{"rid": f"host-{f}-{i}", "token_start": 0, "token_count": lens[i],
                 "last": True, "cached_prefix": 0, "extra": {"attempt": 0}, "fields": {}}
                for i in wanted]
        for m, i in zip(maps, wanted):
            s, n = offs[i], lens[i]
            want[m["rid"]] = ([bits(aux[s:s + n, j * h:(j + 1) * h]) for j in range(k)]
                              + [bits(last[s:s + n])],
                              torch.tensor(prompts[i][prefix[i]:prefix[i] + n]))
        ids = HostRowIds([(prompts[i], prefix[i], lens[i]) for i in wanted])
        assert _capture_packed(p, maps, [offs[i] for i in wanted], aux, last, h, ids,
                               snapshot)
        for a in prompts.values():
            a[:] = array("q", [-1]) * len(a)
        if snapshot:
            aux.fill_(float("nan"))
            last.fill_(float("nan"))
    p.flush()
    _assert_packed_samples(sub, want)
    st = p.stats()
    assert st.get("host_id_captures") == 20 and st.get("dropped", 0) == 0, st
    assert st.get("native_copies", 0) == (20 if copy_path == "native" else 0), st


def test_the_native_path_takes_the_hooks_captures_and_ineligible_ones_fall_back(pair, copy_path):
    """Dense-row sources (also a column slice of a wider tensor: a row pitch) and int64 or
    int32 device ids go through the native path; column-strided sources go through torch;
    both exact, including with snapshot and host ids."""
    p, sub = pair
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(5)
    wide = torch.randn(300, 1000, generator=g, device=dev).to(torch.bfloat16)
    cases = {
        "dense-i64": ([torch.randn(300, 384, generator=g, device=dev).to(torch.bfloat16)],
                      torch.randint(0, 50_000, (300,), generator=g, device=dev), False),
        "pitch-i32": ([wide[:, :384]], torch.randint(0, 50_000, (300,), generator=g,
                                                     device=dev, dtype=torch.int32), True),
        "host-ids": ([torch.randn(300, 384, generator=g, device=dev).to(torch.bfloat16)],
                     _ids(300), True),
        "col-strided": ([wide[:, ::2]], _ids(300), False),
    }
    for rid, (blocks, ids, snap) in cases.items():
        want = [bits(b) for b in blocks], ids.to("cpu", torch.int64)
        before = dict(p.stats())
        maps = [{"rid": rid, "token_start": 0, "token_count": 300, "last": True,
                 "cached_prefix": 0, "extra": {"attempt": 0}, "fields": {}}]
        assert p.capture_rows(maps, [0], blocks, layers=[4], token_ids=ids, snapshot=snap)
        after = p.stats()
        native = after.get("native_copies", 0) - before.get("native_copies", 0)
        torch_ = after.get("torch_copies", 0) - before.get("torch_copies", 0)
        expect_native = copy_path == "native" and rid != "col-strided"
        assert (native, torch_) == ((1, 0) if expect_native else (0, 1)), (rid, native, torch_)
        if snap:
            blocks[0].fill_(float("nan"))
            if ids.is_cuda:
                ids.fill_(-1)
        s = sub.get(rid, timeout=30)
        assert torch.equal(bits(s.tensors["layer_4"]), want[0][0]), rid
        assert torch.equal(s.token_ids.to(torch.int64), want[1]), rid
        s.release()


def test_deferred_captures_on_cuda_become_one_entry_exact_behind_a_slow_forward_stream(
        endpoint, copy_path):
    """``capture_rows(defer=True)``, as the SGLang hook calls it: 12 forwards on a side
    "forward" stream, scattered rows, host ids overwritten after every call; odd forwards are
    CUDA-graph-like (snapshot: the sources are overwritten with NaN right after the call;
    every other one of them leaves out the first rows, so the snapshot's covering copy starts
    past row 0 and its rows are shifted), even ones drop their sources and allocate and fill fresh tensors of the same size (the
    staged entry must keep the memory it reads). The last forward's values land only after
    a ~0.3 s GPU sleep on that stream, and the stage is written from the default stream: the
    copies must wait for the forward stream, not for the stream current at the write. The
    native path writes the 12 forwards as ONE entry; the torch path captures at once. Every
    sample exact."""
    from array import array

    from hscapture._copies import HostRowIds

    p = Producer(endpoint, producer_id=f"gpu-{uuid.uuid4().hex[:8]}", capacity=512 << 20,
                 stage_interval_s=60.0, stage_bytes=256 << 20)
    sub = Subscriber(endpoint)
    try:
        sub.wait_ready(timeout=20)
        dev = torch.device("cuda")
        g = torch.Generator(device=dev).manual_seed(17)
        rng = np.random.default_rng(17)
        k, h = 3, 256
        lens = [9, 1, 130, 4, 47, 2, 300, 8]
        offs = [sum(lens[:i]) for i in range(len(lens))]
        T = sum(lens)
        n_staged = 0
        fwd = torch.cuda.Stream()
        cycles = int(_cycles_per_second() * 0.3)
        want, scratch = {}, []
        for f in range(12):
            snapshot = bool(f % 2)
            wanted = [2, 3, 5, 6] if f % 4 == 3 else [0, 2, 3, 5, 6]
            n_staged += len(wanted)
            truth_aux = torch.randn(T, k * h, generator=g, device=dev).to(torch.bfloat16)
            truth_last = torch.randn(T, h, generator=g, device=dev).to(torch.bfloat16)
            prompts = {i: array("q", rng.integers(0, 150_000, 400 + lens[i]).tolist())
                       for i in wanted}
            prefix = {i: int(rng.integers(0, 400)) for i in wanted}
            maps = [{"rid": f"defer-{f}-{i}", "token_start": 0, "token_count": lens[i],
                     "last": True, "cached_prefix": 0, "extra": {"attempt": 0}, "fields": {}}
                    for i in wanted]
            for m, i in zip(maps, wanted):
                s0, n = offs[i], lens[i]
                want[m["rid"]] = ([bits(truth_aux[s0:s0 + n, j * h:(j + 1) * h])
                                   for j in range(k)] + [bits(truth_last[s0:s0 + n])],
                                  torch.tensor(prompts[i][prefix[i]:prefix[i] + n]))
            fwd.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(fwd):
                aux = torch.empty_like(truth_aux)
                last = torch.empty_like(truth_last)
                if f == 11:
                    torch.cuda._sleep(cycles)        # the last forward is still running
                aux.copy_(truth_aux)
                last.copy_(truth_last)
                ids = HostRowIds([(prompts[i], prefix[i], lens[i]) for i in wanted])
                assert _capture_packed(p, maps, [offs[i] for i in wanted], aux, last, h, ids,
                                       snapshot, defer=True)
                for a in prompts.values():
                    a[:] = array("q", [-1]) * len(a)
                if snapshot:
                    aux.fill_(float("nan"))
                    last.fill_(float("nan"))
                else:
                    del aux, last          # the engine lets go; its allocator hands out anew
                    scratch.append(torch.full((T, (k + 1) * h), float("nan"), device=dev,
                                              dtype=torch.bfloat16))
        staged = p.stats().get("staged_rows", 0)
        p.flush(timeout_s=30)        # from the default stream, which is idle
        st = p.stats()
        if copy_path == "native":
            assert staged == n_staged and st["stage_writes"] == 1, st
            assert st.get("native_copies") == 1, st
        else:
            assert staged == 0 and st.get("torch_copies") == 12, st
        _assert_packed_samples(sub, want)
        assert p.stats().get("dropped", 0) == 0
    finally:
        sub.close()
        p.close()


def _one_forward(p, rng_seed: int, tag: str, snapshot: bool, stage: bool = False) -> dict:
    """One forward of 3 requests (rows 0 and 2 captured) through ``_capture_packed``; the
    sources are overwritten with NaN right after the call when ``snapshot`` (the snapshot was
    taken during it), the int64 ids always. Returns what must arrive (``_assert_packed_samples``)."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(rng_seed)
    k, h = 3, 256
    lens, wanted = [300, 5, 700], [0, 2]
    offs = [0, 300, 305]
    T = sum(lens)
    aux = torch.randn(T, k * h, generator=g, device=dev).to(torch.bfloat16)
    last = torch.randn(T, h, generator=g, device=dev).to(torch.bfloat16)
    ids = torch.randint(0, 50_000, (T,), generator=g, device=dev)
    maps = [{"rid": f"{tag}-{i}", "token_start": 0, "token_count": lens[i], "last": True,
             "cached_prefix": 0, "extra": {"attempt": 0}, "fields": {}} for i in wanted]
    want = {m["rid"]: ([bits(aux[offs[i]:offs[i] + lens[i], j * h:(j + 1) * h])
                        for j in range(k)] + [bits(last[offs[i]:offs[i] + lens[i]])],
                       ids[offs[i]:offs[i] + lens[i]].cpu()) for m, i in zip(maps, wanted)}
    assert _capture_packed(p, maps, [offs[i] for i in wanted], aux, last, h, ids, snapshot,
                           defer=stage)
    ids.fill_(-1)
    if snapshot:
        aux.fill_(float("nan"))
        last.fill_(float("nan"))
    return want


@contextlib.contextmanager
def _deferring(p, max_age: float):
    """Deferred device copies on for the block (skips the test on the torch copy path, which
    has nothing to defer), with the queue's max age set to ``max_age``; both set back after."""
    from hscapture import _ring

    if not p.defer_device_copies(True):
        pytest.skip("the torch copy path has nothing to defer")
    _ring.cuda_set_defer_max_age(max_age)
    try:
        yield
    finally:
        _ring.cuda_set_defer_max_age(0.2)
        p.defer_device_copies(False)


def _three_queued_forwards(p, seed: int, tag: str, snapshot: bool) -> dict:
    """Three forwards (``_one_forward``) captured with their copies queued (the caller turned
    deferral on), the device synchronized after them: every forward and snapshot is done, no
    copy into the ring issued. Returns what must arrive."""
    from hscapture import _ring

    want = {}
    for f in range(3):
        want.update(_one_forward(p, seed + f, f"{tag}-{f}", snapshot))
    assert _ring.cuda_deferred() == 3
    torch.cuda.synchronize()
    return want


@pytest.mark.parametrize("snapshot", [False, True])
def test_deferred_device_copies_wait_for_the_flush_then_arrive_exact(pair, copy_path, snapshot):
    """``Producer.defer_device_copies`` (what the SGLang hook turns on where its step hook
    runs): a capture's device-to-host copies are queued, not issued; its entry cannot be
    committed (its ``done`` reads as pending), so nothing reaches the subscriber, until
    ``flush_device_copies`` issues them; then every sample is exact, the snapshot's included
    (its sources were overwritten right after the call). The torch path has nothing to defer
    and says so."""
    from hscapture import _ring

    p, sub = pair
    on = p.defer_device_copies(True)
    assert on == (copy_path == "native")
    if not on:
        return
    _ring.cuda_set_defer_max_age(60.0)      # no wait may issue them early in this test
    try:
        want = _three_queued_forwards(p, 40, f"dfr-{snapshot:d}", snapshot)
        assert sub.poll(timeout=0.0) is None   # the copies are not issued: nothing committed
        assert p.flush_device_copies() == 3
        assert _ring.cuda_deferred() == 0
        _assert_packed_samples(sub, want)
        st = p.stats()
        assert st.get("dropped", 0) == 0 and st.get("native_copies") == 3, st
    finally:
        _ring.cuda_set_defer_max_age(0.2)
        p.defer_device_copies(False)


@pytest.mark.parametrize("snapshot", [False, True])
def test_a_flush_with_a_byte_budget_issues_the_copies_in_parts_and_every_sample_arrives_exact(
        pair, copy_path, snapshot):
    """``flush_device_copies(max_bytes=B)`` (``HSCAPTURE_COPY_STEP_BYTES``): each call issues
    about B bytes of the queued copies, splitting a copy between rows, and goes on from there at
    the next call; a capture counts (and its entry can be committed) only once its last copy
    is issued: after a first call that issued part of one, a synchronized device still has
    nothing committed. Three forwards of ~2 MB at 64 KiB a call take ~96 calls; every sample
    then arrives exact, the snapshots' included. A capture queued for half the max age or
    longer is issued whole whatever the budget."""
    from hscapture import _ring

    p, sub = pair
    with _deferring(p, 60.0):
        want = _three_queued_forwards(p, 140, f"dfb-{snapshot:d}", snapshot)
        budget = 64 << 10
        assert p.flush_device_copies(max_bytes=budget) == 0     # part of the first one
        torch.cuda.synchronize()                                # that part has landed
        assert _ring.cuda_deferred() == 3
        assert sub.poll(timeout=0.0) is None                    # and commits nothing
        whole, calls = 0, 1
        while _ring.cuda_deferred():
            whole += p.flush_device_copies(max_bytes=budget)
            calls += 1
            assert calls < 100_000
        hidden = 3 * 1000 * 4 * 256 * 2                         # the captured rows' bytes
        assert whole == 3 and calls >= hidden // (budget + 4096), (whole, calls)
        _assert_packed_samples(sub, want)
        more = _one_forward(p, 150, f"dfb-age-{snapshot:d}", snapshot)
        _ring.cuda_set_defer_max_age(0.0)   # every queued capture is past half of it now
        assert p.flush_device_copies(max_bytes=1) == 1          # whole, budget or not
        _assert_packed_samples(sub, more)
        st = p.stats()
        assert st.get("dropped", 0) == 0 and st.get("native_copies") == 4, st


def test_deferred_copies_flushed_after_an_engine_event_start_only_once_it_completed(
        pair, copy_path):
    """``flush_device_copies(after_event)`` (the SGLang hook passes the event SGLang records
    behind its result read-back): the flushed copies wait for that event too. Here it is
    recorded ~0.4 s late, on a stream of its own; until then the capture's ``done`` stays
    pending and nothing is committed, though its forward finished long before; then the
    sample arrives exact."""
    p, sub = pair
    with _deferring(p, 60.0):
        want = _one_forward(p, 90, "dfr-after", False)
        torch.cuda.synchronize()                 # the forward and its snapshot are done
        engine = torch.cuda.Stream()
        readback = torch.cuda.Event()
        with torch.cuda.stream(engine):
            torch.cuda._sleep(int(_cycles_per_second() * 0.4))
            readback.record(engine)
        assert p.flush_device_copies(readback.cuda_event) == 1
        assert sub.poll(timeout=0.1) is None     # issued, but behind the engine's event
        assert not readback.query()
        _assert_packed_samples(sub, want)
        assert readback.query()
        st = p.stats()
        assert st.get("dropped", 0) == 0 and st.get("native_copies") == 1, st


def test_deferred_captures_from_two_streams_each_wait_for_their_own_forward(pair, copy_path):
    """Queued copies wait for the device's ready event as last recorded when they are issued:
    a capture from another stream first issues what is queued (``NativeCopier._ready_from``).
    The first capture's values land ~0.3 s late on stream A; the second capture, on stream
    B, is ready at once. Without that flush the first capture's copies would wait for B's
    point and read A's sources before they were written. Both samples exact."""
    p, sub = pair
    with _deferring(p, 60.0):
        cycles = int(_cycles_per_second() * 0.3)
        dev = torch.device("cuda")
        k, h, lens, offs = 3, 256, [300, 5, 700], [0, 300, 305]
        want, keep = {}, []
        slow, fast = torch.cuda.Stream(), torch.cuda.Stream()
        for f, (stream, late) in enumerate(((slow, True), (fast, False))):
            g = torch.Generator(device=dev).manual_seed(70 + f)
            truth_aux = torch.randn(sum(lens), k * h, generator=g, device=dev).to(torch.bfloat16)
            truth_last = torch.randn(sum(lens), h, generator=g, device=dev).to(torch.bfloat16)
            ids = torch.randint(0, 50_000, (sum(lens),), generator=g, device=dev)
            maps = [{"rid": f"dfr-2s-{f}-{i}", "token_start": 0, "token_count": lens[i],
                     "last": True, "cached_prefix": 0, "extra": {"attempt": 0}, "fields": {}}
                    for i in (0, 2)]
            for m, i in zip(maps, (0, 2)):
                a, n = offs[i], lens[i]
                want[m["rid"]] = ([bits(truth_aux[a:a + n, j * h:(j + 1) * h]) for j in range(k)]
                                  + [bits(truth_last[a:a + n])], ids[a:a + n].cpu())
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                aux, last = torch.empty_like(truth_aux), torch.empty_like(truth_last)
                if late:
                    torch.cuda._sleep(cycles)       # this forward's values land late
                aux.copy_(truth_aux)
                last.copy_(truth_last)
                assert _capture_packed(p, maps, [offs[0], offs[2]], aux, last, h, ids, False)
            keep.append((aux, last, truth_aux, truth_last, ids))
        assert p.flush_device_copies() >= 1
        _assert_packed_samples(sub, want)


def test_a_deferred_copy_nobody_flushes_is_issued_by_the_publishers_wait_after_max_age(pair,
                                                                                        copy_path):
    """A stalled engine never holds a capture forever: with no flush, the publisher thread's
    wait for the entry's copy issues the queued copies once the oldest is ``max_age`` old
    (here 0.1 s); the samples arrive exact. Staged captures (the stage written by flush) are
    deferred the same way and flushed by ``Producer.flush``."""
    from hscapture import _ring

    p, sub = pair
    with _deferring(p, 0.1):
        want = _one_forward(p, 60, "dfr-age", snapshot=True)
        t0 = time.monotonic()
        _assert_packed_samples(sub, want)      # get() waits; nobody calls flush_device_copies
        assert time.monotonic() - t0 >= 0.05
        assert _ring.cuda_deferred() == 0
        staged = _one_forward(p, 61, "dfr-stage", snapshot=True, stage=True)
        p.flush(timeout_s=30)                  # writes the stage, flushes its copies, waits
        _assert_packed_samples(sub, staged)


def test_through_steady_captures_the_publisher_thread_sleeps_and_takes_the_last(endpoint):
    """CUDA copies complete between captures (a device synchronize, not a sleep): each capture
    publishes the previous entry, the publisher thread publishes none of them (it would take
    the GIL from the engine's thread once per capture), and once the captures stop it
    publishes the last one by itself, no sooner than the commit grace after that capture.

    The last capture's copy is held back by a GPU spin on the caller's stream (the side
    stream waits for it), so that capture cannot announce its own entry right away (a small
    copy otherwise completes before the capture's inline publish looks at it: the H200 run
    of this test's first version saw exactly that)."""
    import threading

    grace = 0.5
    p = Producer(endpoint, producer_id=f"gpu-{uuid.uuid4().hex[:8]}", capacity=64 << 20,
                 commit_grace_s=grace)
    sub = Subscriber(endpoint)
    by: list[tuple[str, float, float]] = []
    real = p._publish

    def publish(item):
        by.append((threading.current_thread().name, time.monotonic(), p._pubq.last_enqueue))
        return real(item)
    p._publish = publish
    try:
        sub.wait_ready(timeout=20)
        p._announcer._heartbeat = lambda: None   # (who publishes: no heartbeat's send lock)
        cycles = int(_cycles_per_second() * 0.2)
        src = torch.randn(256, 512, device="cuda").to(torch.bfloat16)
        ids = torch.arange(256, device="cuda")
        spin_done = torch.cuda.Event()
        for i in range(8):
            if i == 7:
                torch.cuda._sleep(cycles)              # the last copy queues behind this
                spin_done.record()
            assert p.capture(f"s{i}", [src], layers=[1], token_ids=ids)
            if i < 7:
                torch.cuda.synchronize()               # this capture's copy has completed
        still_spinning = not spin_done.query()
        for i in range(8):                             # no flush: the last is the thread's
            s = sub.get(f"s{i}", timeout=20)
            assert_bits_equal(s.tensors["layer_1"], src, f"s{i}")
            s.release()
        assert still_spinning, "the GPU spin ended before the last capture returned: void"
        names = [t for t, _, _ in by]
        assert names == [threading.main_thread().name] * 7 + ["hscapture-publisher"], names
        assert by[-1][1] - by[-1][2] >= grace
    finally:
        sub.close()
        p.close()


def test_the_capturing_thread_announces_completed_copies_and_flush_cuts_the_grace(endpoint):
    """With a commit grace far longer than the test, an entry whose copy completed is
    announced by the next capture (inline, no publisher-thread hand-off), and flush() does
    not wait out the grace for the last one."""
    p = Producer(endpoint, producer_id=f"gpu-{uuid.uuid4().hex[:8]}", capacity=64 << 20,
                 commit_grace_s=60.0)
    sub = Subscriber(endpoint)
    try:
        sub.wait_ready(timeout=20)
        src = torch.randn(64, 256, device="cuda").to(torch.bfloat16)
        ids = torch.arange(64, device="cuda")
        assert p.capture("first", [src], layers=[1], token_ids=ids)
        torch.cuda.synchronize()                       # the first copy has completed
        assert p.capture("second", [src], layers=[1], token_ids=ids)
        t0 = time.monotonic()
        s = sub.get("first", timeout=20)               # announced by the second capture
        assert time.monotonic() - t0 < 20
        assert_bits_equal(s.tensors["layer_1"], src, "first")
        s.release()
        t0 = time.monotonic()
        p.flush(timeout_s=20)
        assert time.monotonic() - t0 < 20, "flush waited out the commit grace"
        sub.get("second", timeout=5).release()
    finally:
        sub.close()
        p.close()


# (vi) streaming straight onto the GPU: hscapture.stream(..., device="cuda") (issue #9) --------

def _stream_spec(endpoint, requests, **over):
    out = {"endpoint": endpoint, "hidden": 256, "layers": [2, 5, 7], "requests": requests,
           "threads": 1, "policy": "wait"}
    out.update(over)
    return out


def _finish(proc):
    try:
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _on_host(x):
    """A device sample's tensors brought back (on the current stream: no explicit sync)."""
    from hscapture import Sample

    return Sample(x.rid, x.producer_id, x.epoch, x.num_tokens, x.token_ids.cpu(),
                  {k: v.cpu() for k, v in x.tensors.items()}, x.layers, x.layer_kinds,
                  x.dtype, x.hidden)


def _wait_ready(sub, n, timeout=30.0):
    deadline = time.monotonic() + timeout
    while sub.stats()["ready"] < n:
        assert time.monotonic() < deadline, sub.stats()
        sub.pump(0.05)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_stream_to_cuda_bytes_on_device_equal_the_ring_bytes(endpoint, tmp_path, dtype):
    """Every tensor handed out is on the GPU, contiguous, and bit-identical to the ring's own
    bytes (read by a second, zero-copy subscriber of the same ring); single-chunk samples are
    copied straight from the registered ring, multi-chunk ones (owned host memory) staged."""
    import hscapture
    from capture_support import assert_sample_exact, start_producer

    requests = [[f"v{i}", 1 + 97 * i % 700, 256 if i % 3 == 0 else 1024] for i in range(12)]
    multi = sum(1 for _, n, c in requests if n > c)
    proc = start_producer(_stream_spec(endpoint, requests, dtype=dtype, consumers=2),
                          tmp_path)
    ref = hscapture.Subscriber(endpoint, zero_copy=True)
    feed = hscapture.stream(endpoint, device="cuda", max_samples=12, idle_timeout_s=30,
                            prefetch=3)
    try:
        ref.wait_ready(timeout=30)
        feed.subscriber.wait_ready(timeout=30)
        by_rid = {r[0]: r[1] for r in requests}
        n = 0
        for x in feed:
            assert feed.held <= 3
            for t in (x.token_ids, *x.tensors.values()):
                assert t.device.type == "cuda" and t.is_contiguous()
            with ref.get(x.rid, timeout=30) as ring:
                for name, t in x.tensors.items():
                    assert_bits_equal(t, ring.tensors[name], f"{x.rid} {name}")
                assert torch.equal(x.token_ids.cpu(), ring.token_ids.clone())
            assert_sample_exact(_on_host(x), x.rid, by_rid[x.rid], 256, [2, 5, 7], dtype)
            n += 1
        assert n == 12
        report = feed.report()
        assert report["delivered"] == 12 and not report["undelivered"]
        assert not (report["dropped"] or report["incomplete"] or report["rejected"])
        assert feed._copier.staged_samples == multi, (
            "single-chunk samples were staged: cudaHostRegister of the consumer's ring mapping "
            "failed here (see the RuntimeWarning)")
        assert feed._copier._pins == {}, "a ring registration outlived the stream"
    finally:
        feed.close()
        ref.close()
        _finish(proc)


def test_stream_releases_a_ring_slot_only_after_its_copy_event_completed(endpoint, tmp_path):
    """The copy stream is made busy (~1 s) before the copies are issued: next() returns at
    once (no host wait for the copy), the sample's ring slot stays held while its event has
    not completed, the user's stream still sees the right bytes without any explicit sync,
    and the slot goes back at the next call once the event completed."""
    import hscapture
    from capture_support import assert_sample_exact, start_producer

    # the producer stays up until _finish: its end would detach the ring (consumer None)
    # between the two deliveries, racing the release check below
    proc = start_producer(_stream_spec(endpoint, [["e0", 300, 300], ["e1", 300, 300]],
                                       hold=True), tmp_path)
    feed = hscapture.stream(endpoint, device="cuda", max_samples=2, idle_timeout_s=30,
                            prefetch=4)
    try:
        sub = feed.subscriber
        _wait_ready(sub, 2)
        feed._copier.region(sub, sub._delivery.ready[0])   # register the ring before the clock
        cycles = int(_cycles_per_second() * 1.0)
        with torch.cuda.stream(feed._copier.stream):
            torch.cuda._sleep(cycles)             # the copies queue behind this
        t0 = time.monotonic()
        first = next(feed)
        took = time.monotonic() - t0
        assert took < 0.5, f"next() took {took:.3f}s: it waited for the copy"
        assert first.tensors["layer_5"].device.type == "cuda"
        host, event = feed._releasing[0]
        assert host.rid == first.rid
        assert not event.query(), "the copy finished before the sleep: the test means nothing"
        assert host.borrowed and not host.released, "slot released before the copy completed"
        src = sub._sources[host.epoch]
        released_before = src.consumer.released
        assert len(src.borrowed) == 2                # the sample handed out + the one ahead
        assert_sample_exact(_on_host(first), "e0", 300, 256, [2, 5, 7])   # ordered, no sync
        assert event.query()
        second = next(feed)
        assert host.released and not host.borrowed   # reaped at the next call
        assert src.consumer.released > released_before
        assert_sample_exact(_on_host(second), "e1", 300, 256, [2, 5, 7])
        with pytest.raises(StopIteration):
            next(feed)
        assert feed.report()["delivered"] == 2
    finally:
        feed.close()
        _finish(proc)


def test_a_held_cuda_sample_stays_valid_while_the_ring_wraps_and_memory_is_reused(
        endpoint, tmp_path):
    """A sample kept by the trainer stays exact while 40 more pass through an 8 MiB ring
    (wrapping it ~7 times) and the device allocator recycles every other sample's memory."""
    import hscapture
    from capture_support import assert_sample_exact, start_producer

    requests = [[f"w{i}", 512, 512] for i in range(41)]      # 512 x 1024 x 3 bf16 = 3 MiB
    proc = start_producer(_stream_spec(endpoint, requests, hidden=1024, capacity=8 << 20),
                          tmp_path)
    feed = hscapture.stream(endpoint, device="cuda", max_samples=41, idle_timeout_s=30,
                            prefetch=2)
    try:
        it = iter(feed)
        kept = next(it)
        for x in it:
            assert_sample_exact(_on_host(x), x.rid, 512, 1024, [2, 5, 7])
            del x
        assert_sample_exact(_on_host(kept), "w0", 512, 1024, [2, 5, 7])
        assert feed.report()["delivered"] == 41
    finally:
        feed.close()
        _finish(proc)


def test_a_freed_cuda_sample_is_not_recycled_before_the_users_stream_is_done_with_it(
        endpoint, tmp_path):
    """record_stream semantics: the trainer queues work on a sample behind ~0.3 s of other
    work, drops the sample, and streams on; the allocator must not hand its memory to the next
    samples' copies (another stream) before that queued work has read it."""
    import hscapture
    from capture_support import source, start_producer

    requests = [[f"f{i}", 512, 512] for i in range(12)]
    proc = start_producer(_stream_spec(endpoint, requests, hidden=1024), tmp_path)
    feed = hscapture.stream(endpoint, device="cuda", max_samples=12, idle_timeout_s=30,
                            prefetch=2)
    try:
        _wait_ready(feed.subscriber, 4)
        first = next(feed)
        torch.cuda._sleep(int(_cycles_per_second() * 0.3))     # on the current stream
        late = first.tensors["layer_5"] * 1                    # reads it after the sleep
        del first
        rest = [next(feed).rid for _ in range(6)]              # new copies meanwhile
        want = source("f0", 512, 1024, 3)[0][1]
        assert_bits_equal(late, want, "f0 layer_5 read after the sample was dropped")
        assert rest == [f"f{i}" for i in range(1, 7)]
    finally:
        feed.close()
        _finish(proc)


def test_stream_to_cuda_without_a_registered_ring_is_staged_exact_and_says_why(
        endpoint, tmp_path, recwarn):
    """The fallback: a failed registration warns once (pinned staging named) and leaves no CUDA
    error behind; a stream whose rings are not registered copies through pinned staging,
    exact; StreamDataset(device=...) yields items on the GPU."""
    import hscapture
    from capture_support import assert_sample_exact, start_producer
    from hscapture.stream import StreamDataset, register_ring
    from torch.utils.data import DataLoader

    assert register_ring(4096, 4096) is None
    msgs = [str(w.message) for w in recwarn.list if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 1 and "pinned staging buffer" in msgs[0]
    x = torch.ones(1024, device="cuda") * 2
    assert float(x.sum()) == 2048.0

    requests = [[f"u{i}", 5 + 61 * i, 128] for i in range(6)]
    proc = start_producer(_stream_spec(endpoint, requests), tmp_path)
    ds = StreamDataset(endpoint, max_samples=6, idle_timeout_s=30, prefetch=2,
                       device="cuda", _register_rings=False)
    try:
        items = list(DataLoader(ds, batch_size=None, num_workers=0))
        assert [i["rid"] for i in items] == [r[0] for r in requests]
        for item, (rid, n, _) in zip(items, requests):
            assert item["input_ids"].device.type == "cuda"
            assert item["input_ids"].dtype == torch.int64
            s = hscapture.Sample(rid, "t", 0, n, item["input_ids"].cpu(),
                                 {f"layer_{L}": item[f"layer_{L}"].cpu() for L in (2, 5, 7)},
                                 [2, 5, 7], ["residual"] * 3, "bfloat16", 256)
            assert_sample_exact(s, rid, n, 256, [2, 5, 7])
        assert ds._feed._copier.staged_samples == 6
        assert ds.report()["delivered"] == 6
    finally:
        ds.close()
        _finish(proc)


def test_stream_to_cuda_keeps_exactly_once_samples_copied_but_not_handed_out_come_again(
        endpoint, tmp_path):
    """Samples already copied to the GPU but not handed out when the feed stops are reported
    undelivered and NOT acknowledged: the next durable subscriber of the name gets them."""
    import hscapture
    from capture_support import assert_sample_exact, start_producer

    requests = [[f"g{i}", 10, 10] for i in range(12)]
    proc = start_producer(_stream_spec(endpoint, requests), tmp_path)
    name = f"dur-{uuid.uuid4().hex[:6]}"
    feed = hscapture.stream(endpoint, device="cuda", idle_timeout_s=30, prefetch=4, name=name)
    again = None
    try:
        sub = feed.subscriber
        _wait_ready(sub, 4)                            # the first next() takes 4, hands out 1
        assert next(feed).rid == "g0"
        deadline = time.monotonic() + 30
        while feed.buffered + sub.stats()["ready"] < 11:
            assert time.monotonic() < deadline, sub.stats()
            sub.pump(0.05)
        assert feed.buffered == 3                      # copied to the device, not handed out
        feed.close()
        report = feed.report()
        assert report["delivered"] == 1
        assert sorted(report["undelivered"]) == sorted(f"g{i}" for i in range(1, 12))
        again = hscapture.stream(endpoint, device="cuda", idle_timeout_s=3, prefetch=4,
                                 name=name)
        seen = [x for x in again]
        assert sorted(x.rid for x in seen) == sorted(f"g{i}" for i in range(1, 12))
        for x in seen:
            assert_sample_exact(_on_host(x), x.rid, 10, 256, [2, 5, 7])
    finally:
        feed.close()
        if again is not None:
            again.close()
        hscapture.Subscriber(endpoint, name=name).unsubscribe()   # give the place up
        _finish(proc)


def test_the_pass_log_arena_copies_graph_rows_in_stream_order_exactly_on_both_copy_paths(
        copy_path):
    """The SGLang pass log's arena (``hscapture.sglang.log_batch``), as the hook fills it from
    CUDA-graph outputs: each "pass" writes its sources on a forward stream (the first after a
    ~0.2 s GPU sleep), the arena takes rows ``[first, end)`` of each block on that stream, and
    the sources are overwritten with NaN right after (the next replay). The native path (one
    driver call a pass) must be ordered after the writes and before the overwrite, exactly as
    the torch ``copy_`` path; a source whose rows are not dense takes the torch copy. Every
    arena row equals its source row, bit for bit."""
    from hscapture.sglang.log_batch import Arenas

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(5)
    k, h, T = 3, 256, 700
    arenas = Arenas()
    fwd = torch.cuda.Stream()
    fwd.wait_stream(torch.cuda.current_stream())
    cycles = int(_cycles_per_second() * 0.2)
    want, puts = [], []
    aux = torch.empty(T, k * h, device=dev, dtype=torch.bfloat16)
    last = torch.empty(T, h, device=dev, dtype=torch.bfloat16)
    for f, (first, end) in enumerate([(0, T), (5, 300), (299, 300), (100, 650), (0, 1)]):
        truth_aux = torch.randn(T, k * h, generator=g, device=dev).to(torch.bfloat16)
        truth_last = torch.randn(T, h, generator=g, device=dev).to(torch.bfloat16)
        fwd.wait_stream(torch.cuda.current_stream())       # (the truths: the default stream)
        with torch.cuda.stream(fwd):
            if f == 0:
                torch.cuda._sleep(cycles)
            aux.copy_(truth_aux)
            last.copy_(truth_last)
            srcs = [aux, last]
            if f == 3:   # rows not dense (column stride 2): the torch copy, same result
                wide = torch.empty(T, k * h, 2, device=dev, dtype=torch.bfloat16)
                wide[:, :, 0].copy_(truth_aux)
                srcs = [wide[:, :, 0], last]
            arena = arenas.for_rows(srcs, end - first, 64 << 20)
            pos = arena.put(srcs, first, end, T)
            aux.fill_(float("nan"))
            last.fill_(float("nan"))
        want.append((truth_aux[first:end], truth_last[first:end]))
        puts.append((arena, pos, end - first))
    torch.cuda.synchronize()
    assert (arenas.copier is not None) == (copy_path == "native")
    for f, ((wa, wl), (arena, pos, n)) in enumerate(zip(want, puts)):
        assert_bits_equal(arena.blocks[0][pos:pos + n], wa, f"pass {f} aux rows")
        assert_bits_equal(arena.blocks[1][pos:pos + n], wl, f"pass {f} final rows")
