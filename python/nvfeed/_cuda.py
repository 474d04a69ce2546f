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
by UUID across processes (ordinals depend on ``CUDA_VISIBLE_DEVICES``).

This module is the driver (loading libcuda, its errors, GPUs by UUID,
primary contexts, consumer streams); ``_cudamem`` maps the memory
(``DeviceMapping``, ``CudaArray``) and ``_fence`` holds it back until the
consumer's GPU work is done (``ReleaseFence``)."""

from __future__ import annotations

import ctypes
import os
from typing import Any, Callable, Optional

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


def session_device(cu: Any, session: str, uuid: str, device_id: int, asked: str) -> int:
    """This process's ordinal of the GPU a session's memory is on, by its
    ``uuid``; ``device_id`` when the daemon names none (a daemon before
    UUIDs: then its ordinal is ``device_id``). CudaError when it is not the
    GPU the source asked for (``asked``, ``device_id``)."""
    if not uuid:
        return device_id
    dev = find_device(cu, uuid)
    if dev != device_id:
        raise CudaError(f"the daemon placed session {session}'s memory on GPU {uuid} (device {dev} here), not on "
                        f"{asked} (device_id {device_id}) that this source asked for")
    return dev


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
