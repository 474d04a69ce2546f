# SPDX-License-Identifier: Apache-2.0
"""nvfeed's part of a DALI checkpoint (``enable_checkpointing=True``,
``pipe.checkpoint()``). DALI 2.4 saves its iteration and epoch as a JSON
object, ``pipeline_data``, in the checkpoint, and reads back only those
two keys. A pipeline fed by nvfeed gets its own ``_get_checkpoint`` (an
attribute of that pipeline, not of the class): it writes the same
object with one more key, ``"nvfeed"``, each feeder's entry in it (its
sampling, where its stream started). At restore a feeder reads that key
back from the checkpoint's bytes (``pipe._checkpoint``), where the JSON
text sits verbatim. A DALI without these parts raises here, never
checkpoints without nvfeed's state."""

from __future__ import annotations

import importlib
import json
import warnings
import weakref
from typing import Any, Callable, Optional

from ._errors import LoaderError

KEY = "nvfeed"
"""The key of ``pipeline_data`` that holds nvfeed's entries."""

VERSION = 1
"""The version of that key's value."""

_FEEDERS = "_nvfeed_checkpoint"
"""The pipeline's attribute: the feeders' entry makers by group."""

READERS, SOURCES = "readers", "sources"
"""The groups: ``nvfeed.dali.reader``s in definition order, and
``LoaderSource``s fed to external sources in the order of their first batch."""

Entry = Callable[[], Optional[dict[str, Any]]]
"""A feeder's entry for the checkpoint (None: not opened yet)."""


def checkpointing(pipe: Any) -> bool:
    """Whether ``pipe`` was built with ``enable_checkpointing=True``."""
    return bool(getattr(pipe, "_enable_checkpointing", False))


def hook(pipe: Any, group: str, entry: Entry) -> int:
    """Adds a feeder's entry to ``pipe``'s checkpoints; its index in its group.

    Raises
    ------
    LoaderError
        This DALI's pipeline lacks the parts the hook needs.
    """
    feeders: Optional[dict[str, list[Entry]]] = pipe.__dict__.get(_FEEDERS)
    if feeders is None:
        missing = [a for a in ("_get_checkpoint", "_consumer_iter", "_epoch_idx", "_checkpoint") if not hasattr(pipe, a)]
        backend: Any = importlib.import_module("nvidia.dali.backend")
        if not hasattr(backend, "ExternalContextCheckpoint"):
            missing.append("backend.ExternalContextCheckpoint")
        if missing:
            raise LoaderError("nvfeed: this DALI's checkpoints cannot carry nvfeed's state (its Pipeline lacks "
                              f"{', '.join(missing)}; nvfeed knows DALI 2.4's): build the pipeline without "
                              "enable_checkpointing, or use a DALI nvfeed knows")
        feeders = {READERS: [], SOURCES: []}
        setattr(pipe, _FEEDERS, feeders)
        pipe._get_checkpoint = _Checkpoint(pipe, feeders, backend)
    feeders[group].append(entry)
    return len(feeders[group]) - 1


class _Checkpoint:
    """A pipeline's ``_get_checkpoint``: DALI 2.4's, with nvfeed's key."""

    def __init__(self, pipe: Any, feeders: dict[str, list[Entry]], backend: Any) -> None:
        self._pipe = weakref.ref(pipe)  # the pipeline holds this: no cycle, it goes when its users let go
        self._feeders, self._backend = feeders, backend

    def __call__(self, iterator_data: str = "") -> Any:
        p = self._pipe()
        if p is None:
            raise ReferenceError("nvfeed: the pipeline is gone")
        cpt = self._backend.ExternalContextCheckpoint()
        cpt.pipeline_data = json.dumps({"iter": p._consumer_iter, "epoch_idx": p._epoch_idx,
                                        KEY: {"version": VERSION, **{g: [f() for f in fs] for g, fs in self._feeders.items()}}})
        cpt.iterator_data = iterator_data
        return p._pipe.GetSerializedCheckpoint(cpt)


def sized(pipe: Any) -> bool:
    """Whether the checkpoint ``pipe`` was restored from holds a DALI
    iterator's state that counts epochs (its ``_size``: ``size=`` or
    ``reader_name``)."""
    data = getattr(pipe, "_iterator_data", None)
    if not data:
        return False
    try:
        size = json.loads(data).get("_size", -1)
    except (json.JSONDecodeError, AttributeError):
        return True  # not DALI 2.4's: assume it counts
    return isinstance(size, int) and size > 0


class Saved:
    """What a restored pipeline's checkpoint holds for one feeder."""

    def __init__(self, data: dict[str, Any], group: str, index: int) -> None:
        self.iter, self.epoch_idx = int(data["iter"]), int(data["epoch_idx"])
        """DALI's consumed iteration and its epoch."""
        ours = data.get(KEY)
        self.group: list[Optional[dict[str, Any]]] = []
        """The group's entries."""
        self.known = ours is not None
        """Whether the checkpoint holds nvfeed's key (an older nvfeed's does not)."""
        self.entry: Optional[dict[str, Any]] = None
        """The feeder's entry (None: it had not opened, or no key)."""
        if ours is None:
            return
        if ours.get("version") != VERSION:
            raise LoaderError(f"nvfeed: this DALI checkpoint's nvfeed state is version {ours.get('version')}, this "
                              f"nvfeed reads {VERSION}: restore it with the nvfeed that took it")
        self.group = ours.get(group) or []
        if index < 0:
            return
        if len(self.group) <= index:
            raise LoaderError(f"nvfeed: this DALI checkpoint holds {len(self.group)} nvfeed {group}, the pipeline "
                              f"has one more: restore it into the pipeline that took it")
        self.entry = self.group[index]


def saved(pipe: Any, group: str, index: int) -> Optional[Saved]:
    """What the checkpoint ``pipe`` was restored from holds for feeder
    ``index`` of ``group`` (-1: the group alone); None when restored from none.

    Raises
    ------
    LoaderError
        DALI's pipeline data is not in the checkpoint's bytes, or nvfeed's
        key is of a version this nvfeed does not read.
    """
    cpt = getattr(pipe, "_checkpoint", None)
    if cpt is None:
        return None
    text = cpt.decode("latin-1") if isinstance(cpt, (bytes, bytearray)) else str(cpt)
    at = text.find('{"iter": ')
    while at >= 0:
        try:
            data, _ = json.JSONDecoder().raw_decode(text, at)
        except json.JSONDecodeError:
            data = None
        if isinstance(data, dict) and "epoch_idx" in data:
            return Saved(data, group, index)
        at = text.find('{"iter": ', at + 1)
    raise LoaderError("nvfeed: cannot find DALI's pipeline data in this checkpoint (not DALI 2.4's format)")


def restore_source(pipe: Any, src: Any) -> None:
    """Adds a ``LoaderSource`` fed by ``source=src.batch`` to ``pipe``'s
    checkpoints and checks the checkpoint ``pipe`` was restored from. DALI
    asks such a source for the batches of its own positions (epoch,
    iteration), which name other samples on other shards: a restore on
    other shards or batch size is refused (``nvfeed.dali.reader`` resumes
    one exactly); one by an older nvfeed is warned of.

    Raises
    ------
    LoaderError
        The checkpoint's source of this dataset read other shards or
        batches, or it read no such dataset.
    """
    def entry() -> dict[str, Any]:
        s = src.opened_state["sampling"]
        return {"dataset": src.options.dataset, "fingerprint": src.fingerprint, "num_shards": s["num_shards"],
                "batch_size": s["batch_size"],
                # the order's arguments (seed, shuffle, padding...): the positions DALI asks for name other
                # samples under others. The shard is not one: every rank is at the same position.
                "sampling": {k: v for k, v in s.items() if k not in ("shard_id", "num_shards", "batch_size")}}
    hook(pipe, SOURCES, entry)
    saved_ = saved(pipe, SOURCES, -1)  # compared by dataset: the order of first batches may change
    if saved_ is None:
        return
    if not saved_.known:
        warnings.warn(f"LoaderSource({src.options.dataset!r}): this DALI checkpoint was taken by an nvfeed that did "
                      "not save its state: restored as taken with these num_shards and batch size, which nvfeed "
                      "cannot check. Restored on other ones, the pipeline reads other samples. Take a new "
                      "checkpoint with this nvfeed", RuntimeWarning, stacklevel=6)
        return
    mine = entry()
    same = [e for e in saved_.group if e is not None and e.get("fingerprint") == mine["fingerprint"]]
    if not same:
        raise LoaderError(f"LoaderSource({src.options.dataset!r}): the DALI checkpoint this pipeline was restored "
                          "from holds no source of this dataset (by its fingerprint): restore it into the pipeline "
                          "that took it, reading the same dataset")
    if all((e["num_shards"], e["batch_size"]) != (mine["num_shards"], mine["batch_size"]) for e in same):
        e = same[0]
        raise LoaderError(f"LoaderSource({src.options.dataset!r}): the DALI checkpoint was taken with num_shards="
                          f"{e['num_shards']} and batch_size={e['batch_size']}, this source has {mine['num_shards']} "
                          f"and {mine['batch_size']}: DALI would ask it for the old positions, other samples here. "
                          "Restore with the saved num_shards and batch_size, or read through nvfeed.dali.reader, "
                          "whose checkpoints resume on other shards")
    # An entry of an nvfeed before "sampling" is not compared there.
    if not any(e.get("sampling", mine["sampling"]) == mine["sampling"] for e in same):
        old = same[0]["sampling"]
        diff = ", ".join(f"{k} {old.get(k)!r} (now {mine['sampling'].get(k)!r})"
                         for k in sorted(set(old) | set(mine["sampling"])) if old.get(k) != mine["sampling"].get(k))
        raise LoaderError(f"LoaderSource({src.options.dataset!r}): the DALI checkpoint was taken with other sampling "
                          f"arguments: {diff}. DALI would ask this source for the old positions, which name other "
                          "samples in this order: restore with the saved arguments")
