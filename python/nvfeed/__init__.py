# SPDX-License-Identifier: Apache-2.0
"""nvfeed's Python client: a DALI ``fn.external_source`` source that reads
batches from loaderd.

::

    from nvfeed import LoaderSource
    src = LoaderSource("imagenet", socket="/run/loaderd/loaderd.sock", batch_size=64,
                       shard_id=0, num_shards=1, random_shuffle=True, seed=0,
                       backend="gds", batch_format="dali")
    jpegs, labels = fn.external_source(source=src, num_outputs=2, batch=True,
                                       dtype=[types.UINT8, types.INT32])

Backends and their options (``backend_options``), with defaults and
limits, are whatever the daemon offers: ``backends(socket)`` returns its
description (the same one ``loaderd backends`` prints).

Each ``next()`` returns ``(samples, labels)``: a list of 1-D uint8 numpy
arrays and int32 labels of shape (batch, 1); with ``batch_format="dali"``,
two DALI ``TensorListCPU``. Fed to DALI, the samples view the session's
batch memory (no copy; the daemon passes it to this process as a file
descriptor, read-only), given back to the daemon only after
``release_after`` later batches, so DALI may use it with ``no_copy=True``.
Read by user code, each batch is a copy, valid while referenced
(``zero_copy=True``: views, valid until ``release_after`` more batches).
At the end of an epoch it raises ``StopIteration``; iterating again starts
the next epoch, as DALI does after ``pipeline.reset()``.

Over a numpy dataset (``mkbmap --reader numpy``, ``src.reader ==
"numpy"``) each ``next()`` returns the arrays alone: one numpy array
``(batch, *shape)`` when they share a shape, else a list of arrays, each
its file's dtype and shape. ``PairedSource`` reads datasets whose samples
pair (``x`` and ``y`` of each case) as aligned tuples.

With ``device="gpu"`` the samples are ``CudaArray`` objects of GPU memory
(``__cuda_array_interface__``), one dense ``(batch, size)`` array per
batch of same-size samples with ``batch_format="dali"``; ``src.samples``
and ``src.labels`` feed GPU samples and host labels to two external
sources (see ``LoaderSource`` and python/README.md).

Without ``socket``, the source and ``backends()`` connect to
``$NVFEED_SOCKET``, else ``/run/loaderd/loaderd.sock``. Not being in the
socket's group raises ``SocketPermissionError`` naming the group; no daemon
there, ``DaemonNotRunningError``; another service there,
``NotLoaderdError`` ("the socket at X answered, but not as loaderd").

Client and daemon tell each other their versions with every request
(``daemon_version()``): a session works with a daemon of this release or
the one before; a request that needs a feature the daemon lacks, or a
daemon outside that window, raises ``VersionError`` naming both versions
and what to upgrade (docs/protocol.md, Versions).

Needs only the standard library, numpy and msgpack.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

from ._api import backends, daemon_version, datasets
from ._connect import DEFAULT_SOCKET, SOCKET_ENV
from ._cudamem import CudaArray
from ._errors import (BadRequestError, ConflictError, DaemonGoneError, DaemonNotRunningError, DriftError, ForbiddenError,
                      LimitError, LoaderError, NoSpaceError, NotFoundError, NotLoaderdError, RankMismatchError, SampleError,
                      SocketPermissionError, VersionError)
from ._paired import PairedSource
from ._source import LoaderSource
from ._version import RELEASE, DaemonVersion
from ._wire import DatasetInfo, State

# Also importable from here (and typed as exported), as before the client
# was split into modules: the batch types and the source's literals, the
# other exceptions and the messages the public functions return.
from ._source import (Batch as Batch, BatchFormat as BatchFormat, Components as Components, DaliBatch as DaliBatch,
                      Device as Device, MissingComponent as MissingComponent,
                      GPUPath as GPUPath, OnError as OnError, Sample as Sample, Shuffle as Shuffle, Tensors as Tensors,
                      Transport as Transport)
from ._options import SourceOptions as SourceOptions
from ._cuda import CudaError as CudaError
from ._stream import StreamError as StreamError
from ._upgrade import UpgradeError as UpgradeError
from ._wire import BackendsResponse as BackendsResponse, DatasetsResponse as DatasetsResponse, MemoryDesc as MemoryDesc

if TYPE_CHECKING:  # deprecated: see __getattr__
    from ._connect import check_timeout as check_timeout, connect as connect, socket_path as socket_path
    from ._cudamem import DeviceMapping as DeviceMapping
    from ._memory import map_host as map_host, receive as receive
    from ._stream import Stream as Stream
    from ._wire import (NextRequest as NextRequest, NextResponse as NextResponse, OpenRequest as OpenRequest,
                        OpenResponse as OpenResponse)

_DEPRECATED = {
    "check_timeout": "_connect", "connect": "_connect", "socket_path": "_connect", "DeviceMapping": "_cudamem",
    "map_host": "_memory", "receive": "_memory", "Stream": "_stream", "NextRequest": "_wire",
    "NextResponse": "_wire", "OpenRequest": "_wire", "OpenResponse": "_wire",
}
"""Helpers and protocol messages that are not the API, once re-exported
here: still importable, with a DeprecationWarning, by name: their module."""


def __getattr__(name: str) -> Any:
    """A deprecated re-export (``_DEPRECATED``), with a DeprecationWarning.

    Parameters
    ----------
    name : str
        The name asked for.

    Returns
    -------
    Any
        The object, from the client module that defines it.

    Raises
    ------
    AttributeError
        ``name`` is not one of the client's names.
    """
    module = _DEPRECATED.get(name)
    if module is None:
        raise AttributeError(f"module 'nvfeed' has no attribute {name!r}")
    warnings.warn(f"nvfeed.{name} is not part of the client's API and will go: it is nvfeed.{module}.{name}, "
                  "an internal helper", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(f"nvfeed.{module}"), name)


__version__ = RELEASE
"""This release: the same for the client, loaderd and mkbmap (one place:
the file VERSION beside this module)."""

__all__ = ["DEFAULT_SOCKET", "SOCKET_ENV", "BadRequestError", "ConflictError", "CudaArray", "DaemonGoneError",
           "DaemonNotRunningError", "ForbiddenError", "LimitError", "LoaderError", "LoaderSource", "NoSpaceError",
           "NotFoundError", "RankMismatchError", "SampleError", "SocketPermissionError", "State", "DatasetInfo", "backends",
           "datasets", "daemon_version", "DaemonVersion", "NotLoaderdError", "VersionError", "DriftError", "PairedSource"]
