# SPDX-License-Identifier: Apache-2.0
"""``nvfeed.dali.reader``: loaderd's batches in a DALI pipeline where
``fn.readers.file`` stood, with what DALI's iterators ask of a reader.

::

    # jpegs, labels = fn.readers.file(file_root=root, shard_id=rank, num_shards=world,
    #                                 random_shuffle=True, pad_last_batch=True, name="Reader")
    jpegs, labels = nvfeed.dali.reader("imagenet", shard_id=rank, num_shards=world,
                                       random_shuffle=True, pad_last_batch=True, name="Reader")

    it = DALIClassificationIterator(pipe, reader_name="Reader", last_batch_policy=LastBatchPolicy.PARTIAL)

As ``fn.readers.file``, it goes on from epoch to epoch (``pipe.run()``
never raises ``StopIteration``), and answers ``pipe.reader_meta(name)``
and ``pipe.epoch_size(name)`` as that reader does, so
``DALIGenericIterator``/``DALIClassificationIterator`` (and DALI's other
framework iterators) size each epoch of the rank's shard and drop the
padding of its last batch, uneven and rotating shards included, under
each ``last_batch_policy``, with or without ``reader_name``.
It reads ``fn.readers.file``'s samples in its order (``shuffle="dali"``)
and takes the seed such a reader would take from the pipeline, so the
batches, and the random augmentations after them, are the reader's.

Over a numpy dataset (``mkbmap --reader numpy``) it stands where
``fn.readers.numpy`` stood, and returns one output, the arrays, as that
reader does::

    # volumes = fn.readers.numpy(file_root=root, shard_id=rank, num_shards=world, name="Reader")
    volumes = nvfeed.dali.reader("volumes", shard_id=rank, num_shards=world, name="Reader")

DALI's ``ops`` form has its counterpart, ``nvfeed.dali.ops.readers.Numpy``
and ``.File``: made with the arguments (in a pipeline's ``__init__``),
called in ``define_graph``::

    # self.input_x = ops.readers.Numpy(files=imgs, shard_id=rank, num_shards=world, shuffle_after_epoch=True)
    self.input_x = nvfeed.dali.ops.readers.Numpy("images", files=imgs, shard_id=rank, num_shards=world,
                                                 shuffle_after_epoch=True)
    ...
    img = self.input_x(name="ReaderX")

Over a WebDataset dataset (``mkbmap --reader webdataset``: tar shards)
it stands where ``fn.readers.webdataset`` stood, one output per ``ext``
entry, the samples and their order that reader's (``shuffle="dali"``)::

    # jpegs, labels = fn.readers.webdataset(paths=tars, ext=["jpg", "cls"], random_shuffle=True, name="Reader")
    jpegs, labels = nvfeed.dali.reader("laion", ext=["jpg", "cls"], random_shuffle=True, name="Reader")

Needs DALI in this process (``import nvfeed`` does not).
"""

from __future__ import annotations

import importlib
import weakref
from typing import Any, Optional

from ._api import datasets
from ._dalireader import META, Reader as _Reader, reader_meta as reader_meta, register as _register
from ._errors import NotFoundError
from ._seeds import seed_for as seed_for
from ._options import Shuffle, SourceOptions, with_parameters
from ._options import SourceOptions as _D  # the defaults, declared once
from ._wire import DatasetInfo

try:  # DALI, untyped here: nothing of it is in this module's signatures
    _backend: Any = importlib.import_module("nvidia.dali.backend")
    _fn: Any = importlib.import_module("nvidia.dali.fn")
    _types: Any = importlib.import_module("nvidia.dali.types")
    _Pipeline: Any = importlib.import_module("nvidia.dali.pipeline").Pipeline
except ImportError as _e:  # pragma: no cover - the module's one requirement
    raise ImportError(f"nvfeed.dali needs DALI (nvidia.dali) in this process: {_e}") from _e

from . import _dalinumpy, _daliwds  # noqa: E402 - import DALI, checked above
from ._daliops import ops as ops  # noqa: E402 - DALI's ops form, checked above

__all__ = ["ops", "reader", "reader_meta", "seed_for"]

def reader(dataset: str, *, name: Optional[str] = None, shard_id: int = _D.shard_id, num_shards: int = _D.num_shards,
           random_shuffle: bool = _D.random_shuffle, seed: Optional[int] = None,
           pad_last_batch: bool = _D.pad_last_batch,
           stick_to_shard: bool = _D.stick_to_shard, initial_fill: int = _D.initial_fill, shuffle: Shuffle = "dali",
           shuffle_after_epoch: bool = _D.shuffle_after_epoch, shuffle_after_epoch_seed: Optional[int] = None,
           **source_options: Any) -> Any:
    """``fn.readers.file``'s place in a pipeline definition: the samples
    (1-D uint8, encoded files) and labels (int32, shape (1,)) of this
    rank's shard of ``dataset``, read by loaderd. Over a numpy dataset,
    ``fn.readers.numpy``'s place: one output, the arrays (each sample its
    file's dtype and shape).

    Call it where the pipeline is defined (a ``@pipeline_def`` function,
    ``define_graph``, or under ``with pipe:``); the batch size is the
    pipeline's. As DALI's readers, it never ends an epoch: ``pipe.run()``
    goes on into the next one (the shard's next samples; without
    ``pad_last_batch`` an epoch's last batch is completed with the next
    epoch's first samples, as the reader completes it, and such batches
    are copies: one copy of each sample, where padded batches, and those
    of shards of whole batches, view the daemon's memory). The arguments shared with ``fn.readers.file`` mean what
    they mean there, so swapping the reader's line for this one changes no
    sample of a training run. The session opens when the pipeline first
    needs it (the first batch, or an iterator asking ``reader_meta``), and
    closes with the pipeline; the dataset's kind (and a numpy dataset's
    dtype) is asked of the daemon here (``datasets()``), so the daemon must
    be running when the pipeline is defined.

    With ``enable_checkpointing=True`` the pipeline's checkpoints carry
    the reader's state. Restored on the saved shards and batch size, it
    goes on exactly; on others, the epoch it was taken in delivers every
    sample not yet delivered once across the new ranks, then fresh epochs
    follow (docs/resume.md, "DALI's checkpoints", says what is refused).

    Parameters
    ----------
    dataset : str
        The dataset's name, as registered with ``loaderd serve --dataset``
        (in place of the reader's ``file_root``).
    name : str, optional
        The reader's name (not an operator's: DALI names no external source
        of two outputs). With a name, ``pipe.reader_meta(name)`` and
        ``pipe.epoch_size(name)`` answer as the reader's would, and DALI's
        iterators take ``reader_name=name``: the shard's size every epoch,
        its padding dropped with ``LastBatchPolicy.PARTIAL``, every
        ``last_batch_policy`` as with the reader, padded or not.
    {shard_id}
    {num_shards}
    {random_shuffle}
    seed : int, optional
        The shuffle's seed. Without it, the seed ``fn.readers.file`` would
        take at this place in the pipeline, derived from the pipeline's
        ``seed`` (``seed_for``); and the reader's place in the pipeline's
        sequence of operator seeds is kept (by a one-value
        ``fn.random.uniform``), so every random operator after it draws as
        it did with the reader. A pipeline without a ``seed`` draws one at
        random, as DALI's does.
    {pad_last_batch}
    {stick_to_shard}
    {initial_fill}
    {shuffle_after_epoch}
    {shuffle_after_epoch_seed}
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
        ``batch_format`` (default ``"dali"``); for a WebDataset dataset
        ``ext`` (required), ``missing_component_behavior``,
        ``case_sensitive_extensions`` and ``dtypes`` (a DALI type, or one
        per ``ext`` entry: each component's bytes reinterpreted, as
        ``fn.readers.webdataset`` does). Host batches only. DALI
        reader arguments that only tune how DALI reads (``read_ahead``,
        ``dont_use_mmap``, ``use_o_direct``, ``device="cpu"``, ...) are
        ignored with a warning; any other DALI argument raises
        ``TypeError`` here, naming it.

    Returns
    -------
    tuple of DataNode, or DataNode
        A file dataset: the samples and the labels, as ``fn.readers.file``
        returns them. A numpy dataset: one ``DataNode``, the arrays (of the
        dataset's dtype), as ``fn.readers.numpy`` returns them. A
        WebDataset dataset: one ``DataNode`` per ``ext`` entry (a list;
        one ``DataNode`` for one entry), as ``fn.readers.webdataset``.

    Raises
    ------
    RuntimeError
        Called outside a pipeline definition.
    TypeError
        An argument ``LoaderSource`` does not take (``batch_size``, which
        is the pipeline's, included), or ``device``; a numpy dataset of a
        dtype DALI has no type for (complex); ``ext`` missing for a
        WebDataset dataset or given for another; ``fn.readers.webdataset``'s
        ``paths``/``index_paths`` (saying how to map the tars instead).
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
    if source_options.get("device", "gpu") == "cpu":
        del source_options["device"]  # fn.readers.numpy(device="cpu"): what this reader gives
    dtypes = source_options.pop("dtypes", None)
    for bad in ("batch_size", "device", "device_id", "gpu_path", "state"):
        if bad in source_options:
            why = {"batch_size": "it is the pipeline's", "state": "resume with DALI's checkpointing"}.get(
                bad, "it reads host batches, as fn.readers.file; decode with device='mixed'")
            raise TypeError(f"nvfeed.dali.reader: no argument {bad!r} ({why})")
    if name is not None and name in pipe.__dict__.get(META, {}):
        raise ValueError(f"nvfeed.dali.reader: a reader named {name!r} is already in this pipeline")
    source_options.setdefault("batch_format", "dali")
    # Checked once, here: the source opens only when the pipeline is built.
    options = SourceOptions.check(
        dataset, "nvfeed.dali.reader", batch_size=pipe.max_batch_size, shard_id=shard_id, num_shards=num_shards,
        random_shuffle=random_shuffle, seed=0 if seed is None else seed, pad_last_batch=pad_last_batch,
        stick_to_shard=stick_to_shard, initial_fill=initial_fill, shuffle=shuffle,
        shuffle_after_epoch=shuffle_after_epoch, shuffle_after_epoch_seed=shuffle_after_epoch_seed, **source_options)
    info = _dataset(options)
    numpy = info.get("reader") == "numpy"
    dtype = _dalinumpy.dali_type(dataset, info.get("dtype", "")) if numpy else None
    wds = info.get("reader") == "webdataset"
    if wds != bool(options.ext) or (dtypes is not None and not wds):
        raise TypeError(f"nvfeed.dali.reader: dataset {dataset!r} holds " + (
            "WebDataset samples: name their components with ext=[...] (as fn.readers.webdataset)" if wds else
            f"{info.get('reader', 'file')} samples: ext= and dtypes= are for WebDataset datasets"))
    k = len(options.ext)
    out_types = _daliwds.dtypes_arg(dtypes, k) if wds else []
    rd = _Reader(pipe, name, options, seed)
    weakref.finalize(pipe, rd.close)
    if wds:
        return _daliwds.outputs(pipe, name, rd, seed, k, out_types, _slot_per_seeded_op())
    if numpy:
        return _dalinumpy.output(pipe, name, rd, seed, dtype, _slot_per_seeded_op())
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


reader.__doc__ = with_parameters(reader.__doc__ or "")


def _dataset(o: SourceOptions) -> DatasetInfo:
    """The daemon's description of the dataset (GET /v1/datasets)."""
    dataset, sock = o.dataset, o.socket
    served = datasets(sock, o.timeout)
    for d in served:
        if d["name"] == dataset:
            return d
    raise NotFoundError(f"nvfeed.dali.reader: loaderd at {sock} serves no dataset {dataset!r} (it serves: "
                        f"{', '.join(d['name'] for d in served) or 'none'})")


def _slot_per_seeded_op() -> bool:
    """Whether this DALI gives seeds only to operators that take one (a
    reader does, an external source does not), so that the swap would
    move the seeds of the operators after it."""
    try:
        return bool(_backend.GetSchema("readers__File").HasRandomSeedArg()
                    and not _backend.GetSchema("ExternalSource").HasRandomSeedArg())
    except AttributeError:  # an older DALI: every operator takes the next seed
        return False
