# SPDX-License-Identifier: Apache-2.0
"""``LoaderDataset``'s passes and positions, a part the dataset owns
(``_torchdataset`` has the class): its session, opened at the resume position; where a pass starts
(a loop that received ``len(ds)`` batches finished its epoch; an
evaluation pass that stopped early leaves the position where it found
it), a batch as the loop receives it under the last-batch policy,
``state_dict()`` and ``load_state_dict()``."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Iterator, Optional, Union, cast

import numpy as np
import torch

from . import _resume, _torchwds
from ._options import SourceOptions
from ._source import Batch, Components, LoaderSource, Tensors
from ._torchbatch import FileBatch
from ._torchloop import EpochRepeatWarning, epoch_zero_again
from ._torchshard import Epochs, LastBatchPolicy, distributed_shard
from ._torchviews import TensorBatch, TorchViews
from ._wire import State

TorchBatch = tuple[list[torch.Tensor], torch.Tensor]
"""One batch: the samples (1-D uint8 tensors) and their labels (int64, shape (batch,))."""

WdsBatch = tuple[_torchwds.Component, ...]
"""One WebDataset batch: one entry per ``ext`` entry, the samples'
components as ``bytes`` (or tensors: ``zero_copy``, GPU), decoded labels
as an int64 tensor of shape (batch,)."""

Item = Union[TorchBatch, TensorBatch, WdsBatch]
"""What ``LoaderDataset`` yields: a ``TorchBatch`` over a file dataset, a
``TensorBatch`` over a numpy dataset, a ``WdsBatch`` over a WebDataset."""

STATE_VERSION = 1
"""The version of ``LoaderDataset.state_dict()``'s layout."""


class Passes:
    """A ``LoaderDataset``'s session and position: the part that moves
    them. The dataset owns it and gives it its arguments: ``options`` are
    the source's, checked; the shard (``None``: the process's rank) and
    the state are set when the session opens."""

    def __init__(self, dataset: str, batch_size: int, last_batch_policy: LastBatchPolicy, decode_labels: bool,
                 options: SourceOptions, shard: Optional[tuple[int, int]], views: TorchViews) -> None:
        self.dataset, self.batch_size = dataset, batch_size
        self._policy, self._decode = last_batch_policy, decode_labels
        self._options, self._shard, self._views = options, shard, views
        self._src: Optional[LoaderSource] = None
        self._resume: Optional[State] = None  # where the next session starts (load_state_dict)
        self._first_epoch: Optional[int] = None  # set_epoch before the session: where it starts
        self._epoch_given = False  # set_epoch was called: the loop says which epoch it reads
        self._epochs: Optional[Epochs] = None  # the session's epochs, under last_batch_policy
        self._at: Optional[tuple[int, int]] = None  # the next batch the loop receives (epoch, batch)
        self._pass: Optional[tuple[object, tuple[int, int], bool]] = None  # the last pass: token, start, evaluating

    @property
    def shard(self) -> tuple[int, int]:
        """``(shard_id, num_shards)``: as given, else this process's rank and
        world size (``distributed_shard()``)."""
        if self._shard is not None:
            return self._shard
        return distributed_shard()

    def close(self) -> None:
        """Ends the session; the next pass opens one at this position."""
        if self._src is not None:
            self._views.wait_pending()
            self._resume = self._position()
            self._src.close()
            self._src = None

    def __del__(self) -> None:
        src = getattr(self, "_src", None)
        if src is not None:
            try:
                src.close()
            except Exception:  # noqa: BLE001 - at interpreter exit the daemon reaps the session anyway
                pass

    def __getstate__(self) -> dict[str, Any]:
        # A copy in another process (a DataLoader worker) has no session:
        # it would open its own, which __iter__ refuses there.
        d = self.__dict__.copy()
        d["_src"], d["_views"] = None, TorchViews(self._views.device, self._views.zero_copy)
        return d

    def batches(self) -> int:
        """Batches the loop receives in the next epoch."""
        self._source()
        e, _ = self._start()
        ep = cast(Epochs, self._epochs)
        return max(ep.batches(e), ep.batches(e + 1)) if ep.offset(e) else ep.batches(e)

    def _source(self) -> LoaderSource:
        """The session, opened (at the resume position, if any) when it is
        not: the shard is resolved then."""
        if self._src is None:
            shard_id, num_shards = self.shard
            if self._resume is not None:  # rank 0's position on this rank's shard, known now (not at load_state_dict)
                self._resume = _resume.for_run(self._resume, shard_id, num_shards, self.batch_size)
            resume = self._resume
            if resume is not None:  # the daemon's position: past its last batch, its epoch's end
                ep = Epochs(resume["sampling"], self._policy, _resume.resumed(resume))
                resume = _resume.at(resume, resume["epoch"], min(resume["batch"], ep.daemon_batches(resume["epoch"])))
            self._src = LoaderSource.of(dataclasses.replace(self._options, shard_id=shard_id, num_shards=num_shards,
                                                            state=resume))
            st0 = self._src.opened_state
            self._epochs = Epochs(st0["sampling"], self._policy, _resume.resumed(st0))
            if self._resume is not None:
                e = self._resume["epoch"]
                self._at = (e, self._resume["batch"] + self._epochs.offset(e))
            elif self._first_epoch is not None:
                self._at = (self._first_epoch, 0)
            else:
                self._at = self._src.next_position
            self._pass, self._resume, self._first_epoch = None, None, None
        return self._src

    def _first_pass(self) -> None:
        """Warn when another dataset of this process already began epoch 0
        of the same order: made anew each epoch without ``set_epoch``, it
        would repeat epoch 0's order every epoch."""
        shard_id, num_shards = self.shard
        if self._epoch_given:
            return  # the epoch is the loop's own choice (set_epoch(0) included)
        o = self._options
        if not o.random_shuffle and (num_shards == 1 or o.stick_to_shard):
            return  # every epoch is the same order
        if epoch_zero_again(self, (self.dataset, o.socket, o.seed, o.shuffle,
                                   self.batch_size, shard_id, num_shards)):
            warnings.warn(
                f"LoaderDataset({self.dataset!r}): another LoaderDataset of this process with the same sampling "
                "already began epoch 0, and this one begins it again: the same order as then. A dataset made anew "
                "each epoch learns its epoch from set_epoch(epoch): Lightning calls it at each epoch's start; "
                "call ds.set_epoch(epoch) in a loop of your own.", EpochRepeatWarning, stacklevel=3)

    def _start(self) -> tuple[int, int]:
        """Where the next pass starts: the loop's position, or where the
        last pass started when it was an evaluation pass that stopped early;
        past an epoch's last batch, the next epoch's first."""
        ep = cast(Epochs, self._epochs)
        e, k = cast(tuple[int, int], self._at)
        if self._pass is not None:
            _, start, evaluating = self._pass
            if evaluating and k < ep.batches(e):
                e, k = start
        if k >= ep.batches(e):
            e, k = e + 1, 0
        return e, k

    def epoch(self, evaluating: bool) -> Iterator[Item]:
        """One pass: the batches the loop receives from the pass's start."""
        src = self._source()
        ep = cast(Epochs, self._epochs)
        e, k = self._at = self._start()
        if (e, k) == (0, 0):
            self._first_pass()
        token = object()
        self._pass = (token, (e, k), evaluating)
        n = ep.batches(e)
        while k < n:
            item = self._get(src, ep, e, k)
            if self._pass is None or self._pass[0] is not token:
                raise RuntimeError("LoaderDataset: an iterator of an earlier pass was used after a new one began (or "
                                   "after load_state_dict): a dataset has one position, iterate one pass at a time")
            k += 1
            self._at = (e, k)
            yield item

    def _get(self, src: LoaderSource, ep: Epochs, e: int, k: int) -> Item:
        """Batch k of epoch e as the loop receives it."""
        k -= ep.offset(e)  # the daemon's batch
        if k >= ep.daemon_batches(e):  # past this rank's shard ("partial"): an empty batch, in step with the others
            if src.components:
                return _torchwds.batch(self._views, src.options.ext, ([],) * src.components, self._decode)
            if src.reader == "numpy":
                return []
            return FileBatch(([], torch.zeros(0, dtype=torch.int64)))
        if src.next_position != (e, k) and k == 0 and src.next_position == (e - 1, ep.daemon_batches(e - 1)):
            try:  # the previous epoch's end, not yet taken: take it
                src.fetch(None)
            except StopIteration:
                pass
        self._views.wait_pending()  # the last batch goes back to the daemon with this request
        src.keep = ep.keep(e, k)
        b = src.fetch(None if src.next_position == (e, k) else (e, k))
        if src.components:
            return _torchwds.batch(self._views, src.options.ext, cast(Components, b), self._decode)
        if src.reader == "numpy":
            return self._views.arrays(cast(Tensors, b))
        samples, labels = cast(Batch, b)
        return FileBatch((self._views.tensors(samples), torch.from_numpy(labels.reshape(-1).astype(np.int64))))

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass yield epoch ``epoch`` from its first batch,
        as ``DistributedSampler.set_epoch`` does: a dataset made anew each
        epoch then yields what one dataset iterated on would.

        A position already in that epoch is kept: a checkpoint resumed
        mid-epoch goes on where it stopped. Lightning calls it at every
        epoch's start (through ``ds.sampler``), so under
        ``limit_train_batches`` each epoch trains the first batches of its
        own order, and the rest of the epoch it stopped in is not seen
        (docs/torch.md, Epochs).

        Raises
        ------
        ValueError
            ``epoch`` is not an int in ``[0, 2**31)``.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch < 2**31:
            raise ValueError(f"LoaderDataset.set_epoch: epoch must be an int in [0, 2**31), got {epoch!r}")
        self._epoch_given = True
        if self._src is not None:
            if self._start()[0] != epoch:
                self._at, self._pass = (epoch, 0), None
        elif self._resume is not None:
            if self._resume["epoch"] != epoch:
                self._resume = _resume.at(self._resume, epoch, 0)
        else:
            self._first_epoch = epoch

    def _position(self) -> Optional[State]:
        """The daemon's State at the next pass's start (the batch the loop
        receives: past the daemon's last batch of the epoch for an empty one)."""
        if self._src is None:
            return self._resume
        e, k = self._start()
        return _resume.at(self._src.opened_state, e, k - cast(Epochs, self._epochs).offset(e))

    def state_dict(self) -> dict[str, Any]:
        """The position of the next batch the loop will receive, and the
        sampling it was made under: pass it to ``load_state_dict()``.

        Returns
        -------
        dict
            ``{"version": 1, "dataset": name, "epoch": e, "batch": b,
            "state": the daemon's State}``: plain values (ints, strings,
            bools), fit for ``torch.save`` and JSON.
        """
        if self._src is None and self._resume is None:
            self._source()
        st = cast(State, self._position())
        r = _resume.resumed(st)
        off = r[2] if r is not None else 0
        return {"version": STATE_VERSION, "dataset": self.dataset, "epoch": st["epoch"], "batch": st["batch"] + off,
                "state": st}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue at the position ``state_dict()`` returned: the next
        iteration yields that batch. The state may come from any rank of the
        run (rank 0's checkpoint): this dataset keeps its own shard. From a
        run of other ranks or another batch size, the epoch goes on with
        the samples no rank had received, each once across this run's
        ranks, and the loop's batches counted on (docs/resume.md).

        Raises
        ------
        ValueError
            The state is not a ``state_dict()`` of this version, or is for
            another dataset. Other sampling arguments that differ (seed,
            shuffle, ...), and a resume on other ranks that cannot be exact
            (``shuffle="dali"``, ``stick_to_shard``), are refused by the
            daemon when the session opens, saying why.
        """
        if not isinstance(state_dict, dict) or state_dict.get("version") != STATE_VERSION or "state" not in state_dict:
            raise ValueError(f"LoaderDataset.load_state_dict: not a state_dict() of version {STATE_VERSION}: "
                             f"{state_dict!r:.200}")
        if state_dict.get("dataset") != self.dataset:
            raise ValueError(f"LoaderDataset.load_state_dict: the state is for dataset {state_dict.get('dataset')!r}, "
                             f"this dataset reads {self.dataset!r}")
        st = cast(State, dict(state_dict["state"]))
        e, k = int(state_dict["epoch"]), int(state_dict["batch"])
        r = _resume.resumed(st)
        st = _resume.at(st, e, k - (r[2] if r is not None and r[0] == e else 0))
        # Put on this rank's shard when the session opens (_source): the rank may not be known yet
        # (torch.distributed initialised after load_state_dict).
        if self._src is not None:
            self._views.wait_pending()
            self._src.close()
            self._src = None
        self._resume, self._pass, self._first_epoch = st, None, None
