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

import collections
import ctypes
import os
import threading
import warnings
import weakref
from typing import Any, Callable, Optional, Union

from ._errors import LoaderError

LIB_DIR_ENV = "NVFEED_CUDA_LIB_DIR"
"""A directory to load ``libcuda.so.1`` from instead of the loader's path
(the test suite's CUDA stand-in, a driver outside the loader's cache)."""

LIBCUDA = "libcuda.so.1"

_POSIX_FD = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
_LOCATION_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
_READWRITE = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE
_EVENT_FLAGS = 0x1 | 0x2  # CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING: wait asleep, no spinning core


class CudaError(LoaderError):
    """A CUDA driver call failed, or there is no driver; the message names
    the call, CUDA's error and what to do about it (``call`` and ``code``
    too, when a call failed). A ``LoaderError``: a script catching that
    catches GPU failures too."""

    def __init__(self, message: str, call: str = "", code: int = 0) -> None:
        super().__init__(message)
        self.call, self.code = call, code


NO_DRIVER_HINT = ("install the NVIDIA driver (it provides libcuda.so.1), point NVFEED_CUDA_LIB_DIR at the folder "
                  "holding libcuda.so.1, or use device='cpu'")
"""What to do when this process has no CUDA driver."""

_HINTS: dict[int, str] = {
    2: "the GPU is out of memory: free some (other processes: nvidia-smi) or use a smaller batch_size",
    3: "the driver is not initialised: " + NO_DRIVER_HINT,
    34: "the CUDA stub library was loaded, not the driver's: " + NO_DRIVER_HINT,
    35: "the NVIDIA driver is older than this CUDA: update the driver",
    100: "this process sees no GPU: check nvidia-smi and CUDA_VISIBLE_DEVICES, or use device='cpu'",
    101: "device_id is not a GPU of this process: count the GPUs CUDA_VISIBLE_DEVICES leaves it",
    999: "the driver failed: check nvidia-smi and the kernel log (dmesg)",
    803: "the NVIDIA kernel module and libcuda.so.1 differ in version: reboot, or reinstall the driver",
    804: "forward compatibility is not supported on this GPU: use the driver's own libcuda.so.1",
}
"""What to do about a CUDA driver error, by code (CUresult), when a call
of _SETUP fails."""

_SETUP = frozenset({"cuInit", "cuDeviceGet", "cuDeviceGetCount", "cuDeviceGetUuid_v2", "cuDevicePrimaryCtxRetain",
                    "cuMemImportFromShareableHandle", "cuMemAddressReserve", "cuMemMap", "cuMemSetAccess"})
"""The calls that set a GPU up for this process: their failures say what to
do (a cleanup's failure names the call alone)."""


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


def load_libcuda() -> ctypes.CDLL:
    """libcuda.so.1 from ``$NVFEED_CUDA_LIB_DIR`` when that is set (and not
    empty) and holds it, else from the dynamic loader's search (the
    system's driver). A file there that does not load is an error, not a
    reason to look elsewhere. Raises CudaError saying what was tried and
    what to do."""
    d = os.environ.get(LIB_DIR_ENV, "")
    tried = f"{LIB_DIR_ENV} is not set"
    if d:
        path = os.path.join(d, LIBCUDA)
        if os.path.lexists(path):
            try:
                return ctypes.CDLL(path)
            except OSError as e:
                raise CudaError(f"no NVIDIA driver found: cannot load {path} ({LIB_DIR_ENV}={d}): {e}; "
                                f"{NO_DRIVER_HINT}") from e
        tried = f"{LIB_DIR_ENV}={d} holds no {LIBCUDA}"
    try:
        return ctypes.CDLL(LIBCUDA)
    except OSError as e:
        raise CudaError(f"no NVIDIA driver found: {LIBCUDA} is not in the dynamic loader's path ({tried}): {e}; "
                        f"{NO_DRIVER_HINT}") from e


def _error(cu: Any, name: str, rc: int) -> CudaError:
    s = ctypes.c_char_p()
    try:
        known = int(cu.cuGetErrorName(rc, ctypes.byref(s))) == 0 and s.value
    except (AttributeError, OSError):
        known = False
    what = s.value.decode() if known and s.value else "CUDA_ERROR"
    hint = _HINTS.get(rc) if name in _SETUP else None
    return CudaError(f"{name}: {what} ({rc})" + (f": {hint}" if hint else ""), name, rc)


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
                    f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}): give this process a "
                    "CUDA_VISIBLE_DEVICES that includes the GPU the daemon placed the memory on")


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
        raise TypeError("cuda_stream must be None, 'context', an int CUstream handle, or a stream object with cuda_stream, "
                        f"__cuda_stream__, handle or ptr (torch.cuda.Stream, cupy.cuda.Stream); got {type(stream).__name__}")
    if isinstance(h, ctypes.c_void_p):
        h = h.value or 0
    if isinstance(h, bool) or not isinstance(h, int):
        raise TypeError(f"cuda_stream: {type(stream).__name__}'s handle is {h!r}, not an int")
    if h < 0 or h >= 1 << 64:
        raise ValueError(f"cuda_stream must be a CUstream handle in [0, 2**64), got {h}")
    return h


CU_STREAM_LEGACY = 1
"""The legacy default stream's handle: work recorded on it follows the
work queued before on every blocking stream of the context."""

CONTEXT = "context"
"""LoaderSource's ``cuda_stream="context"``: the release fence waits for
the whole context (``cuCtxSynchronize``), the client's behaviour before
the fence moved to a stream."""

_NOT_READY = 600  # CUDA_ERROR_NOT_READY: cuEventQuery's "not yet"


def torch_current_stream(device: int) -> Optional[int]:
    """The handle of PyTorch's current stream on ``device`` when PyTorch is
    imported in this process and has initialised CUDA; else None. PyTorch
    is never imported here."""
    import sys
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_initialized():
            return None
        h = torch.cuda.current_stream(device).cuda_stream
    except (AttributeError, RuntimeError):
        return None
    return h if isinstance(h, int) and not isinstance(h, bool) else None


class _Fence:
    """What a ReleaseFence holds (apart from it, for its finalizer): the
    context, the slots waiting with their events, the events free again."""

    def __init__(self, ctx: _PrimaryContext, stream: Union[int, str, None],
                 current: Callable[[int], Optional[int]]) -> None:
        self.ctx, self.stream, self.current = ctx, stream, current
        self.pending: collections.deque[tuple[int, Optional[ctypes.c_void_p]]] = collections.deque()
        self.free: list[ctypes.c_void_p] = []
        self.events: list[ctypes.c_void_p] = []

    def consumer_stream(self) -> int:
        """The stream the consumer's work is on now: the one given, else
        PyTorch's current stream, else the legacy default stream."""
        if isinstance(self.stream, int):
            return self.stream
        h = self.current(self.ctx.device)
        return CU_STREAM_LEGACY if h is None else h

    def record(self, slot: int) -> None:
        cu, ctx = self.ctx.cu, self.ctx
        ctx.push()
        try:
            if self.stream == CONTEXT:
                _call(cu, "cuCtxSynchronize")
                self.pending.append((slot, None))
            else:
                if self.free:
                    ev = self.free.pop()
                else:
                    ev = ctypes.c_void_p()
                    _call(cu, "cuEventCreate", ctypes.byref(ev), _EVENT_FLAGS)
                    self.events.append(ev)
                try:
                    _call(cu, "cuEventRecord", ev, ctypes.c_void_p(self.consumer_stream()))
                except CudaError:
                    self.free.append(ev)
                    raise
                self.pending.append((slot, ev))
        finally:
            ctx.pop()

    def wait(self) -> None:
        cu, ctx = self.ctx.cu, self.ctx
        ctx.push()
        try:
            if self.stream == CONTEXT:
                _call(cu, "cuCtxSynchronize")
                return
            if not self.free:
                ev = ctypes.c_void_p()
                _call(cu, "cuEventCreate", ctypes.byref(ev), _EVENT_FLAGS)
                self.events.append(ev)
                self.free.append(ev)
            ev = self.free[-1]
            _call(cu, "cuEventRecord", ev, ctypes.c_void_p(self.consumer_stream()))
            _call(cu, "cuEventSynchronize", ev)
        finally:
            ctx.pop()

    def done(self, keep: int) -> list[int]:
        cu, ctx = self.ctx.cu, self.ctx
        out: list[int] = []
        if not self.pending:
            return out
        ctx.push()
        try:
            still: collections.deque[tuple[int, Optional[ctypes.c_void_p]]] = collections.deque()
            while self.pending:
                slot, ev = self.pending[0]
                rc = 0 if ev is None else int(cu.cuEventQuery(ev))
                if rc not in (0, _NOT_READY):
                    # Nothing is lost: the slots found done go out next time.
                    done: collections.deque[tuple[int, Optional[ctypes.c_void_p]]] = collections.deque(
                        (x, None) for x in out)
                    self.pending = done + still + self.pending
                    raise _error(cu, "cuEventQuery", rc)
                self.pending.popleft()
                if rc == _NOT_READY:
                    still.append((slot, ev))
                    continue
                out.append(slot)
                if ev is not None:
                    self.free.append(ev)
            self.pending = still
            while len(self.pending) > keep:
                slot, ev = self.pending[0]
                if ev is not None:
                    _call(cu, "cuEventSynchronize", ev)
                    self.free.append(ev)
                self.pending.popleft()
                out.append(slot)
        finally:
            ctx.pop()
        return out

    def close(self) -> None:
        f = _Failures()
        events, self.events, self.free = self.events, [], []
        self.pending.clear()
        if events and f.run(self.ctx.push):
            for ev in events:
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
    """Holds batch memory back from the daemon (which writes it again once
    it has it) until the consumer's GPU work queued on it has finished,
    without stopping the host for it.

    ``record(slot)`` marks the consumer's work queued so far: an event
    (``CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING``, from a pool
    reused as events complete) recorded on the consumer's stream —
    ``stream`` when given; else PyTorch's current stream on the device
    when PyTorch has initialised CUDA in this process; else the legacy
    default stream (which follows every blocking stream of the context).
    With ``stream`` ``"context"``, ``cuCtxSynchronize`` at once instead.
    ``done(keep)`` gives the slots whose events completed (``cuEventQuery``,
    no wait), and waits (``cuEventSynchronize``, the oldest first) only
    while more than ``keep`` slots would stay held back. No whole-context
    synchronisation per release by default: a CUDA graph being captured
    on another stream is left alone. The primary context is retained from
    creation to ``close()`` (or interpreter exit)."""

    def __init__(self, cu: Any, device: int, stream: Union[int, str, None],
                 current: Callable[[int], Optional[int]] = torch_current_stream) -> None:
        self._f = _Fence(_PrimaryContext(cu, device), stream, current)
        self._fin = weakref.finalize(self, self._f.close_quietly)

    def _check(self) -> None:
        if not self._fin.alive:
            raise CudaError("the release fence is closed")

    def record(self, slot: int) -> None:
        """Holds ``slot`` back until the consumer's work queued so far has
        finished; CudaError naming the call when it cannot."""
        self._check()
        self._f.record(slot)

    def wait(self) -> None:
        """Returns when the consumer's work queued so far has finished (an
        event recorded on its stream, then waited for; with ``"context"``,
        ``cuCtxSynchronize``); CudaError naming the call otherwise."""
        self._check()
        self._f.wait()

    def done(self, keep: int) -> list[int]:
        """The slots held back whose consumer's work has finished, oldest
        first, waiting for the oldest ones while more than ``keep`` would
        stay held back; CudaError naming the call otherwise."""
        self._check()
        return self._f.done(keep)

    @property
    def held(self) -> list[int]:
        """The slots held back now."""
        return [slot for slot, _ in self._f.pending]

    def forget(self) -> None:
        """Drops the slots held back (they belonged to a session that is
        gone); their events are reused."""
        f = self._f
        f.free += [ev for _, ev in f.pending if ev is not None]
        f.pending.clear()

    def close(self) -> None:
        """Destroys the events and releases the context (once)."""
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
