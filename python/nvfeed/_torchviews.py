# SPDX-License-Identifier: Apache-2.0
"""A batch's memory as torch tensors for ``nvfeed.torch.LoaderDataset``:
views (``zero_copy``) or copies of one span of batch memory, host or GPU,
and when the batch may go back to the daemon (the copies, or the loop's
GPU work on the views, done)."""

from __future__ import annotations

from typing import Any, Optional, Union, cast

import numpy as np
import torch

from ._cudamem import CudaArray
from ._torchbatch import dense, read_only
from ._views import Tensors

TensorBatch = Union[torch.Tensor, list[torch.Tensor]]
"""One batch of a numpy dataset: one tensor (batch, *shape) when its arrays
share a shape, else a list of tensors, each its array's dtype and shape."""


class _Writable:
    """Presents a read-only numpy view of batch memory as writable, so that
    ``torch.from_numpy`` takes it without its "not writable" warning. The
    memory itself stays read-only: zero-copy tensors are ``ReadOnlyTensor``
    (``_torchbatch``), which refuse writes;
    ``_base`` keeps it mapped. Bytes by default, or an array of ``typestr``
    and ``shape``."""

    __slots__ = ("__array_interface__", "_base")

    def __init__(self, ptr: int, nbytes: int, base: object, typestr: str = "|u1",
                 shape: Optional[tuple[int, ...]] = None) -> None:
        self.__array_interface__ = {"shape": (nbytes,) if shape is None else shape, "typestr": typestr,
                                    "data": (ptr, False), "version": 3}
        self._base = base


def _writable(a: "np.ndarray[Any, np.dtype[Any]]") -> "np.ndarray[Any, np.dtype[Any]]":
    """A writable view of a's memory (see _Writable), a keeping it mapped."""
    return np.asarray(_Writable(int(a.__array_interface__["data"][0]), a.nbytes, a, a.dtype.str, a.shape))


def _span(addrs: list[int], sizes: list[int]) -> tuple[int, int]:
    """The first byte and the length of the smallest range holding every sample."""
    lo = min(addrs)
    return lo, max(a + n for a, n in zip(addrs, sizes)) - lo


class TorchViews:
    """Batches as tensors on ``device``, views (``zero_copy``) or copies;
    ``pending`` the CUDA event the batch handed out last waits for: its
    copies, or (zero_copy) the end of the work queued before the previous
    request."""

    def __init__(self, device: torch.device, zero_copy: bool) -> None:
        self.device, self.zero_copy = device, zero_copy
        self.pending: Optional[torch.cuda.Event] = None

    def arrays(self, b: Tensors) -> TensorBatch:
        """A numpy dataset's batch as tensors: one dense tensor, or a list;
        views (zero_copy) or copies (one span of batch memory copied)."""
        if self.device.type == "cuda":
            if isinstance(b, CudaArray):
                t = torch.as_tensor(b, device=self.device)
                if not self.zero_copy:
                    t = t.clone()
                    self.mark_copies()
                return dense(t, self.zero_copy)
            return self.cuda_arrays(cast(list[CudaArray], b))
        if isinstance(b, np.ndarray):
            return dense(torch.from_numpy(_writable(b) if self.zero_copy else b.copy()), self.zero_copy)
        arrays = cast(list["np.ndarray[Any, np.dtype[Any]]"], b)
        if self.zero_copy or not arrays:
            return [read_only(torch.from_numpy(_writable(a))) for a in arrays]
        addrs = [int(a.__array_interface__["data"][0]) for a in arrays]
        lo, n = _span(addrs, [a.nbytes for a in arrays])
        span = np.asarray(_Writable(lo, n, arrays[0])).copy()  # one copy of the batch's bytes
        return [torch.from_numpy(np.ndarray(a.shape, dtype=a.dtype, buffer=span, offset=p - lo))
                for a, p in zip(arrays, addrs)]

    def cuda_arrays(self, arrays: list[CudaArray]) -> list[torch.Tensor]:
        """A numpy dataset's ragged GPU batch: a tensor per array."""
        if self.zero_copy or not arrays:
            return [read_only(torch.as_tensor(a, device=self.device)) for a in arrays]
        lo, n = _span([a.ptr for a in arrays], [a.nbytes for a in arrays])
        span = torch.as_tensor(CudaArray(lo, n, self.device.index or 0, arrays[0]), device=self.device).clone()
        self.mark_copies()
        dtype = torch.from_numpy(np.empty(0, dtype=np.dtype(arrays[0].typestr))).dtype
        return [span[a.ptr - lo:a.ptr - lo + a.nbytes].view(dtype).reshape(a.shape) for a in arrays]

    def mark_copies(self) -> None:
        """Records the end of the copies just queued: the batch goes back
        once they are done (wait_pending)."""
        self.pending = torch.cuda.Event()  # type: ignore[no-untyped-call]
        self.pending.record(torch.cuda.current_stream(self.device))

    def tensors(self, samples: Union[list[Any], CudaArray]) -> list[torch.Tensor]:
        """The samples as tensors: copies, or views (zero_copy), of one span
        of batch memory (a dense GPU batch: its rows)."""
        if isinstance(samples, CudaArray):
            rows = torch.as_tensor(samples, device=self.device)
            if not self.zero_copy:
                rows = rows.clone()
                self.mark_copies()
            else:
                rows = read_only(rows)
            return list(rows.unbind(0))
        if not samples:
            return []
        if self.device.type == "cuda":
            return self.cuda_tensors(samples)
        addrs = [int(s.__array_interface__["data"][0]) for s in samples]
        sizes = [int(s.nbytes) for s in samples]
        lo, n = _span(addrs, sizes)
        view = np.asarray(_Writable(lo, n, samples[0]))  # samples[0] keeps the mapping alive
        span = read_only(torch.from_numpy(view)) if self.zero_copy else torch.from_numpy(view.copy())
        return [span[a - lo:a - lo + k] for a, k in zip(addrs, sizes)]

    def cuda_tensors(self, samples: list[CudaArray]) -> list[torch.Tensor]:
        """A file dataset's GPU samples as tensors of one span."""
        lo, n = _span([s.ptr for s in samples], [s.nbytes for s in samples])
        span = torch.as_tensor(CudaArray(lo, n, self.device.index or 0, samples[0]), device=self.device)
        if not self.zero_copy:
            span = span.clone()
            self.mark_copies()
        else:
            span = read_only(span)
        return [span[s.ptr - lo:s.ptr - lo + s.nbytes] for s in samples]

    def wait_pending(self) -> None:
        """Before a request: waits until the batch it gives back may go. With
        copies, the batch handed out last, once its copies are done. Zero-copy
        (release_after=1), the batch before it, once the work the loop had
        queued on the current stream by the previous request is done (that
        batch's step); the last batch's step may still run."""
        if self.device.type != "cuda":
            return
        if not self.zero_copy:
            if self.pending is not None:
                self.pending.synchronize()
                self.pending = None
            return
        now = torch.cuda.Event()  # type: ignore[no-untyped-call]
        now.record(torch.cuda.current_stream(self.device))
        if self.pending is not None:
            self.pending.synchronize()
        self.pending = now
