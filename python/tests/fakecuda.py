# SPDX-License-Identifier: Apache-2.0
"""A recording, strict libcuda double for the client's unit tests: every
call is recorded; the driver state the client touches (contexts per
thread, primary-context retains, handles, reservations, mappings, events)
is kept, and a call whose documented precondition does not hold returns
CUDA's error and is recorded as a violation, as the C stand-in
(internal/cuda/standin) does for the whole-flow tests.

GPUs are given by UUID bytes in this process's order (as after
``CUDA_VISIBLE_DEVICES``); ``fail`` maps an entry point to the error it
returns (no violation recorded)."""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable, Optional

SUCCESS, INVALID_VALUE, OUT_OF_MEMORY, NOT_INITIALIZED = 0, 1, 2, 3
INVALID_DEVICE, INVALID_CONTEXT, INVALID_HANDLE = 101, 201, 400

_NAMES = {0: "CUDA_SUCCESS", 1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY",
          3: "CUDA_ERROR_NOT_INITIALIZED", 101: "CUDA_ERROR_INVALID_DEVICE", 201: "CUDA_ERROR_INVALID_CONTEXT",
          400: "CUDA_ERROR_INVALID_HANDLE", 999: "CUDA_ERROR_UNKNOWN"}


def uuid_bytes(i: int) -> bytes:
    """The stand-in's UUID bytes of physical GPU i."""
    return f"STANDIN-GPU-000{i}".encode()


def _v(x: Any) -> Any:
    """The value of a ctypes scalar (or x itself)."""
    return x.value if hasattr(x, "value") else x


def _out(x: Any) -> Any:
    """The object behind a ctypes.byref()."""
    return x._obj


class FakeCuda:
    """libcuda as ctypes.CDLL would give it, over Python state."""

    def __init__(self, gpus: Optional[list[bytes]] = None, fail: Optional[dict[str, int]] = None) -> None:
        self.gpus = gpus if gpus is not None else [uuid_bytes(0), uuid_bytes(1)]
        self.fail = dict(fail or {})
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.violations: list[str] = []
        self.inited = False
        self._tls = threading.local()
        self.retains: dict[int, int] = {}
        self.handles: set[int] = set()
        self.reservations: dict[int, int] = {}
        self.mappings: dict[int, int] = {}
        self.access: set[int] = set()
        self.events: dict[int, int] = {}  # handle -> flags
        self.records: list[tuple[int, int]] = []  # (event, stream)
        self.syncs: list[str] = []  # what each synchronization waited for
        self.not_ready: set[int] = set()  # events cuEventQuery calls not done yet
        self.on_call: Optional[Callable[[str], None]] = None
        self._next = 0x7000_0000
        self._lock = threading.Lock()

    # -- bookkeeping --------------------------------------------------

    def names(self) -> list[str]:
        """The entry points called, in order (cuGetErrorName left out)."""
        return [n for n, _ in self.calls if n != "cuGetErrorName"]

    def live(self) -> dict[str, int]:
        """What is still held, by kind (all 0 after a clean shutdown)."""
        return {"primary_ctx_retains": sum(self.retains.values()), "imports": len(self.handles),
                "reservations": len(self.reservations), "mappings": len(self.mappings), "events": len(self.events),
                "pushed": len(self._stack())}

    def _stack(self) -> list[int]:
        if not hasattr(self._tls, "stack"):
            self._tls.stack = []
        s: list[int] = self._tls.stack
        return s

    def current(self) -> Optional[int]:
        """The device whose primary context is current on this thread."""
        s = self._stack()
        return s[-1] - 0x1000 if s else None

    def _violate(self, name: str, what: str, rc: int) -> int:
        self.violations.append(f"{name}: {what}")
        return rc

    def _addr(self) -> int:
        with self._lock:
            self._next += 1 << 24
            return self._next

    def __getattr__(self, name: str) -> Any:
        impl = getattr(type(self), "_" + name, None)
        if impl is None:
            raise AttributeError(f"libcuda double: undefined symbol: {name}")

        def call(*args: Any) -> int:
            self.calls.append((name, args))
            if self.on_call is not None:
                self.on_call(name)
            if name in self.fail:
                return self.fail[name]
            if name not in ("cuInit", "cuGetErrorName") and not self.inited:
                return self._violate(name, "cuInit not called", NOT_INITIALIZED)
            return int(impl(self, name, *args))
        return call

    def _need_ctx(self, name: str) -> Optional[int]:
        if not self._stack():
            self._violate(name, "no current context on the calling thread", INVALID_CONTEXT)
            return INVALID_CONTEXT
        return None

    # -- entry points -------------------------------------------------

    def _cuInit(self, name: str, flags: int) -> int:
        self.inited = True
        return SUCCESS

    def _cuGetErrorName(self, name: str, rc: int, out: Any) -> int:
        if rc not in _NAMES:
            return INVALID_VALUE
        _out(out).value = _NAMES[rc].encode()
        return SUCCESS

    def _cuDeviceGetCount(self, name: str, out: Any) -> int:
        _out(out).value = len(self.gpus)
        return SUCCESS

    def _cuDeviceGet(self, name: str, out: Any, ordinal: int) -> int:
        if not 0 <= ordinal < len(self.gpus):
            return INVALID_DEVICE
        _out(out).value = ordinal
        return SUCCESS

    def _cuDeviceGetUuid_v2(self, name: str, out: Any, dev: Any) -> int:
        d = _v(dev)
        if not 0 <= d < len(self.gpus):
            return INVALID_DEVICE
        ctypes.memmove(ctypes.addressof(_out(out)), self.gpus[d], 16)
        return SUCCESS

    def _cuDevicePrimaryCtxRetain(self, name: str, out: Any, dev: Any) -> int:
        d = _v(dev)
        self.retains[d] = self.retains.get(d, 0) + 1
        _out(out).value = 0x1000 + d
        return SUCCESS

    def _cuDevicePrimaryCtxRelease_v2(self, name: str, dev: Any) -> int:
        d = _v(dev)
        if self.retains.get(d, 0) <= 0:
            return self._violate(name, f"device {d}: release without a retain", INVALID_CONTEXT)
        self.retains[d] -= 1
        return SUCCESS

    def _cuCtxPushCurrent_v2(self, name: str, ctx: Any) -> int:
        c = _v(ctx)
        if c is None or self.retains.get(c - 0x1000, 0) <= 0:
            return self._violate(name, f"context {c} is not retained", INVALID_CONTEXT)
        self._stack().append(c)
        return SUCCESS

    def _cuCtxPopCurrent_v2(self, name: str, out: Any) -> int:
        s = self._stack()
        if not s:
            return self._violate(name, "no context to pop", INVALID_CONTEXT)
        _out(out).value = s.pop()
        return SUCCESS

    def _cuCtxSynchronize(self, name: str) -> int:
        rc = self._need_ctx(name)
        if rc is None:
            self.syncs.append(f"ctx {self.current()}")
        return rc or SUCCESS

    def _cuMemImportFromShareableHandle(self, name: str, out: Any, fd: Any, typ: int) -> int:
        if (rc := self._need_ctx(name)) is not None:
            return rc
        if typ != 1:
            return self._violate(name, f"handle type {typ}, want POSIX fd", INVALID_VALUE)
        h = self._addr()
        self.handles.add(h)
        _out(out).value = h
        return SUCCESS

    def _cuMemAddressReserve(self, name: str, out: Any, size: Any, align: Any, addr: Any, flags: Any) -> int:
        if (rc := self._need_ctx(name)) is not None:
            return rc
        p = self._addr()
        self.reservations[p] = _v(size)
        _out(out).value = p
        return SUCCESS

    def _cuMemMap(self, name: str, ptr: Any, size: Any, off: Any, h: Any, flags: Any) -> int:
        if (rc := self._need_ctx(name)) is not None:
            return rc
        p = _v(ptr)
        if p not in self.reservations or _v(h) not in self.handles:
            return self._violate(name, f"{p:#x}: not reserved, or the handle is not live", INVALID_VALUE)
        self.mappings[p] = _v(size)
        return SUCCESS

    def _cuMemRelease(self, name: str, h: Any) -> int:
        if (rc := self._need_ctx(name)) is not None:
            return rc
        if _v(h) not in self.handles:
            return self._violate(name, "release of an unknown handle", INVALID_VALUE)
        self.handles.discard(_v(h))
        return SUCCESS

    def _cuMemSetAccess(self, name: str, ptr: Any, size: Any, desc: Any, count: Any) -> int:
        if (rc := self._need_ctx(name)) is not None:
            return rc
        p, d = _v(ptr), _out(desc)
        if p not in self.mappings:
            return self._violate(name, f"{p:#x} is not mapped", INVALID_VALUE)
        if d.location.id != self.current():
            return self._violate(name, f"location {d.location.id} is not the memory's device {self.current()}",
                                 INVALID_DEVICE)
        self.access.add(p)
        return SUCCESS

    def _cuMemUnmap(self, name: str, ptr: Any, size: Any) -> int:
        if (rc := self._need_ctx(name)) is not None:
            return rc
        p = _v(ptr)
        if p not in self.mappings:
            return self._violate(name, f"{p:#x} is not mapped", INVALID_VALUE)
        del self.mappings[p]
        self.access.discard(p)
        return SUCCESS

    def _cuMemAddressFree(self, name: str, ptr: Any, size: Any) -> int:
        if (rc := self._need_ctx(name)) is not None:
            return rc
        p = _v(ptr)
        if p not in self.reservations:
            return self._violate(name, f"{p:#x} is not reserved", INVALID_VALUE)
        if p in self.mappings:
            return self._violate(name, f"{p:#x} still has a mapping", INVALID_VALUE)
        del self.reservations[p]
        return SUCCESS

    def _cuEventCreate(self, name: str, out: Any, flags: int) -> int:
        if (rc := self._need_ctx(name)) is not None:
            return rc
        e = self._addr()
        self.events[e] = flags
        _out(out).value = e
        return SUCCESS

    def _cuEventRecord(self, name: str, ev: Any, stream: Any) -> int:
        if (rc := self._need_ctx(name)) is not None:
            return rc
        if _v(ev) not in self.events:
            return self._violate(name, "unknown or destroyed event", INVALID_HANDLE)
        self.records.append((_v(ev), _v(stream) or 0))
        return SUCCESS

    def _cuEventSynchronize(self, name: str, ev: Any) -> int:
        if (rc := self._need_ctx(name)) is not None:
            return rc
        if _v(ev) not in self.events:
            return self._violate(name, "unknown or destroyed event", INVALID_HANDLE)
        self.syncs.append(f"event {_v(ev):#x}")
        return SUCCESS

    def _cuEventQuery(self, name: str, ev: Any) -> int:
        if (rc := self._need_ctx(name)) is not None:
            return rc
        if _v(ev) not in self.events:
            return self._violate(name, "unknown or destroyed event", INVALID_HANDLE)
        return 600 if _v(ev) in self.not_ready else SUCCESS  # CUDA_ERROR_NOT_READY

    def _cuEventDestroy_v2(self, name: str, ev: Any) -> int:
        if (rc := self._need_ctx(name)) is not None:
            return rc
        if _v(ev) not in self.events:
            return self._violate(name, "destroy of an unknown or destroyed event", INVALID_HANDLE)
        del self.events[_v(ev)]
        return SUCCESS
