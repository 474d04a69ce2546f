# SPDX-License-Identifier: Apache-2.0
"""The client's former import name, kept so that code written for it runs
unchanged: ``dali_source`` re-exports ``nvfeed``, the same objects under a
second name (``from dali_source import LoaderSource``,
``dali_source.__version__``). Deprecated: importing it warns
(``DeprecationWarning``); new code imports ``nvfeed``."""

from __future__ import annotations

import sys
import warnings
from typing import Any

warnings.warn("dali_source is the nvfeed client's former name and will go: import nvfeed (the same objects)",
              DeprecationWarning, stacklevel=2)

import nvfeed  # noqa: E402  (after the warning: it names the importer)
from nvfeed import *  # noqa: E402,F401,F403  (the names of nvfeed.__all__)
from nvfeed import __all__ as __all__, __version__ as __version__  # noqa: E402

# The client's modules under their former names too
# (``from dali_source._stream import Stream``): the same module objects.
for _name, _module in list(sys.modules.items()):
    if _name.startswith("nvfeed."):
        sys.modules["dali_source" + _name[len("nvfeed"):]] = _module
del _name, _module


def __getattr__(name: str) -> Any:
    """nvfeed's names beyond ``__all__`` (``Sample``, ``CudaError``, ...)."""
    try:
        return getattr(nvfeed, name)
    except AttributeError:
        raise AttributeError(f"module 'dali_source' has no attribute {name!r}") from None
