# SPDX-License-Identifier: Apache-2.0
"""Shuffle quality on class-sorted WebDataset shards (bench/wds_dataset.py:
classes stored class after class, each sample's .cls its class and .idx
its stored position). For each reader, one epoch's order: the mean
fraction of a batch (64) drawn from its two most frequent classes, the
share of batches with 80 % or more from two classes, and how far samples
move from their stored positions (largest and mean distance, as a
fraction of the dataset), against a uniform permutation's. Readers:
fn.readers.webdataset (random_shuffle, default and large initial_fill),
webdataset.WebDataset (shardshuffle and a shuffle buffer), and with
--socket this project's global permutation (LoaderSource, shuffle
"permute") and its shuffle="dali" (which must equal DALI's).

Usage: python3 bench/wds_shuffle.py --root DIR [--socket SOCK --dataset NAME] [--batch 64] [--fill 16384]"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tarfile
from typing import Callable

import numpy as np

Order = list[tuple[int, int]]  # (class, stored position) in reading order


def dali(paths: list[str], n: int, batch: int, fill: int, seed: int) -> Order:
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=batch, num_threads=2, device_id=None, seed=seed)
    def pipe():  # type: ignore[no-untyped-def]
        return tuple(fn.readers.webdataset(paths=paths, ext=["cls", "idx"], random_shuffle=True, initial_fill=fill,
                                           seed=seed, name="r"))

    p = pipe()
    p.build()
    out: Order = []
    while len(out) < n:
        cls, idx = p.run()
        out += [(int(np.asarray(cls[i]).tobytes()), int(np.asarray(idx[i]).tobytes())) for i in range(len(cls))]
    return out[:n]


def webdataset(paths: list[str], n: int, buffer: int, seed: int) -> Order:
    import webdataset as wds
    ds = wds.WebDataset(paths, shardshuffle=len(paths), seed=seed).shuffle(buffer).to_tuple("cls", "idx")
    return [(int(c), int(i)) for c, i in ds][:n]


def nvfeed(socket: str, dataset: str, n: int, batch: int, shuffle: str, seed: int, fill: int) -> Order:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    from nvfeed import LoaderSource
    out: Order = []
    with LoaderSource(dataset, socket=socket, batch_size=batch, ext=["cls", "idx"], random_shuffle=True, seed=seed,
                      shuffle=shuffle, initial_fill=fill) as src:
        for cls, idx in src:
            out += [(int(c.tobytes()), int(i.tobytes())) for c, i in zip(cls, idx)]
    return out[:n]


def _stored(paths: list[str]) -> Order:
    """Every sample's (class, position) in stored order, read from the shards."""
    out: Order = []
    for p in paths:
        with tarfile.open(p) as t:
            cls = None
            for m in t:
                if m.name.endswith((".cls", ".idx")):
                    v = int(t.extractfile(m).read())  # type: ignore[union-attr]
                    if m.name.endswith(".cls"):
                        cls = v
                    else:
                        out.append((int(cls), v))  # type: ignore[arg-type]
    return out


def quality(order: Order, n: int, batch: int) -> tuple[float, float, float, float]:
    """(mean top-2 share of a batch, share of batches >= 80 % from two
    classes, largest move / n, mean move / n)."""
    cls = np.array([c for c, _ in order])
    idx = np.array([i for _, i in order])
    shares = []
    for b in range(len(cls) // batch):
        counts = np.sort(np.bincount(cls[b * batch:(b + 1) * batch]))[::-1]
        shares.append(counts[:2].sum() / batch)
    moved = np.abs(np.arange(len(idx)) - idx)
    assert sorted(idx.tolist()) == list(range(n)), "not one epoch of every sample"
    return float(np.mean(shares)), float(np.mean(np.array(shares) >= 0.8)), moved.max() / n, moved.mean() / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--socket")
    ap.add_argument("--dataset", default="wds")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--fill", type=int, default=16384, help="the large initial_fill")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    paths = sorted(glob.glob(os.path.join(a.root, "*.tar")))
    stored = _stored(paths)
    n = len(stored)
    rng = np.random.default_rng(a.seed)
    cases: list[tuple[str, Callable[[], Order]]] = [
        ("uniform permutation (reference)", lambda: [stored[i] for i in rng.permutation(n)]),
        ("fn.readers.webdataset initial_fill=1024 (default)", lambda: dali(paths, n, a.batch, 1024, a.seed)),
        (f"fn.readers.webdataset initial_fill={a.fill}", lambda: dali(paths, n, a.batch, a.fill, a.seed)),
        ("webdataset shardshuffle + shuffle(1000)", lambda: webdataset(paths, n, 1000, a.seed)),
        ("webdataset shardshuffle + shuffle(10000)", lambda: webdataset(paths, n, 10000, a.seed)),
    ]
    if a.socket:
        cases += [("nvfeed permute (global, default)", lambda: nvfeed(a.socket, a.dataset, n, a.batch, "permute",
                                                                       a.seed, 1024)),
                  ("nvfeed shuffle=\"dali\" initial_fill=1024", lambda: nvfeed(a.socket, a.dataset, n, a.batch, "dali",
                                                                               a.seed, 1024))]
    print(f"wds shuffle quality: {n} samples, {len(paths)} shards, classes stored in order, batch {a.batch}")
    print(f"{'reader':52} {'top-2 share':>11} {'>=80% top-2':>11} {'max move':>9} {'mean move':>9}")
    orders: dict[str, Order] = {}
    for name, run in cases:
        order = run()
        orders[name] = order
        top2, hi, mx, mean = quality(order, n, a.batch)
        print(f"{name:52} {top2:11.3f} {hi:11.3f} {mx:9.3f} {mean:9.3f}")
    same = [k for k in orders if k.startswith("nvfeed shuffle")]
    if same:
        d = orders["fn.readers.webdataset initial_fill=1024 (default)"]
        print(f"nvfeed shuffle=\"dali\" equals fn.readers.webdataset's order: {orders[same[0]] == d}")


if __name__ == "__main__":
    main()
