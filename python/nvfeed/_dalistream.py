# SPDX-License-Identifier: Apache-2.0
"""``nvfeed.dali.reader``'s batches as DALI's readers give them: one
stream of samples that goes on from epoch to epoch, never a
``StopIteration``. ``fn.readers.file``, ``numpy`` and ``webdataset``
read the shard and then the next epoch's, batch after batch; without
``pad_last_batch`` an epoch's last batch is completed with the next
epoch's first samples (a shard smaller than a batch: with several
epochs'). The daemon's epochs, concatenated, are that stream (its
``"dali"`` shuffle included); here DALI's batch ``g`` is cut out of them.

Where every epoch is whole batches (``pad_last_batch``, or shards of
whole batches) batch ``g`` is one of the daemon's, handed on as it is
(no copy). Otherwise the samples of the daemon's batches are copied
once, as they arrive, and batches made of them. Used by ``nvfeed.dali``,
which loads DALI first."""

from __future__ import annotations

import bisect
import collections
import importlib
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, cast

import numpy as np

from ._errors import LoaderError
from . import _resume
from ._wire import Sampling, Stage, State

if TYPE_CHECKING:  # a type only: the source is made elsewhere
    from ._source import LoaderSource

_backend: Any = importlib.import_module("nvidia.dali.backend")


class At(NamedTuple):
    """A daemon batch's position, as DALI's ``BatchInfo`` names one."""

    epoch_idx: int
    iteration: int


class Epochs:
    """How many samples each epoch of the reader's stream holds: the
    shard's, rotating unless it sticks (``shuffle_after_epoch`` implies
    it, as in DALI), padded to whole batches of the largest shard with
    ``pad_last_batch``; and which epoch a position of the stream is in.
    The stream starts at epoch ``first``; ``head``: that epoch's list's
    length when it is a resumed one (``nvfeed._resume``)."""

    def __init__(self, s: Sampling, batch_size: int, first: int = 0, head: Optional[int] = None) -> None:
        n, shards, shard = s["n"], s["num_shards"], s["shard_id"]
        pad, stick = s["pad_last_batch"], s["stick_to_shard"] or s.get("shuffle_after_epoch", False)

        def size(e: int, m: int) -> int:  # DALI's shard of m samples in epoch e
            if pad:
                return -(-(-(-m // shards)) // batch_size) * batch_size
            k = shard if stick else (shard + e) % shards
            return (k + 1) * m // shards - k * m // shards
        self.batch_size = batch_size
        self._first = first
        self._head = [] if head is None else [size(first, head)]
        self._from = first + len(self._head)  # the first epoch of whole lists
        self._sizes = [size(self._from + i, n) for i in range(1 if pad or stick else shards)]
        if sum(self._sizes) == 0:
            raise LoaderError(f"nvfeed.dali.reader: shard {shard} of {shards} holds no sample of {n}")
        self._starts = [0]
        for m in self._sizes:
            self._starts.append(self._starts[-1] + m)
        self.aligned = all(m % batch_size == 0 for m in self._head + self._sizes)
        """Whether every epoch is whole batches: DALI's batches are the daemon's."""

    def size(self, epoch: int) -> int:
        """The samples of epoch ``epoch``."""
        if self._head and epoch == self._first:
            return self._head[0]
        return self._sizes[(epoch - self._from) % len(self._sizes)]

    def locate(self, p: int) -> tuple[int, int]:
        """The epoch sample ``p`` of the stream is in, and its place there."""
        if self._head:
            if p < self._head[0]:
                return self._first, p
            p -= self._head[0]
        cycle, r = divmod(p, self._starts[-1])
        k = bisect.bisect_right(self._starts, r) - 1
        return self._from + cycle * len(self._sizes) + k, r - self._starts[k]


def restart(start: State, base: int, consumed: int, shard_id: int, num_shards: int, batch_size: int) -> State:
    """Rank ``shard_id`` of ``num_shards``' state, batch ``batch_size``,
    for a pipeline restored from a DALI checkpoint whose reader's stream
    started at ``start`` (rank 0's state) at DALI's iteration ``base``,
    and whose loop had consumed DALI's batches up to ``consumed``. On the
    saved shards and batch size: ``start`` on this shard (the stream
    goes on at ``consumed``). Else every old rank's place in its stream
    (all at batch ``consumed``) becomes one stage of the epoch they were
    in (``nvfeed._resume``), the new stream starting there.

    Raises
    ------
    LoaderError
        The old ranks were at different places of their epochs (uneven
        shards without ``pad_last_batch``): no stage says what they had.
    """
    s = start["sampling"]
    old = int(s.get("num_shards") or 1), int(s.get("batch_size") or 0)
    if old == (num_shards, batch_size):
        return _resume.for_run(start, shard_id, num_shards, batch_size)
    r = _resume.resumed(start)
    head = r[1] if r is not None else None
    places = {Epochs(cast(Sampling, dict(s, shard_id=k)), old[1], start["epoch"], head).locate((consumed - base) * old[1])
              for k in range(old[0])}
    if len(places) != 1:
        raise LoaderError(f"nvfeed.dali.reader: this checkpoint's {old[0]} ranks (batch size {old[1]}) were at "
                          f"different places of their epochs at DALI's iteration {consumed}: their shards are uneven "
                          "and, without pad_last_batch, each rank's stream crosses epochs at its own batch. Restore "
                          f"it with num_shards={old[0]} and the batch size {old[1]}, or run with pad_last_batch=True")
    (e, off), = places
    st = _resume.at(start, e, 0)
    if off == 0:  # at an epoch's start: nothing of it was received
        return _sharded(st, shard_id, num_shards, batch_size)
    stage: Stage = {"num_shards": old[0], "batch_size": old[1], "batch": off // old[1]} if off % old[1] == 0 else \
        {"num_shards": old[0], "batch_size": 1, "batch": off}
    return _resume.with_stage(st, stage, shard_id, num_shards, batch_size)


def _sharded(state: State, shard_id: int, num_shards: int, batch_size: int) -> State:
    """``state`` on other shards and batch size, its position kept."""
    s = cast(Sampling, dict(state["sampling"], shard_id=shard_id, num_shards=num_shards, batch_size=batch_size))
    return cast(State, dict(state, sampling=s))


class Stream:
    """DALI's batches of a reader's stream, cut from a source's epochs:
    ``stream(info)`` is the batch DALI's ``BatchInfo`` asks for. DALI's
    pipeline numbers its batches on (``epoch_idx`` stays 0: this source
    never ends an epoch), so batch ``iteration`` is the stream's batch of
    that number, and a pipeline restored from a checkpoint asks for its
    own. ``keep``: how many batches made here DALI may still read.
    ``base``: DALI's iteration of the stream's first batch, the start of
    the source's first epoch (a restore on other shards: ``restart``)."""

    def __init__(self, src: LoaderSource, batch_size: int, keep: int, base: int = 0) -> None:
        self._src = src
        st = src.opened_state
        r = _resume.resumed(st)
        self._epochs = Epochs(st["sampling"], batch_size, st["epoch"], r[1] if r is not None else None)
        self._base = base
        self._at = 0  # the stream position of the samples pending
        self._first = {0: 0}  # DALI's epoch_idx -> the stream's batch it starts at
        self._last = -1  # the stream's batch asked for last
        self._pending: list[list[Any]] = []  # one list of copied samples per output
        self._next = At(st["epoch"], 0)  # the daemon batch after them
        self._skip = 0  # samples of that batch before the stream position
        self._tuple = True  # whether the source's batches are tuples of outputs
        self._made: collections.deque[Any] = collections.deque(maxlen=keep)

    def __call__(self, info: Any) -> Any:
        g = self._number(int(info.epoch_idx), int(info.iteration)) - self._base
        if g < 0:
            raise LoaderError(f"nvfeed.dali.reader: DALI asks for its batch {g + self._base}, before this stream's "
                              f"first ({self._base}, where the pipeline was restored)")
        bs = self._epochs.batch_size
        if self._epochs.aligned:
            e, off = self._epochs.locate(g * bs)
            return self._src.batch(At(e, off // bs))
        if g * bs != self._at:
            self._seek(g * bs)
        while not self._pending or len(self._pending[0]) < bs:
            self._pull()
        out = [self._list(col[:bs]) for col in self._pending]
        self._pending = [col[bs:] for col in self._pending]
        self._at += bs
        self._made.append(out)  # alive while DALI may read it (no_copy)
        return tuple(out) if self._tuple else out[0]

    def _number(self, epoch: int, iteration: int) -> int:
        """The stream's batch DALI asks for: DALI's epochs restart its
        count only after another source of the pipeline ended one. DALI
        asked every source for the iteration that source ended, and ran
        none (the reader did not move): the new epoch starts with the
        batch asked for last."""
        first = self._first.get(epoch)
        if first is None:
            if epoch - 1 not in self._first:
                raise LoaderError(f"nvfeed.dali.reader: DALI asks for batch {iteration} of its epoch {epoch}, whose "
                                  "start this reader does not know (the pipeline was restored from a checkpoint "
                                  "taken after another source ended an epoch)")
            first = self._first[epoch] = max(self._last, 0)
        self._last = first + iteration
        return self._last

    def _seek(self, p: int) -> None:
        """Goes to position ``p`` of the stream: the daemon's batch holding
        it is the next to read, its samples before ``p`` skipped."""
        e, off = self._epochs.locate(p)
        bs = self._epochs.batch_size
        self._next, self._skip, self._at, self._pending = At(e, off // bs), off % bs, p, []

    def _pull(self) -> None:
        """Reads the next daemon batch, copying its samples past the
        stream position to the pending ones."""
        e, i = self._next
        bs = self._epochs.batch_size
        want = min(bs, self._epochs.size(e) - i * bs)
        skipped = self._src.skipped_samples
        batch: Any = self._src.batch(self._next)
        self._tuple = isinstance(batch, tuple)
        cols = list(batch) if self._tuple else [batch]
        got = len(cols[0])
        if got > want or (got < want and self._src.skipped_samples == skipped):
            raise LoaderError(f"loaderd: epoch {e} batch {i} holds {got} samples, this reader's shard {want}")
        if not self._pending:
            self._pending = [[] for _ in cols]
        for pending, col in zip(self._pending, cols):
            pending += [np.array(col[j]) for j in range(self._skip, got)]
        self._skip = 0
        e, i = (e, i + 1) if (i + 1) * bs < self._epochs.size(e) else (e + 1, 0)
        while self._epochs.size(e) == 0:
            e += 1
        self._next = At(e, i)

    @staticmethod
    def _list(samples: list[Any]) -> Any:
        """The samples as one TensorListCPU viewing them (each tensor keeps
        its array alive)."""
        tensor = _backend.TensorCPU
        return _backend.TensorListCPU([tensor(s) for s in samples], contiguous=False)
