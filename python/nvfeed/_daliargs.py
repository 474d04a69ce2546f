# SPDX-License-Identifier: Apache-2.0
"""DALI reader arguments that ``LoaderSource`` and ``nvfeed.dali.reader``
do not take as their own: those that only tune how DALI reads (accepted,
a warning says they are ignored) and those nvfeed does not support
(refused at the call that names them, saying so)."""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any, Optional, cast

from ._wire import ROI as ROIRequest

PERFORMANCE_ONLY = frozenset({
    "read_ahead", "dont_use_mmap", "use_o_direct", "lazy_init", "tensor_init_bytes", "bytes_per_sample_hint",
    "skip_cached_images", "preserve", "num_threads", "cache_header_information",
})
"""``fn.readers.numpy``/``fn.readers.file`` arguments that change how DALI
reads, never what: loaderd reads on its own terms, so they are ignored."""

_STARTS = ("roi_start", "rel_roi_start")
_ENDS = ("roi_end", "rel_roi_end", "roi_shape", "rel_roi_shape")
_POLICIES = ("error", "pad", "trim_to_shape")
MAX_ROI_AXES = 32
"""The most values a region argument has (the daemon's ``loader.MaxROIAxes``)."""
_INT64 = (-(1 << 63), (1 << 63) - 1)

ROI = frozenset({*_STARTS, *_ENDS, "roi_axes", "out_of_bounds_policy", "fill_value"})
"""``fn.readers.numpy``'s region-of-interest arguments: the daemon reads
each sample as that region (only the byte ranges it needs)."""

UNSUPPORTED = {
    "file_root": "name the dataset registered with loaderd instead (its root is the map's)",
    "file_filter": "the map's --file-filter chose the files (mkbmap)",
    "file_filters": "the map's --filter chose the files (mkbmap)",
    "labels": "a file list's labels are the map's (mkbmap --file-list)",
    "case_sensitive_filter": "the map's filter chose the files (mkbmap)",
    "dir_filters": "the map's folders are mkbmap's",
    "register_buffers": "loaderd registers its own batch memory",
    "checkpointing": "resume with the source's state() or DALI's checkpointing of nvfeed.dali.reader",
}
"""``fn.readers.numpy``/``fn.readers.file`` arguments with no equivalent
here, and what to do instead."""


def _values(caller: str, name: str, v: Any, real: bool) -> list[Any]:
    """A region argument's values: one number or a sequence of them (ints;
    with ``real``, any real number, as DALI's float arguments)."""
    seq = list(v) if isinstance(v, (list, tuple)) or (hasattr(v, "ndim") and getattr(v, "ndim") == 1) else [v]
    out: list[Any] = []
    for x in seq:
        if isinstance(x, bool) or not isinstance(x, numbers.Real if real else numbers.Integral):
            what = "a number or a list of numbers" if real else "an int or a list of ints"
            raise TypeError(f"{caller}: {name}= must be {what} (one per axis of roi_axes, default every axis), "
                            f"got {v!r}")
        if real:
            f = float(x)
            if not math.isfinite(f):
                raise ValueError(f"{caller}: {name}= values must be finite, got {v!r}")
            out.append(f)
        else:
            i = int(x)
            if not _INT64[0] <= i <= _INT64[1]:
                raise ValueError(f"{caller}: {name}= values must be in [-2^63, 2^63), got {v!r}")
            out.append(i)
    if len(out) > MAX_ROI_AXES:
        raise ValueError(f"{caller}: {name}= has {len(out)} values, at most {MAX_ROI_AXES} (one per axis)")
    return out


def roi(caller: str, kwargs: dict[str, Any]) -> Optional[ROIRequest]:
    """Takes ``fn.readers.numpy``'s region-of-interest arguments out of
    ``kwargs`` and checks what needs no dataset, as DALI does: at most one
    start and one end argument, one value per axis, the shapes not
    negative, the policy among DALI's. The daemon checks the region
    against every sample's shape at open.

    Returns
    -------
    ROI or None
        The region as the open request carries it; None when no region
        argument is given (``out_of_bounds_policy``/``fill_value`` alone
        change nothing, as in DALI).

    Raises
    ------
    TypeError, ValueError
        A region argument of the wrong type or out of its range, named
        with the range and the value given.
    """
    given = {k: kwargs.pop(k) for k in sorted(ROI) if k in kwargs}
    region: dict[str, Any] = {}
    counts: dict[str, int] = {}
    for name in (*_STARTS, *_ENDS):
        if name in given and given[name] is not None:
            region[name] = _values(caller, name, given[name], name.startswith("rel_"))
            counts[name] = len(region[name])
    starts = [n for n in _STARTS if n in region]
    ends = [n for n in _ENDS if n in region]
    if len(starts) > 1:
        raise ValueError(f"{caller}: roi_start= and rel_roi_start= are mutually exclusive (as in fn.readers.numpy)")
    if len(ends) > 1:
        raise ValueError(f"{caller}: {'= and '.join(ends)}= are mutually exclusive (give one; as in fn.readers.numpy)")
    if len(set(counts.values())) > 1:
        raise ValueError(f"{caller}: the region arguments have different numbers of values ({counts}): one per axis")
    for name in ("roi_shape", "rel_roi_shape"):
        if any(x < 0 for x in region.get(name, [])):
            raise ValueError(f"{caller}: {name}= must not be negative, got {given[name]!r}")
    policy = given.get("out_of_bounds_policy", "error")
    if policy not in _POLICIES:
        raise ValueError(f"{caller}: out_of_bounds_policy= must be one of {', '.join(map(repr, _POLICIES))} (as "
                         f"fn.readers.numpy), got {policy!r}")
    fill = given.get("fill_value", 0.0)
    if isinstance(fill, bool) or not isinstance(fill, numbers.Real) or not math.isfinite(float(fill)):
        raise TypeError(f"{caller}: fill_value= must be a finite number, got {fill!r}")
    if not region:
        if given.get("roi_axes") is not None:
            raise ValueError(f"{caller}: roi_axes= names the axes of roi_start=/roi_end=/roi_shape= (or their rel_ "
                             "forms); none is given")
        return None
    if given.get("roi_axes") is not None:
        axes = _values(caller, "roi_axes", given["roi_axes"], False)
        n = next(iter(counts.values()))
        if len(axes) != n:
            raise ValueError(f"{caller}: roi_axes= has {len(axes)} axes, the region arguments {n} values (one per "
                             "axis)")
        if len(set(axes)) != len(axes) or any(not -MAX_ROI_AXES <= a < MAX_ROI_AXES for a in axes):
            raise ValueError(f"{caller}: roi_axes= must be distinct axes in [-{MAX_ROI_AXES}, {MAX_ROI_AXES}), got "
                             f"{given['roi_axes']!r}")
        region["roi_axes"] = axes
    region["out_of_bounds_policy"] = policy
    region["fill_value"] = float(fill)
    return cast(ROIRequest, region)


def split(caller: str, kwargs: dict[str, Any]) -> Optional[ROIRequest]:
    """Checks the DALI reader arguments ``kwargs`` holds (removing the
    performance-only ones, with a warning, and the region-of-interest
    ones: ``roi``) before anything else is done.

    Returns
    -------
    ROI or None
        The region of interest the arguments give (``roi``).

    Raises
    ------
    TypeError
        An argument of ``fn.readers.numpy`` nvfeed does not support,
        saying what to do instead; or one no DALI reader takes.
    ValueError
        A region-of-interest argument out of its range (``roi``).
    """
    region = roi(caller, kwargs)
    for name in sorted(kwargs):
        if name in PERFORMANCE_ONLY:
            del kwargs[name]
            warnings.warn(f"{caller}: {name}= is a fn.readers.numpy/fn.readers.file argument that only tunes how "
                          "DALI reads; loaderd reads on its own terms, so it is ignored", RuntimeWarning, stacklevel=3)
        elif name in UNSUPPORTED:
            raise TypeError(f"{caller}: {name}= is a fn.readers.numpy/fn.readers.file argument nvfeed does not "
                            f"support: {UNSUPPORTED[name]}")
        else:
            raise TypeError(f"{caller}: got an unexpected keyword argument {name!r} (neither its own nor a DALI "
                            "reader's)")
    return region
