# SPDX-License-Identifier: Apache-2.0
"""DALI reader arguments that ``LoaderSource`` and ``nvfeed.dali.reader``
do not take as their own: those that only tune how DALI reads (accepted,
a warning says they are ignored) and those nvfeed does not support
(refused at the call that names them, saying so)."""

from __future__ import annotations

import warnings
from typing import Any

PERFORMANCE_ONLY = frozenset({
    "read_ahead", "dont_use_mmap", "use_o_direct", "lazy_init", "tensor_init_bytes", "bytes_per_sample_hint",
    "skip_cached_images", "preserve", "num_threads", "cache_header_information",
})
"""``fn.readers.numpy``/``fn.readers.file`` arguments that change how DALI
reads, never what: loaderd reads on its own terms, so they are ignored."""

ROI = frozenset({"roi_start", "rel_roi_start", "roi_end", "rel_roi_end", "roi_shape", "rel_roi_shape", "roi_axes",
                 "out_of_bounds_policy", "fill_value"})
"""``fn.readers.numpy``'s region-of-interest arguments: not supported yet."""

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


def split(caller: str, kwargs: dict[str, Any]) -> None:
    """Checks the DALI reader arguments ``kwargs`` holds (removing the
    performance-only ones, with a warning) before anything else is done.

    Raises
    ------
    TypeError
        An argument of ``fn.readers.numpy`` nvfeed does not support (ROI
        arguments included), saying what to do instead; or one no DALI
        reader takes.
    """
    for name in sorted(kwargs):
        if name in PERFORMANCE_ONLY:
            del kwargs[name]
            warnings.warn(f"{caller}: {name}= is a fn.readers.numpy/fn.readers.file argument that only tunes how "
                          "DALI reads; loaderd reads on its own terms, so it is ignored", RuntimeWarning, stacklevel=3)
        elif name in ROI:
            raise TypeError(f"{caller}: {name}= is a fn.readers.numpy argument nvfeed does not support yet (region "
                            "of interest reads); read whole arrays and slice them (fn.slice) meanwhile")
        elif name in UNSUPPORTED:
            raise TypeError(f"{caller}: {name}= is a fn.readers.numpy/fn.readers.file argument nvfeed does not "
                            f"support: {UNSUPPORTED[name]}")
        else:
            raise TypeError(f"{caller}: got an unexpected keyword argument {name!r} (neither its own nor a DALI "
                            "reader's)")
