# SPDX-License-Identifier: Apache-2.0
"""Figures over interleaved rounds, the one rule every bench table uses.

A figure is the median of its rounds with their spread (min to max).
A ratio of two cases is taken round by round, then summarized the same
way: the rounds interleave, so round r of both cases ran side by side.
A goal row whose spread is wider than its margin to the goal says so:
its verdict could flip between identical runs.

The text form is "MEDIAN [LO-HI]" (figure); bench/results.py reads it
back from each step's "goal:" lines with parse_figure."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

# The fewest rounds a figure should rest on; fewer are marked.
MIN_ROUNDS = 5


@dataclass(frozen=True)
class Figure:
    """A median and the spread of the rounds it came from.

    rounds is 0 for a single figure whose rounds were not printed.
    """

    median: float
    lo: float
    hi: float
    rounds: int

    def spread(self) -> float:
        """The width of the rounds' range."""
        return self.hi - self.lo

    def text(self, digits: int = 2) -> str:
        """The figure as "MEDIAN [LO-HI]", the form parse_figure reads."""
        return f"{self.median:.{digits}f} [{self.lo:.{digits}f}-{self.hi:.{digits}f}]"


def figure(values: Iterable[float]) -> Figure:
    """The median and min-max of values (one per round).

    Raises
    ------
    ValueError
        When values is empty: a figure with no rounds is no figure.
    """
    xs = list(values)
    if not xs:
        raise ValueError("rounds: no rounds to summarize")
    return Figure(statistics.median(xs), min(xs), max(xs), len(xs))


def ratio(a: Mapping[int, float], b: Mapping[int, float]) -> Figure:
    """The ratio a/b round by round (rounds keyed by number), summarized.

    Raises
    ------
    ValueError
        When a round of one has no partner in the other, or b has a zero.
    """
    if set(a) != set(b):
        raise ValueError(f"rounds: the cases ran in different rounds: {sorted(a)} and {sorted(b)}")
    if any(b[r] == 0 for r in b):
        raise ValueError("rounds: a ratio over a zero figure")
    return figure(a[r] / b[r] for r in sorted(a))


def by_round(rows: Sequence[Mapping[str, object]], key: str) -> dict[int, float]:
    """Each row's key by its "round" field.

    Raises
    ------
    ValueError
        When two rows share a round (the cases were not one per round).
    """
    out: dict[int, float] = {}
    for r in rows:
        n = int(str(r["round"]))
        if n in out:
            raise ValueError(f"rounds: two rows for round {n}")
        out[n] = float(str(r[key]))
    return out


def met(value: float, op: str, target: float) -> bool:
    """Whether value meets the goal "op target" (op one of >=, <=, <, >)."""
    if op == ">=":
        return value >= target
    if op == "<=":
        return value <= target
    if op == "<":
        return value < target
    if op == ">":
        return value > target
    raise ValueError(f"rounds: unknown goal operator {op!r}")


def unsteady(f: Figure, target: float) -> bool:
    """Whether the rounds' spread exceeds the median's margin to target."""
    return f.spread() > abs(f.median - target)


def verdict(f: Figure, op: str, target: float) -> str:
    """"met" or "missed", with the markers that say how far to trust it."""
    words = ["met" if met(f.median, op, target) else "missed"]
    if f.rounds == 0:
        return " ".join([*words, "(no spread)"])  # a single figure, its rounds unknown
    if unsteady(f, target):
        words.append("(spread > margin)")
    if f.rounds < MIN_ROUNDS:
        words.append(f"({f.rounds} rounds < {MIN_ROUNDS})")
    return " ".join(words)


def goal_line(name: str, f: Figure, unit: str, op: str, target: float, digits: int = 2) -> str:
    """A step's "goal:" line: the figure, its spread, the goal, the verdict."""
    return f"goal: {name}: {f.text(digits)}{unit} over {f.rounds} rounds ({op} {target:g}) {verdict(f, op, target)}"


FIGURE = re.compile(r"([\d.]+) \[([\d.]+)-([\d.]+)\](?: ?[^\s\d]+)? over (\d+) rounds")


def parse_figure(line: str) -> Figure | None:
    """The first "MEDIAN [LO-HI]UNIT over N rounds" in line, or None."""
    m = FIGURE.search(line)
    if not m:
        return None
    return Figure(float(m[1]), float(m[2]), float(m[3]), int(m[4]))
