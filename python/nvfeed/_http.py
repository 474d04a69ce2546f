# SPDX-License-Identifier: Apache-2.0
"""Requests and answers over the daemon's unix socket: HTTP/1.1 with
msgpack bodies on a keep-alive connection, each request naming this
client's version and each answer the daemon's (``_version``); the
daemon's error answers turned into the client's exceptions, and answers
that are not loaderd's recognised as such."""

from __future__ import annotations

import http.client
from typing import Any, Optional

import msgpack

from ._connect import connect
from ._errors import DaemonGoneError, LoaderError, NotLoaderdError, error_for
from ._version import DaemonVersion, daemon_of, request_headers, unversioned

MSGPACK = "application/msgpack"


class UnixHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection to loaderd's unix socket at ``path``, connected
    (by ``_connect.connect``) with errors that say what to do; ``daemon``
    is the daemon's version its last answer told."""

    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("loaderd", timeout=timeout)
        self._path = path
        self.daemon: DaemonVersion = unversioned()

    def connect(self) -> None:
        self.sock = connect(self._path, self.timeout)


def _not_http(e: Exception) -> Optional[str]:
    """What a service that does not speak HTTP answered, from http.client's
    error; ``None`` for an error that is not that."""
    if isinstance(e, http.client.RemoteDisconnected) or not isinstance(
            e, (http.client.BadStatusLine, http.client.UnknownProtocol, http.client.LineTooLong)):
        return None
    line = str(e.args[0] if e.args else e).strip().strip("'\"").replace("\\r\\n", "").strip()
    return f"it does not speak HTTP; it wrote {line[:80]!r}"


def _answer(resp: http.client.HTTPResponse, raw: bytes) -> str:
    """An HTTP answer that is not loaderd's, in short."""
    ctype, server = resp.getheader("Content-Type"), resp.getheader("Server")
    text = " ".join(raw[:400].decode(errors="replace").split())
    return (f"an HTTP service answered {resp.status} {resp.reason}" + (f", {ctype}" if ctype else "")
            + (f" (Server: {server})" if server else "") + (f": {text[:80]!r}" if text else ""))


def _decode(resp: http.client.HTTPResponse, raw: bytes, where: str, daemon: Optional[DaemonVersion]) -> Any:
    """The answer's msgpack: an answer that names no protocol must be
    msgpack (all the release before versions answered these requests
    with), else it is not loaderd's."""
    ctype = (resp.getheader("Content-Type") or "").split(";")[0].strip()
    if daemon is None and raw and ctype != MSGPACK:
        raise NotLoaderdError(where, _answer(resp, raw))
    try:
        return msgpack.unpackb(raw) if raw else None
    except Exception as e:  # noqa: BLE001 - any undecodable body
        if daemon is None:
            raise NotLoaderdError(where, _answer(resp, raw)) from e
        if resp.status >= 400:
            return None  # its text is the message
        raise LoaderError(f"loaderd at {where}: a malformed answer ({resp.status}): {e}") from e


def call(conn: UnixHTTPConnection, where: str, method: str, path: str, body: Optional[Any] = None) -> Any:
    """One request (``body`` packed as msgpack) and the daemon's decoded
    answer (``None`` when empty); ``conn.daemon`` is set from the answer.
    An error answer raises the ``LoaderError`` subclass of its HTTP
    status; no answer, ``DaemonGoneError`` naming ``where`` (the socket);
    an answer that is not loaderd's, ``NotLoaderdError``."""
    data = msgpack.packb(body) if body is not None else None
    headers = {"Content-Type": MSGPACK, **request_headers()}
    for attempt in (1, 2):
        reused = conn.sock is not None
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
            break
        except LoaderError:  # connect's own, which say what to do
            conn.close()
            raise
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            if (what := _not_http(e)) is not None:
                raise NotLoaderdError(where, what) from e
            # The daemon closes keep-alive connections idle past its
            # --idle-timeout without having read a request from them: a
            # request that found its reused connection closed is sent once
            # more on a new one.
            if attempt == 1 and reused and isinstance(e, (ConnectionResetError, BrokenPipeError)):
                continue
            raise DaemonGoneError(f"loaderd at {where}: {method} {path}: {e}") from e
    daemon = daemon_of(resp.headers)
    answer = _decode(resp, raw, where, daemon)
    conn.daemon = daemon or unversioned()
    if resp.status >= 400:
        code: Optional[str] = None
        if isinstance(answer, dict) and isinstance(answer.get("error"), str):
            msg, code = answer["error"], answer.get("code")
        else:
            msg = raw.decode(errors="replace")
        raise error_for(f"loaderd: {msg} (HTTP {resp.status})", resp.status, code)
    return answer


def hello(conn: UnixHTTPConnection, where: str) -> DaemonVersion:
    """The daemon's version, asked on ``conn`` before a request that
    depends on it (``GET /v1/backends``: every release has it, and its
    msgpack answer tells loaderd from another service)."""
    call(conn, where, "GET", "/v1/backends")
    return conn.daemon
