# SPDX-License-Identifier: Apache-2.0
"""Writes a class-sorted WebDataset: CLASSES classes stored class after
class (sample i of class c at position c * per_class + i), in shards of
--per-shard samples named shard-000000.tar... Each sample has a .jpg
(random bytes, lognormal sizes around --mean, or --mean 0 for 16 bytes),
a .cls (its class as decimal text, as webdataset writes labels) and a
.idx (its stored position as decimal text): every reader's order can be
measured from the two small components alone.

Usage: python3 bench/wds_dataset.py --out DIR --classes 100 --per-class 1000 --per-shard 1000 [--mean 110000]
Prints the number of samples."""

from __future__ import annotations

import argparse
import io
import os
import tarfile

import numpy as np


def _add(t: tarfile.TarFile, name: str, data: bytes) -> None:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    ti.mtime = 0
    t.addfile(ti, io.BytesIO(data))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--per-class", type=int, default=1000)
    ap.add_argument("--per-shard", type=int, default=1000)
    ap.add_argument("--mean", type=int, default=0, help="mean .jpg size in bytes (0: 16 bytes each)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    n = a.classes * a.per_class
    sizes = (np.full(n, 16) if a.mean <= 0 else
             np.clip(rng.lognormal(np.log(a.mean) - 0.125, 0.5, n), 1024, 8 * a.mean).astype(np.int64))
    blob = rng.integers(0, 256, int(sizes.max()) + 4096, dtype=np.uint8).tobytes()
    t = None
    for i in range(n):
        if i % a.per_shard == 0:
            if t is not None:
                t.close()
            t = tarfile.open(os.path.join(a.out, f"shard-{i // a.per_shard:06d}.tar"), "w")
        key = f"{i:08d}"
        start = (i * 4099) % 4096
        assert t is not None
        _add(t, f"{key}.jpg", blob[start:start + int(sizes[i])])
        _add(t, f"{key}.cls", str(i // a.per_class).encode())
        _add(t, f"{key}.idx", str(i).encode())
    if t is not None:
        t.close()
    print(n)


if __name__ == "__main__":
    main()
