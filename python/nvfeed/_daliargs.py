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
"""``fn.readers.numpy``/``fn.readers.file``/``fn.readers.webdataset``
arguments that change how DALI reads, never what: loaderd reads on its
own terms, so they are ignored."""

ROI = frozenset({"roi_start", "rel_roi_start", "roi_end", "rel_roi_end", "roi_shape", "rel_roi_shape", "roi_axes",
                 "out_of_bounds_policy", "fill_value"})
"""``fn.readers.numpy``'s region-of-interest arguments: not supported yet."""

UNSUPPORTED = {
    "file_root": "name the dataset registered with loaderd instead (its root is the map's)",
    "file_filter": "the map's --file-filter chose the files (mkbmap)",
    "file_filters": "the map's --filter chose the files (mkbmap)",
    "files": "map the list with mkbmap --file-list, or read a dataset of those files",
    "file_list": "map the list with mkbmap --file-list",
    "labels": "a file list's labels are the map's (mkbmap --file-list)",
    "case_sensitive_filter": "the map's filter chose the files (mkbmap)",
    "dir_filters": "the map's folders are mkbmap's",
    "register_buffers": "loaderd registers its own batch memory",
    "checkpointing": "resume with the source's state() or DALI's checkpointing of nvfeed.dali.reader",
}
"""``fn.readers.numpy``/``fn.readers.file`` arguments with no equivalent
here, and what to do instead."""

WEBDATASET = {
    "paths": "map the tars with mkbmap --reader webdataset --mountpoint DIR (every .tar of DIR, sorted as DALI sorts "
             "paths) or --file-list LIST (the paths in your order), register the map with loaderd serve --dataset "
             "NAME=MAP, and name NAME here",
    "index_paths": "list the wds2idx indexes, one a line, in a file for mkbmap --reader webdataset --index-paths "
                   "FILE (the map is then the indexes' samples, checked against the tars)",
    "shuffle_after_epoch_seed": "WebDataset datasets shuffle with random_shuffle (shuffle='permute' or 'dali')",
}
"""``fn.readers.webdataset`` arguments with no equivalent here (its
``ext``, ``missing_component_behavior``, ``case_sensitive_extensions``
and sampling arguments are this client's own), and what to do instead."""


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
        elif name in WEBDATASET:
            raise TypeError(f"{caller}: {name}= is a fn.readers.webdataset argument nvfeed does not take: "
                            f"{WEBDATASET[name]}")
        elif name in UNSUPPORTED:
            raise TypeError(f"{caller}: {name}= is a fn.readers.numpy/fn.readers.file argument nvfeed does not "
                            f"support: {UNSUPPORTED[name]}")
        else:
            raise TypeError(f"{caller}: got an unexpected keyword argument {name!r} (neither its own nor a DALI "
                            "reader's)")
