# SPDX-License-Identifier: Apache-2.0
"""The ROI benchmark's readers (bench/roi.sh): one epoch of a flat .npy
dataset (bench/npy_dataset.py) read whole or as a region of interest,
printing one JSON object (samples, bytes: the arrays' bytes returned,
seconds: from the reader set up to the epoch's last batch; with --dev,
timed_dev_bytes: the bytes that device read meanwhile):

    nvfeed --socket S --dataset NAME --backend B   LoaderSource(NAME, backend=B) through loaderd
    dali --root DIR [--no-mmap]                    fn.readers.numpy (CPU, num_threads 2)
    summary < results.jsonl                        bench/roi.sh's table from its cases' lines

--roi takes the region as JSON, the fn.readers.numpy arguments by name
(e.g. '{"roi_start": [96, 96, 96], "roi_end": [160, 160, 160]}'); none:
whole arrays. --expect SHAPE (comma-separated) checks every sample's
shape, so a case that read the wrong region fails instead of timing."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import numpy as np


def dev_bytes(dev: str) -> int:
    """Bytes read from block device dev (e.g. loop3) so far; 0 without one."""
    if not dev:
        return 0
    with open(f"/sys/block/{dev}/stat") as f:
        return int(f.read().split()[2]) * 512


def nvfeed(a: argparse.Namespace, roi: dict[str, Any]) -> tuple[int, int, float, list[tuple[int, ...]]]:
    from nvfeed import LoaderSource

    n = nbytes = 0
    shapes: set[tuple[int, ...]] = set()
    with LoaderSource(a.dataset, socket=a.socket, batch_size=a.batch_size, backend=a.backend, zero_copy=True,
                      **roi) as src:  # views, as measured
        a.dev0, t0 = dev_bytes(a.dev), time.perf_counter()
        for batch in src:
            arrays = list(batch) if isinstance(batch, np.ndarray) else batch
            for x in arrays:
                shapes.add(tuple(x.shape))
                nbytes += x.nbytes
            n += len(arrays)
        return n, nbytes, time.perf_counter() - t0, sorted(shapes)


def dali(a: argparse.Namespace, roi: dict[str, Any]) -> tuple[int, int, float, list[tuple[int, ...]]]:
    import nvidia.dali.fn as fn
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=a.batch_size, num_threads=2, device_id=None)  # type: ignore[arg-type]
    def pipe():  # type: ignore[no-untyped-def]
        kw = dict(roi)
        if a.no_mmap:
            kw["dont_use_mmap"] = True
        return fn.readers.numpy(file_root=a.root, name="r", **kw)

    p = pipe()
    p.build()
    size = p.epoch_size("r")
    n = nbytes = 0
    shapes: set[tuple[int, ...]] = set()
    a.dev0, t0 = dev_bytes(a.dev), time.perf_counter()
    while n < size:
        (out,) = p.run()
        for i in range(min(len(out), size - n)):  # the last batch is padded to batch_size
            x = out.at(i)
            shapes.add(tuple(x.shape))
            nbytes += x.nbytes
            n += 1
    return n, nbytes, time.perf_counter() - t0, sorted(shapes)


def summary() -> None:
    """bench/roi.sh's tables from its cases' JSON lines on stdin: medians
    over rounds of the bytes returned, the bytes read from the device and
    the seconds (with their spread), each region against the same case
    reading whole arrays; then the merge-gap sweep."""
    runs: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for line in sys.stdin:
        if line.strip():
            r = json.loads(line)
            runs.setdefault((r["section"], r["region"], r["case"]), []).append(r)

    def med(key: tuple[str, str, str]) -> tuple[float, float, float, float, float, float]:
        rs = runs[key]
        secs = [r["out"]["seconds"] for r in rs]
        return (statistics.median(r["out"]["bytes"] for r in rs) / 2**20,
                statistics.median(r["out"].get("timed_dev_bytes", r["dev_bytes"]) for r in rs) / 2**20,
                statistics.median(secs), min(secs), max(secs),
                statistics.median(r["dev_bytes"] for r in rs) / 2**20)

    mib = "MiB"
    print(f"{'region':<9} {'case':<13} {'returned':>10} {'device':>10} {'dev/ret':>8} {'seconds':>8} "
          f"{'spread':>15} {'GB/s ret':>9} {'dev vs whole':>13} {'time vs whole':>14} {'dev w/ open':>12}")
    for (section, region, case) in runs:
        if section != "roi":
            continue
        ret, dev, s, lo, hi, dev_all = med((section, region, case))
        whole = ("roi", "whole", case)
        vs_dev = vs_t = "-"
        if region != "whole" and whole in runs:
            _, wdev, ws, *_ = med(whole)
            vs_dev = f"{dev / wdev:.4f}x" if wdev else "-"
            vs_t = f"{ws / s:.1f}x faster" if s else "-"
        print(f"{region:<9} {case:<13} {ret:>7.1f} {mib} {dev:>7.1f} {mib} {dev / ret if ret else 0:>7.2f}x "
              f"{s:>8.3f} {f'[{lo:.3f}, {hi:.3f}]':>15} {ret * 2**20 / s / 1e9 if s else 0:>9.3f} {vs_dev:>13} {vs_t:>14} "
              f"{dev_all:>8.1f} {mib}")
    gaps = sorted({k[0] for k in runs if k[0] != "roi"}, key=lambda g: int(g.split()[-1]))
    if gaps:
        print()
        print("merge gap (loader/roi.go roiGap), nvfeed gds")
        print(f"{'gap':<13} {'region':<9} {'device':>10} {'seconds':>8} {'spread':>15}")
        for g in gaps:
            for (section, region, case) in runs:
                if section == g:
                    _, dev, s, lo, hi, _ = med((section, region, case))
                    print(f"{g:<13} {region:<9} {dev:>7.1f} {mib} {s:>8.3f} {f'[{lo:.3f}, {hi:.3f}]':>15}")
    print(f"\n(medians of {max((len(v) for v in runs.values()), default=0)} rounds; returned: the arrays' bytes; "
          "device: bytes the loop device read while the epoch was timed; dev w/ open: the same over the whole "
          "case, the reader's set-up included)")


def main() -> None:
    if sys.argv[1:2] == ["summary"]:
        summary()
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="reader", required=True)
    for name in ("nvfeed", "dali"):
        p = sub.add_parser(name)
        p.add_argument("--batch-size", type=int, default=4)
        p.add_argument("--roi", default="", help="the region's fn.readers.numpy arguments, as JSON")
        p.add_argument("--expect", default="", help="every sample's shape, comma-separated")
        p.add_argument("--dev", default="", help="the block device (e.g. loop3) whose bytes read while timed are counted")
        if name == "nvfeed":
            p.add_argument("--socket", required=True)
            p.add_argument("--dataset", required=True)
            p.add_argument("--backend", required=True)
        else:
            p.add_argument("--root", required=True)
            p.add_argument("--no-mmap", action="store_true")
    a = ap.parse_args()
    roi = json.loads(a.roi) if a.roi else {}
    n, nbytes, secs, shapes = (nvfeed if a.reader == "nvfeed" else dali)(a, roi)
    timed_dev = dev_bytes(a.dev) - a.dev0
    if a.expect:
        want = tuple(int(x) for x in a.expect.split(","))
        if shapes != [want]:
            raise SystemExit(f"roi_read: {a.reader} read samples of shapes {shapes}, want {want}")
    print(json.dumps({"samples": n, "bytes": nbytes, "seconds": secs, "timed_dev_bytes": timed_dev}))


if __name__ == "__main__":
    main()
