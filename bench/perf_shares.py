"""Shares of CPU time by thread group in `perf record -a` profiles, one
column per profile: DALI's thread pool and executor, the Python main thread
(the source's per-batch code and DALI's Python side), loaderd, the kernel's
unbound workers (the loop device's copy of every byte; DMA on real NVMe),
softirqs, idle. Usage: python bench/perf_shares.py PERF.DATA...
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

GROUPS = [
    ("DALI thread pool", re.compile(r"^\[DALI\]\[TP")),
    ("DALI executor", re.compile(r"^\[DALI\]")),
    ("Python main thread", re.compile(r"^python")),
    ("loaderd", re.compile(r"^loaderd")),
    ("kernel unbound workers (loop device)", re.compile(r"^kworker/u")),
    ("softirq", re.compile(r"^ksoftirqd")),
    ("idle", re.compile(r"^swapper")),
]
OTHER = "other"


def shares(path: str) -> dict[str, float]:
    """Percent of samples per group in one profile."""
    out = subprocess.run(["perf", "report", "-i", path, "--no-children", "--sort", "comm", "-g", "none", "--stdio"],
                         capture_output=True, text=True, check=True).stdout
    got: dict[str, float] = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(.+?)\s*$", line)
        if not m:
            continue
        pct, comm = float(m.group(1)), m.group(2)
        group = next((g for g, rx in GROUPS if rx.search(comm)), OTHER)
        got[group] = got.get(group, 0.0) + pct
    return got


def main() -> None:
    paths = sys.argv[1:]
    cols = [shares(p) for p in paths]
    names = [Path(p).stem for p in paths]
    print("| thread group | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for g in [g for g, _ in GROUPS] + [OTHER]:
        print(f"| {g} | " + " | ".join(f"{c.get(g, 0.0):.1f}%" for c in cols) + " |")


if __name__ == "__main__":
    main()
