# SPDX-License-Identifier: Apache-2.0
"""bench/gpu.sh's client side: exactness, zero copy and the release rule
of GPU batches, a bytes-only speed comparison, and (with the CUDA stand-in)
its leak and violation report.

``exact``: one source per shard (two shards, two epochs, shuffled) reads
the dataset into GPU memory; a consumer (PyTorch, else CuPy; with the
stand-in, its test kernel) wraps every sample without a copy, checks that
its pointer is the sample's address inside the imported allocation, and
queues a delayed copy of the sample back to the host without waiting
for it. The bytes are compared with the files only at the end of each
epoch, so a slot handed back to the daemon before that queued work ran
shows up as wrong bytes. Shard 0 releases with the client's default (an
event on PyTorch's current stream, else on the legacy default stream):
its consumer queues its work where that default covers it (PyTorch's
current stream; a blocking stream, which the legacy default stream
follows). Shard 1 queues on a non-blocking stream of its own, passes it
as ``cuda_stream`` (an event on it) and takes its batches as DALI's two
external sources do (``src.labels``, ``src.samples``). ``--dense`` asks for
``batch_format="dali"`` on a dataset whose samples share a size and
expects one (batch, size) array per batch; where DALI does not import,
``batch_format="numpy"``, whose GPU samples of one size are that same
one (batch, size) array. Without ``--dense`` a batch may be a list or,
where its samples happen to share a size, one (batch, size) array.
``--tensor``: a numpy dataset (``mkbmap --reader numpy``) of one dtype and
shape, whose GPU batches are one dense ``(batch, *shape)`` array without
DALI and without labels: every row's bytes against the ``.npy`` files'
data, zero copy and the release rule as above.

``speed --row ROW``: one row of the speed table, in its own process (one
row failing, cuFile say, never takes the others with it): samples/s into
GPU memory (``cufile``; ``bounce``), into host memory (``host``), or a
PyTorch (or CuPy) read and copy to the GPU (``baseline``), cold where
``drop_caches`` may be written; appended to ``--out`` as one JSON line,
with its error where it failed. Bytes only: nothing is decoded.
``figures``: the speed table from those lines, each row against the
baseline where it has one, and each missing row with its reason.

``report``: the stand-in's per-process reports (``CUDA_STANDIN_REPORT``):
no violation, nothing left allocated, mapped or registered, no spinning
event, and both the daemon and a client loaded the stand-in.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal, Optional, Protocol

import numpy as np

from nvfeed import LoaderSource

Files = dict[str, tuple[str, int]]


def files(root: Path) -> tuple[Files, list[Path]]:
    """sha256 -> (CLASS/FILE, label), and every file, in DALI's order."""
    by_hash: Files = {}
    paths: list[Path] = []
    for label, c in enumerate(sorted(os.listdir(root), key=os.fsencode)):
        if not (root / c).is_dir():
            continue
        for f in sorted(os.listdir(root / c), key=os.fsencode):
            p = root / c / f
            by_hash[hashlib.sha256(p.read_bytes()).hexdigest()] = (f"{c}/{f}", label)
            paths.append(p)
    return by_hash, paths


def cai(x: Any) -> tuple[int, tuple[int, ...]]:
    """A CUDA array's device address and shape."""
    i = x.__cuda_array_interface__
    return int(i["data"][0]), tuple(i["shape"])


def span(x: Any, row: Optional[int]) -> tuple[int, int]:
    """The device address and byte length of a CUDA array x, or of its
    row (a dense batch's sample), whatever its element type."""
    i = x.__cuda_array_interface__
    ptr, shape = int(i["data"][0]), tuple(int(n) for n in i["shape"])
    item = np.dtype(i.get("typestr", "|u1")).itemsize
    if row is None:
        return ptr, int(np.prod(shape, dtype=np.int64)) * item
    per = int(np.prod(shape[1:], dtype=np.int64)) * item
    return ptr + row * per, per


def tensor_files(root: Path) -> Files:
    """sha256 of each .npy file's data (its bytes past the header) ->
    (FILE, -1): a numpy dataset has no labels."""
    out: Files = {}
    for p in sorted(root.glob("*.npy")):
        out[hashlib.sha256(np.ascontiguousarray(np.load(p)).tobytes()).hexdigest()] = (p.name, -1)
    return out


def libcuda() -> ctypes.CDLL:
    """The libcuda this process's client uses: the explicit directory's
    (the stand-in's, under gpu.sh --standin), else the driver's."""
    d = os.environ.get("NVFEED_CUDA_LIB_DIR", "")
    p = os.path.join(d, "libcuda.so.1")
    return ctypes.CDLL(p if d and os.path.exists(p) else "libcuda.so.1")


def cu_check(cu: ctypes.CDLL, name: str, *args: Any) -> None:
    rc = int(getattr(cu, name)(*args))
    if rc != 0:
        raise RuntimeError(f"{name}: CUresult {rc}")


def device_uuid(device_id: int) -> str:
    """GPU device_id's UUID as this process's CUDA names it, as hex."""
    cu = libcuda()
    cu_check(cu, "cuInit", 0)
    dev = ctypes.c_int()
    cu_check(cu, "cuDeviceGet", ctypes.byref(dev), device_id)
    raw = ctypes.create_string_buffer(16)
    get = getattr(cu, "cuDeviceGetUuid_v2", None) or cu.cuDeviceGetUuid
    rc = int(get(raw, dev))
    if rc != 0:
        raise RuntimeError(f"cuDeviceGetUuid: CUresult {rc}")
    return raw.raw.hex()


def uuid_hex(s: str) -> str:
    """GPU-xxxxxxxx-xxxx-... or bare hex, as 32 lowercase hex digits."""
    return s.lower().removeprefix("gpu-").replace("-", "")


class Lag:
    """How long the work queued with each batch should take, so that the
    consumer's queue stays behind the daemon's refills whatever the read
    speed (a slot handed back before its queued work ran is then written
    again under it): for the first batches a little, while it measures the
    time between them; then twice the longest of those, within bounds.
    Fixed after that, so the waits it causes do not feed back into it."""

    def __init__(self, least: float = 0.002, most: float = 0.05, calibrate: int = 8) -> None:
        self.least, self.most, self.calibrate = least, most, calibrate
        self.gaps: list[float] = []
        self.last = 0.0
        self.fixed = 0.0

    def next(self) -> float:
        """Seconds of GPU work to queue with this batch."""
        if self.fixed:
            return self.fixed
        now = time.perf_counter()
        if self.last:
            self.gaps.append(now - self.last)
        self.last = now
        if len(self.gaps) >= self.calibrate:
            self.fixed = min(self.most, max(self.least, 2 * max(self.gaps)))
        return self.least


class Consumer(Protocol):
    """What a training process does with a batch: views without a copy and
    queued GPU work that reads them."""

    name: str

    def cuda_stream(self) -> Any:
        """What to pass as LoaderSource's cuda_stream: the consumer's own
        non-blocking stream."""

    def use(self, own: bool) -> None:
        """Queues the work from now on on the consumer's own stream (own),
        else where the client's default fence covers it."""

    def pointer(self, x: Any, row: Optional[int]) -> int:
        """The address the consumer's own view of x (or its row) has."""

    def batch(self) -> None:
        """Queues work that outlasts the batch's hand-back."""

    def launch(self, x: Any, row: Optional[int]) -> Any:
        """Queues a copy of x (or its row) to the host; returns its handle."""

    def finish(self) -> None:
        """Waits for everything queued."""

    def data(self, h: Any) -> bytes:
        """The bytes a finished copy brought back."""

    def close(self) -> None:
        """Gives back what the consumer holds."""


class TorchConsumer:
    name = "torch"

    def __init__(self, device_id: int) -> None:
        import torch
        self.torch = torch
        self.dev = torch.device("cuda", device_id)
        self.own = torch.cuda.Stream(self.dev)  # non-blocking, as PyTorch makes its streams
        self.stream = self.own
        self.lag = Lag()
        props = torch.cuda.get_device_properties(self.dev)
        self.hz = float(getattr(props, "clock_rate", 1_500_000)) * 1000  # kHz, as CUDA's clockRate; about right if absent

    def cuda_stream(self) -> Any:
        return self.own  # has .cuda_stream

    def use(self, own: bool) -> None:
        # The default fence records on PyTorch's current stream.
        self.stream = self.own if own else self.torch.cuda.current_stream(self.dev)

    def _view(self, x: Any, row: Optional[int]) -> Any:
        t = self.torch.as_tensor(x, device=self.dev)
        return t if row is None else t[row]

    def pointer(self, x: Any, row: Optional[int]) -> int:
        return int(self._view(x, row).data_ptr())

    def batch(self) -> None:
        with self.torch.cuda.stream(self.stream):
            self.torch.cuda._sleep(int(self.lag.next() * self.hz))  # a kernel that spins that long

    def launch(self, x: Any, row: Optional[int]) -> Any:
        with self.torch.cuda.stream(self.stream):
            t = self._view(x, row).reshape(-1).view(self.torch.uint8)  # the bytes, whatever the dtype
            h = self.torch.empty(t.shape, dtype=self.torch.uint8, pin_memory=True)
            h.copy_(t, non_blocking=True)
        return h

    def finish(self) -> None:
        self.stream.synchronize()

    def data(self, h: Any) -> bytes:
        return bytes(h.numpy().tobytes())

    def close(self) -> None:
        self.finish()


class CupyConsumer:
    name = "cupy"

    def __init__(self, device_id: int) -> None:
        import cupy
        import cupyx
        self.cupy, self.cupyx = cupy, cupyx
        cupy.cuda.Device(device_id).use()
        self.own = cupy.cuda.Stream(non_blocking=True)
        self.blocking = cupy.cuda.Stream(non_blocking=False)  # the legacy default stream follows it
        self.stream = self.own

    def cuda_stream(self) -> Any:
        return int(self.own.ptr)

    def use(self, own: bool) -> None:
        self.stream = self.own if own else self.blocking

    def _view(self, x: Any, row: Optional[int]) -> Any:
        g = self.cupy.asarray(x)
        return g if row is None else g[row]

    def pointer(self, x: Any, row: Optional[int]) -> int:
        return int(self._view(x, row).data.ptr)

    def batch(self) -> None:
        pass

    def launch(self, x: Any, row: Optional[int]) -> Any:
        with self.stream:
            g = self._view(x, row).reshape(-1).view(np.uint8)  # the bytes, whatever the dtype
            h = self.cupyx.empty_pinned(g.shape, dtype=np.uint8)
            g.get(stream=self.stream, out=h)
        return h

    def finish(self) -> None:
        self.stream.synchronize()

    def data(self, h: Any) -> bytes:
        return bytes(h.tobytes())

    def close(self) -> None:
        self.finish()


class StandinConsumer:
    """The CUDA stand-in's consumer: its device memory is host memory at the
    device address, and cuStandinLaunchRead queues a "kernel" on a stream
    that sleeps, then copies device bytes to the host."""

    name = "stand-in kernel"
    delay_us = 100

    def __init__(self, device_id: int) -> None:
        self.cu = cu = libcuda()
        cu_check(cu, "cuInit", 0)
        self.dev = ctypes.c_int()
        cu_check(cu, "cuDeviceGet", ctypes.byref(self.dev), device_id)
        ctx = ctypes.c_void_p()
        cu_check(cu, "cuDevicePrimaryCtxRetain", ctypes.byref(ctx), self.dev)
        cu_check(cu, "cuCtxPushCurrent_v2", ctx)
        s, b = ctypes.c_void_p(), ctypes.c_void_p()
        cu_check(cu, "cuStreamCreate", ctypes.byref(s), 1)  # CU_STREAM_NON_BLOCKING
        cu_check(cu, "cuStreamCreate", ctypes.byref(b), 0)  # blocking: the legacy default stream follows it
        self.own, self.blocking = s, b
        self.stream = s
        cu.cuStandinLaunchRead.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_size_t, ctypes.c_uint,
                                           ctypes.c_void_p]
        self.lag = Lag()
        self._batch_delay_us = 0

    def cuda_stream(self) -> Any:
        return int(self.own.value or 0)

    def use(self, own: bool) -> None:
        self.stream = self.own if own else self.blocking

    def pointer(self, x: Any, row: Optional[int]) -> int:
        return span(x, row)[0]

    def batch(self) -> None:
        self._batch_delay_us = int(self.lag.next() * 1e6)  # the batch's first "kernel" is that slow

    def launch(self, x: Any, row: Optional[int]) -> Any:
        n = span(x, row)[1]
        buf = ctypes.create_string_buffer(n)
        delay, self._batch_delay_us = max(self.delay_us, self._batch_delay_us), 0
        cu_check(self.cu, "cuStandinLaunchRead", self.stream, self.pointer(x, row), n, delay, buf)
        return buf

    def finish(self) -> None:
        for s in (self.own, self.blocking):
            cu_check(self.cu, "cuStreamSynchronize", s)

    def data(self, h: Any) -> bytes:
        return bytes(h.raw)

    def close(self) -> None:
        if self.stream is None:
            return
        self.finish()
        for s in (self.own, self.blocking):
            cu_check(self.cu, "cuStreamDestroy_v2", s)
        self.stream = None  # type: ignore[assignment]
        old = ctypes.c_void_p()
        cu_check(self.cu, "cuCtxPopCurrent_v2", ctypes.byref(old))
        cu_check(self.cu, "cuDevicePrimaryCtxRelease_v2", self.dev)


def consumer(kind: str, device_id: int) -> Consumer:
    if kind == "standin":
        return StandinConsumer(device_id)
    if kind in ("auto", "torch"):
        try:
            return TorchConsumer(device_id)
        except ImportError:
            if kind == "torch":
                raise
    return CupyConsumer(device_id)


def labels_of(labels: Any) -> list[int]:
    """Labels as ints, from a numpy array or a DALI TensorListCPU."""
    a = labels.as_array() if hasattr(labels, "as_array") else np.asarray(labels)
    return [int(v) for v in np.asarray(a).reshape(-1)]


def rows_of(samples: Any, dense: bool, tensor: bool = False) -> tuple[list[tuple[Any, Optional[int]]], str]:
    """A batch's samples as (array, row) pairs, and what is wrong with its
    shape ("" when nothing). A dense batch is one (batch, size) array, or
    for a numpy dataset (tensor) one (batch, *shape) array; any other is
    a list, or that one array where its samples happen to share a size."""
    if hasattr(samples, "__cuda_array_interface__"):
        _, shape = cai(samples)
        if len(shape) < 2 if tensor else len(shape) != 2:
            return [], f"one array of shape {shape}, not (batch, {'*shape' if tensor else 'size'})"
        return [(samples, i) for i in range(shape[0])], ""
    out: list[tuple[Any, Optional[int]]] = [(x, None) for x in samples]
    return out, "a list of separate arrays where one dense (batch, size) array was due" if dense else ""


def batches(src: Any, halves: bool, tensor: bool = False) -> Any:
    """One epoch of (samples, labels): by iterating the source, or, as
    DALI's two external sources of GPU samples and host labels take them,
    through src.labels and src.samples (labels first: DALI calls them in
    no defined order). A numpy dataset's batches are its arrays alone:
    labels None (src.samples alone for the halves)."""
    if tensor:
        for samples in (iter(src.samples, None) if halves else src):
            yield samples, None
        return
    if not halves:
        yield from src
        return
    while True:
        try:
            labels = src.labels()
        except StopIteration:
            try:
                src.samples()  # takes its half of the end of the epoch
            except StopIteration:
                pass
            return
        yield src.samples(), labels


def exact(a: argparse.Namespace) -> int:
    by_hash = tensor_files(Path(a.root)) if a.tensor else files(Path(a.root))[0]
    dense = a.dense or a.tensor
    want = f"{a.dataset} {a.backend or 'default'} {a.gpu_path}{' dense' if dense else ''}"
    try:
        con = consumer(a.consumer, a.device_id)
    except Exception as e:
        print(f"{want}: FAILED: no consumer to read GPU memory with ({a.consumer}: PyTorch, else CuPy; "
              f"{type(e).__name__}: {e})")
        return 1
    bad = 0
    seen: dict[tuple[int, int], list[str]] = {}
    has_stream = "cuda_stream" in inspect.signature(LoaderSource).parameters
    if not has_stream:
        print(f"  {want}: this client's LoaderSource takes no cuda_stream: the release rule is not the design's")
        bad += 1
    has_halves = callable(getattr(LoaderSource, "samples", None)) and callable(getattr(LoaderSource, "labels", None))
    if not has_halves:
        print(f"  {want}: this client's LoaderSource has no samples/labels pair (GPU samples, host labels)")
        bad += 1
    try:
        my_uuid = device_uuid(a.device_id)
    except (OSError, RuntimeError) as e:
        print(f"  {want}: this process cannot name its GPU {a.device_id}'s UUID: {e}")
        my_uuid, bad = "", bad + 1
    try:
        for shard in range(2):
            kw: dict[str, Any] = {}
            if a.backend:
                kw["backend"] = a.backend
            if dense and not a.tensor:
                kw["batch_format"] = "dali"
            if shard == 1 and has_stream:
                kw["cuda_stream"] = con.cuda_stream()  # the release waits for an event on it
            con.use(shard == 1 and has_stream)  # shard 0: where the client's default fence covers the work
            open_kw = dict(socket=a.socket, batch_size=a.batch_size, shard_id=shard, num_shards=2,
                           random_shuffle=True, seed=7, device="gpu", device_id=a.device_id, gpu_path=a.gpu_path,
                           zero_copy=True)
            try:
                opened = LoaderSource(a.dataset, **open_kw, **kw)
            except ImportError as e:
                if kw.pop("batch_format", None) != "dali":
                    raise
                # DALI does not import: batch_format="numpy" gives GPU
                # samples of one size as the same (batch, size) array.
                print(f"  {want}: batch_format='dali' needs DALI in this client ({e}): checked with "
                      "batch_format='numpy' (GPU samples of one size: one (batch, size) array there too)")
                opened = LoaderSource(a.dataset, **open_kw, **kw)
            with opened as src:
                expect = a.expect_path or (a.gpu_path if a.gpu_path != "auto" else "")
                if expect and src.gpu_path != expect:
                    print(f"  {want}: expected gpu_path {expect}, the daemon ran {src.gpu_path}")
                    bad += 1
                mem: dict[str, Any] = dict(getattr(src, "memory", {}) or {})
                if shard == 0:
                    print(f"  {want}: gpu_path {src.gpu_path}; client GPU {a.device_id} = daemon GPU "
                          f"{mem.get('device')}, UUID {mem.get('uuid') or '(none given)'}")
                if my_uuid and uuid_hex(str(mem.get("uuid") or "")) != my_uuid:
                    print(f"  {want}: the memory's GPU UUID {mem.get('uuid')!r} is not this process's GPU "
                          f"{a.device_id} ({my_uuid})")
                    bad += 1
                if a.daemon_device is not None and mem.get("device") != a.daemon_device:
                    print(f"  {want}: daemon GPU {mem.get('device')}, expected {a.daemon_device} "
                          "(the daemon sees the GPUs in another order)")
                    bad += 1
                g = getattr(src, "_gpu", None)
                lo, hi = (g.ptr, g.ptr + g.size) if g is not None else (0, 1 << 64)
                for epoch in range(2):
                    pending: list[tuple[Any, int]] = []
                    for samples, labels in batches(src, shard == 1 and has_halves, a.tensor):
                        rows, wrong = rows_of(samples, dense, a.tensor)
                        lab = [-1] * len(rows) if a.tensor else labels_of(labels)
                        if wrong or len(rows) != len(lab):
                            print(f"  {want}: epoch {epoch} shard {shard}: {wrong or 'samples and labels differ in number'}")
                            bad += 1
                        con.batch()
                        for (x, row), lbl in zip(rows, lab):
                            at = span(x, row)[0]
                            mine = con.pointer(x, row)
                            if mine != at or not lo <= at < hi:
                                print(f"  {want}: a copy, not a view: consumer pointer {mine:#x}, sample at {at:#x}, "
                                      f"allocation [{lo:#x}, {hi:#x})")
                                bad += 1
                            pending.append((con.launch(x, row), lbl))
                    # Only now wait for the queued copies: a slot the daemon
                    # wrote again before they ran gives wrong bytes.
                    con.finish()
                    for h, lbl in pending:
                        hit = by_hash.get(hashlib.sha256(con.data(h)).hexdigest())
                        if hit is None or hit[1] != lbl:
                            bad += 1
                            if bad <= 5:
                                print(f"  {want}: epoch {epoch} shard {shard}: bytes or label {lbl} match no file"
                                      + (" (and more: the count below)" if bad == 5 else ""))
                            continue
                        seen.setdefault((epoch, shard), []).append(hit[0])
    except Exception as e:  # report it as this run's failure, and go on with the others
        print(f"  {want}: {type(e).__name__}: {e}")
        bad += 1
    finally:
        con.close()
    for epoch in range(2):
        both = seen.get((epoch, 0), []) + seen.get((epoch, 1), [])
        if sorted(both) != sorted(p for p, _ in by_hash.values()):
            bad += 1
            print(f"  {want}: epoch {epoch}: the two shards do not cover the dataset exactly once")
    print(f"{want} ({con.name}): {sum(map(len, seen.values()))} samples, "
          f"{'byte- and label-exact, zero copy, released after the queued work' if bad == 0 else f'{bad} FAILURES'}")
    return 1 if bad else 0


def drop() -> bool:
    """Empties the page cache where this process may; False where not."""
    subprocess.run(["sync"], check=True)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


ROWS = ("cufile", "bounce", "host", "baseline")
"""The speed table's rows, in its order."""


def row_label(row: str, bounce_backend: str, lib: str = "") -> str:
    """A speed row's name in the table."""
    return {"cufile": "gpu cufile", "bounce": f"gpu {bounce_backend} bounce", "host": f"host {bounce_backend}",
            "baseline": f"{lib or 'torch/cupy'} read + copy to GPU"}[row]


def to_gpu_fn() -> tuple[Any, Any, str]:
    """The baseline's copy of bytes to the GPU, its sync and its library:
    PyTorch with CUDA, else CuPy; RuntimeError saying why neither."""
    why = []
    try:
        import torch
        if torch.cuda.is_available():
            def to_gpu(b: bytes) -> None:
                torch.frombuffer(bytearray(b), dtype=torch.uint8).cuda(non_blocking=False)
            return to_gpu, torch.cuda.synchronize, "torch"
        why.append("PyTorch sees no CUDA GPU")
    except ImportError:
        why.append("PyTorch does not import")
    try:
        import cupy

        def to_gpu_cp(b: bytes) -> None:
            cupy.asarray(np.frombuffer(b, dtype=np.uint8))
        return to_gpu_cp, cupy.cuda.Device().synchronize, "cupy"
    except ImportError:
        why.append("CuPy does not import")
    raise RuntimeError("; ".join(why))


def speed(a: argparse.Namespace) -> int:
    """One row of the speed table, appended to a.out as a JSON line."""
    _, paths = files(Path(a.root))
    line: dict[str, Any] = {"row": a.row, "label": row_label(a.row, a.bounce_backend), "rounds": [], "cold": True}
    try:
        if a.row == "baseline":
            to_gpu, sync, lib = to_gpu_fn()
            line["label"] = row_label(a.row, a.bounce_backend, lib)
        for _ in range(a.rounds):
            line["cold"] &= drop()
            t0, n = time.perf_counter(), 0
            if a.row == "baseline":
                for p in paths:
                    to_gpu(p.read_bytes())
                    n += 1
                sync()
            else:
                device: Literal["cpu", "gpu"] = "cpu" if a.row == "host" else "gpu"
                kw: dict[str, Any] = {"gpu_path": a.row} if device == "gpu" else {}
                backend = "cufile" if a.row == "cufile" else a.bounce_backend
                with LoaderSource(a.dataset, socket=a.socket, batch_size=64, random_shuffle=True, seed=1,
                                  backend=backend, device=device, zero_copy=True, **kw) as src:
                    for samples, _ in src:
                        n += len(samples)
            line["rounds"].append(n / (time.perf_counter() - t0))
    except Exception as e:  # the row's failure is its line; the other rows run on
        line["error"] = f"{type(e).__name__}: {e}"
    with open(a.out, "a") as f:
        f.write(json.dumps(line) + "\n")
    if "error" in line:
        print(f"  {line['label']}: FAILED: {line['error']}")
        return 1
    print(f"  {line['label']}: " + " ".join(f"{x:.0f}" for x in line["rounds"]) + " samples/s")
    return 0


def figures(a: argparse.Namespace) -> int:
    """The speed table from the rows' lines: medians, each against the
    baseline where it has one; a row without figures says why."""
    lines: dict[str, dict[str, Any]] = {}
    p = Path(a.out)
    if p.exists():
        for text in p.read_text().splitlines():
            if text.strip():
                r = json.loads(text)
                lines[str(r["row"])] = r
    med = {k: sorted(r["rounds"])[len(r["rounds"]) // 2] for k, r in lines.items() if r.get("rounds") and "error" not in r}
    base = med.get("baseline")
    if any(not r.get("cold", True) for r in lines.values()):
        print("  page cache NOT dropped (drop_caches is not writable here): warm figures")
    for row in ROWS:
        r = lines.get(row)
        label = str((r or {}).get("label") or row_label(row, a.bounce_backend))
        if r is None:
            print(f"  {label:<28} no figure: the row did not run")
        elif row not in med:
            print(f"  {label:<28} no figure: {r.get('error', 'no rounds')}")
        else:
            v = med[row]
            vs = f"{v / base:5.2f}x the baseline" if base else "(no baseline)"
            print(f"  {label:<28} {v:>10.0f} samples/s  {vs}   rounds: " + " ".join(f"{x:.0f}" for x in r["rounds"]))
    print(json.dumps({"medians": med, "rows": lines}))
    return 0


def report(a: argparse.Namespace) -> int:
    """The stand-in's reports: every process clean, both sides present."""
    bad, kinds = 0, set()
    reports = sorted(Path(a.dir).glob("*.json"))
    for p in reports:
        r = json.loads(p.read_text())
        exe = os.path.basename(str(r.get("exe", "?")))
        kinds.add("daemon" if exe.startswith("loaderd") else "python" if exe.startswith("python") else exe)
        live = {k: v for k, v in dict(r.get("live", {})).items() if v}
        problems = []
        if r.get("violations"):
            problems.append("violations: " + "; ".join(map(str, r["violations"])))
        if live:
            problems.append(f"still live at exit: {live}")
        if r.get("spinning_events"):
            problems.append(f"{r['spinning_events']} spinning event(s) (no cudaEventBlockingSync)")
        print(f"  pid {r.get('pid')} {exe}: {r.get('copies', 0)} copies, {r.get('cufile_reads', 0)} cuFile reads"
              + ("" if not problems else ": " + " | ".join(problems)))
        bad += 1 if problems else 0
    for need in ("daemon", "python"):
        if need not in kinds:
            print(f"  no report from a {need} process: the stand-in was not loaded there")
            bad += 1
    print(f"stand-in: {len(reports)} processes, " + ("no violation, nothing leaked" if not bad else f"{bad} FAILURES"))
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("mode", choices=["exact", "speed", "figures", "report"])
    ap.add_argument("--socket")
    ap.add_argument("--root", help="the dataset's root (CLASS/FILE; with --tensor, the .npy files)")
    ap.add_argument("--dataset", default="train")
    ap.add_argument("--backend", default="", help="'' leaves it to the daemon (what gpu_path auto needs)")
    ap.add_argument("--gpu-path", default="bounce", choices=["bounce", "cufile", "auto"])
    ap.add_argument("--expect-path", default="", choices=["", "bounce", "cufile"],
                    help="the path the daemon must run (for auto)")
    ap.add_argument("--dense", action="store_true", help="samples of one size: expect one (batch, size) array")
    ap.add_argument("--tensor", action="store_true",
                    help="a numpy dataset: one (batch, *shape) array a batch, no labels, no DALI")
    ap.add_argument("--device-id", type=int, default=0)
    ap.add_argument("--daemon-device", type=int, help="the daemon's ordinal of this process's GPU, when known")
    ap.add_argument("--consumer", default="auto", choices=["auto", "torch", "cupy", "standin"])
    ap.add_argument("--batch-size", type=int, default=8,
                    help="exact: small, so that an epoch has more batches than the session has slots")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--row", choices=ROWS, help="speed: the row to measure")
    ap.add_argument("--out", help="speed, figures: the rows' JSON lines")
    ap.add_argument("--bounce-backend", default="gds", help="speed: the host backend of the bounce and host rows")
    ap.add_argument("--dir", help="report: the stand-in's report directory")
    a = ap.parse_args()
    if a.mode == "report":
        return report(a)
    if a.mode == "figures":
        if not a.out:
            ap.error("figures needs --out")
        return figures(a)
    if not a.socket or not a.root:
        ap.error(f"{a.mode} needs --socket and --root")
    if a.mode == "speed":
        if not a.row or not a.out:
            ap.error("speed needs --row and --out")
        return speed(a)
    return exact(a)


if __name__ == "__main__":
    sys.exit(main())
