# SPDX-License-Identifier: Apache-2.0
"""``nvfeed.dali.reader``: loaderd's batches in a DALI pipeline where
``fn.readers.file`` stood, with what DALI's iterators ask of a reader.

::

    # jpegs, labels = fn.readers.file(file_root=root, shard_id=rank, num_shards=world,
    #                                 random_shuffle=True, pad_last_batch=True, name="Reader")
    jpegs, labels = nvfeed.dali.reader("imagenet", shard_id=rank, num_shards=world,
                                       random_shuffle=True, pad_last_batch=True, name="Reader")

    it = DALIClassificationIterator(pipe, reader_name="Reader", last_batch_policy=LastBatchPolicy.PARTIAL)

The reader answers ``pipe.reader_meta(name)`` as ``fn.readers.file``
does, so ``DALIGenericIterator``/``DALIClassificationIterator`` (and
DALI's other framework iterators) size each epoch of the rank's shard and
drop the padding of its last batch, uneven and rotating shards included.
It reads ``fn.readers.file``'s samples in its order (``shuffle="dali"``)
and takes the seed such a reader would take from the pipeline, so the
batches, and the random augmentations after them, are the reader's.

Over a numpy dataset (``mkbmap --reader numpy``) it stands where
``fn.readers.numpy`` stood, and returns one output, the arrays, as that
reader does::

    # volumes = fn.readers.numpy(file_root=root, shard_id=rank, num_shards=world, name="Reader")
    volumes = nvfeed.dali.reader("volumes", shard_id=rank, num_shards=world, name="Reader")

Needs DALI in this process (``import nvfeed`` does not).
"""

from __future__ import annotations

import importlib
import secrets
import warnings
import weakref
from typing import Any, Optional

from ._api import datasets
from ._connect import socket_path
from ._errors import NotFoundError
from ._source import LoaderSource, Shuffle
from ._wire import DatasetInfo

try:  # DALI, untyped here: nothing of it is in this module's signatures
    _backend: Any = importlib.import_module("nvidia.dali.backend")
    _fn: Any = importlib.import_module("nvidia.dali.fn")
    _types: Any = importlib.import_module("nvidia.dali.types")
    _Pipeline: Any = importlib.import_module("nvidia.dali.pipeline").Pipeline
except ImportError as _e:  # pragma: no cover - the module's one requirement
    raise ImportError(f"nvfeed.dali needs DALI (nvidia.dali) in this process: {_e}") from _e

__all__ = ["reader", "reader_meta", "seed_for"]

_MAX_SEEDS = 1024
"""DALI's pipeline draws this many operator seeds from its own seed."""

_META = "_nvfeed_readers"  # the pipeline's attribute: reader name -> _Reader


def reader(dataset: str, *, name: Optional[str] = None, shard_id: int = 0, num_shards: int = 1,
           random_shuffle: bool = False, seed: Optional[int] = None, pad_last_batch: bool = False,
           stick_to_shard: bool = False, initial_fill: int = 1024, shuffle: Shuffle = "dali",
           **source_options: Any) -> Any:
    """``fn.readers.file``'s place in a pipeline definition: the samples
    (1-D uint8, encoded files) and labels (int32, shape (1,)) of this
    rank's shard of ``dataset``, read by loaderd. Over a numpy dataset,
    ``fn.readers.numpy``'s place: one output, the arrays (each sample its
    file's dtype and shape).

    Call it where the pipeline is defined (a ``@pipeline_def`` function,
    ``define_graph``, or under ``with pipe:``); the batch size is the
    pipeline's. The arguments shared with ``fn.readers.file`` mean what
    they mean there, so swapping the reader's line for this one changes no
    sample of a training run. The session opens when the pipeline first
    needs it (the first batch, or an iterator asking ``reader_meta``), and
    closes with the pipeline; the dataset's kind (and a numpy dataset's
    dtype) is asked of the daemon here (``datasets()``), so the daemon must
    be running when the pipeline is defined.

    Parameters
    ----------
    dataset : str
        The dataset's name, as registered with ``loaderd serve --dataset``
        (in place of the reader's ``file_root``).
    name : str, optional
        The reader's name (not an operator's: DALI names no external source
        of two outputs). With a name, ``pipe.reader_meta(name)``
        answers as the reader's would, and DALI's iterators take
        ``reader_name=name``: the shard's size every epoch, its padding
        dropped with ``LastBatchPolicy.PARTIAL``. That needs
        ``pad_last_batch=True`` (as DALI's examples set it): the reader's
        unpadded batches run across the epoch boundary, which a source
        whose epochs end does not do, so ``reader_meta`` refuses a reader
        without it, saying so.
    shard_id : int, optional, default = 0
        This rank's shard, in ``[0, num_shards)``.
    num_shards : int, optional, default = 1
        The number of shards (ranks).
    random_shuffle : bool, optional, default = False
        Shuffle every epoch, as ``shuffle`` says.
    seed : int, optional
        The shuffle's seed. Without it, the seed ``fn.readers.file`` would
        take at this place in the pipeline, derived from the pipeline's
        ``seed`` (``seed_for``); and the reader's place in the pipeline's
        sequence of operator seeds is kept (by a one-value
        ``fn.random.uniform``), so every random operator after it draws as
        it did with the reader. A pipeline without a ``seed`` draws one at
        random, as DALI's does.
    pad_last_batch : bool, optional, default = False
        Pad every shard to the same length, and to whole batches, by
        repeating its last sample, as DALI does.
    stick_to_shard : bool, optional, default = False
        Read the same shard every epoch (else shard ``(shard_id + epoch) %
        num_shards``).
    initial_fill : int, optional, default = 1024
        The ``"dali"`` shuffle's buffer, in samples (``fn.readers.file``'s
        ``initial_fill``).
    shuffle : {"dali", "permute"}, optional, default = "dali"
        ``"dali"``: ``fn.readers.file(random_shuffle=True)``'s order,
        sample for sample (the default here, unlike ``LoaderSource``'s:
        this function stands for the reader). ``"permute"``: a global
        permutation every epoch (``LoaderSource``); every rank must then
        pass the same ``seed``.
    **source_options
        ``LoaderSource``'s other arguments: ``socket``, ``backend``,
        ``backend_options``, ``prefetch_queue_depth``, ``release_after``,
        ``timeout``, ``on_error``, ``transport``, ``reconnect_timeout``,
        ``batch_format`` (default ``"dali"``). Host batches only.

    Returns
    -------
    tuple of DataNode, or DataNode
        A file dataset: the samples and the labels, as ``fn.readers.file``
        returns them. A numpy dataset: one ``DataNode``, the arrays (of the
        dataset's dtype), as ``fn.readers.numpy`` returns them.

    Raises
    ------
    RuntimeError
        Called outside a pipeline definition.
    TypeError
        An argument ``LoaderSource`` does not take (``batch_size``, which
        is the pipeline's, included), or ``device``; a numpy dataset of a
        dtype DALI has no type for (complex).
    NotFoundError
        The daemon serves no dataset of that name (the message lists those
        it serves).
    DaemonNotRunningError
        No daemon listens on the socket.
    """
    pipe = _Pipeline.current()
    if pipe is None:
        raise RuntimeError("nvfeed.dali.reader: call it where a pipeline is defined (a @pipeline_def function, "
                           "define_graph, or under `with pipe:`), as fn.readers.file")
    for bad in ("batch_size", "device", "device_id", "gpu_path", "state"):
        if bad in source_options:
            why = {"batch_size": "it is the pipeline's", "state": "resume with DALI's checkpointing"}.get(
                bad, "it reads host batches, as fn.readers.file; decode with device='mixed'")
            raise TypeError(f"nvfeed.dali.reader: no argument {bad!r} ({why})")
    if name is not None and name in pipe.__dict__.get(_META, {}):
        raise ValueError(f"nvfeed.dali.reader: a reader named {name!r} is already in this pipeline")
    source_options.setdefault("batch_format", "dali")
    info = _dataset(dataset, source_options)
    args = dict(batch_size=pipe.max_batch_size, shard_id=shard_id, num_shards=num_shards,
                random_shuffle=random_shuffle, pad_last_batch=pad_last_batch, stick_to_shard=stick_to_shard,
                initial_fill=initial_fill, shuffle=shuffle)
    numpy = info.get("reader") == "numpy"
    dtype = _dali_type(dataset, info.get("dtype", "")) if numpy else None
    rd = _Reader(pipe, dataset, name, args, seed, source_options)
    weakref.finalize(pipe, rd.close)
    if numpy:
        return _numpy_output(pipe, name, rd, seed, dtype)
    jpegs, labels = _fn.external_source(source=rd, num_outputs=2, batch=True, batch_info=True, no_copy=True,
                                        dtype=[_types.UINT8, _types.INT32])
    if seed is None and _slot_per_seeded_op():
        # fn.readers.file without a seed takes the pipeline's next operator
        # seed; fn.external_source takes none. A one-value uniform right
        # after the source (an argument of pass-through reshapes of both
        # outputs, so it follows the source in DALI's graph order whichever
        # output is reached first) takes it instead: the operators after
        # keep their seeds, and its place says which seed the reader had.
        one = _fn.random.uniform(values=[1.0], shape=[1])
        rd.marker = one.source
        jpegs = _fn.reshape(jpegs, rel_shape=one)
        labels = _fn.reshape(labels, rel_shape=one)
    else:
        rd.marker = jpegs.source
    if name is not None:
        _register(pipe, name, rd)
    return jpegs, labels


_DALI_TYPES = {"|b1": "BOOL", "|i1": "INT8", "<i2": "INT16", "<i4": "INT32", "<i8": "INT64", "|u1": "UINT8",
               "<u2": "UINT16", "<u4": "UINT32", "<u8": "UINT64", "<f2": "FLOAT16", "<f4": "FLOAT", "<f8": "FLOAT64"}
"""DALI's type of each .npy descr the daemon serves (complex has none)."""


def _dataset(dataset: str, options: dict[str, Any]) -> DatasetInfo:
    """The daemon's description of dataset (GET /v1/datasets)."""
    sock = socket_path(options.get("socket"))
    served = datasets(sock, float(options.get("timeout", 60.0)))
    for d in served:
        if d["name"] == dataset:
            return d
    raise NotFoundError(f"nvfeed.dali.reader: loaderd at {sock} serves no dataset {dataset!r} (it serves: "
                        f"{', '.join(d['name'] for d in served) or 'none'})")


def _dali_type(dataset: str, descr: str) -> Any:
    """DALI's type for a numpy dataset's dtype."""
    name = _DALI_TYPES.get(descr)
    if name is None:
        raise TypeError(f"nvfeed.dali.reader: numpy dataset {dataset!r} holds arrays of dtype {descr or 'unknown'}, "
                        "for which DALI has no type (as fn.readers.numpy has none)")
    return getattr(_types, name)


def _numpy_output(pipe: Any, name: Optional[str], rd: _Reader, seed: Optional[int], dtype: Any) -> Any:
    """The one output of a reader over a numpy dataset: an external source
    of the arrays (one TensorListCPU a batch), in fn.readers.numpy's place
    in the pipeline's sequence of operator seeds as reader does it for
    fn.readers.file."""
    data = _fn.external_source(source=rd, batch=True, batch_info=True, no_copy=True, dtype=dtype)
    if seed is None and _slot_per_seeded_op():
        # As for the two outputs of fn.readers.file: a one-value uniform
        # right after the source takes the seed the reader would have. Its
        # pass-through here is a reshape of the arrays to their own shapes
        # times one: any number of dimensions, 0-d arrays included.
        one = _fn.random.uniform(values=[1.0], shape=[1])
        rd.marker = one.source
        shape = data.shape() if callable(getattr(data, "shape", None)) else _fn.shapes(data)
        data = _fn.reshape(data, shape=shape * _fn.cast(one, dtype=_types.INT64))
    else:
        rd.marker = data.source
    if name is not None:
        _register(pipe, name, rd)
    return data


def reader_meta(src: LoaderSource) -> dict[str, int]:
    """What ``fn.readers.file`` with the source's sampling arguments gives
    as ``pipe.reader_meta(name)``: ``epoch_size``, ``epoch_size_padded``,
    ``number_of_shards``, ``shard_id``, ``pad_last_batch``,
    ``stick_to_shard`` (the flags as 0 or 1, as DALI gives them)."""
    s = src.state()["sampling"]
    n, shards = s["n"], s["num_shards"]
    return {"epoch_size": n, "epoch_size_padded": -(-n // shards) * shards if s["pad_last_batch"] else n,
            "number_of_shards": shards, "shard_id": s["shard_id"], "pad_last_batch": int(s["pad_last_batch"]),
            "stick_to_shard": int(s["stick_to_shard"])}


def seed_for(pipeline_seed: int, slot: int = 0) -> int:
    """The seed DALI gives the ``slot``-th operator (counting those that
    take a seed and were given none, in graph order) of a pipeline with
    ``seed=pipeline_seed``: ``std::seed_seq{seed}.generate`` of 1024 seeds,
    its entry ``slot``. ``fn.readers.file`` feeding a pipeline's first
    output is slot 0."""
    if not 0 <= slot < _MAX_SEEDS:
        raise ValueError(f"slot must be in [0, {_MAX_SEEDS}), got {slot}")
    return _seed_seq(pipeline_seed, _MAX_SEEDS)[slot]


def _seed_seq(seed: int, n: int) -> list[int]:
    """std::seed_seq{seed}.generate(n values), as the C++ standard
    ([rand.util.seedseq]) specifies it: 32-bit words."""
    m32 = 0xFFFFFFFF
    v = [seed & m32]
    s = len(v)
    b = [0x8B8B8B8B] * n
    t = 11 if n >= 623 else 7 if n >= 68 else 5 if n >= 39 else 3 if n >= 7 else (n - 1) // 2
    p = (n - t) // 2
    q = p + t
    m = max(s + 1, n)

    def mix(x: int) -> int:
        return x ^ (x >> 27)
    for k in range(m):
        r1 = 1664525 * mix(b[k % n] ^ b[(k + p) % n] ^ b[(k - 1) % n]) & m32
        r2 = (r1 + (s if k == 0 else k % n + v[k - 1] if k <= s else k % n)) & m32
        b[(k + p) % n] = (b[(k + p) % n] + r1) & m32
        b[(k + q) % n] = (b[(k + q) % n] + r2) & m32
        b[k % n] = r2
    for k in range(m, m + n):
        r3 = 1566083941 * mix((b[k % n] + b[(k + p) % n] + b[(k - 1) % n]) & m32) & m32
        r4 = (r3 - k % n) & m32
        b[(k + p) % n] ^= r3
        b[(k + q) % n] ^= r4
        b[k % n] = r4
    return b


def _slot_per_seeded_op() -> bool:
    """Whether this DALI gives seeds only to operators that take one (a
    reader does, an external source does not), so that the swap would
    move the seeds of the operators after it."""
    try:
        return bool(_backend.GetSchema("readers__File").HasRandomSeedArg()
                    and not _backend.GetSchema("ExternalSource").HasRandomSeedArg())
    except AttributeError:  # an older DALI: every operator takes the next seed
        return False


def _takes_seed(op: Any) -> bool:
    """Whether op, one of a built pipeline's operators, takes the next
    operator seed (it takes one and was given none)."""
    return bool(op._op.schema.HasRandomSeedArg()) and "seed" not in op._op._init_args


class _Reader:
    """The external source's callback: opens the LoaderSource when first
    needed (the pipeline is built by then, so the seed the reader would
    have had is known) and answers batches and reader_meta."""

    def __init__(self, pipe: Any, dataset: str, name: Optional[str], args: dict[str, Any], seed: Optional[int],
                 options: dict[str, Any]) -> None:
        self._pipe = weakref.ref(pipe)
        self._dataset, self._name, self._args, self._seed, self._options = dataset, name, args, seed, options
        self.marker: Any = None  # the operator at the reader's place in the graph's order
        self.src: Optional[LoaderSource] = None

    def __repr__(self) -> str:  # DALI names the source by it in its messages
        return f"nvfeed.dali.reader({self._dataset!r}, name={self._name!r})"

    def __call__(self, info: Any) -> Any:
        return self.source().batch(info)

    def source(self) -> LoaderSource:
        if self.src is None:
            pipe = self._pipe()
            seed = self._seed if self._seed is not None else self._pipeline_seed(pipe)
            _Pipeline.push_current(pipe)  # what LoaderSource learns from the pipeline it is in
            try:
                self.src = LoaderSource(self._dataset, seed=seed, **self._args, **self._options)
            finally:
                _Pipeline.pop_current()
        return self.src

    def _pipeline_seed(self, pipe: Any) -> int:
        """The seed fn.readers.file would have taken here."""
        if pipe is None or pipe.seed is None:
            return secrets.randbits(32)  # DALI's pipeline drew its seed at random too
        slot = 0
        try:
            for op in pipe._ops:
                if op is self.marker:
                    break
                slot += _takes_seed(op)
        except (AttributeError, TypeError) as e:
            warnings.warn(f"nvfeed.dali.reader: cannot tell this reader's place among the pipeline's seeded "
                          f"operators ({e!r}); taking the first seed. Pass seed= to this reader and to "
                          "fn.readers.file to compare them", RuntimeWarning, stacklevel=3)
            slot = 0
        return seed_for(int(pipe.seed), slot % _MAX_SEEDS)

    def meta(self) -> dict[str, int]:
        if not self._args["pad_last_batch"]:
            raise ValueError(
                f"nvfeed.dali.reader {self._name!r}: DALI's iterators with reader_name need pad_last_batch=True "
                "on this reader. Without it fn.readers.file completes an epoch's last batch with the next "
                "epoch's samples, and the iterator takes only whole batches; this reader ends each epoch with a "
                "partial batch instead. Pass pad_last_batch=True (DALI's examples do) and "
                "last_batch_policy=LastBatchPolicy.PARTIAL to drop the padding, or leave reader_name out "
                "(the iterator then reads each epoch to its end, partial batch included)")
        return reader_meta(self.source())

    def close(self) -> None:
        if self.src is not None:
            self.src.close()
            self.src = None


def _register(pipe: Any, name: str, rd: _Reader) -> None:
    """Makes pipe.reader_meta(name) answer for rd; the pipeline's own
    readers answer as before."""
    readers: Optional[dict[str, _Reader]] = pipe.__dict__.get(_META)
    if readers is None:
        readers = {}
        setattr(pipe, _META, readers)
        pipe.reader_meta = _ReaderMeta(pipe)
    readers[name] = rd


class _ReaderMeta:
    """A pipeline's reader_meta with this module's readers in it. It holds
    the pipeline weakly: the pipeline that holds it goes (and closes its
    readers) when its last user lets go, not at the next garbage
    collection."""

    def __init__(self, pipe: Any) -> None:
        self._pipe = weakref.ref(pipe)
        self._own = type(pipe).reader_meta
        self.__doc__ = self._own.__doc__

    def __call__(self, name: Optional[str] = None) -> Any:
        pipe = self._pipe()
        mine: dict[str, _Reader] = pipe.__dict__[_META]
        if name is not None:
            return mine[name].meta() if name in mine else self._own(pipe, name)
        out = dict(self._own(pipe))
        out.update({n: reader_meta(r.source()) for n, r in mine.items()})
        return out
