# SPDX-License-Identifier: Apache-2.0
"""The tensor benchmark's reference readers, one epoch of a flat .npy
dataset (bench/npy_dataset.py), each printing one JSON object in
`loaderd bench --json`'s shape (samples, bytes, seconds, samples_per_s,
bytes_per_s, cpu_seconds: this process's user+sys while timed):

    npload --root DIR                 np.load of every file, in a shuffled order
    dali --root DIR --batch-size B    a DALI pipeline of fn.readers.numpy (CPU) alone,
                                      shuffle_after_epoch (a full permutation per epoch),
                                      num_threads 2; --o-direct, --no-mmap: its options
    dali --device gpu ...             fn.readers.numpy(device="gpu") (GPUDirect Storage
                                      where cuFile has it), into GPU memory
    torch-cuda --root DIR             torch.from_numpy(np.load(f)).cuda() per file, shuffled

Timing starts once the reader is set up (DALI: the pipeline built), as
loaderd bench times; GPU cases synchronize the device before the clock
stops. bytes are the arrays' data bytes (not the .npy headers)."""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import random
import time

import numpy as np


def files_of(root: str, pattern: str) -> list[str]:
    """fn.readers.numpy's files of a flat root: bytewise sorted."""
    names = sorted((n for n in os.listdir(root) if fnmatch.fnmatchcase(n, pattern)), key=os.fsencode)
    return [os.path.join(root, n) for n in names]


def cpu() -> float:
    t = os.times()
    return t.user + t.system


def npload(a: argparse.Namespace) -> tuple[int, int, float, float]:
    files = files_of(a.root, a.filter)
    random.Random(a.seed).shuffle(files)
    n = nbytes = 0
    c0, t0 = cpu(), time.perf_counter()
    for f in files:
        x = np.load(f)
        n += 1
        nbytes += x.nbytes
    return n, nbytes, time.perf_counter() - t0, cpu() - c0


def torch_cuda(a: argparse.Namespace) -> tuple[int, int, float, float]:
    import torch
    files = files_of(a.root, a.filter)
    random.Random(a.seed).shuffle(files)
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the context, before the clock
    n = nbytes = 0
    c0, t0 = cpu(), time.perf_counter()
    for f in files:
        t = torch.from_numpy(np.load(f)).cuda()
        n += 1
        nbytes += t.nbytes
        del t
    torch.cuda.synchronize()
    return n, nbytes, time.perf_counter() - t0, cpu() - c0


def dali(a: argparse.Namespace) -> tuple[int, int, float, float]:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    gpu = a.device == "gpu"

    device_id = 0 if gpu else None  # None: a CPU-only pipeline (no CUDA needed)

    @pipeline_def(batch_size=a.batch_size, num_threads=a.threads, device_id=device_id,  # type: ignore[arg-type]
                  prefetch_queue_depth=a.prefetch)
    def pipe():
        kw = {}
        if a.o_direct:  # DALI takes it only with dont_use_mmap
            kw["use_o_direct"] = kw["dont_use_mmap"] = True
        if a.no_mmap:
            kw["dont_use_mmap"] = True
        return fn.readers.numpy(file_root=a.root, file_filter=a.filter, shuffle_after_epoch=True, seed=a.seed,
                                device=a.device, name="r", **kw)
    p = pipe()
    p.build()
    size = p.epoch_size("r")
    steps = (size + a.batch_size - 1) // a.batch_size
    n = nbytes = 0
    c0, t0 = cpu(), time.perf_counter()
    for _ in range(steps):
        (out,) = p.run()
        k = min(len(out), size - n)  # the last batch is padded to batch_size
        itemsize = np.dtype(types.to_numpy_type(out.dtype)).itemsize
        nbytes += sum(int(np.prod(s)) for s in out.shape()[:k]) * itemsize
        n += k
    if gpu:
        try:
            import torch
            torch.cuda.synchronize()
        except ImportError:
            pass
    return n, nbytes, time.perf_counter() - t0, cpu() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="reader", required=True)
    for name in ("npload", "dali", "torch-cuda"):
        p = sub.add_parser(name)
        p.add_argument("--root", required=True)
        p.add_argument("--filter", default="*.npy")
        p.add_argument("--seed", type=int, default=1)
        if name == "dali":
            p.add_argument("--batch-size", type=int, default=64)
            p.add_argument("--threads", type=int, default=2)
            p.add_argument("--prefetch", type=int, default=2)
            p.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
            p.add_argument("--o-direct", action="store_true",
                           help="use_o_direct=True (and dont_use_mmap=True, which it needs)")
            p.add_argument("--no-mmap", action="store_true", help="dont_use_mmap=True")
    a = ap.parse_args()
    n, nbytes, secs, cpus = {"npload": npload, "dali": dali, "torch-cuda": torch_cuda}[a.reader](a)
    print(json.dumps({"backend": a.reader, "samples": n, "bytes": nbytes, "seconds": secs,
                      "samples_per_s": n / secs, "bytes_per_s": nbytes / secs, "cpu_seconds": cpus}))


if __name__ == "__main__":
    main()
