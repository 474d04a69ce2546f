# SPDX-License-Identifier: Apache-2.0
"""The batch stream: after a session opens, one more unix connection to
loaderd is upgraded to a stream of frames (a 4-byte big-endian length, then
msgpack). The daemon pushes each batch's descriptor as soon as it is read;
releases go back as frames with no reply. No request per batch."""

from __future__ import annotations

import os
from typing import Any, Optional

import msgpack

from ._upgrade import UpgradeError, upgrade
from ._wire import StreamControl, StreamRequest

UPGRADE = "nvfeed-stream"


class StreamError(UpgradeError):
    """The stream could not be opened or broke; the message says why and
    ``status`` is the daemon's HTTP status when it refused."""


class Stream:
    """A session's stream, from ``at`` (or the session's next batch).
    ``keep`` names the slots of batches this client still holds from
    earlier streams; the daemon releases every other batch it delivered
    before the first frame (a stream that broke leaves them held)."""

    def __init__(self, path: str, session_id: str, timeout: Optional[float], at: Optional[tuple[int, int]],
                 keep: list[int]) -> None:
        req: StreamRequest = {"keep": keep}
        if at is not None:
            req["epoch"], req["iteration"] = at
        try:
            self._sock, self._buf, fds = upgrade(path, f"/v1/sessions/{session_id}/stream", UPGRADE,
                                                 msgpack.packb(req), timeout)
        except UpgradeError as e:
            raise StreamError(str(e), e.status, e.error_code) from e
        for fd in fds:  # none is expected
            os.close(fd)

    def _fill(self, n: int) -> None:
        while len(self._buf) < n:
            want = max(65536, n - len(self._buf))
            try:
                # What the kernel already holds, read straight from the
                # descriptor: recv on a socket with a timeout polls first.
                chunk = os.read(self._sock.fileno(), want)
            except BlockingIOError:
                chunk = self._sock.recv(want)  # nothing yet: waits, with the timeout
            if not chunk:
                raise StreamError("the daemon closed the stream")
            self._buf += chunk

    def ready(self) -> bool:
        """Whether the next frame is already here (recv will not wait)."""
        b = self._buf
        return len(b) >= 4 and len(b) >= 4 + int.from_bytes(b[:4], "big")

    def recv(self) -> dict[str, Any]:
        """The next frame from the daemon (blocks until it comes)."""
        try:
            self._fill(4)
            n = int.from_bytes(self._buf[:4], "big")
            self._fill(4 + n)
        except OSError as e:
            raise StreamError(str(e)) from e
        with memoryview(self._buf) as mv:  # no copy of the frame
            frame: dict[str, Any] = msgpack.unpackb(mv[4:4 + n])
        del self._buf[:4 + n]
        return frame

    def send(self, obj: StreamControl) -> None:
        b = msgpack.packb(obj)
        frame = len(b).to_bytes(4, "big") + b
        try:
            # A control frame (< 1 KiB) fits the socket's buffer: written
            # straight to the descriptor, not by sendall, which polls a
            # socket with a timeout first (a syscall a batch). Only what
            # does not fit now is left to sendall, and its timeout.
            try:
                n = os.write(self._sock.fileno(), frame)
            except BlockingIOError:
                n = 0
            if n < len(frame):
                self._sock.sendall(frame[n:])
        except OSError as e:
            raise StreamError(str(e)) from e

    def stop(self, keep: list[int]) -> None:
        """Ends the stream: the daemon releases every batch it sent but
        those in keep, and says so; frames before that are dropped."""
        self.send({"stop": True, "keep": keep})
        while True:
            f = self.recv()
            if f.get("stopped"):
                break
            if f.get("error"):
                raise StreamError(f["error"])
        self.close()

    def close(self) -> None:
        self._sock.close()
