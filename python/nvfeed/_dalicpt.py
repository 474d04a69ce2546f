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
from typing import Any, Callable, Optional

from ._errors import LoaderError

KEY = "nvfeed"
"""The key of ``pipeline_data`` that holds nvfeed's entries."""

VERSION = 1
"""The version of that key's value."""

_FEEDERS = "_nvfeed_checkpoint"
"""The pipeline's attribute: the feeders' entry makers, in definition order."""

Entry = Callable[[], Optional[dict[str, Any]]]
"""A feeder's entry for the checkpoint (None: not opened yet)."""


def checkpointing(pipe: Any) -> bool:
    """Whether ``pipe`` was built with ``enable_checkpointing=True``."""
    return bool(getattr(pipe, "_enable_checkpointing", False))


def hook(pipe: Any, entry: Entry) -> int:
    """Adds a feeder's entry to ``pipe``'s checkpoints; its index.

    Raises
    ------
    LoaderError
        This DALI's pipeline lacks the parts the hook needs.
    """
    feeders: Optional[list[Entry]] = pipe.__dict__.get(_FEEDERS)
    if feeders is None:
        missing = [a for a in ("_get_checkpoint", "_consumer_iter", "_epoch_idx", "_checkpoint") if not hasattr(pipe, a)]
        backend: Any = importlib.import_module("nvidia.dali.backend")
        if not hasattr(backend, "ExternalContextCheckpoint"):
            missing.append("backend.ExternalContextCheckpoint")
        if missing:
            raise LoaderError("nvfeed: this DALI's checkpoints cannot carry nvfeed's state (its Pipeline lacks "
                              f"{', '.join(missing)}; nvfeed knows DALI 2.4's): build the pipeline without "
                              "enable_checkpointing, or use a DALI nvfeed knows")
        feeders = []
        setattr(pipe, _FEEDERS, feeders)
        pipe._get_checkpoint = _Checkpoint(pipe, feeders, backend)
    feeders.append(entry)
    return len(feeders) - 1


class _Checkpoint:
    """A pipeline's ``_get_checkpoint``: DALI 2.4's, with nvfeed's key."""

    def __init__(self, pipe: Any, feeders: list[Entry], backend: Any) -> None:
        self._pipe, self._feeders, self._backend = pipe, feeders, backend  # the pipeline holds this: a cycle

    def __call__(self, iterator_data: str = "") -> Any:
        p = self._pipe
        cpt = self._backend.ExternalContextCheckpoint()
        cpt.pipeline_data = json.dumps({"iter": p._consumer_iter, "epoch_idx": p._epoch_idx,
                                        KEY: {"version": VERSION, "feeders": [f() for f in self._feeders]}})
        cpt.iterator_data = iterator_data
        return p._pipe.GetSerializedCheckpoint(cpt)


class Saved:
    """What a restored pipeline's checkpoint holds for one feeder."""

    def __init__(self, data: dict[str, Any], index: int) -> None:
        self.iter, self.epoch_idx = int(data["iter"]), int(data["epoch_idx"])
        """DALI's consumed iteration and its epoch."""
        ours = data.get(KEY)
        self.known = ours is not None
        """Whether the checkpoint holds nvfeed's key (an older nvfeed's does not)."""
        self.entry: Optional[dict[str, Any]] = None
        """The feeder's entry (None: it had not opened, or no key)."""
        if ours is None:
            return
        if ours.get("version") != VERSION:
            raise LoaderError(f"nvfeed: this DALI checkpoint's nvfeed state is version {ours.get('version')}, this "
                              f"nvfeed reads {VERSION}: restore it with the nvfeed that took it")
        feeders = ours.get("feeders") or []
        if len(feeders) <= index:
            raise LoaderError(f"nvfeed: this DALI checkpoint holds {len(feeders)} nvfeed feeder(s), the pipeline "
                              f"defines one more: restore it into the pipeline that took it")
        self.entry = feeders[index]


def saved(pipe: Any, index: int) -> Optional[Saved]:
    """What the checkpoint ``pipe`` was restored from holds for feeder
    ``index``; None when restored from none.

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
            return Saved(data, index)
        at = text.find('{"iter": ', at + 1)
    raise LoaderError("nvfeed: cannot find DALI's pipeline data in this checkpoint (not DALI 2.4's format)")
