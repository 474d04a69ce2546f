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
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

import numpy as np

from ._errors import LoaderError
from ._wire import Sampling

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
    ``pad_last_batch``; and which epoch a position of the stream is in."""

    def __init__(self, s: Sampling, batch_size: int) -> None:
        n, shards, shard = s["n"], s["num_shards"], s["shard_id"]

        def size(k: int) -> int:  # DALI's shard k of n samples
            return (k + 1) * n // shards - k * n // shards
        if s["pad_last_batch"]:
            sizes = [-(-(-(-n // shards)) // batch_size) * batch_size]
        elif s["stick_to_shard"] or s.get("shuffle_after_epoch", False):
            sizes = [size(shard)]
        else:
            sizes = [size((shard + e) % shards) for e in range(shards)]
        if sum(sizes) == 0:
            raise LoaderError(f"nvfeed.dali.reader: shard {shard} of {shards} holds no sample of {n}")
        self.batch_size = batch_size
        self._sizes = sizes
        self._starts = [0]
        for m in sizes:
            self._starts.append(self._starts[-1] + m)
        self.aligned = all(m % batch_size == 0 for m in sizes)
        """Whether every epoch is whole batches: DALI's batches are the daemon's."""

    def size(self, epoch: int) -> int:
        """The samples of epoch ``epoch``."""
        return self._sizes[epoch % len(self._sizes)]

    def locate(self, p: int) -> tuple[int, int]:
        """The epoch sample ``p`` of the stream is in, and its place there."""
        cycle, r = divmod(p, self._starts[-1])
        k = bisect.bisect_right(self._starts, r) - 1
        return cycle * len(self._sizes) + k, r - self._starts[k]


class Stream:
    """DALI's batches of a reader's stream, cut from a source's epochs:
    ``stream(info)`` is the batch DALI's ``BatchInfo`` asks for. DALI's
    pipeline numbers its batches on (``epoch_idx`` stays 0: this source
    never ends an epoch), so batch ``iteration`` is the stream's batch of
    that number, and a pipeline restored from a checkpoint asks for its
    own. ``keep``: how many batches made here DALI may still read."""

    def __init__(self, src: LoaderSource, batch_size: int, keep: int) -> None:
        self._src = src
        self._epochs = Epochs(src.opened_state["sampling"], batch_size)
        self._first = {0: 0}  # DALI's epoch_idx -> the stream's batch it starts at
        self._last = -1  # the stream's batch asked for last
        self._at = 0  # the stream position of the samples pending
        self._pending: list[list[Any]] = []  # one list of copied samples per output
        self._next = At(0, 0)  # the daemon batch after them
        self._skip = 0  # samples of that batch before the stream position
        self._tuple = True  # whether the source's batches are tuples of outputs
        self._made: collections.deque[Any] = collections.deque(maxlen=keep)

    def __call__(self, info: Any) -> Any:
        g = self._number(int(info.epoch_idx), int(info.iteration))
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
