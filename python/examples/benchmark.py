# SPDX-License-Identifier: Apache-2.0
"""Read throughput of data sources, with the xNVMe DALI example's interface:

    python benchmark.py --batchsize 64 --batches 1000 python-file --datadir /data/train
    python benchmark.py --batchsize 64 --batches 1000 dali --datadir /data/train
    python benchmark.py --batchsize 64 dali-memory --datadir /data/train
    python benchmark.py --batchsize 64 --batches 1000 loader --socket /run/loaderd/loaderd.sock --dataset train --backend gds
    python benchmark.py --batchsize 64 --batches 1000 loader-dali --socket /run/loaderd/loaderd.sock --dataset train --backend gds

Prints img/s (and MB/s). Timing starts once the source is set up (the
session opened, the pipeline built), as `loaderd bench` times. `loader` iterates LoaderSource alone (the shim's
own cost); `loader-dali` and `dali` run DALI pipelines that read only (no
decode), so the figures compare data sources, not decoders. --batches 0
reads one epoch. --json prints one JSON object instead. `dali-memory` is the
ceiling: external_source over the files already in memory. --consume
operator hands the bytes to an operator (their shape, standing in for a
decoder) instead of returning them, which DALI does with a copy.
`loader-dali` and `dali-memory` hand DALI one TensorListCPU of views per
batch (--batch-format dali, the default) or a list of numpy views
(--batch-format numpy).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import time

import numpy as np


from nvfeed import LoaderSource

EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".pnm", ".ppm", ".pgm", ".pbm", ".jp2", ".webp")


def _files(datadir: str) -> list[str]:
    classes = sorted((d for d in os.listdir(datadir) if os.path.isdir(os.path.join(datadir, d))), key=os.fsencode)
    return [os.path.join(datadir, c, f) for c in classes
            for f in sorted(os.listdir(os.path.join(datadir, c)), key=os.fsencode) if f.lower().endswith(EXTS)]


def python_file(a: argparse.Namespace) -> tuple[int, int, float]:
    files = _files(a.datadir)
    random.Random(0).shuffle(files)
    nb = a.batches or (len(files) + a.batchsize - 1) // a.batchsize
    n = nbytes = 0
    t0 = time.perf_counter()
    for b in range(nb):
        chunk = [files[(b * a.batchsize + i) % len(files)] for i in range(a.batchsize)]
        arrs = [np.fromfile(p, dtype=np.uint8) for p in chunk]
        n += len(arrs)
        nbytes += sum(x.size for x in arrs)
    return n, nbytes, time.perf_counter() - t0


def loader(a: argparse.Namespace) -> tuple[int, int, float]:
    n = nbytes = 0
    # zero_copy: the loader's own rate, views of its batch memory (a loop
    # that keeps batches would take the default, copies)
    with LoaderSource(a.dataset, socket=a.socket, batch_size=a.batchsize, random_shuffle=True,
                      backend=a.backend, prefetch_queue_depth=a.prefetch, transport=a.transport,
                      zero_copy=True) as src:
        t0 = time.perf_counter()
        want = a.batches or len(src)
        while n < want * a.batchsize:
            try:
                samples, _ = next(src)
            except StopIteration:
                if not a.batches:
                    break
                continue
            n += len(samples)
            nbytes += sum(s.size for s in samples)
        return n, nbytes, time.perf_counter() - t0


def _perf(cmd: str) -> None:
    """With PERF_CTL_FIFO set (perf record --delay=-1 --control
    fifo:PATH), turns perf's recording on or off around the timed part."""
    if path := os.environ.get("PERF_CTL_FIFO"):
        with open(path, "w") as f:
            f.write(cmd + "\n")


def _consume(a: argparse.Namespace, jpegs):
    """What a pipeline does with the encoded bytes (--consume): "output"
    returns them (DALI makes pipeline outputs contiguous: one copy of
    every byte); "operator" hands them to an operator that needs no copy
    (its shape, standing in for a decoder) and returns what it gives."""
    return jpegs if a.consume == "output" else jpegs.shape()


def _dali_run(pipe, batches: int) -> tuple[int, int, float]:
    import nvidia.dali.types as types
    pipe.build()
    n = nbytes = 0
    _perf("enable")
    t0 = time.perf_counter()
    for _ in range(batches):
        try:
            data, _ = pipe.run()
        except StopIteration:
            break
        n += len(data)
        if data.dtype == types.INT64:  # --consume operator: each sample's shape
            nbytes += int(data.as_array().sum())
        else:  # one call per batch: a Python call per sample costs ~40% here
            nbytes += sum(s[0] for s in data.shape())
    secs = time.perf_counter() - t0
    _perf("disable")
    return n, nbytes, secs


def dali(a: argparse.Namespace) -> tuple[int, int, float]:
    import nvidia.dali.fn as fn
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=a.batchsize, num_threads=a.threads, device_id=None)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=a.datadir, random_shuffle=True)
        return _consume(a, jpegs), labels
    return _dali_run(pipe(), a.batches or (len(_files(a.datadir)) + a.batchsize - 1) // a.batchsize)


def loader_dali(a: argparse.Namespace) -> tuple[int, int, float]:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    with LoaderSource(a.dataset, socket=a.socket, batch_size=a.batchsize, random_shuffle=True,
                      backend=a.backend, prefetch_queue_depth=a.prefetch, transport=a.transport,
                      batch_format=a.batch_format) as src:
        @pipeline_def(batch_size=a.batchsize, num_threads=a.threads, device_id=None)
        def pipe():
            jpegs, labels = fn.external_source(source=src, num_outputs=2, batch=True, no_copy=True,
                                               dtype=[types.UINT8, types.INT32])
            return _consume(a, jpegs), labels
        return _dali_run(pipe(), a.batches or len(src))


def dali_memory(a: argparse.Namespace) -> tuple[int, int, float]:
    """The ceiling no loader can beat: fn.external_source over the same
    files already in memory (read before the clock starts), fed exactly as
    LoaderSource feeds DALI, one shuffled epoch. With --load-in-clock the
    reading of the files counts too: the ceiling cold, when the caller
    dropped the page cache."""
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    from nvidia.dali.backend import TensorCPU, TensorListCPU

    files = _files(a.datadir)
    classes = {c: i for i, c in enumerate(sorted({os.path.basename(os.path.dirname(f)) for f in files}, key=os.fsencode))}
    # Laid out as loaderd lays out batch memory: one buffer, every sample
    # 4 KiB-aligned, handed to DALI as views (no_copy=True), so the only
    # difference from LoaderSource is the reading.
    sizes = [os.path.getsize(f) for f in files]
    offs, off = [], 0
    for n in sizes:
        offs.append(off)
        off += (n + 4095) // 4096 * 4096
    t0 = time.perf_counter()
    buf = np.empty(off, dtype=np.uint8)

    def load_one(k: int) -> None:  # 16 at once: the page cache's reads overlap
        with open(files[k], "rb", buffering=0) as f:
            if (got := f.readinto(memoryview(buf)[offs[k]:offs[k] + sizes[k]])) != sizes[k]:
                raise OSError(f"{files[k]}: read {got} of {sizes[k]} bytes (changed while loading?)")
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(load_one, range(len(files))))
    load = time.perf_counter() - t0 if a.load_in_clock else 0.0
    # As LoaderSource makes them: numpy views, or memoryview slices for DALI.
    data = [(buf if a.batch_format == "numpy" else buf.data)[o:o + n] for o, n in zip(offs, sizes)]
    labels = [np.array([classes[os.path.basename(os.path.dirname(f))]], dtype=np.int32) for f in files]
    order = list(range(len(files)))
    random.Random(0).shuffle(order)
    nb = (len(order) + a.batchsize - 1) // a.batchsize

    def source():
        for b in range(nb):
            idx = order[b * a.batchsize:(b + 1) * a.batchsize]
            views, lbls = [data[i] for i in idx], np.array([labels[i] for i in idx], dtype=np.int32)
            if a.batch_format == "dali":  # as LoaderSource(batch_format="dali") hands them over
                yield TensorListCPU([TensorCPU(v) for v in views], contiguous=False), TensorListCPU(lbls)
            else:
                yield views, lbls

    @pipeline_def(batch_size=a.batchsize, num_threads=a.threads, device_id=None)
    def pipe():
        jpegs, lbls = fn.external_source(source=source, num_outputs=2, batch=True, no_copy=True,
                                         dtype=[types.UINT8, types.INT32])
        return _consume(a, jpegs), lbls
    n, nbytes, secs = _dali_run(pipe(), a.batches or nb)
    return n, nbytes, secs + load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batchsize", type=int, default=64)
    ap.add_argument("--batches", type=int, default=0, help="batches to read (0: one epoch)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--threads", type=int, default=4, help="DALI pipelines' num_threads")
    ap.add_argument("--consume", default="output", choices=["output", "operator"],
                    help="DALI pipelines: return the bytes (a copy by DALI) or hand them to an operator (no copy)")
    sub = ap.add_subparsers(dest="source", required=True)
    fmt = dict(default="dali", choices=["numpy", "dali"],
               help="what DALI is handed per batch: a TensorListCPU of views (dali) or a list of numpy views")
    for name in ("python-file", "dali", "dali-memory"):
        p = sub.add_parser(name)
        p.add_argument("--datadir", required=True)
        if name == "dali-memory":
            p.add_argument("--batch-format", **fmt)
            p.add_argument("--load-in-clock", action="store_true",
                           help="count reading the files into memory (one epoch: with --batches 0)")
    for name in ("loader", "loader-dali"):
        p = sub.add_parser(name)
        p.add_argument("--socket", default=None, help="default: $NVFEED_SOCKET, else /run/loaderd/loaderd.sock")
        p.add_argument("--dataset", required=True)
        p.add_argument("--backend", default="file", choices=["file", "gds", "bam"])
        p.add_argument("--prefetch", type=int, default=2)
        p.add_argument("--transport", default="stream", choices=["stream", "http"])
        if name == "loader-dali":
            p.add_argument("--batch-format", **fmt)
    a = ap.parse_args()
    if getattr(a, "load_in_clock", False) and a.batches:
        ap.error("--load-in-clock reads one epoch's files: it needs --batches 0")
    run = {"python-file": python_file, "dali": dali, "dali-memory": dali_memory, "loader": loader,
           "loader-dali": loader_dali}[a.source]
    n, nbytes, secs = run(a)
    label = a.source + (f" ({a.backend})" if a.source.startswith("loader") else "")
    if a.json:
        print(json.dumps({"source": label, "samples": n, "bytes": nbytes, "seconds": secs,
                          "samples_per_s": n / secs, "bytes_per_s": nbytes / secs}))
    else:
        print(f"{label:<22} {n:>8} img in {secs:6.2f} s: {n / secs:10.0f} img/s {nbytes / secs / 1e6:9.1f} MB/s")


if __name__ == "__main__":
    main()
