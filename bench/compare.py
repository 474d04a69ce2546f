# SPDX-License-Identifier: Apache-2.0
"""Summarizes benchmark rounds: reads JSON lines {"case", "round",
"device", result...} and prints, per device and cache state, medians and
ratios to the python-file reference and to the device limit (fio's best
on the same bytes in a shuffled order), then the targets that compare
cases with each other. Each figure is the median of the rounds with
their spread, a ratio taken round by round (bench/rounds.py)."""

from __future__ import annotations

import json
import re
import statistics
import sys

from rounds import by_round, figure, ratio as round_ratio, verdict


def brief(rows: dict[tuple[str, str], list[dict]]) -> None:
    """One short table for a newcomer: every row cold, with ratios to the
    Python reader, DALI's reader and the device limit (fio's best)."""
    med = {c: statistics.median(r["samples_per_s"] for r in rs) for (_, c), rs in rows.items()}
    fio = {c: v for c, v in med.items() if c.startswith("fio shuffled")}
    best = max(fio, key=fio.get, default=None)
    py, dali = med.get("python-file cold"), med.get("dali readers.file cold")
    print(f"{'(all cold)':<32} {'samples/s':>10} {'vs python':>10} {'vs DALI reader':>15} {'vs fio best':>12}")
    for c, v in med.items():
        if c in fio and c != best:
            continue
        name = f"fio best ({c.split()[-2]})" if c == best else c.removesuffix(" cold")
        cells = [f"{v / ref:>9.2f}x" if ref else f"{'-':>10}" for ref in (py, dali, med.get(best) if best else None)]
        print(f"{name:<32} {v:>10.0f} {cells[0]} {cells[1]:>15} {cells[2]:>12}")
    print("fio best: the device's limit for these bytes (every sample's extents, shuffled, best of queue depth 16/32/64,"
          " with and without registered buffers).")


def main() -> None:
    rows: dict[tuple[str, str], list[dict]] = {}
    for line in sys.stdin:
        if line.strip():
            r = json.loads(line)
            rows.setdefault((r.get("device", "-"), r["case"]), []).append(r)
    if sys.argv[1:] == ["--brief"]:
        brief(rows)
        return
    med = {k: statistics.median(r["samples_per_s"] for r in rs) for k, rs in rows.items()}
    cpu = {k: statistics.median(r["cpu_seconds"] / (r["bytes"] / 1e9) for r in rs)
           for k, rs in rows.items() if all("cpu_seconds" in r for r in rs)}
    for dev in sorted({d for d, _ in rows}):
        fio_cases = [c for d, c in rows if d == dev and c.startswith("fio shuffled qd")]
        best = max(fio_cases, key=lambda c: med[(dev, c)], default=None)
        limit = med[(dev, best)] if best else None
        for cache in ("cold", "warm"):
            ref = med.get((dev, f"python-file {cache}"))
            cases = [c for d, c in rows if d == dev and c.endswith(" " + cache)]
            if not cases:
                continue
            n = len(rows[(dev, cases[0])])
            print(f"\n{dev} device, {cache} page cache (medians of {n} rounds)")
            print(f"{'case':<36} {'samples/s':>10} {'spread':>16} {'MB/s':>8} {'cpu s/GB':>9} {'vs python':>10} {'vs fio best':>12}")
            for c in cases:
                k = (dev, c)
                mbs = statistics.median(r["bytes_per_s"] for r in rows[k]) / 1e6
                cp = f"{cpu[k]:>9.2f}" if k in cpu else f"{'-':>9}"
                vp = f"{med[k] / ref:>9.2f}x" if ref else f"{'-':>10}"
                vf = f"{med[k] / limit:>11.2f}x" if limit and cache == "cold" else f"{'-':>12}"
                f = figure(r["samples_per_s"] for r in rows[k])
                print(f"{c:<36} {med[k]:>10.0f} {f'{f.lo:.0f}-{f.hi:.0f}':>16} {mbs:>8.1f} {cp} {vp} {vf}")
        print(f"\n{dev} device: targets")

        def ratio(a: str, b: str, what: str) -> None:
            ka, kb = (dev, a), (dev, b)
            if ka in med and kb in med:
                f = round_ratio(by_round(rows[ka], "samples_per_s"), by_round(rows[kb], "samples_per_s"))
                goal = re.search(r"\((>=|<=) ([\d.]+)\)", what)
                says = verdict(f, goal[1], float(goal[2])) if goal else ""
                print(f"  {what:<58} {f.text()}x over {f.rounds} rounds {says}".rstrip())
        if best:
            print(f"  device limit: {best} ({limit:.0f} samples/s, the best median)")
            ratio("gds cold", f"{best}", "gds vs fio best (>= 0.95)")
            if (dev, "gds cold") in cpu and (dev, best) in cpu:
                print(f"  {'gds CPU s/GB vs fio best (<= 1.2)':<58} {cpu[(dev, 'gds cold')] / cpu[(dev, best)]:.2f}x")
            ratio("8 sessions gds cold", f"{best}", "8 sessions aggregate vs fio best (>= 0.9)")
        ratio("bam cold", "fio bam requests qd256 cold", "bam vs fio on its own 4 KiB requests (>= 0.9)")
        for b in ("16", "64"):
            ratio(f"shim file b{b} warm", f"file b{b} warm", f"LoaderSource vs loaderd bench, warm, batch {b} (>= 0.9)")
        ratio("shim file b64 cold", "file b64 cold", "LoaderSource vs loaderd bench, cold, batch 64 (>= 0.95)")
        ratio("shim file b16 http warm", "file b16 warm", "  (the HTTP round-trip path, warm, batch 16)")
        ratio("dali external_source gds b64 cold", "dali readers.file b64 cold", "external_source(LoaderSource, gds) vs readers.file, cold (>= 2)")


if __name__ == "__main__":
    main()
