# SPDX-License-Identifier: Apache-2.0
"""``LoaderSource``: one shard of a dataset as batches for DALI's
``fn.external_source``, read by loaderd into batch memory this process
maps. A short facade over its pieces: its constructor (``_sourceinit``),
the arguments checked once (``_options``), the session and its transport (``_session``,
``_transport``), the batch views (``_views``) and the DALI-facing source
(``_feed``)."""

from __future__ import annotations

from . import _args
from ._options import BatchFormat, Device, GPUPath, OnError, Shuffle, Transport
from ._sourceinit import SourceInit
from ._views import Array, Batch, DaliBatch, Sample, Tensors
from ._wds import Components, MissingComponent

__all__ = ["LoaderSource", "MAX_INITIAL_FILL", "Array", "Batch", "BatchFormat", "Components", "DaliBatch", "Device",
           "GPUPath", "MissingComponent", "OnError", "Sample", "Shuffle", "Tensors", "Transport"]

MAX_INITIAL_FILL = _args.MAX_INITIAL_FILL
"""The largest ``initial_fill`` (the daemon's bound too)."""


class LoaderSource(SourceInit):
    """Batches of one shard of a dataset registered with loaderd, for
    ``fn.external_source(source=src, num_outputs=2, batch=True)``; or, for
    GPU samples with host labels, for two external sources
    (``source=src.samples, device="gpu"`` and ``source=src.labels,
    device="cpu"``; see ``samples``). Read by user code instead, each batch is
    a copy, valid while referenced (``zero_copy``; python/README.md, "Batch lifetime").

    Over a numpy dataset (``mkbmap --reader numpy``; ``reader`` is then
    ``"numpy"``) each batch is the arrays **alone**, without labels, as
    ``fn.readers.numpy``'s one output, for
    ``fn.external_source(source=src, batch=True)``: one ``(batch,
    *shape)`` array (a view of the batch memory), or a list of them (python/README.md,
    "LoaderSource over a numpy dataset", says which, and what unpacking
    such a batch does).

    Over a WebDataset dataset (``mkbmap --reader webdataset``: tar
    shards) name the components with ``ext``: each batch is a tuple of
    ``len(ext)`` outputs, one list of 1-D uint8 views (or ``CudaArray``;
    a ``TensorListCPU`` with ``batch_format="dali"``) per entry, sample
    by sample as ``fn.readers.webdataset`` returns them, for
    ``fn.external_source(source=src, num_outputs=len(ext), batch=True)``.

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
        on every rank (shards stay disjoint; with ``stick_to_shard`` the
        rank's samples are DALI's shard's, permuted anew each epoch).
        ``"dali"``: ``fn.readers.file(random_shuffle=True)``'s order,
        sample for sample, epoch after epoch (same ``seed``,
        ``initial_fill``, sharding, padding and ``batch_size``): a local
        shuffle, through a buffer of ``initial_fill`` samples, of one list
        order fixed for every seed. Without ``pad_last_batch`` DALI's
        batches run across the epoch boundary; here the epoch ends with a
        partial batch of the same samples. Resuming at epoch *e* replays
        the epochs before it in the daemon (about 15 ns a sample, at most
        2**30 samples).
    shuffle_after_epoch : bool, optional, default = False
        DALI's ``shuffle_after_epoch``: the whole list permuted anew at
        every epoch's end, the same permutations on every rank and for
        every ``seed``; each rank reads its ``shard_id``'s range. Two
        sources over datasets of one length (``x`` and ``y`` of each case)
        read the same positions: pairs stay paired. The permutations are
        DALI 2.4's, sample for sample (``fn.readers.numpy`` and
        ``fn.readers.file`` of the same list and arguments return the
        same samples). Not with ``random_shuffle`` or ``stick_to_shard``.
    shuffle_after_epoch_seed : int, optional
        DALI's ``shuffle_after_epoch_seed`` (an int64): the seed of those
        permutations; ``None``, DALI's fixed default (524287). Every rank
        must pass the same.
    files : list of str, optional
        DALI's ``files=``: the dataset's samples to read, in this order
        (the list DALI's readers shard and shuffle), each named by its
        path relative to the map's root or its absolute path under it
        (nnU-Net's k-fold lists, computed at run time). The daemon checks
        only these as the caller and refuses, at open, a name the map does
        not hold. Default: every sample of the dataset.
    file_list : str, optional
        DALI's ``file_list=``: a text file of such names, one a line (read
        here, as the caller; a trailing integer label is dropped: the
        map's labels count). Not with ``files``.
    initial_fill : int, optional, default = 1024
        The ``"dali"`` shuffle's buffer, in samples, in ``[1, 2**24]``:
        ``fn.readers.file``'s ``initial_fill``. Only ``shuffle="dali"``
        with ``random_shuffle`` uses it.
    backend : str, optional
        How the daemon reads: ``"file"``, ``"gds"``, ``"bam"`` (see
        ``backends()``); ``None`` takes the fastest the dataset allows: raw
        reads (``gds``) over a block device's map, else ``file``
        (``backend`` and ``backend_why`` say which and why).
    backend_options : dict, optional
        The backend's options by name (see ``backends()``).
    prefetch_queue_depth : int, optional
        Batches the daemon reads ahead, in ``[1, 64]``; ``None`` takes its
        default (2). Not DALI's ``prefetch_queue_depth``: ``release_after``
        follows that one.
    release_after : int, optional
        A batch's memory goes back to the daemon after this many later
        batches, in ``[0, 64]``. ``None``: derived from the DALI pipeline
        the source feeds (how long DALI may still read a batch fed with
        ``no_copy=True``: ``prefetch_queue_depth + 1``, or with separated
        queues ``cpu_size * gpu_size + 1`` unless equal), outside DALI the
        daemon's ``prefetch_queue_depth + 1``. A smaller value than the
        pipeline needs raises ``ValueError`` naming both.
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
        ``"stream"``: batch descriptors pushed by the daemon as batches
        are read, releases sent back without a reply (no round trip per
        batch); ``"http"``: a request per batch.
    device : {"cpu", "gpu"}, optional, default = "cpu"
        Where batches land. ``"cpu"``: page-locked host memory (numpy
        views). ``"gpu"``: GPU memory on ``device_id``, written by the
        daemon before the batch is handed out; samples are ``CudaArray``
        objects (``__cuda_array_interface__``: ``fn.external_source(
        device="gpu")``, ``torch.as_tensor``, ``cupy.asarray`` take them
        without a copy; samples of one size come as one ``(batch, size)``
        array); labels stay on the host. Needs the CUDA driver here
        (``$NVFEED_CUDA_LIB_DIR`` or the loader's path), else
        ``CudaError`` says what was tried. GPU memory goes back only after
        the consumer's work on it (``cuda_stream``).
    device_id : int, optional, default = 0
        The GPU for ``device="gpu"``, as this process numbers its GPUs
        (``CUDA_VISIBLE_DEVICES`` applied). The daemon is told the GPU's
        UUID, so a daemon that numbers GPUs differently uses the same one.
    gpu_path : {"auto", "cufile", "bounce"}, optional, default = "auto"
        How batches reach GPU memory (``device="gpu"``): ``"cufile"``,
        ``cuFileRead`` straight into the device; ``"bounce"``, ``backend``
        reads into page-locked staging memory copied once per batch;
        ``"auto"``, cufile where cuFile runs on the daemon's machine and
        no host backend is named, else bounce (``gpu_path`` says which).
    reconnect_timeout : float, optional, default = 60.0
        Seconds to keep trying when the daemon goes away (an upgrade, a
        crash, a restart): the source reconnects, reopens its session at
        its own position and yields exactly the batches an uninterrupted
        source would have; batches already handed out stay valid. After
        it, ``DaemonGoneError`` says since when. 0 turns reconnection off.
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
        The dataset's fingerprint this source must read (32 hex digits,
        ``src.fingerprint`` or ``datasets()``); another raises
        ``ConflictError``. A reopen after a restart asks for the first.
    process_group : torch.distributed.ProcessGroup, optional
        With ``torch.distributed`` initialised and ``num_shards`` > 1, the
        sources of this group's ranks (``None``: the default group) are
        compared at construction by one ``all_gather_object`` every rank
        must reach: another dataset or sampling, two ranks with one
        ``shard_id`` or a group not of ``num_shards`` ranks raise
        ``RankMismatchError`` on every rank, naming each rank's value.
        Pass the data-parallel group when model-parallel ranks share a
        shard; with NCCL set each rank's device first. Never done in a
        DataLoader worker.
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
        with ``cuda_stream``, ``__cuda_stream__``, ``handle`` or ``ptr``.
        A batch's GPU memory past ``release_after`` goes back to the daemon
        only once the work queued on that stream so far has finished (an
        event recorded there, polled at each batch; the host waits only
        when more than ``prefetch_queue_depth`` slots are held back). By
        default PyTorch's current stream when PyTorch has initialised
        CUDA, else the legacy default stream; ``"context"`` synchronises
        the whole context at each release instead.
    ext : str or list of str, optional
        WebDataset datasets: the components, one output each, as
        ``fn.readers.webdataset``'s ``ext`` (``"jpg;png"``: the first of
        the alternatives a sample has).
    missing_component_behavior : {"empty", "skip", "error"}, optional, default = "empty"
        A sample lacking a component of ``ext``: an empty one, the sample
        left out, or refused when the session opens (as DALI's).
    case_sensitive_extensions : bool, optional, default = True
        Whether ``ext`` matches member names' extensions case-sensitively.
    zero_copy : bool, optional, default = False
        Outside DALI, read-only views of the batch memory, valid until
        ``release_after`` more batches were taken (the daemon then reads
        other samples into it), not copies valid while referenced. DALI
        gets views always (it copies them, or ``release_after`` covers its
        queues). GPU batches are never copied: outside DALI they need it.
    **dali_args
        DALI reader arguments: those that only tune how DALI reads
        (``read_ahead``, ``dont_use_mmap``, ``use_o_direct``, ...) are
        ignored with a warning; any other raises ``TypeError`` here,
        saying it is a ``fn.readers.numpy`` argument nvfeed does not
        support and what to do instead.

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

    def __iter__(self) -> LoaderSource:
        super().__iter__()
        return self

    def __enter__(self) -> LoaderSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
