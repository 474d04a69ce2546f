# SPDX-License-Identifier: Apache-2.0
"""Writes a tensor dataset for the benchmarks: FILES .npy files made by
np.save, every one the same dtype and shape (so every batch is dense),
named 000000.npy, ... directly in OUT (fn.readers.numpy's file_root with
its default file_filter *.npy). Each array holds random bytes (one random
block, its first element set to the file's index, so no two files are
equal). Prints the number of files, their data bytes and the file size.

Usage: python bench/npy_dataset.py --out DIR --files N --shape 2048,2048 [--dtype float32]"""

from __future__ import annotations

import argparse
import os

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--files", type=int, required=True)
    ap.add_argument("--shape", required=True, help="comma-separated, e.g. 256,256")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    shape = tuple(int(x) for x in a.shape.split(","))
    dt = np.dtype(a.dtype)
    nbytes = int(np.prod(shape)) * dt.itemsize
    rng = np.random.default_rng(a.seed)
    arr = np.frombuffer(rng.bytes(nbytes), dtype=dt).reshape(shape).copy()
    os.makedirs(a.out, exist_ok=True)
    flat = arr.reshape(-1)
    for i in range(a.files):
        flat[0] = i
        np.save(os.path.join(a.out, f"{i:06d}.npy"), arr)
    fsize = os.path.getsize(os.path.join(a.out, f"{0:06d}.npy")) if a.files else 0
    print(a.files, nbytes, fsize)


if __name__ == "__main__":
    main()
