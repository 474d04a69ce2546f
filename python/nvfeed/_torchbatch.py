# SPDX-License-Identifier: Apache-2.0
"""What ``nvfeed.torch.LoaderDataset`` yields, made so it cannot be
mistaken: a file dataset's ``(samples, labels)`` that says so when used
as a tensor, a numpy dataset's dense batch that refuses to be unpacked
as ``(samples, labels)``, and zero-copy tensors that refuse writes (the
batch memory is mapped read-only: a write would be a segfault)."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import torch

_IN_PLACE_DUNDERS = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
                     "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__imatmul__"}


def _writes(name: str) -> bool:
    """Whether the tensor method or function name writes its first argument."""
    return name in _IN_PLACE_DUNDERS or (name.endswith("_") and not name.startswith("__"))


def _storages(args: Any, kwargs: Any) -> set[int]:
    """The storage addresses of the read-only tensors among args and kwargs."""
    out: set[int] = set()
    for a in list(args) + list(kwargs.values()):
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(t, ReadOnlyTensor):
                out.add(torch.Tensor.untyped_storage(t).data_ptr())
    return out


def _wrap(out: Any, ro: set[int]) -> Any:
    """Outputs over read-only memory (views) stay read-only; the rest plain."""
    if isinstance(out, torch.Tensor):
        if out.untyped_storage().data_ptr() in ro and not isinstance(out, ReadOnlyTensor):
            return out.as_subclass(ReadOnlyTensor)
        return out
    if isinstance(out, (list, tuple)):
        return type(out)(_wrap(o, ro) for o in out)
    return out


class ReadOnlyTensor(torch.Tensor):
    """A tensor over the daemon's batch memory (``zero_copy=True``), which
    this process maps read-only: an in-place op, an assignment into it or
    ``out=`` it raises ``RuntimeError`` instead of killing the process;
    its views (slices, reshapes) are read-only too, other results are
    ordinary tensors; ``.numpy()`` is a read-only array. ``.clone()`` is
    a writable copy."""

    @classmethod
    def __torch_function__(cls, func: Callable[..., Any], types: Any, args: Any = (),
                           kwargs: Optional[dict[str, Any]] = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        target = kwargs.get("out")
        if (_writes(name) and args and isinstance(args[0], ReadOnlyTensor)) or isinstance(target, ReadOnlyTensor):
            raise RuntimeError(f"{name}: this tensor views loaderd's batch memory (zero_copy=True), which is mapped "
                               "read-only: write into a copy (t.clone())")
        with torch._C.DisableTorchFunctionSubclass():
            ro = _storages(args, kwargs)
            out = func(*args, **kwargs)
            if name == "numpy" and hasattr(out, "flags"):
                out.flags.writeable = False
            return _wrap(out, ro)


def _refuse_unpacking(what: str) -> TypeError:
    return TypeError(f"LoaderDataset over a numpy dataset yields one tensor (batch, *shape) a batch, {what}: "
                     "take it whole (`for x in ds`), or its rows with x.unbind(0)")


class DenseBatch(torch.Tensor):
    """A numpy dataset's dense batch, ``(batch, *shape)``: a tensor in
    every way but iteration, so that unpacking it as a file dataset's
    ``(samples, labels)`` raises ``TypeError`` instead of splitting its
    rows (``x.unbind(0)`` gives them). Results of ops are plain tensors."""

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    def __iter__(self) -> Iterator[torch.Tensor]:
        raise _refuse_unpacking("not (samples, labels), and it is not iterated row by row")


class ReadOnlyDenseBatch(ReadOnlyTensor):
    """``DenseBatch`` over read-only batch memory (``zero_copy=True``)."""

    def __iter__(self) -> Iterator[torch.Tensor]:
        raise _refuse_unpacking("not (samples, labels), and it is not iterated row by row")


class FileBatch(tuple[Any, ...]):
    """A file dataset's batch: ``(samples, labels)``, a tuple of two;
    used as a tensor (``.shape``, ``.to`` ...) it says what it is."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(f"LoaderDataset over a file dataset yields (samples, labels) a batch: a tuple of a list "
                             f"of 1-D uint8 tensors and an int64 tensor of labels, which has no .{name}: unpack it "
                             "(`for samples, labels in ds`)")


def dense(t: torch.Tensor, zero_copy: bool) -> torch.Tensor:
    """A dense numpy batch as DenseBatch (ReadOnlyDenseBatch: zero_copy)."""
    return t.as_subclass(ReadOnlyDenseBatch if zero_copy else DenseBatch)


def read_only(t: torch.Tensor) -> torch.Tensor:
    """t (over the read-only batch memory) as a ReadOnlyTensor."""
    return t.as_subclass(ReadOnlyTensor)
