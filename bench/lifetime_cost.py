# SPDX-License-Identifier: Apache-2.0
"""What a batch's lifetime costs a plain Python loop: copies (the
default outside DALI: every batch the caller's own memory) against views
(``zero_copy=True``: valid until ``release_after`` more batches),
``--epochs`` epochs a round, the two alternating (their order reversed every other
round), against a running loaderd. Each round: samples/s, and the
client's CPU (user + system, getrusage) per batch. Prints a Markdown
table of the medians, with every round's figures as JSON after it.

    python bench/lifetime_cost.py --socket S --dataset train:64 --dataset volumes:16 [--rounds 5] [--epochs 3]

``NAME:BATCH``: a dataset the daemon serves and the batch size to read it
with (an image dataset yields (samples, labels), a numpy one arrays)."""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from typing import Any

from nvfeed import LoaderSource


def run(socket: str, dataset: str, batch: int, zero_copy: bool, epochs: int = 1) -> dict[str, float]:
    """``epochs`` epochs of a plain loop over a fresh source, shuffled:
    samples/s and the client's CPU per batch (µs), the first batch (the
    open, the first read) not counted. The loop touches every batch (its
    length) as training code would at least."""
    with LoaderSource(dataset, socket=socket, batch_size=batch, random_shuffle=True, seed=1,
                      zero_copy=zero_copy) as src:
        it = iter(src)
        first = next(it)  # the open and the first read are not the loop's
        samples, batches = len(first[0]) if isinstance(first, tuple) else len(first), 1
        parts = first[0] if isinstance(first, tuple) else first if isinstance(first, list) else [first]
        mb = sum(p.nbytes for p in parts) / 1e6
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        for e in range(epochs):
            for b in (it if e == 0 else src):
                samples += len(b[0]) if isinstance(b, tuple) else len(b)
                batches += 1
        dt, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return {"samples_s": (samples - batch) / dt, "cpu_us_batch": cpu / (batches - 1) * 1e6,
            "mb_batch": mb}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--dataset", action="append", required=True, help="NAME:BATCH")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=3, help="epochs a round, each case")
    a = ap.parse_args()
    runs: dict[tuple[str, bool], list[dict[str, float]]] = {}
    cases = [(name, int(bs)) for name, bs in (d.split(":") for d in a.dataset)]
    for name, bs in cases:
        run(a.socket, name, bs, True)  # warm the page cache
    for r in range(a.rounds):
        for name, bs in cases:
            for zc in ((False, True) if r % 2 == 0 else (True, False)):
                runs.setdefault((name, zc), []).append(run(a.socket, name, bs, zc, a.epochs))
    print("| dataset (batch, MB) | lifetime | samples/s | client CPU µs/batch | copies vs views |\n|---|---|---|---|---|")
    for name, bs in cases:
        med: dict[bool, Any] = {zc: {k: statistics.median(x[k] for x in runs[(name, zc)]) for k in runs[(name, zc)][0]}
                                for zc in (False, True)}
        for zc, what in ((True, "views (`zero_copy=True`)"), (False, "copies (default)")):
            m = med[zc]
            ratio = "" if zc else f"{m['samples_s'] / med[True]['samples_s']:.2f}× samples/s, " \
                                  f"+{m['cpu_us_batch'] - med[True]['cpu_us_batch']:.0f} µs CPU"
            print(f"| {name} ({bs}, {m['mb_batch']:.1f}) | {what} | {m['samples_s']:.0f} | {m['cpu_us_batch']:.0f} | {ratio} |")
    print(json.dumps({f"{n}/{'views' if zc else 'copies'}": v for (n, zc), v in runs.items()}))


if __name__ == "__main__":
    main()
