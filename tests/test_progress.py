"""The drain's and the export's progress display (hscapture/progress.py)."""

from __future__ import annotations

import io

import pytest

from hscapture.progress import Progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("total", [10, None])
def test_the_bar_shows_the_totals_inside_its_brackets_without_a_stray_comma(total):
    # tqdm puts ", " before a postfix: after the brackets it read "samples/s] , 0.00 GB"
    # (newcomer walk, 2026-12-05)
    out = _Terminal()
    bar = Progress(total, True, out)
    bar.update(3, 2_000_000, dropped=1, incomplete=2)
    bar.close()
    last = out.getvalue().rstrip("\n").split("\r")[-1]
    assert "] ," not in last, last
    assert "samples/s, 0.00 GB, " in last and last.endswith("dropped 1, incomplete 2]"), last


def test_without_a_terminal_a_plain_line_says_the_same():
    out = io.StringIO()
    bar = Progress(None, True, out)
    bar.update(3, 2_000_000, dropped=1)
    assert "3 samples" in bar.line() and "dropped 1" in bar.line()
    bar.close()
