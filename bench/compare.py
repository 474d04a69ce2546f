"""Summarizes benchmark rounds: reads JSON lines {"case", "round", result...}
and prints medians and ratios to the python-file reference, per cache state."""

from __future__ import annotations

import json
import statistics
import sys


def main() -> None:
    rows: dict[str, list[dict]] = {}
    for line in sys.stdin:
        line = line.strip()
        if line:
            r = json.loads(line)
            rows.setdefault(r["case"], []).append(r)
    for cache in ("cold", "warm"):
        ref_key = f"python-file {cache}"
        if ref_key not in rows:
            continue
        ref = statistics.median(r["samples_per_s"] for r in rows[ref_key])
        print(f"\n{cache} page cache (medians of {len(rows[ref_key])} rounds)")
        print(f"{'case':<28} {'samples/s':>10} {'MB/s':>8} {'cpu s/GB':>9} {'vs python':>10}")
        for case, rs in rows.items():
            if not case.endswith(cache):
                continue
            sps = statistics.median(r["samples_per_s"] for r in rs)
            mbs = statistics.median(r["bytes_per_s"] for r in rs) / 1e6
            cpus = [r["cpu_seconds"] / (r["bytes"] / 1e9) for r in rs if "cpu_seconds" in r]
            cpu = f"{statistics.median(cpus):>9.2f}" if cpus else f"{'-':>9}"
            print(f"{case:<28} {sps:>10.0f} {mbs:>8.1f} {cpu} {sps / ref:>9.2f}x")


if __name__ == "__main__":
    main()
