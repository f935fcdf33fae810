"""Random schedules through the real hook: exactly once, or reported, whatever SGLang does.

Hypothesis draws schedules of what SGLang 0.5.23 does to requests between and during prefill
passes, on its real ``Req`` / ``ScheduleBatch`` objects (``sglang_support.FakeModelServer``):
new requests, chunked passes of up to three requests with chunks of any size (MIXED with the
running requests' decode rows, padded as DP attention pads), requests whose first chunk starts
past a radix-cache hit, retractions mid-prefill and after a complete prefill (a re-prefill of
prompt + outputs), aborts by the 1-token stub forward and between chunks (the scheduler's
sweep), decode passes, requests that finish, and new requests reusing a finished or aborted
request's rid (a client's retry). A model of the schedule says what each request instance must
come to, and the subscriber's view is checked against it:

- every request whose prompt was prefilled whole (in its last attempt, never aborted first)
  arrives exactly once, its token ids and every layer bit-exact, in the order of its rid's
  instances; a retraction after that (and its re-prefill) publishes nothing more;
- a request aborted after a chunk of it was captured is reported incomplete, by rid, and
  nothing of it arrives; one aborted before any chunk may be reported, never delivered;
- a request whose prefill starts past a cached prefix is reported once a chunk of it was
  captured (its first positions were never computed), never delivered;
- nothing arrives for anything else, and nothing is rejected.

The end of each schedule is found without waiting on a clock: once its passes were processed
(the producer's flush, which processes the pass log and then reports the requests stopped with
a chunk in it), a marker request is prefilled, and one producer's entries reach a subscriber
in order, so once the marker's sample arrived every sample and report before it did. Each schedule runs with the pass log off and
on (its default), and with CUDA-graph outputs (rows copied into the log's arena) and without.

``HSCAPTURE_SCHEDULES=N`` draws N schedules per configuration (30 by default, ~3 s each
configuration on the 2-core CI machine); a soak: ``HSCAPTURE_SCHEDULES=2000 pytest
tests/sglang/test_hook_schedules.py``.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_support import FakeModelServer

MAX_PROMPT = 40
SCHEDULES = int(os.environ.get("HSCAPTURE_SCHEDULES", "30"))


@dataclass
class Inst:
    """One request object as the model sees it."""

    req: Any
    rid: str
    end: int                  # the prefill's length (prompt; prompt + outputs on a re-prefill)
    pos: int = 0              # where its next chunk starts
    captured: bool = False    # a chunk of its current attempt passed
    #: prefill (toward its sample), cached (toward a report: a radix-cache hit), reprefill
    #: (after a retraction of a complete one), done (decoding), aborted, finished
    state: str = "prefill"


@dataclass
class Model:
    """What the subscriber must see for one schedule."""

    samples: dict[str, list[tuple[list[int], dict[str, torch.Tensor]]]] = field(
        default_factory=dict)
    must_report: set[str] = field(default_factory=set)
    may_report: set[str] = field(default_factory=set)


def _schedule(data: Any, srv: FakeModelServer, hook: Any, tag: str) -> Model:
    """Play one drawn schedule; returns its model."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    model = Model()
    live: list[Inst] = []
    reusable: list[str] = []
    ids = itertools.count()

    def new(rid: str | None = None, cached: bool = False) -> None:
        rid = rid or f"hscap-{tag}-{next(ids)}"
        n = data.draw(st.integers(2 if cached else 1, MAX_PROMPT), label="prompt")
        req = srv.new_req(rid, n, max_new_tokens=8)
        inst = Inst(req, rid, n)
        if cached:      # a radix-cache hit: the prefill starts past the cached prefix
            inst.pos, inst.state = data.draw(st.integers(1, n - 1), label="cached"), "cached"
        live.append(inst)

    def prefilling() -> list[Inst]:
        return [i for i in live if i.state in ("prefill", "cached", "reprefill")]

    def run_pass(insts: list[Inst], whole: bool = False) -> None:
        rows = []
        for inst in insts:
            size = inst.end - inst.pos if whole else \
                data.draw(st.integers(1, inst.end - inst.pos), label="chunk")
            rows.append((inst.req, inst.pos, size))
            inst.pos += size
            inst.captured = True
            if inst.state == "cached":
                model.must_report.add(inst.rid)
        running = [i.req for i in live if i.state == "done"]
        decode = running if running and data.draw(st.booleans(), label="mixed") else ()
        srv.extend(rows, decode, pad=data.draw(st.sampled_from([0, 0, 3]), label="pad"))
        for inst in insts:
            if inst.pos == inst.end:
                if inst.state == "prefill":     # its sample is complete
                    model.samples.setdefault(inst.rid, []).append(
                        (list(inst.req.origin_input_ids), srv.expected(inst.req)))
                inst.state = "done"

    new()
    for _ in range(data.draw(st.integers(1, 30), label="steps")):
        action = data.draw(st.sampled_from(
            ["new", "pass", "pass", "pass", "retract", "abort_stub", "abort_between",
             "finish", "reuse", "decode", "cached"]), label="action")
        if action in ("new", "cached"):
            new(cached=action == "cached")
        elif action == "reuse" and reusable:
            new(reusable.pop(data.draw(st.integers(0, len(reusable) - 1), label="rid")))
        elif action == "pass" and prefilling():
            cands = prefilling()
            pick = data.draw(st.lists(st.integers(0, len(cands) - 1), min_size=1, max_size=3,
                                      unique=True), label="rows")
            run_pass([cands[k] for k in pick])
        elif action == "retract":
            cands = [i for i in live if i.state == "done" or
                     (i.state in ("prefill", "reprefill") and i.pos > 0)]
            if not cands:
                continue
            inst = data.draw(st.sampled_from(cands), label="retracted")
            if inst.state == "done":
                inst.req.output_ids.extend([5, 6])
                inst.state = "reprefill"
            inst.req.reset_for_retract()       # SGLang's retraction: retraction_count += 1
            inst.req.init_next_round_input(None)
            if inst.state == "reprefill":
                inst.end = len(inst.req.full_untruncated_fill_ids)
            inst.pos, inst.captured = 0, False
        elif action == "abort_stub" and prefilling():
            # SGLang's abort: a 1-token stub prompt and one last forward; never a sample
            inst = data.draw(st.sampled_from(prefilling()), label="aborted")
            inst.req.set_finish_with_abort("client went away")
            inst.req.init_next_round_input(None)
            srv.extend([(inst.req, 0, 1)])
            _aborted(model, inst)
            reusable.append(inst.rid)           # a client may retry with the same rid
        elif action == "abort_between" and prefilling():
            # process_pending_chunked_abort between chunks, then the scheduler's step
            inst = data.draw(st.sampled_from(prefilling()), label="aborted")
            inst.req.finished_reason = FINISH_ABORT("aborted between chunks")
            hook.sweep()
            _aborted(model, inst)
            reusable.append(inst.rid)
        elif action == "finish":
            done = [i for i in live if i.state == "done"]
            if done:
                inst = data.draw(st.sampled_from(done), label="finished")
                live.remove(inst)               # SGLang lets go of it
                reusable.append(inst.rid)
        elif action == "decode":
            running = [i.req for i in live if i.state == "done"]
            if running:
                srv.decode(running)
    while prefilling():                         # every prefill runs to its end
        run_pass(prefilling()[:3], whole=data.draw(st.booleans(), label="whole"))
    return model


def _aborted(model: Model, inst: Inst) -> None:
    if inst.state in ("prefill", "cached"):
        # a chunk of it captured: reported; none: nothing to report (it may be reported)
        (model.must_report if inst.captured else model.may_report).add(inst.rid)
    # a re-prefill's abort: its sample was delivered complete; nothing more, no report
    inst.state = "aborted"


@pytest.mark.parametrize("log_ms,graph", [("0", False), ("0", True), ("50", False),
                                          ("50", True)],
                         ids=["log-off", "log-off-graph", "log-on", "log-on-graph"])
def test_every_drawn_schedule_delivers_each_prefilled_request_once_or_reports_it(
        rig, log_ms: str, graph: bool) -> None:
    hook, sub, srv = rig(env={"HSCAPTURE_PASS_LOG_MS": log_ms})
    srv.graph = graph
    schedules = itertools.count()
    #: the schedules whose marker arrived: nothing of theirs may arrive after it. (Hypothesis
    #: abandons a schedule whose draws overrun its buffer: what it captured arrives in a
    #: later schedule's window, unchecked, since its model was never finished.)
    checked: set[str] = set()

    @settings(max_examples=SCHEDULES, deadline=None, database=None)
    @given(st.data())
    def one(data: Any) -> None:
        tag = f"{log_ms}-{int(graph)}-{next(schedules)}"
        model = _schedule(data, srv, hook, tag)
        # a pass log's passes captured, and then the requests stopped with a chunk in it
        # reported (the hook's sweep after processing the log); then the marker, after all
        hook.producer.flush(timeout_s=10)
        marker = srv.new_req(f"hscap-{tag}-marker", 3)
        srv.extend([(marker, 0, 3)])
        hook.producer.flush(timeout_s=10)
        got: dict[str, list[Any]] = {}
        while True:
            s = sub.poll(timeout=10)
            assert s is not None, f"the marker of schedule {tag} never arrived"
            if s.rid == marker.rid:
                s.release()
                break
            owner = s.rid.rsplit("-", 1)[0].removeprefix("hscap-")
            assert owner not in checked, f"{s.rid} arrived after its schedule's marker"
            if owner == tag:
                got.setdefault(s.rid, []).append(s)
            else:
                s.release()                    # an abandoned schedule's
        checked.add(tag)
        assert set(got) <= set(model.samples), \
            f"samples nobody prefilled whole: {sorted(set(got) - set(model.samples))}"
        for rid, want in model.samples.items():
            have = got.get(rid, [])
            assert len(have) == len(want), f"{rid}: {len(have)} samples, expected {len(want)}"
            for s, (ids, tensors) in zip(have, want):
                assert s.token_ids.to(torch.int64).tolist() == ids, rid
                assert set(s.tensors) == set(tensors), rid
                for name, t in tensors.items():
                    assert torch.equal(s.tensors[name], t), (rid, name)
                s.release()
        st_ = sub.stats()
        mine = f"hscap-{tag}-"
        told = {r for r in (*st_["incomplete"], *st_["dropped"]) if r.startswith(mine)}
        assert not any(r.startswith(mine) for r in st_["rejected"]), st_["rejected"]
        assert model.must_report <= told, f"not reported: {model.must_report - told}"
        assert told <= model.must_report | model.may_report, \
            f"reported, but delivered or never started: {told - model.must_report - model.may_report}"

    one()
