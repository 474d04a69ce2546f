# SPDX-License-Identifier: Apache-2.0
"""Ranks that cannot silently disagree: the sources of one training job
compared across its ranks through ``torch.distributed`` (every node, one
``all_gather_object`` per source), so that ranks with another seed, another
``num_shards`` or batch size, another dataset, or one ``shard_id`` between
two of them raise, on every rank, naming what differs. (The daemon
compares the sessions that share a ``job_id`` on its node: see
``LoaderSource(job_id=...)``.)"""

from __future__ import annotations

import sys
from typing import Any, Optional

from . import _content
from ._errors import RankMismatchError
from ._wire import Content

_ARGS = ("batch_size", "num_shards", "random_shuffle", "shuffle", "seed", "initial_fill", "pad_last_batch", "stick_to_shard")
"""The sampling arguments every rank of a job must agree on."""


def terms(args: dict[str, Any]) -> dict[str, Any]:
    """The sampling arguments that shape a rank's epochs, as the daemon
    compares them: ``shuffle`` counts with ``random_shuffle`` only; ``seed``
    with ``shuffle="permute"`` only; ``initial_fill`` never (None where they
    do not count). With ``shuffle="dali"`` shards are fixed ranges of an
    order no seed changes: a rank's seed and buffer order its own samples
    only, and DALI's own examples give each rank its seed."""
    t = {k: args[k] for k in _ARGS}
    if not t["random_shuffle"]:
        t["shuffle"] = None
    if t["shuffle"] != "permute":
        t["seed"] = None
    t["initial_fill"] = None
    return t


class Peers:
    """The ranks of a ``torch.distributed`` process group this source is
    compared with: ``exchange`` is one ``all_gather_object`` on it, which
    every rank of the group must reach, once per source, in the same
    order."""

    def __init__(self, dist: Any, group: Any, size: int, rank: int) -> None:
        self._dist, self._group, self.size, self.rank = dist, group, size, rank

    def _exchange(self, mine: dict[str, Any]) -> list[dict[str, Any]]:
        out: list[Any] = [None] * self.size
        self._dist.all_gather_object(out, mine, group=self._group)
        return out

    def fail(self, err: BaseException) -> None:
        """Tells the other ranks this one could not open its source (they
        raise naming it); the caller raises ``err`` on this rank."""
        self._exchange({"rank": self.rank, "error": f"{type(err).__name__}: {err}"})

    def compare(self, dataset: str, fingerprint: str, shard_id: int, args: dict[str, Any],
                content: Optional[Content] = None) -> None:
        """Raises ``RankMismatchError`` on every rank, naming each
        difference, unless every rank of the group opened ``dataset``'s
        fingerprint with the same sampling, each its own ``shard_id``, and
        the group has ``num_shards`` ranks. Each rank's copy of the dataset
        is compared by its ``content`` (names, sizes, labels), naming the
        first samples that differ."""
        mine = {"rank": self.rank, "dataset": dataset, "fingerprint": fingerprint, "shard_id": shard_id, "terms": terms(args),
                "content": content}
        gathered = self._exchange(mine)
        problems = disagreements(gathered)
        if not any("error" in g for g in gathered):
            problems += _content.differences(dataset, gathered)
        if problems:
            raise RankMismatchError(
                f"ranks disagree (torch.distributed, {self.size} ranks, this is rank {self.rank}): " + "; ".join(problems)
                + ". Every rank must open the same dataset with the same sampling arguments and its own shard_id "
                "(its rank in the group): pass process_group= for a group of data-parallel ranks, or check_ranks=False "
                "for a source not built on every rank", 409)


def peers(num_shards: object, process_group: Any, check: bool) -> Optional[Peers]:
    """The group to compare a source of ``num_shards`` shards with: the
    default group (or ``process_group``) when ``torch.distributed`` is
    initialised in this process, the source is sharded (``num_shards`` >
    1: a source of the whole dataset may well be built on one rank only,
    and a collective there would wait forever) and ``check`` is on; not in
    a DataLoader worker (not a member of the group). Never imports torch:
    a process that has not imported it has no process group."""
    if not check or not isinstance(num_shards, int) or isinstance(num_shards, bool) or num_shards <= 1:
        return None
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    data = sys.modules.get("torch.utils.data")
    if data is not None and data.get_worker_info() is not None:
        return None
    rank = dist.get_rank(process_group)
    if rank < 0:  # not a member of process_group
        return None
    return Peers(dist, process_group, dist.get_world_size(process_group), rank)


def _ranks(rs: list[int]) -> str:
    """'rank 3' or 'ranks 0, 2' (the first eight, then a count)."""
    shown = ", ".join(str(r) for r in rs[:8]) + (f" and {len(rs) - 8} more" if len(rs) > 8 else "")
    return f"rank{'s' if len(rs) > 1 else ''} {shown}"


def _by_value(name: str, values: list[tuple[int, Any]], show: Any = repr) -> Optional[str]:
    """'seed: 12 on ranks 0, 2; 13 on rank 1', or None when all agree."""
    groups: dict[Any, list[int]] = {}
    for rank, v in values:
        groups.setdefault(v, []).append(rank)
    if len(groups) < 2:
        return None
    return f"{name}: " + "; ".join(f"{show(v)} on {_ranks(rs)}" for v, rs in groups.items())


def disagreements(gathered: list[dict[str, Any]]) -> list[str]:
    """What the ranks' descriptions (one per rank, in rank order) disagree
    on, each naming the argument and the value of each rank."""
    failed = [g for g in gathered if "error" in g]
    if failed:
        return [f"rank {g['rank']} could not open its source ({g['error']})" for g in failed]
    out: list[str] = []
    fp = _by_value("dataset", [(g["rank"], (g["dataset"], g["fingerprint"])) for g in gathered],
                   show=lambda v: f"{v[0]!r} (fingerprint {v[1]})")
    if fp is not None and len({g["fingerprint"] for g in gathered}) > 1:
        out.append(fp)
    shuffled = {g["terms"]["random_shuffle"] for g in gathered}
    for name in _ARGS:
        if name in ("shuffle", "seed", "initial_fill") and len(shuffled) > 1:
            continue  # random_shuffle differs: that is the difference
        if name == "seed" and len({g["terms"]["shuffle"] for g in gathered}) > 1:
            continue  # shuffle differs: that is the difference
        d = _by_value(name, [(g["rank"], g["terms"][name]) for g in gathered])
        if d is not None:
            out.append(d)
    shards: dict[int, list[int]] = {}
    for g in gathered:
        shards.setdefault(g["shard_id"], []).append(g["rank"])
    for shard, rs in sorted(shards.items()):
        if len(rs) > 1:
            out.append(f"shard_id {shard} on {_ranks(rs)}: they read the same samples")
    nums = {g["terms"]["num_shards"] for g in gathered}
    if len(nums) == 1:
        n = nums.pop()
        unread = [s for s in range(n) if s not in shards]
        if unread:
            shown = ", ".join(str(s) for s in unread[:8]) + (f" and {len(unread) - 8} more" if len(unread) > 8 else "")
            out.append(f"num_shards {n} with {len(gathered)} ranks in the group: shard{'s' if len(unread) > 1 else ''} "
                       f"{shown} read by no rank (never seen)")
    return out
