"""The batch stream: after a session opens, one more unix connection to
loaderd is upgraded to a stream of frames (a 4-byte big-endian length, then
msgpack). The daemon pushes each batch's descriptor as soon as it is read;
releases go back as frames with no reply. No request per batch."""

from __future__ import annotations

import socket as _socket
from typing import Any, Optional

import msgpack

UPGRADE = "nvfeed-stream"


class StreamError(RuntimeError):
    """The stream could not be opened or broke; the message says why."""


class Stream:
    def __init__(self, path: str, session_id: str, timeout: Optional[float], at: Optional[tuple[int, int]]) -> None:
        body = msgpack.packb({"epoch": at[0], "iteration": at[1]}) if at is not None else b""
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(path)
            s.sendall((f"POST /v1/sessions/{session_id}/stream HTTP/1.1\r\nHost: loaderd\r\n"
                       f"Upgrade: {UPGRADE}\r\nConnection: Upgrade\r\nContent-Type: application/msgpack\r\n"
                       f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = s.recv(65536)
                if not chunk:
                    raise StreamError("the daemon closed the connection before answering")
                head += chunk
        except OSError as e:
            s.close()
            raise StreamError(str(e)) from e
        hdr, rest = head.split(b"\r\n\r\n", 1)
        lines = hdr.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        if status != 101:
            length = next((int(l.split(":", 1)[1]) for l in lines[1:] if l.lower().startswith("content-length:")), 0)
            while len(rest) < length:
                chunk = s.recv(65536)
                if not chunk:
                    break
                rest += chunk
            s.close()
            try:
                msg = msgpack.unpackb(rest[:length])["error"]
            except Exception:
                msg = rest[:length].decode(errors="replace")
            raise StreamError(f"{msg} (HTTP {status})")
        self._sock = s
        self._buf = bytearray(rest)

    def _fill(self, n: int) -> None:
        while len(self._buf) < n:
            chunk = self._sock.recv(max(65536, n - len(self._buf)))
            if not chunk:
                raise StreamError("the daemon closed the stream")
            self._buf += chunk

    def recv(self) -> dict[str, Any]:
        """The next frame from the daemon (blocks until it comes)."""
        try:
            self._fill(4)
            n = int.from_bytes(self._buf[:4], "big")
            self._fill(4 + n)
        except OSError as e:
            raise StreamError(str(e)) from e
        with memoryview(self._buf) as mv:  # no copy of the frame
            frame = msgpack.unpackb(mv[4:4 + n])
        del self._buf[:4 + n]
        return frame

    def send(self, obj: dict[str, Any]) -> None:
        b = msgpack.packb(obj)
        try:
            self._sock.sendall(len(b).to_bytes(4, "big") + b)
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
