"""The real capture hook, through real SGLang objects, into a real Producer, checked by the
real Subscriber against the fabricated source tensors (see sglang_support.py)."""

from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("sglang")  # local convenience only: CI installs sglang

import torch  # noqa: E402

from hscapture.errors import IncompleteSampleError, SampleTimeoutError  # noqa: E402
from hscapture.sglang.config import load_config  # noqa: E402
from hscapture.sglang.hook import SGLangCaptureHook  # noqa: E402

from sglang_support import LAYERS, FakeModelServer, chunks  # noqa: E402


def check(sample, server, req, n=None):
    want = server.expected(req, n)
    n = len(req.origin_input_ids) if n is None else n
    assert sample.num_tokens == n
    assert sample.token_ids.tolist() == list(req.origin_input_ids[:n])
    assert set(sample.tensors) == set(want), (sorted(sample.tensors), sorted(want))
    for name, t in want.items():
        assert torch.equal(sample.tensors[name].cpu(), t), name
    assert sample.layers[:len(LAYERS)] == list(LAYERS)


def set_mode(hook, mode_file, name: str) -> None:
    """Switch the hook to benchmark mode ``name`` (HSCAPTURE_EXPERIMENT_FILE ``mode_file``)
    for its next forward: the hook looks at the file at most every 100 ms, so the check's
    clock is reset."""
    mode_file.write_text(name)
    hook._bench.checked = 0


def capture_whole(sub, srv, prefix: str, count: int, tokens: int, **kw) -> list:
    """``count`` requests of ``tokens`` tokens (rids ``prefix0``...), each prefilled whole in
    its own pass, and each one's sample checked; returns the requests."""
    reqs = [srv.new_req(f"{prefix}{i}", tokens, **kw) for i in range(count)]
    for r in reqs:
        srv.extend([(r, 0, tokens)])
    for r in reqs:
        check(sub.get(r.rid, timeout=10), srv, r)
    return reqs


def reprefill_publishes_nothing(hook, sub, srv, req) -> None:
    """Retract ``req`` (its prompt captured), re-prefill it, and check that nothing was
    published for it: the next sample is a marker request's, sent after it (one producer's
    samples arrive in the order of their passes), and the hook counts a skipped re-prefill."""
    skipped = hook.stats().get("reprefill_skipped", 0)
    req.output_ids.extend([5, 6])
    req.reset_for_retract()
    req.init_next_round_input(None)
    srv.extend([(req, 0, len(req.full_untruncated_fill_ids))])
    marker = srv.new_req(f"hscap-marker-{req.rid}", 3)
    srv.extend([(marker, 0, 3)])
    got = sub.poll(timeout=10)
    assert got is not None and got.rid == marker.rid, got
    assert hook.stats()["reprefill_skipped"] == skipped + 1


def test_the_finished_rid_memory_keeps_the_newest_and_evicts_the_oldest_first(rig, monkeypatch):
    """The hook remembers the last MAX_DONE finished samples (a retraction's re-prefill of
    one of them publishes no duplicate): past the bound the OLDEST is forgotten first, and
    the re-prefill of a remembered one is still skipped."""
    import hscapture.sglang.samples as samples_module

    monkeypatch.setattr(samples_module, "MAX_DONE", 4)
    hook, sub, srv = rig()
    reqs = [srv.new_req(f"hscap-mem-{i}", 5, max_new_tokens=8) for i in range(6)]
    for r in reqs:
        srv.extend([(r, 0, 5)])
    assert list(hook._samples.done) == [r.rid for r in reqs[2:]]
    for r in reqs:
        check(sub.get(r.rid, timeout=10), srv, r)
    newest = reqs[-1]
    reprefill_publishes_nothing(hook, sub, srv, newest)
    assert list(hook._samples.done)[-2] == newest.rid and len(hook._samples.done) == 4


def test_a_request_whose_rid_was_evicted_from_the_memory_still_publishes_no_duplicate(
        rig, monkeypatch):
    """Whether a request's sample is done is marked on the request itself: after MAX_DONE
    newer samples evicted its rid, a retraction's re-prefill of it (a long generation
    retracted long after its prompt was captured) is still skipped, while a new request
    reusing an evicted or remembered rid is a new sample."""
    import hscapture.sglang.samples as samples_module

    monkeypatch.setattr(samples_module, "MAX_DONE", 2)
    hook, sub, srv = rig()
    reqs = capture_whole(sub, srv, "hscap-old-", 5, 5, max_new_tokens=8)
    oldest = reqs[0]
    assert oldest.rid not in hook._samples.done          # evicted by rid
    reprefill_publishes_nothing(hook, sub, srv, oldest)
    # new requests with an evicted rid and with a remembered one: both new samples
    again = [srv.new_req(reqs[1].rid, 6), srv.new_req(reqs[-1].rid, 7)]
    for r in again:
        srv.extend([(r, 0, len(r.origin_input_ids))])
    for r in again:
        check(sub.get(r.rid, timeout=10), srv, r)


def test_remembering_done_samples_keeps_nothing_the_garbage_collector_tracks(rig):
    """A completed sample leaves an int in its request's dict and one in the rid memory: no
    container object survives it (each one the cyclic collector tracks brings its next
    young collection closer, in the scheduler's process)."""
    import gc

    hook, sub, srv = rig()
    reqs = capture_whole(sub, srv, "hscap-gc-", 4, 5)
    done = hook._samples.done
    assert list(done) == [r.rid for r in reqs]
    assert not any(gc.is_tracked(v) for v in done.values()), list(done.values())
    assert not hook._samples.inflight


def test_batch_of_several_requests_chunked_and_mixed(rig):
    hook, sub, srv = rig()
    a = srv.new_req("hscap-a", 23)
    b = srv.new_req("hscap-b", 5)
    plain = srv.new_req("not-captured", 9)
    c = srv.new_req("anything", 7, custom_params={"hscapture": True})  # opt-in by param
    # pass 1: a chunk 0, plain, b whole
    srv.extend([(a, 0, 10), (plain, 0, 9), (b, 0, 5)])
    # pass 2: a chunk 1 + c whole, mixed with decode rows of b and plain (skipped)
    b.output_ids.append(1); plain.output_ids.append(2)
    b.refresh_fill_ids(); plain.refresh_fill_ids()
    srv.extend([(a, 10, 10), (c, 0, 7)], decode=[b, plain])
    # a DECODE pass with stale prefix/extend lens: nothing read
    srv.decode([b, plain])
    # pass 3: a last chunk, with DP padding rows after the real ones
    srv.extend([(a, 20, 3)], pad=5, graph=True)
    for req in (a, b, c):
        s = sub.get(req.rid, timeout=10)
        check(s, srv, req)
        assert s.meta["extra"]["attempt"] == 0
        s.release()
    with pytest.raises(SampleTimeoutError):
        sub.get("not-captured", timeout=0.3)
    st = hook.stats()
    assert st["samples"] == 3 and st["chunks"] == 5 and st.get("errors", 0) == 0


def test_radix_cache_prefix_is_reported_incomplete(rig):
    hook, sub, srv = rig()
    r = srv.new_req("hscap-cached", 12)
    srv.extend([(r, 4, 8)])  # first extend starts at 4: [0, 4) came from the radix cache
    with pytest.raises(IncompleteSampleError, match="4|cache|prefix|missing"):
        sub.get(r.rid, timeout=10)
    assert hook.stats()["cached_prefix_samples"] == 1


def test_retraction_mid_prefill_restarts_and_yields_one_sample(rig):
    hook, sub, srv = rig()
    r = srv.new_req("hscap-retract", 20)
    srv.extend([(r, 0, 8)])
    r.reset_for_retract()            # SGLang's own retraction (retraction_count += 1)
    r.init_next_round_input(None)
    for start, size in chunks(20, 8):
        srv.extend([(r, start, size)])
    s = sub.get(r.rid, timeout=10)
    check(s, srv, r)
    assert s.meta["extra"]["attempt"] == 1
    assert hook.stats()["restarts"] == 1


def test_retraction_after_complete_sample_publishes_no_duplicate(rig):
    hook, sub, srv = rig()
    r = srv.new_req("hscap-done", 9, max_new_tokens=8)
    srv.extend([(r, 0, 9)])
    s = sub.get(r.rid, timeout=10)
    check(s, srv, r)
    s.release()
    r.output_ids.extend([5, 6])
    r.reset_for_retract()
    r.init_next_round_input(None)    # re-prefill covers prompt + 2 output tokens
    srv.extend([(r, 0, len(r.full_untruncated_fill_ids))])
    assert hook.stats()["reprefill_skipped"] == 1
    assert sub.poll(timeout=0.5) is None


def test_abort_between_chunks_is_reported(rig):
    hook, sub, srv = rig()
    r = srv.new_req("hscap-abort", 30)
    other = srv.new_req("hscap-other", 4)
    srv.extend([(r, 0, 10)])
    r.set_finish_with_abort("client went away")   # SGLang's abort: 1-token stub prompt
    r.init_next_round_input(None)
    srv.extend([(r, 0, 1), (other, 0, 4)])          # its last, cheap forward; never a sample
    with pytest.raises(IncompleteSampleError, match="abort"):
        sub.get(r.rid, timeout=10)
    check(sub.get(other.rid, timeout=10), srv, other)


def test_request_finished_between_chunks_is_swept(rig):
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    hook, sub, srv = rig()
    r = srv.new_req("hscap-gone", 30)
    srv.extend([(r, 0, 10)])
    r.finished_reason = FINISH_ABORT("aborted between chunks")  # process_pending_chunked_abort
    hook.sweep()
    with pytest.raises(IncompleteSampleError, match="abort"):
        sub.get(r.rid, timeout=10)


def test_gap_between_chunks_is_reported_never_mixed(rig):
    hook, sub, srv = rig()
    r = srv.new_req("hscap-gap", 30)
    srv.extend([(r, 0, 10)])
    srv.extend([(r, 12, 18)])
    with pytest.raises(IncompleteSampleError):
        sub.get(r.rid, timeout=10)


def test_warmup_health_and_unrequested_rids_publish_nothing(rig):
    hook, sub, srv = rig()
    reqs = [srv.new_req(rid, 6) for rid in ("HEALTH_CHECK_1735", "3f2a9c0d1e", "hscap",
                                            "x-hscap-1")]
    srv.extend([(r, 0, 6) for r in reqs])
    assert sub.poll(timeout=0.5) is None
    assert hook.producer.stats().get("captured", 0) == 0


def test_tp_rank_other_than_zero_publishes_nothing(published, sock_dir, unique_id):
    published(layers=[2, 16, 29], tp_size=2, world_rank=1)
    made = []
    hook = SGLangCaptureHook(
        load_config({"HSCAPTURE_ENDPOINT": f"ipc://{sock_dir}/x.sock",
                     "HSCAPTURE_PRODUCER_ID": unique_id}),
        producer_factory=lambda *a: made.append(a))
    srv = FakeModelServer(hook)
    r = srv.new_req("hscap-tp1", 6)
    srv.extend([(r, 0, 6)])
    assert hook.ranks.attn_tp_rank == 1 and not hook.ranks.publisher
    assert made == [] and hook.producer is None


def test_dp_rank_is_tagged_and_gets_its_own_endpoint(rig, sock_dir):
    hook, sub, srv = rig(publish_kwargs={"dp_size": 2, "dp_rank": 1})
    assert hook.ranks.dp_rank == 1
    assert hook.producer.endpoint == f"ipc://{sock_dir}/cap-1.sock"
    r = srv.new_req("hscap-dp", 7)
    srv.extend([(r, 0, 7)])
    s = sub.get(r.rid, timeout=10)
    check(s, srv, r)
    assert s.meta["dp_rank"] == 1


def test_hook_errors_are_caught_and_reported(rig):
    hook, sub, srv = rig()
    r = srv.new_req("hscap-broken", 6)
    srv.extend([(r, 0, 6)], hidden_override=[1, 2, 3])   # not a tensor: the hook raises inside
    with pytest.raises(IncompleteSampleError, match="hook error"):
        sub.get(r.rid, timeout=10)
    assert hook.stats()["errors"] == 1
    r2 = srv.new_req("hscap-after", 6)
    srv.extend([(r2, 0, 6)])
    check(sub.get(r2.rid, timeout=10), srv, r2)


def test_missing_hidden_states_are_reported(rig):
    hook, sub, srv = rig()
    r = srv.new_req("hscap-nohs", 6)
    srv.extend([(r, 0, 6)], hidden_override=None)
    with pytest.raises(IncompleteSampleError, match="enable-return-aux-hidden-states"):
        sub.get(r.rid, timeout=10)


def test_hidden_states_short_of_the_batch_are_reported_and_a_mismatched_final_norm_is_left_out(
        rig):
    """A forward whose aux hidden states cover fewer rows than the batch's tokens: its rows
    are reported (never a short sample). A ``last_hidden_states`` of the wrong width, too few
    rows or another dtype: the sample is captured exact without ``final_norm``, logged once.
    The batch after each is captured whole."""
    from sglang_support import H, K

    hook, sub, srv = rig()
    r = srv.new_req("hscap-short", 6)
    srv.extend([(r, 0, 6)], hidden_override=torch.zeros(3, K * H, dtype=srv.dtype))
    with pytest.raises(IncompleteSampleError,
                       match=rf"hidden states \(3, {K * H}\) do not cover the batch's 6 tokens"):
        sub.get(r.rid, timeout=10)
    for i, bad in enumerate([torch.zeros(6, H + 1, dtype=srv.dtype),
                             torch.zeros(2, H, dtype=srv.dtype),
                             torch.zeros(6, H, dtype=torch.float64)]):
        b = srv.new_req(f"hscap-badlast{i}", 6)
        srv.extend([(b, 0, 6)], last_override=bad)
        s = sub.get(b.rid, timeout=10)
        want = srv.expected(b)
        assert set(s.tensors) == set(want) - {"final_norm"}
        for name, t in s.tensors.items():
            assert torch.equal(t, want[name]), name
    ok = srv.new_req("hscap-after-bad", 6)
    srv.extend([(ok, 0, 6)])
    check(sub.get(ok.rid, timeout=10), srv, ok)


def test_without_final_norm(rig):
    hook, sub, srv = rig(env={"HSCAPTURE_FINAL_NORM": "0"})
    r = srv.new_req("hscap-nofn", 6)
    srv.extend([(r, 0, 6)])
    s = sub.get(r.rid, timeout=10)
    assert "final_norm" not in s.tensors and s.layers == list(LAYERS)


def test_layers_disagreeing_with_sglang_are_refused(rig):
    hook, sub, srv = rig(env={"HSCAPTURE_LAYERS": "1,2,3"})
    r = srv.new_req("hscap-layers", 6)
    srv.extend([(r, 0, 6)])
    with pytest.raises(IncompleteSampleError, match="HSCAPTURE_LAYERS"):
        sub.get(r.rid, timeout=10)


def test_same_rid_reused_by_a_new_request_is_a_new_sample(rig):
    hook, sub, srv = rig()
    r = srv.new_req("hscap-again", 6)
    srv.extend([(r, 0, 6)])
    sub.get(r.rid, timeout=10).release()
    r2 = srv.new_req("hscap-again", 8)   # client retried the rid later: a fresh request
    srv.extend([(r2, 0, 8)])
    check(sub.get(r2.rid, timeout=10), srv, r2)


def test_a_request_stopped_mid_sample_and_a_retry_with_its_rid_before_any_sweep(rig):
    """A request aborted between chunks that no sweep saw yet, then a new request with the
    same rid (a client's retry): the earlier sample is reported incomplete, by rid (it can
    never complete; a quiet restart lost it), and the retry arrives whole."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    hook, sub, srv = rig()
    hook._swept = time.monotonic() + 3600        # (the forward's own sweep: not due)
    r = srv.new_req("hscap-retried", 30)
    srv.extend([(r, 0, 10)])
    r.finished_reason = FINISH_ABORT("client went away")
    r2 = srv.new_req("hscap-retried", 12)           # the retry, before any scheduling step
    srv.extend([(r2, 0, 12)])
    marker = srv.new_req("hscap-retried-marker", 3)
    srv.extend([(marker, 0, 3)])
    got = []
    while True:
        s = sub.poll(timeout=10)
        assert s is not None, "the marker never arrived"
        if s.rid == marker.rid:
            break
        got.append(s)
    assert [s.rid for s in got] == [r2.rid]
    check(got[0], srv, r2)
    assert "new request reuses its rid" in sub.stats()["incomplete"][r.rid]
    assert hook.stats()["superseded"] == 1


def test_an_invalid_rid_is_counted_and_skipped_and_its_batch_mates_are_captured(rig):
    hook, sub, srv = rig()
    bad = srv.new_req("hscap-bad\nrid", 6)          # a control character: not a valid rid
    good = srv.new_req("hscap-good-mate", 7)
    srv.extend([(bad, 0, 6), (good, 0, 7)])
    s = sub.get(good.rid, timeout=10)
    assert s.num_tokens == 7
    assert hook.counters["invalid_rids"] == 1
    assert hook.counters.get("errors", 0) == 0      # never an exception in the server
    sub.pump(0.2)
    assert bad.rid not in sub.dropped and bad.rid not in sub.incomplete


@pytest.mark.parametrize("invalid", [1, 2])
def test_invalid_rids_in_a_failing_pass_never_keep_its_valid_requests_from_being_reported(
        rig, invalid):
    # a forward without hidden states reports every opted-in request of its batch: the
    # report of an invalid rid (never captured) raised, which ended the loop, and with two
    # of them first the valid request was reported nowhere (fault hunt 5, 2026-12-05)
    hook, sub, srv = rig()
    bad = [srv.new_req(f"hscap-bad\n{i}", 6) for i in range(invalid)]
    good = srv.new_req("hscap-good-in-failed-pass", 6)
    srv.extend([(r, 0, 6) for r in bad] + [(good, 0, 6)], hidden_override=None)
    hook.producer.flush()
    with pytest.raises(IncompleteSampleError, match="hidden states"):
        sub.get(good.rid, timeout=10)
    assert hook.counters.get("errors", 0) == 0
    assert not any(r.rid in sub.incomplete for r in bad)


def test_the_benchmarks_hook_modes_noop_and_publisher_do_what_they_say(rig, tmp_path,
                                                                        monkeypatch):
    """bench_server's modes, read from HSCAPTURE_EXPERIMENT_FILE: ``noop`` captures nothing
    (the hook returns at once); ``publisher`` captures exactly, with the producer's inline
    publishing off (only its thread commits and announces); no mode turns it back on."""
    mode = tmp_path / "mode"
    monkeypatch.setenv("HSCAPTURE_EXPERIMENT_FILE", str(mode))
    hook, sub, srv = rig()

    set_mode(hook, mode, "noop")
    a = srv.new_req("hscap-noop", 9)
    srv.extend([(a, 0, 9)])
    with pytest.raises(SampleTimeoutError):
        sub.get(a.rid, timeout=0.3)
    set_mode(hook, mode, "publisher")
    b = srv.new_req("hscap-publisher", 9)
    srv.extend([(b, 0, 9)])
    assert hook.producer.inline_publish is False
    check(sub.get(b.rid, timeout=10), srv, b)
    set_mode(hook, mode, "")
    c = srv.new_req("hscap-inline", 9)
    srv.extend([(c, 0, 9)])
    assert hook.producer.inline_publish is True
    check(sub.get(c.rid, timeout=10), srv, c)


def test_the_benchmarks_stage_modes_defer_what_they_say_and_every_sample_is_exact(
        rig, tmp_path, monkeypatch):
    """By default the hook's captures are deferred (staged), CUDA-graph forwards included;
    ``nostage`` captures every forward at once; ``nosnapstage`` defers only forwards whose
    outputs need no snapshot. Whatever the mode, every sample arrives exact."""
    mode = tmp_path / "mode"
    monkeypatch.setenv("HSCAPTURE_EXPERIMENT_FILE", str(mode))
    hook, sub, srv = rig()
    hook.producer.stage_interval_s = 3600.0       # written by flush() only, not by time
    staged = {}
    for name in ("", "nostage", "nosnapstage"):
        set_mode(hook, mode, name)
        for graph in (False, True):
            r = srv.new_req(f"hscap-{name or 'on'}-{graph}", 9)
            before = hook.producer.stats().get("staged_rows", 0)
            srv.extend([(r, 0, 9)], graph=graph)
            staged[(name, graph)] = hook.producer.stats().get("staged_rows", 0) - before
            hook.producer.flush()
            check(sub.get(r.rid, timeout=10), srv, r)
    assert staged == {("", False): 1, ("", True): 1, ("nostage", False): 0,
                      ("nostage", True): 0, ("nosnapstage", False): 1,
                      ("nosnapstage", True): 0}, staged


def test_hook_time_is_kept_per_benchmark_mode_with_the_producers_share(rig, tmp_path,
                                                                       monkeypatch):
    """The hook's timing keeps each benchmark mode's capturing calls apart (modes alternate
    within one bench_server run), and for modes that capture, the part spent inside
    ``Producer.capture_rows``, never more than the hook's own time; with a stats file and
    ``HSCAPTURE_HOOK_PHASES=1``, each capturing call cut into phases."""
    mode = tmp_path / "mode"
    monkeypatch.setenv("HSCAPTURE_EXPERIMENT_FILE", str(mode))
    monkeypatch.setenv("HSCAPTURE_STATS_FILE", str(tmp_path / "stats.json"))
    monkeypatch.setenv("HSCAPTURE_HOOK_PHASES", "1")
    hook, sub, srv = rig()

    def run(name: str, rid: str, n: int) -> None:
        set_mode(hook, mode, name)
        for i in range(n):
            r = srv.new_req(f"{rid}-{i}", 9)
            srv.extend([(r, 0, 9)])

    run("", "hscap-on", 3)
    run("nocapture", "hscap-nocap", 2)
    by_mode = hook._timing.summary()["by_mode"]
    assert set(by_mode) == {"", "nocapture"}
    assert by_mode[""]["hook"]["n"] == 3 and by_mode[""]["producer"]["n"] == 3
    assert by_mode["nocapture"]["hook"]["n"] == 2 and by_mode["nocapture"]["producer"]["n"] == 0
    assert (by_mode[""]["capturing_calls"], by_mode[""]["producer_calls"]) == (3, 3)
    assert (by_mode["nocapture"]["capturing_calls"], by_mode["nocapture"]["producer_calls"]) \
        == (2, 0)
    on = by_mode[""]
    assert 0 < on["producer"]["p50_us"] <= on["hook"]["p99_us"]
    # every capturing call cut into phases that add up to the call, per mode
    phases = on["phases_mean_us"]
    assert phases["calls"] == 3
    assert set(phases) == {"calls", "select", "rows", "ids", "capture", "after", "thread_cpu"}
    assert all(v > 0 for v in phases.values())
    assert by_mode["nocapture"]["phases_mean_us"]["calls"] == 2
    assert "capture" not in by_mode["nocapture"]["phases_mean_us"]
    total = sum(v for k, v in phases.items() if k not in ("calls", "thread_cpu"))
    assert total * 3 <= hook._timing.total_ns / 1e3 + 1e-6
    # and the producer's share of it, cut the same way (cumulative ns over its captures):
    # three deferred captures, staged, then written as one entry
    hook.producer.flush(timeout_s=10)
    st = hook.producer.stats()
    assert st["stagings"] == 3 and st["captures"] == 1 and st["stage_writes"] == 1
    assert all(st[f"time_{p}_ns"] > 0 for p in ("stage", "plan", "reserve", "copy"))


def test_without_hscapture_hook_phases_the_hook_keeps_no_phase_timing(rig, monkeypatch,
                                                                      tmp_path):
    """The per-phase clocks cost several microseconds a capturing forward (two thread-CPU
    clock reads, each a syscall): only a run that asks for them (``HSCAPTURE_HOOK_PHASES=1``
    with a stats file) pays them. A benchmark's mode file and stats file alone do not, so a
    throughput benchmark measures the hook as it runs in production: its wall time per call
    only, and the producer counts no ``time_*`` stages."""
    monkeypatch.setenv("HSCAPTURE_EXPERIMENT_FILE", str(tmp_path / "mode"))
    monkeypatch.setenv("HSCAPTURE_STATS_FILE", str(tmp_path / "stats.json"))
    monkeypatch.delenv("HSCAPTURE_HOOK_PHASES", raising=False)
    hook, sub, srv = rig()
    r = srv.new_req("hscap-untimed", 9)
    srv.extend([(r, 0, 9)])
    check(sub.get(r.rid, timeout=10), srv, r)
    assert hook._timing.phases is False and hook.producer.timed is False
    on = hook._timing.summary()["by_mode"][""]
    assert on["hook"]["n"] == 1 and on["phases_mean_us"] == {}
    assert not any(k.startswith("time_") for k in hook.producer.stats())


def test_hscapture_hook_profile_writes_a_cprofile_of_the_hook_calls_only(rig, monkeypatch,
                                                                          tmp_path):
    """``HSCAPTURE_HOOK_PROFILE=FILE`` (a diagnostic) profiles each hook call and nothing
    between them: at close the file names the number of calls profiled and the hook's own
    functions, sorted by own and by cumulative time; the samples are captured as without it."""
    out = tmp_path / "hook-profile.txt"
    monkeypatch.setenv("HSCAPTURE_HOOK_PROFILE", str(out))
    monkeypatch.delenv("HSCAPTURE_STATS_FILE", raising=False)
    hook, sub, srv = rig()
    capture_whole(sub, srv, "hscap-prof-", 3, 9)
    hook.close()
    text = out.read_text()
    assert text.startswith("hook calls profiled: 3\n"), text[:200]
    assert "(process)" in text and "capture_rows" in text
    assert "Ordered by: internal time" in text and "Ordered by: cumulative time" in text


def test_under_torch_profiler_each_hook_call_is_one_named_range(rig):
    """While torch's profiler records (SGLang's /start_profile), every hook call shows up as
    one ``hscapture.hook`` range, so a server trace says how long the hook took per forward;
    outside a profile nothing is recorded (the check is one C call)."""
    from torch.profiler import ProfilerActivity, profile

    hook, sub, srv = rig()
    a = srv.new_req("hscap-outside", 9)
    srv.extend([(a, 0, 9)])
    check(sub.get(a.rid, timeout=10), srv, a)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(2):
            r = srv.new_req(f"hscap-profiled-{i}", 9)
            srv.extend([(r, 0, 9)])
    names = [e.name for e in prof.events() if e.name == "hscapture.hook"]
    assert len(names) == 2
    for i in range(2):
        r_id = f"hscap-profiled-{i}"
        assert sub.get(r_id, timeout=10).num_tokens == 9


def test_the_benchmarks_grace_mode_sets_the_producers_commit_grace_and_nothing_else(
        rig, tmp_path, monkeypatch):
    """``grace=S`` (bench_server's ``on:grace=S``) captures exactly with the producer's commit
    grace at S seconds; a malformed or negative S, and leaving the mode, restore the hook's
    default (longer than a forward step, and than the pass log's interval: commit_grace_for)."""
    from hscapture.sglang.hook import COMMIT_GRACE_S, commit_grace_for

    mode = tmp_path / "mode"
    monkeypatch.setenv("HSCAPTURE_EXPERIMENT_FILE", str(mode))
    hook, sub, srv = rig()
    default = commit_grace_for(hook.config)
    assert default >= max(COMMIT_GRACE_S, 2 * hook.config.pass_log_interval_s)
    assert hook.producer.commit_grace_s == default

    def run(name: str, rid: str) -> float:
        set_mode(hook, mode, name)
        r = srv.new_req(rid, 9)
        srv.extend([(r, 0, 9)])
        check(sub.get(r.rid, timeout=10), srv, r)
        return hook.producer.commit_grace_s

    assert run("grace=0.005", "hscap-g1") == 0.005
    assert run("grace=oops", "hscap-g2") == default
    assert run("grace=-1", "hscap-g3") == default
    assert run("grace=0.2", "hscap-g4") == 0.2
    assert run("", "hscap-g5") == default


def test_the_hook_publishes_at_most_once_per_interval_and_its_interval_mode_sets_it(
        rig, tmp_path, monkeypatch):
    """The hook's producer coalesces the scheduler thread's publishing (PUBLISH_INTERVAL_S):
    prefills inside the interval queue their entries, the first forward after it (a prefill
    or a decode step) announces them all, each sample exact and once. ``interval=S``
    (bench_server's ``on:interval=S``) sets the interval; malformed, negative, or leaving the
    mode restores the default."""
    import threading

    from hscapture.sglang.hook import PUBLISH_INTERVAL_S

    mode = tmp_path / "mode"
    monkeypatch.setenv("HSCAPTURE_EXPERIMENT_FILE", str(mode))
    hook, sub, srv = rig()
    p = hook.producer
    assert p.publish_interval_s == PUBLISH_INTERVAL_S > 0
    p.commit_grace_s = 30.0          # the publisher thread stays out of it
    p.stage_interval_s = 0.0         # one entry per forward: this is about publishing
    set_mode(hook, mode, "interval=30")
    by: list[tuple[str, str]] = []
    real = p._publish

    def publish(item):
        by.append((threading.current_thread().name, item.rows[0]["rid"] if item.rows else ""))
        return real(item)
    p._publish = publish
    reqs = [srv.new_req(f"hscap-iv{i}", 9) for i in range(4)]
    for r in reqs:
        srv.extend([(r, 0, 9)])
    assert p.publish_interval_s == 30.0
    assert [rid for _, rid in by] == ["hscap-iv0"]      # the first publishes, the rest queue
    srv.decode(reqs)                                     # inside the interval: nothing
    assert len(by) == 1
    set_mode(hook, mode, "interval=0")          # the interval has passed
    srv.decode(reqs)                       # (a decode step reads the mode too: 0 s now)
    last = srv.new_req("hscap-iv-last", 9)
    srv.extend([(last, 0, 9)])
    assert [rid for _, rid in by] == [f"hscap-iv{i}" for i in range(4)] + ["hscap-iv-last"]
    assert {t for t, _ in by} == {threading.main_thread().name}
    for r in reqs + [last]:
        check(sub.get(r.rid, timeout=10), srv, r)
    for name, want in (("interval=oops", PUBLISH_INTERVAL_S), ("interval=-1", PUBLISH_INTERVAL_S),
                       ("interval=0.5", 0.5), ("", PUBLISH_INTERVAL_S)):
        set_mode(hook, mode, name)
        r = srv.new_req(f"hscap-ivm{len(by)}", 9)
        srv.extend([(r, 0, 9)])
        assert p.publish_interval_s == want, name
    p.flush(timeout_s=10)


def test_the_publish_interval_comes_from_the_environment_and_a_mode_leaves_back_to_it(
        rig, tmp_path, monkeypatch):
    """``HSCAPTURE_PUBLISH_INTERVAL_MS`` sets the hook's producer's interval (0: publish at
    every forward, each sample announced by the capture after it or the next decode step);
    leaving a benchmark mode restores that value, not the built-in default."""
    mode = tmp_path / "mode"
    monkeypatch.setenv("HSCAPTURE_EXPERIMENT_FILE", str(mode))
    hook, sub, srv = rig(env={"HSCAPTURE_PUBLISH_INTERVAL_MS": "0"})
    p = hook.producer
    assert p.publish_interval_s == 0.0 and hook.config.publish_interval_s == 0.0
    p.commit_grace_s = 30.0          # a sample must come from the scheduler thread's publish
    a = srv.new_req("hscap-iv-env", 9)
    srv.extend([(a, 0, 9)])
    srv.decode([a])
    check(sub.get(a.rid, timeout=10), srv, a)
    for name, want in (("interval=0.25", 0.25), ("", 0.0)):
        set_mode(hook, mode, name)
        r = srv.new_req(f"hscap-iv-env-{want}", 9)
        srv.extend([(r, 0, 9)])
        assert p.publish_interval_s == want, name
    p.flush(timeout_s=10)


def test_a_decode_step_announces_what_the_last_prefill_left_pending(rig):
    """A forward that captures nothing (a decode step, a prefill of requests that did not opt
    in) publishes completed entries on the scheduler's thread, so a sample is announced at the
    next step once the publish interval passed (0 here: the next step), not after the
    producer's commit grace (30 s here: a timeout would show)."""
    import threading

    hook, sub, srv = rig()
    hook.producer.commit_grace_s = 30.0
    hook.producer.publish_interval_s = 0.0
    hook.producer.stage_interval_s = 0.0      # one entry per forward: this is about publishing
    by: list[str] = []
    real = hook.producer._publish

    def publish(item):
        by.append(threading.current_thread().name)
        return real(item)
    hook.producer._publish = publish
    a = srv.new_req("hscap-pending", 9)
    with hook.producer._pubq.send_lock:        # the capture's own inline publish cannot run
        srv.extend([(a, 0, 9)])
    assert by == []
    srv.decode([a])
    check(sub.get(a.rid, timeout=10), srv, a)
    b = srv.new_req("hscap-pending-2", 9)
    with hook.producer._pubq.send_lock:
        srv.extend([(b, 0, 9)])
    srv.extend([(srv.new_req("plain-request", 5), 0, 5)])   # opted out: captures nothing
    check(sub.get(b.rid, timeout=10), srv, b)
    assert by == [threading.main_thread().name] * 2, by


def test_token_ids_come_from_each_requests_own_array_and_the_devids_mode_from_the_device(
        rig, tmp_path, monkeypatch):
    """By default the token ids come from each request's host fill ids (SGLang's
    array('q'), the array its batch input_ids are built from), written into the entry by the
    CPU, with no torch op; the benchmark mode ``devids`` takes them from the batch's device
    input_ids instead. Whole and chunked samples, several rows per forward, are exact either
    way, and the two paths agree byte for byte."""
    mode = tmp_path / "mode"
    monkeypatch.setenv("HSCAPTURE_EXPERIMENT_FILE", str(mode))
    mode.write_text("")
    hook, sub, srv = rig()
    a = srv.new_req("hscap-host-a", 23)
    b = srv.new_req("hscap-host-b", 5)
    srv.extend([(a, 0, 10), (b, 0, 5)])
    srv.extend([(a, 10, 13)])
    got_a = sub.get(a.rid, timeout=10)
    check(got_a, srv, a)
    check(sub.get(b.rid, timeout=10), srv, b)
    hook.producer.flush(timeout_s=10)
    # (entries written with host ids: the two forwards were staged as one entry)
    host = hook.producer.stats().get("host_id_captures", 0)
    assert host >= 1
    set_mode(hook, mode, "devids")
    c = srv.new_req("hscap-device-c", 9)
    srv.extend([(c, 0, 9)])
    check(sub.get(c.rid, timeout=10), srv, c)
    assert hook.producer.stats().get("host_id_captures", 0) == host   # the device path
    # back to the default, a request whose ids are not an array('q') (a plain list) sends its
    # whole batch to the device ids, still exact
    set_mode(hook, mode, "")
    d = srv.new_req("hscap-list-d", 7)
    e = srv.new_req("hscap-array-e", 6)
    d.full_untruncated_fill_ids = list(d.full_untruncated_fill_ids)
    srv.extend([(d, 0, 7), (e, 0, 6)])
    check(sub.get(d.rid, timeout=10), srv, d)
    check(sub.get(e.rid, timeout=10), srv, e)
    assert hook.producer.stats().get("host_id_captures", 0) == host
    srv.extend([(srv.new_req("hscap-array-f", 5), 0, 5)])
    hook.producer.flush(timeout_s=10)         # (deferred: written as an entry by now)
    assert hook.producer.stats().get("host_id_captures", 0) == host + 1
    assert hook.counters["errors"] == 0


def test_the_forward_log_records_every_pass_in_every_mode_with_its_tokens_and_rows(
        rig, tmp_path, monkeypatch):
    """HSCAPTURE_FORWARD_LOG: one record per forward pass whatever the mode (capture on, a
    pass with nothing opted in, ``noop``, a DECODE pass), in call order, on the clock a client
    reads (``time.perf_counter``), with the batch's token count, the rows captured and whether
    it was a prefill; flushed with each stats report and read back whole."""
    from hscapture.sglang.timing import read_forward_log

    mode, log = tmp_path / "mode", tmp_path / "forwards.bin"
    monkeypatch.setenv("HSCAPTURE_EXPERIMENT_FILE", str(mode))
    monkeypatch.setenv("HSCAPTURE_STATS_FILE", str(tmp_path / "stats.json"))
    monkeypatch.setenv("HSCAPTURE_FORWARD_LOG", str(log))
    hook, sub, srv = rig()
    t_a = time.perf_counter_ns()
    a, b = srv.new_req("hscap-log-a", 9), srv.new_req("hscap-log-b", 14)
    plain = srv.new_req("plain-log", 6)
    srv.extend([(a, 0, 9), (plain, 0, 6), (b, 0, 10)])      # 25 tokens, 2 rows captured
    srv.extend([(b, 10, 4)], decode=[plain])                 # MIXED: 4 + 1 tokens, 1 row
    srv.decode([plain, a])                                   # DECODE: 2 requests
    srv.extend([(srv.new_req("plain-only", 7), 0, 7)])       # nothing opted in
    set_mode(hook, mode, "noop")
    srv.extend([(srv.new_req("hscap-noop", 5), 0, 5)])       # the hook returns at once
    hook._write_stats()
    t_b = time.perf_counter_ns()
    got = read_forward_log(str(log))
    assert [(int(r["tokens"]), int(r["rows"]), int(r["extend"])) for r in got] == \
        [(25, 2, 1), (5, 1, 1), (2, 0, 0), (7, 0, 1), (5, 0, 1)]
    assert (np.diff(got["t_ns"]) > 0).all() and t_a <= got["t_ns"][0] <= got["t_ns"][-1] <= t_b
    assert (got["hook_ns"] > 0).all() and (got["hook_ns"] < t_b - t_a).all()
    import lzma   # the results folders keep the logs xz-compressed: read back the same
    (tmp_path / "forwards.bin.xz").write_bytes(lzma.compress(log.read_bytes()))
    assert (read_forward_log(str(tmp_path / "forwards.bin.xz")) == got).all()
    check(sub.get(a.rid, timeout=10), srv, a)
    check(sub.get(b.rid, timeout=10), srv, b)


def test_alt_mode_captures_n_prefill_passes_then_skips_n_like_off_and_logs_each_side(
        rig, tmp_path, monkeypatch):
    """Benchmark mode ``alt=N`` (bench_server --alt): prefill passes are captured in blocks
    of N and the next N skipped, in turn; a DECODE pass takes its block's side without
    counting. The forward log's ``phase`` says each pass's side (1 captured, 2 skipped, 0
    outside the mode). A skipped pass publishes nothing: its opted-in requests are neither
    delivered nor reported, and the captured ones arrive exact. Meanwhile the producer's
    commit grace and heartbeat are ALT_QUIET_S (the publisher thread stays out of the
    skipped blocks); another mode restores both."""
    from hscapture.sglang.hook import commit_grace_for
    from hscapture.sglang.modes import ALT_QUIET_S
    from hscapture.sglang.timing import read_forward_log

    mode, log = tmp_path / "mode", tmp_path / "forwards.bin"
    monkeypatch.setenv("HSCAPTURE_EXPERIMENT_FILE", str(mode))
    monkeypatch.setenv("HSCAPTURE_STATS_FILE", str(tmp_path / "stats.json"))
    monkeypatch.setenv("HSCAPTURE_FORWARD_LOG", str(log))
    hook, sub, srv = rig()
    heartbeat = hook.producer.heartbeat_interval_s
    reqs = [srv.new_req(f"hscap-alt-{i}", 5 + i) for i in range(6)]
    srv.extend([(reqs[0], 0, 5)])                       # before the mode: phase 0
    set_mode(hook, mode, "alt=2")
    srv.extend([(reqs[1], 0, 6)])                       # captured
    assert hook.producer.commit_grace_s == ALT_QUIET_S
    assert hook.producer.heartbeat_interval_s == ALT_QUIET_S
    srv.extend([(reqs[2], 0, 7)])                       # captured
    srv.decode([reqs[0]])                               # the skipped block's side, uncounted
    srv.extend([(reqs[3], 0, 8)])                       # skipped
    srv.extend([(reqs[4], 0, 9)])                       # skipped
    srv.extend([(reqs[5], 0, 10)])                      # captured
    set_mode(hook, mode, "")
    srv.extend([(srv.new_req("plain-after", 4), 0, 4)])
    assert hook.producer.commit_grace_s == commit_grace_for(hook.config)
    assert hook.producer.heartbeat_interval_s == heartbeat
    hook._write_stats()
    got = read_forward_log(str(log))
    assert [int(p) for p in got["phase"]] == [0, 1, 1, 2, 2, 2, 1, 0]
    assert [int(r) for r in got["rows"]] == [1, 1, 1, 0, 0, 0, 1, 0]
    for i in (0, 1, 2, 5):
        check(sub.get(reqs[i].rid, timeout=10), srv, reqs[i])
    hook.producer.flush(timeout_s=10)
    assert sub.poll(timeout=0.3) is None
    st = sub.stats()
    assert not st["dropped"] and not st["incomplete"] and not st["rejected"]
    assert hook.producer.stats()["next_seq"] == 4        # nothing numbered for 3 and 4
    assert hook.counters["errors"] == 0


def test_turn_costs_charge_gc_runs_and_publisher_time_to_the_side_whose_turn_they_fell_in(
        rig, tmp_path, monkeypatch):
    """``HSCAPTURE_TURN_COSTS=1`` (a diagnostic, with a stats file): each turn (one hook call's
    start to the next one's) is counted for its pass's mode and ``alt=N`` side, a garbage
    collection is charged to the turn it ran in (here one forced after a captured pass and
    two after a skipped one), and the publisher thread's CPU time is read per turn."""
    import gc
    import json

    mode, stats = tmp_path / "mode", tmp_path / "stats.json"
    monkeypatch.setenv("HSCAPTURE_EXPERIMENT_FILE", str(mode))
    monkeypatch.setenv("HSCAPTURE_STATS_FILE", str(stats))
    monkeypatch.setenv("HSCAPTURE_TURN_COSTS", "1")
    hook, sub, srv = rig()
    set_mode(hook, mode, "alt=1")
    reqs = [srv.new_req(f"hscap-costs-{i}", 5) for i in range(4)]
    was_enabled = gc.isenabled()
    gc.disable()          # only the collections forced here (callbacks still run for them)
    try:
        srv.extend([(reqs[0], 0, 5)])                   # captured
        gc.collect()                                    # in the captured pass's turn
        srv.extend([(reqs[1], 0, 5)])                   # skipped
        gc.collect()
        gc.collect()
        srv.extend([(reqs[2], 0, 5)])                   # captured
        srv.extend([(reqs[3], 0, 5)])                   # skipped: ends the captured turn
    finally:
        if was_enabled:
            gc.enable()
    hook._write_stats()
    costs = json.loads(stats.read_text())["turn_costs"]
    cap, skp = costs["alt=1|1"], costs["alt=1|2"]
    assert cap["turns"] == 2 and skp["turns"] == 1, costs
    assert cap["gc_runs"][2] == 1 and skp["gc_runs"][2] == 2, costs
    assert cap["gc_us_per_turn"] > 0 and skp["gc_gen2_us_per_turn"] > 0
    assert cap["publisher_us_per_turn"] >= 0 and skp["publisher_us_per_turn"] >= 0
    check(sub.get(reqs[0].rid, timeout=10), srv, reqs[0])
    hook.close()
    assert hook._costs._on_gc not in gc.callbacks
