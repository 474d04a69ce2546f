# SPDX-License-Identifier: Apache-2.0
"""Where the daemon is and how to reach it: the socket path (argument,
``NVFEED_SOCKET``, or the default), timeouts checked before any
connection, and a connect whose errors say what to do."""

from __future__ import annotations

import errno
import grp
import math
import os
import pwd
import socket as _socket
import stat
from typing import Optional

from ._errors import DaemonGoneError, DaemonNotRunningError, LoaderError, SocketPermissionError

DEFAULT_SOCKET = "/run/loaderd/loaderd.sock"
"""The socket loaderd listens on by default in deploy/ (systemd's
``RuntimeDirectory=loaderd``, the Kubernetes hostPath ``/run/loaderd``)."""

SOCKET_ENV = "NVFEED_SOCKET"
"""The environment variable naming the socket when no ``socket`` is given."""


def socket_path(socket: Optional[str]) -> str:
    """The socket to use: ``socket`` when given, else ``$NVFEED_SOCKET``
    when set and not empty, else ``DEFAULT_SOCKET``."""
    if socket:
        return socket
    return os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET


def check_timeout(name: str, value: object, zero: Optional[str] = None) -> float:
    """Returns ``value`` as seconds, or raises ValueError naming ``name``
    and its range: a finite number > 0 (>= 0 when ``zero`` says what 0
    means)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        if value > 0 or (zero is not None and value == 0):
            return float(value)
    if zero is not None:
        raise ValueError(f"{name} must be a finite number of seconds >= 0 (0 {zero}), got {value!r}")
    raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")


def connect(path: str, timeout: Optional[float]) -> _socket.socket:
    """A unix stream socket connected to ``path``. Raises
    ``SocketPermissionError`` (``EACCES``, ``EPERM``),
    ``DaemonNotRunningError`` (``ENOENT``, ``ECONNREFUSED``,
    ``ENOTDIR``) or ``DaemonGoneError`` (anything else), each naming the
    socket."""
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
    except OSError as e:
        s.close()
        raise connect_error(path, e) from e
    return s


def connect_error(path: str, e: OSError) -> LoaderError:
    """The error for a failed connect to ``path``, saying what to do."""
    if e.errno in (errno.EACCES, errno.EPERM):
        return _permission_error(path, e)
    if e.errno in (errno.ENOENT, errno.ECONNREFUSED, errno.ENOTDIR):
        return DaemonNotRunningError(
            f"is loaderd running at {path}? Connecting failed: {e.strerror or e}. Start it "
            f"(`sudo systemctl start loaderd`, or "
            f"`sudo loaderd serve --socket {path} --socket-group GROUP --dataset NAME=MAP`), "
            f"or point the client at the socket it listens on (socket=PATH, or {SOCKET_ENV}=PATH).", path)
    return DaemonGoneError(f"loaderd at {path}: cannot connect: {e}")


def _group_name(gid: int) -> Optional[str]:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return None


def _user_name() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def _permission_error(path: str, e: OSError) -> SocketPermissionError:
    """Explains EACCES: the socket's group and how to join it (never
    root's group: then how to give the daemon a group), or the directory
    this process cannot search."""
    me = f"this process (user {_user_name()}, uid {os.geteuid()}, groups {sorted(set(os.getgroups()) | {os.getegid()})})"
    try:
        st = os.stat(path)
    except OSError as se:
        d = os.path.dirname(path) or "."
        return SocketPermissionError(
            f"cannot connect to loaderd at {path}: permission denied ({e.strerror}), and the socket cannot be "
            f"examined ({se.strerror}): {me} cannot search a directory on its path (e.g. {d}). The socket's "
            f"directory must be searchable by every client (mode 0755, as systemd's RuntimeDirectoryMode gives).",
            path, None, None)
    gid = st.st_gid
    name = _group_name(gid)
    shown = f"'{name}' (gid {gid})" if name else f"gid {gid} (no name on this machine)"
    msg = (f"cannot connect to loaderd at {path}: permission denied. Only members of the socket's group {shown} "
           f"may connect (socket mode {stat.S_IMODE(st.st_mode):04o}); {me} is not one. ")
    if gid == 0:
        # Root's group: the daemon was started without a socket group. Its
        # members hold root's files; no one joins it to reach a socket.
        msg += ("The daemon was started without a socket group, so only root may connect. Ask its administrator to "
                "give it one of its own (loaderd serve --socket-group GROUP, or socket-group = GROUP in its config "
                "file) and to add this user to that group.")
    elif name is None:
        msg += (f"Run the process with that group: a supplementary group {gid} "
                "(in Kubernetes, securityContext.supplementalGroups).")
    else:
        user = _user_name()
        try:
            listed = user in grp.getgrgid(gid).gr_mem
        except KeyError:
            listed = False
        if listed:
            msg += (f"{user} is listed in {name} but this process started before that: "
                    f"log in again (or run `newgrp {name}`) so the new group applies.")
        else:
            msg += (f"Join it: `sudo usermod -aG {name} $USER`, then log in again (or run `newgrp {name}`) "
                    "so the new group applies.")
    return SocketPermissionError(msg, path, name if name else str(gid), gid)
