# SPDX-License-Identifier: Apache-2.0
"""What the daemon offers and serves, asked without a session:
``backends()`` (the backends and their options), ``datasets()`` (the
datasets and their counts) and ``daemon_version()``."""

from __future__ import annotations

from typing import Any, Optional, cast

from ._connect import check_timeout, socket_path
from ._http import UnixHTTPConnection, call, hello
from ._version import DaemonVersion
from ._wire import BackendsResponse, DatasetInfo, DatasetsResponse


def backends(socket: Optional[str] = None, timeout: float = 60.0) -> BackendsResponse:
    """What the daemon offers: the default backends (``auto`` over a dataset
    that allows raw reads, ``default`` otherwise) and prefetch depth, and
    every backend with its options (kind, default, limits, doc).

    Parameters
    ----------
    socket : str, optional
        The daemon's unix socket; by default ``$NVFEED_SOCKET``, else
        ``/run/loaderd/loaderd.sock``.
    timeout : float, optional, default = 60.0
        Seconds to wait for the daemon (> 0).

    Raises
    ------
    ValueError
        ``timeout`` is not a positive number (before connecting).
    SocketPermissionError
        This process may not connect (not in the socket's group).
    DaemonNotRunningError
        Nothing listens on the socket.
    """
    return cast(BackendsResponse, _get("/v1/backends", socket, timeout))


def datasets(socket: Optional[str] = None, timeout: float = 60.0) -> list[DatasetInfo]:
    """The datasets the daemon serves, sorted by name: for each, its
    samples, bytes and classes, and how many samples are ``fresh`` (read
    from their extents), ``stale`` (changed since mapping: read through the
    filesystem, or failed if gone), ``writable`` (unchanged, but a user the
    daemon does not trust may change them: read through the filesystem,
    never raw) and ``filesystem_only``, and how many
    files were ``added`` to its class folders since mapping (not served
    until mkbmap maps them and ``loaderd reload``), its ``reader``
    (``"file"``: encoded files with labels; ``"numpy"``: ``.npy`` arrays)
    and a numpy dataset's ``dtype`` (the ``.npy`` descr, ``"<f4"``). Counts
    only: no file and no session is named.

    Parameters
    ----------
    socket : str, optional
        The daemon's unix socket; by default ``$NVFEED_SOCKET``, else
        ``/run/loaderd/loaderd.sock``.
    timeout : float, optional, default = 60.0
        Seconds to wait for the daemon (> 0).

    Raises
    ------
    ValueError
        ``timeout`` is not a positive number (before connecting).
    SocketPermissionError
        This process may not connect (not in the socket's group).
    DaemonNotRunningError
        Nothing listens on the socket.
    """
    return cast(DatasetsResponse, _get("/v1/datasets", socket, timeout))["datasets"]


def daemon_version(socket: Optional[str] = None, timeout: float = 60.0) -> DaemonVersion:
    """The daemon's version: its release, protocol and features, as its
    answers tell them (a daemon of the release before versions names
    none: protocol 1, release ``""``). A session fits its open request to
    it: docs/protocol.md, Versions.

    Parameters
    ----------
    socket : str, optional
        The daemon's unix socket; by default ``$NVFEED_SOCKET``, else
        ``/run/loaderd/loaderd.sock``.
    timeout : float, optional, default = 60.0
        Seconds to wait for the daemon (> 0).

    Returns
    -------
    DaemonVersion
        Its ``protocol``, ``release`` and ``features``.

    Raises
    ------
    NotLoaderdError
        What listens on the socket is not loaderd.
    DaemonNotRunningError
        Nothing listens on the socket.
    """
    timeout = check_timeout("timeout", timeout)
    socket = socket_path(socket)
    conn = UnixHTTPConnection(socket, timeout)
    try:
        return hello(conn, socket)
    finally:
        conn.close()


def _get(path: str, socket: Optional[str], timeout: float) -> Any:
    """GET path from the daemon on its own connection."""
    timeout = check_timeout("timeout", timeout)
    socket = socket_path(socket)
    conn = UnixHTTPConnection(socket, timeout)
    try:
        return call(conn, socket, "GET", path)
    finally:
        conn.close()
