# SPDX-License-Identifier: Apache-2.0
"""GPU batch memory in the client: the daemon passes a CUDA VMM POSIX file
descriptor; this module imports and maps it with the CUDA driver API
(ctypes on libcuda: no CuPy or PyTorch needed) and wraps samples (or a
whole dense batch) as objects with ``__cuda_array_interface__`` v3, which
DALI's ``fn.external_source(device="gpu")``, ``torch.as_tensor(x,
device="cuda")`` and ``cupy.asarray(x)`` take without a copy.

The daemon waits for its copy to the device (a CUDA event) before it sends
a batch's descriptor, so the bytes are ready when a batch is handed out:
the interface's ``stream`` is ``None`` ("no synchronization needed"; a
stream of the daemon's process could not be named here anyway).

Lifetimes: a ``DeviceMapping`` is unmapped when its owner (the source)
has let it go and no ``CudaArray`` of it is left, or at interpreter exit
for mappings still alive then; exactly once, with the device's primary
context pushed, after the context's queued work finished. GPUs are named
by UUID across processes (ordinals depend on ``CUDA_VISIBLE_DEVICES``)."""

from __future__ import annotations

import ctypes
import os
import threading
import warnings
import weakref
from typing import Any, Callable, Optional, Union

LIB_DIR_ENV = "NVFEED_CUDA_LIB_DIR"
"""A directory to load ``libcuda.so.1`` from instead of the loader's path
(the test suite's CUDA stand-in, a driver outside the loader's cache)."""

LIBCUDA = "libcuda.so.1"

_POSIX_FD = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
_LOCATION_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
_READWRITE = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE
_EVENT_FLAGS = 0x1 | 0x2  # CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING: wait asleep, no spinning core


class CudaError(RuntimeError):
    """A CUDA driver call failed, or there is no driver; the message names
    the call and CUDA's error (``call`` and ``code`` too, when a call
    failed)."""

    def __init__(self, message: str, call: str = "", code: int = 0) -> None:
        super().__init__(message)
        self.call, self.code = call, code


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


def load_libcuda() -> ctypes.CDLL:
    """libcuda.so.1 from ``$NVFEED_CUDA_LIB_DIR`` when that is set (and not
    empty), else from the dynamic loader's path. Raises CudaError saying
    what was tried."""
    d = os.environ.get(LIB_DIR_ENV, "")
    if d:
        path = os.path.join(d, LIBCUDA)
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            raise CudaError(f"no NVIDIA driver found: cannot load {path} ({LIB_DIR_ENV}={d}): {e}") from e
    try:
        return ctypes.CDLL(LIBCUDA)
    except OSError as e:
        raise CudaError(f"no NVIDIA driver found: {LIBCUDA} is not in the dynamic loader's path "
                        f"({LIB_DIR_ENV} is not set): {e}") from e


def _error(cu: Any, name: str, rc: int) -> CudaError:
    s = ctypes.c_char_p()
    try:
        known = int(cu.cuGetErrorName(rc, ctypes.byref(s))) == 0 and s.value
    except (AttributeError, OSError):
        known = False
    what = s.value.decode() if known and s.value else "CUDA_ERROR"
    return CudaError(f"{name}: {what} ({rc})", name, rc)


def _call(cu: Any, name: str, *args: Any) -> None:
    """Calls a driver entry point; raises CudaError naming it on failure."""
    rc = int(getattr(cu, name)(*args))
    if rc != 0:
        raise _error(cu, name, rc)


class _Failures:
    """Runs cleanup steps to the end, keeping what failed: the first
    failure is raised at the end, naming the others too."""

    def __init__(self) -> None:
        self.errors: list[CudaError] = []

    def run(self, f: Callable[..., None], *args: Any) -> bool:
        try:
            f(*args)
            return True
        except CudaError as e:
            self.errors.append(e)
            return False

    def raise_first(self) -> None:
        if not self.errors:
            return
        first = self.errors[0]
        if len(self.errors) == 1:
            raise first
        also = "; ".join(str(e) for e in self.errors[1:])
        raise CudaError(f"{first}; then {also}", first.call, first.code) from first


def format_uuid(raw: bytes) -> str:
    """A GPU's 16 UUID bytes as nvidia-smi and ``CUDA_VISIBLE_DEVICES``
    write them: ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``."""
    if len(raw) != 16:
        raise ValueError(f"a GPU UUID has 16 bytes, got {len(raw)}")
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _uuid_of(cu: Any, dev: ctypes.c_int) -> str:
    raw = (ctypes.c_ubyte * 16)()
    _call(cu, "cuDeviceGetUuid_v2", ctypes.byref(raw), dev)
    return format_uuid(bytes(raw))


def device_uuid(cu: Any, device: int) -> str:
    """The UUID of this process's GPU ``device`` (its ordinal here)."""
    _call(cu, "cuInit", 0)
    dev = ctypes.c_int()
    try:
        _call(cu, "cuDeviceGet", ctypes.byref(dev), device)
    except CudaError as e:
        raise CudaError(f"GPU {device} of this process: {e}", e.call, e.code) from e
    return _uuid_of(cu, dev)


def find_device(cu: Any, uuid: str) -> int:
    """This process's ordinal of the GPU with ``uuid``; CudaError naming
    the UUID and the GPUs this process sees when it sees no such GPU."""
    _call(cu, "cuInit", 0)
    n = ctypes.c_int()
    _call(cu, "cuDeviceGetCount", ctypes.byref(n))
    seen = []
    for i in range(n.value):
        dev = ctypes.c_int()
        _call(cu, "cuDeviceGet", ctypes.byref(dev), i)
        u = _uuid_of(cu, dev)
        if u.lower() == uuid.lower():
            return i
        seen.append(u)
    raise CudaError(f"GPU {uuid} is not visible to this process (it sees {', '.join(seen) or 'no GPU'}; "
                    f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')})")


class _PrimaryContext:
    """A device's primary context, retained once (at creation) and
    released once (``release``); pushed around the calls that need it."""

    def __init__(self, cu: Any, device: int) -> None:
        self.cu, self.device = cu, device
        _call(cu, "cuInit", 0)
        dev = ctypes.c_int()
        _call(cu, "cuDeviceGet", ctypes.byref(dev), device)
        ctx = ctypes.c_void_p()
        _call(cu, "cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        self.dev, self.ctx, self.retained = dev, ctx, True

    def push(self) -> None:
        _call(self.cu, "cuCtxPushCurrent_v2", self.ctx)

    def pop(self) -> None:
        old = ctypes.c_void_p()
        _call(self.cu, "cuCtxPopCurrent_v2", ctypes.byref(old))

    def release(self) -> None:
        """Gives the retain back; a second call does nothing."""
        if self.retained:
            self.retained = False
            _call(self.cu, "cuDevicePrimaryCtxRelease_v2", self.dev)


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
        cu = lib if lib is not None else load_libcuda()
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


def stream_handle(stream: object) -> Optional[int]:
    """The ``CUstream`` handle of a consumer's stream, as LoaderSource's
    ``cuda_stream`` takes it: ``None``; an int (0 the legacy default
    stream, 1 ``CU_STREAM_LEGACY``, 2 ``CU_STREAM_PER_THREAD``, else a
    handle); or an object with ``cuda_stream`` (``torch.cuda.Stream``),
    ``__cuda_stream__()`` (the CUDA stream protocol), ``handle`` (numba,
    an int or ``ctypes.c_void_p``) or ``ptr`` (``cupy.cuda.Stream``).
    Raises TypeError or ValueError naming ``cuda_stream``."""
    if stream is None:
        return None
    if isinstance(stream, bool):
        raise TypeError(f"cuda_stream must be a stream or its handle, got {stream!r}")
    h: object
    if isinstance(stream, int):
        h = stream
    elif hasattr(stream, "cuda_stream"):
        h = getattr(stream, "cuda_stream")
    elif hasattr(stream, "__cuda_stream__"):
        proto = getattr(stream, "__cuda_stream__")()
        h = proto[1] if isinstance(proto, tuple) and len(proto) == 2 else proto
    elif hasattr(stream, "handle"):
        h = getattr(stream, "handle")
    elif hasattr(stream, "ptr"):
        h = getattr(stream, "ptr")
    else:
        raise TypeError("cuda_stream must be None, an int CUstream handle, or a stream object with cuda_stream, "
                        f"__cuda_stream__, handle or ptr (torch.cuda.Stream, cupy.cuda.Stream); got {type(stream).__name__}")
    if isinstance(h, ctypes.c_void_p):
        h = h.value or 0
    if isinstance(h, bool) or not isinstance(h, int):
        raise TypeError(f"cuda_stream: {type(stream).__name__}'s handle is {h!r}, not an int")
    if h < 0 or h >= 1 << 64:
        raise ValueError(f"cuda_stream must be a CUstream handle in [0, 2**64), got {h}")
    return h


class _Fence:
    """What a ReleaseFence holds (apart from it, for its finalizer)."""

    def __init__(self, ctx: _PrimaryContext, stream: Optional[int]) -> None:
        self.ctx, self.stream = ctx, stream
        self.event: Optional[ctypes.c_void_p] = None

    def wait(self) -> None:
        cu, ctx = self.ctx.cu, self.ctx
        ctx.push()
        try:
            if self.stream is None:
                _call(cu, "cuCtxSynchronize")
            else:
                if self.event is None:
                    ev = ctypes.c_void_p()
                    _call(cu, "cuEventCreate", ctypes.byref(ev), _EVENT_FLAGS)
                    self.event = ev
                _call(cu, "cuEventRecord", self.event, ctypes.c_void_p(self.stream))
                _call(cu, "cuEventSynchronize", self.event)
        except BaseException:
            try:
                ctx.pop()
            except CudaError:
                pass  # the failure that brought us here is the one to raise
            raise
        ctx.pop()

    def close(self) -> None:
        f = _Failures()
        if self.event is not None:
            ev, self.event = self.event, None
            if f.run(self.ctx.push):
                f.run(_call, self.ctx.cu, "cuEventDestroy_v2", ev)
                f.run(self.ctx.pop)
        f.run(self.ctx.release)
        f.raise_first()

    def close_quietly(self) -> None:
        try:
            self.close()
        except CudaError as e:
            warnings.warn(f"nvfeed: releasing the consumer fence: {e}", RuntimeWarning, stacklevel=2)


class ReleaseFence:
    """Makes the consumer's queued GPU work finish before batch memory goes
    back to the daemon (which then writes it again).

    ``wait()``, with ``stream`` None: ``cuCtxSynchronize`` with the
    device's primary context pushed (every stream of that context: what
    DALI, PyTorch and CuPy use by default); with a stream handle: an event
    (``CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING``, created on first
    use and reused) recorded on that stream, then synchronized. The primary
    context is retained from creation to ``close()`` (or interpreter
    exit)."""

    def __init__(self, cu: Any, device: int, stream: Optional[int]) -> None:
        self._f = _Fence(_PrimaryContext(cu, device), stream)
        self._fin = weakref.finalize(self, self._f.close_quietly)

    def wait(self) -> None:
        """Returns when the work queued so far (on the stream, or in the
        context) has finished; CudaError naming the call otherwise."""
        if not self._fin.alive:
            raise CudaError("the release fence is closed")
        self._f.wait()

    def close(self) -> None:
        """Destroys the event and releases the context (once)."""
        if self._fin.detach() is not None:
            self._f.close()


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
