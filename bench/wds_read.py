# SPDX-License-Identifier: Apache-2.0
"""One epoch of a WebDataset (.jpg and .cls of every sample), cold, batch
64, by one reader; prints one JSON line (case, samples, bytes, seconds,
samples/s, MB/s). The page cache is dropped right before the timed part
(after the modules are loaded and DALI's pipeline is built: its index
of the tars, which mkbmap's map stands for on our side, is not timed;
our session's open and the DataLoader's worker start are).

Readers: ``nvfeed`` (LoaderSource, ext=["jpg", "cls"], the global
permutation, --backend), ``nvfeed-dali`` (nvfeed.dali.reader in a DALI
pipeline, shuffle="permute"), ``dali`` (fn.readers.webdataset,
sequential: its fast case), ``webdataset`` (webdataset.WebDataset with
shardshuffle and shuffle(1000), batched, DataLoader(num_workers=2)).

Usage: python3 bench/wds_read.py READER --root DIR [--socket S --dataset NAME --backend gds]
       python3 bench/wds_read.py --table < JSON-LINES   (a table with the ratios)"""

from __future__ import annotations

import argparse
import glob
import importlib
import json
import os
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))


def drop() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def nvfeed(a: argparse.Namespace, paths: list[str]) -> tuple[int, int]:
    from nvfeed import LoaderSource
    n = b = 0
    with LoaderSource(a.dataset, socket=a.socket, batch_size=a.batch, ext=["jpg", "cls"], random_shuffle=True,
                      seed=1, backend=a.backend, zero_copy=True) as src:  # views, as measured
        for jpg, cls in src:
            n += len(jpg)
            b += sum(x.nbytes for x in jpg) + sum(x.nbytes for x in cls)
    return n, b


def _run_dali(build: Callable[[], Any], size: int, batch: int) -> tuple[int, int]:
    p = build()
    p.build()
    drop()
    global _t0
    _t0 = time.perf_counter()
    n = b = 0
    while n < size:
        outs = p.run()
        k = min(len(outs[0]), size - n)
        n += k
        b += sum(int(s[0]) for o in outs for s in o.shape()[:k])
    return n, b


def dali(a: argparse.Namespace, paths: list[str]) -> tuple[int, int]:
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=a.batch, num_threads=2, device_id=None, prefetch_queue_depth=2)
    def pipe():  # type: ignore[no-untyped-def]
        return tuple(fn.readers.webdataset(paths=paths, ext=["jpg", "cls"], name="r"))

    return _run_dali(pipe, a.samples, a.batch)


def nvfeed_dali(a: argparse.Namespace, paths: list[str]) -> tuple[int, int]:
    import nvfeed.dali
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=a.batch, num_threads=2, device_id=None, prefetch_queue_depth=2, seed=1)
    def pipe():  # type: ignore[no-untyped-def]
        return tuple(nvfeed.dali.reader(a.dataset, socket=a.socket, ext=["jpg", "cls"], random_shuffle=True,
                                        shuffle="permute", backend=a.backend))

    drop()  # the session opens (and reads ahead) at the first batch: timed from here
    return _run_dali(pipe, a.samples, a.batch)


def webdataset(a: argparse.Namespace, paths: list[str]) -> tuple[int, int]:
    import torch.utils.data
    import webdataset as wds
    ds = (wds.WebDataset(paths, shardshuffle=len(paths), seed=1, workersplitter=wds.split_by_worker)
          .shuffle(1000).to_tuple("jpg", "cls").batched(a.batch, partial=True))
    n = b = 0
    for jpg, cls in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2):
        n += len(jpg)
        b += sum(len(x) for x in jpg) + sum(len(x) for x in cls)
    return n, b


_t0 = 0.0


def table(lines: list[str]) -> None:
    """Prints the JSON lines of a run as a table: each case's rate, and
    the ratios to fn.readers.webdataset's and webdataset's on its device
    (the case names start with the device)."""
    rows = [json.loads(x) for x in lines if x.startswith("{")]
    ref: dict[tuple[str, str], float] = {}
    for r in rows:
        dev = r["case"].split()[0]
        for key, what in (("dali", "fn.readers.webdataset"), ("wds", "webdataset shuffled")):
            if what in r["case"]:
                ref[(dev, key)] = r["samples_per_s"]
    print(f"{'case':66} {'samples/s':>9} {'MB/s':>7} {'vs DALI seq':>11} {'vs webdataset':>13}")
    for r in rows:
        dev = r["case"].split()[0]
        ratio = [f"{r['samples_per_s'] / ref[(dev, k)]:.2f}x" if (dev, k) in ref else "-" for k in ("dali", "wds")]
        print(f"{r['case']:66} {r['samples_per_s']:9.0f} {r['MB_s']:7.1f} {ratio[0]:>11} {ratio[1]:>13}")


def main() -> None:
    if sys.argv[1:2] == ["--table"]:
        table(sys.stdin.read().splitlines())
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reader", choices=["nvfeed", "nvfeed-dali", "dali", "webdataset"])
    ap.add_argument("--root", required=True)
    ap.add_argument("--socket")
    ap.add_argument("--dataset", default="wds")
    ap.add_argument("--backend", default="gds")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--samples", type=int, required=True, help="the dataset's samples (one epoch)")
    ap.add_argument("--case", help="the name printed (default: the reader)")
    a = ap.parse_args()
    paths = sorted(glob.glob(os.path.join(a.root, "*.tar")))
    # The modules each reader needs, loaded before the timed part.
    for mod in {"nvfeed": ["nvfeed"], "nvfeed-dali": ["nvfeed", "nvfeed.dali"], "dali": ["nvidia.dali.fn"],
                "webdataset": ["torch.utils.data", "webdataset"]}[a.reader]:
        importlib.import_module(mod)
    run = {"nvfeed": nvfeed, "nvfeed-dali": nvfeed_dali, "dali": dali, "webdataset": webdataset}[a.reader]
    global _t0
    if a.reader in ("nvfeed", "webdataset"):
        drop()
    _t0 = time.perf_counter()
    n, b = run(a, paths)
    s = time.perf_counter() - _t0
    print(json.dumps({"case": a.case or a.reader, "samples": n, "bytes": b, "seconds": round(s, 3),
                      "samples_per_s": round(n / s, 1), "MB_s": round(b / s / 1e6, 1)}))


if __name__ == "__main__":
    main()
