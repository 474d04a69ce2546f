# SPDX-License-Identifier: Apache-2.0
"""Batch views: pure functions of a batch descriptor (offsets, lengths,
a numpy dataset's dtype and shapes) and the session's mapping (``Mapped``:
host memory or GPU memory), giving numpy views, dense arrays,
``CudaArray`` objects or DALI tensor lists of the batch memory, never a
copy. Nothing here talks to the daemon."""

from __future__ import annotations

import dis
import math
import mmap
import sys
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
same views (typed ``Any``). A host batch (``ArrayBatch``, ``ArrayList``)
refuses to be unpacked into names, as an image dataset's ``(samples,
labels)`` is: ``TypeError``."""

_UNPACK = frozenset(dis.opmap[name] for name in ("UNPACK_SEQUENCE", "UNPACK_EX") if name in dis.opmap)


def _unpacked_into(depth: int) -> int:
    """How many names the frame ``depth`` frames above the caller unpacks
    the object being iterated into (``a, b = x``, ``for a, b in ...``,
    ``a, *b = x``: an UNPACK_SEQUENCE or UNPACK_EX instruction is
    running); 0 when it iterates otherwise (a for loop, ``list(x)``,
    DALI's ``fn.external_source`` reading a batch)."""
    try:
        f = sys._getframe(depth + 1)
    except ValueError:
        return 0
    code, i = f.f_code.co_code, f.f_lasti
    if not 0 <= i < len(code) or code[i] not in _UNPACK:
        return 0
    # The error's path only: the instruction's whole argument (an
    # EXTENDED_ARG may carry its high bits).
    arg = next((ins.arg or 0 for ins in dis.get_instructions(f.f_code) if ins.offset == i), 0)
    return arg if code[i] == dis.opmap["UNPACK_SEQUENCE"] else (arg & 0xff) + (arg >> 8) + 1


def _unpack_error(what: str, names: int) -> TypeError:
    """The error of a numpy dataset's batch (``what`` says what it is)
    unpacked into names."""
    return TypeError(f"LoaderSource: {what}: the arrays alone, without labels (a numpy dataset yields one batch per "
                     f"step, as fn.readers.numpy's one output); unpacking it into {names} names would split it into "
                     "its samples. Write `for batch in src:` (batch[i] is sample i), feed it to one "
                     "fn.external_source(source=src, batch=True), or read (samples, labels) from a file dataset "
                     "(mkbmap without --reader numpy)")


class ArrayBatch(np.ndarray):  # type: ignore[type-arg]
    """A numpy dataset's dense host batch: one array ``(batch, *shape)``
    viewing batch memory, an ``np.ndarray`` in every way (DALI takes it
    through the buffer protocol; views and results of it are plain in
    behaviour) except that unpacking the batch itself into names (``x, y
    = batch``, ``for x, y in src``) raises ``TypeError`` saying what it
    holds: a two-sample batch would otherwise split silently into
    "samples" and "labels". Iterating it (``for a in batch``) gives its
    samples."""

    _nvfeed_what: str  # set on the batch handed out only

    def __iter__(self) -> Any:
        what = self.__dict__.get("_nvfeed_what")
        if what is not None:
            names = _unpacked_into(1)
            if names:
                raise _unpack_error(what, names)
        return super().__iter__()


class ArrayList(list):  # type: ignore[type-arg]
    """A numpy dataset's ragged host batch: a list of the samples' arrays
    (each viewing batch memory), a ``list`` in every way (DALI's
    ``fn.external_source`` takes its length and iterates it) except that
    unpacking it into names (``x, y = batch``, ``for x, y in src``)
    raises ``TypeError`` saying what it holds, as ``ArrayBatch`` does."""

    def __init__(self, arrays: list[Array], what: str) -> None:
        super().__init__(arrays)
        self._nvfeed_what = what

    def __iter__(self) -> Any:
        names = _unpacked_into(1)
        if names:
            raise _unpack_error(self._nvfeed_what, names)
        return super().__iter__()

Buffer = Union[mmap.mmap, "np.ndarray[Any, np.dtype[np.uint8]]"]
"""Host batch memory: the session's mapping, or a batch's copy."""

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
    for GPU memory; ``dali`` the DALI types when batches are DALI's. A
    batch copied out of it (``_lifetime.own``) has a ``Mapped`` of its
    own: ``host`` and ``buf`` the copy."""

    host: Optional[Buffer]
    buf: "np.ndarray[Any, np.dtype[np.uint8]]"
    gpu: Optional[DeviceMapping]
    dali: Optional[DaliTypes]

    def mm(self) -> Buffer:
        """The host memory; ``LoaderError`` when the memory is the GPU's."""
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

    def views(self, buf: "np.ndarray[Any, np.dtype[np.uint8]]", offsets: list[int], lengths: list[int]) -> Any:
        """One TensorListCPU whose samples view host memory ``buf`` at
        offsets (zero-length for empty ones); each keeps the memory
        alive. DALI 2.4 makes a ragged list only of one tensor a sample.
        Tensors of memoryview slices cost less than of numpy views."""
        t, mv = self._tensor, buf.data
        return self._list([t(mv[o:o + n]) for o, n in zip(offsets, lengths)], contiguous=False)  # type: ignore[call-overload]

    def samples(self, samples: list[Sample]) -> Any:
        """One TensorListCPU whose samples view the arrays."""
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
        return dali.views(m.buf, offsets, lengths), dali.labels(labels)
    n = dense(offsets, lengths)
    # GPU samples of one size lie back to back: one (batch, size) array
    # (DALI wraps it as the batch, no copy; torch.as_tensor and
    # cupy.asarray view it whole), the labels numpy without DALI.
    data: Union[list[Sample], CudaArray] = (CudaArray(g.ptr + offsets[0], (len(offsets), n), g.device, g) if n
                                            else samples(m, offsets, lengths))
    return (data, labels) if dali is None else (data, dali.labels(labels))


def tensors(m: Mapped, where: str, dt: "np.dtype[Any]", offsets: list[int], lengths: list[int],
            shapes: list[list[int]], whole: bool, dataset: str = "") -> Union[Tensors, Any]:
    """A numpy dataset's batch: the arrays alone, viewing batch memory.
    With ``whole`` (no sample skipped) and every sample one shape, back
    to back: one array (batch, *shape) (an ``ArrayBatch``); else a list of
    each sample's array (an ``ArrayList``). ``where`` names the batch in
    errors (a length that is not its shape's), ``dataset`` in the error of
    a batch unpacked into names."""
    descr = dt.str
    if whole and offsets:  # an empty batch (all padding trimmed: keep 0) is an empty list
        row, shape, n = dense(offsets, lengths), tuple(shapes[0]), len(offsets)
        if row and shapes.count(shapes[0]) == n and row == nbytes(dt, shape):
            g = m.gpu
            if g is not None:
                return CudaArray(g.ptr + offsets[0], (n, *shape), g.device, g, descr)
            if m.dali is not None:
                return m.dali.tensors(np.ndarray((n, *shape), dtype=dt, buffer=m.mm(), offset=offsets[0]))
            batch = ArrayBatch((n, *shape), dtype=dt, buffer=m.mm(), offset=offsets[0])  # its base the mapping
            batch._nvfeed_what = f"a batch of numpy dataset {dataset!r} is one array of shape {batch.shape} {dt.name}"
            return batch
    for ln, s in zip(lengths, shapes):
        if ln != nbytes(dt, s):
            raise LoaderError(f"loaderd: {where}: a sample of {ln} bytes, but its shape {tuple(s)} of {descr} holds "
                              f"{nbytes(dt, s)}")
    g = m.gpu
    if g is not None:
        return [CudaArray(g.ptr + o, tuple(s), g.device, g, descr) for o, s in zip(offsets, shapes)]
    mm = m.mm()
    arrays: list[Array] = [np.ndarray(tuple(s), dtype=dt, buffer=mm, offset=o) for o, s in zip(offsets, shapes)]
    if m.dali is not None:
        return m.dali.tensors(arrays)
    return ArrayList(arrays, f"a batch of numpy dataset {dataset!r} is a list of {len(arrays)} arrays (one a sample, "
                             f"shapes differ)")
