# SPDX-License-Identifier: Apache-2.0
"""bench/rounds.py, the one rule for figures over interleaved rounds
(median, min-max spread, ratios round by round, "spread > margin"), and
bench/results.py reading those figures back into the goals table from a
step's printed output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import rounds  # noqa: E402  (bench/ is no package)


def test_figure_is_the_median_and_range() -> None:
    f = rounds.figure([3.0, 1.0, 2.0, 10.0, 4.0])
    assert (f.median, f.lo, f.hi, f.rounds) == (3.0, 1.0, 10.0, 5)
    assert f.text() == "3.00 [1.00-10.00]"


def test_figure_of_no_rounds_is_an_error() -> None:
    with pytest.raises(ValueError, match="no rounds"):
        rounds.figure([])


def test_ratio_pairs_rounds_not_medians() -> None:
    # The medians' ratio would be 1.0; round by round it is 2 or 0.5.
    a = {1: 2.0, 2: 1.0, 3: 2.0}
    b = {1: 1.0, 2: 2.0, 3: 1.0}
    f = rounds.ratio(a, b)
    assert (f.median, f.lo, f.hi) == (2.0, 0.5, 2.0)


@pytest.mark.parametrize("a,b,match", [
    ({1: 1.0, 2: 1.0}, {1: 1.0}, "different rounds"),
    ({1: 1.0}, {1: 0.0}, "zero"),
])
def test_ratio_refuses_unpaired_rounds(a: dict[int, float], b: dict[int, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        rounds.ratio(a, b)


def test_by_round_refuses_two_rows_of_a_round() -> None:
    with pytest.raises(ValueError, match="two rows for round 1"):
        rounds.by_round([{"round": 1, "x": 1}, {"round": 1, "x": 2}], "x")


@pytest.mark.parametrize("values,op,target,want", [
    ([0.95, 0.96, 0.97, 0.98, 0.99], ">=", 0.9, "met"),  # spread 0.04 < margin 0.07
    ([0.80, 0.90, 0.93, 0.96, 1.10], ">=", 0.9, "met (spread > margin)"),
    ([0.50, 0.52, 0.53, 0.55, 0.57], ">=", 0.9, "missed"),
    ([0.70, 0.80, 0.85, 0.95, 1.00], ">=", 0.9, "missed (spread > margin)"),
    ([12.0, 14.0, 18.0, 19.0, 20.0], "<=", 10, "missed"),
    ([9.0, 9.5, 9.8, 10.5, 11.0], "<=", 10, "met (spread > margin)"),
    ([0.3, 0.35, 0.38], "<", 0.5, "met (3 rounds < 5)"),  # spread 0.08 < margin 0.15
    ([0.3, 0.4, 0.6], "<", 0.5, "met (spread > margin) (3 rounds < 5)"),
])
def test_verdict(values: list[float], op: str, target: float, want: str) -> None:
    assert rounds.verdict(rounds.figure(values), op, target) == want


def test_a_single_figure_says_it_has_no_spread() -> None:
    assert rounds.verdict(rounds.Figure(14.3, 14.3, 14.3, 0), "<", 15) == "met (no spread)"


def test_unknown_operator_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown goal operator"):
        rounds.met(1.0, "==", 1.0)


@pytest.mark.parametrize("unit", ["x", " us", " s", " µs", ""])
def test_goal_line_reads_back(unit: str) -> None:
    f = rounds.figure([0.51, 0.53, 0.57, 0.49, 0.55])
    line = rounds.goal_line("node: 8 ranks vs fio best", f, unit, ">=", 0.9)
    assert line.startswith("goal: node: 8 ranks vs fio best: 0.53 [0.49-0.57]")
    assert line.endswith("(>= 0.9) missed")
    assert rounds.parse_figure(line) == rounds.Figure(0.53, 0.49, 0.57, 5)


def test_results_goals_carry_spread_and_marker(tmp_path: Path) -> None:
    """bench/results.py's goals table from printed step outputs: the
    spread in brackets, "spread > margin" where it is wider than the
    median's distance to the goal, "no spread" for a single figure, "not run" for a missing step."""
    (tmp_path / "node.txt").write_text(
        "step: commit abc1234, started 2026-11-29T00:00:00Z\n"
        + rounds.goal_line("node: 8 ranks, batch 64, vs fio best", rounds.figure([0.85, 0.88, 0.92, 0.95, 0.89]),
                           "x", ">=", 0.9) + "\n"
        + rounds.goal_line("node: CPU per sample, daemon + clients, batch 64", rounds.figure([18.0, 17.5, 19.0, 18.2, 18.1]),
                           " us", "<=", 10, 1) + "\nstep: took 60 s\n")
    (tmp_path / "scale.txt").write_text(
        "files: 1281167\nmkbmap cold: 14.3 s\n"
        "loaderd: median daemon ready (cold): 0.900 [0.850-1.100] s over 5 rounds\n"
        "loaderd: median 8 ranks' first batch (the slowest of a round): 1.700 [1.500-1.900] s over 5 rounds\n")
    md = subprocess.run([sys.executable, str(REPO / "bench/results.py"), str(tmp_path)], capture_output=True,
                        text=True, check=True).stdout
    rows = {line.split(" | ")[0]: line for line in md.splitlines() if line.startswith("| ")}

    def row(start: str) -> str:
        return next(v for k, v in rows.items() if k.startswith("| " + start))

    assert "| 0.89x [0.85-0.95] |" in row("8 ranks at once")
    assert "**missed** (spread > margin)" in row("8 ranks at once")
    assert "| 18.1 µs [17.5-19.0] |" in row("CPU per sample, daemon + clients, 8 ranks")
    assert "**missed** [why]" in row("CPU per sample, daemon + clients, 8 ranks")
    assert "| 14.30 s | < 15 s | met (no spread) |" in row("1 281 167 files: `mkbmap`")
    assert "| 0.90 s [0.85-1.10] | < 5 s | met |" in row("1 281 167 files: the daemon ready")
    assert "| 1.70 s [1.50-1.90] | < 0.5 s | **missed**" in row("1 281 167 files: 8 ranks' first batch")
    assert "| not run |" in row("the README's swap")
    assert "## A training node's shape: 8 ranks at once, beside fio" in md


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading's text."""
    kept = "".join(c for c in heading.strip().lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def test_every_why_link_names_a_section() -> None:
    """Each missed goal's [why] link in RESULTS.md leads to a heading of
    docs/decisions.md: a renamed section would leave the link dead."""
    import results  # noqa: E402  (bench/ is no package)

    text = (REPO / "docs/decisions.md").read_text()
    anchors = {_anchor(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}
    dead = [a for _, a in results.WHY if a not in anchors]
    assert not dead, f"bench/results.py's WHY names no heading of docs/decisions.md: {dead}"
