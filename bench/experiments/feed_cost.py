# SPDX-License-Identifier: Apache-2.0
"""What handing a batch to DALI's fn.external_source costs on the Python
thread, without any reading: DALI's conversion of a list of numpy views
against building one TensorListCPU of them (what LoaderSource does with
batch_format="dali"), and a whole pipe.run() per batch fed either way
(the bytes go to an operator: their shape). Needs DALI.

Usage: python bench/experiments/feed_cost.py [BATCH]
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

import numpy as np
import nvidia.dali.fn as fn
import nvidia.dali.types as types
from nvidia.dali import pipeline_def
from nvidia.dali.backend import TensorCPU, TensorListCPU
from nvidia.dali.external_source import _prep_data_for_feed_input

BS = int(sys.argv[1]) if len(sys.argv) > 1 else 64
STRIDE = 112 << 10  # ~110 KB samples, 4 KiB-aligned, as in batch memory
BATCHES = 50
buf = np.zeros(BS * STRIDE * BATCHES, dtype=np.uint8)
labels = np.zeros((BS, 1), np.int32)


def views(b: int) -> list[Any]:
    base = (b % BATCHES) * BS * STRIDE
    return [buf[base + i * STRIDE: base + i * STRIDE + 100_000 + i] for i in range(BS)]


def tensor_list(v: list[Any]) -> Any:
    return TensorListCPU([TensorCPU(x) for x in v], contiguous=False)


def per_call(f: Callable[[], object], n: int = 2000) -> float:
    f()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t0) / n * 1e6


def pipeline(fmt: str, n: int = 1000) -> float:
    def source():  # type: ignore[no-untyped-def]
        b = 0
        while True:
            v = views(b)
            b += 1
            yield (tensor_list(v), TensorListCPU(labels)) if fmt == "dali" else (v, labels)

    @pipeline_def(batch_size=BS, num_threads=2, device_id=None)
    def pipe():  # type: ignore[no-untyped-def]
        j, lab = fn.external_source(source=source, num_outputs=2, batch=True, no_copy=True,
                                    dtype=[types.UINT8, types.INT32])
        return j.shape(), lab
    p = pipe()
    p.build()
    for _ in range(20):
        p.run()
    t0 = time.perf_counter()
    for _ in range(n):
        p.run()
    return (time.perf_counter() - t0) / n * 1e6


v = views(0)
print(f"batch {BS}, µs per batch on the Python thread")
print(f"  views (numpy slices)                      {per_call(lambda: views(1)):7.1f}")
print(f"  DALI's conversion of a list of views      {per_call(lambda: _prep_data_for_feed_input(v, BS, None)):7.1f}")
print(f"  one TensorListCPU of the views            {per_call(lambda: tensor_list(v)):7.1f}")
print(f"  pipe.run(), fed a list of numpy views     {pipeline('numpy'):7.1f}")
print(f"  pipe.run(), fed a TensorListCPU           {pipeline('dali'):7.1f}")
