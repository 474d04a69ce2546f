# SPDX-License-Identifier: Apache-2.0
"""bench/gpu.sh's client side, on a GPU machine: exactness and zero copy of
GPU batches, and samples/s into GPU memory against host batches and a
PyTorch baseline. Uses PyTorch where it imports, else CuPy."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from nvfeed import CudaArray, LoaderSource


def files(root: Path) -> tuple[dict[str, tuple[str, int]], list[Path]]:
    """sha256 -> (path, label), and every file, in DALI's order."""
    by_hash, paths = {}, []
    for label, c in enumerate(sorted(os.listdir(root), key=os.fsencode)):
        for f in sorted(os.listdir(root / c), key=os.fsencode):
            p = root / c / f
            by_hash[hashlib.sha256(p.read_bytes()).hexdigest()] = (f"{c}/{f}", label)
            paths.append(p)
    return by_hash, paths


def to_host() -> tuple[str, Callable[[CudaArray], tuple[bytes, int]]]:
    """A copy of a CudaArray back to the host, and the consumer's pointer."""
    try:
        import torch

        def t(x: CudaArray) -> tuple[bytes, int]:
            g = torch.as_tensor(x, device="cuda")
            return g.cpu().numpy().tobytes(), g.data_ptr()
        return "torch", t
    except ImportError:
        import cupy

        def c(x: CudaArray) -> tuple[bytes, int]:
            g = cupy.asarray(x)
            return cupy.asnumpy(g).tobytes(), g.data.ptr
        return "cupy", c


def exact(a: argparse.Namespace) -> int:
    by_hash, _ = files(Path(a.root))
    lib, back = to_host()
    bad, seen = 0, {}
    for shard in range(2):
        with LoaderSource("train", socket=a.socket, batch_size=16, shard_id=shard, num_shards=2, random_shuffle=True,
                          seed=7, backend=a.backend, device="gpu", device_id=0, gpu_path=a.gpu_path) as src:
            if src.gpu_path != a.gpu_path:
                print(f"  {a.backend}: asked for gpu_path {a.gpu_path}, the daemon ran {src.gpu_path}")
                bad += 1
            g = src._gpu
            assert g is not None, "the session's memory is not GPU memory"
            for epoch in range(2):
                for samples, labels in src:
                    for x, lbl in zip(samples, labels[:, 0]):
                        data, ptr = back(x)
                        if not g.ptr <= ptr < g.ptr + g.size or ptr != x.ptr:
                            print(f"  {a.backend}: copy, not a view: consumer pointer {ptr:#x}, sample at {x.ptr:#x}, "
                                  f"allocation [{g.ptr:#x}, +{g.size})")
                            bad += 1
                        hit = by_hash.get(hashlib.sha256(data).hexdigest())
                        if hit is None or hit[1] != int(lbl):
                            bad += 1
                            print(f"  {a.backend}: epoch {epoch} shard {shard}: bytes or label {lbl} match no file")
                            continue
                        seen.setdefault((epoch, shard), []).append(hit[0])
    for epoch in range(2):
        both = seen.get((epoch, 0), []) + seen.get((epoch, 1), [])
        if sorted(both) != sorted(p for p, _ in by_hash.values()):
            bad += 1
            print(f"  {a.backend}: epoch {epoch}: the two shards do not cover the dataset exactly once")
    print(f"{a.backend} {a.gpu_path} ({lib}): {sum(map(len, seen.values()))} samples, "
          f"{'byte- and label-exact, zero copy' if bad == 0 else f'{bad} FAILURES'}")
    return 1 if bad else 0


def drop() -> None:
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def speed(a: argparse.Namespace) -> int:
    import torch
    _, paths = files(Path(a.root))

    def epoch_source(device: str, backend: str = "gds") -> float:
        drop()
        kw: dict[str, Any] = {"gpu_path": "cufile" if backend == "cufile" else "bounce"} if device == "gpu" else {}
        with LoaderSource("train", socket=a.socket, batch_size=64, random_shuffle=True, seed=1, backend=backend,
                          device=device, **kw) as src:  # type: ignore[arg-type]
            t0, n = time.perf_counter(), 0
            for samples, _ in src:
                n += len(samples)
            torch.cuda.synchronize()
            return n / (time.perf_counter() - t0)

    def baseline() -> float:
        drop()
        t0 = time.perf_counter()
        for p in paths:
            torch.frombuffer(bytearray(p.read_bytes()), dtype=torch.uint8).cuda(non_blocking=False)
        torch.cuda.synchronize()
        return len(paths) / (time.perf_counter() - t0)

    rows: dict[str, list[float]] = {"gpu cufile": [], "gpu gds bounce": [], "host gds": [], "torch read + .cuda()": []}
    for _ in range(a.rounds):
        rows["gpu cufile"].append(epoch_source("gpu", "cufile"))
        rows["gpu gds bounce"].append(epoch_source("gpu"))
        rows["host gds"].append(epoch_source("cpu"))
        rows["torch read + .cuda()"].append(baseline())
    med = {k: sorted(v)[len(v) // 2] for k, v in rows.items()}
    base = med["torch read + .cuda()"]
    for k, v in med.items():
        print(f"  {k:<22} {v:>10.0f} samples/s  {v / base:5.2f}x the PyTorch baseline   rounds: "
              + " ".join(f"{x:.0f}" for x in rows[k]))
    print(json.dumps({"medians": med, "rounds": rows}))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["exact", "speed"])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--backend", default="gds")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gpu-path", default="bounce", choices=["bounce", "cufile"])
    a = ap.parse_args()
    return exact(a) if a.mode == "exact" else speed(a)


if __name__ == "__main__":
    sys.exit(main())
