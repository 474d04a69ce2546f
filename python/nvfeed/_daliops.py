# SPDX-License-Identifier: Apache-2.0
"""``nvfeed.dali.ops``: DALI's ``ops`` form of ``nvfeed.dali.reader``
(``ops.readers.Numpy``, ``ops.readers.File``): the arguments judged at
construction, as DALI judges an ``ops`` reader's, the reader made at the
call. Imported by ``nvfeed.dali``, which needs DALI."""

from __future__ import annotations

import inspect
from typing import Any, Optional

from . import _daliargs
from ._source import LoaderSource


class _OpsReader:
    """A reader in DALI's ``ops`` form: the arguments at construction,
    the pipeline at the call (``nvfeed.dali.reader``'s). ``kind`` is the
    dataset's reader, ``"numpy"`` or ``"file"``."""

    def __init__(self, kind: str, dataset: str, **kwargs: Any) -> None:
        self._kind = kind
        self._cls = "Numpy" if kind == "numpy" else "File"  # the class's name under ops.readers
        where = f"nvfeed.dali.ops.readers.{self._cls}"
        device = kwargs.pop("device", "cpu")
        if device != "cpu":
            raise TypeError(f"{where}: device={device!r}: it reads host batches, as ops.readers.{self._cls}"
                            "(device='cpu'); move them with .gpu()")
        if "name" in kwargs:
            self._name: Optional[str] = kwargs.pop("name")
        else:
            self._name = None
        from .dali import reader  # the module that imports this one, loaded by now
        own = set(inspect.signature(reader).parameters) | set(inspect.signature(LoaderSource).parameters)
        # Judged here, where DALI judges an ops reader's arguments. The
        # region ones go on to the reader: they say what it reads.
        extra = {k: kwargs.pop(k) for k in list(kwargs) if k not in own}
        region = {k: v for k, v in extra.items() if k in _daliargs.ROI}
        _daliargs.split(where, extra)
        kwargs.update(region)
        for bad in ("batch_size", "device_id", "gpu_path", "state", "dataset"):
            if bad in kwargs:
                raise TypeError(f"{where}: no argument {bad!r} (see nvfeed.dali.reader)")
        self._dataset, self._kwargs = dataset, kwargs

    def __call__(self, *, name: Optional[str] = None) -> Any:
        """The reader's outputs in the pipeline being defined, as DALI's
        ``ops`` reader's call gives them (``name`` as its ``name``)."""
        from .dali import reader
        out = reader(self._dataset, name=name if name is not None else self._name, **self._kwargs)
        if isinstance(out, tuple) != (self._kind == "file"):
            other = "File" if self._kind == "numpy" else "Numpy"
            raise TypeError(f"nvfeed.dali.ops.readers.{self._cls}: dataset {self._dataset!r} is not a "
                            f"{self._kind} dataset: read it with nvfeed.dali.ops.readers.{other}")
        return out


def _numpy(dataset: str, **args: Any) -> _OpsReader:
    """``ops.readers.Numpy``'s counterpart over a numpy dataset (``mkbmap
    --reader numpy``): ``Numpy(dataset, **args)``, then ``reader()`` in
    ``define_graph`` gives the arrays. ``args`` are
    ``nvfeed.dali.reader``'s (``files``, ``shuffle_after_epoch``,
    ``seed``, sharding, ...); ``device="cpu"`` and DALI's
    performance-only arguments are accepted, others refused here."""
    return _OpsReader("numpy", dataset, **args)


def _file(dataset: str, **args: Any) -> _OpsReader:
    """``ops.readers.File``'s counterpart over a file dataset: the call
    gives the samples and the labels."""
    return _OpsReader("file", dataset, **args)


class _Readers:
    """``nvfeed.dali.ops.readers``: ``Numpy`` and ``File``."""

    Numpy = staticmethod(_numpy)
    File = staticmethod(_file)


class ops:  # noqa: N801 - named as nvidia.dali.ops
    """``nvfeed.dali.ops``: DALI's ``ops`` form of this module's reader
    (``ops.readers.Numpy``, ``ops.readers.File``)."""

    readers = _Readers
