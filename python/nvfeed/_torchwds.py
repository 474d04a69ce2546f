# SPDX-License-Identifier: Apache-2.0
"""A WebDataset batch for ``nvfeed.torch.LoaderDataset``, as users of
``webdataset.WebDataset(...).to_tuple(...)`` take samples: one entry per
``ext`` entry, each a list of the samples' component bytes (``bytes``
objects: copies, valid for as long as they are kept), or tensors
(``zero_copy`` views, or GPU memory); integer components (``cls`` and
the other extensions ``webdataset``'s decoder turns into ``int``)
decoded into one int64 tensor where asked."""

from __future__ import annotations

from typing import Any, Union

import torch

from ._errors import LoaderError
from ._torchviews import TorchViews
from ._wds import Components

INT_EXTENSIONS = frozenset({"cls", "cls2", "class", "count", "index", "inx", "id"})
"""Extensions ``webdataset``'s ``.decode()`` reads as an integer (its
``basichandlers``): their components are decimal text."""

Component = Union[list[bytes], list[torch.Tensor], torch.Tensor]
"""One output of a WebDataset batch: the samples' bytes, tensors, or
(decoded labels) an int64 tensor of shape (batch,)."""


def is_label(ext: str) -> bool:
    """Whether every alternative of the ``ext`` entry is an integer
    extension (``"cls"``, ``"cls;class"``)."""
    return all(a.lower() in INT_EXTENSIONS for a in ext.split(";"))


def decode_labels(ext: str, components: list[Any]) -> torch.Tensor:
    """The ``ext`` components (decimal text, as ``webdataset`` writes
    ``.cls``) as one int64 tensor of shape (batch,).

    Raises
    ------
    LoaderError
        A component is not an integer's text (an empty one included),
        naming its position in the batch.
    """
    out = []
    for i, c in enumerate(components):
        raw = bytes(memoryview(c)) if not isinstance(c, torch.Tensor) else c.cpu().numpy().tobytes()
        try:
            out.append(int(raw.decode("ascii").strip()))
        except (UnicodeDecodeError, ValueError):
            raise LoaderError(f"LoaderDataset: sample {i} of the batch has a .{ext} component {raw[:32]!r} that "
                              "is not an integer (decode_labels=True decodes it as webdataset's .decode() "
                              "does)") from None
    return torch.tensor(out, dtype=torch.int64)


def batch(views: TorchViews, ext: tuple[str, ...], b: Components, labels: bool) -> tuple[Component, ...]:
    """The batch's outputs, one per ``ext`` entry: ``bytes`` copies on the
    CPU by default, tensors with ``zero_copy`` or on a GPU; with
    ``labels``, integer entries (``is_label``) as int64 tensors."""
    out: list[Component] = []
    for e, comp in zip(ext, b):
        items = list(comp)
        if labels and is_label(e):
            out.append(decode_labels(e, items))
        elif views.device.type == "cpu" and not views.zero_copy:
            out.append([bytes(memoryview(c)) for c in items])
        else:
            out.append(views.tensors(items))
    return tuple(out)
