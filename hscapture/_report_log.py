"""The drain's record of failures in its output directory: ``reports.jsonl``.

A durable subscriber keeps the ring records that name a failure (a drop or abort entry, a
failed sample's chunks) until the failure is acknowledged; the drain acknowledges only what
it appended here and fsync'd. So a failure the drain read is, at every moment, either still
in the ring (a restarted drain reads it again) or in this file, and a drain killed before it
printed its report leaves its failures to the next drain into the directory, which reports
them. Format (:mod:`hscapture.shard_format`): one JSON object per line, ``\\n``-terminated;
``{"kind": "dropped"|"incomplete"|"rejected", "rid": ..., "reason": ..., "event": ...}`` per
failure (``event``: the ring record that named it, ``"epoch:seq"``, or null), the same with
``"kind": "ended"`` for an abort that ended a sample which had failed before (not reported:
what tells the next drain that later rows of the rid are another attempt's), and
``{"reported": true, "at": ISO-8601}`` once a drain's report named every failure above it. A
torn last line is ignored. Every event in the file is known to the next drain: read again
from the ring (an older record held it back), such a failure is not reported twice.
"""

from __future__ import annotations

import json
import logging
import os
import time

from .record import ENDED, ended_by_abort
from .shard_format import REPORTS_NAME, jdump
from .shard_index import append_lines, fsync_dir

log = logging.getLogger("hscapture")

__all__ = ["ReportLog"]

KINDS = ("dropped", "incomplete", "rejected")


class ReportLog:
    """``reports.jsonl`` of one output directory."""

    def __init__(self, out_dir: str) -> None:
        self.path = os.path.join(out_dir, REPORTS_NAME)
        self.dir = out_dir

    def unreported(self) -> list[tuple[str, str, str]]:
        """``(kind, rid, reason)`` of the failures after the last ``reported`` line: those an
        earlier drain recorded and never named in a report (it was killed first)."""
        return self.read()[0]

    def read(self) -> tuple[list[tuple[str, str, str]], dict[str, str], set[str]]:
        """:meth:`unreported`, the event of every failure in the file with its rid, and the
        events of those an abort ended (:meth:`hscapture.Subscriber.known_failures` takes
        both)."""
        events: dict[str, str] = {}
        aborted: set[str] = set()
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return [], events, aborted
        out: list[tuple[str, str, str]] = []
        for line in raw.split(b"\n")[:-1]:          # the part after the last newline is torn
            try:
                d = json.loads(line)
            except ValueError:
                log.warning("hscapture drain: %s: a line that is not JSON, skipped", self.path)
                continue
            if not isinstance(d, dict):
                continue
            if d.get("reported"):
                out.clear()
            elif d.get("kind") in KINDS + (ENDED,) and isinstance(d.get("rid"), str):
                if d["kind"] != ENDED:     # (an abort that ended a failed sample: no report)
                    out.append((d["kind"], d["rid"], str(d.get("reason", ""))))
                if isinstance(d.get("event"), str):
                    events[d["event"]] = d["rid"]
                    if ended_by_abort(str(d.get("reason", ""))):
                        aborted.add(d["event"])
        return out, events, aborted

    def append(self, failures: list[tuple[str, str, str, str | None]]) -> None:
        """Append ``failures`` (``(kind, rid, reason, event)``) and make them durable (file
        and, when new, directory fsync'd)."""
        if failures:
            self._write("".join(jdump({"kind": k, "rid": r, "reason": why, "event": ev}) + "\n"
                                for k, r, why, ev in failures))

    def mark_reported(self) -> None:
        """Every failure above was named in a report shown to the user."""
        if os.path.exists(self.path):
            self._write(jdump({"reported": True, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                     time.gmtime())}) + "\n")

    def _write(self, text: str) -> None:
        """Append whole lines (:func:`~hscapture.shard_index.append_lines`), fsync'd."""
        new = not os.path.exists(self.path)
        append_lines(self.path, text, fsync=True)
        if new:
            fsync_dir(self.dir)
