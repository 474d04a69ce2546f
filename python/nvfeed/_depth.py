# SPDX-License-Identifier: Apache-2.0
"""How long DALI may still read a batch it was fed, from the pipeline's
queue depths, and so the ``release_after`` a source needs under it.

With ``fn.external_source(no_copy=True)`` DALI reads the source's memory
where it lies. Its documentation of ``no_copy`` says a fed buffer may be
reused once the pipeline has run ``prefetch_queue_depth`` more iterations
after it was fed, or ``cpu_size * gpu_size`` of them with separated queues
(``prefetch_queue_depth={"cpu_size": c, "gpu_size": g}``) of unequal
sizes; before its first output the pipeline calls the source
``prefetch_queue_depth`` times (``max(c, g)`` with separated queues). One
batch more is kept: the output ``run()`` returned last may be a view of it
(a pipeline that returns the undecoded bytes). A source whose batches go
back to the daemon sooner has them overwritten while DALI reads them:
measured at depth 8 with ``release_after=3`` (the daemon's default), 12 to
37 of 46 batches came out of the pipeline with other samples' bytes, and
the decoder failed on bytes overwritten under it."""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

from ._args import MAX_RELEASE_AFTER


def find_pipeline(frames: bool) -> Optional[Any]:
    """The DALI pipeline this source is used in, if any: the current one
    (set while DALI builds a pipeline's graph, when it calls ``iter()`` on
    an iterable source), else, with ``frames``, the pipeline whose input
    callbacks are calling this source (a callable source such as
    ``src.batch``, found among the callers' frames). None without DALI
    imported."""
    mod = sys.modules.get("nvidia.dali.pipeline")
    if mod is None:
        return None
    pipeline = getattr(mod, "Pipeline", None)
    if pipeline is None:
        return None
    current = pipeline.current()
    if current is not None or not frames:
        return current
    # Only DALI's own frames are looked into: reading a frame's f_locals
    # keeps a snapshot of its variables (before Python 3.13), which would
    # keep a caller's objects alive after it dropped them.
    where = os.path.dirname(mod.__file__ or "") + os.sep
    f = sys._getframe(1)
    for _ in range(32):
        f = f.f_back  # type: ignore[assignment]
        if f is None:
            break
        if not f.f_code.co_filename.startswith(where):
            continue
        for name in ("self", "pipeline", "pipe"):
            v = f.f_locals.get(name)
            if isinstance(v, pipeline):
                return v
    return None


def needed(pipe: Any) -> tuple[int, str]:
    """The least ``release_after`` for a source of ``pipe``, and the
    pipeline's depths as its constructor takes them (for messages)."""
    depth = pipe.prefetch_queue_depth
    if isinstance(depth, dict) or getattr(pipe, "exec_separated", False):
        cpu = int(getattr(pipe, "cpu_queue_size", None) or depth.get("cpu_size", depth.get("cpu")))
        gpu = int(getattr(pipe, "gpu_queue_size", None) or depth.get("gpu_size", depth.get("gpu")))
        held = cpu if cpu == gpu else cpu * gpu
        return held + 1, f"prefetch_queue_depth={{'cpu_size': {cpu}, 'gpu_size': {gpu}}}"
    return int(depth) + 1, f"prefetch_queue_depth={int(depth)}"


def release_after_for(pipe: Any, in_effect: int, given: Optional[int]) -> Optional[int]:
    """The ``release_after`` to reopen the source's session with under
    ``pipe``, or None when ``in_effect`` is enough. A ``release_after``
    the caller ``given`` that is too small, or a pipeline that needs more
    than ``MAX_RELEASE_AFTER``, is a ``ValueError`` naming both."""
    need, depths = needed(pipe)
    if in_effect >= need:
        return None
    why = (f"the DALI pipeline's {depths} may still read a batch {need - 1} batches after it was fed "
           f"(fn.external_source(no_copy=True) reads the source's memory in place)")
    if need > MAX_RELEASE_AFTER:
        raise ValueError(f"{why}: this source would need release_after >= {need}, past its range [0, {MAX_RELEASE_AFTER}]: "
                         f"use smaller queue depths, or let DALI copy (no_copy=False)")
    if given is not None:
        raise ValueError(f"release_after={given} is too small: {why}; pass release_after >= {need}, "
                         f"or None to have it derived from the pipeline")
    return need
