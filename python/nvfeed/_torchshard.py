# SPDX-License-Identifier: Apache-2.0
"""For ``nvfeed.torch.LoaderDataset``: this process's shard (rank and world
size) and the batches every rank's loop receives an epoch under a
last-batch policy, computed from the sampling alone (the same on every
rank), as DALI's framework iterators compute them from ``reader_name``."""

from __future__ import annotations

import os
from typing import Literal, Mapping, Optional

LastBatchPolicy = Literal["partial", "drop", "fill"]
"""What the loop receives of a shard's last batch: DALI's ``LastBatchPolicy``."""

POLICIES = ("partial", "drop", "fill")


def shard_args(last_batch_policy: str, shard_id: Optional[int],
               num_shards: Optional[int]) -> Optional[tuple[int, int]]:
    """``LoaderDataset``'s ``last_batch_policy`` checked, and its shard:
    ``(shard_id, num_shards)`` as given, or ``None`` (the process's rank).

    Raises
    ------
    ValueError
        ``last_batch_policy`` is not one of ``POLICIES``, only one of
        ``shard_id`` and ``num_shards`` is given, or they are out of range.
    """
    if last_batch_policy not in POLICIES:
        raise ValueError(f"last_batch_policy must be one of {', '.join(POLICIES)}, got {last_batch_policy!r}")
    if (shard_id is None) != (num_shards is None):
        raise ValueError(f"give both shard_id and num_shards or neither (got shard_id={shard_id!r}, "
                         f"num_shards={num_shards!r}): without them they come from the process's rank")
    if shard_id is None or num_shards is None:
        return None
    if not isinstance(num_shards, int) or isinstance(num_shards, bool) or num_shards < 1:
        raise ValueError(f"num_shards must be an int of at least 1, got {num_shards!r}")
    if not isinstance(shard_id, int) or isinstance(shard_id, bool) or not 0 <= shard_id < num_shards:
        raise ValueError(f"shard_id must be an int in [0, num_shards={num_shards}), got {shard_id!r}")
    return shard_id, num_shards


def distributed_shard() -> tuple[int, int]:
    """This process's ``(rank, world_size)``: from ``torch.distributed``
    when it is initialised, else from the ``RANK`` and ``WORLD_SIZE``
    environment variables (``torchrun`` sets both), else ``(0, 1)``.

    Raises
    ------
    ValueError
        Only one of ``RANK`` and ``WORLD_SIZE`` is set, one is not an
        integer, or ``RANK`` is not in ``[0, WORLD_SIZE)``.
    """
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None and world is None:
        return 0, 1
    if rank is None or world is None:
        raise ValueError(f"LoaderDataset: RANK={rank!r} and WORLD_SIZE={world!r}: set both or neither")
    try:
        r, w = int(rank), int(world)
    except ValueError:
        raise ValueError(f"LoaderDataset: RANK={rank!r} and WORLD_SIZE={world!r} must be integers") from None
    if w < 1 or not 0 <= r < w:
        raise ValueError(f"LoaderDataset: RANK={r} must be in [0, WORLD_SIZE={w}) and WORLD_SIZE >= 1")
    return r, w


class Epochs:
    """A rank's epochs under a last-batch policy, from the session's
    sampling (``State["sampling"]``: ``n`` samples, the reader's
    arguments). Shard k of n holds samples ``[k*N//n, (k+1)*N//n)``, as
    DALI's readers shard; the daemon reads ``daemon_batches(e)`` batches
    of it in epoch e (with ``pad_last_batch``: ``ceil(N/n)`` samples
    padded to whole batches, the shard's last sample repeated). A resumed
    epoch (``resumed``: its number, its list's length, the batches its
    earlier runs received) shards its list, and the loop numbers its
    batches on from those (``nvfeed._resume``)."""

    def __init__(self, sampling: Mapping[str, object], policy: LastBatchPolicy,
                 resumed: Optional[tuple[int, int, int]] = None) -> None:
        def num(key: str) -> int:
            v = sampling.get(key, 0)
            return int(v) if isinstance(v, (int, bool)) else 0
        self.n, self.shards, self.bs = num("n"), max(num("num_shards"), 1), max(num("batch_size"), 1)
        self.shard_id, self.pad, self.stick = num("shard_id"), bool(sampling.get("pad_last_batch")), \
            bool(sampling.get("stick_to_shard"))
        self.policy = policy
        self.resumed = resumed

    def _n(self, epoch: int) -> int:
        """The samples of epoch e's list."""
        return self.resumed[1] if self.resumed is not None and self.resumed[0] == epoch else self.n

    def offset(self, epoch: int) -> int:
        """The loop's batches of epoch e before the daemon's first: those
        of a resumed epoch's earlier runs, else 0."""
        return self.resumed[2] if self.resumed is not None and self.resumed[0] == epoch else 0

    def shard_size(self, epoch: int, shard_id: int = -1) -> int:
        """The samples of shard_id's (this rank's by default) shard in epoch e, padding excluded."""
        k = self.shard_id if shard_id < 0 else shard_id
        if not self.stick:
            k = (k + epoch) % self.shards
        n = self._n(epoch)
        return (k + 1) * n // self.shards - k * n // self.shards

    def daemon_batches(self, epoch: int) -> int:
        """The batches the daemon reads for this rank in epoch e, padding included."""
        if self.pad:
            per = -(-self._n(epoch) // self.shards)
            return -(-per // self.bs)
        return -(-self.shard_size(epoch) // self.bs)

    def batches(self, epoch: int) -> int:
        """The batches every rank's loop receives an epoch: ``partial``, as
        many as the largest shard fills (``ceil(ceil(N/n)/batch_size)``, the
        same every epoch and on every rank); ``drop``, the whole batches of
        the smallest shard; ``fill``, the daemon's for epoch e."""
        n, off = self._n(epoch), self.offset(epoch)
        if self.policy == "partial":
            return off - (-(-(-n // self.shards)) // self.bs)
        if self.policy == "drop":
            return off + (n // self.shards) // self.bs
        return off + self.daemon_batches(epoch)  # fill: as read (equal on every rank with pad_last_batch)

    def keep(self, epoch: int, batch: int) -> int:
        """How many of the daemon's batch ``batch`` of epoch e the loop
        receives: the samples before the shard's end (``partial`` and
        ``drop``: padding trimmed), all of them with ``fill``."""
        if self.policy == "fill":
            return self.bs
        return max(0, min(self.bs, self.shard_size(epoch) - batch * self.bs))
