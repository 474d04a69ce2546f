# SPDX-License-Identifier: Apache-2.0
"""WebDataset sources (``mkbmap --reader webdataset``): the arguments
``fn.readers.webdataset`` takes for its samples' components are
checked in ``_args``. Here: a batch of samples with K components as K outputs, one list (or
DALI tensor list) of views per ``ext`` entry, as that reader returns
them. Nothing here talks to the daemon."""

from __future__ import annotations

from typing import Any, Optional, Union

from ._args import MissingComponent as MissingComponent
from ._errors import LoaderError
from ._views import Mapped, Sample, samples

Components = tuple[Union[list[Sample], Any], ...]
"""A WebDataset batch: one output per ``ext`` entry, each a list of the
samples' components (1-D uint8 views of batch memory, or ``CudaArray``;
an empty component is a zero-length one), or with ``batch_format="dali"``
one ``TensorListCPU`` a component."""


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
        offs, lens = [offsets[i * k + j] for i in rows], [lengths[i * k + j] for i in rows]
        if m.dali is not None and m.gpu is None:
            out.append(m.dali.views(m.buf, offs, lens))
            continue
        views = samples(m, offs, lens)
        out.append(views if m.dali is None else m.dali.samples(views))
    return tuple(out)


def count_samples(k: int, offsets: list[int]) -> int:
    """The samples in a descriptor of ``k`` components a sample."""
    return len(offsets) // k if k > 0 else len(offsets)
