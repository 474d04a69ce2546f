# SPDX-License-Identifier: Apache-2.0
"""The release fence: batch GPU memory held back from the daemon until the
consumer's GPU work queued on it has finished (an event recorded on the
consumer's stream, polled without waiting), with the driver calls of
``_cuda``."""

from __future__ import annotations

import collections
import ctypes
import warnings
import weakref
from typing import Any, Callable, Optional, Union

from ._cuda import _EVENT_FLAGS, CONTEXT, CU_STREAM_LEGACY, CudaError, _call, _error, _Failures, _PrimaryContext

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
                    try:
                        _call(cu, "cuEventSynchronize", ev)
                    except CudaError:
                        # Nothing is lost: the slots found done go out next time.
                        self.pending.extendleft((x, None) for x in reversed(out))
                        raise
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
