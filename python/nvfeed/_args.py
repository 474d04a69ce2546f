# SPDX-License-Identifier: Apache-2.0
"""Every argument of a source checked where it enters, before any daemon
is asked: the same ranges as the daemon's (docs/protocol.md's bounds
table), and a ``ValueError`` naming the argument, its range and what was
given. No number takes a default for 0.

The bounds below are the daemon's Go constants, each named beside it; the
Go test ``TestPythonBoundsAreTheDaemons`` (cmd/loaderd/internal/wire)
reads this file and fails when one differs from its constant, so write
them as a decimal, ``1 << n`` or ``(1 << n) - 1``."""

from __future__ import annotations

import operator
import os
import unicodedata
from typing import Literal, Optional, Sequence

import numpy as np

MAX_BATCH_SIZE = 1 << 16
"""The largest ``batch_size`` (loader.MaxBatchSize)."""
MAX_SHARDS = (1 << 31) - 1
"""The largest ``num_shards`` (loader.MaxSamples: a dataset has at most 2**31 - 1 samples)."""
MAX_PREFETCH = 64
"""The largest ``prefetch_queue_depth`` (session.MaxPrefetch, loader.MaxPrefetchQueueDepth)."""
MAX_RELEASE_AFTER = 64
"""The largest ``release_after`` (session.MaxReleaseAfter)."""
MAX_DEVICE = 1023
"""The largest ``device_id`` (session.MaxDevice)."""
MAX_SEED = (1 << 64) - 1
MIN_INT64, MAX_INT64 = -(1 << 63), (1 << 63) - 1
"""DALI's int64 arguments' range (``shuffle_after_epoch_seed``: DALI
silently uses its default for a value past it; nvfeed refuses it)."""
"""The largest ``seed``: an unsigned 64-bit integer."""
MAX_INITIAL_FILL = 1 << 24
"""The largest ``initial_fill`` (loader.MaxInitialFill)."""
MAX_JOB_ID = 128
"""The most bytes of ``job_id`` (session.MaxJobID)."""
FINGERPRINT_LEN = 32
"""A dataset fingerprint's length: lowercase hex digits (bmap.FingerprintLen)."""


def int_arg(name: str, value: object, lo: int, hi: int, note: str = "") -> int:
    """``value`` as an ``int`` in ``[lo, hi]`` (any integer type, numpy's
    included; not a bool), or a ``ValueError`` naming ``name``, the range
    and the value (``note`` added after the range)."""
    v: Optional[int] = None
    if not isinstance(value, bool):
        try:
            v = operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            v = None
    if v is None or not lo <= v <= hi:
        raise ValueError(f"{name} must be an int in [{lo}, {hi}]{note}, got {value!r}")
    return v


def bool_arg(name: str, value: object) -> bool:
    """``value`` as a ``bool`` (a numpy bool too), or a ``ValueError``
    naming ``name``: 1 or "yes" are not taken for True."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ValueError(f"{name} must be True or False, got {value!r}")


def job_id_arg(value: object) -> str:
    """A ``job_id``: ``None`` or ``""`` (no job, returned as ``""``), or at
    most ``MAX_JOB_ID`` bytes of UTF-8 without control characters."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"job_id must be a str of at most {MAX_JOB_ID} bytes, got {value!r}")
    n = len(value.encode("utf-8", errors="replace"))
    if n > MAX_JOB_ID:
        raise ValueError(f"job_id must be a str of at most {MAX_JOB_ID} bytes, got one of {n} bytes")
    for ch in value:
        if unicodedata.category(ch) in ("Cc", "Cs"):
            raise ValueError(f"job_id must have no control characters, got {value!r}")
    return value


def fingerprint_arg(value: object) -> str:
    """A dataset ``fingerprint``: ``None`` or ``""`` (any, returned as
    ``""``), or ``FINGERPRINT_LEN`` lowercase hex digits (what
    ``LoaderSource.fingerprint`` and ``datasets()`` give)."""
    if value is None or value == "":
        return ""
    if (not isinstance(value, str) or len(value) != FINGERPRINT_LEN
            or any(c not in "0123456789abcdef" for c in value)):
        raise ValueError(f"fingerprint must be {FINGERPRINT_LEN} lowercase hex digits (a source's .fingerprint, "
                         f"or datasets()'), got {value!r}")
    return value


MAX_FILES = 1 << 24
"""The most names ``files=`` may give (the daemon's bound too)."""


def files_arg(files: object, file_list: object) -> tuple[str, ...]:
    """DALI's ``files=`` or ``file_list=`` (a text file of names, one a
    line, read here as the caller; a trailing integer label, as
    ``fn.readers.file``'s lists have, is dropped: the map's labels count)
    as the names the open request carries; ``()`` for neither."""
    if files is not None and file_list is not None:
        raise ValueError("files and file_list cannot both be given (as in DALI)")
    if file_list is not None:
        if not isinstance(file_list, (str, os.PathLike)):
            raise ValueError(f"file_list must be a path to a text file of names, got {file_list!r}")
        names = []
        with open(file_list, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                head, _, tail = line.rpartition(" ")
                names.append(head.strip() if head and tail.lstrip("-").isdigit() else line)
        files = names
    if files is None:
        return ()
    if isinstance(files, (str, bytes)) or not all(isinstance(n, (str, os.PathLike)) for n in files):  # type: ignore[attr-defined]
        raise ValueError(f"files must be a list of file names (str), got {files!r}"[:300])
    out = tuple(os.fspath(n) for n in files)  # type: ignore[attr-defined]
    if not out:
        raise ValueError("files is empty: name at least one file of the dataset (or leave it out for all)")
    if len(out) > MAX_FILES:
        raise ValueError(f"files has {len(out)} names, at most {MAX_FILES}")
    return out


MissingComponent = Literal["empty", "skip", "error"]
"""``missing_component_behavior``: a sample lacking a component gets an
empty one (DALI's default), is left out, or is an error."""

MISSING: tuple[str, ...] = ("empty", "skip", "error")


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
