# SPDX-License-Identifier: Apache-2.0
"""WebDataset samples that ``missing_component_behavior="skip"`` leaves
out: the daemon counts them when the session opens (the open answer's
``skipped`` and, per ``ext`` entry, ``skipped_lacking``), and the client
says so once an epoch, as its first batch arrives, with a
``UserWarning`` that names the epoch (so Python's filter shows each)."""

from __future__ import annotations

import warnings
from typing import Sequence

from ._wire import OpenResponse


def skipped_of(r: OpenResponse) -> tuple[int, tuple[int, ...]]:
    """The samples the session's skip leaves out, and per ``ext`` entry
    how many of them lack it; ``(0, ())`` from a daemon that gives none."""
    return int(r.get("skipped") or 0), tuple(int(n) for n in (r.get("skipped_lacking") or ()))


def message(dataset: str, epoch: int, ext: Sequence[str], skipped: int, lacking: Sequence[int]) -> str:
    """The warning for ``skipped`` samples left out of ``epoch``."""
    why = ", ".join(f"{n} lack {e!r}" for e, n in zip(ext, lacking) if n) or "a component fills two ext entries"
    return (f"nvfeed: dataset {dataset!r}, epoch {epoch}: missing_component_behavior='skip' left out {skipped} "
            f"samples, the same every epoch ({why}), as DALI's fn.readers.webdataset does (webdataset's "
            "to_tuple would raise on them). To keep them, name their extensions too (';' alternatives, "
            "'jpg;png') or pass missing_component_behavior='empty'.")


def tell(dataset: str, epoch: int, ext: Sequence[str], skipped: tuple[int, tuple[int, ...]]) -> None:
    """Warn that ``skipped`` samples are left out of ``epoch`` (none: no
    warning)."""
    if skipped[0]:
        warnings.warn(message(dataset, epoch, ext, skipped[0], skipped[1]), UserWarning, stacklevel=5)
