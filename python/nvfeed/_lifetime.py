# SPDX-License-Identifier: Apache-2.0
"""How long a batch a source hands out stays valid: views of the batch
memory or copies of it, decided per source by who consumes the batches.

A batch's slot goes back to the daemon ``release_after`` batches later,
and the daemon then reads other samples into it: a view kept past that
shows other bytes, with no error. Fed to DALI's ``fn.external_source``
the batches stay views (DALI copies them, or with ``no_copy=True``
``release_after`` covers its queues: ``_depth``); iterated by user code
they are copies, one ``memcpy`` of the batch's bytes, whose memory is
the batch's own for as long as it is referenced, unless the source was
opened with ``zero_copy=True`` (views, valid until ``release_after``
more batches were taken). GPU batches are never copied here: outside
DALI they need ``zero_copy=True``."""

from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Any, Optional, cast

import numpy as np

from ._views import Mapped
from ._wire import NextResponse

ALIGN = 64
"""A copy starts at a multiple of this offset of the batch memory (which
is page-aligned), so every array in it keeps its alignment."""


_DALI_CODE = os.path.join("nvidia", "dali", "")
_DEPTH = 24  # frames looked through: DALI's callback, the reader form's stream, the source's own


def called_by_dali() -> bool:
    """Whether DALI's code is on the stack above this call: the batch is
    fetched for a pipeline (its callback, its iterable source, its
    reader form), not for a loop of the user's."""
    f: Optional[FrameType] = sys._getframe(1)
    for _ in range(_DEPTH):
        if f is None:
            return False
        if _DALI_CODE in f.f_code.co_filename:
            return True
        f = f.f_back
    return False


class Lifetime:
    """A source's choice between views and copies: ``zero_copy`` as
    given; ``dali`` set once DALI is found consuming the batches."""

    def __init__(self, zero_copy: bool) -> None:
        self.zero_copy = zero_copy
        self.dali = False

    def copies(self, gpu: bool, dataset: str) -> bool:
        """Whether the next batch is handed out as a copy: a view only
        with ``zero_copy``, or when DALI, found feeding on this source,
        asks for this very batch (the call comes from DALI's code). A
        source that fed a pipeline and is then read by a loop of its
        own gets copies. ``ValueError`` for GPU batches read outside
        DALI without ``zero_copy``: the client does not copy GPU memory,
        and a view would change under the caller."""
        if self.zero_copy or (self.dali and called_by_dali()):
            return False
        if gpu:
            raise ValueError(f"LoaderSource({dataset!r}, device='gpu') read outside DALI: its batches view GPU batch "
                             "memory that goes back to the daemon release_after batches later, and this client does "
                             "not copy GPU memory. Pass zero_copy=True to take views with that lifetime (clone what "
                             "you keep), or read through nvfeed.torch.LoaderDataset(device='cuda'), which copies")
        return True


def own(m: Mapped, r: NextResponse) -> tuple[Mapped, NextResponse]:
    """The batch ``r`` copied out of the mapping ``m``: a mapping over a
    fresh copy of the bytes its samples span, and ``r`` with its offsets
    into that copy (an empty sample's at 0). One copy a batch."""
    offsets, lengths = r["offsets"], r["lengths"]
    spans = [(o, n) for o, n in zip(offsets, lengths) if n > 0]
    lo = min((o for o, _ in spans), default=0) // ALIGN * ALIGN
    hi = max((o + n for o, n in spans), default=lo)
    buf = m.buf[lo:hi].copy()
    out = cast(dict[str, Any], dict(r))
    out["offsets"] = [o - lo if n > 0 else 0 for o, n in zip(offsets, lengths)]
    return Mapped(buf, buf, None, m.dali), cast(NextResponse, out)
