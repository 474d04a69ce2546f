# SPDX-License-Identifier: Apache-2.0
"""What ``nvfeed.dali.reader`` puts in a pipeline: the external source's
callback (``Reader``: the ``LoaderSource`` opened once the pipeline is
built, with the seed ``fn.readers.file`` would have taken, its batches
the reader's stream, epoch after epoch: ``_dalistream``) and
``pipe.reader_meta`` and ``pipe.epoch_size`` answering for it as for
DALI's own readers. Used by ``nvfeed.dali``, which loads DALI first."""

from __future__ import annotations

import dataclasses
import importlib
import secrets
import warnings
import weakref
from typing import Any, Optional

from . import _dalicpt, _depth
from ._dalistream import Stream, restart
from ._errors import LoaderError, RankMismatchError
from ._options import SourceOptions
from ._seeds import MAX_SEEDS, seed_for
from ._source import LoaderSource

META = "_nvfeed_readers"
"""The pipeline's attribute: reader name -> Reader."""


def reader_meta(src: LoaderSource) -> dict[str, int]:
    """What ``fn.readers.file`` with the source's sampling arguments gives
    as ``pipe.reader_meta(name)``: ``epoch_size``, ``epoch_size_padded``,
    ``number_of_shards``, ``shard_id``, ``pad_last_batch``,
    ``stick_to_shard`` (the flags as 0 or 1, as DALI gives them)."""
    s = src.opened_state["sampling"]
    n, shards = s["n"], s["num_shards"]
    return {"epoch_size": n, "epoch_size_padded": -(-n // shards) * shards if s["pad_last_batch"] else n,
            "number_of_shards": shards, "shard_id": s["shard_id"], "pad_last_batch": int(s["pad_last_batch"]),
            "stick_to_shard": int(s["stick_to_shard"] or s.get("shuffle_after_epoch", False))}  # DALI implies it


def _takes_seed(op: Any) -> bool:
    """Whether op, one of a built pipeline's operators, takes the next
    operator seed (it takes one and was given none)."""
    return bool(op._op.schema.HasRandomSeedArg()) and "seed" not in op._op._init_args


class Reader:
    """The external source's callback: opens the LoaderSource when first
    needed (the pipeline is built by then, so the seed the reader would
    have had is known) and answers batches (the reader's stream, which
    never ends an epoch: ``Stream``) and reader_meta."""

    def __init__(self, pipe: Any, name: Optional[str], options: SourceOptions, seed: Optional[int]) -> None:
        self._pipe = weakref.ref(pipe)
        self._name, self._options, self._seed = name, options, seed  # options checked: nvfeed.dali.reader
        self.marker: Any = None  # the operator at the reader's place in the graph's order
        self.src: Optional[LoaderSource] = None
        self._stream: Optional[Stream] = None
        self._base = 0  # DALI's iteration of the stream's first batch (Stream)
        self.short = False
        """Whether the stream starts with a resumed epoch, shorter than the
        others (a restore on other shards or batch size: ``_restored``)."""
        self._index = _dalicpt.hook(pipe, _dalicpt.READERS, self._entry) if _dalicpt.checkpointing(pipe) else -1

    def __repr__(self) -> str:  # DALI names the source by it in its messages
        return f"nvfeed.dali.reader({self._options.dataset!r}, name={self._name!r})"

    def __call__(self, info: Any) -> Any:
        if self._stream is None:
            pipe = self._pipe()
            keep = _depth.needed(pipe)[0] if pipe is not None else 1
            self._stream = Stream(self.source(), self._options.batch_size, keep, self._base)
        return self._stream(info)

    def _entry(self) -> Optional[dict[str, Any]]:
        """This reader's part of a DALI checkpoint: where its stream
        started (the source's opened state: sampling, epoch, stages,
        content) and DALI's iteration there."""
        if self.src is None:
            return None
        return {"dataset": self._options.dataset, "state": self.src.opened_state, "base": self._base}

    def _restored(self, pipe: Any, options: SourceOptions) -> SourceOptions:
        """``options`` with the state to open for the checkpoint ``pipe``
        was restored from (``restart``): a restore on other shards or
        batch size resumes the epoch the checkpoint was taken in."""
        saved = _dalicpt.saved(pipe, _dalicpt.READERS, self._index) if self._index >= 0 else None
        if saved is None:
            return options
        o = options
        if not saved.known:
            warnings.warn(f"{self!r}: this DALI checkpoint was taken by an nvfeed that did not save its state: "
                          "restored as taken with these num_shards and batch size, which nvfeed cannot check. "
                          "Restored on other ones, the pipeline reads other samples than the checkpoint's rest. "
                          "Take a new checkpoint with this nvfeed", RuntimeWarning, stacklevel=4)
            return o
        if saved.epoch_idx != 0:
            raise LoaderError(f"{self!r}: the checkpoint was taken after another source of the pipeline ended DALI's "
                              f"epoch {saved.epoch_idx - 1}: where this reader's stream was then is not known")
        if saved.entry is None:
            if saved.iter != 0:
                raise LoaderError(f"{self!r}: the checkpoint holds no state of this reader, but DALI's iteration "
                                  f"{saved.iter}: restore it into the pipeline that took it")
            return o
        if saved.entry.get("dataset") != o.dataset:
            raise LoaderError(f"{self!r}: the checkpoint was taken reading dataset {saved.entry.get('dataset')!r}: "
                              "restore it into a pipeline reading that dataset")
        start = saved.entry["state"]
        st = restart(start, int(saved.entry["base"]), saved.iter, o.shard_id, o.num_shards, o.batch_size)
        moved = st["sampling"].get("num_shards") != start["sampling"].get("num_shards") or \
            st["sampling"].get("batch_size") != start["sampling"].get("batch_size")
        self._base = saved.iter if moved else int(saved.entry["base"])
        self.short = bool(st.get("stages"))
        if (moved or self.short) and _dalicpt.sized(pipe):
            raise LoaderError(f"{self!r}: restored on other shards or batch size (now or at an earlier restore), but "
                              "the checkpoint's DALI iterator counts epochs for the shards it was taken on (its size= "
                              "or reader_name): restore it with the saved num_shards and batch size, or iterate "
                              "without size= and reader_name")
        return dataclasses.replace(o, state=st)

    def source(self) -> LoaderSource:
        if self.src is None:
            pipe = self._pipe()
            seed = self._seed if self._seed is not None else self._pipeline_seed(pipe)
            pipeline: Any = importlib.import_module("nvidia.dali.pipeline").Pipeline  # loaded by nvfeed.dali
            pipeline.push_current(pipe)  # what LoaderSource learns from the pipeline it is in
            try:
                self.src = LoaderSource.of(self._restored(pipe, dataclasses.replace(self._options, seed=seed)))
                self.src.dali_checkpoint = False  # the reader's entry stands for it
            except RankMismatchError as e:
                if self._seed is not None or "seed" not in str(e):
                    raise
                raise RankMismatchError(f"{e}. This rank's seed {seed} was not passed: nvfeed.dali.reader derived it "
                                        f"from the pipeline's seed ({self._seed_origin(pipe)}), as fn.readers.file "
                                        "takes its seed, and each rank's pipeline has its own seed. Pass the same "
                                        "seed= to nvfeed.dali.reader on every rank (shuffle='permute' shards one "
                                        "permutation that every rank must draw alike), or use shuffle='dali', whose "
                                        "shards no seed changes", e.status, e.error_code) from e
            finally:
                pipeline.pop_current()
        return self.src

    @staticmethod
    def _seed_origin(pipe: Any) -> str:
        """Where a derived seed came from: the pipeline's seed, or DALI's
        random one."""
        if pipe is None or pipe.seed is None or pipe.seed < 0:
            return "none was given, so DALI drew one at random"
        return f"seed={pipe.seed}"

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
        return seed_for(int(pipe.seed), slot % MAX_SEEDS)

    def meta(self) -> dict[str, int]:
        src = self.source()
        if self.short:
            raise LoaderError(f"{self!r}: restored on other shards or batch size, it resumes a shorter epoch; DALI's "
                              "iterators size every epoch alike from reader_meta and would trim or pad it wrongly. "
                              "Iterate without reader_name (and size=), or restore with the saved num_shards and "
                              "batch size")
        return reader_meta(src)

    def close(self) -> None:
        self._stream = None
        if self.src is not None:
            self.src.close()
            self.src = None


def register(pipe: Any, name: str, rd: Reader) -> None:
    """Makes pipe.reader_meta(name) and pipe.epoch_size(name) answer for
    rd; the pipeline's own readers answer as before."""
    readers: Optional[dict[str, Reader]] = pipe.__dict__.get(META)
    if readers is None:
        readers = {}
        setattr(pipe, META, readers)
        pipe.reader_meta = ReaderMeta(pipe)
        pipe.epoch_size = EpochSize(pipe)
    readers[name] = rd


class ReaderMeta:
    """A pipeline's reader_meta with this module's readers in it. It holds
    the pipeline weakly: the pipeline that holds it goes (and closes its
    readers) when its last user lets go, not at the next garbage
    collection."""

    def __init__(self, pipe: Any) -> None:
        self._pipe = weakref.ref(pipe)
        self._own = type(pipe).reader_meta
        self.__doc__ = self._own.__doc__

    def __call__(self, name: Optional[str] = None) -> Any:
        pipe = _alive(self._pipe)
        pipe.build()  # as DALI's: the reader's seed is known once the graph is
        mine: dict[str, Reader] = pipe.__dict__[META]
        if name is not None:
            return mine[name].meta() if name in mine else self._own(pipe, name)
        out = dict(self._own(pipe))
        out.update({n: reader_meta(r.source()) for n, r in mine.items()})
        return out


class EpochSize:
    """A pipeline's epoch_size with this module's readers in it: each
    reader's ``epoch_size_padded``, as DALI's (the pipeline held weakly,
    as by ``ReaderMeta``)."""

    def __init__(self, pipe: Any) -> None:
        self._pipe = weakref.ref(pipe)
        self.__doc__ = type(pipe).epoch_size.__doc__

    def __call__(self, name: Optional[str] = None) -> Any:
        pipe = _alive(self._pipe)
        if name is not None:
            return pipe.reader_meta(name)["epoch_size_padded"]
        return {k: v["epoch_size_padded"] for k, v in pipe.reader_meta().items()}


def _alive(ref: "weakref.ref[Any]") -> Any:
    """The pipeline a method bound to it holds weakly (alive while the
    method is reached through it)."""
    pipe = ref()
    if pipe is None:
        raise ReferenceError("nvfeed.dali.reader: the pipeline is gone")
    return pipe
