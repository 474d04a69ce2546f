# SPDX-License-Identifier: Apache-2.0
"""How a session asks for its next batch descriptor: a request over HTTP
per batch, or the stream the daemon pushes descriptors on. Releases go
back on the stream without a reply. The stream is opened, moved and
dropped here."""

from __future__ import annotations

from typing import Optional, cast

from ._errors import DaemonGoneError, error_for
from ._http import UnixHTTPConnection, call
from ._stream import Stream, StreamError
from ._wire import NextRequest, NextResponse

class Transport:
    """The next descriptor by ``kind``, ``"stream"`` or ``"http"``, over
    the session's socket, its timeout and its HTTP connection ``conn``."""

    def __init__(self, kind: str, socket: str, timeout: float, conn: UnixHTTPConnection) -> None:
        self._kind, self._socket, self._timeout, self._conn = kind, socket, timeout, conn
        self._stream: Optional[Stream] = None
        self._unsent: list[int] = []  # releases held back to go with the next frame

    @property
    def streaming(self) -> bool:
        """Whether a stream is open: the daemon may have read ahead into it."""
        return self._stream is not None

    def next(self, sid: str, release: list[int], at: Optional[tuple[int, int]], expect: Optional[tuple[int, int]],
             kept: list[int]) -> NextResponse:
        """The next descriptor of session ``sid``. ``release``: slots that
        go back. ``at``: the batch wanted, None for the next. ``expect``:
        the session's position, where a new stream starts. ``kept``: the
        slots the source still holds."""
        if self._kind == "stream":
            return self._stream_next(sid, release, at, expect, kept)
        body: NextRequest = {}
        if release:
            body["release"] = release
        if at is not None:
            body["epoch"], body["iteration"] = at
        return cast(NextResponse, call(self._conn, self._socket, "POST", f"/v1/sessions/{sid}/next", body or None))

    def _stream_next(self, sid: str, release: list[int], at: Optional[tuple[int, int]],
                     expect: Optional[tuple[int, int]], kept: list[int]) -> NextResponse:
        """The next frame of the stream. It opens the stream, or moves it
        when ``at`` is not where the stream is."""
        try:
            if self._stream is not None and at is not None and at != expect:
                self._stream.stop(keep=kept)  # what DALI still holds stays held
                self._stream, self._unsent = None, []
            if self._stream is None:
                # From the source's own position: no request for it. What
                # the source still holds is kept. Everything else the daemon
                # delivered goes back before the first frame.
                self._stream = Stream(self._socket, sid, self._timeout, at if at is not None else expect, kept)
                self._unsent = []
            elif release or self._unsent:
                # One control frame for two batches where the daemon is
                # ahead. A release is held back while the next frame is
                # already here, at most one batch, and goes with the next.
                # It is never held while the source waits for a frame: the
                # daemon may be waiting for the slot. That halves the
                # release frames where the client is the slower. A call
                # with nothing to release sends what was held back.
                self._unsent += release
                if len(self._unsent) > len(release) or not self._stream.ready():
                    self._stream.send({"release": self._unsent})
                    self._unsent = []
            r = cast(NextResponse, self._stream.recv())
        except StreamError as e:
            self.drop()
            if e.status is not None:
                raise error_for(f"loaderd: stream: {e}", e.status, e.error_code) from e
            raise DaemonGoneError(f"loaderd at {self._socket}: stream: {e}") from e
        if r.get("error"):
            self.drop()
            raise error_for(f"loaderd: {r['error']}", r.get("error_status"), r.get("error_code"))
        return r

    def drop(self) -> None:
        """Closes the stream. Releases not sent are not lost: a stream's
        start and stop release every delivered batch but those kept."""
        self._unsent = []
        if self._stream is not None:
            self._stream.close()
            self._stream = None
