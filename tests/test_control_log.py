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
