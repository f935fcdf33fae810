"""The hook's pass log (``HSCAPTURE_PASS_LOG_MS``): a prefill pass only reads what changes after
it and is processed later with the passes around it. Every outcome a subscriber sees is the one
the hook gives when it processes each pass at once (tests/sglang/test_sglang_hook.py, whose rig
turns the log off): exact samples, restarts, aborts and sweeps reported, no duplicate; and
nothing is held forever (the producer's publisher thread hands the log over once forwards
stop, its flush and close do at once)."""

from __future__ import annotations

import pytest

pytest.importorskip("sglang")  # local convenience only: CI installs sglang

from hscapture.errors import IncompleteSampleError, SampleTimeoutError  # noqa: E402

from sglang_support import chunks  # noqa: E402
from test_sglang_hook import check  # noqa: E402

LOG = {"HSCAPTURE_PASS_LOG_MS": "50"}


@pytest.fixture(params=[False, True], ids=["eager", "graph"])
def rig(rig, request):
    """Every test of this module twice: the forwards' outputs as an eager forward hands them
    out (a logged pass keeps them referenced), and as CUDA-graph replays do (a logged pass
    copies its rows into the log's arena, and a drain captures the arena's rows in one
    call: hscapture.sglang.log_batch)."""
    def _rig(**kwargs):
        hook, sub, srv = rig(**kwargs)
        srv.graph = request.param
        return hook, sub, srv
    return _rig


def _in_flight(hook, srv, rid, n, first, graph=None):
    """A request of ``n`` tokens whose first chunk (``first`` tokens) was processed at once:
    it is in flight; the log then holds passes for an hour (until a drain is forced)."""
    r = srv.new_req(rid, n)
    hook.pass_log_interval_s = 0.0
    srv.extend([(r, 0, first)], graph=graph)
    hook.pass_log_interval_s = 3600.0
    return r


def test_logged_passes_are_held_then_processed_together_and_every_sample_is_exact(rig):
    hook, sub, srv = rig(env=LOG)
    a = srv.new_req("hscap-a", 23)
    b = srv.new_req("hscap-b", 5)
    plain = srv.new_req("not-captured", 9)
    c = srv.new_req("anything", 7, custom_params={"hscapture": True})
    srv.extend([(a, 0, 10), (plain, 0, 9), (b, 0, 5)])
    st = hook.stats()
    assert st["logged_passes"] == 1 and st["logged_rows"] == 2, st
    assert hook.producer.stats().get("staged_rows", 0) == 0     # held by the hook alone
    b.output_ids.append(1); plain.output_ids.append(2)
    b.refresh_fill_ids(); plain.refresh_fill_ids()
    srv.extend([(a, 10, 10), (c, 0, 7)], decode=[b, plain])
    srv.decode([b, plain])
    srv.extend([(a, 20, 3)], pad=5, graph=True)
    for req in (a, b, c):
        s = sub.get(req.rid, timeout=10)        # handed over by the producer's publisher
        check(s, srv, req)
        assert s.meta["extra"]["attempt"] == 0
        s.release()
    with pytest.raises(SampleTimeoutError):
        sub.get("not-captured", timeout=0.3)
    hook.producer.flush()
    st = hook.stats()
    assert st["samples"] == 3 and st["chunks"] == 5 and st.get("errors", 0) == 0, st
    assert st["logged_passes"] == 0


def test_a_logged_pass_of_graph_outputs_copies_its_rows_at_the_pass(rig):
    """CUDA-graph outputs are overwritten by the next replay: a logged pass copies the rows
    covering its wanted ones during the call (here the outputs are wiped right after it)."""
    hook, sub, srv = rig(env=LOG)
    plain, after = srv.new_req("not-captured", 6), srv.new_req("not-captured-2", 5)
    r1, r2 = srv.new_req("hscap-g1", 9), srv.new_req("hscap-g2", 4)
    # rows that did not opt in before and after the captured ones: only [6, 19) is copied
    srv.extend([(plain, 0, 6), (r1, 0, 9), (r2, 0, 4), (after, 0, 5)], graph=True)
    lo = srv._result.logits_output
    lo.hidden_states.fill_(float("nan"))
    lo.last_hidden_states.fill_(float("nan"))
    assert hook.stats()["logged_passes"] == 1
    for r in (r1, r2):
        check(sub.get(r.rid, timeout=10), srv, r)


def test_a_logged_retraction_mid_prefill_restarts_and_yields_one_sample(rig):
    hook, sub, srv = rig(env=LOG)
    r = srv.new_req("hscap-retract", 20)
    srv.extend([(r, 0, 8)])
    r.reset_for_retract()
    r.init_next_round_input(None)
    for start, size in chunks(20, 8):
        srv.extend([(r, start, size)])
    s = sub.get(r.rid, timeout=10)
    check(s, srv, r)
    assert s.meta["extra"]["attempt"] == 1
    hook.producer.flush()
    assert hook.stats()["restarts"] == 1


def test_a_logged_reprefill_after_a_complete_sample_publishes_no_duplicate(rig):
    hook, sub, srv = rig(env=LOG)
    r = srv.new_req("hscap-done", 9, max_new_tokens=8)
    srv.extend([(r, 0, 9)])
    check(sub.get(r.rid, timeout=10), srv, r)
    r.output_ids.extend([5, 6])
    r.reset_for_retract()
    r.init_next_round_input(None)
    srv.extend([(r, 0, len(r.full_untruncated_fill_ids))])
    hook.producer.flush()
    assert hook.stats()["reprefill_skipped"] == 1
    assert sub.poll(timeout=0.5) is None


def test_a_logged_abort_between_chunks_is_reported_and_its_batch_mate_exact(rig):
    hook, sub, srv = rig(env=LOG)
    r = srv.new_req("hscap-abort", 30)
    other = srv.new_req("hscap-other", 4)
    srv.extend([(r, 0, 10)])
    r.set_finish_with_abort("client went away")   # read at the pass: the stub forward
    r.init_next_round_input(None)
    srv.extend([(r, 0, 1), (other, 0, 4)])
    with pytest.raises(IncompleteSampleError, match="abort"):
        sub.get(r.rid, timeout=10)
    check(sub.get(other.rid, timeout=10), srv, other)


def test_the_sweep_reports_a_request_stopped_between_chunks_at_once_and_leaves_the_log_alone(
        rig):
    """SGLang runs the chunked-abort step (the sweep hook) at EVERY scheduling step. It once
    processed the log there each time, so the log never held more than one pass and its
    processing ran outside the forward hook; now a step only looks at the requests in
    flight: one that stopped is reported at that step, the log is left as it is."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    hook, sub, srv = rig(env=LOG)
    r = _in_flight(hook, srv, "hscap-gone", 30, 10)
    other = srv.new_req("hscap-other", 6)
    srv.extend([(other, 0, 6)])               # logged
    for _ in range(100):
        hook.sweep()                          # the scheduler's steps: nothing stopped
    assert hook.stats()["logged_passes"] == 1 and hook.stats().get("aborted", 0) == 0
    r.finished_reason = FINISH_ABORT("aborted between chunks")
    hook.sweep()                              # the step that aborts it
    st = hook.stats()
    assert st["aborted"] == 1 and st["logged_passes"] == 1 and st["sweep_calls"] == 101, st
    with pytest.raises(IncompleteSampleError, match="abort"):
        sub.get(r.rid, timeout=10)
    hook.producer.flush()
    check(sub.get(other.rid, timeout=10), srv, other)


def test_a_stopped_request_with_a_chunk_in_the_log_is_reported_once_the_log_is_processed(rig):
    """The logged chunk may be the request's last: the step leaves it; processing the log
    (here the producer's flush: a forward, the publisher thread once forwards stop and close
    do the same) captures the chunk, then reports the request, whose last chunk never came."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    hook, sub, srv = rig(env=LOG)
    r = _in_flight(hook, srv, "hscap-gone", 30, 10)
    srv.extend([(r, 10, 10)])                 # its second chunk, logged
    r.finished_reason = FINISH_ABORT("aborted between chunks")
    hook.sweep()
    st = hook.stats()
    assert st["logged_passes"] == 1 and st.get("aborted", 0) == 0, st
    hook.producer.flush()                     # the log first, then the sweep
    st = hook.stats()
    assert st["logged_passes"] == 0 and st["aborted"] == 1 and st["chunks"] == 2, st
    with pytest.raises(IncompleteSampleError, match="abort"):
        sub.get(r.rid, timeout=10)


def test_a_stopped_request_whose_last_chunk_is_in_the_log_arrives_whole(rig):
    """A request finishing right after its last chunk (max_new_tokens=1, the capture
    workload) is not reported by the step that sees it finished while that chunk is logged:
    the sample arrives whole."""
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH

    hook, sub, srv = rig(env=LOG)
    r = srv.new_req("hscap-done", 20)
    hook.pass_log_interval_s = 0.0
    srv.extend([(r, 0, 10)])
    hook.pass_log_interval_s = 3600.0
    srv.extend([(r, 10, 10)])                 # its last chunk, logged
    r.finished_reason = FINISH_LENGTH(length=1)
    hook.sweep()
    hook.producer.flush()
    assert hook.stats().get("aborted", 0) == 0
    check(sub.get(r.rid, timeout=10), srv, r)


def test_the_log_holds_at_most_max_logged_passes_whatever_its_interval(rig):
    from hscapture.sglang import hook as hook_mod

    hook, sub, srv = rig(env=LOG)
    hook.pass_log_interval_s = 3600.0
    reqs = [srv.new_req(f"hscap-many-{i}", 3) for i in range(hook_mod._MAX_LOGGED + 1)]
    for i, r in enumerate(reqs):
        srv.extend([(r, 0, 3)])
        assert hook.stats()["logged_passes"] == (i + 1) % hook_mod._MAX_LOGGED
    hook.producer.flush()         # the last one: its interval is an hour
    for r in reqs:
        check(sub.get(r.rid, timeout=10), srv, r)


def test_the_log_holds_at_most_a_sixteenth_of_the_ring_in_referenced_outputs(rig):
    """Logged passes keep their outputs referenced (or their copies): past 1/16 of the ring
    (the stage's own bound) the log is processed whatever its interval."""
    hook, sub, srv = rig(env=dict(LOG, HSCAPTURE_RING_BYTES="2M"))   # bound: 128 KiB
    hook.pass_log_interval_s = 3600.0
    big = [srv.new_req(f"hscap-big-{i}", 600) for i in range(2)]    # 75 KiB of outputs each
    srv.extend([(big[0], 0, 600)])
    assert hook.stats()["logged_passes"] == 1
    srv.extend([(big[1], 0, 600)])
    assert hook.stats()["logged_passes"] == 0           # over the bound: processed
    for r in big:
        check(sub.get(r.rid, timeout=10), srv, r)


def test_passes_logged_before_the_hook_closes_are_captured(rig):
    hook, sub, srv = rig(env=LOG)
    hook.pass_log_interval_s = 3600.0
    hook.producer.commit_grace_s = 3600.0     # nothing but close() may hand them over
    r = srv.new_req("hscap-close", 11)
    srv.extend([(r, 0, 11)])
    assert hook.stats()["logged_passes"] == 1
    hook.close(timeout_s=10)
    check(sub.get(r.rid, timeout=10), srv, r)


def test_benchmark_mode_alt_with_log_sets_the_log_interval_for_that_mode_alone(
        rig, tmp_path, monkeypatch):
    """``alt=N,log=MS`` (bench_server --alt-log): the pass log's interval is MS for as long as
    the mode lasts (0: each pass processed at once), so windows with and without the log
    compare inside one server; plain ``alt=N`` and every other mode keep the configured one.
    Every captured sample arrives exact either way."""
    from test_sglang_hook import set_mode

    mode = tmp_path / "mode"
    monkeypatch.setenv("HSCAPTURE_EXPERIMENT_FILE", str(mode))
    hook, sub, srv = rig(env=LOG)
    reqs = [srv.new_req(f"hscap-altlog-{i}", 4 + i) for i in range(5)]
    set_mode(hook, mode, "alt=1,log=3600000")
    srv.extend([(reqs[0], 0, 4)])                      # captured, logged for an hour
    assert hook.pass_log_interval_s == 3600.0
    assert hook.stats()["logged_passes"] == 1
    srv.extend([(reqs[1], 0, 5)])                      # skipped: nothing processed
    assert hook.stats()["logged_passes"] == 1
    set_mode(hook, mode, "alt=1,log=0")
    srv.extend([(reqs[2], 0, 6)])                      # captured: the log, then this, at once
    assert hook.pass_log_interval_s == 0.0
    assert hook.stats()["logged_passes"] == 0
    set_mode(hook, mode, "alt=1")
    srv.extend([(reqs[3], 0, 7)])                      # skipped, the configured 50 ms again
    assert hook.pass_log_interval_s == 0.05
    set_mode(hook, mode, "")
    srv.extend([(reqs[4], 0, 8)])                      # captured as configured
    assert hook.pass_log_interval_s == 0.05
    hook.producer.flush(timeout_s=10)
    for i in (0, 2, 4):
        check(sub.get(reqs[i].rid, timeout=10), srv, reqs[i])
    assert hook.counters["errors"] == 0


def test_benchmark_mode_alt_leaves_the_captured_passes_work_out_of_skipped_blocks(
        rig, tmp_path, monkeypatch):
    """Under ``alt=N`` what a captured pass owes is paid in captured passes: the sweep hook,
    which SGLang runs at every scheduling step, does nothing after a skipped pass."""
    import time

    from sglang.srt.managers.schedule_batch import FINISH_ABORT
    from test_sglang_hook import set_mode

    mode = tmp_path / "mode"
    monkeypatch.setenv("HSCAPTURE_EXPERIMENT_FILE", str(mode))
    hook, sub, srv = rig(env=LOG)
    r = srv.new_req("hscap-altsweep", 30)
    set_mode(hook, mode, "alt=1,log=0")
    srv.extend([(r, 0, 10)])                   # captured, processed at once: r in flight
    srv.extend([(srv.new_req("hscap-altsweep-2", 5), 0, 5)])          # skipped
    r.finished_reason = FINISH_ABORT("aborted between chunks")
    hook.sweep()                               # after a skipped pass: nothing
    assert hook.stats().get("sweep_calls", 0) == 0 and hook.stats().get("aborted", 0) == 0
    hook._swept = time.monotonic()             # (the forward's own sweep: not due)
    y = srv.new_req("hscap-altsweep-3", 4)
    srv.extend([(y, 0, 4)])                    # captured
    hook.sweep()                               # after a captured pass: r reported
    st = hook.stats()
    assert st["sweep_calls"] == 1 and st["aborted"] == 1, st
    with pytest.raises(IncompleteSampleError, match="abort"):
        sub.get(r.rid, timeout=10)
    hook.producer.flush()
    check(sub.get(y.rid, timeout=10), srv, y)


def test_with_no_step_or_forward_after_it_the_publisher_reports_a_stop_left_to_the_log(rig):
    """The quiet end of a run: the stopped request's chunk is in the log and no scheduling
    step or forward comes; the producer's publisher thread hands the log over once the log's
    interval passed, and sweeps after it: the request is reported, never left pending."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    hook, sub, srv = rig(env=LOG)
    r = srv.new_req("hscap-quiet", 30)
    hook.pass_log_interval_s = 0.0
    srv.extend([(r, 0, 10)])                   # processed at once: r is in flight
    hook.pass_log_interval_s = 0.05
    srv.extend([(r, 10, 10)])                  # logged
    r.finished_reason = FINISH_ABORT("aborted between chunks")
    hook.sweep()                               # the last step: left to the log
    assert hook.stats()["logged_passes"] == 1
    with pytest.raises(IncompleteSampleError, match="abort"):
        sub.get(r.rid, timeout=15)             # nothing else runs in this process
    assert hook.stats()["logged_passes"] == 0 and hook.stats()["chunks"] == 2


def test_the_publisher_thread_leaves_a_due_log_to_the_forwards_while_they_come(rig):
    """While forwards keep coming, a due log is processed by the next one (the forward hook),
    never by the producer's publisher thread (``_upstream(idle=True)``), which would take the
    GIL and the hook's lock in the middle of a turn; once no forward came for the log's
    interval, the publisher thread processes it. Time is moved by the hook's clocks, not by
    sleeping."""
    import time

    hook, sub, srv = rig(env=LOG)
    hook.pass_log_interval_s = 3600.0            # (no drain by the forwards below)
    r = srv.new_req("hscap-busy", 8)
    srv.extend([(r, 0, 8)])                      # logged
    assert hook.stats()["logged_passes"] == 1
    hook.pass_log_interval_s = 30.0
    now = time.monotonic()
    hook._log_since = now - 60.0                 # the log is due
    hook._last_forward = now                     # a forward just came
    hook._upstream(idle=True)
    assert hook.stats()["logged_passes"] == 1    # left to the next forward
    hook._last_forward = now - 60.0              # no forward for a minute: stopped
    hook._upstream(idle=True)
    assert hook.stats()["logged_passes"] == 0
    check(sub.get(r.rid, timeout=10), srv, r)


def _wipe(srv):
    """What the next CUDA-graph replay does to the outputs a pass handed out."""
    lo = srv._result.logits_output
    lo.hidden_states.fill_(float("nan"))
    lo.last_hidden_states.fill_(float("nan"))


def test_graph_passes_of_one_drain_are_captured_in_one_call_each_sample_one_row(rig):
    """Chunked prompts over five graph passes (each pass's outputs wiped after it, rows that
    did not opt in between): the drain captures all of them in ONE producer call, a sample's
    chunks merged into one row, and every sample arrives exact."""
    hook, sub, srv = rig(env=LOG)
    hook.pass_log_interval_s = 3600.0
    a, b, c = (srv.new_req(f"hscap-merge-{x}", n) for x, n in (("a", 30), ("b", 7), ("c", 25)))
    plain = srv.new_req("not-captured", 40)
    passes = [[(a, 0, 12), (plain, 0, 5)],
              [(a, 12, 12), (plain, 5, 9)],
              [(a, 24, 6), (b, 0, 7), (c, 0, 3)],
              [(c, 3, 10), (plain, 14, 20)],
              [(c, 13, 12), (plain, 34, 6)]]
    for rows in passes:
        srv.extend(rows, graph=True)
        _wipe(srv)
    assert hook.stats()["logged_passes"] == 5
    hook.producer.flush()
    st = hook.stats()
    assert st["log_captures"] == 1 and st["chunks"] == 7 and st["samples"] == 3, st
    on = hook._timing.summary()["by_mode"][""]        # what bench_server prints per mode
    assert (on["capturing_calls"], on["producer_calls"]) == (5, 1)
    assert st["producer"]["staged_rows"] == 3           # one row per sample, its chunks merged
    for r in (a, b, c):
        check(sub.get(r.rid, timeout=10), srv, r)
    with pytest.raises(SampleTimeoutError):
        sub.get("not-captured", timeout=0.3)


def test_a_chunk_that_does_not_follow_its_rows_in_the_arena_starts_another_call(rig):
    """Two opted-in rows in a pass, the first one chunked: its next chunk is not right after
    its rows in the arena (its batch mate's are), so the batch so far is captured first and
    the chunk starts the next one. Both samples exact."""
    hook, sub, srv = rig(env=LOG)
    hook.pass_log_interval_s = 3600.0
    r, w = srv.new_req("hscap-gap-r", 20), srv.new_req("hscap-gap-w", 4)
    srv.extend([(r, 0, 8), (w, 0, 4)], graph=True)
    _wipe(srv)
    srv.extend([(r, 8, 12)], graph=True)
    _wipe(srv)
    hook.producer.flush()
    assert hook.stats()["log_captures"] == 2
    for x in (r, w):
        check(sub.get(x.rid, timeout=10), srv, x)


def _flush_with_capture_failing(hook, monkeypatch):
    """Flush the hook's log with every producer call raising (fault injected); returns what
    restores the producer's call."""
    real = hook.producer.capture_rows

    def broken(*args, **kwargs):
        raise RuntimeError("injected: the producer call failed")

    monkeypatch.setattr(hook.producer, "capture_rows", broken)
    hook.producer.flush()
    return lambda: monkeypatch.setattr(hook.producer, "capture_rows", real)


def _captures_again(hook, sub, srv, rid):
    """After a failure the hook goes on: a new request arrives exact."""
    n = srv.new_req(rid, 9)
    srv.extend([(n, 0, 9)], graph=True)
    hook.producer.flush()
    check(sub.get(n.rid, timeout=10), srv, n)


def test_a_failed_capture_of_the_drains_rows_reports_every_sample_in_it(rig, monkeypatch):
    """A producer call that raises (fault injected) loses the whole batch: each of its
    samples is reported by rid, the one whose last chunk was in it too, and the hook goes on
    capturing the next ones."""
    hook, sub, srv = rig(env=LOG)
    hook.pass_log_interval_s = 3600.0
    r, q = srv.new_req("hscap-fail-r", 20), srv.new_req("hscap-fail-q", 6)
    srv.extend([(r, 0, 10)], graph=True)
    srv.extend([(r, 10, 10), (q, 0, 6)], graph=True)
    restore = _flush_with_capture_failing(hook, monkeypatch)
    st = hook.stats()
    assert st["errors"] == 1 and st["aborted"] == 2 and st.get("samples", 0) == 0, st
    for x in (r, q):
        with pytest.raises(IncompleteSampleError, match="injected"):
            sub.get(x.rid, timeout=10)
    restore()
    _captures_again(hook, sub, srv, "hscap-fail-next")


def test_a_report_of_a_sample_outside_the_batch_leaves_the_batch_whole(rig):
    """A request that stopped between chunks is reported while the drain's rows wait to be
    captured: its own chunks are not among them, so the batch goes on (one call) and the
    report and the samples are what they would be otherwise."""
    hook, sub, srv = rig(env=LOG)
    x = _in_flight(hook, srv, "hscap-stopped", 30, 10, graph=True)
    a, b = srv.new_req("hscap-keep-a", 20), srv.new_req("hscap-keep-b", 6)
    srv.extend([(a, 0, 10)], graph=True)
    _wipe(srv)
    x.set_finish_with_abort("client went away")   # read at the pass: the stub forward
    x.init_next_round_input(None)
    srv.extend([(a, 10, 10), (x, 0, 1), (b, 0, 6)], graph=True)
    _wipe(srv)
    hook.producer.flush()
    st = hook.stats()
    assert st["log_captures"] == 1 and st["aborted"] == 1 and st["samples"] == 2, st
    with pytest.raises(IncompleteSampleError, match="abort"):
        sub.get(x.rid, timeout=10)
    for r in (a, b):
        check(sub.get(r.rid, timeout=10), srv, r)


def test_the_forwards_periodic_sweep_reports_a_stop_and_leaves_the_log_to_its_interval(rig):
    """The forward hook looks for stopped requests every 50 ms too (where no scheduling step
    runs). It reports one whose chunks were all processed at once and leaves the log alone:
    the log is processed by its own interval, its passes in one drain."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    hook, sub, srv = rig(env=LOG)
    x = _in_flight(hook, srv, "hscap-swept", 30, 10)
    a = srv.new_req("hscap-logged", 20)
    srv.extend([(a, 0, 10)])                   # logged
    x.finished_reason = FINISH_ABORT("aborted between chunks")
    hook._swept = 0.0                          # the forward's sweep is due
    srv.extend([(a, 10, 10)])
    st = hook.stats()
    assert st["aborted"] == 1 and st["logged_passes"] == 2, st
    with pytest.raises(IncompleteSampleError, match="abort"):
        sub.get(x.rid, timeout=10)
    hook.producer.flush()
    check(sub.get(a.rid, timeout=10), srv, a)


@pytest.mark.parametrize("seed", range(4))
def test_a_random_schedule_with_the_log_gives_every_sample_exact_or_reported_by_rid(rig, seed):
    """A scheduler's prefill passes as SGLang's PrefillAdder makes them (the chunked request
    first, then new ones until the token budget, the last one cut), with the pass log on:
    random budgets, opted-in and other requests, aborts of a request between its chunks (its
    1-token stub forward), retractions mid-prompt (re-prefilled from the start), drains at
    random points (a flush, a pass processed at once) and, under the ``graph`` parameter,
    each pass's outputs at random as CUDA-graph buffers wiped after it or as eager tensors
    (one drain then mixes arena passes and referenced ones). Every opted-in request arrives
    exact with its last attempt, or, aborted, is reported by rid; nothing else arrives."""
    import random

    hook, sub, srv = rig(env=LOG)
    rng = random.Random(seed)
    graphs = srv.graph
    hook.pass_log_interval_s = 3600.0
    queue = []
    for i in range(14):
        rid = f"hscap-rand-{seed}-{i}" if rng.random() < 0.8 else f"plain-{seed}-{i}"
        queue.append(srv.new_req(rid, rng.randint(1, 90)))
    wanted = [r for r in queue if r.rid.startswith("hscap-")]
    aborted, retracted = set(), {}
    chunked = None                      # (req, next position)
    while chunked is not None or queue:
        budget, rows = rng.randint(8, 64), []
        if chunked is not None:
            r, pos = chunked
            chunked = None
            fate = rng.random()
            if pos > 0 and fate < 0.12 and r.rid not in aborted:
                r.set_finish_with_abort("client went away")
                r.init_next_round_input(None)
                aborted.add(r.rid)
                rows.append((r, 0, 1))               # the stub forward; then it is gone
                budget -= 1
            else:
                if pos > 0 and fate < 0.24:
                    r.reset_for_retract()
                    r.init_next_round_input(None)
                    retracted[r.rid] = r.retraction_count
                    pos = 0
                n = min(budget, len(r.origin_input_ids) - pos)
                rows.append((r, pos, n))
                budget -= n
                if pos + n < len(r.origin_input_ids):
                    chunked = (r, pos + n)
        while budget > 0 and chunked is None and queue:
            r = queue.pop(0)
            n = min(budget, len(r.origin_input_ids))
            rows.append((r, 0, n))
            budget -= n
            if n < len(r.origin_input_ids):
                chunked = (r, n)
        graph = graphs and rng.random() < 0.7
        if rng.random() < 0.1:
            hook.pass_log_interval_s = 0.0           # this pass (and the log) processed now
        srv.extend(rows, graph=graph)
        hook.pass_log_interval_s = 3600.0
        if graph:
            _wipe(srv)
        if rng.random() < 0.08:
            hook.producer.flush()
    hook.producer.flush()
    for r in wanted:
        if r.rid in aborted:
            with pytest.raises(IncompleteSampleError):
                sub.get(r.rid, timeout=10)
            continue
        s = sub.get(r.rid, timeout=10)
        check(s, srv, r)
        assert s.meta["extra"]["attempt"] == retracted.get(r.rid, 0)
        s.release()
    assert sub.poll(timeout=0.3) is None, "nothing else arrives"
    st = hook.stats()
    assert st.get("errors", 0) == 0 and st["logged_passes"] == 0, st
    assert (st.get("log_captures", 0) > 0) == graphs, st      # the arena's batches ran


def test_logged_passes_with_a_mismatched_final_norm_or_none_are_exact_without_it(rig):
    """A ``last_hidden_states`` of the wrong width, too few rows or another dtype, logged
    (graph outputs: copied into an arena as they are) beside normal passes, and a server
    without final norm capture: each sample exact, ``final_norm`` left out where it cannot be
    captured, and the passes after them whole."""
    import torch

    from sglang_support import H

    hook, sub, srv = rig(env=LOG)
    hook.pass_log_interval_s = 3600.0
    bad = [torch.zeros(6, H + 1, dtype=srv.dtype), torch.zeros(2, H, dtype=srv.dtype),
           torch.zeros(6, H, dtype=torch.float64)]
    reqs = []
    for i, last in enumerate(bad):
        r = srv.new_req(f"hscap-badlast-{i}", 6)
        srv.extend([(r, 0, 6)], last_override=last)
        ok = srv.new_req(f"hscap-goodlast-{i}", 5)
        srv.extend([(ok, 0, 5)])
        reqs.append((r, ok))
    hook.producer.flush()
    for r, ok in reqs:
        s = sub.get(r.rid, timeout=10)
        want = srv.expected(r)
        assert set(s.tensors) == set(want) - {"final_norm"}
        for name, t in s.tensors.items():
            assert torch.equal(t, want[name]), name
        check(sub.get(ok.rid, timeout=10), srv, ok)
    nofn = srv.new_req("hscap-nolast", 7)
    srv.extend([(nofn, 0, 4)], last_hidden=False)
    srv.extend([(nofn, 4, 3)], last_hidden=False)
    hook.producer.flush()
    s = sub.get(nofn.rid, timeout=10)
    want = srv.expected(nofn)
    assert set(s.tensors) == set(want) - {"final_norm"}
    for name, t in s.tensors.items():
        assert torch.equal(t, want[name]), name


def test_a_logged_pass_of_a_subset_of_rows_is_reported_between_exact_passes(rig):
    """The checks of a pass's outputs hold for every logged pass, also one whose arena's
    layout an earlier pass's checks passed (graph outputs): hidden states of a subset of rows
    (``hidden_states_token_indices``) have that pass's request reported by rid, and the
    passes before and after it in the same log stay exact."""
    import torch

    hook, sub, srv = rig(env=LOG)
    hook.pass_log_interval_s = 3600.0
    a, b, c = (srv.new_req(f"hscap-subset-{x}", n) for x, n in (("a", 6), ("b", 5), ("c", 4)))
    srv.extend([(a, 0, 6)])
    plain = srv._result_for

    def subset(*args, **kwargs):
        res = plain(*args, **kwargs)
        res.logits_output.hidden_states_token_indices = torch.arange(2)
        return res

    srv._result_for = subset
    srv.extend([(b, 0, 5)])
    srv._result_for = plain
    srv.extend([(c, 0, 4)])
    assert hook.stats()["logged_passes"] == 3
    hook.producer.flush()
    with pytest.raises(IncompleteSampleError, match="subset of rows"):
        sub.get(b.rid, timeout=10)
    for r in (a, c):
        check(sub.get(r.rid, timeout=10), srv, r)


def test_a_report_whose_flush_fails_reports_the_sample_once(rig, monkeypatch):
    """A sample with a chunk in the drain's batch stops (aborted) in the next logged pass: its
    report first captures the batch (its chunks before its report), and that capture raises
    (fault injected). The sample is reported once, by the failed batch, not a second time by
    the report that flushed it; the hook goes on."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    hook, sub, srv = rig(env=LOG)
    hook.pass_log_interval_s = 3600.0
    r = srv.new_req("hscap-flushfail", 20)
    srv.extend([(r, 0, 10)], graph=True)
    r.finished_reason = FINISH_ABORT("aborted between chunks")
    srv.extend([(r, 10, 10)], graph=True)
    restore = _flush_with_capture_failing(hook, monkeypatch)
    st = hook.stats()
    assert st["aborted"] == 1, st
    with pytest.raises(IncompleteSampleError):
        sub.get(r.rid, timeout=10)
    restore()
    _captures_again(hook, sub, srv, "hscap-flushfail-next")


@pytest.fixture
def collections():
    """Every cyclic collection that starts, as whether a hook call of the scheduler's thread
    (the forward hook, the sweep) was on the stack; the threshold at 5 allocations meanwhile,
    so that any call building a few objects would start one (both restored after)."""
    import gc
    import sys

    from hscapture.sglang.hook import SGLangCaptureHook

    calls = {SGLangCaptureHook.__call__.__code__, SGLangCaptureHook.sweep.__code__}
    seen: list[bool] = []

    def started(phase, info):
        if phase == "start":
            f = sys._getframe(1)
            while f is not None and f.f_code not in calls:
                f = f.f_back
            seen.append(f is not None)

    old, was = gc.get_threshold(), gc.isenabled()
    gc.callbacks.append(started)
    gc.set_threshold(5)
    try:
        yield seen
    finally:
        gc.set_threshold(*old)
        gc.callbacks.remove(started)
        (gc.enable if was else gc.disable)()


def _logged_round(hook, srv, n):
    """Passes into the log, a drain (by the log's interval), steps: what allocates most."""
    reqs = [srv.new_req(f"hscap-gc-{n}-{i}", 40 + i) for i in range(6)]
    for lo in range(0, 40, 20):
        srv.extend([(r, lo, 20) for r in reqs])
        hook.sweep()
    hook.pass_log_interval_s = 0.0
    srv.extend([(r, 40, i) for i, r in enumerate(reqs) if i])   # due: the log is drained
    hook.sweep()
    hook.pass_log_interval_s = 0.05
    return reqs


def test_the_schedulers_hook_calls_never_run_the_garbage_collector_and_keep_it_on(
        rig, collections):
    """A hook call builds and frees hundreds of short-lived objects while it processes the log,
    and a collection they started ran inside the hook (~0.6 ms each in a real 1B-shape
    server). The calls hold the collector off and put it back on: collections run in the
    host's code, never inside the hook, and every sample is still exact."""
    import gc

    hook, sub, srv = rig(env=LOG)
    reqs = _logged_round(hook, srv, 0)
    assert gc.isenabled()
    assert collections and not any(collections), (
        f"{sum(collections)} of {len(collections)} collections started inside a hook call")
    hook.producer.flush()
    for r in reqs:
        check(sub.get(r.rid, timeout=10), srv, r)
    assert hook.stats().get("errors", 0) == 0


def test_a_collector_the_host_turned_off_stays_off_after_the_hooks_calls(rig, collections):
    import gc

    hook, sub, srv = rig(env=LOG)
    gc.disable()
    reqs = _logged_round(hook, srv, 1)
    assert not gc.isenabled() and not any(collections)   # (explicit gc.collect() calls run)
    hook.producer.flush()
    for r in reqs:
        check(sub.get(r.rid, timeout=10), srv, r)
