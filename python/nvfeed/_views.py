# SPDX-License-Identifier: Apache-2.0
"""Batch views: pure functions of a batch descriptor (offsets, lengths,
a numpy dataset's dtype and shapes) and the session's mapping (``Mapped``:
host memory or GPU memory), giving numpy views, dense arrays,
``CudaArray`` objects or DALI tensor lists of the batch memory, never a
copy. Nothing here talks to the daemon."""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass
from typing import Any, Optional, Union, cast

import numpy as np

from ._cudamem import CudaArray, DeviceMapping
from ._errors import LoaderError
from ._wire import NextResponse

Sample = Union["np.ndarray[Any, np.dtype[np.uint8]]", CudaArray]
"""One sample's bytes: a 1-D uint8 numpy view of host batch memory, or a
CudaArray (``__cuda_array_interface__``) of GPU batch memory."""

Batch = tuple[Union[list[Sample], CudaArray], "np.ndarray[Any, np.dtype[np.int32]]"]
"""A batch: the samples and their labels (int32, shape (batch, 1), host).
GPU samples all of one size come as one ``CudaArray`` of shape (batch,
size), the rows back to back; else (and host samples) a list, one array
a sample."""

Array = np.ndarray[Any, np.dtype[Any]]
"""A numpy array of any dtype."""

Tensors = Union[Array, list[Array], CudaArray, list[CudaArray]]
"""A numpy dataset's batch (the arrays alone, no labels): host memory, one
numpy array ``(batch, *shape)`` viewing the batch memory when every sample
has one shape (a dense batch), else a list of views, each sample's own
dtype and shape; GPU memory, the same as ``CudaArray`` objects. With
``batch_format="dali"`` host batches are one ``TensorListCPU`` of the
same views (typed ``Any``)."""

DaliBatch = tuple[Any, Any]
"""A batch with ``batch_format="dali"``: the samples, then the labels (a
``nvidia.dali.tensors.TensorListCPU``, int32, shape (1,) a sample). Host
samples: a ``TensorListCPU`` of views of batch memory. GPU samples: one
``CudaArray`` of shape (batch, size) when they all have one size and lie
back to back (the daemon packs such batches), else a list of
``CudaArray``."""


@dataclass(frozen=True)
class Mapped:
    """A session's batch memory as this process maps it: ``host`` (its
    mapping) and ``buf`` (a uint8 array over it) for host memory, ``gpu``
    for GPU memory; ``dali`` the DALI types when batches are DALI's."""

    host: Optional[mmap.mmap]
    buf: "np.ndarray[Any, np.dtype[np.uint8]]"
    gpu: Optional[DeviceMapping]
    dali: Optional[DaliTypes]

    def mm(self) -> mmap.mmap:
        """The host mapping; ``LoaderError`` when the memory is the GPU's."""
        if self.host is None:
            raise LoaderError("LoaderSource: no host batch memory is mapped")
        return self.host


class DaliTypes:
    """DALI's tensor list types, imported when batch_format="dali" asks for
    them (the client does not need DALI otherwise)."""

    def __init__(self) -> None:
        try:
            from nvidia.dali.backend import TensorCPU, TensorListCPU  # type: ignore[import-not-found,import-untyped,unused-ignore]
        except ImportError as e:
            raise ImportError(f"LoaderSource: batch_format='dali' needs DALI (nvidia.dali) in this process: {e}") from e
        self._tensor, self._list = TensorCPU, TensorListCPU

    def batch(self, samples: list[Sample], labels: "np.ndarray[Any, np.dtype[np.int32]]") -> DaliBatch:
        """One TensorListCPU whose samples view the arrays (each keeps its
        array, and so the batch memory, alive), and one of the labels."""
        t = self._tensor
        return self._list([t(s) for s in samples], contiguous=False), self.labels(labels)  # type: ignore[call-overload]

    def samples(self, samples: list[Sample]) -> Any:
        """One TensorListCPU whose samples view the arrays (a WebDataset
        batch's component: zero-length arrays for empty ones)."""
        t = self._tensor
        return self._list([t(s) for s in samples], contiguous=False)  # type: ignore[call-overload]

    def labels(self, labels: "np.ndarray[Any, np.dtype[np.int32]]") -> Any:
        """The labels as one TensorListCPU."""
        return self._list(labels)

    def tensors(self, arrays: Union[Array, list[Array]]) -> Any:
        """A numpy dataset's host batch as one TensorListCPU: a dense array
        wrapped whole (its first axis the batch), or each array of a list
        as a sample; the memory viewed, not copied."""
        if isinstance(arrays, list):
            t = self._tensor
            return self._list([t(a) for a in arrays], contiguous=False)  # type: ignore[call-overload]
        return self._list(arrays)


def prefix(r: NextResponse, keep: int, per: int = 1) -> NextResponse:
    """The descriptor r of its first ``keep`` samples only (the others are
    padding the loop is not to see); their failures with them. ``per``:
    the (offset, length) entries a sample (a WebDataset's K)."""
    out = cast(dict[str, Any], dict(r))
    for key in ("offsets", "lengths", "labels", "indices", "shapes"):
        v = out.get(key)
        if v is not None:
            out[key] = v[:keep * per] if key in ("offsets", "lengths") else v[:keep]
    failed, errors = r.get("failed") or [], r.get("errors") or []
    out["failed"] = [i for i in failed if i < keep]
    if len(errors) == len(failed):
        out["errors"] = [e for i, e in zip(failed, errors) if i < keep]
    return cast(NextResponse, out)


def tensor_dtype(descr: str) -> "np.dtype[Any]":
    """The numpy dtype of a batch's .npy descr ("<f4"); LoaderError for one
    the client does not know."""
    try:
        dt = np.dtype(descr)
    except TypeError:
        dt = None
    if dt is None or dt.kind not in "biufc" or dt.str != descr or descr[:1] not in "<|":
        raise LoaderError(f"loaderd: a batch of a numpy dataset has dtype {descr!r}, which this client does not know")
    return dt


def nbytes(dt: "np.dtype[Any]", shape: Any) -> int:
    """The bytes of a C-order array of dtype dt and shape."""
    return int(dt.itemsize * math.prod(shape))


def dense(offsets: list[int], lengths: list[int]) -> int:
    """The samples' common size when they all have it (> 0) and lie back
    to back from offsets[0]; else 0."""
    if not lengths:
        return 0
    n, o0 = lengths[0], offsets[0]
    if n <= 0:
        return 0
    for i, (o, m) in enumerate(zip(offsets, lengths)):
        if m != n or o != o0 + i * n:
            return 0
    return n


def samples(m: Mapped, offsets: list[int], lengths: list[int]) -> list[Sample]:
    """Views of the samples at offsets: numpy arrays of host memory, or
    CudaArrays of GPU memory."""
    g = m.gpu
    if g is None:
        buf = m.buf
        return [buf[o:o + n] for o, n in zip(offsets, lengths)]
    return [CudaArray(g.ptr + o, n, g.device, g) for o, n in zip(offsets, lengths)]


def batch(m: Mapped, offsets: list[int], lengths: list[int],
          labels: "np.ndarray[Any, np.dtype[np.int32]]") -> Union[Batch, DaliBatch]:
    """The batch's samples at offsets, and its labels, in the mapping's
    batch format."""
    g, dali = m.gpu, m.dali
    if g is None:
        if dali is None:
            return samples(m, offsets, lengths), labels
        return dali.batch(samples(m, offsets, lengths), labels)
    n = dense(offsets, lengths)
    # GPU samples of one size lie back to back: one (batch, size) array
    # (DALI wraps it as the batch, no copy; torch.as_tensor and
    # cupy.asarray view it whole), the labels numpy without DALI.
    data: Union[list[Sample], CudaArray] = (CudaArray(g.ptr + offsets[0], (len(offsets), n), g.device, g) if n
                                            else samples(m, offsets, lengths))
    return (data, labels) if dali is None else (data, dali.labels(labels))


def tensors(m: Mapped, where: str, dt: "np.dtype[Any]", offsets: list[int], lengths: list[int],
            shapes: list[list[int]], whole: bool) -> Union[Tensors, Any]:
    """A numpy dataset's batch: the arrays alone, viewing batch memory.
    With ``whole`` (no sample skipped) and every sample one shape, back
    to back: one array (batch, *shape); else a list of each sample's
    array. ``where`` names the batch in errors (a length that is not its
    shape's)."""
    descr = dt.str
    if whole:
        row, shape, n = dense(offsets, lengths), tuple(shapes[0]), len(offsets)
        if row and shapes.count(shapes[0]) == n and row == nbytes(dt, shape):
            g = m.gpu
            if g is not None:
                return CudaArray(g.ptr + offsets[0], (n, *shape), g.device, g, descr)
            arr: Array = np.ndarray((n, *shape), dtype=dt, buffer=m.mm(), offset=offsets[0])
            return m.dali.tensors(arr) if m.dali is not None else arr
    for ln, s in zip(lengths, shapes):
        if ln != nbytes(dt, s):
            raise LoaderError(f"loaderd: {where}: a sample of {ln} bytes, but its shape {tuple(s)} of {descr} holds "
                              f"{nbytes(dt, s)}")
    g = m.gpu
    if g is not None:
        return [CudaArray(g.ptr + o, tuple(s), g.device, g, descr) for o, s in zip(offsets, shapes)]
    mm = m.mm()
    arrays: list[Array] = [np.ndarray(tuple(s), dtype=dt, buffer=mm, offset=o) for o, s in zip(offsets, shapes)]
    return m.dali.tensors(arrays) if m.dali is not None else arrays
