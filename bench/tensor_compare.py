# SPDX-License-Identifier: Apache-2.0
"""The tensor benchmarks' records and summary (bench/tensors.sh, and the
tensor run of bench/gpu.sh).

    tag --case C --round R --device D --size S --dev-bytes N --tensor-bytes T --shape A,B --batch B --files F
        reads one result (the last line of stdin: a JSON object in
        `loaderd bench --json`'s shape) and prints it with those fields
    skip --case C --device D --size S --why REASON
        prints a skipped case's record
    summary [--gpu] < records
        per device and tensor size: each case's median tensors/s and GB/s,
        the spread of its rounds ((max - min) / median), its process CPU
        seconds per GB, the bytes the device read per data byte (dev/data:
        1.00 means every tensor came from the device, once; - where not
        known), and its ratios to the references: fn.readers.numpy (CPU),
        the np.load loop and fio's best (the best median of the fio
        settings), then the goals; with --gpu (into GPU memory): to
        fn.readers.numpy(device="gpu") and torch.from_numpy(np.load(f)).cuda()."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

GOALS = [  # (case, reference column or case, what, at least; None: context, no goal)
    ("loaderd gds", "vs dali", "loaderd gds vs fn.readers.numpy (CPU)", 1.5),
    ("loaderd gds", "vs fio best", "loaderd gds vs fio best", 0.9),
    ("loaderd gds", "pread ring qd4 512MiB", "(context) vs pread ring into 512 MiB", None),
    ("pread ring qd4 512MiB", "pread ring qd4 4MiB", "(context) pread ring: 512 MiB vs 4 MiB destination", None),
]
GOAL_AT = ("ram", "16m")  # the goals are for the RAM device, 16 MiB tensors
DALI_GPU = "dali readers.numpy gpu"
TORCH_GPU = "torch np.load .cuda()"


def sizename(size: str) -> str:
    return {"256k": "256 KiB", "16m": "16 MiB"}.get(size, size)


def tag(a: argparse.Namespace) -> None:
    lines = sys.stdin.read().strip().splitlines()
    if not lines:
        sys.exit(f"tensor_compare tag: {a.case}: no result on stdin")
    r = json.loads(lines[-1])
    r.update(case=a.case, round=a.round, device=a.device, size=a.size, dev_bytes=a.dev_bytes,
             tensor_bytes=a.tensor_bytes, shape=a.shape, batch=a.batch, files=a.files)
    print(json.dumps(r))


def skip(a: argparse.Namespace) -> None:
    print(json.dumps({"case": a.case, "device": a.device, "size": a.size, "skipped": a.why}))


def summary(a: argparse.Namespace) -> None:
    rows: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {}
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
        if a.gpu:
            refs = {"vs dali gpu": med.get(DALI_GPU), "vs torch": med.get(TORCH_GPU)}
        else:
            refs = {"vs dali": med.get("dali readers.numpy"), "vs np.load": med.get("np.load loop"),
                    "vs fio best": med.get(best) if best else None}
        some = next(iter(cases.values()), [{}])[0]
        n = max((len(rs) for rs in cases.values()), default=0)
        where = "into GPU memory" if a.gpu else "into host memory"
        print(f"\n{dev} device, {sizename(size)} tensors (float32 {some.get('shape', '?').replace(',', 'x')}, "
              f"{some.get('files', '?')} files, {some.get('files', 0) * some.get('tensor_bytes', 0) / 2**30:.1f} GiB) "
              f"{where}, batch {some.get('batch', '?')}, shuffled, cold, medians of {n} rounds")
        print(f"{'case':<30} {'tensors/s':>10} {'GB/s':>7} {'spread':>7} {'cpu s/GB':>9} {'dev/data':>9}"
              + "".join(f" {k:>11}" for k in refs))
        for c, rs in cases.items():
            v = med[c]
            gbs = statistics.median(r["bytes_per_s"] for r in rs) / 1e9
            vals = [r["samples_per_s"] for r in rs]
            spread = (max(vals) - min(vals)) / v if v else 0
            data = rs[0]["files"] * rs[0]["tensor_bytes"]
            cpu = (f"{statistics.median(r['cpu_seconds'] / (data / 1e9) for r in rs):.3f}"
                   if all("cpu_seconds" in r for r in rs) else "-")
            devr = f"{statistics.median(r['dev_bytes'] / data for r in rs):.2f}" \
                if all(r.get("dev_bytes", -1) >= 0 for r in rs) else "-"
            name = c + (" (best)" if c == best else "")
            cells = "".join(f" {f'{v / ref:.2f}x' if ref else '-':>11}" for ref in refs.values())
            print(f"{name:<30} {v:>10.1f} {gbs:>7.2f} {spread:>7.0%} {cpu:>9} {devr:>9}{cells}")
        by_why: dict[str, list[str]] = {}
        for c, why in skipped.get(key, {}).items():
            by_why.setdefault(why, []).append(c)
        for why, cs in by_why.items():
            print(f"skipped: {', '.join(cs)}: {why}")
        if a.gpu:
            continue
        # Here, not at the top: bench/gpu.sh copies this file alone and
        # runs no goals.
        from rounds import by_round, ratio as round_ratio, verdict as rounds_verdict
        refcase = {"vs dali": "dali readers.numpy", "vs np.load": "np.load loop", "vs fio best": best or ""}
        note = "" if key == GOAL_AT else " (set for the RAM device, 16 MiB tensors; shown for comparison)"
        print(f"{dev} device, {sizename(size)} tensors: goals{note}")
        for case, col, what, want in GOALS:
            got, ref = med.get(case), refs.get(col, med.get(col))
            if want is None and not (got and ref):
                continue
            cell = f"{got / ref:.2f}x" if got and ref else "not measured"
            verdict = ("met" if got / ref >= want else "MISSED") if got and ref and want else ""
            rc = refcase.get(col, col)
            if got and ref and rc in cases:  # the ratio round by round, with its spread
                try:
                    f = round_ratio(by_round(cases[case], "samples_per_s"), by_round(cases[rc], "samples_per_s"))
                    cell = f"{f.text()}x over {f.rounds} rounds"
                    verdict = rounds_verdict(f, ">=", want) if want else ""
                except ValueError as e:  # a case skipped in some rounds: the medians' ratio, saying so
                    verdict += f" ({e})"
            print(f"  {what + (f' (>= {want})' if want else ''):<52} {cell:>30}  {verdict}".rstrip())
    print("\nspread: (max - min) / median of the rounds. dev/data: bytes read from the loop device per tensor data")
    print("byte (its sysfs stat around each case). cpu s/GB: the reading process's user+sys (the RAM device's copy")
    print("runs in kernel workers, not counted). dev/data above 1.00: a reader's prefetch reading on into the next")
    print("epoch (loaderd: about 3 batches, 1.09 at 16 MiB; DALI with O_DIRECT), or whole 4 KiB blocks around each")
    print("256 KiB tensor's 128-byte header and its end (1.02).")
    if not a.gpu:
        print("fio best: the device's limit for these bytes: every tensor's data extents (4 KiB-rounded), shuffled,")
        print("the best median of the fio settings shown. fio reads into iodepth x request bytes of buffers, which")
        print("stay in the CPU's cache; pread ring: the same reads into a 4 MiB or a loader-sized 512 MiB destination.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tag")
    for f in ("case", "device", "size", "shape"):
        t.add_argument("--" + f, required=True)
    for f in ("round", "dev-bytes", "tensor-bytes", "batch", "files"):
        t.add_argument("--" + f, type=int, required=True)
    s = sub.add_parser("skip")
    for f in ("case", "device", "size", "why"):
        s.add_argument("--" + f, required=True)
    m = sub.add_parser("summary")
    m.add_argument("--gpu", action="store_true", help="GPU memory: references are DALI's GPU reader and torch")
    a = ap.parse_args()
    {"tag": tag, "skip": skip, "summary": summary}[a.cmd](a)


if __name__ == "__main__":
    main()
