# SPDX-License-Identifier: Apache-2.0
"""Requests and answers over the daemon's unix socket: HTTP/1.1 with
msgpack bodies on a keep-alive connection, and the daemon's error answers
turned into the client's exceptions."""

from __future__ import annotations

import http.client
from typing import Any, Optional

import msgpack

from ._connect import connect
from ._errors import DaemonGoneError, LoaderError, error_for


class UnixHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection to loaderd's unix socket at ``path``, connected
    (by ``_connect.connect``) with errors that say what to do."""

    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("loaderd", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = connect(self._path, self.timeout)


def call(conn: http.client.HTTPConnection, where: str, method: str, path: str,
         body: Optional[Any] = None) -> Any:
    """One request (``body`` packed as msgpack) and the daemon's decoded
    answer (``None`` when empty). An error answer raises the
    ``LoaderError`` subclass of its HTTP status; no answer,
    ``DaemonGoneError`` naming ``where`` (the socket)."""
    data = msgpack.packb(body) if body is not None else None
    for attempt in (1, 2):
        reused = conn.sock is not None
        try:
            conn.request(method, path, body=data, headers={"Content-Type": "application/msgpack"})
            resp = conn.getresponse()
            raw = resp.read()
            break
        except LoaderError:  # connect's own, which say what to do
            conn.close()
            raise
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            # The daemon closes keep-alive connections idle past its
            # --idle-timeout without having read a request from them: a
            # request that found its reused connection closed is sent once
            # more on a new one.
            if attempt == 1 and reused and isinstance(e, (ConnectionResetError, BrokenPipeError)):
                continue
            raise DaemonGoneError(f"loaderd at {where}: {method} {path}: {e}") from e
    if resp.status >= 400:
        code: Optional[str] = None
        try:
            answer = msgpack.unpackb(raw)
            msg, code = answer["error"], answer.get("code")
        except Exception:
            msg = raw.decode(errors="replace")
        raise error_for(f"loaderd: {msg} (HTTP {resp.status})", resp.status, code)
    return msgpack.unpackb(raw) if raw else None
