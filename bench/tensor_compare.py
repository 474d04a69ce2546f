# SPDX-License-Identifier: Apache-2.0
"""Summarizes bench/tensors.sh: reads its JSON lines (one per case and
round: the case's result plus case, round, device, size, dev_bytes,
tensor_bytes, shape, batch, files; or a skipped case with its reason) and
prints, per device and tensor size, each case's median tensors/s and GB/s,
the spread of its rounds ((max - min) / median), its process CPU seconds per
GB, the bytes the device read per data byte (dev/data: 1.00 means every
tensor came from the device, once), and its ratios to fn.readers.numpy
(CPU), the np.load loop and fio's best (the best median of the fio
settings); then the goals.

Usage: python bench/tensor_compare.py < results.jsonl"""

from __future__ import annotations

import json
import statistics
import sys

GOALS = [  # (case, reference, what, at least)
    ("loaderd gds", "dali readers.numpy", "loaderd gds vs fn.readers.numpy (CPU)", 1.5),
    ("loaderd gds", "fio best", "loaderd gds vs fio best", 0.9),
]
GOAL_AT = ("ram", "16m")  # the goals are for the RAM device, 16 MiB tensors


def sizename(size: str) -> str:
    return {"256k": "256 KiB", "16m": "16 MiB"}.get(size, size)


def main() -> None:
    rows: dict[tuple[str, str], dict[str, list[dict]]] = {}
    skipped: dict[tuple[str, str], dict[str, str]] = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        r = json.loads(line)
        key = (r["device"], r["size"])
        if "skipped" in r:
            skipped.setdefault(key, {})[r["case"]] = r["skipped"]
            continue
        rows.setdefault(key, {}).setdefault(r["case"], []).append(r)
    order = {"virtio": 0, "ram": 1}
    for key in sorted(set(rows) | set(skipped), key=lambda k: (order.get(k[0], 9), k[0], k[1] != "256k", k[1])):
        dev, size = key
        cases = rows.get(key, {})
        med = {c: statistics.median(r["samples_per_s"] for r in rs) for c, rs in cases.items()}
        fio = {c: v for c, v in med.items() if c.startswith("fio ")}
        best = max(fio, key=lambda c: fio[c], default=None)
        refs = {"dali readers.numpy": med.get("dali readers.numpy"), "np.load loop": med.get("np.load loop"),
                "fio best": med.get(best) if best else None}
        some = next(iter(cases.values()), [{}])[0]
        n = max((len(rs) for rs in cases.values()), default=0)
        print(f"\n{dev} device, {sizename(size)} tensors (float32 {some.get('shape', '?').replace(',', 'x')}, "
              f"{some.get('files', '?')} files, {some.get('files', 0) * some.get('tensor_bytes', 0) / 2**30:.1f} GiB), "
              f"batch {some.get('batch', '?')}, shuffled, cold, medians of {n} rounds")
        print(f"{'case':<30} {'tensors/s':>10} {'GB/s':>7} {'spread':>7} {'cpu s/GB':>9} {'dev/data':>9} "
              f"{'vs dali':>8} {'vs np.load':>10} {'vs fio best':>11}")
        for c, rs in cases.items():
            v = med[c]
            gbs = statistics.median(r["bytes_per_s"] for r in rs) / 1e9
            vals = [r["samples_per_s"] for r in rs]
            spread = (max(vals) - min(vals)) / v if v else 0
            data = rs[0]["files"] * rs[0]["tensor_bytes"]
            cpu = (statistics.median(r["cpu_seconds"] / (data / 1e9) for r in rs)
                   if all("cpu_seconds" in r for r in rs) else None)
            devr = statistics.median(r["dev_bytes"] / data for r in rs)
            name = c + (" (best)" if c == best else "")
            cells = [f"{v / ref:>7.2f}x" if ref else f"{'-':>8}" for ref in refs.values()]
            print(f"{name:<30} {v:>10.1f} {gbs:>7.2f} {spread:>6.0%} {cpu if cpu is None else f'{cpu:.3f}':>9} "
                  f"{devr:>9.2f} {cells[0]:>8} {cells[1]:>10} {cells[2]:>11}")
        by_why: dict[str, list[str]] = {}
        for c, why in skipped.get(key, {}).items():
            by_why.setdefault(why, []).append(c)
        for why, cs in by_why.items():
            print(f"skipped: {', '.join(cs)}: {why}")
        note = "" if key == GOAL_AT else " (set for the RAM device, 16 MiB tensors; shown for comparison)"
        print(f"{dev} device, {sizename(size)} tensors: goals{note}")
        for case, ref, what, want in GOALS:
            a, b = med.get(case), refs.get(ref)
            got = f"{a / b:.2f}x" if a and b else "not measured"
            verdict = ("met" if a / b >= want else "MISSED") if a and b else ""
            print(f"  {what + f' (>= {want})':<52} {got:>12}  {verdict}")
    print("\nspread: (max - min) / median of the rounds. dev/data: bytes read from the loop device per tensor data")
    print("byte (its sysfs stat around each case). cpu s/GB: the reading process's user+sys (the RAM device's copy")
    print("runs in kernel workers, not counted). fio best: the device's limit for these bytes: every tensor's data")
    print("extents (4 KiB-rounded), shuffled, the best median of the fio settings shown.")


if __name__ == "__main__":
    main()
