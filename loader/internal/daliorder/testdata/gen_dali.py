# SPDX-License-Identifier: Apache-2.0
"""Writes dali.json: the samples real DALI's fn.readers.file returns, for
package daliorder's test. Each case names the reader's arguments and lists
the sample indices (the file's position in the list) of its first epochs
as one flat sequence, padding included.

Run with DALI installed (CPU is enough), from this directory:

    ../../../../.venv/bin/python gen_dali.py > dali.json
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import numpy as np
from nvidia.dali import __version__ as dali_version
from nvidia.dali import fn, pipeline_def

EPOCHS = 3

# (N, batch_size, initial_fill, seed, num_shards, shard_id, pad_last_batch, stick_to_shard, random_shuffle)
# and, for shuffle_after_epoch's cases, its shuffle_after_epoch_seed (None: not passed)
CASES: list[tuple] = [
    (20, 4, 8, 7, 1, 0, False, False, True),
    (45, 9, 1024, 0, 1, 0, False, False, True),
    (100, 8, 16, 42, 3, 1, False, False, True),
    (100, 8, 16, 42, 3, 1, True, False, True),
    (100, 8, 16, 42, 3, 2, True, True, True),
    (101, 5, 7, 1, 4, 3, False, True, True),
    (257, 16, 1024, 123456789, 2, 0, True, False, True),
    (257, 16, 100, 2**32 + 5, 8, 5, False, False, True),
    (17, 3, 3000, 9, 2, 1, True, True, True),
    (1000, 32, 1, 3, 4, 0, False, False, True),
    (1000, 32, 64, 2**31, 4, 2, True, False, True),
    (999, 10, 1024, 11, 1, 0, False, True, True),
    (33, 4, 5, 5, 3, 0, True, False, False),
    (33, 4, 5, 5, 3, 2, False, True, False),
    (7, 2, 2, 0, 7, 6, True, False, True),
    (64, 64, 1024, 77, 1, 0, True, False, True),
    (11, 3, 1, 0, 2, 0, True, False, False, None),
    (11, 3, 1, 0, 2, 1, True, False, False, None),
    (24, 2, 1, 5, 1, 0, False, False, False, None),
    (24, 24, 1, 5, 1, 0, False, False, False, 0),
    (101, 8, 1, 9, 4, 3, False, False, False, 12345),
    (100, 7, 1, 1, 3, 1, True, False, False, 2**40 + 3),
    (5, 4, 1, 0, 5, 2, True, False, False, -1),
    (1000, 32, 1, 3, 4, 2, True, False, False, 524287),
]


def run(root: str, case: tuple) -> list[int]:
    n, bs, fill, seed, shards, sid, pad, stick, shuffle = case[:9]
    after = {}
    if len(case) > 9:  # shuffle_after_epoch, with its seed where one is given
        after = {"shuffle_after_epoch": True}
        if case[9] is not None:
            after["shuffle_after_epoch_seed"] = case[9]
    files = [os.path.join(root, f"{i:06d}") for i in range(n)]

    @pipeline_def(batch_size=bs, num_threads=1, device_id=None, seed=1, prefetch_queue_depth=1)
    def pipe():
        _, labels = fn.readers.file(files=files, labels=list(range(n)), random_shuffle=shuffle, initial_fill=fill,
                                    seed=seed, num_shards=shards, shard_id=sid, pad_last_batch=pad,
                                    stick_to_shard=stick, **after)
        return labels

    p = pipe()
    p.build()
    per = -(-n // shards)
    want = EPOCHS * (-(-per // bs) * bs if pad else per)  # at least this many samples
    out: list[int] = []
    while len(out) < want:
        (labels,) = p.run()
        out += [int(np.array(labels[i]).reshape(-1)[0]) for i in range(len(labels))]
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as root:
        for i in range(max(c[0] for c in CASES)):
            with open(os.path.join(root, f"{i:06d}"), "wb") as f:
                f.write(b"%d" % i)
        cases = []
        for c in CASES:
            n, bs, fill, seed, shards, sid, pad, stick, shuffle = c[:9]
            case = {"n": n, "batch_size": bs, "initial_fill": fill, "seed": seed, "num_shards": shards,
                    "shard_id": sid, "pad_last_batch": pad, "stick_to_shard": stick, "random_shuffle": shuffle}
            if len(c) > 9:
                case["shuffle_after_epoch"] = True
                if c[9] is not None:
                    case["shuffle_after_epoch_seed"] = c[9]
            cases.append(case | {"samples": run(root, c)})
    json.dump({"dali": dali_version, "epochs": EPOCHS, "cases": cases}, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
