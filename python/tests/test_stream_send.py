# SPDX-License-Identifier: Apache-2.0
"""The stream's control frames: written to the descriptor directly (no
poll first), whole whatever the write takes."""

from __future__ import annotations

import os
import socket
from typing import Any

import msgpack
import pytest

from nvfeed import _stream
from nvfeed._stream import Stream, StreamError


def _pair() -> tuple[Stream, socket.socket]:
    a, b = socket.socketpair()
    a.settimeout(5.0)  # as a session's stream has: a non-blocking descriptor
    st = Stream.__new__(Stream)
    st._sock, st._buf = a, bytearray()
    return st, b


def _frame(peer: socket.socket) -> Any:
    peer.settimeout(5.0)
    n = int.from_bytes(peer.recv(4, socket.MSG_WAITALL), "big")
    return msgpack.unpackb(peer.recv(n, socket.MSG_WAITALL))


def test_send_writes_a_whole_frame() -> None:
    st, peer = _pair()
    st.send({"release": [1, 2, 3]})
    st.send({"stop": True, "keep": [4]})
    assert _frame(peer) == {"release": [1, 2, 3]}
    assert _frame(peer) == {"stop": True, "keep": [4]}


_real_write = os.write


@pytest.mark.parametrize("first", ["short", "would block"])
def test_send_finishes_what_the_write_left(monkeypatch: pytest.MonkeyPatch, first: str) -> None:
    """A write that takes part of the frame, or none (the buffer full):
    the rest goes by sendall, the frame whole on the wire."""
    st, peer = _pair()

    def write(fd: int, b: bytes) -> int:
        if first == "short":
            return _real_write(fd, b[:3])
        raise BlockingIOError

    monkeypatch.setattr(_stream.os, "write", write)  # type: ignore[attr-defined]
    st.send({"release": list(range(100))})
    assert _frame(peer) == {"release": list(range(100))}


def test_send_to_a_closed_peer_is_a_stream_error() -> None:
    st, peer = _pair()
    peer.close()
    with pytest.raises(StreamError):
        st.send({"release": [1]})
