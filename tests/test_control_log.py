"""The producer's control accounting (hscapture/_control.py): the backlog and the unheard list."""

from __future__ import annotations

from types import SimpleNamespace

from hscapture import record as rec
from hscapture._control import ControlLog

EPOCH = 0x1234


def _committed(position: int, seq: int, rids: list[str], last: bool = True):
    rows = [{"rid": r, "last": last} for r in rids]
    return SimpleNamespace(position=position, seq=seq, rows=rows, abort=None)


def _unheard(log: ControlLog, seq: int, attached_at: int) -> dict:
    rows, overflow, discarded = log.take_unheard(attached_at)
    return rec.unheard_meta("p", EPOCH, seq, 0, rows, overflow, discarded)


def test_heartbeats_say_heard_only_once_the_unheard_entry_is_out_of_the_backlog():
    log = ControlLog()
    log.note_unheard(_committed(0, 0, ["a", "b"]))
    assert not log.told                       # no subscriber yet: an unheard entry may come
    meta = _unheard(log, 2, attached_at=4096)
    assert log.heard and log.told             # taken (and, say, written into the ring)
    log.add(meta)                             # ... or no room: it waits in the backlog
    assert log.heard and not log.told
    assert log.recorded_through(5) == 2       # nothing at or past its seq counts as recorded
    assert log.pending() == [meta]
    log.pop()                                 # written into the ring at last
    assert log.told and log.backlog_rows == 0 and log.recorded_through(5) == 5


def test_an_unheard_entry_past_the_backlogs_bound_counts_every_row_it_names_unrecorded():
    log = ControlLog(backlog_rows=1)
    log.add(rec.drop_meta("p", EPOCH, 0, 0, "ring_full",
                          [{"rid": "d", "token_start": 0, "token_count": 1, "last": True}]))
    log.note_unheard(_committed(0, 1, ["a", "b", "c"]))
    log.add(_unheard(log, 4, attached_at=4096))
    assert log.unrecorded == 3 and log.told   # named nowhere: counted, never waited for


def test_past_the_unheard_bound_only_ended_rows_are_counted_and_open_ones_stay_named():
    # 4 rows named, then 2 more ended samples (counted: overflow 2), then z's first chunk and
    # an abort: z's row is still named (a restart may discard it, and did) and the abort's
    # number is listed discarded. Until 2026-12-06 both were past the bound: z stayed in the
    # overflow count (a false count) and the abort's number was listed nowhere, so a
    # follower reported it lost (fault hunt i1, GUARANTEES 13(f))
    log = ControlLog(unheard_rows=4)
    for k in range(6):
        log.note_unheard(_committed(k, k, [f"w{k}"]))
    log.note_unheard(_committed(6, 6, ["z"], last=False))
    meta = _unheard(log, 8, attached_at=4096)       # taken while z is open
    assert meta["overflow"] == 2
    assert [r["rid"] for r in meta["rows"]] == ["w0", "w1", "w2", "w3", "z"]
    assert meta["rows"][-1]["last"] is False and meta["discarded"] == []
    log = ControlLog(unheard_rows=4)
    for k in range(6):
        log.note_unheard(_committed(k, k, [f"w{k}"]))
    log.note_unheard(_committed(6, 6, ["z"], last=False))
    log.note_unheard(SimpleNamespace(position=7, seq=7, rows=[], abort=("z", True)))
    meta = _unheard(log, 8, attached_at=4096)       # taken after z's restart abort
    assert meta["overflow"] == 2 and [r["rid"] for r in meta["rows"]] == ["w0", "w1", "w2", "w3"]
    assert meta["discarded"] == [6, 7]


def test_open_rows_past_the_unheard_bound_are_themselves_bounded():
    log = ControlLog(unheard_rows=2)
    log.note_unheard(_committed(0, 0, [f"o{k}" for k in range(10)], last=False))
    rows, overflow, discarded = log.take_unheard(4096)
    assert len(rows) == 4 and overflow == 6 and discarded == []


def test_an_entry_the_ring_can_never_hold_is_given_up_and_counted_unrecorded():
    log = ControlLog()
    log.add({"kind": "drop", "seq": 4, "rows": [{"rid": "a"}, {"rid": "b"}]})
    log.add({"kind": "abort", "seq": 6, "rid": "c"})
    assert (log.backlog_rows, log.recorded_through(9)) == (3, 4)
    assert log.give_up_first() == 2
    assert (log.backlog_rows, log.unrecorded, log.recorded_through(9)) == (1, 2, 6)
    assert log.peek()["rid"] == "c"
