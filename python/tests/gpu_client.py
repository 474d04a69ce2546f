# SPDX-License-Identifier: Apache-2.0
"""A GPU client in its own process, for test_gpu_standin.py: it reads GPU
batches from a daemon through the CUDA stand-in (NVFEED_CUDA_LIB_DIR), copies
every sample back from its device address with cuMemcpyDtoH and prints one
JSON line per sample: {"epoch", "hash", "label", "ptr", "base", "size"}, then
{"done": ...}. Usage:

    python gpu_client.py '{"socket": ..., "batch_size": ..., ...}'

The JSON names LoaderSource's arguments plus "epochs", "end" ("close": close
the source; "hold": exit holding arrays, closing nothing), "consumer_delay_us"
(a slow "kernel" on a consumer stream reads the first batch; its bytes are
checked after the epochs), "use_labels_source" (the batch through src.labels and src.samples, as two
fn.external_source take it), "pass_stream" (the consumer's stream, then
non-blocking, given as cuda_stream), "no_dali" (nvidia.dali made
unimportable first).

Over a numpy dataset each batch is the arrays alone: every array is read
back at the address, shape, typestr and strides its
__cuda_array_interface__ advertises (a dense batch's rows at their
C-order strides), each line then carrying "shape" and "typestr" and no
label."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import sys
from typing import Any

import numpy as np

from nvfeed import CudaArray, LoaderSource, SampleError


def _cuda() -> ctypes.CDLL:
    return ctypes.CDLL(os.path.join(os.environ["NVFEED_CUDA_LIB_DIR"], "libcuda.so.1"))


class Device:
    """The client's view of one GPU through the stand-in's driver API: a
    retained primary context pushed around each call."""

    def __init__(self, cu: ctypes.CDLL, ordinal: int) -> None:
        self.cu = cu
        self._ok(cu.cuInit(0), "cuInit")
        self.dev = ctypes.c_int()
        self._ok(cu.cuDeviceGet(ctypes.byref(self.dev), ordinal), "cuDeviceGet")
        self.ctx = ctypes.c_void_p()
        self._ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), self.dev), "cuDevicePrimaryCtxRetain")

    @staticmethod
    def _ok(rc: int, call: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{call}: CUDA error {rc}")

    def __enter__(self) -> "Device":
        self._ok(self.cu.cuCtxPushCurrent_v2(self.ctx), "cuCtxPushCurrent_v2")
        return self

    def __exit__(self, *exc: Any) -> None:
        old = ctypes.c_void_p()
        self._ok(self.cu.cuCtxPopCurrent_v2(ctypes.byref(old)), "cuCtxPopCurrent_v2")

    def read(self, ptr: int, n: int) -> bytes:
        buf = ctypes.create_string_buffer(max(n, 1))
        with self:
            self._ok(self.cu.cuMemcpyDtoH_v2(buf, ctypes.c_ulonglong(ptr), ctypes.c_size_t(n)), "cuMemcpyDtoH_v2")
        return buf.raw[:n]

    def close(self) -> None:
        self._ok(self.cu.cuDevicePrimaryCtxRelease_v2(self.dev), "cuDevicePrimaryCtxRelease_v2")


def _samples(data: Any) -> list[tuple[int, int]]:
    """(device address, bytes) of each sample of a batch: a list of
    CudaArray, or one dense CudaArray of shape (batch, S)."""
    if isinstance(data, CudaArray):
        rows, size = data.shape if len(data.shape) == 2 else (1, data.shape[0])
        return [(data.ptr + i * size, size) for i in range(rows)]
    return [(a.ptr, a.nbytes) for a in data]


def _arrays(data: Any) -> list[tuple[int, int, list[int], str]]:
    """(device address, bytes, shape, typestr) of each array of a numpy
    dataset's batch, from the __cuda_array_interface__ of one dense
    CudaArray (batch, *shape) or of each CudaArray of a list: C-contiguous
    (strides None), so row i of a dense batch starts i times the row's
    bytes after the first."""
    out = []
    for a in data if isinstance(data, list) else [data]:
        cai = a.__cuda_array_interface__
        if cai["strides"] is not None or cai["version"] != 3:
            raise AssertionError(f"not a C-contiguous v3 array: {cai}")
        ptr, shape, typestr = cai["data"][0], tuple(cai["shape"]), cai["typestr"]
        itemsize = np.dtype(typestr).itemsize
        if isinstance(data, list):
            out.append((ptr, int(np.prod(shape, dtype=np.int64)) * itemsize, list(shape), typestr))
            continue
        row = int(np.prod(shape[1:], dtype=np.int64)) * itemsize
        out += [(ptr + i * row, row, list(shape[1:]), typestr) for i in range(shape[0])]
    return out


def main() -> int:
    args: dict[str, Any] = json.loads(sys.argv[1])
    epochs = args.pop("epochs", 2)
    end = args.pop("end", "close")
    delay = args.pop("consumer_delay_us", 0)
    labels_source = args.pop("use_labels_source", False)
    pause_after = args.pop("pause_after", 0)
    pass_stream = args.pop("pass_stream", False)
    if args.pop("no_dali", False):  # DALI made unimportable: the client must not need it
        for m in ("nvidia", "nvidia.dali", "nvidia.dali.backend"):
            sys.modules[m] = None  # type: ignore[assignment]
    socket, name = args.pop("socket"), args.pop("dataset", "train")
    cu = _cuda()
    dev = Device(cu, args.get("device_id", 0))
    stream = ctypes.c_void_p()
    if delay:
        with dev:
            # A stream passed is non-blocking (only an event on it covers
            # it); one not passed is blocking (the legacy default stream's
            # event follows it).
            Device._ok(cu.cuStreamCreate(ctypes.byref(stream), 1 if pass_stream else 0), "cuStreamCreate")
        if pass_stream:
            args["cuda_stream"] = stream.value
    src = LoaderSource(name, socket=socket, device="gpu", zero_copy=True, **args)
    out = sys.stdout
    out.write(json.dumps({"gpu_path": src.gpu_path}) + "\n")
    out.write(json.dumps({"memory": dict(src.memory)}) + "\n")
    held: list[Any] = []
    slow: list[tuple[bytes, Any, list[tuple[int, int]]]] = []
    skipped, delivered = 0, 0
    for epoch in range(epochs):
        while True:
            try:
                if labels_source:  # two halves, labels asked for first (DALI's order is undefined)
                    labels = src.labels()
                    data = src.samples()
                elif src.reader == "numpy":
                    data, labels = next(src), None
                else:
                    data, labels = next(src)
            except StopIteration:
                if labels_source:  # the end of the epoch reaches the other half too
                    try:
                        src.samples()
                        raise AssertionError("samples() went on after labels() ended the epoch")
                    except StopIteration:
                        pass
                break
            except SampleError as e:
                out.write(json.dumps({"epoch": epoch, "error": str(e)}) + "\n")
                continue
            if labels is None:  # a numpy dataset: the arrays alone
                for ptr, n, shape, typestr in _arrays(data):
                    b = dev.read(ptr, n)
                    out.write(json.dumps({"epoch": epoch, "hash": hashlib.sha256(b).hexdigest(), "shape": shape,
                                          "typestr": typestr, "ptr": ptr, "size": n,
                                          "dense": isinstance(data, CudaArray)}) + "\n")
                if end == "hold":
                    held.append(data)
                continue
            if hasattr(labels, "as_array"):  # a TensorListCPU (batch_format="dali")
                labels = labels.as_array()
            samples = _samples(data)
            if delay and not slow:
                # A consumer's kernel queued on its stream that reads the
                # batch late: it must see this batch, not a later one.
                with dev:
                    ptr0 = samples[0][0]
                    total = samples[-1][0] + samples[-1][1] - ptr0  # the batch's span in its slot
                    host = ctypes.create_string_buffer(total)
                    want = dev.read(ptr0, total)
                    Device._ok(cu.cuStandinLaunchRead(stream, ctypes.c_ulonglong(ptr0), ctypes.c_size_t(total),
                                                      ctypes.c_uint(delay), host), "cuStandinLaunchRead")
                slow.append((want, host, samples))
            for (ptr, n), label in zip(samples, [int(x) for x in labels.reshape(-1)]):
                b = dev.read(ptr, n)
                out.write(json.dumps({"epoch": epoch, "hash": hashlib.sha256(b).hexdigest(), "label": label,
                                      "ptr": ptr, "size": n,
                                      "dense": isinstance(data, CudaArray)}) + "\n")
            if end == "hold":
                held.append(data)
            delivered += 1
            if pause_after and delivered == pause_after:
                out.write(json.dumps({"paused": True}) + "\n")
                out.flush()
                sys.stdin.readline()
        skipped = src.skipped_samples
    if slow:
        with dev:
            Device._ok(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
            Device._ok(cu.cuStreamDestroy_v2(stream), "cuStreamDestroy_v2")
        want, host, _ = slow[0]
        out.write(json.dumps({"consumer_saw_its_batch": host.raw[:len(want)] == want}) + "\n")
    out.write(json.dumps({"done": True, "skipped": skipped, "held": len(held)}) + "\n")
    out.flush()
    dev.close()
    if end == "close":
        src.close()
    # "hold": the interpreter exits with arrays and the source alive.
    return 0


if __name__ == "__main__":
    sys.exit(main())
