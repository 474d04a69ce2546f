# SPDX-License-Identifier: Apache-2.0
"""The stream's frames: control frames written to the descriptor
directly (no poll first), whole whatever the write takes; the daemon's
read from the descriptor first, waiting with the timeout only when
nothing is there."""

from __future__ import annotations

import os
import socket
import threading
import time
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


def _framed(obj: Any) -> bytes:
    b = msgpack.packb(obj)
    return len(b).to_bytes(4, "big") + b


def test_recv_takes_frames_split_or_together() -> None:
    """A frame in pieces, the next arriving with its end: each whole,
    in order, whether the bytes were waiting or came later."""
    st, peer = _pair()
    one, two = _framed({"slot": 1, "offsets": list(range(50))}), _framed({"slot": 2})
    peer.sendall(one[:3])

    def rest() -> None:
        time.sleep(0.05)
        peer.sendall(one[3:] + two)
    t = threading.Thread(target=rest)
    t.start()
    assert st.recv() == {"slot": 1, "offsets": list(range(50))}
    assert st.recv() == {"slot": 2}
    t.join()
    peer.sendall(_framed({"slot": 3}))  # waiting in the kernel already
    time.sleep(0.01)
    assert st.recv() == {"slot": 3}


def test_recv_waits_with_the_timeout() -> None:
    st, _peer = _pair()
    st._sock.settimeout(0.1)
    with pytest.raises(StreamError):
        st.recv()


def test_recv_from_a_closed_peer_is_a_stream_error() -> None:
    st, peer = _pair()
    peer.sendall(_framed({"slot": 1})[:5])
    peer.close()
    with pytest.raises(StreamError, match="closed"):
        st.recv()


class _FakeStream:
    """A stream whose next frame is here or not, as the test says; it
    records the control frames sent."""

    def __init__(self) -> None:
        self.here = False
        self.sent: list[Any] = []
        self.frames = 0

    def ready(self) -> bool:
        return self.here

    def send(self, obj: Any) -> None:
        self.sent.append(obj)

    def recv(self) -> dict[str, Any]:
        self.frames += 1
        return {"slot": self.frames}

    def close(self) -> None:
        pass


def _transport(st: _FakeStream) -> Any:
    from nvfeed._transport import Transport
    t = Transport("stream", "/x", 5.0, None)  # type: ignore[arg-type]
    t._stream = st  # type: ignore[assignment]
    return t


def test_releases_wait_only_while_the_next_frame_is_here() -> None:
    """A release goes at once when the source is to wait for its next
    frame; while that frame is already here it waits for the next
    release, one batch at most, and goes with it."""
    st = _FakeStream()
    t = _transport(st)
    t.next("s", [1], None, (0, 0), [])  # the daemon is not ahead: sent now
    assert st.sent == [{"release": [1]}]
    st.here = True
    t.next("s", [2], None, (0, 0), [])  # the next frame is here: held back
    assert st.sent == [{"release": [1]}]
    t.next("s", [3], None, (0, 0), [])  # one batch held back at most
    assert st.sent == [{"release": [1]}, {"release": [2, 3]}]
    t.next("s", [4], None, (0, 0), [])
    st.here = False
    t.next("s", [5], None, (0, 0), [])  # about to wait: what was held back goes too
    assert st.sent == [{"release": [1]}, {"release": [2, 3]}, {"release": [4, 5]}]
    t.next("s", [], None, (0, 0), [])
    assert len(st.sent) == 3 and st.frames == 6


def test_a_call_with_no_release_sends_what_was_held_back() -> None:
    """A call with nothing to release (a GPU fence still holds the last
    batch) sends the release held back, whether the next frame is here
    or not: else a source of two slots waits for a frame the daemon
    cannot make without that slot."""
    for here in (False, True):
        st = _FakeStream()
        t = _transport(st)
        st.here = True
        t.next("s", [1], None, (0, 0), [])  # held back
        assert st.sent == []
        st.here = here
        t.next("s", [], None, (0, 0), [])
        assert st.sent == [{"release": [1]}], here


def test_releases_held_back_go_with_the_stream() -> None:
    """A release held back when the stream is dropped is not sent on a
    later stream: that stream's start releases every batch the source
    does not keep."""
    st = _FakeStream()
    st.here = True
    t = _transport(st)
    t.next("s", [7], None, (0, 0), [])
    assert st.sent == [] and t._unsent == [7]
    t.drop()
    assert t._unsent == [] and not t.streaming
