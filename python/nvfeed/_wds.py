# SPDX-License-Identifier: Apache-2.0
"""WebDataset sources (``mkbmap --reader webdataset``): the arguments
``fn.readers.webdataset`` takes for its samples' components (``ext``,
``missing_component_behavior``, ``case_sensitive_extensions``), checked,
and a batch of samples with K components as K outputs, one list (or
DALI tensor list) of views per ``ext`` entry, as that reader returns
them. Nothing here talks to the daemon."""

from __future__ import annotations

from typing import Any, Literal, Optional, Sequence, Union

from ._errors import LoaderError
from ._views import Mapped, Sample, samples

MissingComponent = Literal["empty", "skip", "error"]
"""``missing_component_behavior``: a sample lacking a component gets an
empty one (DALI's default), is left out, or is an error."""

MISSING: tuple[str, ...] = ("empty", "skip", "error")

Components = tuple[Union[list[Sample], Any], ...]
"""A WebDataset batch: one output per ``ext`` entry, each a list of the
samples' components (1-D uint8 views of batch memory, or ``CudaArray``;
an empty component is a zero-length one), or with ``batch_format="dali"``
one ``TensorListCPU`` a component."""


def ext_arg(ext: object) -> tuple[str, ...]:
    """``ext`` as ``fn.readers.webdataset`` takes it: one string or a list
    of strings, each an extension or ``;``-separated alternatives, no
    leading dot.

    Raises
    ------
    ValueError
        ``ext`` is empty, or an entry (or an alternative of one) is empty
        or not a string.
    """
    entries: Sequence[object] = [ext] if isinstance(ext, str) else ext if isinstance(ext, (list, tuple)) else []
    if not entries:
        raise ValueError(f"ext must be an extension or a list of them (fn.readers.webdataset's ext, e.g. "
                         f"['jpg', 'cls'] or ['jpg;png', 'cls']), got {ext!r}")
    for e in entries:
        if not isinstance(e, str) or not all(a for a in e.split(";")):
            raise ValueError(f"ext: each entry must be an extension or ';'-separated alternatives, none empty, "
                             f"got {e!r} in {ext!r}")
    return tuple(str(e) for e in entries)


def missing_arg(value: object) -> MissingComponent:
    """``missing_component_behavior`` checked; DALI's ``""`` is its
    default, ``"empty"``.

    Raises
    ------
    ValueError
        Not one of ``"empty"``, ``"skip"``, ``"error"`` (or ``""``).
    """
    if value == "":
        return "empty"
    if value not in MISSING:
        raise ValueError(f"missing_component_behavior must be 'empty', 'skip' or 'error' (as in "
                         f"fn.readers.webdataset), got {value!r}")
    return value  # type: ignore[return-value]


def outputs(m: Mapped, k: int, offsets: list[int], lengths: list[int], keep: Optional[list[int]]) -> Components:
    """The batch's components as ``k`` outputs: descriptor entry
    ``i * k + j`` is sample ``i``'s component ``j`` (sample-major);
    ``keep``, when given, the samples kept (the others failed).

    Raises
    ------
    LoaderError
        The descriptor does not hold ``k`` entries a sample.
    """
    if k <= 0 or len(offsets) % k or len(lengths) != len(offsets):
        raise LoaderError(f"loaderd: a WebDataset batch of {len(offsets)} offsets and {len(lengths)} lengths is not "
                          f"{k} components a sample")
    rows = range(len(offsets) // k) if keep is None else keep
    out: list[Union[list[Sample], Any]] = []
    for j in range(k):
        views = samples(m, [offsets[i * k + j] for i in rows], [lengths[i * k + j] for i in rows])
        out.append(views if m.dali is None else m.dali.samples(views))
    return tuple(out)


def count_samples(k: int, offsets: list[int]) -> int:
    """The samples in a descriptor of ``k`` components a sample."""
    return len(offsets) // k if k > 0 else len(offsets)
