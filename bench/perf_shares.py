# SPDX-License-Identifier: Apache-2.0
"""Shares of CPU time by thread group in `perf record -a` profiles, one
column per profile: DALI's thread pool and executor, the Python main thread
(the source's per-batch code and DALI's Python side), loaderd, fio, the kernel's
unbound workers (the loop device's copy of every byte; DMA on real NVMe),
softirqs, idle; then loaderd's own samples by what their call stacks
are doing. Usage: python bench/perf_shares.py PERF.DATA...
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
    ("fio", re.compile(r"^fio")),
    ("kernel unbound workers (loop device)", re.compile(r"^kworker/u")),
    ("softirq", re.compile(r"^ksoftirqd")),
    ("idle", re.compile(r"^swapper")),
]
OTHER = "other"

# loaderd's samples by the first rule any frame of the stack matches.
LOADERD = [
    ("registering batch memory (session open: pins every page)", ("RegisterBuffers",)),
    ("io_uring submission (block layer, loop queueing)", ("io_submit_sqes", "io_issue_sqe")),
    ("io_uring waits and completions", ("io_cqring_wait", "io_uring_enter")),
    ("futex (goroutine hand-offs, the ring's locked thread)", ("futex",)),
    ("the stream (frame encoding, socket write)", ("msgpack", "serve.(*Server).stream", "netFD")),
    ("Go scheduler, allocation, GC", ("runtime.schedule", "runtime.findRunnable", "gcBgMarkWorker", "runtime.mallocgc",
                                      "runtime.sysmon", "runtime.usleep")),
    ("planning, freshness", ("raw.", "fresh.", "bmap.")),
]


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


def loaderd_stacks(path: str) -> tuple[int, dict[str, int]]:
    """loaderd's samples in one profile, counted by LOADERD's rules."""
    out = subprocess.run(["perf", "script", "-i", path, "--comms", "loaderd"],
                         capture_output=True, text=True, check=True).stdout
    got: dict[str, int] = {}
    n = 0
    for stack in out.split("\n\n"):
        if not stack.strip():
            continue
        n += 1
        group = next((g for g, keys in LOADERD if any(k in stack for k in keys)), OTHER)
        got[group] = got.get(group, 0) + 1
    return n, got


def main() -> None:
    paths = sys.argv[1:]
    cols = [shares(p) for p in paths]
    names = [Path(p).stem for p in paths]
    print("| thread group | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for g in [g for g, _ in GROUPS] + [OTHER]:
        print(f"| {g} | " + " | ".join(f"{c.get(g, 0.0):.1f}%" for c in cols) + " |")
    stacks = [(name, *loaderd_stacks(p)) for name, p in zip(names, paths)]
    stacks = [t for t in stacks if t[1] > 0]
    if stacks:
        print("\n| loaderd's samples | " + " | ".join(f"{name} ({n})" for name, n, _ in stacks) + " |")
        print("|---|" + "---|" * len(stacks))
        for g in [g for g, _ in LOADERD] + [OTHER]:
            print(f"| {g} | " + " | ".join(f"{100 * c.get(g, 0) / n:.0f}%" for _, n, c in stacks) + " |")


if __name__ == "__main__":
    main()
