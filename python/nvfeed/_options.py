# SPDX-License-Identifier: Apache-2.0
"""A source's arguments, declared once: ``SourceOptions``.

Each field is one argument of ``LoaderSource``: its name, type, default,
range and doc. That one declaration checks the argument (``check``),
builds the open request (``open_request``), writes ``LoaderSource``'s
signature (``signature``) and the "Parameters" entries of the docstrings
(``with_parameters``).
The bounds are ``_args``'s: a Go test ties them to the daemon's constants."""

from __future__ import annotations

import dataclasses
import inspect
import re
import textwrap
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional, Union, cast

from . import _args, _daliargs
from ._connect import check_timeout, socket_path
from ._cuda import CONTEXT, stream_handle
from ._wire import ROI, OpenRequest, State

OnError = Literal["raise", "skip"]
Transport = Literal["stream", "http"]
BatchFormat = Literal["numpy", "dali"]
Device = Literal["cpu", "gpu"]
GPUPath = Literal["auto", "cufile", "bounce"]
Shuffle = Literal["permute", "dali"]

Check = Callable[[str, Any], Any]
"""An argument's check: its name and value in, the checked value out, or a
``ValueError`` naming both."""

_REQUIRED = dataclasses.MISSING


def param(kind: str = "", default: Any = _REQUIRED, check: Optional[Check] = None, choices: tuple[str, ...] = (),
          wire: str = "", compare: bool = True, accepts: str = "", doc: str = "") -> Any:
    """One argument's declaration, as a dataclass field: ``kind``, its
    type as the docs name it (choices name their own); ``default``
    (absent: required); ``check``, or ``choices``; ``wire``, how the open
    request carries it under its own name: never (""), "always", when
    not None ("given") or when not empty ("set"); ``compare``, whether
    two options compare it; ``accepts``, the type the signature names
    where the field holds another; ``doc``, for the docstring."""
    if choices:
        kind = "{" + ", ".join(f'"{c}"' for c in choices) + "}"
    meta = {"param": True, "kind": kind, "check": check or (_choice(choices) if choices else None), "wire": wire,
            "accepts": accepts, "doc": textwrap.dedent(doc).strip("\n")}
    return field(default=default, compare=compare, metadata=meta)


def _choice(allowed: tuple[str, ...]) -> Check:
    """One of ``allowed``."""
    def check(name: str, value: Any) -> Any:
        if value not in allowed:
            said = " or ".join(", ".join(repr(a) for a in allowed).rsplit(", ", 1))
            raise ValueError(f"{name} must be {said}, got {value!r}")
        return value
    return check


def _int(lo: int, hi: int, note: str = "", none: Optional[str] = None) -> Check:
    """An int in ``[lo, hi]``; with ``none``, also None (``none`` says what it means)."""
    def check(name: str, value: Any) -> Any:
        if none is not None and value is None:
            return None
        return _args.int_arg(name, value, lo, hi, note + ("" if none is None else f" or None ({none})"))
    return check


def _seconds(zero: Optional[str] = None) -> Check:
    """Seconds > 0; with ``zero``, also 0 (``zero`` says what it means)."""
    return lambda name, value: check_timeout(name, value, zero=zero)


def _named(check: Callable[[Any], Any]) -> Check:
    """A check that names its argument itself."""
    return lambda _, value: check(value)


def _flag(name: str, value: Any) -> bool:
    """True or False, not 1 or "yes"."""
    return _args.bool_arg(name, value)


def _dataset(name: str, value: Any) -> str:
    """A dataset's name: a str, not empty."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"dataset must be a registered dataset's name, got {value!r}")
    return value


def _socket(_: str, value: Any) -> str:
    """The socket given, else ``$NVFEED_SOCKET``, else the default."""
    return socket_path(value)


def _ext(_: str, value: Any) -> tuple[str, ...]:
    """WebDataset components; ``()`` for none."""
    return () if value is None else _args.ext_arg(value)


@dataclass(frozen=True)
class SourceOptions:
    """Every argument of a ``LoaderSource``, checked.

    Built by ``check`` only: each field is in its range and a literal among
    its choices. ``socket`` is resolved. ``job_id`` and ``fingerprint`` are
    ``""`` for none. ``files`` holds ``file_list``'s names too. ``ext`` is
    ``()`` for a source that names no WebDataset components.

    Attributes
    ----------
    roi : ROI or None
        The region of interest ``fn.readers.numpy``'s arguments give.
    stream : int, str or None
        ``cuda_stream`` as a handle (``"context"`` kept as it is).
    """

    dataset: str = param("str", check=_dataset, wire="always", doc="""
        The dataset's name, as registered with ``loaderd serve --dataset``.""")
    socket: str = param("str", default=None, check=_socket, accepts="Optional[str]", doc="""
        The daemon's unix socket; by default ``$NVFEED_SOCKET`` when set,
        else ``/run/loaderd/loaderd.sock`` (``DEFAULT_SOCKET``, where
        deploy/ puts it).""")
    batch_size: int = param("int", default=64, check=_int(1, _args.MAX_BATCH_SIZE), wire="always", doc="""
        Samples per batch (DALI ``fn.readers.file``'s ``batch_size``), in
        ``[1, 65536]``.""")
    shard_id: int = param("int", default=0, wire="always", doc="""
        This rank's shard, in ``[0, num_shards)``.""")
    num_shards: int = param("int", default=1,
        check=_int(1, _args.MAX_SHARDS, " (the number of ranks; 0 does not mean 1)"), wire="always", doc="""
        The number of shards (ranks) the dataset is split into, in
        ``[1, 2**31 - 1]`` (0 is an error: it does not mean 1).""")
    random_shuffle: bool = param("bool", default=False, check=_flag, wire="always", doc="""
        Shuffle every epoch, as ``shuffle`` says. Without it every
        ``shuffle`` reads the shard in order, as ``fn.readers.file`` does.""")
    seed: int = param("int", default=0, check=_int(0, _args.MAX_SEED), wire="always", doc="""
        The shuffle's seed, in ``[0, 2**64)``. With ``shuffle="dali"``
        only its low 32 bits count, as in DALI; pass the same ``seed`` to
        ``fn.readers.file`` (a reader given no seed takes one derived from
        the pipeline's, which this source cannot know).""")
    pad_last_batch: bool = param("bool", default=False, check=_flag, wire="always", doc="""
        Pad every shard to the same length and whole batches by repeating
        its last sample, as DALI does.""")
    stick_to_shard: bool = param("bool", default=False, check=_flag, wire="always", doc="""
        Read the same shard every epoch (else shard ``(shard_id + epoch) %
        num_shards``): the samples ``fn.readers.file``'s shard holds, so
        a node that caches its shard keeps it, shuffled or not.""")
    shuffle: Shuffle = param(default="permute", choices=("permute", "dali"), wire="always", doc="""
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
        2**30 samples).""")
    initial_fill: int = param("int", default=1024, check=_int(1, _args.MAX_INITIAL_FILL), wire="always", doc="""
        The ``"dali"`` shuffle's buffer, in samples, in ``[1, 2**24]``:
        ``fn.readers.file``'s ``initial_fill``. Only ``shuffle="dali"``
        with ``random_shuffle`` uses it.""")
    backend: Optional[str] = param("str", default=None, wire="given", doc="""
        How the daemon reads: ``"file"``, ``"gds"``, ``"bam"`` (see
        ``backends()``); ``None`` takes the fastest the dataset allows: raw
        reads (``gds``) over a block device's map, else ``file``
        (``backend`` and ``backend_why`` say which and why).""")
    backend_options: Optional[dict[str, Any]] = param("dict", default=None, wire="set", doc="""
        The backend's options by name (see ``backends()``).""")
    prefetch_queue_depth: Optional[int] = param("int", default=None,
        check=_int(1, _args.MAX_PREFETCH, none="the daemon's default"), wire="given", doc="""
        Batches the daemon reads ahead, in ``[1, 64]``; ``None`` takes its
        default (2). Not DALI's ``prefetch_queue_depth``: ``release_after``
        follows that one.""")
    release_after: Optional[int] = param("int", default=None,
        check=_int(0, _args.MAX_RELEASE_AFTER, none="derived from the DALI pipeline"), wire="always", doc="""
        A batch's memory goes back to the daemon after this many later
        batches, in ``[0, 64]``. ``None``: derived from the DALI pipeline
        the source feeds (how long DALI may still read a batch fed with
        ``no_copy=True``: ``prefetch_queue_depth + 1``, or with separated
        queues ``cpu_size * gpu_size + 1`` unless equal), outside DALI the
        daemon's ``prefetch_queue_depth + 1``. A smaller value than the
        pipeline needs raises ``ValueError`` naming both.""")
    state: Optional[State] = param("State", default=None, wire="always", doc="""
        Resume where ``state()`` was taken.""")
    timeout: float = param("float", default=600.0, check=_seconds(), doc="""
        Seconds to wait for the daemon per request (> 0).""")
    on_error: OnError = param(default="raise", choices=("raise", "skip"), doc="""
        What a batch with samples that could not be read (deleted, EIO,
        changed) does: ``"raise"`` raises ``SampleError`` naming every
        failed sample, the batch given back and the source still usable;
        ``"skip"`` returns the batch without them (a smaller batch) and
        warns, counting them in ``skipped_samples`` (a batch none of whose
        samples could be read raises even then). A zero-length stand-in is
        never returned.""")
    transport: Transport = param(default="stream", choices=("stream", "http"), doc="""
        ``"stream"``: batch descriptors pushed by the daemon as batches
        are read, releases sent back without a reply (no round trip per
        batch); ``"http"``: a request per batch.""")
    device: Device = param(default="cpu", choices=("cpu", "gpu"), doc="""
        Where batches land. ``"cpu"``: page-locked host memory (numpy
        views). ``"gpu"``: GPU memory on ``device_id``, written by the
        daemon before the batch is handed out; samples are ``CudaArray``
        objects (``__cuda_array_interface__``: ``fn.external_source(
        device="gpu")``, ``torch.as_tensor``, ``cupy.asarray`` take them
        without a copy; samples of one size come as one ``(batch, size)``
        array); labels stay on the host. Needs the CUDA driver here
        (``$NVFEED_CUDA_LIB_DIR`` or the loader's path), else
        ``CudaError`` says what was tried. GPU memory goes back only after
        the consumer's work on it (``cuda_stream``).""")
    device_id: int = param("int", default=0, check=_int(0, _args.MAX_DEVICE), wire="always", doc="""
        The GPU for ``device="gpu"``, as this process numbers its GPUs
        (``CUDA_VISIBLE_DEVICES`` applied). The daemon is told the GPU's
        UUID, so a daemon that numbers GPUs differently uses the same one.""")
    gpu_path: GPUPath = param(default="auto", choices=("auto", "cufile", "bounce"), doc="""
        How batches reach GPU memory (``device="gpu"``): ``"cufile"``,
        ``cuFileRead`` straight into the device; ``"bounce"``, ``backend``
        reads into page-locked staging memory copied once per batch;
        ``"auto"``, cufile where cuFile runs on the daemon's machine and
        no host backend is named, else bounce (``gpu_path`` says which).""")
    reconnect_timeout: float = param("float", default=60.0, check=_seconds("turns reconnection off"), doc="""
        Seconds to keep trying when the daemon goes away (an upgrade, a
        crash, a restart): the source reconnects, reopens its session at
        its own position and yields exactly the batches an uninterrupted
        source would have; batches already handed out stay valid. After
        it, ``DaemonGoneError`` says since when. 0 turns reconnection off.""")
    batch_format: BatchFormat = param(default="numpy", choices=("numpy", "dali"), doc="""
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
        Needs DALI in this process.""")
    cuda_stream: object = param('int, stream object or "context"', default=None, compare=False, doc="""
        The stream the consumer's GPU work on the batches runs on
        (``device="gpu"`` only): an int ``CUstream`` handle, or an object
        with ``cuda_stream``, ``__cuda_stream__``, ``handle`` or ``ptr``.
        A batch's GPU memory past ``release_after`` goes back to the daemon
        only once the work queued on that stream so far has finished (an
        event recorded there, polled at each batch; the host waits only
        when more than ``prefetch_queue_depth`` slots are held back). By
        default PyTorch's current stream when PyTorch has initialised
        CUDA, else the legacy default stream; ``"context"`` synchronises
        the whole context at each release instead.""")
    job_id: str = param("str", default=None, check=_named(_args.job_id_arg), wire="set", accepts="Optional[str]",
        doc="""
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
        compared through ``torch.distributed`` (below).""")
    fingerprint: str = param("str", default=None, check=_named(_args.fingerprint_arg), wire="set",
        accepts="Optional[str]", doc="""
        The dataset's fingerprint this source must read (32 hex digits,
        ``src.fingerprint`` or ``datasets()``); another raises
        ``ConflictError``. A reopen after a restart asks for the first.""")
    process_group: Any = param("torch.distributed.ProcessGroup", default=None, compare=False, doc="""
        With ``torch.distributed`` initialised and ``num_shards`` > 1, the
        sources of this group's ranks (``None``: the default group) are
        compared at construction by one ``all_gather_object`` every rank
        must reach: another dataset or sampling, two ranks with one
        ``shard_id`` or a group not of ``num_shards`` ranks raise
        ``RankMismatchError`` on every rank, naming each rank's value.
        Pass the data-parallel group when model-parallel ranks share a
        shard; with NCCL set each rank's device first. Never done in a
        DataLoader worker.""")
    check_ranks: bool = param("bool", default=True, check=_flag, doc="""
        False skips the ``torch.distributed`` comparison (a sharded source
        built on some ranks only would wait for the others forever).""")
    shuffle_after_epoch: bool = param("bool", default=False, check=_flag, wire="always", doc="""
        DALI's ``shuffle_after_epoch``: the whole list permuted anew at
        every epoch's end, the same permutations on every rank and for
        every ``seed``; each rank reads its ``shard_id``'s range. Two
        sources over datasets of one length (``x`` and ``y`` of each case)
        read the same positions: pairs stay paired. The permutations are
        DALI 2.4's, sample for sample (``fn.readers.numpy`` and
        ``fn.readers.file`` of the same list and arguments return the
        same samples). Not with ``random_shuffle`` or ``stick_to_shard``.""")
    shuffle_after_epoch_seed: Optional[int] = param("int", default=None,
        check=_int(_args.MIN_INT64, _args.MAX_INT64, " (DALI's int64)", none="DALI's default, 524287"), wire="given",
        doc="""
        DALI's ``shuffle_after_epoch_seed`` (an int64): the seed of those
        permutations; ``None``, DALI's fixed default (524287). Every rank
        must pass the same.""")
    files: tuple[str, ...] = param("list of str", default=None, accepts="Optional[Sequence[str]]", doc="""
        DALI's ``files=``: the dataset's samples to read, in this order
        (the list DALI's readers shard and shuffle), each named by its
        path relative to the map's root or its absolute path under it
        (nnU-Net's k-fold lists, computed at run time). The daemon checks
        only these as the caller and refuses, at open, a name the map does
        not hold. Default: every sample of the dataset.""")
    file_list: Optional[str] = param("str", default=None, doc="""
        DALI's ``file_list=``: a text file of such names, one a line (read
        here, as the caller; a trailing integer label is dropped: the
        map's labels count). Not with ``files``.""")
    ext: tuple[str, ...] = param("str or list of str", default=None, check=_ext, accepts="Optional[Any]", doc="""
        WebDataset datasets: the components, one output each, as
        ``fn.readers.webdataset``'s ``ext`` (``"jpg;png"``: the first of
        the alternatives a sample has).""")
    missing_component_behavior: _args.MissingComponent = param(default="empty", choices=("empty", "skip", "error"),
        check=_named(_args.missing_arg), accepts="str", doc="""
        A sample lacking a component of ``ext``: an empty one, the sample
        left out, or refused when the session opens (as DALI's).""")
    case_sensitive_extensions: bool = param("bool", default=True, check=_flag, doc="""
        Whether ``ext`` matches member names' extensions case-sensitively.""")
    zero_copy: bool = param("bool", default=False, check=_flag, doc="""
        Outside DALI, read-only views of the batch memory, valid until
        ``release_after`` more batches were taken (the daemon then reads
        other samples into it), not copies valid while referenced. DALI
        gets views always (it copies them, or ``release_after`` covers its
        queues). GPU batches are never copied: outside DALI they need it.""")
    roi: Optional[ROI] = None
    stream: Union[int, str, None] = None

    @classmethod
    def check(cls, dataset: str, caller: str = "LoaderSource", /, **given: Any) -> SourceOptions:
        """The arguments checked: each by its declaration, then the rules
        that tie two together. Those not declared are DALI's reader
        arguments (``_daliargs``).

        Parameters
        ----------
        dataset : str
            The dataset's name.
        caller : str, optional
            Who was called, for the messages about DALI's arguments.
        **given
            ``LoaderSource``'s other arguments, by keyword.

        Returns
        -------
        SourceOptions
            The arguments, each in its range.

        Raises
        ------
        ValueError
            An argument out of its range or not among its choices, named
            with its range and the value given.
        TypeError
            ``cuda_stream`` is not a stream, a stream handle or
            ``"context"``; or a DALI argument nvfeed does not take.
        """
        given["dataset"] = dataset
        dali = {k: given.pop(k) for k in list(given) if k not in _PARAMS}
        roi = _daliargs.split(caller, dali)
        v: dict[str, Any] = {}
        for f in _PARAMS.values():
            value = given.get(f.name, f.default)
            check: Optional[Check] = f.metadata["check"]
            v[f.name] = value if check is None else check(f.name, value)
        # The rules that tie two arguments together.
        n = v["num_shards"]
        v["shard_id"] = _args.int_arg("shard_id", v["shard_id"], 0, n - 1, f" (num_shards is {n})")
        if v["shuffle_after_epoch"] and (v["random_shuffle"] or v["stick_to_shard"]):
            raise ValueError("shuffle_after_epoch cannot be true with random_shuffle or stick_to_shard (as in DALI): "
                             "it shuffles the whole list each epoch and keeps each rank's range of it")
        if v["cuda_stream"] is not None and v["device"] != "gpu":
            raise ValueError(f"cuda_stream is for device='gpu' (the consumer's GPU work on GPU batches), got it with "
                             f"device={v['device']!r}")
        stream = CONTEXT if v["cuda_stream"] == CONTEXT else stream_handle(v["cuda_stream"])
        if roi is not None and v["device"] != "cpu":
            raise ValueError(f"a region of interest (roi_*=) is read into host memory: device='cpu', got "
                             f"device={v['device']!r}")
        v["files"] = _args.files_arg(v["files"], v["file_list"])
        return cls(**v, roi=roi, stream=stream)

    @property
    def reader_args(self) -> dict[str, object]:
        """DALI's reader arguments, as the open request carries them."""
        req = self.open_request()
        return {k: req[k] for k in _READER if k in req}  # type: ignore[literal-required]

    def open_request(self) -> OpenRequest:
        """The session's open request (without ``device_uuid``, which
        needs this process's CUDA driver).

        Returns
        -------
        OpenRequest
            The request, optional keys only where given.
        """
        req: dict[str, Any] = {}
        for f in _PARAMS.values():
            value, wire = getattr(self, f.name), f.metadata["wire"]
            if wire == "always" or (wire == "given" and value is not None) or (wire == "set" and value):
                req[f.name] = value
        req["memory"] = "gpu" if self.device == "gpu" else "pinned"
        if self.device == "gpu":
            req["gpu_path"] = self.gpu_path
        if self.files:
            req["files"] = list(self.files)
        if self.roi is not None:
            req["roi"] = self.roi
        if self.ext:
            req["ext"] = list(self.ext)
            req["missing_component_behavior"] = self.missing_component_behavior
            req["case_sensitive_extensions"] = self.case_sensitive_extensions
        return cast(OpenRequest, req)


_PARAMS = {f.name: f for f in dataclasses.fields(SourceOptions) if f.metadata.get("param")}
"""The declared arguments, in ``LoaderSource``'s order."""

_READER = ("batch_size", "shard_id", "num_shards", "random_shuffle", "seed", "pad_last_batch", "stick_to_shard",
           "initial_fill", "shuffle_after_epoch", "shuffle_after_epoch_seed")


def signature() -> inspect.Signature:
    """``LoaderSource.__init__``'s signature: ``self``, each declared
    argument with its default, and DALI's reader arguments."""
    kw = inspect.Parameter.POSITIONAL_OR_KEYWORD
    ps = [inspect.Parameter("self", kw)]
    for f in _PARAMS.values():
        ps.append(inspect.Parameter(f.name, kw, default=f.default if f.default is not _REQUIRED else
                                    inspect.Parameter.empty, annotation=f.metadata["accepts"] or f.type))
    ps.append(inspect.Parameter("dali_args", inspect.Parameter.VAR_KEYWORD, annotation="Any"))
    return inspect.Signature(ps, return_annotation="None")


def _entry(name: str) -> list[str]:
    """An argument's numpydoc entry, from its declaration."""
    f = _PARAMS[name]
    head = f"{f.name} : {f.metadata['kind']}"
    if f.default is not _REQUIRED:
        head += ", optional"
        if f.default is not None:
            shown = f'"{f.default}"' if isinstance(f.default, str) else repr(f.default)
            head += f", default = {shown}"
    return [head] + ["    " + line if line else "" for line in f.metadata["doc"].splitlines()]


def with_parameters(doc: str) -> str:
    """``doc`` with its declared arguments written in. A line
    ``{parameters}`` becomes the whole "Parameters" section of
    ``LoaderSource``; a line ``{name}``, that argument's entry.

    Parameters
    ----------
    doc : str
        A docstring, its placeholders on lines of their own.

    Returns
    -------
    str
        The docstring, each entry indented as its placeholder.
    """
    def fill(m: re.Match[str]) -> str:
        indent, name = m.group(1), m.group(2)
        lines = ["Parameters", "----------", *(x for n in _PARAMS for x in _entry(n))] if name == "parameters" \
            else _entry(name)
        return "\n".join(indent + line if line else "" for line in lines)
    return re.sub(r"^( *)\{(\w+)\}$", fill, doc, flags=re.MULTILINE)
