# SPDX-License-Identifier: Apache-2.0
"""GPU batch memory in the client: the daemon passes a CUDA VMM POSIX file
descriptor; this module imports and maps it with the CUDA driver API
(ctypes on libcuda: no CuPy or PyTorch needed) and wraps each sample as an
object with ``__cuda_array_interface__`` v3, which DALI's
``fn.external_source(device="gpu")``, ``torch.as_tensor(x, device="cuda")``
and ``cupy.asarray(x)`` take without a copy.

The daemon waits for its copy to the device (a CUDA event) before it sends
a batch's descriptor, so the bytes are ready when a sample is handed out:
the interface's ``stream`` is ``None`` ("no synchronization needed"; a
stream of the daemon's process could not be named here anyway)."""

from __future__ import annotations

import ctypes
from typing import Any, Optional

_POSIX_FD = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
_LOCATION_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
_READWRITE = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE


class CudaError(RuntimeError):
    """A CUDA driver call failed, or there is no driver; the message names
    the call and CUDA's error."""


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


def _libcuda() -> ctypes.CDLL:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise CudaError(f"no NVIDIA driver found (libcuda.so.1: {e})") from e


class DeviceMapping:
    """Device memory imported from a descriptor and mapped at ``ptr`` for
    ``size`` bytes on GPU ``device``; ``close()`` unmaps it."""

    def __init__(self, fd: int, size: int, device: int, lib: Optional[ctypes.CDLL] = None) -> None:
        self._cu = lib if lib is not None else _libcuda()
        self.size, self.device, self.ptr, self._mapped = size, device, 0, False
        self._dev: Optional[ctypes.c_int] = None
        self._call("cuInit", 0)
        dev = ctypes.c_int()
        self._call("cuDeviceGet", ctypes.byref(dev), device)
        ctx = ctypes.c_void_p()
        self._call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        self._dev = dev
        self._call("cuCtxPushCurrent_v2", ctx)
        try:
            h = ctypes.c_ulonglong()
            self._call("cuMemImportFromShareableHandle", ctypes.byref(h), ctypes.c_void_p(fd), _POSIX_FD)
            ptr = ctypes.c_ulonglong()
            try:
                self._call("cuMemAddressReserve", ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0),
                           ctypes.c_ulonglong(0), ctypes.c_ulonglong(0))
                self.ptr = ptr.value
                self._call("cuMemMap", ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), h, ctypes.c_ulonglong(0))
                self._mapped = True
            finally:
                self._cu.cuMemRelease(h)  # the mapping keeps the memory
            access = _AccessDesc(_Location(_LOCATION_DEVICE, device), _READWRITE)
            self._call("cuMemSetAccess", ptr, ctypes.c_size_t(size), ctypes.byref(access), ctypes.c_size_t(1))
        except BaseException:
            self.close()
            raise
        finally:
            old = ctypes.c_void_p()
            self._cu.cuCtxPopCurrent_v2(ctypes.byref(old))

    def _call(self, name: str, *args: Any) -> None:
        rc = int(getattr(self._cu, name)(*args))
        if rc != 0:
            s = ctypes.c_char_p()
            self._cu.cuGetErrorName(rc, ctypes.byref(s))
            raise CudaError(f"{name}: {(s.value or b'CUDA_ERROR').decode()} ({rc})")

    def close(self) -> None:
        """Unmaps the memory (arrays from it must no longer be used)."""
        if self._mapped:
            self._cu.cuMemUnmap(ctypes.c_ulonglong(self.ptr), ctypes.c_size_t(self.size))
            self._mapped = False
        if self.ptr:
            self._cu.cuMemAddressFree(ctypes.c_ulonglong(self.ptr), ctypes.c_size_t(self.size))
            self.ptr = 0
        if self._dev is not None:
            self._cu.cuDevicePrimaryCtxRelease_v2(self._dev)
            self._dev = None


class CudaArray:
    """One sample's bytes in GPU memory: a 1-D uint8 array of ``nbytes``
    at device address ``ptr``, exposed through ``__cuda_array_interface__``
    (v3). It keeps its memory mapped while it lives."""

    __slots__ = ("ptr", "nbytes", "device", "_owner")

    def __init__(self, ptr: int, nbytes: int, device: int, owner: object) -> None:
        self.ptr, self.nbytes, self.device, self._owner = ptr, nbytes, device, owner

    @property
    def shape(self) -> tuple[int]:
        return (self.nbytes,)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": (self.ptr, False), "version": 3,
                "strides": None, "stream": None}

    def __len__(self) -> int:
        return self.nbytes

    def __repr__(self) -> str:
        return f"CudaArray(ptr={self.ptr:#x}, nbytes={self.nbytes}, device={self.device})"
