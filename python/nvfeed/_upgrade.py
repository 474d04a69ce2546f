# SPDX-License-Identifier: Apache-2.0
"""An HTTP/1.1 upgrade on a new unix connection to loaderd: the request,
then the daemon's answer read with room for ancillary data (a file
descriptor may come with any of its bytes)."""

from __future__ import annotations

import os
import socket as _socket
from typing import Optional

import msgpack

from ._connect import connect
from ._errors import LoaderError, NotLoaderdError
from ._version import request_headers


class UpgradeError(RuntimeError):
    """The upgrade was refused or the connection failed; ``status`` is the
    daemon's HTTP status, ``None`` when there was no answer, and ``error_code``
    its error code (``None`` when it gave none)."""

    def __init__(self, msg: str, status: Optional[int] = None, error_code: Optional[str] = None) -> None:
        super().__init__(msg)
        self.status = status
        self.error_code = error_code


def _recv(s: _socket.socket, fds: list[int]) -> bytes:
    """One read, with room for descriptors (added to fds)."""
    chunk, got, _, _ = _socket.recv_fds(s, 65536, 4)
    fds.extend(got)
    return chunk


def upgrade(path: str, target: str, protocol: str, body: bytes, timeout: Optional[float],
            until_eof: bool = False) -> tuple[_socket.socket, bytearray, list[int]]:
    """POSTs to target asking for protocol and returns the connected socket,
    the bytes after the 101 answer's head, and any descriptors passed. With
    until_eof it reads until the daemon closes the connection. A failed
    connect raises connect's LoaderError (it says what to do), not
    UpgradeError."""
    s = connect(path, timeout)
    data, fds = bytearray(), list[int]()
    versions = "".join(f"{k}: {v}\r\n" for k, v in request_headers().items())
    try:
        s.sendall((f"POST {target} HTTP/1.1\r\nHost: loaderd\r\nUpgrade: {protocol}\r\nConnection: Upgrade\r\n"
                   f"Content-Type: application/msgpack\r\n{versions}Content-Length: {len(body)}\r\n\r\n").encode() + body)
        while b"\r\n\r\n" not in data:
            chunk = _recv(s, fds)
            if not chunk:
                raise UpgradeError("the daemon closed the connection before answering")
            data += chunk
        head, _, rest = bytes(data).partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        if not lines[0].startswith("HTTP/1."):
            raise NotLoaderdError(path, f"it does not speak HTTP; it wrote {lines[0][:80]!r}")
        status = int(lines[0].split(" ", 2)[1])
        if status == 101 and until_eof:
            while chunk := _recv(s, fds):
                rest += chunk
        if status != 101:
            length = next((int(h.split(":", 1)[1]) for h in lines[1:] if h.lower().startswith("content-length:")), 0)
            while len(rest) < length:
                chunk = s.recv(65536)
                if not chunk:
                    break
                rest += chunk
            code: Optional[str] = None
            try:
                e = msgpack.unpackb(rest[:length])
                msg, code = e["error"], e.get("code")
            except Exception:
                msg = rest[:length].decode(errors="replace")
            raise UpgradeError(f"{msg} (HTTP {status})", status, code)
    except BaseException as e:
        s.close()
        for fd in fds:
            os.close(fd)
        if isinstance(e, OSError) and not isinstance(e, LoaderError):
            raise UpgradeError(str(e)) from e
        raise
    return s, bytearray(rest), fds
