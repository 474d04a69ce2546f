# SPDX-License-Identifier: Apache-2.0
"""``LoaderSource``: one shard of a dataset as batches for DALI's
``fn.external_source``, read by loaderd into batch memory this process
maps; the session over HTTP or a stream, reconnection when the daemon
goes away, and the batch types it returns."""

from __future__ import annotations

import collections
import math
import mmap
import os
import time
import warnings
from typing import Any, Literal, Optional, Union, cast

import numpy as np

from . import _args, _depth, _ranks
from ._connect import check_timeout, socket_path
from ._cuda import CONTEXT, CudaArray, CudaError, DeviceMapping, ReleaseFence, device_uuid, find_device, load_libcuda, stream_handle
from ._errors import DaemonGoneError, LoaderError, NotFoundError, SampleError, error_for
from ._http import UnixHTTPConnection, call
from ._memory import map_host, receive
from ._pair import BatchHalves, Position, batch_position
from ._stream import Stream, StreamError
from ._upgrade import UpgradeError
from ._wire import MemoryDesc, NextRequest, NextResponse, OpenRequest, OpenResponse, State

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

OnError = Literal["raise", "skip"]
Transport = Literal["stream", "http"]
BatchFormat = Literal["numpy", "dali"]
Device = Literal["cpu", "gpu"]
GPUPath = Literal["auto", "cufile", "bounce"]
Shuffle = Literal["permute", "dali"]

MAX_INITIAL_FILL = _args.MAX_INITIAL_FILL
"""The largest ``initial_fill`` (the daemon's bound too)."""


class _DaliTypes:
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


def _tensor_dtype(descr: str) -> "np.dtype[Any]":
    """The numpy dtype of a batch's .npy descr ("<f4"); LoaderError for one
    the client does not know."""
    try:
        dt = np.dtype(descr)
    except TypeError:
        dt = None
    if dt is None or dt.kind not in "biufc" or dt.str != descr or descr[:1] not in "<|":
        raise LoaderError(f"loaderd: a batch of a numpy dataset has dtype {descr!r}, which this client does not know")
    return dt


def _nbytes(dt: "np.dtype[Any]", shape: Any) -> int:
    """The bytes of a C-order array of dtype dt and shape."""
    return int(dt.itemsize * math.prod(shape))


def _dense(offsets: list[int], lengths: list[int]) -> int:
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


class LoaderSource:
    """Batches of one shard of a dataset registered with loaderd, for
    ``fn.external_source(source=src, num_outputs=2, batch=True)``; or, for
    GPU samples with host labels, for two external sources
    (``source=src.samples, device="gpu"`` and ``source=src.labels,
    device="cpu"``; see ``samples``).

    Over a numpy dataset (``mkbmap --reader numpy``; ``reader`` is then
    ``"numpy"``) each batch is the arrays **alone**, without labels, as
    ``fn.readers.numpy``'s one output, for
    ``fn.external_source(source=src, batch=True)``: in host memory, when
    every array of the batch has one shape (the daemon then places them
    back to back), one numpy array ``(batch, *shape)`` of the dataset's
    dtype that views the batch memory (``arr.base`` is the mapping: no
    copy); otherwise a list of views, each its file's dtype and shape (0-d
    and empty arrays included). In GPU memory the same as ``CudaArray``
    objects (``typestr`` the dtype's ``.npy`` descr, C-contiguous). With
    ``on_error="skip"`` a batch that lost samples is a list of the others.

    Parameters
    ----------
    dataset : str
        The dataset's name, as registered with ``loaderd serve --dataset``.
    socket : str, optional
        The daemon's unix socket; by default ``$NVFEED_SOCKET`` when set,
        else ``/run/loaderd/loaderd.sock`` (``DEFAULT_SOCKET``, where
        deploy/ puts it).
    batch_size : int, optional, default = 64
        Samples per batch (DALI ``fn.readers.file``'s ``batch_size``), in
        ``[1, 65536]``.
    shard_id : int, optional, default = 0
        This rank's shard, in ``[0, num_shards)``.
    num_shards : int, optional, default = 1
        The number of shards (ranks) the dataset is split into, in
        ``[1, 2**31 - 1]`` (0 is an error: it does not mean 1).
    random_shuffle : bool, optional, default = False
        Shuffle every epoch, as ``shuffle`` says. Without it every
        ``shuffle`` reads the shard in order, as ``fn.readers.file`` does.
    seed : int, optional, default = 0
        The shuffle's seed, in ``[0, 2**64)``. With ``shuffle="dali"``
        only its low 32 bits count, as in DALI; pass the same ``seed`` to
        ``fn.readers.file`` (a reader given no seed takes one derived from
        the pipeline's, which this source cannot know).
    pad_last_batch : bool, optional, default = False
        Pad every shard to the same length and whole batches by repeating
        its last sample, as DALI does.
    stick_to_shard : bool, optional, default = False
        Read the same shard every epoch (else shard ``(shard_id + epoch) %
        num_shards``): the samples ``fn.readers.file``'s shard holds, so
        a node that caches its shard keeps it, shuffled or not.
    shuffle : {"permute", "dali"}, optional, default = "permute"
        How ``random_shuffle`` shuffles. ``"permute"``: a full permutation
        of the dataset every epoch, drawn from ``(seed, epoch)``, the same
        on every rank (shards stay disjoint): mixing is global and the
        epochs are independent of each other. With ``stick_to_shard`` the
        rank's samples are DALI's shard's, permuted anew each epoch.
        ``"dali"``: ``fn.readers.file(random_shuffle=True)``'s order,
        sample for sample, epoch after epoch (same ``seed``,
        ``initial_fill``, ``shard_id``, ``num_shards``, ``pad_last_batch``,
        ``stick_to_shard`` and ``batch_size``): swapping the reader for this
        source changes no sample of a training run. DALI's shuffle is
        local: it permutes the file list once with a fixed seed (the same
        for every ``seed`` and epoch), then draws each sample from a buffer
        of ``initial_fill`` samples, so in every epoch a sample comes out at
        most ``initial_fill - 1`` places before its position in that one
        fixed order and rarely more than a few ``initial_fill`` after it. Without ``pad_last_batch`` DALI's batches run across the
        epoch boundary; here the epoch ends with a partial batch holding
        the same samples. Resuming (``state``, or ``batch(info)`` far from
        the current position) at epoch *e* replays the epochs before it in
        the daemon (about 15 ns a sample, at most 2**30 samples).
    initial_fill : int, optional, default = 1024
        The ``"dali"`` shuffle's buffer, in samples, in ``[1, 2**24]``:
        ``fn.readers.file``'s ``initial_fill``. Only ``shuffle="dali"``
        with ``random_shuffle`` uses it.
    backend : str, optional
        How the daemon reads: ``"file"``, ``"gds"``, ``"bam"`` (see
        ``backends()``); ``None`` takes the daemon's default.
    backend_options : dict, optional
        The backend's options by name (see ``backends()``).
    prefetch_queue_depth : int, optional
        Batches the daemon reads ahead, in ``[1, 64]``; ``None`` takes its
        default (2). Not DALI's ``prefetch_queue_depth``: ``release_after``
        follows that one.
    release_after : int, optional
        A batch's memory goes back to the daemon after this many later
        batches, in ``[0, 64]``. ``None``: derived from the DALI pipeline
        the source feeds (its ``prefetch_queue_depth`` + 1; with separated
        queues ``cpu_size`` + 1 when equal to ``gpu_size``, else
        ``cpu_size * gpu_size + 1``: how long DALI may still read a batch
        fed with ``no_copy=True``), found when DALI builds the pipeline
        (``iter(src)``) or first calls ``src.batch``; outside DALI the
        daemon's ``prefetch_queue_depth + 1``. A ``release_after`` given
        that is smaller than the pipeline needs raises ``ValueError``
        naming both.
    state : State, optional
        Resume where ``state()`` was taken.
    timeout : float, optional, default = 600.0
        Seconds to wait for the daemon per request (> 0).
    on_error : {"raise", "skip"}, optional, default = "raise"
        What a batch with samples that could not be read (deleted, EIO,
        changed) does: ``"raise"`` raises ``SampleError`` naming every
        failed sample, the batch given back and the source still usable;
        ``"skip"`` returns the batch without them (a smaller batch) and
        warns, counting them in ``skipped_samples`` (a batch none of whose
        samples could be read raises even then). A zero-length stand-in is
        never returned.
    transport : {"stream", "http"}, optional, default = "stream"
        ``"stream"`` receives batch descriptors on a stream the daemon
        pushes as batches are read, releases going back without a reply:
        no round trip per batch. ``"http"`` asks for each batch with a
        request.
    device : {"cpu", "gpu"}, optional, default = "cpu"
        Where batches land. ``"cpu"``: page-locked host memory,
        CUDA-registered where a driver is present; samples are numpy views.
        ``"gpu"``: GPU memory on ``device_id`` (the daemon writes each
        batch to the device and waits for it before handing the batch
        out); samples are ``CudaArray`` objects with
        ``__cuda_array_interface__``, taken without a copy by
        ``fn.external_source(device="gpu")``, ``torch.as_tensor(x,
        device="cuda")`` and ``cupy.asarray(x)``; labels stay on the host.
        This process needs the CUDA driver (``libcuda.so.1`` from
        ``$NVFEED_CUDA_LIB_DIR`` when set and holding it, else from the
        dynamic loader's path): without one, ``CudaError`` (a
        ``LoaderError``) says what was tried and what to do, before the
        daemon is asked. Samples of one size come as one ``CudaArray``
        of shape (batch, size), with or without DALI. A batch's GPU memory goes back to the daemon only
        after the consumer's GPU work queued on it has finished (see
        ``cuda_stream``).
    device_id : int, optional, default = 0
        The GPU for ``device="gpu"``, as this process numbers its GPUs
        (``CUDA_VISIBLE_DEVICES`` applied). The daemon is told the GPU's
        UUID, so a daemon that numbers GPUs differently uses the same one.
    gpu_path : {"auto", "cufile", "bounce"}, optional, default = "auto"
        How batches reach GPU memory (``device="gpu"`` only). ``"cufile"``:
        the daemon reads each sample's file with ``cuFileRead`` straight
        into the device (GPUDirect Storage where the platform has it, else
        cuFile's compatibility mode); ``"bounce"``: ``backend`` reads into
        page-locked staging memory, copied to the device once per batch;
        ``"auto"``: cufile when cuFile runs on the daemon's machine and no
        host backend is named, else bounce. ``gpu_path`` says which ran.
    reconnect_timeout : float, optional, default = 60.0
        Seconds to keep trying when the daemon goes away (an upgrade, a
        crash, ``systemctl restart``): the source reconnects on the same
        socket, reopens its session at its own position and goes on
        yielding exactly the batches an uninterrupted source would have,
        for ``__iter__`` and ``batch(info)`` alike. Batches already handed
        out stay valid and unchanged (their memory outlives the daemon). A
        stream that breaks while the daemon lives on is handled the same
        way, and the old session is closed.
        After the timeout, ``DaemonGoneError`` says since when the daemon
        is gone. 0 turns reconnection off (>= 0).
    job_id : str, optional
        A name the ranks of one training job share (at most 128 bytes,
        e.g. the scheduler's job id and the dataset's role): the daemon
        compares the sessions of one job (of this user) on its node and
        refuses one that reads another dataset (fingerprint), other
        sampling (``batch_size``, ``num_shards``, ``random_shuffle``,
        ``pad_last_batch``, ``stick_to_shard``; shuffled, ``shuffle``
        and ``seed``; ``shuffle="dali"``, ``initial_fill``) or a
        ``shard_id`` another rank reads, with ``RankMismatchError`` naming
        each difference. One ``job_id`` per dataset a job reads (training
        and validation sources are two jobs). Ranks on other nodes are
        compared through ``torch.distributed`` (below).
    fingerprint : str, optional
        The dataset's fingerprint this source must read (32 hex digits:
        ``src.fingerprint`` or ``datasets()``, the same on every node
        holding the same files); another raises ``ConflictError``.
        Reopening after a daemon restart always asks for the first one.
    process_group : torch.distributed.ProcessGroup, optional
        When ``torch.distributed`` is initialised in this process and the
        source is sharded (``num_shards`` > 1), the sources of the ranks of
        this group (``None``: the default group) are compared at
        construction: one ``all_gather_object``, which every rank of the
        group must reach (build the source on every rank, in the same
        order). Ranks that read another dataset or with other sampling, two
        ranks with one ``shard_id``, or a group of another size than
        ``num_shards`` raise ``RankMismatchError`` on every rank, naming
        each difference and each rank's value; a rank whose open failed
        raises its own error, the others one naming it. Pass the group of
        data-parallel ranks when model-parallel ranks share a shard. With
        NCCL the exchange uses ``torch.cuda.current_device()``: set each
        rank's device first, as DDP needs anyway. Never done in a
        DataLoader worker; torch is never imported for it.
    check_ranks : bool, optional, default = True
        False skips the ``torch.distributed`` comparison (a sharded source
        built on some ranks only would wait for the others forever).
    batch_format : {"numpy", "dali"}, optional, default = "numpy"
        What ``next()`` returns. ``"numpy"``: a list of numpy views (or
        of ``CudaArray``) and an int32 array of shape (batch, 1); a numpy
        dataset's arrays (above).
        ``"dali"``: one DALI ``TensorListCPU`` of the samples
        (non-contiguous, each sample a view of batch memory: no copy) and
        one of the labels, which
        ``fn.external_source`` takes as they are instead of converting each
        sample (DALI's per-sample conversion of a list costs ~4 µs a
        sample). With ``device="gpu"``: the samples are one ``CudaArray``
        of shape (batch, size) when every sample has the same size (the
        daemon then packs them back to back: DALI wraps that one array,
        no copy), else a list of ``CudaArray`` (which DALI copies into a
        contiguous batch of its own), and the labels a ``TensorListCPU``.
        A numpy dataset's host batch: one ``TensorListCPU`` of its arrays,
        viewing the batch memory (a dense batch wrapped whole); its GPU
        batch: as with ``"numpy"``, a ``CudaArray`` or a list of them.
        Needs DALI in this process.
    cuda_stream : int, stream object or "context", optional
        The stream the consumer's GPU work on the batches runs on
        (``device="gpu"`` only): an int ``CUstream`` handle, or an object
        with ``cuda_stream`` (``torch.cuda.Stream``), ``__cuda_stream__``,
        ``handle`` or ``ptr`` (``cupy.cuda.Stream``). A batch's GPU memory
        past ``release_after`` goes back to the daemon (which then writes
        it again) only once the consumer's work queued so far has
        finished: an event is recorded on the consumer's stream (events
        ``BLOCKING_SYNC``, reused) and the slot is held back until it
        completes, polled without waiting (``cuEventQuery``) at each
        batch; the host waits for the oldest event only when more than
        ``prefetch_queue_depth`` slots are held back (the daemon keeps room
        to read ahead). The consumer's stream, by default (``None``):
        PyTorch's current stream on the device, at each release, when
        PyTorch has initialised CUDA in this process; else the legacy
        default stream, whose event follows every blocking stream of the
        context (PyTorch's and CuPy's default streams). Under DALI,
        ``release_after`` (from the pipeline's queue depths) is what keeps
        a batch until DALI has consumed it, as DALI documents for
        ``no_copy``. No whole-context synchronisation per batch (which
        would also break a CUDA graph captured on another stream);
        ``"context"`` asks for it (``cuCtxSynchronize`` at each release:
        a consumer on non-blocking streams it cannot name).

    Raises
    ------
    ValueError
        An argument out of its range (``num_shards`` < 1, ``shard_id`` not
        below it, ``prefetch_queue_depth`` < 1, ``timeout`` <= 0,
        ``reconnect_timeout`` < 0, ...), named with its range, before the
        daemon is asked.
    RankMismatchError
        The ranks of this source's job disagree (``job_id``,
        ``torch.distributed``): the message names each difference.
    TypeError
        ``cuda_stream`` is not a stream, a stream handle or ``"context"``.
    CudaError
        ``device="gpu"`` and this process has no CUDA driver or cannot see
        ``device_id``, or the daemon's GPU (by UUID); the message names the
        call or what was tried, and what to do. A ``LoaderError``.
    SocketPermissionError
        This process may not connect to the socket: the message names the
        socket's group and how to join it (also a ``PermissionError``).
    DaemonNotRunningError
        Nothing listens on the socket ("is loaderd running at PATH?"; a
        ``DaemonGoneError``).
    LoaderError
        Or one of its subclasses, by the daemon's answer: ``NotFoundError``
        (unknown dataset), ``ForbiddenError`` (this user may not read it),
        ``BadRequestError``, ``LimitError``, ``NoSpaceError``,
        ``DaemonGoneError``.
    """

    def __init__(self, dataset: str, socket: Optional[str] = None, batch_size: int = 64,
                 shard_id: int = 0, num_shards: int = 1, random_shuffle: bool = False, seed: int = 0,
                 pad_last_batch: bool = False, stick_to_shard: bool = False, shuffle: Shuffle = "permute",
                 initial_fill: int = 1024, backend: Optional[str] = None,
                 backend_options: Optional[dict[str, Any]] = None,
                 prefetch_queue_depth: Optional[int] = None, release_after: Optional[int] = None,
                 state: Optional[State] = None, timeout: float = 600.0, on_error: OnError = "raise",
                 transport: Transport = "stream", device: Device = "cpu", device_id: int = 0,
                 gpu_path: GPUPath = "auto", reconnect_timeout: float = 60.0,
                 batch_format: BatchFormat = "numpy", cuda_stream: object = None, job_id: Optional[str] = None,
                 fingerprint: Optional[str] = None, process_group: Any = None, check_ranks: bool = True) -> None:
        # A sharded source under torch.distributed is compared with the
        # other ranks' (one collective each): a rank whose arguments or
        # open fail tells them so, rather than leave them waiting.
        peers = _ranks.peers(num_shards, process_group, _args.bool_arg("check_ranks", check_ranks))
        try:
            self._init(dataset, socket, batch_size, shard_id, num_shards, random_shuffle, seed, pad_last_batch,
                       stick_to_shard, shuffle, initial_fill, backend, backend_options, prefetch_queue_depth,
                       release_after, state, timeout, on_error, transport, device, device_id, gpu_path,
                       reconnect_timeout, batch_format, cuda_stream, job_id, fingerprint)
        except Exception as e:
            if peers is not None:
                peers.fail(e)
            raise
        if peers is not None:
            try:
                peers.compare(dataset, self.fingerprint, self._req["shard_id"], cast(dict[str, Any], self._req))
            except LoaderError:
                self.close()
                raise

    def _init(self, dataset: str, socket: Optional[str], batch_size: int, shard_id: int, num_shards: int,
              random_shuffle: bool, seed: int, pad_last_batch: bool, stick_to_shard: bool, shuffle: Shuffle,
              initial_fill: int, backend: Optional[str], backend_options: Optional[dict[str, Any]],
              prefetch_queue_depth: Optional[int], release_after: Optional[int], state: Optional[State],
              timeout: float, on_error: OnError, transport: Transport, device: Device, device_id: int,
              gpu_path: GPUPath, reconnect_timeout: float, batch_format: BatchFormat, cuda_stream: object,
              job_id: Optional[str], fingerprint: Optional[str]) -> None:
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if transport not in ("stream", "http"):
            raise ValueError(f"transport must be 'stream' or 'http', got {transport!r}")
        if device not in ("cpu", "gpu"):
            raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
        if gpu_path not in ("auto", "cufile", "bounce"):
            raise ValueError(f"gpu_path must be 'auto', 'cufile' or 'bounce', got {gpu_path!r}")
        if batch_format not in ("numpy", "dali"):
            raise ValueError(f"batch_format must be 'numpy' or 'dali', got {batch_format!r}")
        if shuffle not in ("permute", "dali"):
            raise ValueError(f"shuffle must be 'permute' or 'dali', got {shuffle!r}")
        if not isinstance(dataset, str) or not dataset:
            raise ValueError(f"dataset must be a registered dataset's name, got {dataset!r}")
        args = _args.reader_args(batch_size, shard_id, num_shards, random_shuffle, seed, pad_last_batch, stick_to_shard,
                                 initial_fill)
        prefetch_queue_depth = _args.optional_int_arg("prefetch_queue_depth", prefetch_queue_depth, 1, _args.MAX_PREFETCH,
                                                      "the daemon's default")
        release_after = _args.optional_int_arg("release_after", release_after, 0, _args.MAX_RELEASE_AFTER,
                                               "derived from the DALI pipeline")
        device_id = _args.int_arg("device_id", device_id, 0, _args.MAX_DEVICE)
        job = _args.job_id_arg(job_id)
        want_fingerprint = _args.fingerprint_arg(fingerprint)
        if cuda_stream is not None and device != "gpu":
            raise ValueError(f"cuda_stream is for device='gpu' (the consumer's GPU work on GPU batches), got it with "
                             f"device={device!r}")
        stream: Union[int, str, None] = CONTEXT if cuda_stream == CONTEXT else stream_handle(cuda_stream)
        self._dali: Optional[_DaliTypes] = None
        if batch_format == "dali":
            self._dali = _DaliTypes()
        timeout = check_timeout("timeout", timeout)
        reconnect_timeout = check_timeout("reconnect_timeout", reconnect_timeout, zero="turns reconnection off")
        socket = socket_path(socket)
        self._transport = transport
        self._timeout = timeout
        self._stream: Optional[Stream] = None
        self._expect: Optional[tuple[int, int]] = None  # the position of the next batch this source returns
        self._on_error = on_error
        self.skipped_samples = 0
        self._socket = socket
        self._conn = UnixHTTPConnection(socket, timeout)
        self._id: Optional[str] = None
        self._held: collections.deque[int] = collections.deque()
        self._give_back: list[int] = []  # slots of batches not handed out (failed)
        self._reconnect_timeout = reconnect_timeout
        self._gpu: Optional[DeviceMapping] = None
        self._mm: Optional[mmap.mmap] = None  # host batch memory
        self._dtypes: dict[str, np.dtype[Any]] = {}  # a numpy dataset's dtype by descr
        self._fence: Optional[ReleaseFence] = None
        self._cu: Any = None
        self._device_id = device_id
        self._uuid = ""
        self._cuda_stream = cuda_stream  # kept alive: its handle is used at every release
        self._halves = BatchHalves()
        self._last: Optional[Position] = None  # the position of the batch returned last
        self._release_after_given = release_after is not None
        self._dali_looked = False  # the DALI pipeline fed was looked for (release_after)
        req = cast(OpenRequest, {
            "dataset": dataset, **args, "shuffle": shuffle,
            "memory": "gpu" if device == "gpu" else "pinned", "device_id": device_id,
            "release_after": release_after, "state": state,
        })
        if job:
            req["job_id"] = job
        if want_fingerprint:
            req["fingerprint"] = want_fingerprint
        if backend is not None:
            req["backend"] = backend
        if backend_options:
            req["backend_options"] = backend_options
        if prefetch_queue_depth is not None:
            req["prefetch_queue_depth"] = prefetch_queue_depth
        if device == "gpu":
            req["gpu_path"] = gpu_path
            # This process's GPU, named by UUID: the daemon's ordinals may differ.
            self._cu = load_libcuda()
            self._uuid = req["device_uuid"] = device_uuid(self._cu, device_id)
            self._fence = ReleaseFence(self._cu, device_id, stream)
        self._req = req
        try:
            self._open(req)
        except BaseException:
            try:
                self.close()
            except CudaError:
                pass  # the failure that brought us here is the one to raise
            raise
        if self.fingerprint:
            self._req["fingerprint"] = self.fingerprint  # a reopen reads this dataset or none

    def _open(self, req: OpenRequest) -> None:
        """Opens a session and maps its batch memory."""
        r = cast(OpenResponse, self._call("POST", "/v1/sessions", req))
        self._id = r["id"]
        self.backend: str = r["backend"]
        """The backend that reads for this source (the daemon's default filled in)."""
        self.gpu_path: str = r["gpu_path"]
        """For GPU batches, the path that runs: "cufile" or "bounce"; else ""."""
        self._release_after: int = r["release_after"]
        self.prefetch_queue_depth: int = r["prefetch_queue_depth"]
        self._epoch_batches: int = r["epoch_batches"]
        self._expect = (r["epoch"], r["iteration"])
        self._state0: State = r["state"]
        self.fingerprint: str = r.get("fingerprint", "")  # "" from a daemon that gives none
        """The dataset's fingerprint: 32 hex digits naming its samples (paths,
        labels, sizes), the same on every node holding the same files."""
        self.reader: str = r.get("reader") or "file"  # a daemon before numpy datasets serves files only
        """The DALI reader whose samples the dataset holds: ``"file"``
        (encoded files: each batch is its samples and labels) or
        ``"numpy"`` (``.npy`` arrays: each batch is the arrays alone)."""
        try:
            mr, fd = receive(self._socket, r["id"], self._timeout)
        except UpgradeError as e:
            self.close()
            raise error_for(f"loaderd: session {r['id']}: cannot receive its batch memory: {e}", e.status, e.error_code) from e
        desc = mr["memory"]
        self.memory: MemoryDesc = desc
        """The session's batch memory: kind, size, slot size, slots, device."""
        old_gpu = self._gpu
        try:
            if desc["kind"] == "gpu":
                self._gpu = DeviceMapping(fd, desc["size"], self._gpu_ordinal(r["id"], desc), lib=self._cu)
                self._buf: np.ndarray[Any, np.dtype[np.uint8]] = np.empty(0, dtype=np.uint8)
            else:
                self._mm = map_host(fd, desc["size"])
                self._buf = np.frombuffer(self._mm, dtype=np.uint8)
        except (CudaError, OSError) as e:
            try:
                self.close()
            except CudaError:
                pass  # the failure to map is the one to raise
            raise LoaderError(f"loaderd: session {r['id']}: cannot map its {desc['kind']} batch memory: {e}") from e
        finally:
            os.close(fd)
        if old_gpu is not None and old_gpu is not self._gpu:
            # The old session's memory (a reconnect): unmapped now, or when
            # the last array handed out from it dies.
            try:
                old_gpu.retire()
            except CudaError as e:
                warnings.warn(f"LoaderSource: unmapping the previous session's GPU memory: {e}", RuntimeWarning,
                              stacklevel=2)

    def _gpu_ordinal(self, session: str, desc: MemoryDesc) -> int:
        """This process's ordinal of the GPU the session's memory is on, by
        its UUID; device_id when the daemon names none (a daemon before
        UUIDs: then its ordinal is device_id)."""
        uuid = desc.get("uuid") or ""
        if not uuid:
            return self._device_id
        dev = find_device(self._cu, uuid)
        if dev != self._device_id:
            raise CudaError(f"the daemon placed session {session}'s memory on GPU {uuid} (device {dev} here), not on "
                            f"{self._uuid} (device_id {self._device_id}) that this source asked for")
        return dev

    def _reconnect(self, cause: LoaderError) -> None:
        """Reopens the session at this source's position after the daemon
        went away, retrying with backoff for reconnect_timeout seconds."""
        if self._reconnect_timeout <= 0 or self._expect is None:
            raise cause
        since = time.time()
        deadline = time.monotonic() + self._reconnect_timeout
        self._drop_stream()
        self._conn.close()
        epoch, batch = self._expect
        req = cast(OpenRequest, dict(self._req))
        req["state"] = {"version": self._state0["version"], "sampling": self._state0["sampling"], "epoch": epoch, "batch": batch}
        delay, last = 0.05, str(cause)
        warnings.warn(f"LoaderSource: loaderd at {self._socket} went away ({cause}); reconnecting for up to "
                      f"{self._reconnect_timeout:g} s", RuntimeWarning, stacklevel=4)
        # A daemon that lives on (only the stream broke) frees the old
        # session now rather than when it is reaped as idle; arrays handed
        # out keep their memory mapped either way.
        conn = UnixHTTPConnection(self._socket, min(self._timeout, 5.0))
        try:
            call(conn, self._socket, "DELETE", f"/v1/sessions/{self._id}")
        except LoaderError:
            pass
        finally:
            conn.close()
        while True:
            try:
                self._open(req)
                break
            except DaemonGoneError as e:
                last = str(e)
            if time.monotonic() >= deadline:
                raise DaemonGoneError(f"loaderd at {self._socket} gone since {time.strftime('%H:%M:%S', time.localtime(since))} "
                                      f"({time.time() - since:.0f} s without it): {last}") from cause
            time.sleep(delay)
            delay = min(2 * delay, 1.0)
        # Slots of the old session mean nothing to the new one; what DALI
        # still holds keeps its memory (the old mapping) alive.
        self._held.clear()
        self._give_back.clear()
        if self._fence is not None:
            self._fence.forget()

    def _samples(self, offsets: list[int], lengths: list[int]) -> list[Sample]:
        """Views of the samples at offsets: numpy arrays of host memory, or
        CudaArrays of GPU memory."""
        g = self._gpu
        if g is None:
            buf = self._buf
            return [buf[o:o + n] for o, n in zip(offsets, lengths)]
        return [CudaArray(g.ptr + o, n, g.device, g) for o, n in zip(offsets, lengths)]

    def _host(self) -> mmap.mmap:
        """The host batch memory's mapping."""
        if self._mm is None:
            raise LoaderError("LoaderSource: no host batch memory is mapped")
        return self._mm

    def _call(self, method: str, path: str, body: Optional[Any] = None) -> Any:
        return call(self._conn, self._socket, method, path, body)

    def __iter__(self) -> LoaderSource:
        # DALI calls iter() on an iterable source while it builds the
        # pipeline's graph: the pipeline is current then.
        self._fit_pipeline(frames=False)
        return self

    def _fit_pipeline(self, frames: bool) -> None:
        """Makes release_after cover the DALI pipeline this source feeds
        (_depth), once: the session is reopened at this source's position
        with a larger one when it was not given, a ValueError raised when
        the one given is too small."""
        if self._dali_looked:
            return
        pipe = _depth.find_pipeline(frames)
        if pipe is None:
            self._dali_looked = frames  # iter() outside DALI: look again at the first batch
            return
        self._dali_looked = True
        n = _depth.release_after_for(pipe, self._release_after, self._req["release_after"] if self._release_after_given else None)
        if n is not None and self._id is not None and self._expect is not None:
            self._req["release_after"] = n
            self._drop_stream()
            epoch, batch = self._expect
            req = cast(OpenRequest, dict(self._req))
            req["state"] = {"version": self._state0["version"], "sampling": self._state0["sampling"], "epoch": epoch, "batch": batch}
            try:
                self._call("DELETE", f"/v1/sessions/{self._id}")  # first: its shard leaves the job
            except NotFoundError:
                pass
            self._open(req)
            self._held.clear()  # the old session's slots; arrays handed out keep its memory mapped
            self._give_back.clear()
            if self._fence is not None:
                self._fence.forget()

    def __next__(self) -> Union[Batch, DaliBatch, Tensors]:
        return self._fetch(None)

    def batch(self, info: Any) -> Union[Batch, DaliBatch, Tensors]:
        """Batch ``info.iteration`` of epoch ``info.epoch_idx``: for
        ``fn.external_source(source=src.batch, batch=True, batch_info=True)``,
        which gives DALI's ``BatchInfo``. Raises ``StopIteration`` past the
        epoch's last batch. As the batch is a pure function of (epoch,
        iteration), a pipeline built with ``enable_checkpointing=True``
        resumes exactly from ``pipe.checkpoint()``: DALI asks again for the
        batches it had prefetched. Asking in order costs no extra read.
        (Pass the bound method: DALI iterates any iterable source and ignores
        ``batch_info`` for it.)"""
        return self._fetch((int(info.epoch_idx), int(info.iteration)))

    def _fetch(self, at: Optional[tuple[int, int]]) -> Union[Batch, DaliBatch, Tensors]:
        if self._id is None:
            raise LoaderError("LoaderSource is closed")
        if not self._dali_looked:
            self._fit_pipeline(frames=True)  # a callable source (src.batch): DALI is among the callers
        # Batches with release_after later batches delivered go back to the
        # daemon with this request (one round trip per batch); GPU memory
        # only once the consumer's GPU work queued on it has finished.
        # The GPU memory of a batch past release_after is held back (an
        # event on the consumer's stream) until that work has finished,
        # without waiting for it while the daemon still has room to read
        # ahead (prefetch_queue_depth slots held back at most).
        release, self._give_back = self._give_back, []
        while len(self._held) > self._release_after:
            slot = self._held.popleft()
            if self._fence is None:
                release.append(slot)
            else:
                self._fence.record(slot)
        if self._fence is not None:
            release += self._fence.done(self.prefetch_queue_depth)
        try:
            r = self._next(release, at)
        except (DaemonGoneError, NotFoundError) as e:  # NotFound: a restarted daemon does not know the session
            self._reconnect(e)
            r = self._next([], at)
        self._epoch_batches = r["epoch_batches"]
        if r["end_of_epoch"]:
            self._expect = (r["epoch"], 0)
            raise StopIteration
        if at is not None and (r["epoch"], r["iteration"]) != at:
            self._drop_stream()
            raise LoaderError(f"loaderd: sent epoch {r['epoch']} batch {r['iteration']}, asked for {at}")
        self._expect = (r["epoch"], r["iteration"] + 1)
        self._last = (r["epoch"], r["iteration"])
        failed = r.get("failed") or []
        if failed and (self._on_error == "raise" or len(failed) == len(r["offsets"])):
            self._give_back.append(r["slot"])
            raise SampleError(r["epoch"], r["iteration"], failed, r.get("errors") or [])
        self._held.append(r["slot"])
        offsets, lengths, lbls = r["offsets"], r["lengths"], r["labels"]
        if self.reader == "numpy":
            return self._tensors(r, failed)
        if not failed:  # the common case: every sample, no index juggling
            return self._batch(offsets, lengths, np.array(lbls, dtype=np.int32).reshape(-1, 1))
        keep = self._skip(r, failed)
        labels = np.asarray([lbls[i] for i in keep], dtype=np.int32).reshape(-1, 1)
        return self._batch([offsets[i] for i in keep], [lengths[i] for i in keep], labels)

    def _skip(self, r: NextResponse, failed: list[int], stacklevel: int = 4) -> list[int]:
        """The positions of the samples that were read (on_error="skip"),
        the failed ones counted and warned of (the warning points
        stacklevel frames up: at the caller of next())."""
        bad = set(failed)
        keep = [i for i in range(len(r["offsets"])) if i not in bad]
        self.skipped_samples += len(failed)
        warnings.warn(f"LoaderSource: epoch {r['epoch']} batch {r['iteration']}: skipped {len(failed)} sample(s) "
                      "that could not be read: " + "; ".join(r.get("errors") or []), RuntimeWarning, stacklevel=stacklevel)
        return keep

    def _tensors(self, r: NextResponse, failed: list[int]) -> Union[Tensors, Any]:
        """A numpy dataset's batch: the arrays alone, viewing batch memory.
        Dense (every sample one shape, back to back): one array (batch,
        *shape); else, or with samples skipped, a list of each sample's
        array."""
        descr, shapes = r.get("dtype"), r.get("shapes")
        offsets, lengths = r["offsets"], r["lengths"]
        if descr is None or shapes is None or len(shapes) != len(offsets):
            raise LoaderError(f"loaderd: epoch {r['epoch']} batch {r['iteration']} of numpy dataset "
                              f"{self._req['dataset']} came without a dtype and one shape per sample")
        dt = self._dtypes.get(descr)
        if dt is None:
            dt = self._dtypes[descr] = _tensor_dtype(descr)
        n = len(offsets)
        if failed:
            keep = self._skip(r, failed, stacklevel=5)
            offsets, lengths, shapes = [offsets[i] for i in keep], [lengths[i] for i in keep], [shapes[i] for i in keep]
        else:
            row = _dense(offsets, lengths)
            shape = tuple(shapes[0])
            if row and shapes.count(shapes[0]) == n and row == _nbytes(dt, shape):
                whole = (n, *shape)
                g = self._gpu
                if g is not None:
                    return CudaArray(g.ptr + offsets[0], whole, g.device, g, descr)
                arr: Array = np.ndarray(whole, dtype=dt, buffer=self._host(), offset=offsets[0])
                return self._dali.tensors(arr) if self._dali is not None else arr
        for i, (m, s) in enumerate(zip(lengths, shapes)):
            if m != _nbytes(dt, s):
                raise LoaderError(f"loaderd: epoch {r['epoch']} batch {r['iteration']}: a sample of {m} bytes, but "
                                  f"its shape {tuple(s)} of {descr} holds {_nbytes(dt, s)}")
        g = self._gpu
        if g is not None:
            return [CudaArray(g.ptr + o, tuple(s), g.device, g, descr) for o, s in zip(offsets, shapes)]
        mm = self._host()
        arrays: list[Array] = [np.ndarray(tuple(s), dtype=dt, buffer=mm, offset=o) for o, s in zip(offsets, shapes)]
        return self._dali.tensors(arrays) if self._dali is not None else arrays

    def _batch(self, offsets: list[int], lengths: list[int],
               labels: "np.ndarray[Any, np.dtype[np.int32]]") -> Union[Batch, DaliBatch]:
        """The batch's samples at offsets in this source's batch_format."""
        g, dali = self._gpu, self._dali
        if g is None:
            if dali is None:
                return self._samples(offsets, lengths), labels
            return dali.batch(self._samples(offsets, lengths), labels)
        n = _dense(offsets, lengths)
        # GPU samples of one size lie back to back: one (batch, size) array
        # (DALI wraps it as the batch, no copy; torch.as_tensor and
        # cupy.asarray view it whole), the labels numpy without DALI.
        data: Union[list[Sample], CudaArray] = (CudaArray(g.ptr + offsets[0], (len(offsets), n), g.device, g) if n
                                                else self._samples(offsets, lengths))
        return (data, labels) if dali is None else (data, dali.labels(labels))

    def samples(self, info: Any = None) -> Any:
        """The samples of the next batch (or of batch ``info`` of DALI's
        ``BatchInfo``), in this source's batch_format, for one
        ``fn.external_source`` while ``labels`` feeds another: every
        output of one external source lives on its device, so GPU samples
        and host labels need two. DALI calls the two once each per
        iteration, in no defined order: whichever comes first fetches the
        batch, the other takes its half of the same batch (the end of an
        epoch too). Asking for one half twice before the other was taken
        raises ``LoaderError`` (never a shifted label). Use both or
        neither, ``parallel=False``::

            src = LoaderSource("imagenet", batch_size=64, device="gpu", batch_format="dali")

            @pipeline_def(batch_size=64, num_threads=4, device_id=0)
            def pipe():
                data = fn.external_source(source=src.samples, batch=True, device="gpu", no_copy=True,
                                          dtype=types.UINT8)
                labels = fn.external_source(source=src.labels, batch=True, device="cpu",
                                            dtype=types.INT32)
                return data, labels

        For checkpointing pass ``batch_info=True`` to both: each then gets
        DALI's ``BatchInfo`` and the batch at that position (see
        ``batch``).

        A numpy dataset has no labels: ``samples`` is then the whole batch
        (the arrays), the next one at every call (or the one ``info``
        names), as ``next()`` and ``batch`` give it, for one external
        source; ``labels`` raises."""
        if self.reader == "numpy":
            return self._fetch(batch_position(info))
        return self._halves.take(0, info, self._fetch_half)

    def labels(self, info: Any = None) -> Any:
        """The labels (int32, shape (1,) a sample; a ``TensorListCPU`` with
        ``batch_format="dali"``, else a numpy array of shape (batch, 1)) of
        the batch whose samples ``samples`` hands out, for a second
        ``fn.external_source(source=src.labels, device="cpu")``; see
        ``samples``. A numpy dataset has none: ``LoaderError``."""
        if self.reader == "numpy":
            raise LoaderError(f"LoaderSource: dataset {self._req['dataset']} holds numpy arrays, without labels: feed "
                              "the source itself (or src.samples) to one fn.external_source")
        return self._halves.take(1, info, self._fetch_half)

    def _fetch_half(self, at: Optional[Position]) -> tuple[Position, Any, Any]:
        samples, labels = cast(tuple[Any, Any], self._fetch(at))
        return cast(Position, self._last), samples, labels

    def _next(self, release: list[int], at: Optional[tuple[int, int]]) -> NextResponse:
        """The next descriptor, by the source's transport."""
        if self._transport == "stream":
            return self._stream_next(release, at)
        body: NextRequest = {}
        if release:
            body["release"] = release
        if at is not None:
            body["epoch"], body["iteration"] = at
        return cast(NextResponse, self._call("POST", f"/v1/sessions/{self._id}/next", body or None))

    def _stream_next(self, release: list[int], at: Optional[tuple[int, int]]) -> NextResponse:
        """The next frame of the stream, opening it (at at) or moving it
        when at is not where the stream is."""
        try:
            if self._stream is not None and at is not None and at != self._expect:
                self._stream.stop(keep=self._kept())  # what DALI still holds stays held
                self._stream = None
            if self._stream is None:
                # From the source's own position (known since the open, kept
                # by every batch): no request for it. What this source still
                # holds is kept; everything else the daemon delivered
                # (release included) goes back before the first frame.
                if at is not None:
                    self._expect = at
                self._stream = Stream(self._socket, cast(str, self._id), self._timeout, self._expect, self._kept())
            elif release:
                self._stream.send({"release": release})
            r = cast(NextResponse, self._stream.recv())
        except StreamError as e:
            self._drop_stream()
            if e.status is not None:
                raise error_for(f"loaderd: stream: {e}", e.status, e.error_code) from e
            raise DaemonGoneError(f"loaderd at {self._socket}: stream: {e}") from e
        if r.get("error"):
            self._drop_stream()
            raise error_for(f"loaderd: {r['error']}", r.get("error_status"), r.get("error_code"))
        return r

    def _kept(self) -> list[int]:
        """The slots this source still holds: those of batches handed out,
        and those held back for the consumer's GPU work."""
        return list(self._held) + (self._fence.held if self._fence is not None else [])

    def _drop_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def __len__(self) -> int:
        """Batches in the current epoch for this shard."""
        return self._epoch_batches

    def state(self) -> State:
        """The position of the next batch this source will produce; pass it
        as ``state=`` to resume the iterator form. Under DALI that is ahead of
        the training loop by the batches DALI prefetched
        (``prefetch_queue_depth``): resuming from it skips them. For exact
        resume under DALI use ``source=src.batch, batch_info=True`` with
        ``enable_checkpointing=True`` and ``pipe.checkpoint()``."""
        st = cast(State, self._call("GET", f"/v1/sessions/{self._id}/state"))
        if self._stream is not None and self._expect is not None:
            # The daemon has read ahead into the stream: the source's own
            # position is the stream's next frame.
            st["epoch"], st["batch"] = self._expect
        return st

    def close(self) -> None:
        """Ends the session. Batches handed out stay readable: GPU memory is
        unmapped now when no ``CudaArray`` of it lives, else when the last
        one dies (or at interpreter exit), after the device's queued work.
        Raises ``CudaError`` naming the call when that fails, after the
        rest of the cleanup."""
        self._drop_stream()
        if self._id is not None:
            try:
                self._call("DELETE", f"/v1/sessions/{self._id}")
            except LoaderError:
                pass
            self._id = None
        self._conn.close()
        self._halves.clear()
        errors: list[CudaError] = []
        gpu, self._gpu = self._gpu, None
        fence, self._fence = self._fence, None
        for close in (gpu.retire if gpu is not None else None, fence.close if fence is not None else None):
            if close is not None:
                try:
                    close()
                except CudaError as e:
                    errors.append(e)
        if errors:
            raise errors[0]

    def __enter__(self) -> LoaderSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
