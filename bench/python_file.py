# SPDX-License-Identifier: Apache-2.0
"""The xNVMe DALI example's python-file source as a benchmark: read every
sample of a fn.readers.file dataset with numpy.fromfile in shuffled batches
of 64, and print one JSON object with samples/s."""

from __future__ import annotations

import argparse
import json
import os
import random
import time

import numpy as np

FILTERS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".pnm", ".ppm",
           ".pgm", ".pbm", ".jp2", ".webp", ".flac", ".ogg", ".wav")


def discover(root: str) -> list[tuple[str, int]]:
    """DALI fn.readers.file order: sorted class directories, sorted files."""
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    out = []
    for label, c in enumerate(classes):
        for f in sorted(os.listdir(os.path.join(root, c))):
            if f.lower().endswith(FILTERS):
                out.append((os.path.join(root, c, f), label))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    files = discover(a.root)
    random.Random(a.seed).shuffle(files)
    t0 = time.perf_counter()
    c0 = os.times()
    n = nbytes = 0
    for i in range(0, len(files), a.batch_size):
        batch = [np.fromfile(p, dtype=np.uint8) for p, _ in files[i:i + a.batch_size]]
        labels = np.array([[lbl] for _, lbl in files[i:i + a.batch_size]], dtype=np.int32)
        n += len(batch)
        nbytes += sum(b.size for b in batch)
        del labels
    secs = time.perf_counter() - t0
    c1 = os.times()
    print(json.dumps({"backend": "python-file", "samples": n, "bytes": nbytes, "seconds": secs,
                      "samples_per_s": n / secs, "bytes_per_s": nbytes / secs,
                      "cpu_seconds": (c1.user - c0.user) + (c1.system - c0.system)}))


if __name__ == "__main__":
    main()
