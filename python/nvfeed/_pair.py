# SPDX-License-Identifier: Apache-2.0
"""A batch's samples and labels through two ``fn.external_source`` of
one DALI pipeline: every output of one external source lives on its
device, so GPU samples (``device="gpu"``) and host labels
(``device="cpu"``) need two sources fed from the same batch.

DALI calls a pipeline's external-source callbacks once each per
iteration, but in no defined order (it collects them in a ``set``:
``Pipeline._setup_input_callbacks``), so "the labels of the batch
yielded last" would pair a batch's samples with the previous batch's
labels whenever DALI asks for the labels first. Here whichever half is
asked for first fetches the batch and keeps the other half for the
other call; asking for the same half twice before the other one was
taken is an error, never a silent shift."""

from __future__ import annotations

from typing import Any, Callable, Optional

from ._errors import LoaderError

Position = tuple[int, int]
"""(epoch, iteration) of a batch."""

_NAMES = ("samples", "labels")
_END = object()  # the other half of a StopIteration


def batch_position(info: Any) -> Optional[Position]:
    """The batch DALI asks for: ``None`` for the next one in order (no
    argument, or the iteration number DALI passes to a callable that takes
    one without ``batch_info=True``); (epoch, iteration) for DALI's
    ``BatchInfo``. TypeError for anything else."""
    if info is None or (isinstance(info, int) and not isinstance(info, bool)):
        return None
    if hasattr(info, "epoch_idx") and hasattr(info, "iteration"):
        return int(info.epoch_idx), int(info.iteration)
    raise TypeError(f"expected DALI's BatchInfo, an iteration number or nothing, got {type(info).__name__}")


Fetch = Callable[[Optional[Position]], tuple[Position, Any, Any]]
"""``fetch(at)``: ``(position, samples, labels)`` of the batch at ``at``
(the next one for ``None``); StopIteration at the end of an epoch."""


class BatchHalves:
    """Hands out each batch in two halves, samples and labels, to two
    callers, whichever asks first; a StopIteration of the fetch is raised
    to both in turn. (The fetch is passed with each call, not kept: no
    reference cycle with the source.)"""

    def __init__(self) -> None:
        self._pending: Optional[tuple[int, Optional[Position], Any]] = None  # (half waiting, its batch, its value)

    def take(self, half: int, info: Any, fetch: Fetch) -> Any:
        """Half ``half`` (0 samples, 1 labels) of the current batch, fetching
        the next batch when neither half of one waits."""
        at = batch_position(info)
        p = self._pending
        if p is None:
            try:
                pos, samples, labels = fetch(at)
            except StopIteration:
                self._pending = (1 - half, None, _END)
                raise
            self._pending = (1 - half, pos, (samples, labels)[1 - half])
            return (samples, labels)[half]
        waiting, held, value = p
        if waiting != half:
            where = f"epoch {held[0]} batch {held[1]}" if held is not None else "the end of the epoch"
            raise LoaderError(f"LoaderSource.{_NAMES[half]} asked for twice before LoaderSource.{_NAMES[waiting]} took "
                              f"its half of {where}: pass src.samples and src.labels as the sources of two "
                              "fn.external_source of one pipeline (batch=True, parallel=False), each called once "
                              "per iteration; src.samples is not for use without src.labels")
        if at is not None and held is not None and at != held:
            raise LoaderError(f"LoaderSource.{_NAMES[half]} asked for epoch {at[0]} batch {at[1]}, but "
                              f"LoaderSource.{_NAMES[1 - half]} took epoch {held[0]} batch {held[1]}")
        self._pending = None
        if value is _END:
            raise StopIteration
        return value

    def clear(self) -> None:
        """Forgets a half that waits (the source closed)."""
        self._pending = None
