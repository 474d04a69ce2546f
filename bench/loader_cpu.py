# SPDX-License-Identifier: Apache-2.0
"""Two of the issue's rows, measured from a client of a running daemon:

cpu: the loader's CPU per sample, daemon + client. One LoaderSource
(no backend named unless --backend) reads EPOCHS shuffled epochs with
nothing else in the process (no DALI): this process's user + sys
(getrusage) and the daemon's (utime + stime of /proc/PID/stat, --pid)
over the reading, each divided by the samples.

open: session open time. A LoaderSource opened OPENS times in turn (each
closed before the next): the first open's seconds and the median of the
others.

Prints one JSON object. Usage:
  python bench/loader_cpu.py cpu --socket S --dataset D --pid PID [--batch 64] [--epochs 3] [--backend B]
  python bench/loader_cpu.py open --socket S --dataset D [--opens 7] [--backend B]"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

from nvfeed import LoaderSource


def daemon_cpu(pid: int) -> float:
    """The daemon's user + sys CPU seconds so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["cpu", "open"])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--pid", type=int, default=0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--opens", type=int, default=7)
    ap.add_argument("--backend", default=None)
    a = ap.parse_args()
    kw = {"backend": a.backend} if a.backend else {}
    if a.mode == "open":
        secs, backend = [], ""
        for _ in range(a.opens):
            t0 = time.perf_counter()
            with LoaderSource(a.dataset, socket=a.socket, batch_size=4, **kw) as s:
                secs.append(time.perf_counter() - t0)
                backend = s.backend
        print(json.dumps({"backend": backend, "first_s": secs[0], "median_s": statistics.median(secs[1:] or secs)}))
        return
    with LoaderSource(a.dataset, socket=a.socket, batch_size=a.batch, random_shuffle=True, zero_copy=True,
                      **kw) as src:  # views, as measured (bench/lifetime_cost.py: copies)
        n = 0
        d0, c0, t0 = daemon_cpu(a.pid), own_cpu(), time.perf_counter()
        for _ in range(a.epochs):
            for samples, _ in src:
                n += len(samples)
        d1, c1, secs = daemon_cpu(a.pid), own_cpu(), time.perf_counter() - t0
        print(json.dumps({"backend": src.backend, "samples": n, "seconds": secs, "daemon_us": (d1 - d0) / n * 1e6,
                          "client_us": (c1 - c0) / n * 1e6}))


if __name__ == "__main__":
    main()
