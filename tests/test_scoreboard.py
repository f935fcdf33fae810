"""The README's Performance table, its plot and its commands agree.

``benchmarks/scoreboard.json`` is the data of ``docs/scoreboard.png``; each entry names the
README row it plots by that row's command tag. These tests keep a figure from changing in one
place and not the other, and every row's command written out below the table.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DATA = ROOT / "benchmarks" / "scoreboard.json"


def _section() -> str:
    text = README.read_text()
    start = text.index("\n## Performance\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def _rows() -> list[list[str]]:
    """The table's data rows, as cells (the header and the rule left out)."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in _section().splitlines() if line.startswith("| ")]
    assert rows[0][0] == "goal" and rows[0][-1] == "cmd", rows[0]
    return [r for r in rows[1:] if not set(r[0]) <= set("-: ")]


def _goal(rows: list[list[str]], row: list[str]) -> str:
    """A row's goal: its first cell, or for a row that begins "…" (the same goal, another
    case) the first cell of the row it continues."""
    i = rows.index(row)
    while rows[i][0].startswith("…"):
        i -= 1
    return rows[i][0]


def _tags(cell: str) -> list[str]:
    return [t.strip() for t in cell.split(",")]


def _plot_module():
    spec = importlib.util.spec_from_file_location("plot_scoreboard",
                                                  ROOT / "benchmarks" / "plot_scoreboard.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_plotted_figure_is_the_one_its_readme_row_states():
    for entry in json.loads(DATA.read_text())["rows"]:
        table = _rows()
        rows = [r for r in table if entry["cmd"] in _tags(r[-1])]
        assert len(rows) == 1, f"{entry['label']}: {len(rows)} README rows tagged {entry['cmd']}"
        row = " | ".join(rows[0])
        for key in ("median", "lo", "hi"):
            # a number of its own, not the start of a longer one (0.96 is not 0.9616)
            assert re.search(rf"(?<![\d.]){re.escape(entry[key])}(?![\d])", row), (
                f"{entry['label']}: {key} {entry[key]} is not in its README row: {row}")
        goal = _goal(table, rows[0])
        assert re.search(rf"(?<![\d.]){entry['goal']:g}(?![\d])", goal), (
            f"{entry['label']}: goal {entry['goal']} is not its row's goal: {goal}")


def test_a_figure_is_drawn_as_met_only_where_its_row_says_so():
    mod = _plot_module()
    for entry in mod.load(DATA):
        row = next(r for r in _rows() if entry["cmd"] in _tags(r[-1]))
        verdict = row[3]
        if mod.met(entry):
            assert "✅" in verdict, f"{entry['label']}: met by its spread, row says {verdict}"
        else:
            assert "❌" in verdict, f"{entry['label']}: missed by its spread, row says {verdict}"


def test_every_row_names_a_command_written_out_below_the_table():
    section = _section()
    block = section[section.index("```bash"):]
    written = set(re.findall(r"#\s*([A-Z]\d)\b", block))
    for row in _rows():
        for tag in _tags(row[-1]):
            assert tag in written, f"row {row[0][:60]!r}: command {tag} is not written out"
            assert row[4], f"row {row[0][:60]!r} names no machine and run"


def test_the_plot_data_refuses_a_median_outside_its_spread(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": [{"label": "x", "median": "0.7", "lo": "0.8",
                                         "hi": "0.9", "goal": 0.8, "cmd": "Z1"}]}))
    with pytest.raises(ValueError, match="outside its spread"):
        _plot_module().load(bad)


def test_the_plot_is_drawn_from_the_data(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    out = tmp_path / "s.png"
    monkeypatch.setattr("sys.argv", ["plot_scoreboard.py", "--out", str(out)])
    assert _plot_module().main() == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
