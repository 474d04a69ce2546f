# SPDX-License-Identifier: Apache-2.0
"""``LoaderSource``: one shard of a dataset as batches for DALI's
``fn.external_source``, read by loaderd into batch memory this process
maps. It owns its parts: the checked arguments (``_options``), the
session and its transport (``_session``, ``_transport``). It makes the
batches with the views (``_views``)."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Generic, Optional, Sequence, TypeVar, Union, cast

import numpy as np

from . import _args, _dalicpt, _depth, _options, _ranks, _views, _wds
from ._errors import DriftError, LoaderError, SampleError
from ._lifetime import Lifetime, own
from ._options import BatchFormat, Device, GPUPath, OnError, Shuffle, SourceOptions, Transport
from ._pair import BatchHalves, Position, batch_position
from ._session import Session
from ._version import DaemonVersion
from ._views import Array, Batch, DaliBatch, DaliTypes, Sample, Tensors
from ._wds import Components, MissingComponent
from ._wdsskip import tell
from ._wire import MemoryDesc, NextResponse, State

__all__ = ["LoaderSource", "MAX_INITIAL_FILL", "Array", "Batch", "BatchFormat", "Components", "DaliBatch", "Device",
           "GPUPath", "MissingComponent", "OnError", "Sample", "Shuffle", "Tensors", "Transport"]

MAX_INITIAL_FILL = _args.MAX_INITIAL_FILL
"""The largest ``initial_fill`` (the daemon's bound too)."""


T = TypeVar("T")


class _Opened(Generic[T]):
    """A source's attribute that its session's open answered: read from
    the session, the one place it is set."""

    def __init__(self, doc: str) -> None:
        self.__doc__ = doc
        self._name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, src: Optional[LoaderSource], owner: Optional[type] = None) -> T:
        if src is None:
            return cast(T, self)
        return cast(T, getattr(src._session, self._name))


class LoaderSource:
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

    {parameters}
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

    if TYPE_CHECKING:  # SourceOptions' arguments for type checkers; their defaults are its (test_options)
        def __init__(self, dataset: str, socket: Optional[str] = ..., batch_size: int = ..., shard_id: int = ...,
                     num_shards: int = ..., random_shuffle: bool = ..., seed: int = ..., pad_last_batch: bool = ...,
                     stick_to_shard: bool = ..., shuffle: Shuffle = ..., initial_fill: int = ...,
                     backend: Optional[str] = ..., backend_options: Optional[dict[str, Any]] = ...,
                     prefetch_queue_depth: Optional[int] = ..., release_after: Optional[int] = ...,
                     state: Optional[State] = ..., timeout: float = ..., on_error: OnError = ...,
                     transport: Transport = ..., device: Device = ..., device_id: int = ..., gpu_path: GPUPath = ...,
                     reconnect_timeout: float = ..., batch_format: BatchFormat = ..., cuda_stream: object = ...,
                     job_id: Optional[str] = ..., fingerprint: Optional[str] = ..., process_group: Any = ...,
                     check_ranks: bool = ..., shuffle_after_epoch: bool = ...,
                     shuffle_after_epoch_seed: Optional[int] = ..., files: Optional[Sequence[str]] = ...,
                     file_list: Optional[str] = ..., ext: Optional[Any] = ..., missing_component_behavior: str = ...,
                     case_sensitive_extensions: bool = ..., zero_copy: bool = ..., **dali_args: Any) -> None: ...
    else:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            # Positional arguments in the declared order, as before the
            # options were declared (README: LoaderSource(dataset, socket,
            # batch_size, shard_id, ...)).
            try:
                bound = _SIGNATURE.bind(self, *args, **kwargs).arguments
            except TypeError as e:
                raise TypeError(f"LoaderSource: {e}") from None
            options = {k: v for k, v in bound.items() if k not in ("self", "dataset", "dali_args")}
            options.update(bound.get("dali_args", {}))
            self._check(bound["dataset"], options)

    def _check(self, dataset: str, options: dict[str, Any]) -> None:
        """Checks the arguments (``SourceOptions``) and opens the session."""
        try:
            o = SourceOptions.check(dataset, **options)
        except Exception as e:
            # The other ranks wait for this one's comparison: tell them.
            peers = _ranks.peers(options.get("num_shards", 1), options.get("process_group"),
                                 options.get("check_ranks", True) is not False)
            if peers is not None:
                peers.fail(e)
            raise
        self._start(o)

    @classmethod
    def of(cls, o: SourceOptions) -> LoaderSource:
        """A source of options already checked (``nvfeed.dali.reader``'s).

        Parameters
        ----------
        o : SourceOptions
            The arguments, checked.

        Returns
        -------
        LoaderSource
            The source, its session open.
        """
        src = cls.__new__(cls)
        src._start(o)
        return src

    def _start(self, o: SourceOptions) -> None:
        """Opens the session of ``o``. A sharded source under
        torch.distributed is compared with the other ranks'. A rank whose
        open fails tells them so, rather than leave them waiting."""
        peers = _ranks.peers(o.num_shards, o.process_group, o.check_ranks)
        self.options = o
        """The arguments, checked (``SourceOptions``)."""
        self._dtypes: dict[str, np.dtype[Any]] = {}  # a numpy dataset's dtype by descr
        self._halves = BatchHalves()
        self._last: Optional[Position] = None  # the position of the batch returned last
        self.last_indices: list[int] = []
        """The dataset's sample indices of the batch returned last, in order."""
        self._lifetime = Lifetime(o.zero_copy)  # views or copies
        self._dali_looked = False  # the DALI pipeline fed was looked for (release_after)
        self.keep: Optional[int] = None
        """Hand out only the first ``keep`` samples of the next batch (the
        rest is padding: ``nvfeed.torch``'s last-batch policy); ``None``: all."""
        self.dali_checkpoint = True
        """Whether the source adds itself to the checkpoints of the DALI
        pipeline it feeds (``nvfeed.dali.reader``'s does not: the reader does)."""
        self.skipped_samples = 0
        """Samples left out of batches with ``on_error="skip"``."""
        self._skip_told = -1  # the last epoch whose webdataset skip was warned of (_wdsskip)
        try:
            self._session = Session(o, DaliTypes() if o.batch_format == "dali" else None)
        except Exception as e:
            if peers is not None:
                peers.fail(e)
            raise
        if peers is not None:
            try:
                req = self._session.request
                peers.compare(o.dataset, self.fingerprint, req["shard_id"], cast(dict[str, Any], req), self._session.content)
            except LoaderError:
                self.close()
                raise

    backend = _Opened[str]("""The backend that reads for this source (the daemon's default filled in).""")
    backend_why = _Opened[str]("""Why that backend when none was named: the fastest the dataset allows
        (raw reads, ``gds``, from a block device's map; else ``file``); "" when named.""")
    gpu_path = _Opened[str]("""For GPU batches, the path that runs: "cufile" or "bounce"; else "".""")
    prefetch_queue_depth = _Opened[int]("""Batches the daemon reads ahead.""")
    fingerprint = _Opened[str]("""The dataset's fingerprint: 32 hex digits naming its samples (paths,
        labels, sizes), the same on every node holding the same files.""")
    reader = _Opened[str]("""The DALI reader whose samples the dataset holds: ``"file"``
        (encoded files: each batch is its samples and labels) or
        ``"numpy"`` (``.npy`` arrays: each batch is the arrays alone).""")
    components = _Opened[int]("""WebDataset: the outputs of a sample (``len(ext)``); 0 otherwise.""")
    skipped_at_open = _Opened[tuple[int, tuple[int, ...]]]("""WebDataset with ``missing_component_behavior="skip"``:
        the samples left out every epoch, and how many lack each ``ext`` entry.""")
    memory = _Opened[MemoryDesc]("""The session's batch memory: kind, size, slot size, slots, device.""")
    daemon = _Opened[DaemonVersion]("""The daemon's version (release, protocol, features).""")

    @property
    def next_position(self) -> Optional[Position]:
        """(epoch, iteration) of the next batch this source returns."""
        return self._session.expect

    @property
    def opened_state(self) -> State:
        """The state at open: the sampling, and the first batch's position."""
        return self._session.state0

    def state(self) -> State:
        """The position of the next batch this source will produce; pass it
        as ``state=`` to resume the iterator form. A source that feeds a
        DALI pipeline has none that is exact (DALI prefetches): resume it
        with DALI's checkpointing (``source=src.batch, batch_info=True``,
        ``enable_checkpointing=True``, ``pipe.checkpoint()``).

        Returns
        -------
        State
            The sampling and the position, for ``LoaderSource(state=...)``.

        Raises
        ------
        LoaderError
            The source feeds a DALI pipeline.
        """
        if self._lifetime.dali:
            raise LoaderError(f"LoaderSource({self.options.dataset!r}).state(): this source feeds a DALI pipeline, "
                              "which prefetches: the state would be ahead of the loop by the batches DALI holds. "
                              "Resume with DALI's checkpointing (source=src.batch, batch_info=True, "
                              "enable_checkpointing=True, pipe.checkpoint())")
        return self._session.state()

    def __len__(self) -> int:
        """Batches in the current epoch for this shard."""
        return self._session.epoch_batches

    def __enter__(self) -> LoaderSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Ends the session. Batches handed out stay readable: GPU memory is
        unmapped now when no ``CudaArray`` of it lives, else when the last
        one dies (or at interpreter exit), after the device's queued work.

        Raises
        ------
        CudaError
            Unmapping GPU memory or closing the fence failed (the call
            named), after the rest of the cleanup.
        """
        self._halves.clear()  # before GPU memory is unmapped
        self._session.close()

    def __iter__(self) -> LoaderSource:
        # DALI calls iter() on an iterable source while it builds the
        # pipeline's graph: the pipeline is current then.
        self._fit_pipeline(frames=False)
        if self._last is not None and self._session.expect == (self._last[0], len(self)) and len(self):
            raise DriftError(f"LoaderSource({self.options.dataset!r}) iterated anew with every batch of epoch "
                             f"{self._last[0]} taken but not its end: this pass would be that end alone. zip() of two "
                             "sources leaves the second there when the first ends, and from then on pairs a batch "
                             "with its twin's predecessor; read datasets that pair with nvfeed.PairedSource, or take "
                             "the end with one more next() (StopIteration)")
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
        self._dali_looked = self._lifetime.dali = True
        if frames and self.dali_checkpoint and _dalicpt.checkpointing(pipe):
            _dalicpt.restore_source(pipe, self)
        s = self._session
        given = s.request["release_after"] if self.options.release_after is not None else None
        n = _depth.release_after_for(pipe, s.release_after, given)
        if n is not None and s.id is not None and s.expect is not None:
            s.reopen(n)

    @property
    def zero_copy(self) -> bool:
        """Batches read outside DALI view the batch memory (see ``LoaderSource``)."""
        return self._lifetime.zero_copy

    @property
    def position(self) -> Optional[Position]:
        """(epoch, iteration) of the batch returned last; None before the first."""
        return self._last

    def __next__(self) -> Union[Batch, DaliBatch, Tensors, Components]:
        return self.fetch(None)

    def batch(self, info: Any) -> Union[Batch, DaliBatch, Tensors, Components]:
        """Batch ``info.iteration`` of epoch ``info.epoch_idx``: for
        ``fn.external_source(source=src.batch, batch=True, batch_info=True)``,
        which gives DALI's ``BatchInfo``. Raises ``StopIteration`` past the
        epoch's last batch. As the batch is a pure function of (epoch,
        iteration), a pipeline built with ``enable_checkpointing=True``
        resumes exactly from ``pipe.checkpoint()``: DALI asks again for the
        batches it had prefetched. Asking in order costs no extra read.
        (Pass the bound method: DALI iterates any iterable source and ignores
        ``batch_info`` for it.)

        Parameters
        ----------
        info : nvidia.dali.types.BatchInfo
            The batch DALI asks for (``epoch_idx``, ``iteration``).

        Returns
        -------
        Batch, DaliBatch, Tensors or Components
            The batch, as ``next()`` gives it.
        """
        return self.fetch((int(info.epoch_idx), int(info.iteration)))

    def fetch(self, at: Optional[Position]) -> Union[Batch, DaliBatch, Tensors, Components]:
        """The batch at ``at`` (epoch, iteration), or the next one.

        Parameters
        ----------
        at : tuple of int, optional
            The batch wanted; None for the next one.

        Returns
        -------
        Batch, DaliBatch, Tensors or Components
            The batch, as ``next()`` gives it.
        """
        s = self._session
        if s.id is None:
            raise LoaderError("LoaderSource is closed")
        if not self._dali_looked:
            self._fit_pipeline(frames=True)  # a callable source (src.batch): DALI is among the callers
        copy = self._lifetime.copies(s.gpu is not None, self.options.dataset)
        r = s.deliver(at)
        s.epoch_batches = r["epoch_batches"]
        if r["end_of_epoch"]:
            s.expect = (r["epoch"], 0)
            raise StopIteration
        k = s.components  # the session's answers, read once a batch (not through _Opened)
        if self.keep is not None and self.keep < _wds.count_samples(k, r["offsets"]):
            r = _views.prefix(r, self.keep, k or 1)
        if at is not None and (r["epoch"], r["iteration"]) != at:
            s.transport.drop()
            raise LoaderError(f"loaderd: sent epoch {r['epoch']} batch {r['iteration']}, asked for {at}")
        s.expect = (r["epoch"], r["iteration"] + 1)
        self._last = (r["epoch"], r["iteration"])
        if s.skipped_at_open[0] and r["iteration"] == 0 and r["epoch"] != self._skip_told:
            self._skip_told = r["epoch"]
            tell(self.options.dataset, r["epoch"], self.options.ext, s.skipped_at_open)
        failed = r.get("failed") or []
        if failed and (self.options.on_error == "raise" or len(failed) == _wds.count_samples(k, r["offsets"])):
            s.give_back(r["slot"])
            raise SampleError(r["epoch"], r["iteration"], failed, r.get("errors") or [])
        self.last_indices = r.get("indices") or []
        m = s.mapped
        if copy:  # the batch's own memory: its slot goes back with the next request
            m, r = own(m, r)
            s.give_back(r["slot"])
        else:
            s.hold(r["slot"])
        if k:
            keep = self._skip(r, failed) if failed else None
            return _wds.outputs(m, k, r["offsets"], r["lengths"], keep)
        offsets, lengths, lbls = r["offsets"], r["lengths"], r["labels"]
        if s.reader == "numpy":
            return self._tensors(m, r, failed)
        if not failed:  # the common case: every sample, no index juggling
            return _views.batch(m, offsets, lengths, np.array(lbls, dtype=np.int32).reshape(-1, 1))
        keep = self._skip(r, failed)
        labels = np.asarray([lbls[i] for i in keep], dtype=np.int32).reshape(-1, 1)
        return _views.batch(m, [offsets[i] for i in keep], [lengths[i] for i in keep], labels)

    def _skip(self, r: NextResponse, failed: list[int], stacklevel: int = 4) -> list[int]:
        """The positions of the samples that were read (on_error="skip"),
        the failed ones counted and warned of (the warning points
        stacklevel frames up: at the caller of next())."""
        bad = set(failed)
        keep = [i for i in range(_wds.count_samples(self.components, r["offsets"])) if i not in bad]
        self.skipped_samples += len(failed)
        warnings.warn(f"LoaderSource: epoch {r['epoch']} batch {r['iteration']}: skipped {len(failed)} sample(s) "
                      "that could not be read: " + "; ".join(r.get("errors") or []), RuntimeWarning, stacklevel=stacklevel)
        return keep

    def _tensors(self, m: _views.Mapped, r: NextResponse, failed: list[int]) -> Union[Tensors, Any]:
        """A numpy dataset's batch (``_views.tensors``) in the memory ``m``
        (the session's, or the batch's copy), its failed samples skipped."""
        descr, shapes = r.get("dtype"), r.get("shapes")
        offsets, lengths = r["offsets"], r["lengths"]
        if descr is None or shapes is None or len(shapes) != len(offsets):
            raise LoaderError(f"loaderd: epoch {r['epoch']} batch {r['iteration']} of numpy dataset "
                              f"{self.options.dataset} came without a dtype and one shape per sample")
        dt = self._dtypes.get(descr)
        if dt is None:
            dt = self._dtypes[descr] = _views.tensor_dtype(descr)
        if failed:
            keep = self._skip(r, failed, stacklevel=5)
            offsets, lengths, shapes = [offsets[i] for i in keep], [lengths[i] for i in keep], [shapes[i] for i in keep]
        return _views.tensors(m, f"epoch {r['epoch']} batch {r['iteration']}", dt, offsets, lengths,
                              shapes, whole=not failed, dataset=self.options.dataset)

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

        A numpy or WebDataset dataset has no labels: ``samples`` is then the
        whole batch (the arrays, or the components), the next one at every call (or the one ``info``
        names), as ``next()`` and ``batch`` give it, for one external
        source; ``labels`` raises.

        Parameters
        ----------
        info : BatchInfo or int, optional
            DALI's ``BatchInfo`` (``batch_info=True``), or nothing (or
            the iteration number DALI passes) for the next batch.

        Returns
        -------
        Any
            The samples, in this source's batch_format.
        """
        if self.reader == "numpy" or self.components:
            return self.fetch(batch_position(info))
        return self._halves.take(0, info, self._fetch_half)

    def labels(self, info: Any = None) -> Any:
        """The labels (int32, shape (1,) a sample; a ``TensorListCPU`` with
        ``batch_format="dali"``, else a numpy array of shape (batch, 1)) of
        the batch whose samples ``samples`` hands out, for a second
        ``fn.external_source(source=src.labels, device="cpu")``; see
        ``samples``. A numpy dataset has none: ``LoaderError``.

        Parameters
        ----------
        info : BatchInfo or int, optional
            As ``samples`` takes it.

        Returns
        -------
        Any
            The labels, in this source's batch_format.
        """
        if self.reader == "numpy" or self.components:
            what = "WebDataset samples (a label is a component: name its ext)" if self.components else "numpy arrays"
            raise LoaderError(f"LoaderSource: dataset {self.options.dataset} holds {what}, without labels: feed "
                              "the source itself (or src.samples) to one fn.external_source")
        return self._halves.take(1, info, self._fetch_half)

    def _fetch_half(self, at: Optional[Position]) -> tuple[Position, Any, Any]:
        samples, labels = cast(tuple[Any, Any], self.fetch(at))
        return cast(Position, self._last), samples, labels


_SIGNATURE = _options.signature()
LoaderSource.__init__.__signature__ = _SIGNATURE  # type: ignore[attr-defined]
LoaderSource.__doc__ = _options.with_parameters(LoaderSource.__doc__ or "")
