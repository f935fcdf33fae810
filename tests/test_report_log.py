"""The drain's failure log (hscapture/_report_log.py): what a killed drain leaves to the next."""

from __future__ import annotations

from hscapture._report_log import ReportLog


def test_a_failure_appended_after_a_torn_reports_line_stays_readable(tmp_path):
    # A full disk (or a crash) can cut an append to reports.jsonl short. The next append
    # must not run into that fragment: until 2026-12-05 both lines merged into one that
    # does not parse, and the failure it named was reported by no later drain.
    log = ReportLog(str(tmp_path))
    log.append([("dropped", "a", "dropped by producer: ring_full", "7:1")])
    with open(tmp_path / "reports.jsonl", "ab") as f:
        f.write(b'{"kind":"incomplete","rid":"torn","rea')      # a short write
    log.append([("incomplete", "x", "aborted by producer: gone", "7:5")])
    assert log.unreported() == [("dropped", "a", "dropped by producer: ring_full"),
                                ("incomplete", "x", "aborted by producer: gone")]
    log.mark_reported()
    log.append([("rejected", "y", "expected 5 tokens, found 8", None)])
    assert log.unreported() == [("rejected", "y", "expected 5 tokens, found 8")]
    assert (tmp_path / "reports.jsonl").read_bytes().endswith(b"\n")
    assert log.read()[1] == {"7:1": "a", "7:5": "x"}   # every recorded event, and its rid


def test_an_abort_that_ended_a_dropped_sample_is_recorded_for_a_resumer_but_not_reported(
        tmp_path):
    # x's chunk was dropped, then x was aborted: the drop is the report, the abort's end of
    # the sample is what a restarted drain needs to know that later rows of x are another
    # attempt's (GUARANTEES gap 15). Until 2026-12-06 only the drop was recorded
    log = ReportLog(str(tmp_path))
    log.append([("dropped", "x", "dropped by producer: ring_full", "7:3"),
                ("ended", "x", "aborted by producer: client gave up", "7:9")])
    unreported, events, aborted = log.read()
    assert unreported == [("dropped", "x", "dropped by producer: ring_full")]
    assert events == {"7:3": "x", "7:9": "x"} and aborted == {"7:9"}
