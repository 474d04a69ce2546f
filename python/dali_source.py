# SPDX-License-Identifier: Apache-2.0
"""The DALI ``external_source`` shim: loaderd's batches as a source of
``fn.external_source``, in a pipeline where ``fn.readers.file`` (or
``fn.readers.numpy``, ``fn.readers.webdataset``) stood.

    from nvidia.dali import fn, pipeline_def, types
    from dali_source import LoaderSource

    src = LoaderSource("imagenet", batch_size=64, random_shuffle=True, seed=0)

    @pipeline_def(batch_size=64, num_threads=2, device_id=0)
    def pipe():
        jpegs, labels = fn.external_source(source=src, num_outputs=2, batch=True, no_copy=True,
                                           dtype=[types.UINT8, types.INT32])
        return fn.decoders.image(jpegs, device="mixed"), labels

``LoaderSource`` is an iterable DALI takes as a source (one batch a
``next()``, ``StopIteration`` at each epoch's end), or through
``src.batch`` with ``batch_info=True`` for exact checkpoints; its
arguments are the DALI reader's (``shard_id``, ``num_shards``,
``random_shuffle``, ``seed``, ...). ``dali_source.dali.reader`` puts it
in a reader's place in one line. This module is that entry point over
the client package, ``nvfeed``: the same objects (``dali_source.LoaderSource
is nvfeed.LoaderSource``), its other names (``dali_source.datasets``,
``dali_source.LoaderError``, ...), and its modules as
``dali_source.<name>`` (``dali_source.dali``, ``dali_source.torch``: the
module objects themselves, imported when first asked for)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any, Optional, Sequence

import nvfeed
from nvfeed import *  # noqa: F401,F403  (the names of nvfeed.__all__)
from nvfeed import LoaderSource as LoaderSource
from nvfeed import __all__ as __all__, __version__ as __version__

__path__: list[str] = []  # submodules: nvfeed's, through _Modules


class _Modules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import dali_source.X`` gives the module ``nvfeed.X`` itself (the
    same object, its own ``__spec__`` kept), imported then."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]],
                  target: Optional[types.ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        if not fullname.startswith(__name__ + "."):
            return None
        real = "nvfeed" + fullname[len(__name__):]
        if importlib.util.find_spec(real) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self, origin=real)

    def __init__(self) -> None:
        self._own: dict[str, Optional[importlib.machinery.ModuleSpec]] = {}

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(str(spec.origin))
        self._own[module.__name__] = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        # The import system set the alias's spec on the module: give it
        # back its own (nvfeed.X's), so reloading and tools see one module.
        module.__spec__ = self._own.pop(module.__name__, module.__spec__)


if not any(isinstance(f, _Modules) for f in sys.meta_path):
    sys.meta_path.append(_Modules())


def __getattr__(name: str) -> Any:
    """nvfeed's names beyond ``__all__`` (``Sample``, ``CudaError``, ...)."""
    try:
        return getattr(nvfeed, name)
    except AttributeError:
        raise AttributeError(f"module 'dali_source' has no attribute {name!r}") from None
