# SPDX-License-Identifier: Apache-2.0
"""GPU batch memory mapped in this process: ``DeviceMapping`` imports the
daemon's CUDA VMM file descriptor and maps it (the driver calls in
``_cuda``); ``CudaArray`` exposes a sample, or a dense batch, through
``__cuda_array_interface__`` v3 and keeps its mapping alive."""

from __future__ import annotations

import ctypes
import threading
import warnings
import weakref
from typing import Any, Optional, Union

from . import _cuda
from ._cuda import (_POSIX_FD, _READWRITE, _LOCATION_DEVICE, CudaError, _AccessDesc, _call, _Failures, _Location,
                    _PrimaryContext)


class _Mapped:
    """What a DeviceMapping holds (kept apart from it, so that its
    finalizer can reach it): the context, the reservation, the mapping."""

    def __init__(self, ctx: _PrimaryContext, size: int) -> None:
        self.ctx, self.size, self.ptr, self.mapped = ctx, size, 0, False

    def close(self) -> None:
        """Waits for the context's queued work, unmaps, frees the address
        range (the primary context pushed), pops it and releases it: every
        step runs and every return code is checked; the first failure is
        raised after the rest. Once: a second call does nothing."""
        cu, f = self.ctx.cu, _Failures()
        if self.ptr or self.mapped:
            if f.run(self.ctx.push):
                ptr, size = ctypes.c_ulonglong(self.ptr), ctypes.c_size_t(self.size)
                unmapped = True
                if self.mapped:
                    self.mapped = False
                    # A consumer's kernels may still read the memory: the
                    # unmap waits for them (a fault otherwise).
                    f.run(_call, cu, "cuCtxSynchronize")
                    unmapped = f.run(_call, cu, "cuMemUnmap", ptr, size)
                if self.ptr:
                    self.ptr = 0
                    if unmapped:  # a range still mapped cannot be freed
                        f.run(_call, cu, "cuMemAddressFree", ptr, size)
                f.run(self.ctx.pop)
            self.ptr, self.mapped = 0, False
        f.run(self.ctx.release)
        f.raise_first()

    def close_quietly(self) -> None:
        """close() for finalizers (a last array gone, interpreter exit):
        a failure is a warning, not an exception nobody can catch."""
        try:
            self.close()
        except CudaError as e:
            warnings.warn(f"nvfeed: unmapping GPU batch memory: {e}", RuntimeWarning, stacklevel=2)


class DeviceMapping:
    """Device memory imported from a descriptor and mapped at ``ptr`` for
    ``size`` bytes on GPU ``device`` (this process's ordinal).

    The mapping is unmapped once: by ``close()``; or, after its owner
    called ``retire()``, when the last ``CudaArray`` of it dies (or at
    ``retire()`` when none lives); or when the object is collected; or at
    interpreter exit while still mapped. Each time with the device's
    primary context pushed, after ``cuCtxSynchronize`` (the consumer's
    queued kernels on the memory finish first)."""

    def __init__(self, fd: int, size: int, device: int, lib: Optional[Any] = None) -> None:
        cu = lib if lib is not None else _cuda.load_libcuda()
        self.size, self.device = size, device
        self._lock = threading.Lock()
        self._arrays = 0
        self._retired = False
        ctx = _PrimaryContext(cu, device)
        self._res = _Mapped(ctx, size)
        # Runs at most once: close(), collection, or interpreter exit
        # (weakref.finalize's atexit hook, before modules are torn down).
        self._fin = weakref.finalize(self, self._res.close_quietly)
        try:
            ctx.push()
        except CudaError:
            self._fin.detach()
            self._res.close_quietly()
            raise
        try:
            h = ctypes.c_ulonglong()
            _call(cu, "cuMemImportFromShareableHandle", ctypes.byref(h), ctypes.c_void_p(fd), _POSIX_FD)
            f = _Failures()
            ptr = ctypes.c_ulonglong()
            if f.run(_call, cu, "cuMemAddressReserve", ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0),
                     ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)):
                self._res.ptr = ptr.value
                if f.run(_call, cu, "cuMemMap", ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), h,
                         ctypes.c_ulonglong(0)):
                    self._res.mapped = True
            f.run(_call, cu, "cuMemRelease", h)  # the mapping keeps the memory
            f.raise_first()
            access = _AccessDesc(_Location(_LOCATION_DEVICE, device), _READWRITE)
            _call(cu, "cuMemSetAccess", ptr, ctypes.c_size_t(size), ctypes.byref(access), ctypes.c_size_t(1))
        except BaseException:
            try:
                ctx.pop()
            except CudaError:
                pass  # the failure that brought us here is the one to raise
            self._fin.detach()
            self._res.close_quietly()
            raise
        ctx.pop()

    @property
    def ptr(self) -> int:
        """The mapping's device address; 0 once unmapped."""
        return self._res.ptr

    @property
    def closed(self) -> bool:
        """Whether the memory is unmapped."""
        return not self._fin.alive

    def close(self) -> None:
        """Unmaps the memory now (arrays from it must no longer be used);
        raises CudaError naming the first call that failed, after doing
        the rest of the cleanup. A second call does nothing."""
        if self._fin.detach() is not None:
            self._res.close()

    def retire(self) -> None:
        """The owner lets the mapping go: it is unmapped now when no
        CudaArray of it lives (raising as ``close()``), else when the last
        one dies."""
        with self._lock:
            self._retired = True
            last = self._arrays == 0
        if last:
            self.close()

    def _hold(self) -> None:
        with self._lock:
            self._arrays += 1

    def _unhold(self) -> None:
        if not self._fin.alive:  # already unmapped (close, or interpreter exit)
            return
        with self._lock:
            self._arrays -= 1
            last = self._arrays == 0 and self._retired
        if last:
            self._fin()

    @property
    def arrays(self) -> int:
        """The CudaArrays of this mapping still alive."""
        return self._arrays


Shape = Union[int, tuple[int, ...]]


class CudaArray:
    """GPU memory at device address ``ptr`` exposed through
    ``__cuda_array_interface__`` (v3): one sample's bytes (1-D, shape
    ``(nbytes,)``) or a dense batch of samples of one size (2-D, shape
    ``(batch, size)``), or, for a numpy dataset, an array of its dtype
    (``typestr`` the ``.npy`` descr, ``"<f4"``) and shape (``()`` for a
    0-d array: one element; a dense batch ``(batch, *shape)``).
    C-contiguous (``strides`` None), ``typestr`` ``"|u1"`` by default. It
    keeps its memory mapped while it lives."""

    __slots__ = ("ptr", "shape", "typestr", "nbytes", "device", "_owner")

    def __init__(self, ptr: int, shape: Shape, device: int, owner: object, typestr: str = "|u1") -> None:
        shp: tuple[int, ...]
        if type(shape) is int and shape >= 0 and typestr == "|u1":  # a sample: the common case, kept cheap
            shp, n = (shape,), shape
        else:
            shp = (shape,) if isinstance(shape, int) else tuple(shape)
            if any(type(d) is not int or d < 0 for d in shp):
                raise ValueError(f"CudaArray: shape must be non-negative ints, got {shape!r}")
            n = int(typestr[2:]) if len(typestr) > 2 and typestr[2:].isdigit() else 0
            if n <= 0:
                raise ValueError(f"CudaArray: typestr {typestr!r} has no item size")
            for d in shp:
                n *= d
        self.ptr, self.shape, self.typestr, self.nbytes, self.device = ptr, shp, typestr, n, device
        self._owner = owner
        hold = getattr(owner, "_hold", None)  # a DeviceMapping counts its arrays
        if hold is not None:
            hold()

    def __del__(self) -> None:
        # No module globals here: at interpreter exit they may be gone.
        unhold = getattr(getattr(self, "_owner", None), "_unhold", None)
        if unhold is not None:
            unhold()

    def __copy__(self) -> CudaArray:
        """Another view of the same memory (holding it too)."""
        return CudaArray(self.ptr, self.shape, self.device, self._owner, self.typestr)

    def __deepcopy__(self, memo: dict[int, Any]) -> CudaArray:
        return self.__copy__()  # GPU memory is not copied here: a view, as copy()

    def __reduce__(self) -> Any:
        raise TypeError("a CudaArray views GPU memory mapped in this process: it cannot be pickled")

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "typestr": self.typestr, "data": (self.ptr, False), "version": 3,
                "strides": None, "stream": None}

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d CudaArray")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"CudaArray(ptr={self.ptr:#x}, shape={self.shape}, typestr={self.typestr!r}, device={self.device})"
