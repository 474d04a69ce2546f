# SPDX-License-Identifier: Apache-2.0
"""Writes dali.json: the samples real DALI's fn.readers.webdataset returns,
for package wdsorder's test. Each case names the reader's arguments and the
number of tar shards the N samples are split across, and lists the sample
indices (a sample's position in shard and member order, stored in its
.cls member) of its first epochs as one flat sequence, padding included.

Run with DALI installed (CPU is enough), from this directory:

    ../../../../.venv/bin/python gen_dali.py > dali.json
"""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
import tempfile

import numpy as np
from nvidia.dali import __version__ as dali_version
from nvidia.dali import fn, pipeline_def

EPOCHS = 3

# (N, tars, batch_size, initial_fill, seed, num_shards, shard_id, pad_last_batch, stick_to_shard, random_shuffle)
CASES = [
    (20, 1, 4, 8, 7, 1, 0, False, False, True),
    (45, 3, 9, 1024, 0, 1, 0, False, False, True),
    (100, 4, 8, 16, 42, 3, 1, False, False, True),
    (100, 4, 8, 16, 42, 3, 1, True, False, True),
    (100, 2, 8, 16, 42, 3, 2, True, True, True),
    (101, 5, 5, 7, 1, 4, 3, False, True, True),
    (257, 3, 16, 1024, 123456789, 2, 0, True, False, True),
    (257, 7, 16, 100, 2**32 + 5, 8, 5, False, False, True),
    (17, 2, 3, 3000, 9, 2, 1, True, True, True),
    (1000, 10, 32, 1, 3, 4, 0, False, False, True),
    (1000, 3, 32, 64, 2**31, 4, 2, True, False, True),
    (999, 9, 10, 1024, 11, 1, 0, False, True, True),
    (33, 3, 4, 5, 5, 3, 0, True, False, False),
    (64, 1, 64, 1024, 77, 1, 0, True, False, True),
]


def write(root: str, n: int, tars: int) -> list[str]:
    paths = []
    for t in range(tars):
        p = os.path.join(root, f"n{n}-t{tars}-{t:03d}.tar")
        with tarfile.open(p, "w") as tf:
            for i in range(t * n // tars, (t + 1) * n // tars):
                for ext, data in (("bin", b"x" * (i % 7)), ("cls", b"%d" % i)):
                    ti = tarfile.TarInfo(f"{i:06d}.{ext}")
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))
        paths.append(p)
    return paths


def run(root: str, case: tuple) -> list[int]:
    n, tars, bs, fill, seed, shards, sid, pad, stick, shuffle = case
    paths = write(root, n, tars)

    @pipeline_def(batch_size=bs, num_threads=1, device_id=None, seed=1, prefetch_queue_depth=1)
    def pipe():
        return fn.readers.webdataset(paths=paths, ext=["cls"], random_shuffle=shuffle, initial_fill=fill,
                                     seed=seed, num_shards=shards, shard_id=sid, pad_last_batch=pad,
                                     stick_to_shard=stick)

    p = pipe()
    p.build()
    per = -(-n // shards)
    want = EPOCHS * (-(-per // bs) * bs if pad else per)
    out: list[int] = []
    while len(out) < want:
        (cls,) = p.run()
        out += [int(np.array(cls[i]).tobytes()) for i in range(len(cls))]
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as root:
        cases = []
        for c in CASES:
            n, tars, bs, fill, seed, shards, sid, pad, stick, shuffle = c
            cases.append({"n": n, "tars": tars, "batch_size": bs, "initial_fill": fill, "seed": seed,
                          "num_shards": shards, "shard_id": sid, "pad_last_batch": pad, "stick_to_shard": stick,
                          "random_shuffle": shuffle, "samples": run(root, c)})
    json.dump({"dali": dali_version, "epochs": EPOCHS, "cases": cases}, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
