# SPDX-License-Identifier: Apache-2.0
"""A resume on another number of ranks or batch size (docs/resume.md).

Ranks save in lockstep, so rank 0's state stands for all. Resumed with
other ``num_shards`` or ``batch_size``, the epoch it was taken in goes on
as a *resumed epoch*: its list is the samples no rank had received, for
each old shard in order those past its first ``batch * batch_size``, and
the new ranks shard that list as DALI shards any epoch. The state keeps
one *stage* per interrupted run (its ``num_shards``, ``batch_size`` and
``batch``), never samples; the daemon computes the order through them
(``loader.Stage``). Later epochs are a fresh run's with the new ranks.

A loop counts a resumed epoch's batches on from those its earlier runs
received (the stages' ``batch``): a loop that saved at batch b of the
epoch resumes at loop batch b, and the epoch has b more batches than its
list's. ``LoaderDataset`` and Lightning number batches so.
"""

from __future__ import annotations

from typing import Optional, cast

from ._wire import Sampling, Stage, State

STATE_VERSION = 3
"""The first daemon ``State`` version that has ``stages``. A state keeps
its own version where higher: the version selects the order (4 computes
a file dataset's permutation, 3 and less list it: loader.StateVersion)."""


def left(n: int, stage: Stage) -> int:
    """The samples a stage leaves of a list of n: each of its shards holds
    ``n // num_shards`` samples or one more, and gave its first
    ``batch * batch_size``."""
    c = stage["batch"] * stage["batch_size"]
    return 0 if c > n // stage["num_shards"] else n - stage["num_shards"] * c


def resumed(state: State) -> Optional[tuple[int, int, int]]:
    """A resumed state's epoch, its list's length and the batches its
    earlier runs received (the loop's offset); ``None`` for a whole epoch."""
    stages = state.get("stages") or []
    if not stages:
        return None
    n = state["sampling"]["n"]
    for st in stages:
        n = left(n, st)
    return state["epoch"], n, sum(st["batch"] for st in stages)


def at(state: State, epoch: int, batch: int) -> State:
    """``state`` moved to (epoch, batch): its stages only in its own epoch."""
    out = cast(State, {k: v for k, v in state.items() if k != "stages"})
    out["epoch"], out["batch"] = epoch, batch
    if epoch == state["epoch"] and state.get("stages"):
        out["stages"] = state["stages"]
    return out


def for_run(state: State, shard_id: int, num_shards: int, batch_size: int) -> State:
    """Rank ``shard_id`` of ``num_shards``' state from any rank's state
    (rank 0's): the same position on the same shards and batch size, else
    the state's epoch resumed with one more stage (``with_stage``). Whether
    the sampling allows it is the daemon's check: it refuses
    ``shuffle="dali"``, ``shuffle_after_epoch`` and ``stick_to_shard``,
    saying why."""
    s = cast(Sampling, dict(state["sampling"]))
    old = int(s.get("num_shards") or 1), int(s.get("batch_size") or 0)
    s["shard_id"] = shard_id
    if old == (num_shards, batch_size):
        return cast(State, dict(state, sampling=s))
    return with_stage(state, {"num_shards": old[0], "batch_size": old[1], "batch": int(state["batch"])},
                      shard_id, num_shards, batch_size)


def with_stage(state: State, stage: Stage, shard_id: int, num_shards: int, batch_size: int) -> State:
    """Rank ``shard_id`` of ``num_shards``' state for the state's epoch
    resumed after ``stage`` (its run's ranks each gave the first
    ``batch * batch_size`` samples of it): the next epoch's start when no
    sample is left."""
    s = cast(Sampling, dict(state["sampling"]))
    s["shard_id"], s["num_shards"], s["batch_size"] = shard_id, num_shards, batch_size
    r = resumed(state)
    n = r[1] if r is not None else int(s["n"])
    out: State = {"version": max(STATE_VERSION, int(state["version"])), "sampling": s, "epoch": int(state["epoch"]),
                  "batch": 0}
    if state.get("content") is not None:
        out["content"] = state["content"]  # the daemon checks its copy against it
    if left(n, stage) == 0:  # every sample of the epoch was received
        out["version"], out["epoch"] = int(state["version"]), out["epoch"] + 1
    elif stage["batch"] == 0:  # a stage that received nothing leaves the list as it was: no stage (MaxStages)
        if state.get("stages"):
            out["stages"] = list(state["stages"])
    else:
        out["stages"] = list(state.get("stages") or []) + [stage]
    return out


def for_source(state: State, shard_id: int, num_shards: int, batch_size: int) -> State:
    """``LoaderSource(state=...)``'s state: ``for_run``'s, so any rank's
    state (rank 0's) resumes this rank, as ``load_state_dict`` does. A
    state that is not a ``State`` goes as given: the daemon refuses it
    (``BadRequestError`` naming it)."""
    s = state.get("sampling") if isinstance(state, dict) else None
    if not isinstance(s, dict) or "epoch" not in state or "batch" not in state:
        return state
    try:
        return for_run(state, shard_id, num_shards, batch_size)
    except (TypeError, ValueError):
        return state
